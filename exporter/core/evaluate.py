"""Evaluate one attribute's counts: group statistics, configured comparisons, their sufficiency and evidence.

The audit gate and the daemon's computation both go through :func:`evaluate_many`, so the rules for when a number is
reported (enough samples) and what its interval says are written once.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, fields, replace
from typing import Any

import numpy as np

from exporter.core.attributes import Attribute
from exporter.core.conditional import metric as conditional_metric
from exporter.core.fairness import N_COUNTS, PRED_NEG, PRED_POS, GroupStats, group_stats
from exporter.core.metric_table import METRICS, Comparisons, MetricValues, compare


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

    @property
    def unknown_samples(self) -> int:
        """Predictions in the attribute's unknown category."""
        return int(self.unknown[PRED_POS] + self.unknown[PRED_NEG])

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
        comparison is ``inconclusive``."""
        v = self.values(metric)
        judged = conditional_metric(metric).evidence(v.lower, v.upper, threshold)
        return np.where(self.sufficient(metric), judged, "inconclusive")

    def metric(self, metric: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(value, lower, upper) per pair."""
        v = self.values(metric)
        return v.value, v.lower, v.upper


def _rows(stats: Any, rows: slice | np.ndarray) -> Any:
    """The same dataclass of per-row arrays (pairs of arrays for intervals), restricted to some rows."""
    values = {f.name: getattr(stats, f.name) for f in fields(stats)}
    return type(stats)(**{k: tuple(a[rows] for a in v) if isinstance(v, tuple) else v[rows] for k, v in values.items()})


def evaluate_many(
    blocks: Sequence[tuple[Attribute, np.ndarray]], min_samples: int, metrics: Iterable[str] = METRICS
) -> list[Evaluation]:
    """Evaluate one or more ``(attribute, counts)`` blocks in one vectorised pass.

    ``counts`` has a row per group, optionally followed by one more row: the attribute's unknown category (rows
    outside its groups), which counts for the overall rate but in no comparison. ``metrics``: the metrics to compute
    (default: all of the table).

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
    comparisons = compare(counts, global_pairs[:, 0], global_pairs[:, 1], metrics)
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
        ))  # fmt: skip
    return out
