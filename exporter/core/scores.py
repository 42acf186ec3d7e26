"""Score-based parity: each group's AUC and expected calibration error from its labelled score histogram, and the
gap between two groups.

A group's labelled score histogram (per score bin, ascending, its labelled negatives and positives; the daemon and
the gate keep it as the estimation's score counts, reduced by :func:`exporter.core.evaluate.labelled_histogram`) is
all the AUC needs: the probability that a positive scores above a negative, a tie (the same bin) counting one half,
which is scikit-learn's ``roc_auc_score`` of the binned scores. Its variance is DeLong's, from each positive's and
each negative's placement, which a histogram gives per bin; its interval is taken on the logit scale
(:func:`auc_interval`), and a gap's interval combines the two groups' intervals by Newcombe's square roots (MOVER;
the groups are independent samples). Pure functions of additive counts, numpy only.

The expected calibration error needs one more column per bin: the sum of the labelled predictions' scores
(``histogram[..., 2]``; the daemon keeps it per bin beside the counts, a late label adding its prediction's score).
ECE of a group over the score bins: ``sum_b (n_b / n) |pos_b / n_b - mean score_b| = sum_b |pos_b - score sum_b| / n``
over its labelled predictions. Its interval (:func:`calibration_gap`) is a conservative bound, not a normal interval:
see docs/auditor/numbers.md#calibration-within-groups.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray

from exporter.core.fairness import FloatArray, IntArray, abs_interval, mover, wilson_interval

SCORE_SUM: int = 2
"""Column of a labelled score histogram holding the bin's sum of labelled scores (after negatives and positives)."""


def auc(histogram: NDArray) -> tuple[FloatArray, FloatArray, IntArray]:
    """Per group of a labelled score histogram ``(n_groups, n_bins, 2)``: the AUC of its binned scores, DeLong's
    variance of it, and the smaller of its labelled positives and negatives (what ``min_samples`` counts); NaN
    without a positive or a negative (the variance: without two of each).

    >>> a, v, n = auc(np.array([[[3, 0], [1, 1], [0, 2]]]))
    >>> round(float(a[0]), 4), int(n[0])  # 3 positives, 4 negatives: (1 * (3 + 0.5) + 2 * 4) / 12
    (0.9583, 3)
    """
    h = np.asarray(histogram, dtype=np.float64)
    neg, pos = h[..., 0], h[..., 1]
    n_pos, n_neg = pos.sum(axis=-1), neg.sum(axis=-1)
    below_neg = np.cumsum(neg, axis=-1) - neg  # negatives in lower bins
    above_pos = n_pos[..., None] - np.cumsum(pos, axis=-1)  # positives in higher bins
    with np.errstate(invalid="ignore", divide="ignore"):
        v10 = (below_neg + neg / 2.0) / n_neg[..., None]  # a positive's share of the negatives below it, per bin
        v01 = (above_pos + pos / 2.0) / n_pos[..., None]  # a negative's share of the positives above it
        a = (pos * v10).sum(axis=-1) / n_pos
        s10 = (pos * (v10 - a[..., None]) ** 2).sum(axis=-1) / (n_pos - 1)
        s01 = (neg * (v01 - a[..., None]) ** 2).sum(axis=-1) / (n_neg - 1)
        variance = s10 / n_pos + s01 / n_neg
    defined = (n_pos > 0) & (n_neg > 0)
    support = np.minimum(n_pos, n_neg).astype(np.int64)
    return np.where(defined, a, np.nan), np.where(defined & (support > 1), variance, np.nan), support


def auc_interval(value: FloatArray, variance: FloatArray, support: NDArray,
                 z: FloatArray | float) -> tuple[FloatArray, FloatArray]:  # fmt: skip
    """Per group (the outputs of :func:`auc`): the bounds of its AUC's interval at quantile ``z``, DeLong's variance
    on the logit scale (Pohar Perme and Manevski 2019): inside 0..1 and wider towards the nearer end, where a small
    group's AUC near 1 has a DeLong variance too small for a normal interval (0.82 coverage at 30 positives and 30
    negatives, AUC 0.98). Where DeLong's variance is 0 (no spread to estimate it from: the positives' and the
    negatives' bins do not overlap, or all are one bin), Wilson's interval at ``support`` trials: the score interval
    of the largest variance any AUC can have, ``A (1 - A) / min(positives, negatives)`` (Birnbaum and Klose 1957)."""
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        logit = np.log(value / (1.0 - value))
        spread = z * np.sqrt(variance) / (value * (1.0 - value))
        lower, upper = 1.0 / (1.0 + np.exp(spread - logit)), 1.0 / (1.0 + np.exp(-logit - spread))
    flat_low, flat_high = wilson_interval(value * support, support, z)
    flat = variance == 0
    return np.where(flat, flat_low, lower), np.where(flat, flat_high, upper)


def auc_gap(histogram: NDArray, a: NDArray, b: NDArray,
            z: FloatArray | float) -> tuple[FloatArray, FloatArray, FloatArray, FloatArray, IntArray]:
    """Per pair: ``|AUC a - AUC b|``, its interval (the signed gap's, from the groups' :func:`auc_interval` at
    quantile ``z`` by :func:`exporter.core.fairness.mover`, folded as a difference's), the half-width and the support
    (the smallest count of labelled positives or negatives)."""
    value, variance, support = auc(histogram)
    (low_a, high_a), (low_b, high_b) = (auc_interval(value[g], variance[g], support[g], z) for g in (a, b))
    gap = value[a] - value[b]
    low, high = mover(gap, value[a], low_a, high_a, value[b], low_b, high_b)
    lower, upper = abs_interval(low, high)
    return np.abs(gap), np.clip(lower, 0.0, 1.0), np.clip(upper, 0.0, 1.0), (high - low) / 2.0, \
        np.minimum(support[a], support[b]).astype(np.int64)  # fmt: skip


def calibration(histogram: NDArray) -> tuple[FloatArray, FloatArray, FloatArray, IntArray]:
    """Per group of a labelled score histogram with score sums ``(n_groups, n_bins, 3)``: its expected calibration
    error; ``bias``, a bound on how far noise can lift it (``sum_b w_b sigma_b``, ``sigma_b`` the standard error of a
    bin's mean label, its rate shrunk by a half count); ``variance``, that of its noise (``sum_b w_b^2 sigma_b^2``
    plus the bins' shares' multinomial variance); and its labelled predictions. NaN without one.

    >>> e, _, _, n = calibration(np.array([[[3, 1, 0.8], [1, 3, 2.8]]]))  # 8 rows: |1 - 0.8| + |3 - 2.8| over 8
    >>> round(float(e[0]), 4), int(n[0])
    (0.05, 8)
    """
    h = np.asarray(histogram, dtype=np.float64)
    pos, rows, sums = h[..., 1], h[..., 0] + h[..., 1], h[..., SCORE_SUM]
    n = rows.sum(axis=-1)
    with np.errstate(invalid="ignore", divide="ignore"):
        ece = np.abs(pos - sums).sum(axis=-1) / n
        shrunk = (pos + 0.5) / (rows + 1.0)
        sigma2 = np.where(rows > 0, shrunk * (1.0 - shrunk) / rows, 0.0)
        share = rows / n[..., None]
        gap2 = np.where(rows > 0, ((pos - sums) / rows) ** 2, 0.0)
        bias = (share * np.sqrt(sigma2)).sum(axis=-1)
        variance = (share**2 * sigma2).sum(axis=-1) + ((share * gap2).sum(axis=-1) - ece**2) / n
    ok = n > 0
    return np.where(ok, ece, np.nan), np.where(ok, bias, np.nan), np.where(ok, variance, np.nan), \
        n.astype(np.int64)  # fmt: skip


def calibration_gap(histogram: NDArray, a: NDArray, b: NDArray,
                    z: FloatArray | float) -> tuple[FloatArray, FloatArray, FloatArray, FloatArray, IntArray]:
    """Per pair: ``|ECE a - ECE b|``, its interval, the half-width and the support (the smaller group's labelled
    predictions). A plug-in ECE errs upward by at most its noise's absolute value, ``sum_b w_b |e_b|`` (mean at most
    ``bias``), and downward by at most a zero-mean sum (``|d| - |d + e| <= -sign(d) e``), so the signed gap
    ``ECE a - ECE b`` lies within ``[gap - bias_a - z s, gap + bias_b + z s]``, ``s`` the root of both variances;
    folded as a difference's."""
    value, bias, variance, n = calibration(histogram)
    gap = value[a] - value[b]
    spread = z * np.sqrt(variance[a] + variance[b])
    low, high = gap - bias[a] - spread, gap + bias[b] + spread
    lower, upper = abs_interval(low, high)
    return np.abs(gap), np.clip(lower, 0.0, 1.0), np.clip(upper, 0.0, 1.0), (high - low) / 2.0, \
        np.minimum(n[a], n[b]).astype(np.int64)  # fmt: skip
