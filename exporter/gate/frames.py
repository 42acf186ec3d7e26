"""Turn a DataFrame of predictions into per-subgroup counts for the core (the gate's side of the encoding)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

import numpy as np
import pandas as pd

from exporter.config import Config
from exporter.core.encoding import attribute_codes, code_table
from exporter.core.fairness import counts_from_arrays

_EXACT_FLOAT: Final = 2.0**53  # floats up to here hold whole numbers exactly


def _number_text(value: object) -> str | None:
    """A cell as the config writes it: a whole float as an integer ("1", not "1.0"), a blank as None."""
    if value is None:
        return None
    if isinstance(value, float | np.floating):
        number = float(value)
        if np.isnan(number):
            return None
        if number.is_integer() and abs(number) < _EXACT_FLOAT:
            return str(int(number))
    return str(value)


def as_config_text(values: Sequence[object] | np.ndarray | pd.Series) -> pd.Series:
    """The cells of an attribute column as strings comparable with the config's groups; blanks as None.

    An integer column with one blank cell reaches pandas as floats ("1.0"), which would match no group ("1").
    """
    series = pd.Series(values)
    if pd.api.types.is_float_dtype(series):
        numbers = series.to_numpy(dtype=np.float64)
        with np.errstate(invalid="ignore"):  # NaN and inf are not whole; no warning for asking
            whole = (np.mod(numbers, 1) == 0) & (np.abs(numbers) < _EXACT_FLOAT)
        text = series.astype(str).astype(object)
        text[whole] = series[whole].astype(np.int64).astype(str)
    elif series.dtype == object:
        text = series.map(_number_text)
    else:
        text = series.astype(str).astype(object)
    text[series.isna().to_numpy()] = None
    return text


def encode(values: Sequence[object] | np.ndarray | pd.Series, groups: Sequence[str]) -> np.ndarray:
    """Codes of a column of values, by :func:`code_table`; a blank cell gets the attribute's unknown code.

    >>> encode(["f", "m", "x"], ("m", "f")).tolist()
    [1, 0, -1]
    >>> encode(["f", "m", None], ("m", "f", "other")).tolist()
    [1, 0, 2]
    >>> encode([1.0, 2.0, float("nan")], ("1", "2")).tolist()  # an integer column with a blank cell
    [0, 1, -1]
    """
    table, unknown = code_table(groups)
    codes = as_config_text(values).map(table)
    return codes.fillna(unknown).to_numpy(dtype=np.int64)


def frame_counts(
    config: Config, frame: pd.DataFrame, y_pred: np.ndarray, y_true: np.ndarray | None
) -> dict[str, tuple[np.ndarray, int]]:
    """Counts array and number of excluded rows (values outside the groups) for every configured attribute."""
    base = {a.columns[0]: encode(frame[a.columns[0]].to_numpy(), a.groups) for a in config.base_attributes}
    out = {}
    for attribute in config.attributes:
        codes = attribute_codes(attribute, base)
        counts = counts_from_arrays(codes, len(attribute.groups), y_pred, y_true)
        out[attribute.name] = (counts, int((codes < 0).sum()))
    return out
