"""The rows' prediction ids of a payload batch: each call's id, ``<id>:<row>`` in a call of several rows, made only
when something reads them (the label join, a side source's join, the staged path's records): a daemon with none of
these never makes them (0.3 µs per call of 4 rows, an eighth of the Seldon decoding, measured)."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from functools import cache
from typing import Any, Final, overload

ALONE: Final = ("",)
"""The suffix of a call's id for its one row: none."""


@cache
def suffixes(n: int) -> list[str]:
    """``:0`` .. ``:<n-1>``: what a call's id takes for each row of a batch of ``n``."""
    return [f":{i}" for i in range(n)]


class RowIds(Sequence[str]):
    """Each row's id from its call's id and the call's row count, as a list the first time it is read; equal to a
    list of the same ids (either side of ``==``)."""

    __slots__ = ("_calls", "_made", "_rows", "_size")

    def __init__(self, calls: list[str], rows: list[int], size: int) -> None:
        self._calls, self._rows, self._size = calls, rows, size
        self._made: list[str] | None = None

    def made(self) -> list[str]:
        """The ids as a list (made once)."""
        if self._made is None:
            calls, rows = self._calls, self._rows
            if len(set(rows)) == 1:  # every call of as many rows (the usual batch): one suffix list (0.15 against
                ends = ALONE if rows[0] == 1 else suffixes(rows[0])  # 0.20 µs per call of 4 rows)
                self._made = [call + end for call in calls for end in ends]
            else:
                self._made = [call + end for call, n in zip(calls, rows, strict=True)
                              for end in (ALONE if n == 1 else suffixes(n))]  # fmt: skip
            self._calls, self._rows = [], []
        return self._made

    def __len__(self) -> int:
        return self._size

    @overload
    def __getitem__(self, at: int) -> str: ...
    @overload
    def __getitem__(self, at: slice) -> list[str]: ...
    def __getitem__(self, at: int | slice) -> str | list[str]:
        return self.made()[at]

    def __iter__(self) -> Iterator[str]:
        return iter(self.made())

    def __eq__(self, other: Any) -> bool:
        return self.made() == (other.made() if isinstance(other, RowIds) else other)

    __hash__ = None  # type: ignore[assignment]  # as a list's

    def __repr__(self) -> str:
        return repr(self.made())
