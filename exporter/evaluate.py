"""Evaluate one attribute's counts: group statistics, configured comparisons and their sufficiency.

The audit gate and the daemon's computation both go through :func:`evaluate`, so the rules for when a number is
reported (enough samples) and what it means are written once.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from exporter.config import Attribute
from exporter.fairness import Comparisons, GroupStats, compare, group_stats, metric_values


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


def evaluate(attribute: Attribute, counts: np.ndarray, min_samples: int) -> Evaluation:
    """Evaluate an attribute's ``(n_groups, N_COUNTS)`` counts."""
    pairs = np.array(attribute.pairs, dtype=np.int64).reshape(-1, 2)
    return Evaluation(
        attribute=attribute,
        counts=counts,
        groups=group_stats(counts),
        overall=group_stats(counts.sum(axis=0, keepdims=True)),
        comparisons=compare(counts, pairs[:, 0], pairs[:, 1]),
        min_samples=min_samples,
    )
