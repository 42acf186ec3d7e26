"""The seed's public metric functions: thin wrappers over the counts-based core, same signatures and results."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from exporter.config import MetricSpec
from exporter.core.fairness import Comparisons, compare, counts_from_arrays
from exporter.gate.frames import encode


@dataclass(frozen=True)
class FairnessResult:
    """One metric for one pair of groups: the value (rounded to 4 places), its threshold and the verdict."""

    metric_name: str
    dimension: str
    group_a: str
    group_b: str
    value: float
    threshold: float
    passed: bool


def _pair(
    y_pred: Sequence[Any], protected_attribute: Sequence[Any], group_a: Any, group_b: Any, y_true: Any = None
) -> Comparisons:
    groups = (str(group_a), str(group_b))
    codes = encode(np.asarray(protected_attribute, dtype=object), groups)
    counts = counts_from_arrays(codes, 2, np.asarray(y_pred), None if y_true is None else np.asarray(y_true))
    for g, n in zip(groups, counts[:, 0] + counts[:, 1], strict=True):
        if n == 0:
            raise ValueError(f"group {g!r} has no rows in protected_attribute")
    return compare(counts, np.array([0]), np.array([1]))


def _result(name: str, value: float, a: Any, b: Any, threshold: float) -> FairnessResult:
    passed = MetricSpec(name, threshold, "blocking").passes(value)
    return FairnessResult(name, f"{a}_vs_{b}", str(a), str(b), round(float(value), 4), threshold, passed)


def demographic_parity_difference(
    y_pred: Sequence[Any], protected_attribute: Sequence[Any], group_a_value: Any, group_b_value: Any,
    threshold: float = 0.05,
) -> FairnessResult:  # fmt: skip
    """|P(pred=1 | a) - P(pred=1 | b)|; passes at or below the threshold."""
    value = _pair(y_pred, protected_attribute, group_a_value, group_b_value).demographic_parity_difference[0]
    return _result("demographic_parity_difference", value, group_a_value, group_b_value, threshold)


def equalised_odds_difference(
    y_true: Sequence[Any], y_pred: Sequence[Any], protected_attribute: Sequence[Any], group_a_value: Any,
    group_b_value: Any, threshold: float = 0.05,
) -> FairnessResult:  # fmt: skip
    """max(|TPR_a - TPR_b|, |FPR_a - FPR_b|); passes at or below the threshold."""
    value = _pair(y_pred, protected_attribute, group_a_value, group_b_value, y_true).equalised_odds_difference[0]
    return _result("equalised_odds_difference", value, group_a_value, group_b_value, threshold)


def disparate_impact_ratio(
    y_pred: Sequence[Any], protected_attribute: Sequence[Any], group_a_value: Any, group_b_value: Any,
    threshold: float = 0.80,
) -> FairnessResult:  # fmt: skip
    """min/max of the two selection rates (four-fifths rule); passes at or above the threshold."""
    value = _pair(y_pred, protected_attribute, group_a_value, group_b_value).disparate_impact_ratio[0]
    return _result("disparate_impact_ratio", value, group_a_value, group_b_value, threshold)
