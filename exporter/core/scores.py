"""Score-based parity: each group's AUC from its labelled score histogram, and the gap between two groups.

A group's labelled score histogram (per score bin, ascending, its labelled negatives and positives; the daemon and
the gate keep it as the estimation's score counts, reduced by :func:`exporter.core.evaluate.labelled_histogram`) is
all the AUC needs: the probability that a positive scores above a negative, a tie (the same bin) counting one half,
which is scikit-learn's ``roc_auc_score`` of the binned scores. Its variance is DeLong's, from each positive's and
each negative's placement, which a histogram gives per bin. Groups are independent samples, so the variance of a gap
is the sum of theirs. Pure functions of additive counts, numpy only.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray

from exporter.core.fairness import FloatArray, IntArray, abs_interval


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


def auc_gap(histogram: NDArray, a: NDArray, b: NDArray,
            z: FloatArray | float) -> tuple[FloatArray, FloatArray, FloatArray, FloatArray, IntArray]:
    """Per pair: ``|AUC a - AUC b|``, its interval (the signed gap's normal interval at quantile ``z``, folded as a
    difference's), the half-width and the support (the smallest count of labelled positives or negatives)."""
    value, variance, support = auc(histogram)
    gap = value[a] - value[b]
    half = z * np.sqrt(variance[a] + variance[b])
    lower, upper = abs_interval(gap - half, gap + half)
    return np.abs(gap), np.clip(lower, 0.0, 1.0), np.clip(upper, 0.0, 1.0), half, \
        np.minimum(support[a], support[b]).astype(np.int64)  # fmt: skip
