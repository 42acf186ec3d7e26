"""Decode a batch of newline-free JSON values as lines, in one msgspec call per run of lines the schema accepts.

msgspec decodes a whole batch in one call (``decode_lines``) but stops at the first line it refuses, and says
which: ``... - at `$[i]...``` for a value of the wrong type or range, ``(byte n)`` for malformed JSON. So an event
the schema refuses costs one call more, not the whole batch's fall to one call per event: a bad producer's events
no longer slow the good ones beside them. msgspec does not check the UTF-8 of the fields it skips; a line that is
not UTF-8 is refused here too (the decoders' rules reject it as malformed JSON).

Whatever else a value makes msgspec raise (``RecursionError`` for one nested past its depth, say) is never the
batch's: the lines are then decoded value by value, and such a value is refused alone (the rules judge it).
"""

from __future__ import annotations

import bisect
import re
from collections.abc import Sequence
from typing import Any, Final

import msgspec
import numpy as np

STRICT_PAUSE: Final = 64
"""After a batch the strict schema refused in more than :data:`STRICT_MISSES` of its events, the batches parsed
by the general schema before it is tried again."""
STRICT_MISSES: Final = 0.01
"""The share of a batch the strict schema may refuse (parsed then by the general schema, one by one)."""
RUN: Final = 32
"""Lines decoded in one call right after a refusal (then twice as many after each run accepted whole): msgspec
stops at a refused line and returns nothing, so the lines before it are decoded again; short runs bound that."""
MAX_REFUSED: Final = 8
MAX_REFUSED_SHARE: Final = 1 / 64
"""Refusals a batch's lines may have before it is decoded value by value instead: each one costs a msgspec call
that parses the lines up to it, and those lines again, so past a few percent one call per value is cheaper."""
ONE_BY_ONE_PAUSE: Final = 16
"""After a batch refused in more than that many places, the batches decoded value by value at once (each checked:
one refused in few places ends the pause)."""
_AT_LINE: Final = re.compile(r" - at `\$\[(\d+)\]")
_AT_BYTE: Final = re.compile(r"\(byte (\d+)\)")


def joined_lines(values: Sequence[bytes | None]) -> bytes | None:
    """The values as lines of one buffer, or None when they cannot be (a tombstone, an empty value): such a batch
    is decoded value by value. :func:`decode_lines` finds a value that holds a newline."""
    if not all(values):
        return None
    return b"\n".join(values)  # type: ignore[arg-type]


def decode_lines(decoder: msgspec.json.Decoder[Any], joined: bytes, n: int,
                 budget: float | None = None) -> list[Any] | None:  # fmt: skip
    """One struct per line of ``joined`` (``n`` lines), None for each line the schema refuses; None as a whole
    when msgspec's answer cannot be placed on a line, or the values held newlines (the caller then decodes value by
    value). The usual batch, every line accepted, takes one call and no look at its line bounds. ``budget``: the
    refusals after which to give up (None as a whole); without one, past :data:`MAX_REFUSED` and
    :data:`MAX_REFUSED_SHARE` the rest is decoded value by value."""
    if np.count_nonzero(np.frombuffer(joined, dtype=np.uint8) == 10) != n - 1:
        return None  # a newline inside a value: lines and values would not match
    lines: tuple[list[int], list[int]] | None = None
    refused: set[int] = set()
    if not joined.isascii():
        lines = _bounds(joined)
        refused = _not_utf8(joined, lines[0])
    out: list[Any] = []
    line = 0
    view = memoryview(joined)  # pieces without copies
    run = RUN
    while line < n:
        if budget is not None and len(refused) > budget:
            return None
        if len(refused) > MAX_REFUSED + n * MAX_REFUSED_SHARE and lines is not None:
            # many refusals: the rest value by value, which costs less than a call per run of accepted lines
            return out + [decode_one(decoder, joined[lines[0][k] : lines[1][k]]) for k in range(line, n)]
        known = sorted(refused)
        k = bisect.bisect_left(known, line)
        stop = known[k] if k < len(known) else n  # the next line known to be refused
        if lines is not None:  # after a refusal, runs of RUN lines, doubling while accepted: a refusal costs at most
            stop = min(stop, line + run)  # a run's lines again, and sporadic ones a few calls each
        if stop > line:
            piece = view if lines is None else view[lines[0][line] : lines[1][stop - 1]]
            try:
                structs = decoder.decode_lines(piece)
            except (msgspec.ValidationError, msgspec.DecodeError) as exc:
                lines = lines or _bounds(joined)
                bad = _refused_line(exc, piece, line)
            except Exception:  # e.g. RecursionError: not placed on a line, so value by value
                return None
            else:
                if len(structs) != stop - line:
                    return None
                out += structs
                line = stop
                run *= 2
                continue
            if not line <= bad < stop:
                return None
            if bad > line:  # the lines before it are accepted: decode them on their own
                try:
                    before = decoder.decode_lines(view[lines[0][line] : lines[1][bad - 1]])
                except Exception:
                    return None  # a line that ran on into the next ones (an unclosed object): value by value
                if len(before) != bad - line:
                    return None
                out += before
            refused.add(bad)
            line = bad
            run = RUN
        out.append(None)
        line += 1
    return out


def _bounds(joined: bytes) -> tuple[list[int], list[int]]:
    """Where each line starts and ends."""
    bounds = np.concatenate(([-1], np.flatnonzero(np.frombuffer(joined, dtype=np.uint8) == 10), [len(joined)]))
    return (bounds[:-1] + 1).tolist(), bounds[1:].tolist()


def _refused_line(exc: msgspec.ValidationError | msgspec.DecodeError, piece: memoryview, first: int) -> int:
    """The line msgspec stopped at, from its message (-1 when the message does not say)."""
    if isinstance(exc, msgspec.ValidationError):
        found = _AT_LINE.search(str(exc))
        return first + int(found.group(1)) if found else -1
    found = _AT_BYTE.search(str(exc))
    return first + bytes(piece[: int(found.group(1))]).count(b"\n") if found else -1


def _not_utf8(joined: bytes, starts: list[int]) -> set[int]:
    """The lines of ``joined`` that are not valid UTF-8."""
    bad: set[int] = set()
    at = 0
    while True:
        try:
            joined[at:].decode()
            return bad
        except UnicodeDecodeError as exc:
            line = int(np.searchsorted(starts, at + exc.start, side="right")) - 1
            bad.add(line)
            at = starts[line + 1] if line + 1 < len(starts) else len(joined)


def decode_one(decoder: msgspec.json.Decoder[Any], raw: bytes | None) -> Any:
    """One value's struct, or None when the schema refuses it (not valid UTF-8 included, or a tombstone)."""
    try:
        if not raw.isascii():  # type: ignore[union-attr]
            raw.decode()  # type: ignore[union-attr]
        return decoder.decode(raw)  # type: ignore[arg-type]
    except Exception:  # a tombstone (AttributeError, TypeError), a value nested too deep
        return None  # (RecursionError), or anything else one value may cause: refused, the rules say why


class Parser:
    """A schema's pass over batches: per value, its struct or None where the general schema refuses it. The
    strict schema goes first (its strings come back as its own objects: no new string, hashed once) while it
    accepts nearly every event; a topic where it does not (other models, other values) pauses it a while."""

    def __init__(self, general: msgspec.json.Decoder[Any], strict: msgspec.json.Decoder[Any] | None) -> None:
        self.general = general
        self.strict = strict
        self._strict_rest = 0
        """Batches to skip the strict schema for, after one it refused in too many places."""
        self.refused = False
        """Whether the last batch had a value the general schema refused."""
        self._one_by_one = 0
        """Batches to decode value by value, after one refused in too many places."""

    def slots(self, values: Sequence[bytes | None]) -> list[Any]:
        """Each value's struct, None where it is refused (the decoders' rules then say why); :attr:`refused` says
        afterwards whether any was."""
        slots = self._slots(values)
        self.refused = None in slots  # identity first: a struct is never compared with None here
        return slots

    def _slots(self, values: Sequence[bytes | None]) -> list[Any]:
        n = len(values)
        if self._one_by_one:  # the last batches were refused in many places: value by value at once
            self._one_by_one -= 1
            slots = [decode_one(self.general, raw) for raw in values]
            if sum(s is None for s in slots) <= MAX_REFUSED + n * MAX_REFUSED_SHARE:
                self._one_by_one = 0  # the bad producer went quiet: lines again
            return slots
        joined = joined_lines(values)
        if joined is not None and self.strict is not None and not self._strict_rest:
            strict = decode_lines(self.strict, joined, n, budget=n * STRICT_MISSES)
            if strict is not None and None not in strict:
                return strict
            refused = [i for i, event in enumerate(strict or ()) if event is None]
            if strict is not None:
                for i in refused:  # another model's, another group name, or a defect: the general schema says
                    strict[i] = decode_one(self.general, values[i])
                return strict
            self._strict_rest = STRICT_PAUSE
        elif self._strict_rest:
            self._strict_rest -= 1
        lines = decode_lines(self.general, joined, n) if joined is not None else None
        if lines is None:
            return [decode_one(self.general, raw) for raw in values]
        if sum(s is None for s in lines) > MAX_REFUSED + n * MAX_REFUSED_SHARE:
            self._one_by_one = ONE_BY_ONE_PAUSE
        return lines
