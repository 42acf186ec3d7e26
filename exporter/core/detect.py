"""Sequential change detection on per-step counts: likelihood ratios against a threshold, CUSUM, and the alarm level.

Two groups, one step: ``k_h`` of ``n_h`` events of the group that the detector's alternative puts higher are
positive, ``k_l`` of ``n_l`` of the other's. A model meets its threshold when its two rates lie in a half-plane,
``slope x p_h - p_l <= offset`` (a gap: ``p_h - p_l <= threshold``; an impact ratio: ``threshold x p_h - p_l <= 0``).
Against that whole null, at every base rate, the likelihood ratio of two binomials

    LR = Bin(k_h; n_h, q_h) Bin(k_l; n_l, q_l) / (Bin(k_h; n_h, e_h) Bin(k_l; n_l, e_l))

with ``e`` a point on the null's edge and the alternative ``q = e + lambda (slope e_h(1-e_h) / n_h, -e_l(1-e_l) / n_l)``
(``lambda >= 0``: ``e`` is ``q``'s projection on the null, in Kullback-Leibler divergence) has

    log E_p[LR] = n_h log(1 + lambda slope (p_h - e_h) / n_h) + n_l log(1 - lambda (p_l - e_l) / n_l)
               <= lambda (slope p_h - p_l - offset) <= 0

for every rate pair ``p`` of the null (``log(1 + u) <= u``), exactly, whatever the volume and however the rates
move from step to step (and within one, by the same inequality event by event): a model that meets its threshold
cannot raise the evidence, and equal rates lower it. With ``e`` and ``lambda`` chosen from earlier steps and the
step's ``n`` only, the LRs are the increments of test supermartingales:

* Shiryaev-Roberts ``R_t = (1 + R_{t-1}) LR_t``, restarted at 0 after each alarm at ``R >= e^h``, makes at most
  ``steps x e^-h`` false alarms in expectation (``R_t - t`` is a supermartingale): this raises the alarms;
* CUSUM ``S_t = max(0, S_{t-1} + log LR_t)`` is the largest log product over all start steps (``S <= log R``): the
  evidence of a change now, which says when an alarm is over.

Pure functions, vectorised over any array shape, numpy only.
"""

from __future__ import annotations

import math
from typing import Final, NamedTuple

import numpy as np
from numpy.typing import ArrayLike, NDArray

FloatArray = NDArray[np.float64]

RATE_MARGIN: Final = 0.005
"""Alternatives keep both rates at least this far from 0 and 1 (their log likelihoods stay finite)."""
SECONDS_PER_DAY: Final = 86_400.0


class Edge(NamedTuple):
    """A point ``(high, low)`` on the edge of a null half-plane ``slope x p_h - p_l <= slope x high - low``, and how
    far beyond that edge (in ``slope x p_h - p_l``) the alternative lies."""

    high: FloatArray
    low: FloatArray
    slope: float
    excess: FloatArray


def two_sample_log_lr(k_h: ArrayLike, n_h: ArrayLike, k_l: ArrayLike, n_l: ArrayLike, edge: Edge) -> FloatArray:
    """log of the likelihood ratio of one step: the alternative ``edge.excess`` beyond the null's edge, against the
    edge point, whose expectation is at most 1 at every rate pair of the null (module docstring).

    The alternative moves each group from the edge in proportion to its variance over its events (the null's normal
    in the step's sampling metric), so that the edge point is its projection on the null. 0 when a group is empty.

    >>> edge = Edge(np.array(0.525), np.array(0.475), 1.0, np.array(0.05))  # gap 0.05 around 0.5
    >>> # 30/40 against 5/40 (a gap of 0.625); equal trials, so the alternative is 0.55 against 0.45:
    >>> # 65 log(0.55 / 0.525) + 15 log(0.45 / 0.475)
    >>> round(float(two_sample_log_lr(30, 40, 5, 40, edge)), 4)
    2.2128
    >>> float(two_sample_log_lr(3, 3, 0, 0, edge))
    0.0
    """
    k_h, n_h, k_l, n_l = (np.asarray(x, dtype=np.float64) for x in (k_h, n_h, k_l, n_l))
    high, low, excess = (np.asarray(x, dtype=np.float64) for x in (edge.high, edge.low, edge.excess))
    var_h, var_l = high * (1.0 - high), low * (1.0 - low)
    denominator = edge.slope**2 * var_h * n_l + var_l * n_h
    live = (denominator > 0.0) & (excess > 0.0)
    high, low = np.where(live, high, 0.5), np.where(live, low, 0.5)  # elsewhere q = e: a ratio of 1
    lam = np.where(live, excess, 0.0) / np.where(live, denominator, 1.0)
    q_h = high + lam * edge.slope * var_h * n_l
    q_l = low - lam * var_l * n_h
    return one_sample_log_lr(k_h, n_h, high, q_h) + one_sample_log_lr(k_l, n_l, low, q_l)


def one_sample_log_lr(k: ArrayLike, n: ArrayLike, p0: ArrayLike, p1: ArrayLike) -> FloatArray:
    """log of the binomial likelihood ratio of rate p1 against rate p0 for k positives of n (expectation 1 at p0)."""
    k, n = np.asarray(k, dtype=np.float64), np.asarray(n, dtype=np.float64)
    p0, p1 = np.asarray(p0, dtype=np.float64), np.asarray(p1, dtype=np.float64)
    return k * (np.log(p1) - np.log(p0)) + (n - k) * (np.log1p(-p1) - np.log1p(-p0))


def logit(p: ArrayLike) -> FloatArray:
    p = np.asarray(p, dtype=np.float64)
    return np.log(p) - np.log1p(-p)


def gap_edge(pooled_rate: ArrayLike, threshold: float) -> Edge:
    """The null's edge "the higher rate exceeds the lower by the threshold", centred on the pooled rate, and the
    alternative as far beyond it again: a gap of twice the threshold.

    The centre is clipped so that the alternative's rates stay inside (0, 1) however the step's events split
    between the groups; a threshold too large for that shrinks the excess (at 1 - 2 x RATE_MARGIN or more the
    detector gathers no evidence).

    >>> edge = gap_edge(0.3, 0.05)
    >>> round(float(edge.high), 4), round(float(edge.low), 4), float(edge.excess)
    (0.325, 0.275, 0.05)
    """
    theta = float(threshold)
    excess = max(0.0, min(theta, (1.0 - 2.0 * RATE_MARGIN - theta) / 2.0))
    reach = min(theta / 2.0 + excess + RATE_MARGIN, 0.5)
    centre = np.clip(np.nan_to_num(np.asarray(pooled_rate, dtype=np.float64), nan=0.5), reach, 1.0 - reach)
    return Edge(centre + theta / 2.0, centre - theta / 2.0, 1.0, np.full(centre.shape, excess))


def ratio_edge(pooled_rate: ArrayLike, threshold: float) -> Edge:
    """The null's edge "the lower rate is the threshold times the higher", their mean the pooled rate, and the
    alternative as far beyond it again in ratio: the lower rate threshold² times the higher (0.64 for 0.8).

    The higher rate is clipped so that the alternative's rates stay inside (0, 1) however the step's events split.

    >>> edge = ratio_edge(0.3, 0.8)
    >>> round(float(edge.high), 4), round(float(edge.low), 4), round(float(edge.excess), 4)
    (0.3333, 0.2667, 0.0533)
    """
    ratio = float(threshold)
    top = (1.0 - RATE_MARGIN) / (2.0 - ratio)  # the alternative's higher rate is at most (2 - ratio) x high
    bottom = min(RATE_MARGIN / ratio**2, top) if ratio > 0.0 else top  # its lower one at least ratio² x high
    pooled = np.nan_to_num(np.asarray(pooled_rate, dtype=np.float64), nan=0.5)
    high = np.clip(2.0 * pooled / (1.0 + ratio), bottom, top)
    return Edge(high, ratio * high, ratio, ratio * (1.0 - ratio) * high)


def cusum(statistic: ArrayLike, log_lr: ArrayLike) -> FloatArray:
    """One CUSUM step: max(0, S + log LR)."""
    return np.maximum(0.0, np.asarray(statistic, dtype=np.float64) + np.asarray(log_lr, dtype=np.float64))


def shiryaev_roberts(log_r: ArrayLike, log_lr: ArrayLike, level: float) -> tuple[FloatArray, NDArray[np.bool_]]:
    """One step of the Shiryaev-Roberts statistic, in logs, restarted at each alarm: (log R, alarm).

    ``R = (1 + R) x LR``; an alarm when ``log R >= level``, after which R starts again from 0 (log R = -inf).
    Wherever every ratio has expectation at most 1 (the null), ``R_t - t`` plus the alarms' R is a supermartingale
    from 0, so the expected number of alarms in T steps is at most ``T e^-level``. ``R >= e^S`` for the CUSUM S of
    the same ratios: it alarms no later.
    """
    log_r = np.logaddexp(0.0, np.asarray(log_r, dtype=np.float64)) + np.asarray(log_lr, dtype=np.float64)
    alarm = log_r >= level
    return np.where(alarm, -np.inf, log_r), alarm


def alarm_level(n_detectors: int, steps_per_day: float, false_alarms_per_day: float) -> float:
    """The level h that keeps the expected number of false alarms over all of a model's detectors at most
    ``false_alarms_per_day`` per day: h = log(detectors x steps per day / budget).

    >>> round(alarm_level(100, 1440, 0.01), 3)
    16.483
    """
    if n_detectors < 1 or steps_per_day <= 0 or false_alarms_per_day <= 0:
        raise ValueError("alarm_level needs detectors >= 1, steps > 0 and a budget > 0")
    return math.log(n_detectors * steps_per_day / false_alarms_per_day)
