"""Turn a DataFrame of predictions into per-subgroup counts for the core (the gate's side of the encoding)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd

from exporter.config import ModelSpec
from exporter.core.encoding import attribute_codes, code_table, value_text
from exporter.core.fairness import counts_from_arrays


def encode(values: Sequence[object] | np.ndarray | pd.Series, groups: Sequence[str]) -> np.ndarray:
    """Codes of a column of values, by :func:`code_table`; a blank cell gets the attribute's unknown code.

    Cells are compared with the config's groups as :func:`value_text` writes them (as the daemon compares its
    JSON values), a whole float as an integer. Each distinct value is converted once.

    >>> encode(["f", "m", "x"], ("m", "f")).tolist()
    [1, 0, -1]
    >>> encode(["f", "m", None], ("m", "f", "other")).tolist()
    [1, 0, 2]
    >>> encode([1.0, 2.0, float("nan")], ("1", "2")).tolist()  # an integer column with a blank cell
    [0, 1, -1]
    """
    table, unknown = code_table(groups)
    positions, distinct = pd.factorize(pd.Series(values), use_na_sentinel=True)  # a blank is -1
    distinct_codes = np.array([table.get(value_text(v), unknown) for v in distinct] + [unknown], dtype=np.int64)
    return distinct_codes[positions]  # position -1 picks the trailing unknown


def frame_counts(
    config: ModelSpec, frame: pd.DataFrame, y_pred: np.ndarray, y_true: np.ndarray | None
) -> dict[str, np.ndarray]:
    """Counts of every configured attribute: a row per group, then one row for its unknown category (values
    outside the groups, or missing), which the overall rate counts and no comparison does."""
    base = {a.columns[0]: encode(frame[a.columns[0]].to_numpy(), a.groups) for a in config.base_attributes}
    out = {}
    for attribute in config.attributes:
        n = len(attribute.groups)
        codes = attribute_codes(attribute, base)
        out[attribute.name] = counts_from_arrays(np.where(codes < 0, n, codes), n + 1, y_pred, y_true)
    return out
