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

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa

from exporter.config import ConfigError
from exporter.config.sections_intersections import unique_intersection
from exporter.config.toolkit import Errors
from exporter.core.attributes import INTERSECTION_SEP
from exporter.core.fairness import t_interval, wilson_interval
from exporter.gate.data.dataset import DataError, Dataset, open_dataset
from exporter.gate.fairness.ll144 import json_float

Feature = str | Sequence[str]
CONFIDENCE = 0.95


def feature_name(feature: Feature) -> str:
    """The report key of a feature: its column, or its columns joined by ``_x_`` for an intersection."""
    return feature if isinstance(feature, str) else "_x_".join(feature)


def refuse_collisions(features: Sequence[Feature]) -> None:
    """ConfigError, one message naming every problem, when two features would be tallied under one name: a column
    listed twice, or an intersection that lists a column twice, repeats an earlier one or is named (its columns
    joined with ``_x_``) like a column or an earlier intersection. Their rows would be counted twice, or two
    features' groups mixed in one; the gate refuses its intersections by the same code."""
    errors = Errors()
    columns = [f for f in features if isinstance(f, str)]
    for column in dict.fromkeys(c for c in columns if columns.count(c) > 1):
        errors.add(column, "listed more than once: its rows would be counted twice")
    taken: dict[str, list[str]] = {}
    for feature in features:
        if not isinstance(feature, str):
            unique_intersection(list(feature), "+".join(feature), set(columns), taken, errors)
    if errors.lines:
        raise ConfigError("colliding protected features: " + "; ".join(errors.lines))


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
        ``group_sizes``, ``group_intervals``, ``interval_method``, ``threshold``, ``excluded_rows`` and
        ``groups_without_outcome``.

        A group whose every outcome is missing is listed with a NaN mean, as the seed's ``groupby(...).mean()``
        lists it; the gap is that of the other groups (pandas' ``max() - min()`` skip NaN), NaN when no group has
        an outcome, and NaN is not biased (``NaN > 0.1`` is False), as in the seed. ``groups_without_outcome``
        names such groups with their rows, so that no report passes them by omission (:func:`json_report`).

        Raises DataError (a ValueError) naming ``source`` and the column for a missing or non-numeric outcome or a
        missing feature column. A one-column feature's groups are keyed by the column's own values, as the seed's
        ``groupby`` keys them (``{0: ..., 1: ...}`` for a 0/1 column, ``1`` and ``"1"`` two groups, ``True`` and
        ``1`` one, a datetime a Timestamp; the command line's JSON writes them as text).
        """
        return self._evaluate([df], list(df.columns), source, by_value=True)

    def evaluate_dataset(self, location: str) -> dict[str, dict[str, Any]]:
        """:meth:`evaluate_bias` over a dataset (a file, folder, glob or prefix of parquet or CSV files), read a
        batch at a time: memory follows the batch, not the data."""
        return self.evaluate_opened(open_dataset(location, "data"))

    def evaluate_opened(self, dataset: Dataset) -> dict[str, dict[str, Any]]:
        """:meth:`evaluate_dataset` of a dataset already opened (listed): the command then builds its manifest from
        the same listing, so a file changed while it was read is refused (``Dataset.manifest``)."""
        columns = list(dict.fromkeys([self.outcome_feature, *(c for f in self.protected_features
                                                               for c in ([f] if isinstance(f, str) else f))]))
        present = [c for c in columns if c in dataset.columns]
        frames = (_frame(batch, self.outcome_feature) for batch in dataset.batches(present))
        return self.evaluate_batches(frames, dataset.columns, dataset.location)

    def evaluate_batches(self, frames: Iterable[pd.DataFrame], columns: Sequence[str],
                         source: str) -> dict[str, dict[str, Any]]:  # fmt: skip
        """Group sizes, sums and spreads added up over batches of rows (a DataFrame each), then the report, each
        group named by its text (as the command line's JSON writes it). Features that would be tallied under one
        name are refused first (:func:`refuse_collisions`), and two groups named alike (``1`` and ``"1"``) when
        they are met (:meth:`_Groups.named`)."""
        return self._evaluate(frames, columns, source, by_value=False)

    def _evaluate(self, frames: Iterable[pd.DataFrame], columns: Sequence[str], source: str,
                  by_value: bool) -> dict[str, dict[str, Any]]:  # fmt: skip
        """:meth:`evaluate_batches`; ``by_value``: a one-column feature's groups keyed by their values."""
        refuse_collisions(self.protected_features)
        threshold = self.bias_threshold  # read here: a subclass may set it
        if isinstance(threshold, bool) or not isinstance(threshold, int | float) or math.isnan(threshold):
            raise ConfigError(f"bias_threshold {threshold!r} is not a number: no gap is above it, so every feature "
                              "would read as not biased")  # fmt: skip
        if self.outcome_feature not in columns:
            raise DataError(f"{source}: no outcome column {self.outcome_feature!r}; the data has {list(columns)}")
        for feature in self.protected_features:
            missing = [c for c in ([feature] if isinstance(feature, str) else feature) if c not in columns]
            if missing:
                raise DataError(f"{source}: no protected feature column(s) {missing}; the data has {list(columns)}")
        tallies = {feature_name(f): _Groups() for f in self.protected_features}
        binary, any_value = True, False
        for df in frames:
            outcome = self._outcome(df, source)
            valid = outcome.dropna()
            binary &= bool(valid.isin([0, 1]).all())
            any_value |= len(valid) > 0
            for feature in self.protected_features:
                columns_of = [feature] if isinstance(feature, str) else list(feature)
                try:
                    tallies[feature_name(feature)].add(df, columns_of, outcome)
                except DataError as exc:
                    raise DataError(f"{source}: {exc}") from None
        if not any_value:
            raise DataError(f"{source}: outcome column {self.outcome_feature!r} has no values")
        return {feature_name(f): self._feature(f, tallies[feature_name(f)], binary, source, by_value)
                for f in self.protected_features}  # fmt: skip

    def _outcome(self, df: pd.DataFrame, source: str) -> pd.Series:
        column = self.outcome_feature
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
        return numeric.astype(np.float64)

    def _feature(self, feature: Feature, groups: _Groups, binary: bool, source: str,
                 by_value: bool) -> dict[str, Any]:  # fmt: skip
        columns = [feature] if isinstance(feature, str) else list(feature)
        if not groups.keys:
            raise DataError(f"{source}: no row has both {columns} and outcome {self.outcome_feature!r}")
        sizes, sums, means, stds = groups.stats()
        if binary:
            lower, upper = wilson_interval(np.rint(sums).astype(np.int64), sizes)
        else:
            lower, upper = t_interval(means, stds, sizes, CONFIDENCE)
        names = groups.keys if by_value else groups.named(columns, source)
        gap = float(pd.Series(means).max() - pd.Series(means).min())  # NaN skipped, as the seed's pandas does
        measured = [i for i in range(len(names)) if sizes[i] > 0]
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
            "highest_group": names[max(measured, key=means.__getitem__)] if measured else None,
            "lowest_group": names[min(measured, key=means.__getitem__)] if measured else None,
            "excluded_rows": groups.excluded,
            "groups_without_outcome": {names[i]: groups.unmeasured[i] for i in range(len(names)) if sizes[i] == 0},
        }


def json_report(report: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """A report as the command line writes it: the mean of a group without outcome values, and a gap of no groups,
    null (JSON has no NaN; their groups are named in ``groups_without_outcome``)."""
    return {feature: {**r, "group_stats": {g: json_float(v) for g, v in r["group_stats"].items()},
                      "fairness_gap": json_float(r["fairness_gap"])} for feature, r in report.items()}  # fmt: skip


@dataclass
class _Groups:
    """One feature's groups over batches, in the order they first appear: size, sum, mean and sum of squared
    deviations (merged as Chan et al. do, so the spread is exact to rounding); a group seen in one batch keeps
    pandas' own mean and standard deviation, so a file of one batch reports what pandas computes. A row with a
    group and no outcome names its group (the seed's ``groupby`` lists it) and counts in ``unmeasured``.

    A one-column feature's groups are keyed by the column's values, as the seed's ``groupby`` keys them (``1`` and
    ``"1"`` two groups, ``True`` and ``1`` one, a datetime a Timestamp); an intersection's by its values' text
    joined by ``:``. ``names`` holds each group's text, as pandas writes its first value."""

    keys: list[Any] = field(default_factory=list)
    names: list[str] = field(default_factory=list)
    index: dict[Any, int] = field(default_factory=dict)
    parts: list[list[tuple[int, float, float, float, float]]] = field(default_factory=list)
    unmeasured: list[int] = field(default_factory=list)
    """Per group, its rows without an outcome (excluded from its mean)."""
    excluded: int = 0
    combinations: dict[str, tuple[Any, ...]] = field(default_factory=dict)
    """An intersection's group names and the values each stands for (two combinations never share a name)."""

    def add(self, df: pd.DataFrame, columns: list[str], outcome: pd.Series) -> None:
        grouped_rows = df[columns].notna().all(axis=1).to_numpy()
        keep = grouped_rows & outcome.notna().to_numpy()
        self.excluded += int((~keep).sum())
        if not grouped_rows.any():
            return
        keys: Any
        if len(columns) == 1:
            column = df.loc[grouped_rows, columns[0]]
            keys = column.array  # positional, whatever the frame's index
            firsts = ~pd.Series(keys).duplicated().to_numpy()  # the groupby's own equality (True == 1)
            text = dict(zip(keys[firsts], column[firsts].astype(str), strict=True))
        else:
            cells = df.loc[grouped_rows, columns]
            keys = cells.astype(str).agg(INTERSECTION_SEP.join, axis=1).to_numpy()
            self._distinct(columns, cells, keys)
            text = {}
        for key, rows in pd.Series(np.ones(len(keys))).groupby(keys, sort=False, observed=True).size().items():
            at = self._at(key, text.get(key, str(key)))
            self.unmeasured[at] += int(rows)  # every row of the group, less the measured below
        grouped = outcome[keep].groupby(keys[keep[grouped_rows]], sort=False, observed=True)
        table = pd.DataFrame({"n": grouped.size(), "sum": grouped.sum(), "mean": grouped.mean(),
                              "std": grouped.std(ddof=1)})  # fmt: skip
        for key, row in zip(table.index, table.itertuples(index=False), strict=True):
            self.unmeasured[self.index[key]] -= int(row.n)
            var = 0.0 if row.n < 2 else float(row.std) ** 2
            self.parts[self.index[key]].append((int(row.n), float(row.sum), float(row.mean), var * (row.n - 1),
                                                float(row.std)))  # fmt: skip

    def _distinct(self, columns: list[str], cells: pd.DataFrame, keys: np.ndarray) -> None:
        """Refuse two combinations of an intersection's values that would be named alike, their values joined by
        ``:`` (``a:b`` + ``c`` and ``a`` + ``b:c``, or ``1`` + ``c`` and ``"1"`` + ``c``): one group would silently
        hold the rows of both."""
        firsts = ~cells.duplicated().to_numpy()
        for key, values in zip(keys[firsts].tolist(), cells[firsts].itertuples(index=False, name=None), strict=True):
            known = self.combinations.setdefault(key, values)
            if known != values:
                raise DataError(f"protected feature {columns}: the values {list(known)} and {list(values)} are both "
                                f"named {key!r} (their values joined by {INTERSECTION_SEP!r}); rename the values "
                                "that hold it")  # fmt: skip

    def named(self, columns: list[str], source: str) -> list[str]:
        """The groups' text names; DataError for two groups named alike (``1`` and ``"1"``), which a report keyed
        by text would merge into one: one would hide the other's gap."""
        first: dict[str, int] = {}
        for i, name in enumerate(self.names):
            known = first.setdefault(name, i)
            if known != i:
                raise DataError(f"{source}: protected feature {columns}: the values {self.keys[known]!r} and "
                                f"{self.keys[i]!r} are both named {name!r}; make the column hold one type")  # fmt: skip
        return self.names

    def _at(self, key: Any, name: str) -> int:
        """The index of a group, added at its first sight (a numpy scalar kept as the Python value it holds)."""
        if key not in self.index:
            self.index[key] = len(self.keys)
            self.keys.append(key.item() if isinstance(key, np.generic) else key)
            self.names.append(name)
            self.parts.append([])
            self.unmeasured.append(0)
        return self.index[key]

    def stats(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """Per group: size, sum, mean, standard deviation (ddof=1; NaN for a group of one, and both NaN for a
        group without outcome values, of size 0)."""
        out = []
        for parts in self.parts:
            if not parts:
                out.append((0, 0.0, math.nan, math.nan))
                continue
            n, total, mean, m2, std = parts[0]
            for n_b, sum_b, mean_b, m2_b, _ in parts[1:]:
                delta = mean_b - mean
                m2 += m2_b + delta * delta * n * n_b / (n + n_b)
                n, total = n + n_b, total + sum_b
                mean = total / n
                std = math.sqrt(m2 / (n - 1)) if n > 1 else math.nan
            out.append((n, total, mean, std))
        sizes, sums, means, stds = (np.array(c) for c in zip(*out, strict=True))
        return sizes.astype(np.int64), sums.astype(np.float64), means.astype(np.float64), stds.astype(np.float64)


def _frame(batch: pa.RecordBatch, outcome: str) -> pd.DataFrame:
    """A batch as pandas, integer feature columns as nullable integers: a group is named ``1`` in every batch, with
    or without a blank cell in it (pandas named it ``1.0`` in a column with a blank)."""
    integers = {pa.int8(), pa.int16(), pa.int32(), pa.int64(), pa.uint8(), pa.uint16(), pa.uint32()}
    return pd.DataFrame({name: array.to_pandas(types_mapper=None if name == outcome else
                                               {t: pd.Int64Dtype() for t in integers}.get)
                         for name, array in zip(batch.schema.names, batch.columns, strict=True)})  # fmt: skip
