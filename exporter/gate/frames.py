"""Turn a DataFrame of predictions into per-subgroup counts for the core (the gate's side of the encoding)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd

from exporter.config import Config
from exporter.core.encoding import attribute_codes, code_table
from exporter.core.fairness import counts_from_arrays


def encode(values: Sequence[object] | np.ndarray | pd.Series, groups: Sequence[str]) -> np.ndarray:
    """Codes of a column of values, by :func:`code_table` (a missing value is never a group).

    Each distinct value is looked up once (values are factorised first), so millions of rows cost a hash pass.

    >>> encode(["f", "m", "x"], ("m", "f")).tolist()
    [1, 0, -1]
    >>> encode(["f", "m", None], ("m", "f", "other")).tolist()
    [1, 0, 2]
    """
    table, unknown = code_table(groups)
    positions, distinct = pd.factorize(values if isinstance(values, pd.Series) else pd.Series(values, dtype=object))
    lookup = np.array([*(table.get(str(v), unknown) for v in distinct), unknown], dtype=np.int64)
    return lookup[positions]  # a missing value's position is -1: the last entry, `unknown`


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
