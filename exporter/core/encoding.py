"""Map attribute values to subgroup codes (row indices of a counts array), for the gate and the decoder alike."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Final

import numpy as np

from exporter.core.attributes import OTHER_GROUP, Attribute

_EXACT_FLOAT: Final = 2.0**53  # floats up to here hold whole numbers exactly


def value_text(value: object) -> str:
    """An attribute value as the config's groups are written, for the gate's cells and the daemon's JSON values
    alike: a whole float as an integer (``1.0`` is group ``"1"``: an integer column with a blank cell reaches pandas
    as floats, and JSON writers differ on ``1`` vs ``1.0``), anything else as ``str()`` (``true`` is ``"True"``)."""
    if isinstance(value, float | np.floating) and float(value).is_integer() and abs(float(value)) < _EXACT_FLOAT:
        return str(int(value))
    return str(value)


def code_table(groups: Sequence[str], other: bool) -> tuple[dict[str, int], int]:
    """The code of each named group's value (values are compared as strings), and the code of any other value:
    with ``other`` (``Attribute.other``, ``unknown_values: other``) the index of the last group, ``other``, else
    ``-1``: a group named ``other`` is then a value like any."""
    has_other = other and bool(groups) and groups[-1] == OTHER_GROUP
    named = groups[:-1] if has_other else groups
    return {g: i for i, g in enumerate(named)}, len(named) if has_other else -1


def attribute_codes(attribute: Attribute, columns: Mapping[str, np.ndarray]) -> np.ndarray:
    """Codes of one (possibly intersectional) attribute from the base attributes' codes, keyed by column."""
    return attribute.combine([columns[c] for c in attribute.columns])


def score_predictions(scores: np.ndarray, threshold: float) -> np.ndarray:
    """Predictions of a model that emits scores (``events.score_threshold``): 1 where the score reaches the
    threshold, for the daemon's decoder and the gate's score column alike.

    >>> score_predictions(np.array([0.2, 0.5, 0.9]), 0.5).tolist()
    [0, 1, 1]
    """
    return (scores >= threshold).astype(np.int64)


def proxy_columns(attributes: Sequence[Attribute]) -> list[tuple[str, str]]:
    """The (surname, ZCTA) columns of each proxy attribute, in config order: a decoder's codes of them follow the
    exact attributes' (exporter/core/bisg.py Tables.codes)."""
    return [(a.proxy.surname, a.proxy.zcta) for a in attributes if a.proxy]
