"""Evaluate one attribute's counts: group statistics, configured comparisons and their sufficiency.

The audit gate and the daemon's computation both go through :func:`evaluate_many`, so the rules for when a number is
reported (enough samples) and what it means are written once.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, fields, replace
from typing import Any

import numpy as np

from exporter.core.attributes import Attribute
from exporter.core.fairness import Comparisons, GroupStats, compare, group_stats, metric_values


@dataclass(frozen=True)
class Evaluation:
    """Everything reported about one attribute in one window (or one audit)."""

    attribute: Attribute
    counts: np.ndarray
    groups: GroupStats
    overall: GroupStats
    comparisons: Comparisons
    min_samples: int

    def sufficient(self, metric: str) -> np.ndarray:
        """Per pair: both groups have at least min_samples predictions (labelled ones for equalised odds)."""
        if metric == "equalised_odds_difference":
            value = self.comparisons.equalised_odds_difference
            return (self.comparisons.min_labelled >= self.min_samples) & ~np.isnan(value)
        return self.comparisons.min_samples >= self.min_samples

    def metric(self, metric: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(value, lower, upper) per pair."""
        return metric_values(self.comparisons, metric)


def _rows(stats: Any, rows: slice | np.ndarray) -> Any:
    """The same dataclass of per-row arrays (pairs of arrays for intervals), restricted to some rows."""
    values = {f.name: getattr(stats, f.name) for f in fields(stats)}
    return type(stats)(**{k: tuple(a[rows] for a in v) if isinstance(v, tuple) else v[rows] for k, v in values.items()})


def evaluate_many(blocks: Sequence[tuple[Attribute, np.ndarray]], min_samples: int) -> list[Evaluation]:
    """Evaluate one or more ``(attribute, (n_groups, N_COUNTS) counts)`` blocks in one vectorised pass.

    The arithmetic runs on arrays of a handful of groups, so numpy's per-call overhead dominates: one pass over
    every window and attribute at once costs about what one attribute did before.
    """
    counts = np.concatenate([c for _, c in blocks])
    sizes = [len(a.groups) for a, _ in blocks]
    starts = np.cumsum([0, *sizes])
    pairs = [np.array(a.pairs, dtype=np.int64).reshape(-1, 2) for a, _ in blocks]
    pair_starts = np.cumsum([0, *(len(p) for p in pairs)])
    global_pairs = np.concatenate([p + s for p, s in zip(pairs, starts, strict=False)])
    groups = group_stats(counts)
    overall = group_stats(np.add.reduceat(counts, starts[:-1], axis=0))
    comparisons = compare(counts, global_pairs[:, 0], global_pairs[:, 1])
    out = []
    for k, (attribute, block) in enumerate(blocks):
        local = slice(pair_starts[k], pair_starts[k + 1])
        out.append(Evaluation(
            attribute=attribute,
            counts=block,
            groups=_rows(groups, slice(starts[k], starts[k + 1])),
            overall=_rows(overall, slice(k, k + 1)),
            comparisons=replace(_rows(comparisons, local), group_a=pairs[k][:, 0], group_b=pairs[k][:, 1]),
            min_samples=min_samples,
        ))  # fmt: skip
    return out
