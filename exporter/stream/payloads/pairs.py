"""The pair join of a payload log: a call's request and response meet by their id (:class:`PairJoin`), each
arriving as a :class:`~exporter.stream.payloads.platforms.Half`, or, for a poll read together
(exporter/stream/payloads/seldon_batch.py), as one half of a :class:`HalfBlock`: the poll's halves as columns, joined
by :meth:`PairJoin.add_block` with no Python object per half in the usual case (every half new, or every one
completing a block's half that waits), and made Halves one by one (:meth:`HalfBlock.half`) wherever anything else
happens, so that every outcome is the one :meth:`PairJoin.add_all` gives the same halves in the same order.
"""

from __future__ import annotations

from collections import Counter, OrderedDict, deque
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import chain, repeat
from operator import itemgetter
from typing import Any, Final

import numpy as np
import orjson

from exporter.stream.payloads import seldon_batch
from exporter.stream.payloads.platforms import (
    SELDON_RESERVED,
    SELDON_TYPES,
    Half,
    half_json,
    half_of,
    header_table,
    seldon_model,
    texts,
)
from exporter.stream.payloads.platforms import _text as _header_text


@dataclass(eq=False)
class HalfBlock:
    """The halves of one poll of one topic (one model, one direction, one component), as columns: what
    :func:`~exporter.stream.payloads.seldon_batch.halves` (or :func:`~exporter.stream.payloads.kserve_batch.halves`)
    reads as a Half for each record, half ``i`` of which :meth:`half` makes. No half has metadata (headers beyond
    the platform's own)."""

    model: str
    response: bool
    pairs: list[str]
    calls: list[str | None] | None
    """The call's own id where ``pairs`` names its pipeline too, else None (:attr:`Half.call`); None: no half
    names a pipeline."""
    times: np.ndarray
    """Each half's time in epoch seconds (NaN: none)."""
    rows: np.ndarray
    columns: dict[str, Any]
    """Each tensor's values as an Arrow list array, one list per half (the rows' cells of that column)."""
    raws: list[bytes]
    component: str = ""

    def __len__(self) -> int:
        return len(self.pairs)

    def half(self, i: int) -> Half:
        """Half ``i``, as the record-by-record reader makes it."""
        time = float(self.times[i])
        return Half(self.pairs[i], self.response, self.model, None if time != time else time, int(self.rows[i]),
                    {name: values[i].as_py() for name, values in self.columns.items()}, self.raws[i], {},
                    self.calls[i] if self.calls is not None else None, self.component)  # fmt: skip

    def ids(self, at: np.ndarray) -> list[str]:
        """The id the rows of each of these halves carry (:attr:`Half.id`)."""
        pairs, calls = self.pairs, self.calls
        if calls is None:
            return list(map(pairs.__getitem__, at.tolist()))
        return [calls[i] or pairs[i] for i in at.tolist()]


@dataclass(eq=False)
class BlockPairs:
    """Calls joined between two blocks: request ``request_at[k]`` of ``request`` with response ``response_at[k]``
    of ``response``, in the order they were completed."""

    request: HalfBlock
    request_at: np.ndarray
    response: HalfBlock
    response_at: np.ndarray

    def __len__(self) -> int:
        return len(self.request_at)

    def halves(self) -> list[tuple[Half, Half]]:
        """The same calls as (request, response) Halves."""
        request, response = self.request.half, self.response.half
        return [(request(i), response(j)) for i, j in zip(self.request_at.tolist(), self.response_at.tolist(),
                                                          strict=True)]  # fmt: skip


@dataclass(eq=False)
class PollBlocks:
    """A poll of one topic that logs both directions (KServe): its requests and its responses as two blocks, with
    distinct calls in each, and every response that a request of the poll answers after it."""

    requests: HalfBlock
    responses: HalfBlock
    kinds: list[bool]
    """Whether each record, in order, is a response."""

    def halves(self) -> list[Half]:
        """The poll's halves in record order."""
        halves = [map(block.half, range(len(block))) for block in (self.requests, self.responses)]
        return [next(halves[response]) for response in self.kinds]


Joined = tuple[Half, Half] | BlockPairs
"""A call joined as two Halves, or a run of calls joined between two blocks."""


def calls(joined: Iterable[Joined]) -> int:
    """How many calls these are."""
    return sum(len(j) if j.__class__ is BlockPairs else 1 for j in joined)


def as_halves(joined: Iterable[Joined]) -> list[tuple[Half, Half]]:
    """Every call as (request, response) Halves, in order."""
    out: list[tuple[Half, Half]] = []
    for j in joined:
        if j.__class__ is BlockPairs:
            out += j.halves()
        else:
            out.append(j)  # type: ignore[arg-type]
    return out


def _asked(waiting: Any, component: str) -> bool:
    """Whether a waiting half (None: none) is a request of this component."""
    half = None if waiting is None else waiting[0][0] if waiting[0].__class__ is tuple else waiting[0]  # its block's
    return half is not None and not half.response and half.component == component


def _half(waiting: Any) -> Half:
    """A waiting half: a Half, or (block, i) of a block's half."""
    return waiting[0].half(waiting[1]) if waiting.__class__ is tuple else waiting


@dataclass
class PairJoin:
    """Halves waiting for their partner, by (model, id); bounded in count, and in age by ``horizon`` seconds."""

    horizon: float
    max_pending: int = 1_000_000
    pending: dict[tuple[str, str], tuple[Any, float]] = field(default_factory=dict)
    """Each waiting half (a Half, or (block, i): half i of a :class:`HalfBlock`) and when it came."""
    done: OrderedDict[tuple[str, str], tuple[float, bool, str]] = field(default_factory=OrderedDict)
    """Calls joined or refused within the horizon (when, whether refused, the component whose halves met), so that
    a half delivered again is a duplicate, another component's half of the call is not counted again, and the
    partner of a refused half is dropped with it."""

    def add(self, half: Half, now: float, counts: Counter[str]) -> tuple[Half, Half] | None:
        """The (request, response) this half completes, else None (it waits, or is counted as a duplicate)."""
        found = self.add_all((half,), now, counts)
        return found[0] if found else None

    def add_all(self, halves: Iterable[Half], now: float, counts: Counter[str]) -> list[tuple[Half, Half]]:
        """The (request, response) pairs these halves complete, in order, as :meth:`add` of each in turn finds
        them (one loop: 0.6-0.7 µs per half against 0.95 for a call per half)."""
        pending, done, most = self.pending, self.done, self.max_pending
        out = []
        for half in halves:
            key = (half.model or "", half.pair)
            finished = done.get(key)
            if finished is not None:
                counts["partner_refused" if finished[1] else "duplicate_delivery" if finished[2] == half.component
                       else "other_component"] += 1  # fmt: skip
                continue
            waiting = pending.get(key)
            if waiting is None:
                if len(pending) >= most:
                    counts["pending_state_full"] += 1
                else:
                    pending[key] = (half, now)
                continue
            other = waiting[0]
            if other.__class__ is tuple:  # a half of a block (add_block), made a Half only now
                other = other[0].half(other[1])
            if other.component != half.component:
                counts["other_component"] += 1  # the call meets within the component whose half came first
                continue
            if other.response == half.response:
                counts["duplicate_delivery"] += 1  # the same half again: the first one stands
                continue
            del pending[key]
            done[key] = (now, False, half.component)  # at the end: done.get found no such call above
            while len(done) > most:
                done.popitem(last=False)
            out.append((other, half) if half.response else (half, other))
        return out

    def add_block(self, block: HalfBlock, now: float, counts: Counter[str]) -> list[Joined]:
        """What :meth:`add_all` of the block's halves in order gives (the same pairs, counts and state), in columns
        when every half is new and there is room for it, or every half completes one that waits in a block of the
        other direction (the usual poll); else each half is made a Half and added."""
        keys = list(zip(repeat(block.model), block.pairs))
        n, pending = len(keys), self.pending
        if not n:
            return []
        if len(set(block.pairs)) != n or not self.done.keys().isdisjoint(keys):  # one model: its pairs distinct
            return list(self.add_all(map(block.half, range(n)), now, counts))
        waiting = list(map(pending.get, keys))
        hits = n - waiting.count(None)
        if not hits:
            if len(pending) + n > self.max_pending:
                return list(self.add_all(map(block.half, range(n)), now, counts))
            pending.update(zip(keys, zip(zip(repeat(block, n), range(n), strict=True), repeat(now, n), strict=True),
                               strict=True))  # fmt: skip
            return []
        refs = list(map(itemgetter(0), waiting)) if hits == n else []  # type: ignore[arg-type]  # no None: hits
        partners = list(map(itemgetter(0), refs)) if refs and set(map(type, refs)) == {tuple} else []
        distinct = dict(zip(map(id, partners), partners, strict=True))
        if not partners or any(b.response == block.response or b.component != block.component
                               for b in distinct.values()):  # fmt: skip
            return list(self.add_all(map(block.half, range(n)), now, counts))
        deque(map(pending.pop, keys), 0)
        self.done.update(zip(keys, repeat((now, False, block.component))))
        while len(self.done) > self.max_pending:
            self.done.popitem(last=False)
        at = np.fromiter(map(itemgetter(1), refs), np.int64, n)
        mine = np.arange(n, dtype=np.int64)
        out: list[Joined] = []
        start = 0
        if len(distinct) == 1:
            ends = [n]
        else:  # runs of one partner block
            which = np.fromiter(map(id, partners), np.int64, n)  # CPython: an object's id is its address
            ends = [*(np.flatnonzero(which[1:] != which[:-1]) + 1).tolist(), n]
        for end in ends:
            other = partners[start]
            if block.response:
                out.append(BlockPairs(other, at[start:end], block, mine[start:end]))
            else:
                out.append(BlockPairs(block, mine[start:end], other, at[start:end]))
            start = end
        return out

    def add_poll(self, poll: PollBlocks, now: float, counts: Counter[str]) -> list[Joined]:
        """What :meth:`add_all` of the poll's halves in record order gives (the same pairs, counts and state, in the
        same order): its requests added as a block, then its responses, when every request is new, there is room
        for them all, and every response completes a request of the poll (before it, as read) or one that waits
        from its component; else each half made a Half and added in record order."""
        requests, responses, pending = poll.requests, poll.responses, self.pending
        asked = list(zip(repeat(requests.model), requests.pairs))  # distinct, as read
        earlier = set(zip(repeat(responses.model), responses.pairs)).difference(asked)  # answers to earlier polls
        component = responses.component
        if len(pending) + len(asked) > self.max_pending or not pending.keys().isdisjoint(asked) or not \
                self.done.keys().isdisjoint(asked) or not all(_asked(pending.get(k), component) for k in earlier):
            return list(self.add_all(poll.halves(), now, counts))
        pending.update(zip(asked, zip(zip(repeat(requests), range(len(asked))), repeat(now)), strict=False))  # all new
        return self.add_block(responses, now, counts)

    def refuse(self, model: str, pair: str, now: float, counts: Counter[str]) -> None:
        """A half of this call was refused: its partner, waiting or still to come, is dropped with it."""
        key = (model, pair)
        if self.pending.pop(key, None) is not None:
            counts["partner_refused"] += 1
        self._done(key, now, True, "")

    def _done(self, key: tuple[str, str], now: float, refused: bool, component: str) -> None:
        self.done[key] = (now, refused, component)
        self.done.move_to_end(key)
        while len(self.done) > self.max_pending:
            self.done.popitem(last=False)

    def state(self) -> dict[str, np.ndarray]:
        """The waiting halves and the calls done, for a checkpoint or a snapshot (one JSON document as bytes: what
        waits is rows of plain values), so that a restart past their offsets still pairs them."""
        pending = [[half_json(_half(h)), at] for h, at in self.pending.values()]
        done = [[m, p, *value] for (m, p), value in self.done.items()]
        return {"state": np.frombuffer(orjson.dumps({"pending": pending, "done": done}), dtype=np.uint8)}

    def restore(self, state: Mapping[str, np.ndarray]) -> None:
        """Load what :meth:`state` wrote (nothing: a checkpoint written before payload formats)."""
        if "state" not in state:
            return
        found = orjson.loads(state["state"].tobytes())
        halves = [(half_of(h), at) for h, at in found["pending"]]
        self.pending = {(h.model or "", h.pair): (h, at) for h, at in halves}
        self.done = OrderedDict(((m, p), (at, refused, "".join(component))) for m, p, at, refused, *component
                                in found["done"])  # fmt: skip

    def expire(self, now: float, counts: Counter[str]) -> list[Half]:
        """Drop the halves that waited a horizon and forget the calls done a horizon ago (their id used again is a
        new call: every path calls this on its schedule, a half waiting or not); the responses among the halves
        dropped (a response with no request ever is a bad payload: rejected and dead-lettered by the caller)."""
        cutoff = now - self.horizon
        old = [key for key, (_, at) in self.pending.items() if at < cutoff]
        responses = []
        for key in old:
            half = _half(self.pending.pop(key)[0])
            if half.response:
                responses.append(half)
            else:
                counts["request_without_response"] += 1
        while self.done and next(iter(self.done.values()))[0] < cutoff:
            self.done.popitem(last=False)
        waiting = [(key, value) for key, value in self.pending.items() if value[0].__class__ is tuple]
        for key, (ref, at) in waiting:  # a block is held by its halves that wait: made Halves here, each block is
            self.pending[key] = (ref[0].half(ref[1]), at)  # let go within one expiry period of its poll
        return responses


def join_units(join: PairJoin, units: Sequence[HalfBlock | PollBlocks | Sequence[Half]], now: float,
               counts: Counter[str]) -> dict[str, list[Joined]]:  # fmt: skip
    """The calls a poll's halves complete, by model: each unit (a block, a poll's two blocks, or halves read one by
    one) added in turn."""
    out: dict[str, list[Joined]] = {}
    for unit in units:
        if unit.__class__ is HalfBlock:
            found, model = join.add_block(unit, now, counts), unit.model
        elif unit.__class__ is PollBlocks:
            found, model = join.add_poll(unit, now, counts), unit.requests.model
        else:
            for pair in join.add_all(unit, now, counts):  # type: ignore[arg-type]
                out.setdefault(pair[0].model or "", []).append(pair)
            continue
        if found:
            out.setdefault(model, []).extend(found)
    return out


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
    position (:func:`~exporter.stream.payloads.platforms.header_table`), a body that may be JSON by its first
    byte past blanks in one array pass, the times in an array."""
    model, by_name = seldon_model(topic)
    response = by_name if by_name is not None else response
    n = len(records)
    if response is None or model is None or model not in models or n < seldon_batch.FEWEST or \
            not seldon_batch.arrow():  # fmt: skip
        return None
    values: list[bytes] = list(map(_VALUE, records))
    if not all(values) or sum(map(len, values)) > seldon_batch.MOST_BYTES:
        return None  # an empty value, or more than one message may hold
    headers, names = header_table(list(map(_HEADERS_OF, records)), _HEADERS)
    kinds = set(map(_header_text, set(headers["seldon-infer-type"])))
    if not (response or names <= SELDON_RESERVED) or any(SELDON_TYPES.get(kind or "") for kind in kinds):
        return None  # a request's own headers (its rows' metadata), or JSON
    lengths = np.fromiter(map(len, values), np.int64, n)
    heads = list(map(seldon_batch.frame, lengths.tolist()))
    framed = b"".join(chain.from_iterable(zip(heads, values, strict=True)))
    ends = np.cumsum(np.fromiter(map(len, heads), np.int64, n) + lengths)
    if not np.frombuffer(framed, dtype=np.uint8)[ends - lengths].all():
        return None  # a schema-registry framing (its magic byte 0 first), read record by record
    if not kinds <= SELDON_TYPES.keys() and _json_like(framed, ends - lengths, ends):
        return None  # no header says: a body whose first byte past blanks is { may be JSON
    read = seldon_batch.columns(values, response, True, framed)
    if read is None:
        return None
    own, rows, columns = read
    said = headers["x-request-id"]
    pids = texts(said) if None not in said else []
    if not all(pids) or len(pids) != n:  # seldon_call's rule: the header, else the key, else the message's own id
        pids = [p or _header_text(k) or o for p, k, o in zip(texts(said), map(_KEY, records), own, strict=True)]
        if not all(pids):
            return None  # refused (no id) record by record
    pipelines = headers["pipeline"]
    if pipelines.count(None) == n:
        pairs, calls = pids, None
    else:
        named = texts(pipelines)
        pairs = [f"{pipeline}.{pid}" if pipeline else pid for pipeline, pid in zip(named, pids, strict=True)]
        calls = [pid if pipeline else None for pipeline, pid in zip(named, pids, strict=True)]
    ms = np.fromiter(map(_MS, records), np.float64, n)
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
