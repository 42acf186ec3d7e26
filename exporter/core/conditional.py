"""Parity conditional on strata (legitimate factors such as an income band): does a gap survive within them?

* ``conditional_demographic_parity_difference`` and ``conditional_equal_opportunity_difference``: the
  Mantel-Haenszel risk difference of the two groups' selection rates (TPRs) over the strata, weights
  ``n_as * n_bs / n_s``, with a stratified Newcombe interval (:func:`mantel_haenszel`), which on one stratum is
  Newcombe's interval of the unconditional gap. A stratum holding one group only has weight 0: it drops out,
  counted.
* ``conditional_demographic_disparity``: SageMaker Clarify's CDD (CDDPL on predictions), under its own name so a user
  moving from Clarify finds the same number: per stratum, group a's share of the rejections minus its share of the
  acceptances (0 where there is none), averaged with the strata's sizes as weights; over the rows of the two groups
  compared (Clarify compares a facet with all other rows: the same number when the attribute has two groups).

Only rows in a known stratum (a real combination of the strata's values) are compared: a row missing a stratum value,
or whose combination came past the ``segment_values`` cap, has no stratum to be compared within, and pooling such rows
into one pseudo-stratum would bring back the very gap the strata condition on (:func:`known_strata`). Without a row
in a known stratum a comparison has no value (insufficient), never the raw gap.

Like every difference of the metric table, ``value`` is the absolute gap with its folded 95% interval; the signed one
(a - b, or Clarify's sign: positive when group a is over-represented among rejections) is kept beside it. As one of
K comparisons its interval is at 95%/K, as the table's are (:func:`compute_many`: the worst comparison and the
multiplicity rules, :mod:`exporter.core.multiplicity`). Counts are per (group, stratum):
``(n_groups, n_strata, N_COUNTS)``. Pure functions, no I/O, no pandas.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

import numpy as np
from numpy.typing import NDArray

from exporter.core.fairness import (
    PRED_NEG,
    PRED_POS,
    Z_95,
    FloatArray,
    IntArray,
    abs_interval,
    mover,
    rate_counts,
    wilson_interval,
)
from exporter.core.metric_table import METRICS, Metric, MetricValues, Request, simultaneous_z

# fmt: off
CONDITIONAL_METRICS: Final[dict[str, Metric]] = {m.name: m for m in (
    Metric("conditional_demographic_parity_difference", ("selection_rate",), "difference", 0.05,
           "|Mantel-Haenszel risk difference of the selection rates a - b over the strata| (weights n_as n_bs / n_s, "
           "stratified Newcombe interval)"),
    Metric("conditional_equal_opportunity_difference", ("true_positive_rate",), "difference", 0.05,
           "|Mantel-Haenszel risk difference of the TPRs a - b over the strata| (weights n_as n_bs / n_s, over "
           "labelled positives, stratified Newcombe interval)"),
    Metric("conditional_demographic_disparity", ("selection_rate",), "difference", 0.05,
           "|SageMaker Clarify's conditional demographic disparity (CDDPL)|: per stratum, group a's share of the "
           "rejections minus its share of the acceptances, weighted by the strata's sizes"),
)}
# fmt: on


def metric(name: str) -> Metric:
    """A metric of the table or a conditional one, by name."""
    return METRICS[name] if name in METRICS else CONDITIONAL_METRICS[name]


@dataclass(frozen=True)
class Stratified:
    """A conditional metric for pairs of groups: its values, the signed gap, and the strata used and dropped."""

    values: MetricValues
    signed: FloatArray
    strata_used: IntArray
    strata_dropped: IntArray
    """Strata with rows of one of the two groups only (no within-stratum comparison: weight 0)."""


def known_strata(counts: NDArray) -> NDArray:
    """The counts per group and known stratum ``(n_groups, n_strata, N_COUNTS)`` of the counts per group and value of
    the strata's key, whose last value is ``other`` (:class:`exporter.core.explain.SegmentValues`: rows missing a
    stratum value or past the cap), which no conditional metric counts."""
    return np.asarray(counts)[:, :-1]


def excluded_rows(missing: int, beyond_cap: int) -> dict[str, int]:
    """What a report says of the rows no conditional metric counts: missing a stratum value, or past the cap."""
    return {"rows_excluded": missing + beyond_cap, "rows_excluded_missing_value": missing,
            "rows_excluded_beyond_cap": beyond_cap}


def mantel_haenszel(k_a: NDArray, n_a: NDArray, k_b: NDArray, n_b: NDArray, z: float | FloatArray = Z_95,
                    continuity: bool | NDArray = False) -> tuple[FloatArray, FloatArray, FloatArray]:  # fmt: skip
    """The Mantel-Haenszel risk difference of a - b over the last axis (strata) and its interval at quantile ``z``:
    Newcombe's, from each group's stratified Wilson interval (:func:`_stratified_wilson`; ``continuity``, for all or
    per pair: continuity-corrected, as a difference's in a union); NaN when no stratum holds both groups.

    >>> k_a, n_a, k_b, n_b = np.array([30, 10]), np.array([100, 50]), np.array([20, 30]), np.array([100, 100])
    >>> rd, low, high = mantel_haenszel(k_a, n_a, k_b, n_b)
    >>> round(float(rd), 4), round(float(low), 4), round(float(high), 4)
    (0.02, -0.0699, 0.1126)
    """
    x1, m1, x0, m0 = (np.asarray(v, dtype=np.float64) for v in (k_a, n_a, k_b, n_b))
    t = m1 + m0
    with np.errstate(divide="ignore", invalid="ignore"):
        w = np.where(t > 0, m1 * m0 / t, 0.0)
        big_w = w.sum(axis=-1)
        rd = np.where(t > 0, (x1 * m0 - x0 * m1) / t, 0.0).sum(axis=-1) / big_w
        share = w / big_w[..., None]
    (p1, l1, u1), (p0, l0, u0) = (_stratified_wilson(x, m, share, z, continuity) for x, m in ((x1, m1), (x0, m0)))
    lower, upper = mover(rd, p1, l1, u1, p0, l0, u0)
    undefined = ~(big_w > 0)
    return np.where(undefined, np.nan, rd), np.where(undefined, np.nan, lower), np.where(undefined, np.nan, upper)


def _stratified_wilson(k: FloatArray, n: FloatArray, share: FloatArray, z: float | FloatArray,
                       continuity: bool | NDArray) -> tuple[FloatArray, FloatArray, FloatArray]:  # fmt: skip
    """A group's rate averaged over the strata with the Mantel-Haenszel shares, and its Wilson interval at the trials
    of one binomial rate as precise (Kish's effective size, mean (1 - mean) / variance, from the strata's rates
    shrunk by half a count so that a stratum of none or all selected still has some variance): the trials
    themselves on one stratum, and a score interval at every rate, never [0, 0] where no one is selected."""
    with np.errstate(divide="ignore", invalid="ignore"):
        used = share > 0
        shrunk = np.where(used, (k + 0.5) / (n + 1.0), 0.0)
        mean = (share * shrunk).sum(axis=-1)
        trials = mean * (1.0 - mean) / np.where(used, share**2 * shrunk * (1.0 - shrunk) / n, 0.0).sum(axis=-1)
        rate = (share * np.where(used, k / n, 0.0)).sum(axis=-1)
    lower, upper = wilson_interval(rate * trials, trials, z, continuity)
    return rate, lower, upper


def clarify_cdd(strata: NDArray, a: NDArray, b: NDArray) -> tuple[FloatArray, FloatArray]:
    """Clarify's CDD of group a among the rows of groups a and b (per pair), and a delta-method variance (each
    stratum's two shares binomial given its rejections and acceptances)."""
    c = np.asarray(strata, dtype=np.float64)
    pos_a, neg_a = c[a][..., PRED_POS], c[a][..., PRED_NEG]
    rejected = neg_a + c[b][..., PRED_NEG]
    accepted = pos_a + c[b][..., PRED_POS]
    size = rejected + accepted
    with np.errstate(divide="ignore", invalid="ignore"):
        q0 = np.where(rejected > 0, neg_a / rejected, 0.0)
        q1 = np.where(accepted > 0, pos_a / accepted, 0.0)
        v = np.where(rejected > 0, q0 * (1 - q0) / rejected, 0.0) + np.where(accepted > 0, q1 * (1 - q1) / accepted,
                                                                              0.0)  # fmt: skip
        total = size.sum(axis=-1)
        cdd = (size * (q0 - q1)).sum(axis=-1) / total
        var = (size**2 * v).sum(axis=-1) / total**2
    empty = ~(total > 0)
    return np.where(empty, np.nan, cdd), np.where(empty, np.nan, var)


def conditional_compare(name: str, strata: NDArray, group_a: NDArray, group_b: NDArray,
                        comparisons: NDArray | None = None) -> Stratified:  # fmt: skip
    """One conditional metric for pairs ``(group_a[i], group_b[i])`` of the groups of a ``(n_groups, n_strata,
    N_COUNTS)`` counts array; ``comparisons``: per pair, the K of its family, its interval then at 95%/K (default:
    each alone, 95%)."""
    a, b = np.asarray(group_a, dtype=np.int64), np.asarray(group_b, dtype=np.int64)
    (rate,) = CONDITIONAL_METRICS[name].rates
    k, n = rate_counts(strata, rate)  # (n_groups, n_strata)
    both = (n[a] > 0) & (n[b] > 0)
    dropped = ((n[a] > 0) ^ (n[b] > 0)).sum(axis=-1)
    # alone, Z_95 as before (inv_cdf differs in the last bit), as the table's ratios do
    family = np.ones(len(a), np.int64) if comparisons is None else np.asarray(comparisons, dtype=np.int64)
    z = np.where(family > 1, simultaneous_z(family), Z_95)
    if name == "conditional_demographic_disparity":
        signed, var = clarify_cdd(strata, a, b)
        low, high = signed - z * np.sqrt(var), signed + z * np.sqrt(var)
        used = ((n[a] > 0) | (n[b] > 0)).sum(axis=-1)
        dropped = np.zeros_like(dropped)
        support = np.minimum(n[a].sum(axis=-1), n[b].sum(axis=-1))
    else:  # continuity-corrected in a union, as the table's differences (_newcombe_in_union)
        signed, low, high = mantel_haenszel(k[a], n[a], k[b], n[b], z, family > 1)
        used = both.sum(axis=-1)
        support = np.minimum(np.where(both, n[a], 0).sum(axis=-1), np.where(both, n[b], 0).sum(axis=-1))
    lower, upper = abs_interval(low, high)
    values = MetricValues(np.abs(signed), lower, upper, (high - low) / 2.0, support.astype(np.int64))
    return Stratified(values, signed, used.astype(np.int64), dropped.astype(np.int64))


def compute_many(strata: NDArray, requests: Sequence[Request]) -> list[MetricValues]:
    """:func:`exporter.core.metric_table.compute_many` of conditional metrics: each request's pairs over the counts
    per stratum, each pair's interval at 95%/its K."""
    return [conditional_compare(m.name, strata, a, b, k).values for m, a, b, k in requests]
