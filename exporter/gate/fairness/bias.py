"""The bias auditor: the mean of any numeric outcome per group of each protected feature, and the gap between the
highest and the lowest group mean against a threshold.

Each group mean carries a 95% interval: Wilson for a 0/1 outcome (it is then a rate, exactly as in the gate), a
Student t interval otherwise; both come from the counts-based core.

>>> df = pd.DataFrame({"gender": ["male", "female", "male", "female", "male", "female"],
...                    "race": ["white", "black", "black", "white", "asian", "asian"],
...                    "prediction_accuracy": [0.9, 0.7, 0.8, 0.85, 0.92, 0.9]})
>>> report = BiasAuditor(["gender", "race"], "prediction_accuracy").evaluate_bias(df)
>>> {g: round(v, 6) for g, v in report["race"]["group_stats"].items()}, report["race"]["is_biased"]
({'white': 0.875, 'black': 0.75, 'asian': 0.91}, True)
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd

from exporter.core.attributes import INTERSECTION_SEP
from exporter.core.fairness import t_interval, wilson_interval
from exporter.gate.fairness.audit import DataError
from exporter.gate.fairness.ll144 import json_float

Feature = str | Sequence[str]
CONFIDENCE = 0.95


def feature_name(feature: Feature) -> str:
    """The report key of a feature: its column, or its columns joined by ``_x_`` for an intersection."""
    return feature if isinstance(feature, str) else "_x_".join(feature)


class BiasAuditor:
    """Group means of an outcome column per protected feature (a column, or a list of columns as one
    intersectional feature), their gap (max - min) and whether it exceeds ``bias_threshold``.

    The threshold is read when :meth:`evaluate_bias` runs, so a subclass may set or override ``bias_threshold``.
    """

    def __init__(self, protected_features: Sequence[Feature], outcome_feature: str, bias_threshold: float = 0.1):
        self.protected_features = [f if isinstance(f, str) else list(f) for f in protected_features]
        self.outcome_feature = outcome_feature
        self.bias_threshold = bias_threshold

    def evaluate_bias(self, df: pd.DataFrame, *, source: str = "<data>") -> dict[str, dict[str, Any]]:
        """Per feature: ``group_stats`` (mean outcome per group), ``fairness_gap``, ``is_biased``, and beside them
        ``group_sizes``, ``group_intervals``, ``interval_method``, ``threshold`` and ``excluded_rows``.

        Raises DataError (a ValueError) naming ``source`` and the column for a missing or non-numeric outcome or a
        missing feature column.
        """
        outcome = self._outcome(df, source)
        binary = bool(outcome.dropna().isin([0, 1]).all())
        return {feature_name(f): self._feature(df, f, outcome, binary, source) for f in self.protected_features}

    def _outcome(self, df: pd.DataFrame, source: str) -> pd.Series:
        column = self.outcome_feature
        if column not in df.columns:
            raise DataError(f"{source}: no outcome column {column!r}; the data has {list(df.columns)}")
        values = df[column]
        if values.dtype == bool:
            values = values.astype(np.int64)
        numeric = pd.to_numeric(values, errors="coerce")
        bad = numeric.isna() & values.notna()
        if bad.any() or not pd.api.types.is_numeric_dtype(numeric):
            sample = values[bad].unique()[:5].tolist()
            raise DataError(f"{source}: outcome column {column!r} must be numeric; found {sample}")
        if np.isinf(numeric.to_numpy(dtype=np.float64)).any():
            raise DataError(f"{source}: outcome column {column!r} holds infinite values")
        if numeric.isna().all():
            raise DataError(f"{source}: outcome column {column!r} has no values")
        return numeric.astype(np.float64)

    def _feature(
        self, df: pd.DataFrame, feature: Feature, outcome: pd.Series, binary: bool, source: str
    ) -> dict[str, Any]:
        columns = [feature] if isinstance(feature, str) else list(feature)
        missing = [c for c in columns if c not in df.columns]
        if missing:
            raise DataError(f"{source}: no protected feature column(s) {missing}; the data has {list(df.columns)}")
        keep = df[columns].notna().all(axis=1) & outcome.notna()
        if not keep.any():
            raise DataError(f"{source}: no row has both {columns} and outcome {self.outcome_feature!r}")
        keys = df.loc[keep, columns].astype(str).agg(INTERSECTION_SEP.join, axis=1)
        grouped = outcome[keep].groupby(keys, sort=False)
        sizes = grouped.size().to_numpy(dtype=np.int64)
        means = grouped.mean().to_numpy(dtype=np.float64)
        if binary:
            lower, upper = wilson_interval(grouped.sum().to_numpy(dtype=np.int64), sizes)
        else:
            lower, upper = t_interval(means, grouped.std(ddof=1).to_numpy(dtype=np.float64), sizes, CONFIDENCE)
        names = [str(g) for g in grouped.size().index]
        gap = float(means.max() - means.min())
        return {
            "group_stats": dict(zip(names, means.tolist(), strict=True)),
            "fairness_gap": gap,
            "is_biased": bool(gap > self.bias_threshold),
            "threshold": self.bias_threshold,
            "columns": columns,
            "outcome": self.outcome_feature,
            "group_sizes": dict(zip(names, sizes.tolist(), strict=True)),
            "group_intervals": {g: [json_float(lo), json_float(hi)]
                                for g, lo, hi in zip(names, lower, upper, strict=True)},
            "interval_method": "wilson" if binary else "t",
            "confidence": CONFIDENCE,
            "highest_group": names[int(np.argmax(means))],
            "lowest_group": names[int(np.argmin(means))],
            "excluded_rows": int((~keep).sum()),
        }
