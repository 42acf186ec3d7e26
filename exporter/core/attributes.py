"""Protected attributes and their bounded sets of subgroups: what a row of a counts array stands for."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Final

import numpy as np

OTHER_GROUP: Final = "other"
INTERSECTION_SEP: Final = ":"


def titled(name: str, proxy: object) -> str:
    """An attribute's name as every report heads it: marked apart when its groups were inferred (``proxy:``)."""
    return f"{name} (proxy: true)" if proxy else name


@dataclass(frozen=True)
class Proxy:
    """``proxy:`` of an attribute never collected: each row's group is inferred, as posterior probabilities over the
    groups, from other columns (``bisg``: the surname and the ZCTA, exporter/core/bisg.py)."""

    method: str
    surname: str
    zcta: str


@dataclass(frozen=True)
class Attribute:
    """A protected attribute (or an intersection of several) and its bounded set of subgroups.

    ``groups`` are the label values; codes are row indices into a counts array. ``columns`` are the source
    columns (event attribute keys); an intersection has several and its groups are joined with ``:``.
    """

    name: str
    columns: tuple[str, ...]
    groups: tuple[str, ...]
    pairs: tuple[tuple[int, int], ...] | np.ndarray
    """The compared (a, b) group indices; an ``(n, 2)`` int array in ``backtest``'s stacked steps (tens of
    thousands of pairs: as tuples, their allocation alone set off full garbage collections)."""
    base_sizes: tuple[int, ...] = field(default=())
    proxy: Proxy | None = None
    """Inferred, not read: each row adds its posterior probability of each group to that group's (float) counts."""
    source: str | None = None
    """A base attribute read from a side source by id (``attribute_sources:``): its column is the record's key."""
    other: bool = False
    """``unknown_values: other``: the config adds the group ``other`` (last), the bounded group of every value outside
    the others, missing ones too. Otherwise ``other`` is a group like any, its value the text ``other`` (the seed's
    ``ethnicity`` lists one): values outside the groups are the attribute's unknown category."""
    catch_alls: frozenset[str] = frozenset()
    """The bounded groups, as the config made them: the ``other`` it added, of an intersection every subgroup of
    one. Never read from a name: a configured ``x:other`` (or ``other:x``) is a group like any."""

    def catch_all(self, group: str) -> bool:
        """Whether this group is a bounded ``other`` group (of an intersection: one of its parts is)."""
        return group in self.catch_alls

    def combine(self, codes: list[np.ndarray]) -> np.ndarray:
        """Combine per-column codes (``-1`` = excluded) into this attribute's codes."""
        if len(codes) == 1:
            return codes[0]
        out = np.zeros_like(codes[0])
        bad = np.zeros(codes[0].shape, dtype=bool)
        for code, size in zip(codes, self.base_sizes, strict=True):
            out = out * size + code
            bad |= code < 0
        return np.where(bad, -1, out)
