"""Read one column of a record batch as the gate counts it: group codes, 0/1 predictions and labels, scores, text.

Each rule is applied to a column's distinct values (a batch's dictionary: a handful of values for a million rows)
and spread to the rows by their indices, which is what keeps the gate at the speed of the file. The rules are the
daemon's, as the gate has always applied them (:mod:`exporter.gate.fairness.audit`): a group is its value as
:func:`value_text` writes it (a CSV cell's text as written first: :func:`code_lut`); a 0/1 field is a number equal
to 0 or 1, or a boolean, never text.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from exporter.core.encoding import code_table, value_text
from exporter.gate.data.dataset import DataError, written_value

MAX_ROWS_NAMED = 5


def distinct(array: pa.Array) -> tuple[np.ndarray, list[Any]]:
    """Each row's index into the column's distinct values (-1 for a missing cell; int32, or int8/int16 as the file
    wrote them), and those values: a binary column's as their UTF-8 text (:func:`utf8`)."""
    if not pa.types.is_dictionary(array.type):
        array = pc.dictionary_encode(array)
    indices = array.indices.fill_null(-1) if array.indices.null_count else array.indices
    return indices.to_numpy(zero_copy_only=False), utf8(array.dictionary).to_pylist()


def utf8(values: pa.Array) -> pa.Array:
    """Binary values (parquet BYTE_ARRAY without the string annotation: Hive and Impala writers, Spark without
    ``binaryAsString``) as their UTF-8 text, as the daemon reads a Kafka key and JSON text: read as Python bytes
    they were the text ``b'A1'``, which no id or group ever matched. DataError for bytes that are no UTF-8 text."""
    if not (pa.types.is_binary(values.type) or pa.types.is_large_binary(values.type)):
        return values
    try:
        return values.cast(pa.large_string() if pa.types.is_large_binary(values.type) else pa.string())
    except pa.ArrowInvalid as exc:
        raise DataError("a binary column holds bytes that are no UTF-8 text (ids and attribute values are read "
                        "as their UTF-8 text)") from exc


def is_missing(value: object) -> bool:
    """A missing cell: null, or a float NaN (pandas reads both as missing)."""
    return value is None or (isinstance(value, float) and math.isnan(value))


def code_lut(values: Sequence[object], groups: Sequence[str], other: bool, *, written: bool = False) -> np.ndarray:
    """The code of each distinct value, then the unknown code (for index -1, a missing cell): the config's groups
    compared with :func:`value_text`; missing and other values are the attribute's unknown category.

    ``written``: the values are a CSV file's text as written. A text is a group by itself first (``01`` is group
    ``"01"``, where the CSV reader's type inference made it 1); only a text that is no group is read as the number
    it writes (:func:`written_value`), so ``1.0`` (an integer column with a blank cell, as pandas writes it) is
    still group ``"1"``, as in a parquet file of the same frame.

    >>> code_lut(["01", "1.0", "1", "x"], ("01", "1"), False, written=True).tolist()
    [0, 1, 1, -1, -1]
    """
    table, unknown = code_table(groups, other)

    def code(value: object) -> int:
        if is_missing(value):
            return unknown
        if written and isinstance(value, str) and value not in table:
            number = written_value(value)
            return unknown if number is None else table.get(value_text(number), unknown)
        return table.get(value_text(value), unknown)

    return np.array([code(v) for v in values] + [unknown], dtype=np.int64)


def group_codes(array: pa.Array, groups: Sequence[str], other: bool, *, written: bool = False) -> np.ndarray:
    """Codes of a column of attribute values (-1: not one of the groups, unless ``other``: see :func:`code_table`);
    ``written``: a CSV file's text as written (:func:`code_lut`)."""
    indices, values = distinct(array)
    return code_lut(values, groups, other, written=written)[indices]


def text(array: pa.Array) -> tuple[np.ndarray, list[str]]:
    """Each row's index into the column's distinct values as text (``model_id``, compared as text)."""
    indices, values = distinct(array)
    return indices, [str(v) for v in values]


@dataclass
class Problems:
    """Bad cells of one column over every batch: how many, the first rows, the first distinct values."""

    count: int = 0
    rows: list[int] = field(default_factory=list)
    samples: list[Any] = field(default_factory=list)
    text: bool = False

    def add(self, bad: np.ndarray, offset: int, weights: np.ndarray | None, values: list[Any] | None = None,
            indices: np.ndarray | None = None) -> None:  # fmt: skip
        """Count the rows of a batch where ``bad``; name the first rows (unknown for pre-aggregated counts) and
        values."""
        if not bad.any():
            return
        self.count += int(bad.sum() if weights is None else weights[bad].sum())
        if weights is None and len(self.rows) < MAX_ROWS_NAMED:
            self.rows += (np.flatnonzero(bad)[: MAX_ROWS_NAMED - len(self.rows)] + offset).tolist()
        if values is not None and indices is not None and len(self.samples) < MAX_ROWS_NAMED:
            seen, first = np.unique(indices[bad], return_index=True)
            for i in seen[np.argsort(first)]:
                value = values[i] if i >= 0 else None  # index -1: a missing cell
                self.text |= isinstance(value, str | bytes)
                if value not in self.samples and len(self.samples) < MAX_ROWS_NAMED:
                    self.samples.append(value)

    def where(self) -> str:
        return f" (first rows: {self.rows})" if self.rows else ""


def binary(array: pa.Array, missing: Problems, bad: Problems, offset: int,
           weights: np.ndarray | None = None) -> np.ndarray:  # fmt: skip
    """A 0/1 column as int64, -1 for a missing cell; missing cells and values that are no 0/1 are recorded in
    ``missing`` and ``bad`` (the caller decides whether missing is allowed). An integer or boolean column is
    checked on its values directly, which is the same rule and no dictionary to build."""
    if pa.types.is_integer(array.type) or pa.types.is_boolean(array.type):
        blank = array.is_null().to_numpy(zero_copy_only=False) if array.null_count else np.zeros(len(array), bool)
        ints = np.asarray(array.cast(pa.int64()).fill_null(0).to_numpy(zero_copy_only=False))
        wrong = ~blank & ((ints < 0) | (ints > 1))
        missing.add(blank, offset, weights)
        if wrong.any():
            indices, distinct_values = distinct(array)
            bad.add(wrong, offset, weights, distinct_values, indices)
        return np.where(blank, -1, ints)
    indices, values = distinct(array)
    lut = np.full(len(values) + 1, -1, dtype=np.int64)
    wrong_value = np.zeros(len(values) + 1, dtype=bool)
    empty = np.zeros(len(values) + 1, dtype=bool)
    empty[-1] = True  # index -1: a missing cell
    for i, v in enumerate(values):
        if is_missing(v):
            empty[i] = True
        elif isinstance(v, bool | int | float) and v in (0, 1):
            lut[i] = int(v)
        else:  # text, another number, anything else
            wrong_value[i] = True
    missing.add(empty[indices], offset, weights)
    bad.add(wrong_value[indices], offset, weights, values, indices)
    return lut[indices]


def scores(array: pa.Array) -> np.ndarray:
    """A column of scores as float64: NaN for a missing cell, and everywhere when the column is no number."""
    kind = array.type.value_type if pa.types.is_dictionary(array.type) else array.type
    if not (pa.types.is_integer(kind) or pa.types.is_floating(kind) or pa.types.is_decimal(kind)):
        return np.full(len(array), np.nan)
    if pa.types.is_dictionary(array.type):
        array = array.dictionary_decode()
    return np.asarray(array.cast(pa.float64()).to_numpy(zero_copy_only=False), dtype=np.float64)


def numbers(array: pa.Array) -> np.ndarray:
    """A column as float64 the way ``pd.to_numeric(errors="coerce")`` reads it (booleans 1/0, text parsed), NaN for
    a missing cell or one that holds no number."""
    kind = array.type.value_type if pa.types.is_dictionary(array.type) else array.type
    if pa.types.is_boolean(kind) or pa.types.is_integer(kind) or pa.types.is_floating(kind):
        if pa.types.is_dictionary(array.type):
            array = array.dictionary_decode()
        return np.asarray(array.cast(pa.float64()).to_numpy(zero_copy_only=False), dtype=np.float64)
    import pandas as pd

    indices, values = distinct(array)
    return pd.to_numeric(pd.Series([*values, None], dtype=object), errors="coerce").to_numpy(np.float64)[indices]


def seconds(array: pa.Array) -> tuple[np.ndarray, np.ndarray]:
    """A column of times as epoch seconds (float64; NaN for a missing cell or one that holds no time), and where a
    cell holds no time: numbers as they are, datetimes at any resolution, ISO 8601 text (naive means UTC) within
    the years 1678 to 2261. The one reading of a file's times: ``backtest``'s events and the side tables' records,
    and the predictions' times they are joined at. A dictionary's values are read once each."""
    if pa.types.is_dictionary(array.type):
        indices = array.indices.fill_null(-1).to_numpy(zero_copy_only=False)
        times, bad = seconds(array.dictionary)
        return np.append(times, np.nan)[indices], np.append(bad, False)[indices]
    kind, fine = array.type, np.zeros(len(array), dtype=bool)
    if pa.types.is_integer(kind) or pa.types.is_floating(kind):
        return np.asarray(array.cast(pa.float64()).to_numpy(zero_copy_only=False), dtype=np.float64), fine
    if pa.types.is_timestamp(kind):
        nanos = array.cast(pa.timestamp("ns", kind.tz)).cast(pa.int64())
        out = np.asarray(nanos.fill_null(0).to_numpy(zero_copy_only=False), dtype=np.int64) / 1e9  # exact division
        out[np.asarray(nanos.is_null())] = np.nan
        return out, fine
    import pandas as pd

    values = array.to_pandas()
    parsed = pd.to_datetime(values, utc=True, format="ISO8601", errors="coerce")
    stamps = parsed.mask(parsed.notna() & ~parsed.dt.year.between(1678, 2261)).dt.as_unit("ns")  # in int64 ns
    out = stamps.to_numpy("datetime64[ns]").view(np.int64) / 1e9
    missing = stamps.isna().to_numpy()
    out[missing] = np.nan
    return out, missing & values.notna().to_numpy()
