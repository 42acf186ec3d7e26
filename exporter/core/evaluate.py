"""Evaluate one attribute's counts: group statistics, configured comparisons, their sufficiency and evidence.

The audit gate and the daemon's computation both go through :func:`evaluate_many`, so the rules for when a number is
reported (enough samples) and what its interval says are written once.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, fields
from typing import Any

import numpy as np

from exporter.core.attributes import Attribute
from exporter.core.fairness import N_COUNTS, PRED_NEG, PRED_POS, GroupStats, group_stats
from exporter.core.metric_table import METRICS, Comparisons, MetricValues, RateCounts, compare


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

    @property
    def unknown_samples(self) -> int:
        """Predictions in the attribute's unknown category."""
        return int(self.unknown[PRED_POS] + self.unknown[PRED_NEG])

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
        states = np.where(ok, METRICS[metric].evidence(v.lower, v.upper, threshold), "inconclusive")
        if self.multiplicity == "none" or self.simultaneous is None or metric not in self.simultaneous.metrics:
            return states
        failing = fails(self, metric, threshold)
        return np.where(states == "fail", np.where(failing, "fail", "inconclusive"), states)

    def family(self) -> np.ndarray:
        """Per pair: its family (0 but in ``backtest``'s stacked steps)."""
        return np.arange(len(self.attribute.pairs)) // max(len(self.attribute.pairs) // self.families, 1)

    def judged(self, metric: str) -> np.ndarray:
        """Per family: how many comparisons of the metric were judged (have a value)."""
        return np.bincount(self.family(), weights=self.sufficient(metric), minlength=self.families).astype(np.int64)

    def worst(self, metric: str) -> Worst:
        """Per family: the largest difference (smallest ratio) over the judged comparisons, and an interval for the
        true worst that holds simultaneously over them (:func:`worst_of`)."""
        assert self.simultaneous is not None and metric in self.simultaneous.metrics, metric
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


def worst_of(kind: str, values: MetricValues, simultaneous: MetricValues, judged: np.ndarray, family: np.ndarray,
             families: int) -> Worst:  # fmt: skip
    """Per family, over its ``judged`` pairs: the worst value (a difference's largest, a ratio's smallest) and, from
    every pair's interval at 95%/K (Bonferroni over the K judged), the max (a ratio: min) of their lower and of their
    upper bounds: if every interval holds its pair's true value, which happens with 95% probability at least, this
    one holds the true worst. Vectorised over families (``backtest`` judges a day of steps at once)."""
    sign = -1.0 if kind == "ratio" else 1.0  # the worst is the largest of sign * value
    key = np.where(judged, sign * values.value, -np.inf)
    order = np.lexsort((-key, family))  # by family, the worst first
    first = np.searchsorted(family[order], np.arange(families))
    count = np.bincount(family[judged], minlength=families)
    pair = np.where(count > 0, order[np.minimum(first, len(order) - 1)] if len(order) else -1, -1)
    bounds = []
    for side in (simultaneous.lower, simultaneous.upper):
        top = np.full(families, -np.inf)
        np.maximum.at(top, family[judged], sign * side[judged])
        bounds.append(np.where(count > 0, sign * top, np.nan))
    value = np.where(count > 0, values.value[np.maximum(pair, 0)] if len(order) else np.nan, np.nan)
    return Worst(pair.astype(np.int64), value, bounds[0], bounds[1], count.astype(np.int64))


MULTIPLICITY = ("holm", "bonferroni", "none")
"""How ``fail`` is judged across one metric's comparisons of an attribute: Holm's step-down (the default), each at
95%/K (Bonferroni), or each alone. ``pass`` needs no adjustment (docs/auditor/numbers.md)."""


def fails(ev: Evaluation, metric: str, threshold: float) -> np.ndarray:
    """Per pair: whether its interval lies wholly beyond the threshold as one of the metric's K judged comparisons:
    each at the 5%/K error level (Bonferroni), or Holm's step-down: once r of them fail, the others are judged again
    at 5%/(K - r), until none more fails. That fails the same comparisons as Holm's rule on their p-values, since
    an interval at a lower error level holds the one at a higher."""
    assert ev.simultaneous is not None
    m = METRICS[metric]
    ok, family = ev.sufficient(metric), ev.family()
    w = ev.simultaneous.metrics[metric]
    failed = ok & (m.evidence(w.lower, w.upper, threshold) == "fail")
    if ev.multiplicity == "bonferroni":
        return failed
    a, b = (np.array([p[i] for p in ev.attribute.pairs], dtype=np.int64) for i in (0, 1))
    while True:
        left = ok & ~failed
        remaining = np.bincount(family[left], minlength=ev.families)[family]
        judged = np.bincount(family[ok], minlength=ev.families)[family]
        step = np.flatnonzero(left & (remaining < judged))  # a family where some failed: its others, at 95%/left
        if not step.size:
            return failed
        again = m.compute(ev.counts, a[step], b[step], comparisons=remaining[step])
        newly = m.evidence(again.lower, again.upper, threshold) == "fail"
        if not newly.any():
            return failed
        failed[step[newly]] = True


def _rows(stats: Any, rows: slice | np.ndarray) -> Any:
    """The same dataclass of per-row arrays (pairs of arrays for intervals), restricted to some rows."""
    values = {f.name: getattr(stats, f.name) for f in fields(stats)}
    return type(stats)(**{k: tuple(a[rows] for a in v) if isinstance(v, tuple) else v[rows] for k, v in values.items()})


def evaluate_many(
    blocks: Sequence[tuple[Attribute, np.ndarray]], min_samples: int, metrics: Iterable[str] = METRICS,
    multiplicity: str = "none", families: int = 1,
) -> list[Evaluation]:  # fmt: skip
    """Evaluate one or more ``(attribute, counts)`` blocks in one vectorised pass.

    ``counts`` has a row per group, optionally followed by one more row: the attribute's unknown category (rows
    outside its groups), which counts for the overall rate but in no comparison. ``metrics``: the metrics to compute
    (default: all of the table). ``multiplicity``: how a fail is judged across a metric's comparisons
    (:data:`MULTIPLICITY`); ``families``: each block's pairs are this many families judged apart (``backtest``).

    The arithmetic runs on arrays of a handful of groups, so numpy's per-call overhead dominates: one pass over
    every window and attribute at once costs about what one attribute did before.
    """
    unknowns = [c[len(a.groups)] if len(c) > len(a.groups) else np.zeros(N_COUNTS, np.int64) for a, c in blocks]
    blocks = [(a, c[: len(a.groups)]) for a, c in blocks]
    counts = np.concatenate([c for _, c in blocks])
    sizes = [len(a.groups) for a, _ in blocks]
    starts = np.cumsum([0, *sizes])
    pairs = [np.array(a.pairs, dtype=np.int64).reshape(-1, 2) for a, _ in blocks]
    pair_starts = np.cumsum([0, *(len(p) for p in pairs)])
    global_pairs = np.concatenate([p + s for p, s in zip(pairs, starts, strict=False)])
    groups = group_stats(counts)
    overall = group_stats(np.add.reduceat(counts, starts[:-1], axis=0) + np.array(unknowns).reshape(-1, N_COUNTS))
    metrics = tuple(metrics)
    comparisons = compare(counts, global_pairs[:, 0], global_pairs[:, 1], metrics)
    simultaneous = _simultaneous(counts, global_pairs, comparisons, min_samples,
                                 np.repeat(np.arange(len(pairs)), [len(p) for p in pairs]), pair_starts, families)
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
            simultaneous=simultaneous.take(local, pairs[k][:, 0], pairs[k][:, 1]),
            families=families,
        ))  # fmt: skip
    return out


def _simultaneous(counts: np.ndarray, pairs: np.ndarray, comparisons: Comparisons, min_samples: int,
                  block: np.ndarray, pair_starts: np.ndarray, families: int) -> Comparisons:  # fmt: skip
    """Every metric's pairs at the level of their family (a block's pairs, or each of its ``families`` runs): K
    sufficient comparisons in a family put each of its pairs' intervals at 95%/K."""
    local = np.arange(len(pairs)) - pair_starts[block]
    per_family = np.maximum((pair_starts[block + 1] - pair_starts[block]) // families, 1)
    family = block * families + local // per_family
    rates: RateCounts = {}
    out = {}
    for name, v in comparisons.metrics.items():
        ok = (v.support >= min_samples) & ~np.isnan(v.value)
        judged = np.bincount(family, weights=ok, minlength=int(family.max(initial=-1)) + 1).astype(np.int64)
        out[name] = METRICS[name].compute(counts, pairs[:, 0], pairs[:, 1], rates, np.maximum(judged[family], 1))
    return Comparisons(comparisons.group_a, comparisons.group_b, out)
