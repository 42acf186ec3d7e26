"""Evaluate one attribute's counts: group statistics, configured comparisons, their sufficiency and evidence.

The audit gate and the daemon's computation both go through :func:`evaluate_many`, so the rules for when a number is
reported (enough samples) and what its interval says are written once.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from functools import partial
from typing import Any

import numpy as np

from exporter.core import conditional
from exporter.core.attributes import Attribute
from exporter.core.conditional import CONDITIONAL_METRICS
from exporter.core.conditional import metric as conditional_metric
from exporter.core.estimate import LABELLED_NEG, LABELLED_POS
from exporter.core.fairness import N_COUNTS, PRED_NEG, PRED_POS, Z_95, GroupStats, exact, group_stats
from exporter.core.metric_table import METRICS, Comparisons, MetricValues, RateCounts, compare, compute_many
from exporter.core.multiplicity import Compute, Worst, fails, fails_many, simultaneous, worst_of, worsts_of
from exporter.core.scores import SCORE_SUM, auc_interval
from exporter.core.scores import auc as group_auc
from exporter.core.scores import calibration as group_calibration


@dataclass(frozen=True)
class Evaluation:
    """Everything reported about one attribute in one window (or one audit)."""

    attribute: Attribute
    counts: np.ndarray
    groups: GroupStats
    overall: GroupStats
    comparisons: Comparisons
    min_samples: int
    unknown: np.ndarray = field(default_factory=lambda: np.zeros(N_COUNTS, dtype=np.int64))
    """Counts of the rows whose value is not one of the attribute's groups (or is missing): its unknown category."""
    multiplicity: str = "none"
    """How a ``fail`` is judged across the comparisons of one metric (see :data:`MULTIPLICITY`)."""
    simultaneous: Comparisons | None = None
    """Each pair's interval as one of the family of its metric's sufficient comparisons (Bonferroni over them):
    the worst comparison's interval and the first step of the multiplicity rules. A metric absent from it (an
    estimate) is judged per comparison."""
    deferred: bool = False
    """The simultaneous intervals were left out (``evaluate_many(worsts=False)``: ``backtest``'s every step, which
    reads none): :meth:`evidence` computes a metric's when a fail has to be judged under :attr:`multiplicity`."""
    families: int = 1
    """The pairs are this many consecutive families of equal size (``backtest``'s stacked steps), each judged alone."""
    histogram: np.ndarray | None = None
    """Each group's labelled score histogram ``(n_groups, n_bins, 3)`` (:func:`labelled_histogram`), for a model
    that emits scores and compares them (``auc_difference``, ``calibration_difference``)."""
    failing: dict[tuple[str, float], np.ndarray] = field(default_factory=dict)
    """Per (metric, threshold): :func:`fails` of the pairs, computed for the whole batch of evaluations at once."""
    worsts: dict[str, Worst] = field(default_factory=dict)
    """Per metric: :meth:`worst`, computed for the whole batch of evaluations at once."""
    strata: np.ndarray | None = None
    """Counts per group and stratum ``(n_groups, n_strata, N_COUNTS)`` of the conditional metrics among the
    comparisons (``strata:``, :meth:`with_conditional`): what their intervals at 95%/K are computed from."""

    @property
    def unknown_samples(self) -> float:
        """Predictions in the attribute's unknown category (a proxy attribute's: a sum of posteriors)."""
        return float(self.unknown[PRED_POS] + self.unknown[PRED_NEG])

    def with_metrics(self, values: Mapping[str, MetricValues]) -> Evaluation:
        """The same evaluation with some metrics' values added or replaced, for the same pairs (their simultaneous
        intervals as they were)."""
        c = self.comparisons
        return replace(self, comparisons=Comparisons(c.group_a, c.group_b, {**c.metrics, **values}))

    def with_support(self, values: Mapping[str, MetricValues]) -> Evaluation:
        """:meth:`with_metrics` for values whose support counts another unit than the core's (the counterfactual's
        items decided for both groups, not answers), so other comparisons meet ``min_samples``: each such metric's
        simultaneous intervals computed again at the K it now judges (95%/K, :func:`simultaneous`), and its worst
        comparison and fails left to be computed from them."""
        ev = self.with_metrics(values)
        if self.simultaneous is None:
            return ev
        s = self.simultaneous
        again = {m: ev._at_family_level(m) for m in values if m in s.metrics}
        return replace(ev, simultaneous=Comparisons(s.group_a, s.group_b, {**s.metrics, **again}),
                       failing={key: f for key, f in self.failing.items() if key[0] not in again},
                       worsts={m: w for m, w in self.worsts.items() if m not in again})  # fmt: skip

    def with_conditional(self, strata: np.ndarray, values: Mapping[str, MetricValues]) -> Evaluation:
        """The same evaluation with conditional metrics among its comparisons, for the same pairs: ``values``, each
        alone (:func:`exporter.core.conditional.conditional_compare` of ``strata``), and each as one of its
        metric's judged comparisons (at 95%/K, from the same strata), so that the worst comparison and the
        multiplicity rule judge them as every other metric's."""
        ev = replace(self.with_metrics(values), strata=strata)
        if self.simultaneous is None:
            return ev
        c, s = self.comparisons, self.simultaneous
        wide = simultaneous(partial(conditional.compute_many, strata), np.stack([c.group_a, c.group_b], axis=1),
                            Comparisons(c.group_a, c.group_b, dict(values)), {m: ev.sufficient(m) for m in values},
                            self.family())  # fmt: skip
        return replace(ev, simultaneous=Comparisons(s.group_a, s.group_b, {**s.metrics, **wide.metrics}))

    def _compute(self, metric: str) -> Compute:
        """How a metric's pairs are computed at another level (95%/K): from the groups' counts, a conditional one
        from the counts per stratum."""
        if metric in CONDITIONAL_METRICS:
            assert self.strata is not None, metric
            return partial(conditional.compute_many, self.strata)
        return partial(compute_many, self.counts, histogram=self.histogram)

    def values(self, metric: str) -> MetricValues:
        """Value, interval, half-width and support of one metric, per pair."""
        return self.comparisons.metrics[metric]

    def sufficient(self, metric: str) -> np.ndarray:
        """Per pair: the comparison has a value, i.e. both groups have at least min_samples of what the metric counts
        (predictions, labelled positives and negatives, ...) and the metric is defined (a ratio needs a positive in
        each group). However wide its interval: the interval and :meth:`evidence` say how far to trust it."""
        v = self.values(metric)
        return (v.support >= self.min_samples) & ~np.isnan(v.value)

    def evidence(self, metric: str, threshold: float) -> np.ndarray:
        """Per pair: ``pass``, ``fail`` or ``inconclusive`` from the interval against the threshold; an insufficient
        comparison is ``inconclusive``. ``pass`` reads the pair's own 95% interval; ``fail`` reads it as one of the
        metric's comparisons under :attr:`multiplicity` (:func:`fails`)."""
        v = self.values(metric)
        ok = self.sufficient(metric)
        states = np.where(ok, conditional_metric(metric).evidence(v.lower, v.upper, threshold), "inconclusive")
        if self.multiplicity == "none" or not (states == "fail").any():
            return states
        wide = self._simultaneous(metric)
        if wide is None:  # an estimate
            return states
        failing = self.failing.get((metric, threshold))
        if failing is None:
            failing = fails(metric, threshold, self.multiplicity, self._compute(metric), self._pairs(), ok,
                            self.family(), wide)  # fmt: skip
        return np.where(states == "fail", np.where(failing, "fail", "inconclusive"), states)

    def _pairs(self) -> np.ndarray:
        return np.array(self.attribute.pairs, dtype=np.int64).reshape(-1, 2)

    def _simultaneous(self, metric: str) -> MetricValues | None:
        """A metric's pairs at 95%/K (:attr:`simultaneous`, or computed now if :attr:`deferred`, as
        :func:`evaluate_many` would have: the same function on the same counts); None for an estimate."""
        if self.simultaneous is not None:
            return self.simultaneous.metrics.get(metric)
        return self._at_family_level(metric) if self.deferred else None

    def _at_family_level(self, metric: str) -> MetricValues:
        """A metric's pairs at 95%/K, K its family's comparisons judged now (:meth:`sufficient`), from the same
        counts :func:`evaluate_many` computed them from."""
        c = self.comparisons
        alone = Comparisons(c.group_a, c.group_b, {metric: c.metrics[metric]})
        return simultaneous(self._compute(metric), self._pairs(), alone, {metric: self.sufficient(metric)},
                            self.family()).metrics[metric]  # fmt: skip

    def worst_rows(self, metrics: Iterable[str], family: int = 0) -> list[dict[str, Any]]:
        """What a report says of each metric's worst comparison in one family (the gate's ``worst[]``, backtest's
        at its last step): the pair, value, simultaneous interval (None where undefined) and how many were judged.
        Estimated metrics, judged one by one, have none."""
        assert self.simultaneous is not None
        groups, pairs = self.attribute.groups, self.attribute.pairs
        out = []
        for metric in (m for m in metrics if m in self.simultaneous.metrics):
            w = self.worst(metric)
            k = int(w.pair[family])
            out.append({"attribute": self.attribute.name, "metric": metric,
                        "dimension": "_vs_".join(groups[g] for g in pairs[k]) if k >= 0 else None,
                        "value": _finite(w.value[family]),
                        "ci_simultaneous": [_finite(w.lower[family]), _finite(w.upper[family])],
                        "comparisons_judged": int(w.judged[family])})  # fmt: skip
        return out

    def auc(self) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
        """Per group: the AUC of its scores and its 95% interval (DeLong's variance on the logit scale: the one each
        gap's interval is built from, :func:`exporter.core.scores.auc_interval`); None without score histograms."""
        if self.histogram is None:
            return None
        value, variance, support = group_auc(self.histogram)
        return value, *auc_interval(value, variance, support, Z_95)

    def calibration(self) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
        """Per group: the expected calibration error of its scores and its 95% interval (conservative: the plug-in
        less the bound on its upward bias and noise, up to the plug-in plus its noise; clipped to 0..1); None
        without the labelled scores' sums (a model that does not configure ``calibration_difference``)."""
        if self.histogram is None or np.isnan(self.histogram[..., SCORE_SUM]).all():
            return None
        value, bias, variance, _ = group_calibration(self.histogram)
        spread = Z_95 * np.sqrt(variance)
        return value, np.clip(value - bias - spread, 0.0, 1.0), np.clip(value + spread, 0.0, 1.0)

    def family(self) -> np.ndarray:
        """Per pair: its family (0 but in ``backtest``'s stacked steps)."""
        return np.arange(len(self.attribute.pairs)) // max(len(self.attribute.pairs) // self.families, 1)

    def worst(self, metric: str) -> Worst:
        """Per family: the largest difference (smallest ratio) over the judged comparisons, and an interval for the
        true worst that holds simultaneously over them (:func:`worst_of`)."""
        assert self.simultaneous is not None and metric in self.simultaneous.metrics, metric
        if metric in self.worsts:
            return self.worsts[metric]
        return worst_of(conditional_metric(metric).kind, self.values(metric), self.simultaneous.metrics[metric],
                        self.sufficient(metric), self.family(), self.families)  # fmt: skip

    def metric(self, metric: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(value, lower, upper) per pair."""
        v = self.values(metric)
        return v.value, v.lower, v.upper


def _local_worst(w: Worst, first: int, families: int, pair_start: int) -> Worst:
    """One block's families of a batch's :class:`Worst`, its pairs numbered within the block."""
    part = slice(first, first + families)
    return Worst(np.where(w.pair[part] >= 0, w.pair[part] - pair_start, -1), w.value[part], w.lower[part],
                 w.upper[part], w.judged[part])


def _finite(x: float) -> float | None:
    return float(x) if np.isfinite(x) else None


def _rows(stats: GroupStats, rows: slice | np.ndarray) -> GroupStats:
    """The same group statistics (pairs of arrays for intervals), restricted to some rows (a fleet takes
    thousands)."""
    return GroupStats(*[(v[0][rows], v[1][rows]) if type(v) is tuple else v[rows]  # type: ignore[arg-type]
                        for v in vars(stats).values()])  # fmt: skip


def labelled_histogram(score_counts: np.ndarray, sums: np.ndarray | None = None,
                       added_bound: int | None = None) -> np.ndarray:  # fmt: skip
    """Per group and score bin, its labelled negatives and positives (both predicted classes) of a score-counts array
    ``(..., n_bins, 2, N_SCORE_COUNTS)`` (:mod:`exporter.core.estimate`), and the sum of their scores ``(..., n_bins)``
    (NaN when not kept: no calibration): ``(..., n_bins, 3)``. ``added_bound``: the bins on either side of that bound
    (the decision threshold the estimation added, :attr:`exporter.config.ModelSpec.added_score_bound`) as one, so
    that AUC and ECE measure on the bins configured.

    >>> counts = np.zeros((1, 3, 2, 3), dtype=np.int64); counts[0, :, 0, 1:] = [[1, 2], [3, 4], [5, 6]]
    >>> labelled_histogram(counts, added_bound=0)[0, :, :2].tolist()
    [[6.0, 4.0], [6.0, 5.0]]
    """
    c = np.asarray(score_counts, dtype=np.int64).sum(axis=-2)
    total = np.full(c.shape[:-1], np.nan) if sums is None else np.asarray(sums, dtype=np.float64)
    out = np.stack([c[..., LABELLED_NEG], c[..., LABELLED_POS], total], axis=-1)
    if added_bound is None:
        return out
    merged = out[..., added_bound : added_bound + 2, :].sum(axis=-2, keepdims=True)
    return np.concatenate([out[..., :added_bound, :], merged, out[..., added_bound + 2 :, :]], axis=-2)


def evaluate_many(
    blocks: Sequence[tuple[Attribute, np.ndarray]], min_samples: int, metrics: Iterable[str] = METRICS,
    multiplicity: str = "none", families: int = 1, scores: Sequence[np.ndarray] | None = None,
    thresholds: Mapping[str, float] | None = None, score_sums: Sequence[np.ndarray | None] | None = None,
    worsts: bool = True, added_bound: int | None = None,
) -> list[Evaluation]:  # fmt: skip
    """Evaluate one or more ``(attribute, counts)`` blocks in one vectorised pass.

    ``counts`` has a row per group, optionally followed by one more row: the attribute's unknown category (rows
    outside its groups), which counts for the overall rate but in no comparison. ``metrics``: the metrics to compute
    (default: all of the table). ``multiplicity``: how a fail is judged across a metric's comparisons
    (:data:`MULTIPLICITY`); ``families``: each block's pairs are this many families judged apart (``backtest``).
    ``scores``: per block, its score-counts array (rows as the counts'), for the score metrics, and ``score_sums``
    its labelled scores' sums per score bin, for the calibration; ``added_bound``: a bound of their bins that the
    score metrics read through (:func:`labelled_histogram`). ``thresholds``:
    the metrics' thresholds, to judge the fails of every block in one pass (the daemon's fleet). ``worsts=False``:
    no worst comparisons, and no simultaneous intervals unless ``thresholds`` ask for fails under a multiplicity
    rule (``backtest`` reads neither at every step but its last; :attr:`Evaluation.deferred`).

    The arithmetic runs on arrays of a handful of groups, so numpy's per-call overhead dominates: one pass over
    every window and attribute at once costs about what one attribute did before.
    """
    if not blocks:
        return []
    unknowns = [c[len(a.groups)] if len(c) > len(a.groups) else np.zeros(N_COUNTS, np.int64) for a, c in blocks]
    blocks = [(a, c[: len(a.groups)]) for a, c in blocks]
    counts = np.concatenate([c for _, c in blocks])
    sizes = [len(a.groups) for a, _ in blocks]
    starts = np.cumsum([0, *sizes])
    pairs = [np.array(a.pairs, dtype=np.int64).reshape(-1, 2) for a, _ in blocks]
    pair_starts = np.cumsum([0, *(len(p) for p in pairs)])
    global_pairs = np.concatenate([p + s for p, s in zip(pairs, starts, strict=False)])
    overall = np.add.reduceat(counts, starts[:-1], axis=0) + np.array(unknowns).reshape(-1, N_COUNTS)
    # every row counts once overall, whatever its group: a proxy attribute's weighted counts sum to whole rows
    overall = np.rint(overall) if np.issubdtype(overall.dtype, np.floating) else overall
    rates: RateCounts = {}
    if overall.dtype == counts.dtype:  # one pass over the groups and the overall rows (the pairs index the groups)
        counts = exact(np.concatenate([counts, overall]))
        both = group_stats(counts, rates)
        groups, overall = _rows(both, slice(0, starts[-1])), _rows(both, slice(starts[-1], None))
    else:
        groups, overall = group_stats(counts, rates), group_stats(overall)
    metrics = tuple(metrics)
    sums = [None if s is None else s[: len(a.groups)] for (a, _), s in
            zip(blocks, score_sums or [None] * len(blocks), strict=True)]  # fmt: skip
    histograms = None if scores is None else [labelled_histogram(h[: len(a.groups)], s, added_bound)
                                              for (a, _), h, s in zip(blocks, scores, sums, strict=True)]  # fmt: skip
    histogram = None if histograms is None else np.concatenate(histograms)
    comparisons = compare(counts, global_pairs[:, 0], global_pairs[:, 1], metrics, histogram, rates)
    block = np.repeat(np.arange(len(pairs)), [len(p) for p in pairs])
    local_pair = np.arange(len(global_pairs)) - pair_starts[block]
    family = block * families + local_pair // np.maximum((pair_starts[block + 1] - pair_starts[block]) // families, 1)
    judged = {name: (v.support >= min_samples) & ~np.isnan(v.value) for name, v in comparisons.metrics.items()}
    compute = partial(compute_many, counts, rates=rates, histogram=histogram)
    # without worsts, the simultaneous intervals serve only to judge fails: now if thresholds ask, else when asked
    deferred = not worsts and multiplicity != "none" and not thresholds
    wide = simultaneous(compute, global_pairs, comparisons, judged, family) \
        if worsts or (multiplicity != "none" and not deferred) else None  # fmt: skip
    failing = {} if wide is None else fails_many(
        (thresholds or {}) if multiplicity != "none" else {}, multiplicity, compute, global_pairs, judged, family,
        wide.metrics)  # fmt: skip
    worst: dict[str, Worst] = {}
    if worsts and wide is not None:
        names = list(comparisons.metrics)
        worst = dict(zip(names, worsts_of([METRICS[name].kind for name in names], list(comparisons.metrics.values()),
                                          [wide.metrics[name] for name in names],
                                          [judged[name] for name in names], family, len(blocks) * families),
                         strict=True))  # fmt: skip
    out = []
    for k, (attribute, block) in enumerate(blocks):
        local = slice(pair_starts[k], pair_starts[k + 1])
        out.append(Evaluation(
            attribute=attribute,
            counts=block,
            groups=_rows(groups, slice(starts[k], starts[k + 1])),
            overall=_rows(overall, slice(k, k + 1)),
            comparisons=comparisons.take(local, pairs[k][:, 0], pairs[k][:, 1]),
            min_samples=min_samples,
            unknown=unknowns[k],
            multiplicity=multiplicity,
            simultaneous=None if wide is None else wide.take(local, pairs[k][:, 0], pairs[k][:, 1]),
            deferred=deferred,
            families=families,
            histogram=None if histograms is None else histograms[k],
            failing={key: f[local] for key, f in failing.items()},
            worsts={name: _local_worst(w, k * families, families, pair_starts[k]) for name, w in worst.items()},
        ))  # fmt: skip
    return out
