"""The pair join of a payload log: a call's request and response meet by their id (:class:`PairJoin`), each
arriving as a :class:`~exporter.stream.payloads.platforms.Half`, or, for a poll read together
(exporter/stream/payloads/seldon_batch.py), as one half of a :class:`HalfBlock`: the poll's halves as columns, joined
by :meth:`PairJoin.add_block` with no Python object per half in the usual case (every half new, or every one
completing a block's half that waits), and made Halves one by one (:meth:`HalfBlock.half`) wherever anything else
happens, so that every outcome is the one :meth:`PairJoin.add_all` gives the same halves in the same order.
"""

from __future__ import annotations

from collections import Counter, deque
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import islice, repeat, takewhile
from operator import itemgetter
from typing import Any

import numpy as np
import orjson

from exporter.stream.payloads.platforms import (
    Half,
    half_json,
    half_of,
)


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
        """The id the rows of each of these halves carry (:attr:`Half.id`); the block's own list (not to be changed)
        when these are every half of it in order."""
        pairs, calls = self.pairs, self.calls
        if calls is None:
            return pairs if _whole(at, len(pairs)) else list(map(pairs.__getitem__, at.tolist()))
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

    def cells(self, column: str, response_first: bool) -> Any:
        """The cells of ``column`` of every row of these calls, an Arrow array: the request's column, else the
        response's (the prediction: the response's first); None when neither half has it."""
        sides = ((self.request, self.request_at), (self.response, self.response_at))
        for block, at in reversed(sides) if response_first else sides:
            found = block.columns.get(column)
            if found is not None:  # the whole block in order (the usual poll: its calls' other halves in one block):
                return (found if _whole(at, len(found)) else found.take(at)).flatten()  # its column as it is
        return None

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


def _whole(at: np.ndarray, n: int) -> bool:
    """Whether ``at`` is every index of a block of ``n``, in order."""
    return len(at) == n and (not n or (at[0] == 0 and at[-1] == n - 1 and bool((np.diff(at) == 1).all())))


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
    done: dict[tuple[str, str], tuple[float, bool, str]] = field(default_factory=dict)
    """Calls joined or refused within the horizon (when, whether refused, the component whose halves met), so that
    a half delivered again is a duplicate, another component's half of the call is not counted again, and the
    partner of a refused half is dropped with it; the oldest first (a dict: a block's calls entered at half an
    OrderedDict's cost, 66 against 137 ns per call; its oldest forgotten in one pass, :meth:`_forget`)."""
    _waiting: dict[tuple[str, str], tuple[Any, float]] = field(default_factory=dict)
    held: list[tuple[HalfBlock, float, list[tuple[str, str]], set[str]]] = field(default_factory=list)
    """Blocks of new halves not yet put among :attr:`pending` (with when they came, their keys and pairs): a block
    whose halves are exactly a held block's partners, in the same order (the usual poll: a Seldon model's inputs and
    outputs topics), completes it with no entry made or removed per half (measured: 0.11 against 0.39 µs per
    record). Anything else puts them among those waiting first, in the order they came, as :meth:`add_block` of
    each would have."""

    @property
    def pending(self) -> dict[tuple[str, str], tuple[Any, float]]:
        """Each waiting half (a Half, or (block, i): half i of a :class:`HalfBlock`) and when it came."""
        if self.held:
            for block, now, keys, _ in self.held:
                self._waiting.update(zip(keys, zip(zip(repeat(block), range(len(keys))), repeat(now)), strict=False))
            self.held.clear()
        return self._waiting

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
            if len(done) > most:
                self._forget(len(done) - most)
            out.append((other, half) if half.response else (half, other))
        return out

    def add_block(self, block: HalfBlock, now: float, counts: Counter[str]) -> list[Joined]:
        """What :meth:`add_all` of the block's halves in order gives (the same pairs, counts and state), in columns
        when every half is new and there is room for it, or every half completes one that waits in a block of the
        other direction (the usual poll); else each half is made a Half and added."""
        n = len(block.pairs)
        if not n:
            return []
        if self.held:
            met = self._met(block, now)
            if met is not None:
                return met
        keys = list(zip(repeat(block.model), block.pairs))
        pairs = set(block.pairs)
        if len(pairs) != n or not self.done.keys().isdisjoint(keys):  # one model: its pairs distinct
            return list(self.add_all(map(block.half, range(n)), now, counts))
        waits = bool(self._waiting) and not self._waiting.keys().isdisjoint(keys)  # none waits in the usual poll
        if not waits and all(h[3].isdisjoint(pairs) for h in self.held if h[0].model == block.model):
            if len(self._waiting) + sum(len(h[2]) for h in self.held) + n > self.max_pending:
                return list(self.add_all(map(block.half, range(n)), now, counts))
            self.held.append((block, now, keys, pairs))  # every half new: each waits
            return []
        pending = self.pending
        waiting = list(map(pending.get, keys))
        hits = n - waiting.count(None)
        refs = list(map(itemgetter(0), waiting)) if hits == n else []  # type: ignore[arg-type]  # no None: hits
        partners = list(map(itemgetter(0), refs)) if refs and set(map(type, refs)) == {tuple} else []
        distinct = dict(zip(map(id, partners), partners, strict=True))
        if not partners or any(b.response == block.response or b.component != block.component
                               for b in distinct.values()):  # fmt: skip
            return list(self.add_all(map(block.half, range(n)), now, counts))
        deque(map(pending.pop, keys), 0)
        self.done.update(zip(keys, repeat((now, False, block.component))))
        self._forget(len(self.done) - self.max_pending)
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

    def _met(self, block: HalfBlock, now: float) -> list[Joined] | None:
        """What :meth:`add_block` gives when the block's halves are a held block's partners, every one in the same
        order: each call joined (held blocks' keys are apart from every other half waiting and from the calls done:
        anything else releases them); None when no held block is."""
        for k, (other, _, keys, _) in enumerate(self.held):
            if other.pairs == block.pairs and other.model == block.model and other.response != block.response and \
                    other.component == block.component:  # fmt: skip
                del self.held[k]
                self.done.update(zip(keys, repeat((now, False, block.component))))
                self._forget(len(self.done) - self.max_pending)
                at = np.arange(len(keys), dtype=np.int64)
                return [BlockPairs(other, at, block, at) if block.response else BlockPairs(block, at, other, at)]
        return None

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
        self.done.pop(key, None)  # the newest now
        self.done[key] = (now, refused, component)
        self._forget(len(self.done) - self.max_pending)

    def _forget(self, oldest: int) -> None:
        """Forget this many of the oldest calls done (none: <= 0), in one pass over the dict: its first entries
        deleted one at a time would each be looked for past the slots of those before (quadratic)."""
        if oldest > 0:
            deque(map(self.done.__delitem__, list(islice(self.done, oldest))), 0)

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
        self.held.clear()
        self._waiting = {(h.model or "", h.pair): (h, at) for h, at in halves}
        self.done = {(m, p): (at, refused, "".join(component)) for m, p, at, refused, *component in found["done"]}

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
        self._forget(sum(1 for _ in takewhile(lambda done: done[0] < cutoff, self.done.values())))
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
