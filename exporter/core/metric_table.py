"""The metric table: every fact about every pairwise fairness metric, in one place.

A metric compares one or more per-group rates (:data:`exporter.core.fairness.RATES`) between two groups:

* a **difference** is ``max`` over its rates of ``|rate_a - rate_b|`` (one rate for most metrics, two for
  equalised odds), with a Newcombe interval per rate; with k rates each is taken at ``1 - 0.05/k`` (Bonferroni,
  continuity-corrected), so the interval of the max covers at least 95% simultaneously. It passes at or below its
  threshold.
* a **ratio** is ``min(rate_a, rate_b) / max(rate_a, rate_b)`` with the min/max of the ratios of a score interval
  (Miettinen-Nurminen), undefined (insufficient, never 0) when a group has no success. It passes at or above its
  threshold.

Config validation, the gate, the collector, the seed API, the rules generator and the docs read :data:`METRICS`,
so adding a metric is one entry here (see docs/adding-a-metric.md).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
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
    newcombe,
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
        return MetricValues(self.value[rows], self.lower[rows], self.upper[rows], self.half_width[rows],
                            self.support[rows])

    def replaced(self, rows: NDArray, other: MetricValues) -> MetricValues:
        """The same values with those of some pairs (``rows``) replaced by ``other``'s, in order."""
        columns = [getattr(self, name).copy() for name in _VALUE_FIELDS]
        for column, name in zip(columns, _VALUE_FIELDS, strict=True):
            column[rows] = getattr(other, name)
        return MetricValues(*columns)


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
        good, bad = self._sides(lower, upper, threshold)
        return np.where(good, "pass", np.where(bad, "fail", "inconclusive"))

    def fails(self, lower: ArrayLike, upper: ArrayLike, threshold: float) -> NDArray[np.bool_]:
        """Per interval: whether :meth:`evidence` says ``fail``."""
        good, bad = self._sides(lower, upper, threshold)
        return bad & ~good

    def _sides(self, lower: ArrayLike, upper: ArrayLike, threshold: float) -> tuple[NDArray[np.bool_], ...]:
        """(wholly on the passing side, wholly beyond) per interval."""
        lo, hi = np.asarray(lower, dtype=np.float64), np.asarray(upper, dtype=np.float64)
        with np.errstate(invalid="ignore"):  # NaN bounds compare False: inconclusive
            return (hi <= threshold, lo > threshold) if self.kind == "difference" else (lo >= threshold, hi < threshold)

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
        (out,) = compute_many(counts, [(self, np.asarray(a), np.asarray(b), family)], rates, histogram)
        return out


RateCounts = dict[str, tuple[IntArray, IntArray]]
ScoreGap = Callable[[NDArray, NDArray, NDArray, "FloatArray | float"],
                    tuple[FloatArray, FloatArray, FloatArray, FloatArray, IntArray]]
"""A score metric's function of the groups' labelled score histograms, pairs and quantile (:mod:`.scores`)."""


@cache
def _z(n_rates: int) -> float:
    """Normal quantile of each of ``n_rates`` intervals whose union covers CONFIDENCE (Bonferroni)."""
    return NormalDist().inv_cdf(1.0 - (1.0 - CONFIDENCE) / (2 * n_rates))


def simultaneous_z(intervals: IntArray) -> FloatArray:
    """:func:`_z` per pair (of a handful of distinct counts)."""
    return _z_table(int(intervals.max(initial=1)))[intervals]


@cache
def _z_table(largest: int) -> FloatArray:
    """:func:`_z` of 1..largest at those positions (NaN at 0)."""
    return np.array([math.nan, *(_z(n) for n in range(1, largest + 1))])


Request = tuple[Metric, NDArray, NDArray, NDArray]
"""A metric for pairs ``(a[i], b[i])``, each pair's interval one of ``comparisons[i]`` (:meth:`Metric.compute`)."""


def compute_many(counts: NDArray, requests: Sequence[Request], rates: RateCounts | None = None,
                 histogram: NDArray | None = None) -> list[MetricValues]:  # fmt: skip
    """:meth:`Metric.compute` of each request, all in one vectorised pass per kind (numpy's cost per call dominates
    on a handful of pairs: a model's metrics, its simultaneous intervals and Holm's steps cost about one metric).
    Each pair's numbers are those it has alone: every step is elementwise."""
    rates = {} if rates is None else rates
    for metric, *_ in requests:
        for rate in metric.rates:
            if rate not in rates:
                rates[rate] = rate_counts(counts, rate)
    out: list[MetricValues | None] = [None] * len(requests)
    kinds: dict[object, list[int]] = {"difference": [], "ratio": []}
    for i, (metric, *_) in enumerate(requests):
        kinds.setdefault(metric.scores or metric.kind, []).append(i)
    differences, ratios = kinds.pop("difference"), kinds.pop("ratio")
    if differences or ratios:  # every rate's counts of every pair, gathered once
        counted = [requests[i] for i in differences + ratios]
        widths = [len(m.rates) for m, *_ in counted]
        gathered = _gathered(rates, counted, [m.rates for m, *_ in counted])
        cut = sum(len(a) * w for (_, a, _, _), w in zip(counted[: len(differences)], widths, strict=False))
        found = _differences(counted[: len(differences)], widths, [g[:cut] for g in gathered]) + \
            _ratios(counted[len(differences):], [g[cut:] for g in gathered])  # fmt: skip
        for i, values in zip(differences + ratios, found, strict=True):
            out[i] = values
    for gap, members in kinds.items():
        for i, values in zip(members, _score_gaps(gap, histogram, [requests[i] for i in members]),  # type: ignore[arg-type]
                             strict=True):  # fmt: skip
            out[i] = values
    return out  # type: ignore[return-value]


def _gathered(rates: RateCounts, requests: Sequence[Request], slots: Sequence[tuple[str, ...]]) -> list[NDArray]:
    """For each request's pairs, repeated once per rate of its ``slots``: the rate's successes and trials of a, of
    b, and the comparisons times the request's count of rates, concatenated."""
    names = list(dict.fromkeys(r for rs in slots for r in rs))
    k, n = (np.stack([rates[r][i] for r in names]) for i in (0, 1))
    parts = [(names.index(r), a, b, f * len(rs)) for (_, a, b, f), rs in zip(requests, slots, strict=True)
             for r in rs]  # fmt: skip
    sizes = [len(a) for _, a, _, _ in parts]
    which = np.repeat([w for w, *_ in parts], sizes)
    a, b, family = (np.concatenate([p[i] for p in parts]) for i in (1, 2, 3))
    return [k[which, a], n[which, a], k[which, b], n[which, b], family]


def _split(requests: Sequence[Request], widths: Sequence[int], columns: Sequence[NDArray]) -> list[MetricValues]:
    """Cut the batch's columns (value, lower, upper, half-width, support) back per request; a request of ``w`` rates
    (equalised odds) takes the largest of its ``w`` runs of pairs (the smallest support)."""
    out, start = [], 0
    for (_, a, _, _), w in zip(requests, widths, strict=True):
        size = len(a)
        part = slice(start, start + w * size)
        start += w * size
        if w == 1:
            value, lower, upper, half, support = [c[part] for c in columns]
        else:  # np.maximum propagates NaN: a metric with an undefined component is undefined.
            value, lower, upper, half = (np.maximum.reduce(c[part].reshape(w, size)) for c in columns[:4])
            support = np.minimum.reduce(columns[4][part].reshape(w, size))
        out.append(MetricValues(value, lower, upper, half, support.astype(np.int64)))
    return out


def _differences(requests: Sequence[Request], widths: Sequence[int], gathered: Sequence[NDArray]) -> list[MetricValues]:
    """Each difference metric's pairs, every rate of it an interval at the level of ``rates x comparisons``
    simultaneous ones (Newcombe's; continuity-corrected in a union, see :func:`_newcombe_in_union`)."""
    ka, na, kb, nb, intervals = gathered
    d, lo, hi = newcombe(ka, na, kb, nb, simultaneous_z(intervals), _newcombe_in_union(intervals))
    lower, upper = abs_interval(lo, hi)
    # the gap as one division of the exact cross products: the float nearest the exact fraction, as a ratio's value
    # is, so a gap of exactly the threshold passes (4/5 - 3/4 as two rates subtracted is 0.05000000000000004, over
    # a threshold of 0.05)
    a_nb, b_na, na_nb = _cross(ka, na, kb, nb)
    gap = np.where(np.isnan(d), np.nan, _quotient(np.abs(a_nb - b_na), na_nb))
    columns = (gap, lower, upper, (hi - lo) / 2.0, np.minimum(na, nb))
    return _split(requests, widths[: len(requests)], columns)


def _newcombe_in_union(intervals: IntArray) -> NDArray[np.bool_]:
    """Per pair, whether its Newcombe interval is one of a union (intervals > 1). Bonferroni guarantees its level only
    if each component reaches its own: method 10 covers its level on average but dips about 0.3 points below it
    (0.972 for 0.975 at rate 0.5, 100 per group), so a pair in a union uses the continuity-corrected method 11,
    which stays above it."""
    return np.asarray(intervals > 1)


def _ratios(requests: Sequence[Request], gathered: Sequence[NDArray]) -> list[MetricValues]:
    """Each ratio metric's pairs: min/max of the two rates, and the min/max of every ratio of the score interval at
    95%/comparisons of the lower rate over the higher: ``[L, U]`` below 1, ``[min(L, 1/U), 1]`` where it reaches 1
    (the data do not tell which group's true rate is the lower)."""
    ka, na, kb, nb, family = gathered
    a_nb, b_na, _ = _cross(ka, na, kb, nb)
    a_is_low = np.asarray(a_nb <= b_na, dtype=bool)
    k_low, k_high = np.where(a_is_low, ka, kb), np.where(a_is_low, kb, ka)
    n_low, n_high = np.where(a_is_low, na, nb), np.where(a_is_low, nb, na)
    defined = (k_low > 0) & (k_high > 0)  # a group with no success has no meaningful ratio
    value = np.where(defined, _quotient(np.where(a_is_low, a_nb, b_na), np.where(a_is_low, b_na, a_nb)), np.nan)
    # alone, Z_95 as the ratio always had (inv_cdf differs in the last bit: reports stay bit for bit the same)
    lo, hi = ratio_interval(k_low, n_low, k_high, n_high, np.where(family > 1, simultaneous_z(family), Z_95))
    with np.errstate(divide="ignore"):
        lo = np.where(hi >= 1.0, np.minimum(lo, 1.0 / hi), lo)
    lower = np.where(defined, np.clip(lo, 0.0, 1.0), np.nan)
    upper = np.where(defined, np.clip(hi, 0.0, 1.0), np.nan)
    columns = (value, lower, upper, (upper - lower) / 2.0, np.minimum(na, nb))
    return _split(requests, [1] * len(requests), columns)


def _cross(ka: NDArray, na: NDArray, kb: NDArray, nb: NDArray) -> tuple[NDArray, NDArray, NDArray]:
    """``(ka nb, kb na, na nb)`` exactly: in Python's integers (an object array) where integer counts make a product
    of 2**53 or more, beyond which a float rounds it (and int64 overflows from 2**63); weighted counts' products."""
    counts = np.broadcast_arrays(ka, na, kb, nb)
    if all(c.dtype.kind in "iu" for c in counts) and max(float(np.max(c, initial=0)) for c in counts) ** 2 >= 2.0**53:
        ka, na, kb, nb = (c.astype(object) for c in counts)
    return ka * nb, kb * na, na * nb


def _quotient(num: NDArray, den: NDArray) -> FloatArray:
    """``num / den`` as the float nearest the exact fraction of :func:`_cross`'s products (NaN where ``den`` is 0):
    Python divides its integers with one rounding, of the quotient."""
    if num.dtype != object:
        return ratio(num, den)
    return np.array([n / d if d else math.nan for n, d in zip(num.tolist(), den.tolist(), strict=True)], np.float64)


def _score_gaps(gap: ScoreGap, histogram: NDArray | None, requests: Sequence[Request]) -> list[MetricValues]:
    """Each score metric's pairs (of one function), compared from the groups' labelled score histograms."""
    a = np.concatenate([a for _, a, _, _ in requests])
    if histogram is None:
        nan = np.full(np.shape(a), np.nan)
        columns: tuple[NDArray, ...] = (nan, nan, nan, nan, np.zeros(np.shape(a), dtype=np.int64))
    else:
        b = np.concatenate([b for _, _, b, _ in requests])
        family = np.concatenate([np.broadcast_to(f, np.shape(a_)) for _, a_, _, f in requests])
        columns = gap(histogram, a, b, simultaneous_z(family))
    return _split(requests, [1] * len(requests), columns)


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
            histogram: NDArray | None = None, rates: RateCounts | None = None) -> Comparisons:  # fmt: skip
    """The named metrics (default: every metric of :data:`METRICS`) for each pair of rows of ``counts`` (and of
    ``histogram``, the groups' labelled score histograms, for the score metrics), in one pass (``rates``: as for
    :func:`compute_many`)."""
    a = np.asarray(group_a, dtype=np.int64)
    b = np.asarray(group_b, dtype=np.int64)
    names = tuple(metrics)
    ones = np.ones(np.shape(a), dtype=np.int64)
    found = compute_many(exact(counts), [(METRICS[name], a, b, ones) for name in names], rates, histogram)
    return Comparisons(a, b, dict(zip(names, found, strict=True)))


def samples_to_decide(half_width: float, value: float, threshold: float, samples: Mapping[str, float]) -> \
        dict[str, int] | None:  # fmt: skip
    """Samples per group at which the interval (half-width ~ 1/sqrt(n)) would no longer reach the threshold from
    the current value; None when the value sits on the threshold or is undefined."""
    gap = abs(value - threshold)
    if not (gap > 0 and math.isfinite(half_width) and math.isfinite(gap)):
        return None
    factor = (half_width / gap) ** 2
    return {g: math.ceil(n * factor) for g, n in samples.items()}
