"""Turn rows (a DataFrame, or a batch of decoded events) into per-subgroup counts for the core."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import pandas as pd

from exporter.config import OTHER_GROUP, Attribute, Config
from exporter.fairness import counts_from_arrays


def code_table(groups: Sequence[str]) -> tuple[dict[str, int], int]:
    """The code of each named group's value (values are compared as strings), and the code of any other value:
    the index of ``other`` when it is one of the groups, else ``-1``."""
    has_other = bool(groups) and groups[-1] == OTHER_GROUP
    named = groups[:-1] if has_other else groups
    return {g: i for i, g in enumerate(named)}, len(named) if has_other else -1


def encode(values: Sequence[object] | np.ndarray | pd.Series, groups: Sequence[str]) -> np.ndarray:
    """Codes of a column of values, by :func:`code_table`.

    >>> encode(["f", "m", "x"], ("m", "f")).tolist()
    [1, 0, -1]
    >>> encode(["f", "m", None], ("m", "f", "other")).tolist()
    [1, 0, 2]
    """
    table, unknown = code_table(groups)
    codes = pd.Series(values, dtype=object).astype(str).map(table)
    return codes.fillna(unknown).to_numpy(dtype=np.int64)


def attribute_codes(attribute: Attribute, columns: Mapping[str, np.ndarray]) -> np.ndarray:
    """Codes of one (possibly intersectional) attribute from the base attributes' codes, keyed by column."""
    return attribute.combine([columns[c] for c in attribute.columns])


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
