"""The metric table: every fact about every pairwise fairness metric, in one place.

A metric compares one or more per-group rates (:data:`exporter.core.fairness.RATES`) between two groups:

* a **difference** is ``max`` over its rates of ``|rate_a - rate_b|`` (one rate for most metrics, two for
  equalised odds), with a Newcombe interval per rate; with k rates each is taken at ``1 - 0.05/k`` (Bonferroni,
  continuity-corrected), so the interval of the max covers at least 95% simultaneously. It passes at or below its
  threshold.
* a **ratio** is ``min(rate_a, rate_b) / max(rate_a, rate_b)`` with a Katz log interval capped at 1, undefined
  (insufficient, never 0) when a group has no success. It passes at or above its threshold.

Config validation, the gate, the collector, the seed API, the rules generator and the docs read :data:`METRICS`,
so adding a metric is one entry here (see docs/adding-a-metric.md).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, fields
from functools import cache
from statistics import NormalDist
from typing import Final, Literal

import numpy as np
from numpy.typing import ArrayLike, NDArray

from exporter.core.fairness import (
    RATE_TRIALS,
    Z_95,
    FloatArray,
    IntArray,
    abs_interval,
    exact,
    newcombe_interval,
    rate_counts,
    ratio,
    ratio_interval,
)
from exporter.core.scores import auc_gap, calibration_gap

CONFIDENCE: Final = 0.95
EVIDENCE: Final = ("pass", "fail", "inconclusive")
"""What a comparison's interval says against its threshold (the states of model_comparison_evidence)."""


@dataclass(frozen=True)
class MetricValues:
    """One metric for pairs of groups: value, reported interval, precision and the counts it rests on."""

    value: FloatArray
    lower: FloatArray
    upper: FloatArray
    half_width: FloatArray
    """Half-width of the interval on the metric's own scale (the signed difference's, before folding)."""
    support: IntArray
    """The smallest count any of the compared rates rests on, over both groups (what min_samples counts)."""

    @property
    def interval(self) -> tuple[FloatArray, FloatArray]:
        """(lower, upper) of the reported 95% interval."""
        return self.lower, self.upper

    def take(self, rows: slice | NDArray) -> MetricValues:
        """The same values restricted to some pairs (the field names read once: a fleet takes thousands)."""
        return MetricValues(*(getattr(self, name)[rows] for name in _VALUE_FIELDS))


_VALUE_FIELDS: Final = tuple(f.name for f in fields(MetricValues))


@dataclass(frozen=True)
class Metric:
    """One row of the metric table."""

    name: str
    rates: tuple[str, ...]
    kind: Literal["difference", "ratio"]
    default_threshold: float
    formula: str
    """The definition in words, used in HELP texts, reports and docs."""
    seed: bool = False
    """One of the seed's three metrics: the daemon exports it even when the config does not name it."""
    scores: ScoreGap | None = None
    """Compared from each group's labelled score histogram by this function (:mod:`exporter.core.scores`), not from
    its counts: only for a model that emits scores."""
    trials: tuple[str, ...] = ()
    """A score metric's: the rates whose trials its support (what min_samples counts) is, per group."""

    @property
    def prometheus_name(self) -> str:
        """The gauge on /metrics (with ``_lower``/``_upper`` companions)."""
        return f"model_{self.name}"

    @property
    def needs_labels(self) -> bool:
        """Whether the metric needs ground-truth labels (every rate but the selection rate does)."""
        return self.rates != ("selection_rate",)

    @property
    def counted(self) -> str:
        """What min_samples counts for this metric, per group: e.g. ``labelled positives and labelled negatives``."""
        rates = self.trials or self.rates
        return " and ".join(RATE_TRIALS[r] for r in rates)

    @property
    def help(self) -> str:
        """HELP text of the gauge."""
        return f"{self.formula}; absent when insufficient (see model_comparison_insufficient_samples)."

    def passes(self, value: float, threshold: float) -> bool:
        """Differences pass at or below the threshold; ratios at or above it."""
        return value <= threshold if self.kind == "difference" else value >= threshold

    def evidence(self, lower: ArrayLike, upper: ArrayLike, threshold: float) -> NDArray[np.str_]:
        """Per interval: ``pass`` when it lies wholly on the passing side of the threshold, ``fail`` when wholly
        beyond it, else (or undefined) ``inconclusive``."""
        lo, hi = np.asarray(lower, dtype=np.float64), np.asarray(upper, dtype=np.float64)
        with np.errstate(invalid="ignore"):  # NaN bounds compare False: inconclusive
            good, bad = (hi <= threshold, lo > threshold) if self.kind == "difference" else \
                (lo >= threshold, hi < threshold)  # fmt: skip
        return np.where(good, "pass", np.where(bad, "fail", "inconclusive"))

    def compute(self, counts: NDArray, a: NDArray, b: NDArray, rates: RateCounts | None = None,
                comparisons: ArrayLike = 1, histogram: NDArray | None = None) -> MetricValues:  # fmt: skip
        """This metric for pairs ``(a[i], b[i])`` of rows of a ``(n_groups, N_COUNTS)`` counts array (``rates``:
        the (successes, trials) of rates already reduced from these counts, shared between metrics).

        ``comparisons`` (per pair, or one for all): how many comparisons the pair's interval must cover together
        with others (Bonferroni): 1 gives each pair its own 95% interval, K the intervals of a family of K whose
        union covers 95% (the worst group's, and the fail side of ``multiplicity:``). ``histogram``: the groups'
        labelled score histograms ``(n_groups, n_bins, 3)`` (negatives, positives, score sum per bin), which a
        score metric compares (without it, it has no value)."""
        family = np.broadcast_to(np.asarray(comparisons, dtype=np.int64), np.shape(a))
        if self.scores:
            if histogram is None:
                nan = np.full(np.shape(a), np.nan)
                return MetricValues(nan, nan, nan, nan, np.zeros(np.shape(a), dtype=np.int64))
            return MetricValues(*self.scores(histogram, a, b, _zs(family)))
        rates = {} if rates is None else rates
        for rate in self.rates:
            if rate not in rates:
                rates[rate] = rate_counts(counts, rate)
        return _difference(self, rates, a, b, family) if self.kind == "difference" else \
            _ratio(self, rates, a, b, family)  # fmt: skip


RateCounts = dict[str, tuple[IntArray, IntArray]]
ScoreGap = Callable[[NDArray, NDArray, NDArray, "FloatArray | float"],
                    tuple[FloatArray, FloatArray, FloatArray, FloatArray, IntArray]]
"""A score metric's function of the groups' labelled score histograms, pairs and quantile (:mod:`.scores`)."""


@cache
def _z(n_rates: int) -> float:
    """Normal quantile of each of ``n_rates`` intervals whose union covers CONFIDENCE (Bonferroni)."""
    return NormalDist().inv_cdf(1.0 - (1.0 - CONFIDENCE) / (2 * n_rates))


def _zs(intervals: IntArray) -> FloatArray | float:
    """:func:`_z` per pair (a handful of distinct counts; one number when they are all the same, as for the 95%
    intervals of every comparison)."""
    if intervals.size == 0 or (intervals == intervals.flat[0]).all():
        return _z(int(intervals.flat[0]) if intervals.size else 1)
    values, inverse = np.unique(intervals, return_inverse=True)
    return np.array([_z(int(v)) for v in values], dtype=np.float64)[inverse.reshape(np.shape(intervals))]


def _newcombe(k: IntArray, n: IntArray, a: NDArray, b: NDArray, intervals: IntArray) -> tuple[FloatArray, FloatArray]:
    """Newcombe's interval per pair at the level of one of ``intervals`` simultaneous ones. Bonferroni guarantees
    its level only if each component reaches its own: method 10 covers its level on average but dips about 0.3
    points below it (0.972 for 0.975 at rate 0.5, 100 per group), so a pair in a union (intervals > 1) uses the
    continuity-corrected method 11, which stays above it."""
    z, union = _zs(intervals), intervals > 1
    if union.all() or not union.any():
        return newcombe_interval(k[a], n[a], k[b], n[b], z, continuity=bool(union.all()) and union.size > 0)
    plain = newcombe_interval(k[a], n[a], k[b], n[b], z)
    corrected = newcombe_interval(k[a], n[a], k[b], n[b], z, continuity=True)
    return np.where(union, corrected[0], plain[0]), np.where(union, corrected[1], plain[1])


def _difference(metric: Metric, rates: RateCounts, a: NDArray, b: NDArray, family: IntArray) -> MetricValues:
    intervals = len(metric.rates) * family
    parts = []
    for rate in metric.rates:
        k, n = rates[rate]
        lo, hi = _newcombe(k, n, a, b, intervals)
        folded = abs_interval(lo, hi)
        value = np.abs(ratio(k[a], n[a]) - ratio(k[b], n[b]))
        parts.append((value, *folded, (hi - lo) / 2.0, np.minimum(n[a], n[b])))
    # np.maximum propagates NaN: a metric with an undefined component is undefined.
    value, lower, upper, half, _ = (np.maximum.reduce([p[i] for p in parts]) for i in range(5))
    support = np.minimum.reduce([p[4] for p in parts])
    return MetricValues(value, lower, upper, half, support.astype(np.int64))


def _ratio(metric: Metric, rates: RateCounts, a: NDArray, b: NDArray, family: IntArray) -> MetricValues:
    (rate,) = metric.rates
    k, n = rates[rate]
    p = ratio(k, n)
    a_is_low = p[a] <= p[b]
    low, high = np.where(a_is_low, a, b), np.where(a_is_low, b, a)
    defined = (k[low] > 0) & (k[high] > 0)  # a group with no success has no meaningful ratio
    value = np.where(defined, ratio(k[low] * n[high], k[high] * n[low]), np.nan)
    # alone, Z_95 as the ratio always had (inv_cdf differs in the last bit: reports stay bit for bit the same)
    lo, hi = ratio_interval(k[low], n[low], k[high], n[high], np.where(family > 1, _zs(family), Z_95))
    lower = np.where(defined, np.clip(lo, 0.0, 1.0), np.nan)
    upper = np.where(defined, np.clip(hi, 0.0, 1.0), np.nan)
    return MetricValues(value, lower, upper, (upper - lower) / 2.0, np.minimum(n[a], n[b]).astype(np.int64))


# fmt: off
METRICS: Final[dict[str, Metric]] = {m.name: m for m in (
    Metric("demographic_parity_difference", ("selection_rate",), "difference", 0.05,
           "|selection rate a - selection rate b|", seed=True),
    Metric("equalised_odds_difference", ("true_positive_rate", "false_positive_rate"), "difference", 0.05,
           "max(|TPR a - TPR b|, |FPR a - FPR b|) over labelled predictions", seed=True),
    Metric("disparate_impact_ratio", ("selection_rate",), "ratio", 0.80,
           "min/max of the two selection rates (four-fifths rule: below 0.8 is adverse)", seed=True),
    Metric("equal_opportunity_difference", ("true_positive_rate",), "difference", 0.05,
           "|TPR a - TPR b| over labelled positives"),
    Metric("false_positive_rate_difference", ("false_positive_rate",), "difference", 0.05,
           "|FPR a - FPR b| over labelled negatives"),
    Metric("predictive_parity_difference", ("precision",), "difference", 0.05,
           "|PPV a - PPV b| (precision) over labelled positive predictions"),
    Metric("accuracy_difference", ("accuracy",), "difference", 0.05,
           "|accuracy a - accuracy b| over labelled predictions"),
    # The error-rate ratios auditors read against the four-fifths tradition (Aequitas' disparities, folded to min/max
    # so that 0.8 here is Aequitas' band 0.8..1.25). The differences of FNR, TNR, FDR and FOR are not rows: they
    # equal equal_opportunity, false_positive_rate, predictive_parity and negative_predictive_value differences.
    Metric("negative_predictive_value_difference", ("negative_predictive_value",), "difference", 0.05,
           "|NPV a - NPV b| over labelled negative predictions"),
    Metric("false_positive_rate_ratio", ("false_positive_rate",), "ratio", 0.80,
           "min/max of the two false positive rates over labelled negatives"),
    Metric("false_negative_rate_ratio", ("false_negative_rate",), "ratio", 0.80,
           "min/max of the two false negative rates over labelled positives"),
    Metric("true_negative_rate_ratio", ("true_negative_rate",), "ratio", 0.80,
           "min/max of the two true negative rates (specificity) over labelled negatives"),
    Metric("negative_predictive_value_ratio", ("negative_predictive_value",), "ratio", 0.80,
           "min/max of the two negative predictive values over labelled negative predictions"),
    Metric("false_discovery_rate_ratio", ("false_discovery_rate",), "ratio", 0.80,
           "min/max of the two false discovery rates over labelled positive predictions"),
    Metric("false_omission_rate_ratio", ("false_omission_rate",), "ratio", 0.80,
           "min/max of the two false omission rates over labelled negative predictions"),
    # Score-based parity (a model that emits scores): how well the scores rank, and how well they are calibrated,
    Metric("auc_difference", (), "difference", 0.05,
           "|AUC a - AUC b| of the scores (binned by events.score_buckets) among labelled predictions",
           scores=auc_gap, trials=("true_positive_rate", "false_positive_rate")),
    Metric("calibration_difference", (), "difference", 0.05,
           "|ECE a - ECE b|: expected calibration errors over the score bins (events.score_buckets) among labelled "
           "predictions", scores=calibration_gap, trials=("accuracy",)),
)}
# fmt: on
METRIC_NAMES: Final = tuple(METRICS)
COUNT_METRICS: Final = tuple(name for name, m in METRICS.items() if not m.scores)
"""The metrics of the counts alone: each has a seed-style function and a fleet-wide recording rule (a score metric
needs the scores, and an AUC does not re-aggregate across replicas)."""


@dataclass(frozen=True)
class Comparisons:
    """Every metric of the table for pairs ``(group_a[i], group_b[i])`` of group rows."""

    group_a: IntArray
    group_b: IntArray
    metrics: dict[str, MetricValues]

    def take(self, rows: slice | NDArray, group_a: IntArray, group_b: IntArray) -> Comparisons:
        """Some pairs, renumbered to ``group_a``/``group_b``."""
        return Comparisons(group_a, group_b, {k: v.take(rows) for k, v in self.metrics.items()})


def compare(counts: NDArray, group_a: NDArray, group_b: NDArray, metrics: Iterable[str] = METRICS,
            histogram: NDArray | None = None) -> Comparisons:  # fmt: skip
    """The named metrics (default: every metric of :data:`METRICS`) for each pair of rows of ``counts`` (and of
    ``histogram``, the groups' labelled score histograms, for the score metrics)."""
    a = np.asarray(group_a, dtype=np.int64)
    b = np.asarray(group_b, dtype=np.int64)
    c = exact(counts)
    rates: RateCounts = {}
    return Comparisons(a, b, {name: METRICS[name].compute(c, a, b, rates, histogram=histogram) for name in metrics})


def samples_to_decide(half_width: float, value: float, threshold: float, samples: Mapping[str, float]) -> \
        dict[str, int] | None:  # fmt: skip
    """Samples per group at which the interval (half-width ~ 1/sqrt(n)) would no longer reach the threshold from
    the current value; None when the value sits on the threshold or is undefined."""
    gap = abs(value - threshold)
    if not (gap > 0 and math.isfinite(half_width) and math.isfinite(gap)):
        return None
    factor = (half_width / gap) ** 2
    return {g: math.ceil(n * factor) for g, n in samples.items()}
