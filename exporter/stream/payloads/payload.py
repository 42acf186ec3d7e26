"""A serving platform's payload log (``events.format: kserve | seldon``) as the rows the windows count.

Each record is one half of a call (exporter/stream/payloads/platforms.py): its request or its response. The two
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

from collections import Counter
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import chain, repeat
from typing import Any, Final

import numpy as np

from exporter.config import ModelSpec
from exporter.core import bisg
from exporter.core.encoding import attribute_codes, code_table, proxy_columns, value_text
from exporter.core.side_table import id_text
from exporter.stream.decode.events import DecodedBatch, is_binary
from exporter.stream.decode.route import ignore_reason
from exporter.stream.payloads import kserve_batch, seldon_batch
from exporter.stream.payloads.ids import RowIds
from exporter.stream.payloads.oip import BadPayload
from exporter.stream.payloads.pairs import BlockPairs, HalfBlock, Joined, PollBlocks, as_halves
from exporter.stream.payloads.pairs import PairJoin as PairJoin  # the join's home: pairs.py; its callers import it here
from exporter.stream.payloads.platforms import (
    Half,
    headers_of_poll,
    kserve_event,
    kserve_half,
    kserve_model,
    pair_of,
    seldon_half,
    seldon_model,
)
from exporter.stream.payloads.platforms import half_json as half_json
from exporter.stream.payloads.platforms import half_of as half_of
from exporter.stream.payloads.seldon_block import read_block

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
    blocks: list[HalfBlock | PollBlocks] = field(default_factory=list)
    """The poll's halves as one block (``read_halves(blocks=True)``), in place of ``halves``."""


def components(models: Iterable[ModelSpec]) -> dict[str, str]:
    """The KServe component whose log each model counts, where its ``events.component`` names one."""
    return {m.model_id: m.events.component for m in models if m.events.component}


def read_halves(format: str, topic: str, records: Sequence[Raw], models: Collection[str],
                response_topic: str | None = None, counted: Mapping[str, str] | None = None,
                blocks: bool = False) -> Halves:  # fmt: skip
    """Each record as a half of a call of one of ``models``; others counted as ignored, bad ones refused.
    ``response_topic``: the responses' topic when its name does not say so (``kafka.response_topic``);
    ``counted``: the component whose log a model counts (:func:`components`), others ignored; ``blocks``: a poll
    read together may be one block (exporter/stream/payloads/pairs.py) instead of a Half per record."""
    out = Halves()
    response = topic == response_topic if response_topic else None
    block = read_block(topic, records, models, response) if blocks and format == "seldon" else None
    if block is not None:
        return Halves(blocks=[block])  # the direct path's: it tells no record's place (the staged path reads halves)
    fast = seldon_batch.halves(topic, records, models, response) if format == "seldon" else None
    if fast is not None:
        return Halves(fast, at=list(range(len(records))))
    read = kserve_batch.halves(records, models, counted, blocks) if format == "kserve" else None
    if read is not None:
        if read[0].__class__ is PollBlocks:
            return Halves(blocks=[read[0]], ignored=read[-1])
        return Halves(read[0], at=read[1], ignored=read[2])  # type: ignore[arg-type, misc]
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
        self.cells = [*self.read, *(c for _, c in self.sides), *model.counted_columns]
        """Every column whose cells a row takes: the read ones, each side source's id, each segment's."""

    def batch(self, pairs: Sequence[tuple[Half, Half]], now: float) -> tuple[DecodedBatch, list[tuple[Half, str]]]:
        """The rows of these pairs, and the pairs refused (the request half, with the reason)."""
        latest = now + self.max_future_skew_seconds
        reasons, found_of = self._rules(pairs, latest)
        values = list(chain.from_iterable(f for f in found_of if f is not None))
        if not self._valid(values):  # which pairs break it
            reasons = [reason or self._values_rule(found)  # found: None where refused
                       for reason, found in zip(reasons, found_of, strict=True)]  # fmt: skip
        refused = [(request, reason) for (request, _), reason in zip(pairs, reasons, strict=True) if reason] \
            if any(reasons) else []
        kept = [pair for pair, reason in zip(pairs, reasons, strict=True) if not reason] if refused else pairs
        if refused:
            values = list(chain.from_iterable(found for found, reason in zip(found_of, reasons, strict=True)
                                              if not reason))  # fmt: skip
        # each attribute's, id's and segment's cells: the request's column, else the response's, else a logged header
        cells = []
        for column in self.cells:
            found = [request.columns.get(column) or response.columns.get(column) for request, response in kept]
            if None in found:
                found = [cells if cells is not None else [request.metadata.get(column)] * request.rows
                         for cells, (request, _) in zip(found, kept, strict=True)]  # fmt: skip
            cells.append(list(chain.from_iterable(found)))  # type: ignore[arg-type]
        return self._built([request.rows for request, _ in kept], [request.time for request, _ in kept],
                           [request.id for request, _ in kept], values, cells, refused), refused  # fmt: skip

    def block_batch(self, joined: Sequence[BlockPairs], now: float) -> DecodedBatch | None:
        """The batch :meth:`batch` makes of these calls' Halves, read from their blocks' columns (the cells as Arrow
        arrays, numbers as numpy's); None when a rule breaks for one of them (then :meth:`batch` of their Halves
        says which and why)."""
        latest = now + self.max_future_skew_seconds
        rows, times, calls, values = [], [], [], []
        cells: list[list[Any]] = [[] for _ in self.cells]
        for j in joined:
            counts = j.request.rows[j.request_at]
            if not np.array_equal(counts, j.response.rows[j.response_at]) or not counts.all():
                return None  # unequal_rows, or a call of no rows (its cells fall to the other half's: batch)
            found = j.request.times[j.request_at]
            if not (found <= latest).all():
                return None  # missing_field (NaN: no time), future_timestamp
            predicted = j.cells(self.column, True)
            if predicted is None:
                return None  # missing_field
            values.append(predicted)
            for cells_of, column in zip(cells, self.cells, strict=True):
                cells_of.append(j.cells(column, False) or [None] * int(counts.sum()))
            rows.append(counts)
            times.append(found)
            calls += j.request.ids(j.request_at)
        numbers = _numbers(values, self.threshold is not None)
        if numbers is None:
            return None  # invalid_score, invalid_prediction
        return self._built(np.concatenate(rows).tolist(), np.concatenate(times), calls, numbers,
                           [_joined(c) for c in cells], [])  # fmt: skip

    def _built(self, rows: list[int], times: Any, calls: list[str], values: Any, cells: list[Any],
               refused: list[tuple[Half, str]]) -> DecodedBatch:  # fmt: skip
        """The batch of the calls kept: each call's rows, time and id, the predictions (or scores) of every row,
        and each of :attr:`cells`' cells of every row."""
        timestamps = np.repeat(np.asarray(times, dtype=np.float64), rows)
        ids = RowIds(calls, rows, len(timestamps))  # made when read
        raw_codes, sides = cells[:len(self.read)], list(map(_listed, cells[len(self.read):len(self.read) + len(
            self.sides)]))  # fmt: skip
        segments = dict(zip(self.model.counted_columns, map(_listed, cells[len(self.read) + len(self.sides):]),
                            strict=True))  # fmt: skip
        if self.threshold is not None:
            scores = np.asarray(values, dtype=np.float64)
            predictions = (scores >= self.threshold).astype(np.int64)
        else:
            scores = np.zeros(0)
            predictions = values.astype(np.int64) if isinstance(values, np.ndarray) else \
                np.fromiter(map(int, values), np.int64, len(values))  # fmt: skip
        codes = [_codes(cells, table, unknown) for (_, table, unknown), cells in zip(self.tables, raw_codes,
                                                                                    strict=False)]  # fmt: skip
        proxied = [_listed(c) for c in raw_codes[len(self.tables):]]
        codes += [bisg.tables().codes(proxied[2 * k], proxied[2 * k + 1]) for k in range(len(self.proxies))]
        base = dict(zip(self.columns, codes, strict=True))
        base.update({a.columns[0]: np.full(len(timestamps), -1, dtype=np.int64) for a in self.model.base_attributes
                     if a.source is not None})  # fmt: skip
        return DecodedBatch(timestamps=timestamps, predictions=predictions,
                            outcomes=np.full(len(timestamps), -1, dtype=np.int64), prediction_ids=ids,
                            codes={a.name: attribute_codes(a, base) for a in self.model.attributes},
                            rejected=Counter(reason for _, reason in refused), scores=scores, segments=segments,
                            side_ids={name: list(map(id_text, side))
                                      for (name, _), side in zip(self.sides, sides, strict=True)})  # fmt: skip

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
        return _valid(found, self.threshold is not None)


def _valid(found: list[Any], scores: bool) -> bool:
    if scores:  # a number (a bool is none) within [0, 1] (NaN is not)
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


def _codes(cells: Any, table: Mapping[str, int], unknown: int) -> np.ndarray:
    """The code of each cell (a missing one: ``unknown``); text looked up as it is, other values by their text.
    ``cells``: a list, or an Arrow array (a block's: text looked up by Arrow's ``index_in``, a code being its
    group's place in ``table``)."""
    if not isinstance(cells, list):
        import pyarrow as pa
        import pyarrow.compute as pc

        try:
            groups = pa.array(list(table), type=pa.string())
        except UnicodeEncodeError:  # a group no UTF-8 text can be (a lone surrogate): looked up as Python does
            groups = None
        if groups is None or not pa.types.is_string(cells.type):
            return _codes(cells.to_pylist(), table, unknown)
        found = pc.index_in(cells, value_set=groups)
        return np.asarray(found.fill_null(unknown).to_numpy(), dtype=np.int64)
    if set(map(type, cells)) <= _TEXT:  # looked up in one pass with no Python frame per cell
        return np.fromiter(map(table.get, cells, repeat(unknown, len(cells))), np.int64, len(cells))
    return np.fromiter((unknown if v is None else table.get(v if v.__class__ is str else value_text(v), unknown)
                        for v in cells), np.int64, len(cells))  # fmt: skip


def _joined(parts: list[Any]) -> Any:
    """One column's cells of every run: one Arrow array, or a list where a run has no such column."""
    if len(parts) == 1:  # one run (the usual batch): its cells as they are, no copy
        return parts[0]
    if all(isinstance(p, list) for p in parts):
        return list(chain.from_iterable(parts))
    if any(isinstance(p, list) for p in parts):
        return list(chain.from_iterable(p if isinstance(p, list) else p.to_pylist() for p in parts))
    import pyarrow as pa

    return pa.concat_arrays(parts) if len({p.type for p in parts}) == 1 else list(chain.from_iterable(
        p.to_pylist() for p in parts))  # fmt: skip


def _listed(cells: Any) -> list[Any]:
    return cells if isinstance(cells, list) else cells.to_pylist()


def _numbers(parts: list[Any], scores: bool) -> Any:
    """The predictions (``scores``: the scores) of every run as :meth:`PayloadRows._valid` takes them: a numpy
    array of numbers (floats or integers: a bool is no score) when every one is valid, else None; other types
    through the Python rule on their values."""
    import pyarrow as pa

    kinds = {p.type for p in parts}
    if all(pa.types.is_floating(k) or pa.types.is_integer(k) for k in kinds):
        found = np.concatenate([np.asarray(p.to_numpy(zero_copy_only=False), dtype=np.float64) for p in parts])
        valid = ((found >= 0) & (found <= 1)).all() if scores else np.isin(found, (0.0, 1.0)).all()
        return found if valid else None
    values = list(chain.from_iterable(p.to_pylist() for p in parts))
    return values if _valid(values, scores) else None


def payload_batches(pairs: Mapping[str, Sequence[Joined]], rows: Mapping[str, PayloadRows],
                    now: float) -> tuple[dict[str, DecodedBatch], list[tuple[bytes | None, str]]]:  # fmt: skip
    """Each model's batch of its joined calls, and the dead letters of the calls refused (both halves). Calls
    joined between blocks are read from their columns while every rule holds for them all, else as Halves."""
    batches, letters = {}, []
    for model_id, joined in pairs.items():
        if joined and all(j.__class__ is BlockPairs for j in joined):
            found = rows[model_id].block_batch(joined, now)  # type: ignore[arg-type]
            if found is not None:
                batches[model_id] = found
                continue
        mine = as_halves(joined)
        batch, refused = rows[model_id].batch(mine, now)
        batches[model_id] = batch
        by_request = {id(request): response for request, response in mine}
        for request, reason in refused:
            letters += [(request.raw, reason), (by_request[id(request)].raw, reason)]
    return batches, letters
