"""Decode and validate a batch of raw prediction events into columns ready to be counted.

Two steps, one set of rules. msgspec decodes each event straight into a ``Struct`` built from the configured field
paths (exporter/stream/decode/schema.py), validating types and ranges while it parses and skipping every other
field; what that schema accepts is, by construction, an event the rules below accept. Everything it refuses (a
malformed event, a prediction sent as ``1.0``, an attribute value sent as a number, a ``null`` where an object
belongs) is walked by :meth:`EventDecoder._walk`, which alone decides a rejection and its reason. A batch is parsed
as lines in one call per run of accepted lines (exporter/stream/decode/lines.py), so a refused event costs about what an
accepted one does; the stricter ``Struct`` of the same paths (this model only, configured group names only) goes
first while it accepts nearly every event, since its strings come back as the schema's own objects. Columns are
then built from the accepted structs (:meth:`EventDecoder.batch`) with ``np.fromiter`` over attribute getters, the
timestamps by :func:`exporter.stream.decode.timestamps.epochs`, each field read once (:class:`Columns`): a fleet's
shared parse reads it once for all its models, each taking its rows by index (exporter/stream/decode/fleet.py).
Every event either becomes a row of the batch, is ignored (another model's), or is rejected under one reason;
nothing raises.
"""

from __future__ import annotations

import logging
import math
import time
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import repeat
from operator import attrgetter
from typing import Any, Final, TypeGuard

import msgspec
import numpy as np
import orjson

from exporter.config import ModelSpec
from exporter.core import bisg
from exporter.core.encoding import attribute_codes, code_table, proxy_columns, score_predictions, value_text
from exporter.core.side_table import id_text
from exporter.stream.decode.bignum import event_reader
from exporter.stream.decode.lines import Parser
from exporter.stream.decode.paths import lookup
from exporter.stream.decode.route import IGNORE_REASONS, ignore_reason
from exporter.stream.decode.schema import MAX_PREDICTION_ID_LENGTH, schema
from exporter.stream.decode.timestamps import epoch, epochs

REJECT_REASONS: Final = (
    "malformed_json", "missing_field", "invalid_prediction", "invalid_score", "invalid_label",
    "invalid_timestamp", "future_timestamp", "invalid_prediction_id", "undecodable",
)  # fmt: skip
"""Defects of the event itself. A value outside an attribute's groups (or missing) is no defect: the event counts,
in that attribute's unknown category (code -1), exactly as the gate counts such a row. ``undecodable``: a value
that made the rules themselves raise (a defect no rule names yet, logged with its error): it is rejected alone,
never its batch."""
def is_valid_id(pid: object) -> bool:
    """A prediction id the ground-truth join can hold: None (no join), an int, or a string of bounded length."""
    return pid is None or pid.__class__ is int or (pid.__class__ is str and len(pid) <= MAX_PREDICTION_ID_LENGTH)


def is_binary(value: object) -> TypeGuard[int | float]:
    """0 or 1: a number (0.0/1.0 too) or a boolean (true is 1, false is 0, as the gate counts a boolean column),
    never a string."""
    return value.__class__ is not str and value in (0, 1)


log = logging.getLogger(__name__)
LOG_EVERY_SECONDS: Final = 10.0
_logged = [-LOG_EVERY_SECONDS]
"""When an undecodable event was last logged (monotonic seconds)."""

_OUTCOME: Final = {None: -1, 0: 0, 1: 1}
"""The outcome of a label the schema accepted: none (-1), 0 or 1 (False and True hash as 0 and 1)."""


Walked = tuple[float, int, int, Any, list[int], float, list[Any], list[Any]]
"""A walked event's row: timestamp, prediction, outcome, prediction id, base attribute codes, score or NaN, side
source ids, segment values."""


@dataclass
class DecodedBatch:
    """Accepted events as columns, and what happened to the others."""

    timestamps: np.ndarray
    predictions: np.ndarray
    outcomes: np.ndarray
    """The inline ground truth (the event's label), -1 where the event carried none."""
    prediction_ids: Sequence[Any]
    codes: dict[str, np.ndarray]
    """Per configured attribute (intersections included): the subgroup code of every accepted event."""
    segments: dict[str, list[Any]] = field(default_factory=dict)
    """Per segment column (``segments:``): every accepted event's value (None: missing), coded by the window store."""
    rejected: Counter[str] = field(default_factory=Counter)
    ignored: Counter[str] = field(default_factory=Counter)
    """Events of no model of ours (another model's, or none), by reason (decode.route.IGNORE_REASONS)."""
    scores: np.ndarray = field(default_factory=lambda: np.zeros(0))
    """The score of every accepted event when the model emits scores (``events.score_threshold``), else empty."""
    rejected_payloads: list[tuple[bytes, str]] = field(default_factory=list)
    positions: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    """Where each accepted event was among the decoded values (the staged path tells its source offset by it)."""
    side_ids: dict[str, list[str | int | None]] = field(default_factory=dict)
    """Per side source of the model (``attribute_sources``), each event's id (None: missing); the attributes read
    from it have code -1 until exporter/stream/state/attribute_join.py joins them."""

    def __len__(self) -> int:
        return len(self.timestamps)


class Columns:
    """The role values of a batch's structs, each role read once, when first asked: a fleet's batch is read once
    for all its models, and each model takes its own events' rows of it (exporter/stream/decode/fleet.py)."""

    def __init__(self, structs: list[Any], get: Mapping[str, Callable[[Any], Any]]) -> None:
        self.structs = structs
        self.get = get
        """The role getters of the schema that parsed the structs."""
        self._read: dict[tuple[str, str], Any] = {}

    def _cached(self, role: str, form: str, read: Callable[[], Any]) -> Any:
        found = self._read.get((role, form))
        if found is None:
            found = self._read[role, form] = read()
        return found

    def _map(self, role: str) -> Iterator[Any]:
        return map(self.get[role], self.structs)

    def take(self, role: str, rows: np.ndarray | None) -> np.ndarray:
        """A number role at ``rows`` (None: every struct): ``ts`` as epoch seconds (NaN: invalid), ``score`` (NaN:
        none), ``pred`` and ``label`` as 0/1 (-1: none)."""
        column = self._cached(role, "array", lambda: self._array(role))
        return column if rows is None else column[rows]

    def _array(self, role: str) -> np.ndarray:
        n = len(self.structs)
        if role == "ts":
            stamps = epochs(list(self._map(role))) if n else []
            return stamps if stamps.__class__ is np.ndarray else np.array(stamps, dtype=np.float64)  # None: NaN
        if role == "score":
            return np.fromiter(self._map(role), np.float64, n)  # None (a shared schema's optional score): NaN
        if role == "pred":
            try:
                return np.fromiter(self._map(role), np.int64, n)
            except TypeError:  # a None (a shared schema's optional prediction): read as a label is
                pass
        return np.fromiter(map(_OUTCOME.__getitem__, self._map(role)), np.int64, n)

    def lacking(self, role: str, rows: np.ndarray | None) -> np.ndarray:
        """Where a prediction or a score (``role``) is missing, at ``rows``: a shared schema leaves both optional."""
        column = self.take(role, rows)
        return np.isnan(column) if role == "score" else column < 0

    def settled(self, latest: float, needed: str | None) -> bool:
        """Whether every struct's timestamp is valid and no later than ``latest``, and none lacks ``needed``: then
        no model's rows need a look of their own."""
        return self._cached(needed or "", f"settled at {latest!r}", lambda: bool(
            (self.take("ts", None) <= latest).all()) and (needed is None or not self.lacking(needed, None).any()))

    def values(self, role: str, rows: np.ndarray | None) -> list[Any]:
        """A role's values at ``rows`` (None: every struct), as a list of their own."""
        if rows is None:
            return list(self._map(role))
        objects = self._cached(role, "objects", lambda: np.fromiter(self._map(role), object, len(self.structs)))
        return objects[rows].tolist()

    def codes(self, role: str, table: Mapping[str, int], unknown: int, rows: np.ndarray | None) -> np.ndarray:
        """An attribute's codes at ``rows`` by a code table (any other value, None included: ``unknown``). Every
        struct's (one model's batch): a lookup per value. Some rows (a fleet's batch): the column is factorized
        once, and each model looks up only its distinct values."""
        if rows is None:
            return np.fromiter(map(table.get, self._map(role), repeat(unknown)), np.int64, len(self.structs))
        distinct, inverse = self._cached(role, "factors", lambda: _factors(list(self._map(role))))
        lookup = np.fromiter(map(table.get, distinct, repeat(unknown)), np.int64, len(distinct))
        return lookup[inverse[rows]]


def _factors(values: list[Any]) -> tuple[list[Any], np.ndarray]:
    """The distinct values (first seen first), and the index of each value among them."""
    index = {v: k for k, v in enumerate(dict.fromkeys(values))}
    return list(index), np.fromiter(map(index.__getitem__, values), np.int64, len(values))


class EventDecoder:
    """Turns raw Kafka message values into a :class:`DecodedBatch` for one configured model."""

    def __init__(self, model: ModelSpec, max_future_skew_seconds: float = 300.0, keep_rejected: bool = False) -> None:
        self.model = model
        self.max_future_skew_seconds = max_future_skew_seconds
        self.keep_rejected = keep_rejected
        f = model.events
        self._paths = [lookup(p) for p in (f.model_id, f.prediction_id, f.timestamp, f.prediction, f.score, f.label,
                                            f.attributes)]  # fmt: skip
        self._threshold = f.score_threshold
        self._tables = [(a.columns[0], *code_table(a.groups, a.other)) for a in model.base_attributes
                        if a.proxy is None and a.source is None]  # fmt: skip
        self._proxies = proxy_columns(model.base_attributes)
        self._columns = [*(t[0] for t in self._tables), *(a.columns[0] for a in model.base_attributes if a.proxy)]
        """Where each of a row's base codes goes: the exact attributes' columns, then the proxy attributes'."""
        self._sides = [(s.name, s.id) for s in model.attribute_sources]
        self._json = event_reader(model)  # orjson.loads, and a number beyond a float in no field read: read as msgspec
        general = schema([model])
        self._decoder: msgspec.json.Decoder[Any] | None = None
        self._get: dict[str, Callable[[Any], Any]] = {}
        if general is not None:
            struct, paths = general
            self._decoder = msgspec.json.Decoder(struct)
            self._get = {role: attrgetter(path) for role, path in paths.items()}
        strict = schema([model], strict=True) if general is not None else None
        self._parser = Parser(self._decoder, msgspec.json.Decoder(strict[0]) if strict else None) \
            if self._decoder is not None else None  # fmt: skip

    def _structs(self, values: Sequence[bytes]) -> tuple[list[Any], list[int], list[int], Counter[str]]:
        """The schema's pass: (structs of this model's events, their input positions, positions to walk, events
        of no model of ours by reason). Newline-free values (the usual case) are decoded as lines, in one call per
        run of lines the schema accepts; the others value by value."""
        decoder = self._decoder
        if decoder is None:
            return [], [], list(range(len(values))), Counter()
        assert self._parser is not None
        slots = self._parser.slots(values)
        get_model, model_id = self._get["model"], self.model.model_id
        at: Sequence[int] = range(len(slots))
        walked: list[int] = []
        if self._parser.refused:  # the refused ones are walked (the rules say why); the rest as in any batch
            walked = [i for i, event in enumerate(slots) if event is None]
            at = [i for i, event in enumerate(slots) if event is not None]
            slots = [event for event in slots if event is not None]
        models = list(map(get_model, slots))
        if models.count(model_id) == len(slots):  # the usual batch, of this model's events alone
            return slots, list(at), walked, Counter()
        keep = [k for k, m in enumerate(models) if m == model_id]
        return ([slots[k] for k in keep], [at[k] for k in keep], walked,
                Counter(map(ignore_reason, (m for m in models if m != model_id))))

    def decode(self, values: Sequence[bytes], now: float) -> DecodedBatch:
        """Decode a batch; ``now`` (epoch seconds) bounds how far in the future a timestamp may be."""
        structs, at, walked, ignored = self._structs(values)
        return self.batch(values, Columns(structs, self._get), None, np.asarray(at, dtype=np.int64), walked, ignored,
                          now)  # fmt: skip

    def batch(
        self, values: Sequence[bytes], columns: Columns, rows: np.ndarray | None, at: np.ndarray, walked: list[int],
        ignored: Counter[str], now: float, shared: bool = False,
    ) -> DecodedBatch:  # fmt: skip
        """The batch of this model's events among ``values``: the structs of ``columns`` at ``rows`` (None: every
        one), which are the values at positions ``at``, the positions of those the schema refused (``walked``), and
        what was ignored. ``shared``: the schema of several models, which requires neither prediction nor score: an
        event without the one this model needs is walked (the rules say missing_field)."""
        latest = now + self.max_future_skew_seconds
        scored = self._threshold is not None
        needed = ("score" if scored else "pred") if shared else None
        timestamps = columns.take("ts", rows)
        rejects: list[tuple[int, str]] = []
        if not columns.settled(latest, needed):  # some event of the batch needs a look: is it one of this model's?
            walk = np.isnan(timestamps)  # an unparseable timestamp: the walk says which reason
            if needed is not None:
                walk |= columns.lacking(needed, rows)
            future = ~walk & (timestamps > latest)  # a valid timestamp comes first among the rules: nothing else asked
            rejects = [(i, "future_timestamp") for i in at[future].tolist()]
            if future.any() or walk.any():
                walked = sorted([*walked, *at[walk].tolist()])
                kept = np.flatnonzero(~(walk | future))
                rows, at, timestamps = kept if rows is None else rows[kept], at[kept], timestamps[kept]
        n = len(at)
        if n:
            if self._threshold is not None:
                scores = columns.take("score", rows)
                predictions = score_predictions(scores, self._threshold)
            else:
                predictions = columns.take("pred", rows)
            outcomes = columns.take("label", rows)
            ids = columns.values("id", rows)
            sides = [columns.values(f"side:{column}", rows) for _, column in self._sides]  # str, int or None
            segments = {c: columns.values(next(r for r in (f"seg:{c}", f"attr:{c}", f"side:{c}") if r in columns.get),
                                          rows) for c in self.model.counted_columns}  # fmt: skip
            codes = [columns.codes(f"attr:{column}", table, unknown, rows) for column, table, unknown in self._tables]
            for surname, zcta in self._proxies:
                codes.append(bisg.tables().codes(columns.values(f"attr:{surname}", rows),
                                                 columns.values(f"attr:{zcta}", rows)))  # fmt: skip
        else:
            predictions = outcomes = np.zeros(0, dtype=np.int64)
            ids, codes = [], [np.zeros(0, dtype=np.int64) for _ in self._columns]
            sides = [[] for _ in self._sides]
            segments = {c: [] for c in self.model.counted_columns}
        if not scored or not n:
            scores = np.zeros(0)

        if walked:
            found: list[tuple[int, float, int, int, Any, list[int], float, list[Any], list[Any]]] = []
            for i in sorted(walked):
                outcome = self.judge(values[i], latest)
                if outcome in IGNORE_REASONS:
                    ignored[outcome] += 1
                elif isinstance(outcome, str):
                    rejects.append((i, outcome))
                else:
                    found.append((i, *outcome))
            if found:  # merge the walked rows in input order, as every column's consumers expect
                at = np.concatenate([at, np.array([r[0] for r in found], dtype=np.int64)])
                order = np.argsort(at, kind="stable")
                at = at[order]
                timestamps = np.concatenate([timestamps, [r[1] for r in found]])[order]
                predictions = np.concatenate([predictions, np.array([r[2] for r in found], dtype=np.int64)])[order]
                outcomes = np.concatenate([outcomes, np.array([r[3] for r in found], dtype=np.int64)])[order]
                all_ids = ids + [r[4] for r in found]
                ids = [all_ids[k] for k in order.tolist()]
                codes = [np.concatenate([c, np.array([r[5][k] for r in found], dtype=np.int64)])[order]
                         for k, c in enumerate(codes)]  # fmt: skip
                if scored:
                    scores = np.concatenate([scores, [r[6] for r in found]])[order]
                merged = [[*side, *(r[7][k] for r in found)] for k, side in enumerate(sides)]
                sides = [[side[j] for j in order.tolist()] for side in merged]
                for k, c in enumerate(self.model.counted_columns):
                    merged = segments[c] + [r[8][k] for r in found]
                    segments[c] = [merged[i] for i in order.tolist()]

        rejected: Counter[str] = Counter(reason for _, reason in rejects)
        bad = [(values[i], reason) for i, reason in sorted(rejects)] if self.keep_rejected else []
        base = dict(zip(self._columns, codes, strict=True))
        base.update({a.columns[0]: np.full(len(timestamps), -1, dtype=np.int64) for a in self.model.base_attributes
                     if a.source is not None})  # fmt: skip
        return DecodedBatch(
            timestamps=timestamps.astype(np.float64, copy=False),
            predictions=predictions.astype(np.int64, copy=False),
            outcomes=outcomes.astype(np.int64, copy=False),
            prediction_ids=ids,
            codes={a.name: attribute_codes(a, base) for a in self.model.attributes},
            segments=segments,
            rejected=rejected,
            ignored=ignored,
            rejected_payloads=bad,
            scores=scores.astype(np.float64, copy=False),
            positions=np.asarray(at, dtype=np.int64),
            side_ids={name: side for (name, _), side in zip(self._sides, sides, strict=True)},
        )

    def judge(self, raw: bytes, latest: float) -> str | Walked:
        """:meth:`_walk`, and ``undecodable`` for a value it raised on (logged): one value's failure is its own."""
        try:
            return self._walk(raw, latest)
        except Exception as exc:
            now = time.monotonic()
            if now - _logged[0] >= LOG_EVERY_SECONDS:  # a flood of them logs once in a while; each is counted
                _logged[0] = now
                log.warning("event rejected as undecodable (%s: %.200s); its batch reads on", type(exc).__name__, exc)
            return "undecodable"

    def _walk(self, raw: bytes, latest: float) -> str | Walked:
        """The rules, over the parsed JSON: why it is ignored (another model's, see IGNORE_REASONS), a rejection
        reason, or the event's row ``(timestamp, prediction, outcome, prediction id, base attribute codes (of those
        not read from a side source), score or NaN, side source ids, segment values)``."""
        try:
            event = self._json(raw)
        except (orjson.JSONDecodeError, TypeError):  # TypeError: a tombstone (None value); nested past 1024 levels
            return "malformed_json"
        if event.__class__ is not dict:
            return "malformed_json"
        model, pid_of, ts_of, pred_of, score_of, label_of, attrs_of = self._paths
        found = model(event)
        if found != self.model.model_id:
            return ignore_reason(found)
        t = ts_of(event)
        ts = epoch(t)
        if ts is None:
            return "missing_field" if t is None else "invalid_timestamp"
        if ts > latest:
            return "future_timestamp"
        score = score_of(event)
        if score is not None and ((score.__class__ is not float and score.__class__ is not int)
                                  or not 0.0 <= score <= 1.0):  # fmt: skip
            return "invalid_score"
        if self._threshold is not None:
            pred = None if score is None else int(score >= self._threshold)  # score_predictions' rule, one event
        else:
            pred = pred_of(event)
            if pred is not None and not is_binary(pred):
                return "invalid_prediction"
        if pred is None:
            return "missing_field"
        label = label_of(event)
        if label is None:
            label = -1
        elif not is_binary(label):
            return "invalid_label"
        pid = pid_of(event)
        if not is_valid_id(pid):
            return "invalid_prediction_id"
        attrs = attrs_of(event)
        if attrs is None:
            attrs = {}  # every attribute missing: unknown for each, still counted overall
        if attrs.__class__ is not dict:
            return "missing_field"
        codes = []
        for column, table, unknown in self._tables:
            v = attrs.get(column)
            code = None if v is None else table.get(v if v.__class__ is str else value_text(v))
            codes.append(unknown if code is None else code)
        for surname, zcta in self._proxies:
            codes.append(int(bisg.tables().codes([attrs.get(surname)], [attrs.get(zcta)])[0]))
        sides = [id_text(attrs.get(column)) for _, column in self._sides]
        segments = [attrs.get(c) for c in self.model.counted_columns]
        return ts, int(pred), int(label), pid, codes, math.nan if score is None else float(score), sides, segments
