"""The seed's public metric functions, generated from the metric table: thin wrappers over the counts-based core
(same signatures and results as the seed's three, and the same shape for every other metric)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Final

import numpy as np

from exporter.config import MetricSpec
from exporter.core.encoding import value_text
from exporter.core.fairness import counts_from_arrays
from exporter.core.metric_table import COUNT_METRICS, METRICS
from exporter.gate.fairness.frames import encode


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
) -> np.ndarray:
    """The 2-group counts array of one pair: the values compared as the config's groups are (a whole float as the
    integer: group ``1.0`` is the values ``1.0`` and ``1``, as the seed's ``==`` finds them). ValueError for a pair
    naming one group twice or a group with no rows."""
    groups = (value_text(group_a), value_text(group_b))
    if groups[0] == groups[1]:
        raise ValueError(f"group_a_value {group_a!r} and group_b_value {group_b!r} are the same group "
                         f"{groups[0]!r}: a comparison needs two different groups")  # fmt: skip
    codes = encode(np.asarray(protected_attribute, dtype=object), groups)
    counts = counts_from_arrays(codes, 2, np.asarray(y_pred), None if y_true is None else np.asarray(y_true))
    for g, n in zip(groups, counts[:, 0] + counts[:, 1], strict=True):
        if n == 0:
            raise ValueError(f"group {g!r} has no rows in protected_attribute")
    return counts


def _result(name: str, counts: np.ndarray, a: Any, b: Any, threshold: float) -> FairnessResult:
    value = float(METRICS[name].compute(counts, np.array([0]), np.array([1])).value[0])
    if name == "disparate_impact_ratio" and np.isnan(value):  # neither group selected: the seed's ratio is 0
        value = 0.0
    passed = MetricSpec(name, threshold, "blocking").passes(value)
    return FairnessResult(name, f"{a}_vs_{b}", str(a), str(b), round(value, 4), threshold, passed)


def _unlabelled(name: str) -> Callable[..., FairnessResult]:
    metric = METRICS[name]

    def wrapper(y_pred: Sequence[Any], protected_attribute: Sequence[Any], group_a_value: Any, group_b_value: Any,
                threshold: float = metric.default_threshold) -> FairnessResult:  # fmt: skip
        return _result(name, _pair(y_pred, protected_attribute, group_a_value, group_b_value), group_a_value,
                       group_b_value, threshold)  # fmt: skip

    wrapper.__name__ = wrapper.__qualname__ = name
    wrapper.__doc__ = f"{metric.formula}; passes {_direction(name)} the threshold."
    return wrapper


def _labelled(name: str) -> Callable[..., FairnessResult]:
    metric = METRICS[name]

    def wrapper(y_true: Sequence[Any], y_pred: Sequence[Any], protected_attribute: Sequence[Any], group_a_value: Any,
                group_b_value: Any, threshold: float = metric.default_threshold) -> FairnessResult:  # fmt: skip
        return _result(name, _pair(y_pred, protected_attribute, group_a_value, group_b_value, y_true),
                       group_a_value, group_b_value, threshold)  # fmt: skip

    wrapper.__name__ = wrapper.__qualname__ = name
    wrapper.__doc__ = f"{metric.formula}; passes {_direction(name)} the threshold."
    return wrapper


def _direction(name: str) -> str:
    return "at or below" if METRICS[name].kind == "difference" else "at or above"


SEED_FUNCTIONS: Final[dict[str, Callable[..., FairnessResult]]] = {
    name: (_labelled if METRICS[name].needs_labels else _unlabelled)(name) for name in COUNT_METRICS
}
"""One function per metric of the table: ``(y_pred, protected_attribute, group_a_value, group_b_value,
threshold)``, with ``y_true`` first for metrics that need labels (the seed's signatures)."""


def __getattr__(name: str) -> Callable[..., FairnessResult]:
    """``seed_api.<metric name>``: the function of any metric of the table."""
    if name in SEED_FUNCTIONS:
        return SEED_FUNCTIONS[name]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
