"""A serving platform's payload log (``events.format: kserve | seldon``) as the rows the windows count.

Each record is one half of a call (exporter/stream/decode/platforms.py): its request or its response. The two
meet by their id in :class:`PairJoin` (bounded in count and age like the label join, counted: pairs joined,
duplicates delivered twice, halves that found no partner within the horizon). A joined pair becomes one row per
instance, its columns the request's inputs, the response's outputs and the logged headers; from there the rules of
our own events apply: each protected attribute reads its ``column``, ``events.prediction`` names the output column
(a score with ``events.score_threshold``), and a row's ``prediction_id`` is the call's id (``<id>:<row>`` in a
batch of several rows) so that delayed labels join it as they join our events. A payload that breaks a rule is
refused whole, under one reason, and dead-lettered: never half a batch counted. On the staged path the halves
travel to the join partition of their call id first (exporter/stream/stages/entry.py), as JSON (:func:`half_json`),
and meet in that join task's :class:`PairJoin`.
"""

from __future__ import annotations

import base64
from collections import Counter, OrderedDict
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cache
from itertools import chain, repeat
from typing import Any, Final

import numpy as np
import orjson

from exporter.config import ModelSpec
from exporter.core import bisg
from exporter.core.encoding import attribute_codes, code_table, proxy_columns, value_text
from exporter.core.side_table import id_text
from exporter.stream.decode import kserve_batch, seldon_batch
from exporter.stream.decode.events import DecodedBatch, is_binary
from exporter.stream.decode.oip import BadPayload
from exporter.stream.decode.platforms import (
    Half,
    headers_of_poll,
    kserve_event,
    kserve_half,
    kserve_model,
    pair_of,
    seldon_half,
    seldon_model,
)
from exporter.stream.decode.route import ignore_reason

FORMATS: Final = ("json", "kserve", "seldon")
UNMATCHED_REASONS: Final = ("duplicate_delivery", "request_without_response", "response_without_request",
                            "partner_refused", "pending_state_full", "other_component")  # fmt: skip
"""Why a payload half was never counted: delivered twice, no partner within the horizon (a failed call logs only
its request), its partner was refused, the join was full, or another component of the InferenceService (a
transformer and its predictor) logged the same call, which counted once."""

Raw = tuple[bytes | None, Sequence[tuple[str, bytes | None]] | None, bytes | None, int]
"""A record as the payload decoders read it: value, headers, key, Kafka timestamp in ms (-1: none)."""


def records_of(records: Sequence[Any]) -> list[Raw]:
    """Value, headers, key and timestamp of each record: from confluent-kafka's messages (the adapter's batch keeps
    them as ``messages``), else from the record's attributes (kafka-python's ConsumerRecord, tests)."""
    messages = getattr(records, "messages", None)
    if messages is not None:
        return [(m.value(), m.headers(), m.key(), m.timestamp()[1]) for m in messages]
    return [(r.value, getattr(r, "headers", None), getattr(r, "key", None), getattr(r, "timestamp", -1))
            for r in records]  # fmt: skip


@dataclass
class PairJoin:
    """Halves waiting for their partner, by (model, id); bounded in count, and in age by ``horizon`` seconds."""

    horizon: float
    max_pending: int = 1_000_000
    pending: dict[tuple[str, str], tuple[Half, float]] = field(default_factory=dict)
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
        pending = [[half_json(h), at] for h, at in self.pending.values()]
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
            half = self.pending.pop(key)[0]
            if half.response:
                responses.append(half)
            else:
                counts["request_without_response"] += 1
        while self.done and next(iter(self.done.values()))[0] < cutoff:
            self.done.popitem(last=False)
        return responses


def half_json(half: Half) -> list[Any]:
    """A half as plain JSON values (its columns are already): for a checkpoint, or the staged path's re-keying."""
    raw = None if half.raw is None else base64.b64encode(half.raw).decode()
    return [half.model, half.pair, half.response, half.time, half.rows, half.columns, half.metadata, raw, half.call,
            half.component]  # fmt: skip


def half_of(found: list[Any]) -> Half:
    """The half :func:`half_json` wrote (one written before pipelines and components has neither)."""
    model, pair, response, time, rows, columns, metadata, raw, *route = found
    return Half(pair, response, model, time, rows, columns, None if raw is None else base64.b64decode(raw), metadata,
                *route)  # fmt: skip


REFUSED_ROWS: Final = -1
"""The rows of a re-keyed half that stands for a refused one: its call is dropped at the join."""


@dataclass
class Halves:
    """A poll's records read as halves, with what was refused or ignored."""

    halves: list[Half] = field(default_factory=list)
    rejected: list[tuple[bytes | None, str, str | None, str | None]] = field(default_factory=list)
    """(value, reason, model, call id) of each refused record."""
    ignored: Counter[str] = field(default_factory=Counter)
    at: list[int] = field(default_factory=list)
    """Where each half's record was among the records read (the staged path tells its source offset by it)."""
    rejected_at: list[int] = field(default_factory=list)


def components(models: Iterable[ModelSpec]) -> dict[str, str]:
    """The KServe component whose log each model counts, where its ``events.component`` names one."""
    return {m.model_id: m.events.component for m in models if m.events.component}


def read_halves(format: str, topic: str, records: Sequence[Raw], models: Collection[str],
                response_topic: str | None = None, counted: Mapping[str, str] | None = None) -> Halves:  # fmt: skip
    """Each record as a half of a call of one of ``models``; others counted as ignored, bad ones refused.
    ``response_topic``: the responses' topic when its name does not say so (``kafka.response_topic``);
    ``counted``: the component whose log a model counts (:func:`components`), others ignored."""
    out = Halves()
    response = topic == response_topic if response_topic else None
    fast = seldon_batch.halves(topic, records, models, response) if format == "seldon" else None
    if fast is not None:
        return Halves(fast, at=list(range(len(records))))
    read = kserve_batch.halves(records, models, counted) if format == "kserve" else None
    if read is not None:
        return Halves(read[0], at=read[1], ignored=read[2])
    kserve = format == "kserve"
    for i, ((value, _, key, ms), headers) in enumerate(zip(records, headers_of_poll([r[1] for r in records])[0],
                                                          strict=True)):  # fmt: skip
        model = kserve_model(headers) if kserve else seldon_model(topic)[0]
        if model is not None and model not in models:
            out.ignored[ignore_reason(model)] += 1
            continue
        pid = None
        try:
            if kserve:  # the model and component an event names decide before its body is read
                event = kserve_event(value, headers)
                model, pid, component = event.model, event.id, event.component
                if model is not None and model not in models:  # structured mode: named in the event
                    out.ignored[ignore_reason(model)] += 1
                    continue
                if counted and component and counted.get(model or "", component) != component:
                    out.ignored["other_component"] += 1
                    continue
            half = kserve_half(value, headers, ms, event) if kserve else seldon_half(value, headers, key, topic, ms,
                                                                                     response)  # fmt: skip
        except BadPayload as exc:
            out.rejected.append((value, exc.reason, model, pid or pair_of(format, headers, key)))
            out.rejected_at.append(i)
            continue
        if half.model not in models:
            out.ignored[ignore_reason(half.model)] += 1
            continue
        out.halves.append(half)
        out.at.append(i)
    return out


class PayloadRows:
    """Joined pairs of one model as its :class:`DecodedBatch`, by the rules of our own events."""

    def __init__(self, model: ModelSpec, max_future_skew_seconds: float) -> None:
        self.model = model
        self.max_future_skew_seconds = max_future_skew_seconds
        self.threshold = model.events.score_threshold
        self.column = model.events.prediction
        self.tables = [(a.columns[0], *code_table(a.groups, a.other)) for a in model.base_attributes
                       if a.proxy is None and a.source is None]  # fmt: skip
        self.proxies = proxy_columns(model.base_attributes)
        self.sides = [(s.name, s.id) for s in model.attribute_sources]
        self.read = [*(t[0] for t in self.tables), *(c for pair in self.proxies for c in pair)]
        """The columns whose cells are read: the exact attributes', then each proxy's surname and ZCTA."""
        self.columns = [*(t[0] for t in self.tables), *(a.columns[0] for a in model.base_attributes if a.proxy)]

    def batch(self, pairs: Sequence[tuple[Half, Half]], now: float) -> tuple[DecodedBatch, list[tuple[Half, str]]]:
        """The rows of these pairs, and the pairs refused (the request half, with the reason)."""
        latest = now + self.max_future_skew_seconds
        raw_codes: list[list[Any]] = [[] for _ in self.read]
        sides: list[list[Any]] = [[] for _ in self.sides]
        segments: dict[str, list[Any]] = {c: [] for c in self.model.counted_columns}
        reasons, found_of = self._rules(pairs, latest)
        values = list(chain.from_iterable(f for f in found_of if f is not None))
        if not self._valid(values):  # which pairs break it
            reasons = [reason or self._values_rule(found)  # found: None where refused
                       for reason, found in zip(reasons, found_of, strict=True)]  # fmt: skip
        refused = [(request, reason) for (request, _), reason in zip(pairs, reasons, strict=True) if reason] \
            if any(reasons) else []
        kept = [pair for pair, reason in zip(pairs, reasons, strict=True) if not reason] if refused else pairs
        rows = [request.rows for request, _ in kept]
        timestamps = np.repeat(np.asarray([request.time for request, _ in kept], dtype=np.float64), rows)
        if refused:
            values = list(chain.from_iterable(found for found, reason in zip(found_of, reasons, strict=True)
                                              if not reason))  # fmt: skip
        calls = [request.id for request, _ in kept]
        ids = [call + suffix for call, n in zip(calls, rows, strict=True)  # 0.30 against 0.53 µs per call by chain/map
               for suffix in (_ALONE if n == 1 else _suffixes(n))]  # fmt: skip
        # each attribute's, id's and segment's cells: the request's column, else the response's, else a logged header
        for cells_of, column in zip([*raw_codes, *sides, *segments.values()],
                                    [*self.read, *(c for _, c in self.sides), *segments], strict=True):  # fmt: skip
            found = [request.columns.get(column) or response.columns.get(column) for request, response in kept]
            if None in found:
                found = [cells if cells is not None else [request.metadata.get(column)] * request.rows
                         for cells, (request, _) in zip(found, kept, strict=True)]  # fmt: skip
            cells_of += chain.from_iterable(found)  # type: ignore[arg-type]
        if self.threshold is not None:
            scores = np.asarray(values, dtype=np.float64)
            predictions = (scores >= self.threshold).astype(np.int64)
        else:
            scores = np.zeros(0)
            predictions = np.fromiter(map(int, values), np.int64, len(values))
        codes = [_codes(cells, table, unknown) for (_, table, unknown), cells in zip(self.tables, raw_codes,
                                                                                    strict=False)]  # fmt: skip
        proxied = raw_codes[len(self.tables):]
        codes += [bisg.tables().codes(proxied[2 * k], proxied[2 * k + 1]) for k in range(len(self.proxies))]
        base = dict(zip(self.columns, codes, strict=True))
        base.update({a.columns[0]: np.full(len(timestamps), -1, dtype=np.int64) for a in self.model.base_attributes
                     if a.source is not None})  # fmt: skip
        batch = DecodedBatch(timestamps=timestamps, predictions=predictions,
                             outcomes=np.full(len(timestamps), -1, dtype=np.int64), prediction_ids=ids,
                             codes={a.name: attribute_codes(a, base) for a in self.model.attributes},
                             rejected=Counter(reason for _, reason in refused), scores=scores,
                             segments=segments,
                             side_ids={name: list(map(id_text, side))
                                       for (name, _), side in zip(self.sides, sides, strict=True)})  # fmt: skip
        return batch, refused

    def _rules(self, pairs: Sequence[tuple[Half, Half]], latest: float) -> tuple[list[str | None], list[Any]]:
        """Each pair's :meth:`_rule`: asked of each pair only when a rule breaks in the batch (the usual batch is
        checked a rule at a time over all its pairs: 0.35 against 0.47 µs per pair, measured)."""
        column = self.column
        found_of = [response.columns.get(column) for _, response in pairs]
        if None in found_of:
            found_of = [request.columns.get(column) if found is None else found
                        for found, (request, _) in zip(found_of, pairs, strict=True)]  # fmt: skip
        times = [request.time for request, _ in pairs]
        if (None in found_of or None in times or bool((np.asarray(times, dtype=np.float64) > latest).any())
                or [request.rows for request, _ in pairs] != [response.rows for _, response in pairs]):  # fmt: skip
            checked = [self._rule(request, response, latest) for request, response in pairs]
            return [reason for reason, _ in checked], [found for _, found in checked]
        return [None] * len(pairs), found_of

    def _rule(self, request: Half, response: Half, latest: float) -> tuple[str | None, list[Any] | None]:
        """Why a joined pair cannot be counted (None: it can, if its values keep :meth:`_values_rule`, checked for
        a whole batch at once), and its predictions (or scores): the response's column, else the request's."""
        found = response.columns.get(self.column)
        if found is None:
            found = request.columns.get(self.column)
        if request.rows != response.rows:
            return "unequal_rows", None
        if request.time is None:
            return "missing_field", None
        if request.time > latest:
            return "future_timestamp", None
        return ("missing_field", None) if found is None else (None, found)

    def _values_rule(self, found: list[Any]) -> str | None:
        """Why a pair's predictions (or scores) cannot be counted, or None."""
        if self._valid(found):
            return None
        return "invalid_score" if self.threshold is not None else "invalid_prediction"

    def _valid(self, found: list[Any]) -> bool:
        if self.threshold is not None:  # a number (a bool is none) within [0, 1] (NaN is not)
            return set(map(type, found)) <= _NUMBERS and all(map(_ZERO.__le__, found)) and all(map(_ONE.__ge__, found))
        try:  # is_binary of each, by hash: 0, 1, 0.0, 1.0, False and True are the members of {0, 1}; a string never is
            return set(found) <= _BINARY
        except TypeError:  # a list or an object among them: each on its own
            return all(map(is_binary, found))


_NUMBERS: Final = frozenset({float, int})
_BINARY: Final = frozenset({0, 1})
_TEXT: Final = frozenset({str, type(None)})
_ZERO: Final = 0.0
_ONE: Final = 1.0


_ALONE: Final = ("",)
"""The suffix of a call's id for its one row: none."""


@cache
def _suffixes(n: int) -> list[str]:
    """``:0`` .. ``:<n-1>``: what a call's id takes for each row of a batch of ``n``."""
    return [f":{i}" for i in range(n)]


def _codes(cells: list[Any], table: Mapping[str, int], unknown: int) -> np.ndarray:
    """The code of each cell (a missing one: ``unknown``); text looked up as it is, other values by their text."""
    if set(map(type, cells)) <= _TEXT:  # looked up in one pass with no Python frame per cell
        return np.fromiter(map(table.get, cells, repeat(unknown, len(cells))), np.int64, len(cells))
    return np.fromiter((unknown if v is None else table.get(v if v.__class__ is str else value_text(v), unknown)
                        for v in cells), np.int64, len(cells))  # fmt: skip


def payload_batches(pairs: Mapping[str, Sequence[tuple[Half, Half]]], rows: Mapping[str, PayloadRows],
                    now: float) -> tuple[dict[str, DecodedBatch], list[tuple[bytes | None, str]]]:  # fmt: skip
    """Each model's batch of its joined pairs, and the dead letters of the pairs refused (both halves)."""
    batches, letters = {}, []
    for model_id, mine in pairs.items():
        batch, refused = rows[model_id].batch(mine, now)
        batches[model_id] = batch
        by_request = {id(request): response for request, response in mine}
        for request, reason in refused:
            letters += [(request.raw, reason), (by_request[id(request)].raw, reason)]
    return batches, letters
