"""The seed's public metric functions, generated from the metric table: thin wrappers over the counts-based core
(same signatures and results as the seed's three, and the same shape for every other metric)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Final

import numpy as np
import pandas as pd

from exporter.config import MetricSpec
from exporter.core.encoding import value_text
from exporter.core.fairness import counts_from_arrays
from exporter.core.metric_table import COUNT_METRICS, METRICS
from exporter.gate.fairness.frames import encode

MAX_VALUES_NAMED = 5


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
    naming one group twice, a group with no rows, or predictions or labels that are no 0/1 (:func:`_zero_one`)."""
    groups = (value_text(group_a), value_text(group_b))
    if groups[0] == groups[1]:
        raise ValueError(f"group_a_value {group_a!r} and group_b_value {group_b!r} are the same group "
                         f"{groups[0]!r}: a comparison needs two different groups")  # fmt: skip
    codes = encode(np.asarray(protected_attribute, dtype=object), groups)
    labels = None if y_true is None else _zero_one("y_true", y_true, unknown=True)
    counts = counts_from_arrays(codes, 2, _zero_one("y_pred", y_pred), labels)
    for g, n in zip(groups, counts[:, 0] + counts[:, 1], strict=True):
        if n == 0:
            raise ValueError(f"group {g!r} has no rows in protected_attribute")
    return counts


def _zero_one(name: str, values: Sequence[Any], *, unknown: bool = False) -> np.ndarray:
    """A column of 0/1 values (numbers equal to 0 or 1, or booleans: the gate's rule) as int64, checked before any
    cast: the seed averages ``y_pred``, so a score of 0.9 read as 0, a -1 label read as a negative or a NaN read as
    INT64_MIN gave a rate the seed never computes. ``unknown``: a missing value (None, NaN) is allowed, as -1 (a
    label not yet known: the seed's ``y_true == 1`` and ``== 0`` skip it, and the gate counts it unlabelled)."""
    array = np.asarray(values)
    if array.dtype == np.bool_:
        return array.astype(np.int64)
    flat = array.ravel()
    blank = pd.isna(flat) if unknown else np.zeros(len(flat), dtype=bool)
    if flat.dtype.kind in "iuf":
        fine = (flat == 0) | (flat == 1) | blank
    else:  # object (mixed, nullable) or text: each value by its type, as the gate reads a cell
        fine = np.array([isinstance(v, bool | np.bool_ | int | float | np.number) and v in (0, 1) for v in flat],
                        dtype=bool) | blank  # fmt: skip
    if not fine.all():
        wrong = list(dict.fromkeys(repr(str(v)) if isinstance(v, str) else str(v) for v in flat[~fine]))
        shown = ", ".join(wrong[:MAX_VALUES_NAMED]) + (f" and {len(wrong) - MAX_VALUES_NAMED} more"
                                                       if len(wrong) > MAX_VALUES_NAMED else "")  # fmt: skip
        raise ValueError(f"{name} holds values that are no 0/1 (in {int((~fine).sum())} of {len(flat)} rows): "
                         f"{shown}; pass 0/1 numbers or booleans{' (or NaN: unknown)' if unknown else ''}"
                         f"{' (a score thresholded: scores >= 0.5)' if name == 'y_pred' else ''}")  # fmt: skip
    return np.where(blank, -1, flat).astype(np.int64).reshape(array.shape)


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
