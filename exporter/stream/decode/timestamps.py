"""Epoch seconds of events' timestamps: ISO 8601 strings (naive means UTC) or epoch seconds, both within the years
1 to 9999 (what an ISO string can name; a number beyond, infinities and NaN included, is invalid before any
arithmetic: the window's bucket of -1e300 s is no int64).

:func:`epoch` is the rule. :func:`epochs` applies it to a batch; for the usual batch (every timestamp an ISO
string of one layout, such as ``2026-12-01T12:59:48.821358Z``) it checks the layout column by column and lets
numpy's ISO 8601 parser (``datetime64[us]``) read them all in one C call, to the bit what :func:`epoch`
returns, and falls back to :func:`epoch` for any batch it does not certify (another layout, a number, a value
out of range): it never decides that a timestamp is invalid.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime
from functools import lru_cache
from operator import attrgetter
from typing import Any, Final

import numpy as np

EARLIEST: Final = datetime(1, 1, 1, tzinfo=UTC).timestamp()
END: Final = datetime(9999, 12, 31, tzinfo=UTC).timestamp() + 86_400
"""From EARLIEST up to END (253402300800, the first second of year 10000, exact in a float64) are the epoch seconds
an ISO 8601 string can name: a number outside them (NaN and infinities too) is invalid. END is excluded: the last
microsecond of year 9999 as a float64 rounds up to it, so a bound at that microsecond let year 10000 in."""


def epoch(t: object) -> float | None:
    """Epoch seconds of an event's timestamp: ISO 8601 (naive means UTC) or epoch seconds within
    :data:`EARLIEST` up to :data:`END` (excluded); else None."""
    if t.__class__ is str:
        try:
            d = datetime.fromisoformat(t)
        except ValueError:
            return None
        return (d if d.tzinfo is not None else d.replace(tzinfo=UTC)).timestamp()
    if t.__class__ is float or t.__class__ is int:
        return float(t) if EARLIEST <= t < END else None  # NaN compares false
    return None


_NUMBERS = frozenset({float, int})


def epochs(stamps: list[Any]) -> np.ndarray | list[float | None]:
    """:func:`epoch` of each: a float64 array when every one is valid and either of one ISO layout (numpy from the
    characters) or a number, else a list (None where invalid)."""
    if stamps and set(map(type, stamps)) <= _NUMBERS:  # epoch seconds (never a bool: its type is bool)
        seconds = np.array(stamps, dtype=np.float64)
        if ((seconds >= EARLIEST) & (seconds < END)).all():  # NaN compares false: the rule says invalid
            return seconds
    fast = iso_epochs(stamps)
    if fast is not None:
        return fast
    try:
        parsed = list(map(datetime.fromisoformat, stamps))  # TypeError: a number; ValueError: not ISO 8601
    except (TypeError, ValueError):
        return list(map(epoch, stamps))
    if None in map(_TZ, parsed):
        return list(map(epoch, stamps))
    return list(map(datetime.timestamp, parsed))


_TZ = attrgetter("tzinfo")
_LAYOUT = re.compile(r"[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}(\.[0-9]{1,9})?(Z|[+-][0-9]{2}:[0-9]{2})?")
"""What :func:`iso_epochs` certifies: a strict subset of what ``datetime.fromisoformat`` (Python 3.11) reads. It
truncates a fraction beyond the microsecond (Knative's CloudEvents carry nanoseconds): so does this."""
_EXACT = 2**53
"""Microseconds beyond this (about 285 years from 1970) are not exact in a float64: left to datetime."""


@lru_cache(maxsize=64)
def _layout(first: str) -> tuple[np.ndarray, np.ndarray, int, int] | None:
    """For a layout, from one string of it (with a "|" appended, as :func:`iso_epochs` reads each): the columns
    that hold digits, the expected byte of every column (-1 where a digit or an offset's sign goes), the width
    of the local date and time (without the zone) and the offset's sign column (-1: none, or Z); None if
    :data:`_LAYOUT` does not certify it. Naive means UTC: the same as Z."""
    m = _LAYOUT.fullmatch(first)
    if m is None:
        return None
    expect = np.frombuffer(first.encode() + b"|", dtype=np.uint8).astype(np.int16)
    digits = np.array([i for i, c in enumerate(first) if c.isdigit()], dtype=np.intp)
    expect[digits] = -1
    zone = m.group(2)
    sign_at = len(first) - 6 if zone and zone != "Z" else -1
    if sign_at >= 0:
        expect[sign_at] = -1
    return digits, expect, min(m.end(1), 26) if m.group(1) else 19, sign_at  # to the microsecond, as fromisoformat


def _number(d: np.ndarray, start: int, width: int) -> np.ndarray:
    out = d[:, start].astype(np.int64)
    for k in range(start + 1, start + width):
        out = out * 10 + d[:, k]
    return out


def iso_epochs(stamps: list[Any]) -> np.ndarray | None:
    """The epoch seconds of every stamp when each is a valid ISO string of the first one's layout, else None."""
    if not stamps or stamps[0].__class__ is not str:
        return None
    layout = _layout(stamps[0])
    if layout is None:
        return None
    digits, expect, local_width, sign_at = layout
    width = len(expect)
    try:
        joined = "|".join(stamps).encode("ascii") + b"|"
    except (TypeError, UnicodeEncodeError):  # a number, a non-ASCII string: not this layout
        return None
    n = len(stamps)
    if len(joined) != n * width:
        return None
    rows = np.frombuffer(joined, dtype=np.uint8).reshape(n, width)
    # Every column is checked: a digit where the layout has one, else its literal, and "|" last. No "|" can then
    # hide inside a stamp, so the n - 1 separators are exactly the ones joined in and every stamp has the layout.
    d = rows - np.uint8(48)  # digits become 0..9; anything else wraps above 9
    if (d[:, digits] > 9).any():
        return None
    literal = expect >= 0
    if not (rows[:, literal] == expect[literal].astype(np.uint8)).all():
        return None
    # numpy's ISO 8601 parser reads the local date and time (to the microsecond) and refuses what fromisoformat
    # refuses in this layout: a month, day (leap years included), hour, minute or second out of range
    local = np.ascontiguousarray(rows[:, :local_width]).view(f"S{local_width}").ravel()
    try:
        micros = local.astype("datetime64[us]").astype(np.int64)
    except ValueError:
        return None
    if sign_at >= 0:
        off_hour, off_minute = _number(d, sign_at + 1, 2), _number(d, sign_at + 4, 2)
        if ((off_hour > 23) | (off_minute > 59)).any():
            return None
        minus = rows[:, sign_at] == ord("-")
        if not (minus | (rows[:, sign_at] == ord("+"))).all():
            return None
        sign = np.where(minus, -1, 1)
        micros -= sign * (off_hour * 60 + off_minute) * 60_000_000
    if (np.abs(micros) >= _EXACT).any():
        return None
    # datetime.timestamp() is (self - epoch).total_seconds(): the exact microseconds divided by 10^6, correctly
    # rounded; both are exact in a float64 here, so one IEEE division rounds the same
    return micros.astype(np.float64) / 1e6
