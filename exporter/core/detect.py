"""Sequential change detection on per-step counts: exact likelihood ratios, CUSUM, and the alarm level.

Two groups, one step: ``k_a`` of ``n_a`` and ``k_b`` of ``n_b`` events are positive. Given ``k = k_a + k_b``,
under H0 (both groups share one rate, whatever its value and however it moves from step to step) ``k_a`` is
hypergeometric; under the alternative "odds ratio psi" it is Fisher's noncentral hypergeometric. Their ratio

    LR = psi ** k_a / E_H0[psi ** X]

has ``E_H0[LR | k] = 1`` exactly, at any base rate and any volume: no Gaussian approximation, no nuisance
parameter. With ``psi`` chosen from earlier steps only, the LRs are the increments of test martingales:

* Shiryaev-Roberts ``R_t = (1 + R_{t-1}) LR_t``, restarted at 0 after each alarm at ``R >= e^h``, makes at most
  ``steps x e^-h`` false alarms in expectation (``R_t - t`` is a martingale): this raises the alarms;
* CUSUM ``S_t = max(0, S_{t-1} + log LR_t)`` is the largest log product over all start steps (``S <= log R``): the
  evidence of a change now, which says when an alarm is over.

Pure functions, vectorised over any array shape, numpy only.
"""

from __future__ import annotations

import math
from typing import Final

import numpy as np
from numpy.typing import ArrayLike, NDArray

FloatArray = NDArray[np.float64]

RATE_MARGIN: Final = 0.005
"""Alternatives keep both rates at least this far from 0 and 1 (their odds ratio stays finite)."""
SECONDS_PER_DAY: Final = 86_400.0

_log_factorials: FloatArray = np.zeros(1)


def log_factorial(n: ArrayLike) -> FloatArray:
    """log(n!) elementwise, from a table of cumulative log sums that grows on demand."""
    global _log_factorials
    values = np.asarray(n, dtype=np.int64)
    top = int(values.max(initial=0))
    if top >= len(_log_factorials):
        size = max(top + 1, 2 * len(_log_factorials))
        _log_factorials = np.concatenate(([0.0], np.cumsum(np.log(np.arange(1, size, dtype=np.float64)))))
    return _log_factorials[values]


def _noncentral_mode(n_a: FloatArray, n_b: FloatArray, k: FloatArray, psi: FloatArray) -> FloatArray:
    """Mode of Fisher's noncentral hypergeometric distribution (Fog 2008), psi = 1 included."""
    total = n_a + n_b
    a = psi - 1.0
    b = n_a + k - total - (n_a + k + 2.0) * psi
    c = (n_a + 1.0) * (k + 1.0) * psi
    with np.errstate(invalid="ignore", divide="ignore"):
        mode = np.floor(-2.0 * c / (b - np.sqrt(np.maximum(b * b - 4.0 * a * c, 0.0))))
    return np.clip(np.nan_to_num(mode), np.maximum(0.0, k - n_b), np.minimum(k, n_a))


def log_hypergeometric_mgf(log_psi: ArrayLike, n_a: ArrayLike, n_b: ArrayLike, k: ArrayLike) -> FloatArray:
    """log E[psi ** X] for X hypergeometric (k draws from n_a + n_b items of which n_a are marked).

    ``log_psi`` has the counts' shape plus any trailing axes: several alternatives of one step share the
    hypergeometric terms, computed once. A log-sum-exp over the support, padded across the elements. Large
    supports are summed over the modes of the tilted distributions +- 20 sqrt(m) + 20 terms (m = the smallest
    margin, whose quarter bounds the variance): the distribution is log-concave, so the terms left out are below
    e^-38 of the total.

    The terms are computed by blocks of elements of about the same support width (laid out alternatives x
    support x elements: each operation runs along the elements), each element's terms then summed over the
    widest support padded with zeros: a float sum depends on its length, and that sum is the one made here
    since the first version (the alarms' statistics stay the same to the bit).
    """
    n_a, n_b, k = np.broadcast_arrays(*(np.asarray(x, dtype=np.int64) for x in (n_a, n_b, k)))
    counts_shape = n_a.shape
    lp = np.asarray(log_psi, dtype=np.float64)
    lp = np.broadcast_to(lp, (*counts_shape, *lp.shape[len(counts_shape):]))
    extra = lp.shape[len(counts_shape):]
    if not n_a.size:
        return np.zeros((*counts_shape, *extra))
    n_a, n_b, k = n_a.ravel(), n_b.ravel(), k.ravel()
    lp = lp.reshape(len(n_a), -1)
    lo = np.maximum(0, k - n_b)
    hi = np.minimum(k, n_a)
    margin = np.minimum(np.minimum(n_a, n_b), np.minimum(k, n_a + n_b - k))
    half = 20 + np.ceil(20.0 * np.sqrt(margin)).astype(np.int64)
    column = (n_a.astype(np.float64)[:, None], n_b.astype(np.float64)[:, None], k.astype(np.float64)[:, None])
    modes = _noncentral_mode(column[0], column[1], column[2], np.exp(lp)).astype(np.int64)
    start = np.maximum(lo, modes.min(axis=1) - half)
    lengths = np.minimum(hi, modes.max(axis=1) + half) - start + 1
    width = int(lengths.max())
    constant = (log_factorial(n_a) + log_factorial(n_b) + log_factorial(k) + log_factorial(n_a + n_b - k)
                - log_factorial(n_a + n_b))  # fmt: skip
    table = _log_factorials  # now holds every factorial below
    order = np.argsort(lengths, kind="stable")
    step = max(8, width // 16)
    widths = np.minimum(-(-lengths[order] // step) * step, width)
    cuts = np.flatnonzero(np.diff(widths)) + 1
    lp_t, n_alt = np.ascontiguousarray(lp.T), lp.shape[1]
    firsts, lasts = np.r_[0, cuts], np.r_[cuts, len(order)]
    largest = int((lasts - firsts).max())
    scratch = np.empty(largest * n_alt * width)  # one block's terms at a time, and their lanes of no term
    no_term = np.empty(len(scratch), dtype=bool)
    # a block's terms padded with zeros to the widest support: the blocks' widths grow, so a block's rows past its
    # own width were never written and hold their zeros
    summed = np.zeros((largest, n_alt, width))
    out = np.empty_like(lp)
    for first, last in zip(firsts, lasts, strict=True):
        rows, w = order[first:last], int(widths[first])
        offsets = np.arange(w)[:, None]
        x = start[rows] + offsets  # (support, elements)
        outside = offsets >= lengths[rows]
        np.copyto(x, np.broadcast_to(start[rows], x.shape), where=outside)
        base = -(table.take(x) + table.take(n_a[rows] - x) + table.take(k[rows] - x) + table.take((n_b - k)[rows] + x))
        base += constant[rows]
        np.copyto(base, -np.inf, where=outside)
        shape = (n_alt, w, len(rows))
        terms = scratch[: np.prod(shape)].reshape(shape)
        np.multiply(lp_t[:, rows][:, None, :], x.astype(np.float64), out=terms)  # in place from here: cheap ops
        terms += base
        peak = terms.max(axis=1)
        terms -= peak[:, None, :]
        padded = np.less(terms, -750.0, out=no_term[: terms.size].reshape(shape))  # exp is 0 there (the padding,
        np.copyto(terms, 0.0, where=padded)  # underflows), and such lanes take numpy's slow path
        np.exp(terms, out=terms)
        np.copyto(terms, 0.0, where=padded)
        block = summed[: len(rows)]
        block[:, :, :w] = terms.transpose(2, 0, 1)
        out[rows] = peak.T + np.log(block.sum(axis=2))
    return out.reshape((*counts_shape, *extra))


def two_sample_log_lr(k_a: ArrayLike, n_a: ArrayLike, k_b: ArrayLike, n_b: ArrayLike, log_psi: ArrayLike) -> FloatArray:
    """log of the exact conditional likelihood ratio of odds ratio exp(log_psi) (group a over b) against equal rates.

    ``log_psi`` may carry trailing axes beyond the counts' shape (several alternatives per step). 0 when the step
    carries no information (a group is empty, or every event or no event is positive).

    >>> round(float(two_sample_log_lr(3, 3, 0, 3, np.log(9.0))), 4)  # all 3 positives in a: C(6,3) / sum
    2.2479
    """
    k_a, n_a, k_b, n_b = (np.asarray(x, dtype=np.int64) for x in (k_a, n_a, k_b, n_b))
    log_psi = np.asarray(log_psi, dtype=np.float64)
    trailing = (slice(None),) * k_a.ndim + (None,) * (log_psi.ndim - k_a.ndim)
    return k_a[trailing] * log_psi - log_hypergeometric_mgf(log_psi, n_a, n_b, k_a + k_b)


def one_sample_log_lr(k: ArrayLike, n: ArrayLike, p0: ArrayLike, p1: ArrayLike) -> FloatArray:
    """log of the binomial likelihood ratio of rate p1 against rate p0 for k positives of n (expectation 1 at p0)."""
    k, n = np.asarray(k, dtype=np.float64), np.asarray(n, dtype=np.float64)
    p0, p1 = np.asarray(p0, dtype=np.float64), np.asarray(p1, dtype=np.float64)
    return k * (np.log(p1) - np.log(p0)) + (n - k) * (np.log1p(-p1) - np.log1p(-p0))


def logit(p: ArrayLike) -> FloatArray:
    p = np.asarray(p, dtype=np.float64)
    return np.log(p) - np.log1p(-p)


def gap_log_odds_ratio(pooled_rate: ArrayLike, threshold: float) -> FloatArray:
    """log odds ratio of the alternative "rates differ by 2 x threshold, centred on the pooled rate".

    The centre is clipped so both rates stay inside (0, 1); the configured threshold is then the reference value
    of the CUSUM: a true gap below it makes the statistic drift down, a gap above it drift up.
    """
    half = min(float(threshold), 0.5 - 2 * RATE_MARGIN)
    centre = np.clip(np.nan_to_num(np.asarray(pooled_rate, dtype=np.float64), nan=0.5),
                     half + RATE_MARGIN, 1.0 - half - RATE_MARGIN)  # fmt: skip
    return logit(centre + half) - logit(centre - half)


def ratio_log_odds_ratio(pooled_rate: ArrayLike, threshold: float) -> FloatArray:
    """log odds ratio of the alternative "lower rate / higher rate = threshold ** 2, their mean the pooled rate"."""
    ratio = float(threshold) ** 2
    ceiling = (1.0 - RATE_MARGIN) * (1.0 + ratio) / 2.0
    centre = np.clip(np.nan_to_num(np.asarray(pooled_rate, dtype=np.float64), nan=0.5), RATE_MARGIN, ceiling)
    high = 2.0 * centre / (1.0 + ratio)
    return logit(high) - logit(ratio * high)


def cusum(statistic: ArrayLike, log_lr: ArrayLike) -> FloatArray:
    """One CUSUM step: max(0, S + log LR)."""
    return np.maximum(0.0, np.asarray(statistic, dtype=np.float64) + np.asarray(log_lr, dtype=np.float64))


def shiryaev_roberts(log_r: ArrayLike, log_lr: ArrayLike, level: float) -> tuple[FloatArray, NDArray[np.bool_]]:
    """One step of the Shiryaev-Roberts statistic, in logs, restarted at each alarm: (log R, alarm).

    ``R = (1 + R) x LR``; an alarm when ``log R >= level``, after which R starts again from 0 (log R = -inf).
    Under no change ``R_t - t`` plus the alarms' R is a martingale from 0, so the expected number of alarms in
    T steps is at most ``T e^-level``. ``R >= e^S`` for the CUSUM S of the same ratios: it alarms no later.
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
