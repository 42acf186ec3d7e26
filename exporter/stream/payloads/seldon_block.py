"""A poll of one Seldon topic read as one :class:`~exporter.stream.payloads.pairs.HalfBlock` (:func:`read_block`):
the halves :func:`~exporter.stream.payloads.seldon_batch.halves` reads, as columns, with no Python step per record
beyond a few maps."""

from __future__ import annotations

from collections.abc import Collection, Sequence
from operator import itemgetter
from typing import Any, Final

import numpy as np

from exporter.stream.payloads import polls, seldon_batch
from exporter.stream.payloads.pairs import HalfBlock
from exporter.stream.payloads.platforms import SELDON_RESERVED, SELDON_TYPES, seldon_model, texts
from exporter.stream.payloads.platforms import _text as _header_text
from exporter.stream.payloads.polls import header_table

_HEADERS: Final = ("x-request-id", "seldon-infer-type", "pipeline")
_BLANK: Final = np.zeros(256, dtype=bool)
_BLANK[list(b" \t\n\r\x0b\x0c")] = True  # what bytes.lstrip() strips
_VALUE, _HEADERS_OF, _KEY, _MS = itemgetter(0), itemgetter(1), itemgetter(2), itemgetter(3)
_EXACT: Final = float(2**53)
"""Integers below this are floats exactly."""


def read_block(topic: str, records: Sequence[tuple[bytes | None, Any, bytes | None, int]], models: Collection[str],
               response: bool | None) -> HalfBlock | None:  # fmt: skip
    """The poll's records of one Seldon topic as one block of the halves
    :func:`~exporter.stream.payloads.seldon_batch.halves` reads, when also no record logs headers of its own
    (metadata) and every record's tensors are the same columns in the same order (one column each, typed
    contents); else None. The same checks, with no Python step per record beyond a few maps: the headers by
    position (:func:`~exporter.stream.payloads.polls.header_table`), a body that may be JSON by its first
    byte past blanks in one array pass, the times in an array."""
    model, by_name = seldon_model(topic)
    response = by_name if by_name is not None else response
    n = len(records)
    if response is None or model is None or model not in models or n < seldon_batch.FEWEST or \
            not seldon_batch.arrow():  # fmt: skip
        return None
    values: list[bytes] = list(map(_VALUE, records))
    try:
        lengths = np.fromiter(map(len, values), np.int64, n)
    except TypeError:
        return None  # a value of None (a tombstone): refused record by record
    if not lengths.all() or int(lengths.sum()) > seldon_batch.MOST_BYTES:
        return None  # an empty value, or more than one message may hold
    headers, names = header_table(list(map(_HEADERS_OF, records)), _HEADERS)
    kinds = set(map(_header_text, set(headers["seldon-infer-type"]))) if "seldon-infer-type" in names else {None}
    if not (response or names <= SELDON_RESERVED) or any(SELDON_TYPES.get(kind or "") for kind in kinds):
        return None  # a request's own headers (its rows' metadata), or JSON
    framed = polls.frame_records(values, lengths.tolist(), int(lengths.max()))
    ends = np.cumsum(lengths + sum((lengths >= 1 << bits for bits in (7, 14, 21, 28)), 2))  # a key and a varint
    if not np.frombuffer(framed, dtype=np.uint8)[ends - lengths].all():
        return None  # a schema-registry framing (its magic byte 0 first), read record by record
    if not kinds <= SELDON_TYPES.keys() and _json_like(framed, ends - lengths, ends):
        return None  # no header says: a body whose first byte past blanks is { may be JSON
    read = seldon_batch.columns(values, response, True, framed)
    if read is None:
        return None
    own, rows, columns = read
    said = headers["x-request-id"]
    pids = texts(said)  # an absent one (None) or an empty one fails all()
    if not all(pids):  # seldon_call's rule: the header, else the key, else the message's own id
        pids = [p or _header_text(k) or o or None for p, k, o in zip(texts(said), map(_KEY, records),
                                                                     own.to_pylist(), strict=True)]  # fmt: skip
        if not all(pids):
            return None  # refused (no id) record by record
    pipelines = headers["pipeline"]
    if "pipeline" not in names or pipelines.count(None) == n:
        pairs, calls = pids, None
    else:
        named = texts(pipelines)
        pairs = [f"{pipeline}.{pid}" if pipeline else pid for pipeline, pid in zip(named, pids, strict=True)]
        calls = [pid if pipeline else None for pipeline, pid in zip(named, pids, strict=True)]
    try:  # Kafka's timestamps, integers (Raw): read as such (20 against 35 ns per record as floats), made floats
        ms = np.fromiter(map(_MS, records), np.int64, n).astype(np.float64)
    except (OverflowError, TypeError, ValueError):  # beyond an int64: record by record below
        ms = np.full(n, _EXACT)
    if (ms < _EXACT).all():  # ms itself then, and its quotient rounded once, as Python's int / int rounds it
        times = np.where(ms > 0, ms / 1000, np.nan)
    else:
        times = np.array([r[3] / 1000 if r[3] > 0 else np.nan for r in records], dtype=np.float64)
    return HalfBlock(model, response, pairs, calls, times, np.asarray(rows, dtype=np.int64), columns,  # type: ignore[arg-type]
                     values)  # all(pids): each a text


def _json_like(framed: bytes, starts: np.ndarray, ends: np.ndarray) -> bool:
    """Whether a record's first byte past blanks (``bytes.lstrip``) is ``{``: each record's next byte read in one
    array step while a record's bytes so far are blank."""
    data = np.frombuffer(framed, dtype=np.uint8)
    at, live = starts.copy(), np.arange(len(starts))
    while live.size:
        first = data[at[live]]
        if (first == 0x7B).any():
            return True
        live = live[_BLANK[first]]
        at[live] += 1
        live = live[at[live] < ends[live]]
    return False
