"""Evaluate one attribute's counts: group statistics, configured comparisons, their sufficiency and evidence.

The audit gate and the daemon's computation both go through :func:`evaluate_many`, so the rules for when a number is
reported (enough samples) and what its interval says are written once.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from exporter.core.attributes import Attribute
from exporter.core.conditional import metric as conditional_metric
from exporter.core.estimate import LABELLED_NEG, LABELLED_POS
from exporter.core.fairness import N_COUNTS, PRED_NEG, PRED_POS, Z_95, GroupStats, exact, group_stats
from exporter.core.metric_table import METRICS, Comparisons, MetricValues, RateCounts, compare, compute_many
from exporter.core.scores import SCORE_SUM
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
    families: int = 1
    """The pairs are this many consecutive families of equal size (``backtest``'s stacked steps), each judged alone."""
    histogram: np.ndarray | None = None
    """Each group's labelled score histogram ``(n_groups, n_bins, 3)`` (:func:`labelled_histogram`), for a model
    that emits scores and compares them (``auc_difference``, ``calibration_difference``)."""
    failing: dict[tuple[str, float], np.ndarray] = field(default_factory=dict)
    """Per (metric, threshold): :func:`fails` of the pairs, computed for the whole batch of evaluations at once."""
    worsts: dict[str, Worst] = field(default_factory=dict)
    """Per metric: :meth:`worst`, computed for the whole batch of evaluations at once."""

    @property
    def unknown_samples(self) -> float:
        """Predictions in the attribute's unknown category (a proxy attribute's: a sum of posteriors)."""
        return float(self.unknown[PRED_POS] + self.unknown[PRED_NEG])

    def with_metrics(self, values: Mapping[str, MetricValues]) -> Evaluation:
        """The same evaluation with more metrics among its comparisons (the conditional ones, from counts per
        stratum), for the same pairs."""
        c = self.comparisons
        return replace(self, comparisons=Comparisons(c.group_a, c.group_b, {**c.metrics, **values}))

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
        if self.multiplicity == "none" or self.simultaneous is None or metric not in self.simultaneous.metrics or \
                not (states == "fail").any():  # fmt: skip
            return states
        failing = self.failing.get((metric, threshold))
        if failing is None:
            failing = fails(metric, threshold, self.multiplicity, self.counts, np.array(self.attribute.pairs), ok,
                            self.family(), self.simultaneous.metrics[metric], self.histogram)  # fmt: skip
        return np.where(states == "fail", np.where(failing, "fail", "inconclusive"), states)

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
        """Per group: the AUC of its scores and its 95% interval (DeLong's variance, normal, clipped to 0..1); None
        without score histograms."""
        if self.histogram is None:
            return None
        value, variance, _ = group_auc(self.histogram)
        half = Z_95 * np.sqrt(variance)
        return value, np.clip(value - half, 0.0, 1.0), np.clip(value + half, 0.0, 1.0)

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
        return worst_of(METRICS[metric].kind, self.values(metric), self.simultaneous.metrics[metric],
                        self.sufficient(metric), self.family(), self.families)  # fmt: skip

    def metric(self, metric: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(value, lower, upper) per pair."""
        v = self.values(metric)
        return v.value, v.lower, v.upper


@dataclass(frozen=True)
class Worst:
    """Per family of comparisons (one but in ``backtest``): the worst comparison of a metric and its simultaneous
    interval; ``pair`` is -1 (and the numbers NaN) when none was judged."""

    pair: np.ndarray
    value: np.ndarray
    lower: np.ndarray
    upper: np.ndarray
    judged: np.ndarray


def _local_worst(w: Worst, first: int, families: int, pair_start: int) -> Worst:
    """One block's families of a batch's :class:`Worst`, its pairs numbered within the block."""
    part = slice(first, first + families)
    return Worst(np.where(w.pair[part] >= 0, w.pair[part] - pair_start, -1), w.value[part], w.lower[part],
                 w.upper[part], w.judged[part])


def _finite(x: float) -> float | None:
    return float(x) if np.isfinite(x) else None


def worst_of(kind: str, values: MetricValues, simultaneous: MetricValues, judged: np.ndarray, family: np.ndarray,
             families: int) -> Worst:  # fmt: skip
    """Per family, over its ``judged`` pairs: the worst value (a difference's largest, a ratio's smallest) and, from
    every pair's interval at 95%/K (Bonferroni over the K judged), the max (a ratio: min) of their lower and of their
    upper bounds: if every interval holds its pair's true value, which happens with 95% probability at least, this
    one holds the true worst. Vectorised over families (``backtest`` judges a day of steps at once)."""
    return worsts_of([kind], [values], [simultaneous], [judged], family, families)[0]


def worsts_of(kinds: Sequence[str], values: Sequence[MetricValues], simultaneous: Sequence[MetricValues],
              judged: Sequence[np.ndarray], family: np.ndarray, families: int) -> list[Worst]:  # fmt: skip
    """:func:`worst_of` of several metrics of the same pairs, in one pass: each metric's families are families of
    their own."""
    if not kinds:
        return []
    size, n = len(family), len(kinds) * families
    signs = np.array([-1.0 if kind == "ratio" else 1.0 for kind in kinds])  # the worst is the largest sign * value
    sign, family_sign = np.repeat(signs, size), np.repeat(signs, families)
    family = np.add.outer(np.arange(len(kinds)) * families, family).ravel()
    ok = np.concatenate(judged)
    value = np.concatenate([v.value for v in values])
    key = np.where(ok, sign * value, -np.inf)
    order = np.lexsort((-key, family))  # by family, the worst first
    first = np.searchsorted(family[order], np.arange(n))
    count = np.bincount(family[ok], minlength=n)
    pair = np.where(count > 0, order[np.minimum(first, len(order) - 1)] if len(order) else -1, -1)
    bounds = []
    for side in (np.concatenate([s.lower for s in simultaneous]), np.concatenate([s.upper for s in simultaneous])):
        top = np.full(n, -np.inf)
        np.maximum.at(top, family[ok], sign[ok] * side[ok])
        bounds.append(np.where(count > 0, family_sign * top, np.nan))
    worst = np.where(count > 0, value[np.maximum(pair, 0)] if len(order) else np.nan, np.nan)
    local = np.where(pair >= 0, pair - np.repeat(np.arange(len(kinds)) * size, families), -1).astype(np.int64)
    count = count.astype(np.int64)
    return [Worst(local[part], worst[part], bounds[0][part], bounds[1][part], count[part])
            for part in (slice(i * families, (i + 1) * families) for i in range(len(kinds)))]  # fmt: skip


MULTIPLICITY = ("holm", "bonferroni", "none")
"""How ``fail`` is judged across one metric's comparisons of an attribute: Holm's step-down (the default), each at
95%/K (Bonferroni), or each alone. ``pass`` needs no adjustment (docs/auditor/numbers.md)."""


def fails(metric: str, threshold: float, multiplicity: str, counts: np.ndarray, pairs: np.ndarray,
          judged: np.ndarray, family: np.ndarray, simultaneous: MetricValues,
          histogram: np.ndarray | None) -> np.ndarray:  # fmt: skip
    """Per pair (``pairs`` rows of ``counts``, ``judged`` the ones with a value, ``family`` their family): whether its
    interval lies wholly beyond the threshold as one of its family's K judged comparisons: each at the 5%/K error
    level (``simultaneous``: Bonferroni), or Holm's step-down: once r of them fail, the others are judged again at
    5%/(K - r), until none more fails. That fails the same comparisons as Holm's rule on their p-values, since an
    interval at a lower error level holds the one at a higher. Vectorised over families (one per attribute and
    window of a whole fleet, in the daemon's computation)."""
    return fails_many({metric: threshold}, multiplicity, counts, pairs, {metric: judged}, family,
                      {metric: simultaneous}, histogram)[metric, threshold]  # fmt: skip


def fails_many(thresholds: Mapping[str, float], multiplicity: str, counts: np.ndarray, pairs: np.ndarray,
               judged: Mapping[str, np.ndarray], family: np.ndarray, simultaneous: Mapping[str, MetricValues],
               histogram: np.ndarray | None, rates: RateCounts | None = None) -> dict[tuple[str, float], np.ndarray]:
    """:func:`fails` of several metrics at their thresholds, each Holm step of all of them in one
    :func:`compute_many` pass."""
    names, size = list(thresholds), len(family)
    if not names:
        return {}
    failed = np.concatenate([judged[name] & METRICS[name].fails(simultaneous[name].lower, simultaneous[name].upper,
                                                                 thresholds[name]) for name in names])  # fmt: skip
    out = {(name, thresholds[name]): failed[i * size : (i + 1) * size] for i, name in enumerate(names)}  # views
    if multiplicity == "bonferroni" or not size:
        return out
    # every metric's families are families of their own: one bincount per step for all metrics
    n = int(family.max()) + 1
    index = np.add.outer(np.arange(len(names)) * n, family).ravel()
    ok = np.concatenate([judged[name] for name in names])
    total = np.bincount(index[ok], minlength=len(names) * n)[index]
    stepping = np.ones(len(names), dtype=bool)
    while True:
        left = ok & ~failed & np.repeat(stepping, size)
        remaining = np.bincount(index[left], minlength=len(names) * n)[index]
        step = np.flatnonzero(left & (remaining < total))  # a family where some failed: its others, at 5%/left
        if not step.size:
            return out
        bounds = np.searchsorted(step, np.arange(len(names) + 1) * size).tolist()
        steps = [(i, step[bounds[i] : bounds[i + 1]]) for i in range(len(names)) if bounds[i] < bounds[i + 1]]
        again = compute_many(counts, [(METRICS[names[i]], pairs[at - i * size, 0], pairs[at - i * size, 1],
                                       remaining[at]) for i, at in steps], rates, histogram)  # fmt: skip
        stepping[:] = False
        for (i, at), values in zip(steps, again, strict=True):
            newly = METRICS[names[i]].fails(values.lower, values.upper, thresholds[names[i]])
            if newly.any():
                failed[at[newly]] = True
                stepping[i] = True


def _rows(stats: GroupStats, rows: slice | np.ndarray) -> GroupStats:
    """The same group statistics (pairs of arrays for intervals), restricted to some rows (a fleet takes
    thousands)."""
    return GroupStats(*[(v[0][rows], v[1][rows]) if type(v) is tuple else v[rows]  # type: ignore[arg-type]
                        for v in vars(stats).values()])  # fmt: skip


def labelled_histogram(score_counts: np.ndarray, sums: np.ndarray | None = None) -> np.ndarray:
    """Per group and score bin, its labelled negatives and positives (both predicted classes) of a score-counts array
    ``(..., n_bins, 2, N_SCORE_COUNTS)`` (:mod:`exporter.core.estimate`), and the sum of their scores ``(..., n_bins)``
    (NaN when not kept: no calibration): ``(..., n_bins, 3)``."""
    c = np.asarray(score_counts, dtype=np.int64).sum(axis=-2)
    total = np.full(c.shape[:-1], np.nan) if sums is None else np.asarray(sums, dtype=np.float64)
    return np.stack([c[..., LABELLED_NEG], c[..., LABELLED_POS], total], axis=-1)


def evaluate_many(
    blocks: Sequence[tuple[Attribute, np.ndarray]], min_samples: int, metrics: Iterable[str] = METRICS,
    multiplicity: str = "none", families: int = 1, scores: Sequence[np.ndarray] | None = None,
    thresholds: Mapping[str, float] | None = None, score_sums: Sequence[np.ndarray | None] | None = None,
    worsts: bool = True,
) -> list[Evaluation]:  # fmt: skip
    """Evaluate one or more ``(attribute, counts)`` blocks in one vectorised pass.

    ``counts`` has a row per group, optionally followed by one more row: the attribute's unknown category (rows
    outside its groups), which counts for the overall rate but in no comparison. ``metrics``: the metrics to compute
    (default: all of the table). ``multiplicity``: how a fail is judged across a metric's comparisons
    (:data:`MULTIPLICITY`); ``families``: each block's pairs are this many families judged apart (``backtest``).
    ``scores``: per block, its score-counts array (rows as the counts'), for the score metrics, and ``score_sums``
    its labelled scores' sums per score bin, for the calibration. ``thresholds``:
    the metrics' thresholds, to judge the fails of every block in one pass (the daemon's fleet). ``worsts=False``:
    no worst comparisons, and no simultaneous intervals unless a multiplicity rule judges by them (what ``backtest``
    leaves unread at every step but its last).

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
    histograms = None if scores is None else [labelled_histogram(h[: len(a.groups)], s) for (a, _), h, s in
                                              zip(blocks, scores, sums, strict=True)]  # fmt: skip
    histogram = None if histograms is None else np.concatenate(histograms)
    comparisons = compare(counts, global_pairs[:, 0], global_pairs[:, 1], metrics, histogram, rates)
    block = np.repeat(np.arange(len(pairs)), [len(p) for p in pairs])
    local_pair = np.arange(len(global_pairs)) - pair_starts[block]
    family = block * families + local_pair // np.maximum((pair_starts[block + 1] - pair_starts[block]) // families, 1)
    judged = {name: (v.support >= min_samples) & ~np.isnan(v.value) for name, v in comparisons.metrics.items()}
    simultaneous = _simultaneous(counts, global_pairs, comparisons, judged, family, histogram, rates) \
        if worsts or multiplicity != "none" else None  # fmt: skip
    failing = {} if simultaneous is None else fails_many(
        (thresholds or {}) if multiplicity != "none" else {}, multiplicity, counts, global_pairs, judged, family,
        simultaneous.metrics, histogram, rates)  # fmt: skip
    worst: dict[str, Worst] = {}
    if worsts and simultaneous is not None:
        names = list(comparisons.metrics)
        worst = dict(zip(names, worsts_of([METRICS[name].kind for name in names], list(comparisons.metrics.values()),
                                          [simultaneous.metrics[name] for name in names],
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
            simultaneous=None if simultaneous is None else simultaneous.take(local, pairs[k][:, 0], pairs[k][:, 1]),
            families=families,
            histogram=None if histograms is None else histograms[k],
            failing={key: f[local] for key, f in failing.items()},
            worsts={name: _local_worst(w, k * families, families, pair_starts[k]) for name, w in worst.items()},
        ))  # fmt: skip
    return out


def _simultaneous(counts: np.ndarray, pairs: np.ndarray, comparisons: Comparisons, judged: Mapping[str, np.ndarray],
                  family: np.ndarray, histogram: np.ndarray | None, rates: RateCounts) -> Comparisons:  # fmt: skip
    """Every metric's pairs at the level of their family (a block's pairs, or each of its ``families`` runs): K
    judged comparisons in a family put each of its pairs' intervals at 95%/K, all metrics in one pass. A family of
    K <= 1 keeps its 95% intervals, which is what 95%/1 computes again."""
    names = list(comparisons.metrics)
    if not names or not len(pairs):
        return comparisons
    n = int(family.max()) + 1
    # every metric's K per pair in one pass: each metric's families are families of their own
    index = np.add.outer(np.arange(len(names)) * n, family).ravel()
    ok = np.concatenate([judged[name] for name in names])
    k = np.maximum(np.bincount(index, weights=ok, minlength=len(names) * n).astype(np.int64)[index], 1)
    k = k.reshape(len(names), len(pairs))
    wide = k > 1
    every, some = wide.all(axis=1).tolist(), wide.any(axis=1).tolist()
    a, b = pairs[:, 0], pairs[:, 1]
    requests, wider = [], {}
    for i, name in enumerate(names):
        if every[i]:
            requests.append((METRICS[name], a, b, k[i]))
        elif some[i]:
            wider[name] = at = np.flatnonzero(wide[i])
            requests.append((METRICS[name], a[at], b[at], k[i][at]))
    found = iter(compute_many(counts, requests, rates, histogram))
    out = {}
    for i, (name, alone) in enumerate(comparisons.metrics.items()):
        if every[i]:
            out[name] = next(found)
        elif some[i]:
            out[name] = alone.replaced(wider[name], next(found))
        else:
            out[name] = alone
    return Comparisons(comparisons.group_a, comparisons.group_b, out)
