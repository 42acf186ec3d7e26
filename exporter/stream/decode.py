"""Decode and validate a batch of raw prediction events into columns ready to be counted.

Two steps, one set of rules. msgspec decodes each event straight into a ``Struct`` built from the configured field
paths (nested dotted paths too), validating types and ranges while it parses and skipping every other field; what that
schema accepts is, by construction, an event the rules below accept. Everything it refuses (a malformed event, a
prediction sent as ``1.0``, an attribute value sent as a number, a ``null`` where an object belongs) is walked by
:meth:`EventDecoder._walk`, which alone decides a rejection and its reason. A batch is first offered to a stricter
``Struct`` of the same paths (this model only, configured group names only), whose strings come back as the
schema's own objects; a batch it refuses goes the general way. Columns are then built from the accepted structs
with ``np.fromiter`` over attribute getters, the timestamps by :func:`exporter.stream.timestamps.epochs`. Every
event either becomes a row of the batch, is ignored (another model's), or is rejected under one reason; nothing
raises.
"""

from __future__ import annotations

import itertools
import math
from collections import Counter, defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from operator import attrgetter
from typing import Annotated, Any, Final, Literal, TypeGuard

import msgspec
import numpy as np
import orjson

from exporter.config import ModelSpec
from exporter.core.encoding import attribute_codes, code_table, value_text
from exporter.stream.paths import lookup
from exporter.stream.route import IGNORE_REASONS, ignore_reason
from exporter.stream.timestamps import epoch, epochs

REJECT_REASONS: Final = (
    "malformed_json", "missing_field", "invalid_prediction", "invalid_score", "invalid_label",
    "invalid_timestamp", "future_timestamp", "invalid_prediction_id",
)  # fmt: skip
"""Defects of the event itself. A value outside an attribute's groups (or missing) is no defect: the event counts,
in that attribute's unknown category (code -1), exactly as the gate counts such a row."""
MAX_PREDICTION_ID_LENGTH: Final = 256
"""Longer ids (or ids that are neither strings nor integers) are rejected: every pending id is held in memory and
in the checkpoint until its ground truth arrives."""
STRICT_PAUSE: Final = 64
"""After a batch the strict schema refused, the batches decoded by the general schema before it is tried again."""


def is_valid_id(pid: object) -> bool:
    """A prediction id the ground-truth join can hold: None (no join), an int, or a string of bounded length."""
    return pid is None or pid.__class__ is int or (pid.__class__ is str and len(pid) <= MAX_PREDICTION_ID_LENGTH)


def is_binary(value: object) -> TypeGuard[int | float]:
    """0 or 1: a number (0.0/1.0 too) or a boolean (true is 1, false is 0, as the gate counts a boolean column),
    never a string."""
    return value.__class__ is not str and value in (0, 1)


# What the schema accepts of each field: only values that the rules accept as they are. Wider values (1.0 for 1,
# a timestamp JSON number beyond int64, an id integer beyond what orjson reads as an int) fail it and are walked.
_Binary = Literal[0, 1] | bool  # true/false count as 1/0 (np.fromiter and _OUTCOME read True as 1)
_Id = Annotated[str, msgspec.Meta(max_length=MAX_PREDICTION_ID_LENGTH)] | Annotated[int, msgspec.Meta(ge=-(2**63),
                                                                                                    le=2**63 - 1)]
_Score = Annotated[float, msgspec.Meta(ge=0.0, le=1.0)]
_Stamp = str | float
_OUTCOME: Final = {None: -1, 0: 0, 1: 1}
"""The outcome of a label the schema accepted: none (-1), 0 or 1 (False and True hash as 0 and 1)."""


def _schema(model: ModelSpec, strict: bool = False) -> tuple[type[msgspec.Struct], dict[str, str]] | None:
    """A ``Struct`` type for the configured paths, and the attribute path of each role (``model``, ``id``, ``ts``,
    ``pred``, ``score``, ``label``, ``attr:<column>``) in it; None when the paths overlap in a way a Struct
    cannot hold (a field that is both a value and an object), where every event is walked. ``strict``: only this
    model's events, and only configured group names (or none) as attribute values; the same attribute paths."""
    f = model.events
    tables = {a.columns[0]: tuple(code_table(a.groups)[0]) for a in model.base_attributes}
    if strict and not all(tables.values()):
        return None
    # roles a schema-valid event must carry: the timestamp, the prediction (or the score it is derived from) and,
    # for the strict schema, this model's id
    required = {"ts", "pred"}
    if f.score_threshold is not None:
        required.add("score")
    if strict:
        required.add("model")
    roles: dict[str, tuple[Any, Any]] = {
        "model": (f.model_id, Literal[model.model_id] if strict else str | None),
        "id": (f.prediction_id, _Id | None), "ts": (f.timestamp, _Stamp),
        "score": (f.score, _Score if f.score_threshold is not None else _Score | None),
        "label": (f.label, _Binary | None),
    }  # fmt: skip
    if f.score_threshold is None:
        roles["pred"] = (f.prediction, _Binary)
    for a in model.base_attributes:
        groups = tables[a.columns[0]]
        roles[f"attr:{a.columns[0]}"] = (f"{f.attributes}.{a.columns[0]}",
                                         Literal[groups] | None if strict else str | None)
    tree: dict[str, Any] = {}
    for role, (path, _) in roles.items():
        *parents, leaf = path.split(".") if not role.startswith("attr:") else [*f.attributes.split("."),
                                                                                role[len("attr:"):]]
        node = tree
        for key in parents:
            child = node.setdefault(key, {})
            if not isinstance(child, dict):
                return None
            node = child
        if leaf in node:
            return None
        node[leaf] = role
    getters: dict[str, str] = {}
    counter = itertools.count()

    def build(node: dict[str, Any], prefix: str) -> tuple[type[msgspec.Struct], bool]:
        fields: list[tuple[str, Any] | tuple[str, Any, Any]] = []
        rename: dict[str, str] = {}
        has_required = False
        for key, child in node.items():
            name = f"f{next(counter)}"
            rename[name] = key
            if isinstance(child, dict):
                sub, sub_required = build(child, f"{prefix}{name}.")
                if sub_required:
                    fields.append((name, sub))
                    has_required = True
                else:  # missing: every value under it missing, as the walk reads it; null is walked
                    fields.append((name, sub, msgspec.field(default_factory=sub)))
            else:
                getters[child] = f"{prefix}{name}"
                kind = roles[child][1]
                if child in required:
                    fields.append((name, kind))
                    has_required = True
                else:
                    fields.append((name, kind, None))
        fields.sort(key=lambda x: len(x) == 3)  # required fields first
        # gc=False: the structs hold only strings, numbers and other such structs (no cycles), and thousands per batch
        # tracked by the collector cost more than their decoding
        return msgspec.defstruct(f"Event{next(counter)}", fields, rename=rename, gc=False), has_required

    struct, _ = build(tree, "")
    return struct, getters


@dataclass
class DecodedBatch:
    """Accepted events as columns, and what happened to the others."""

    timestamps: np.ndarray
    predictions: np.ndarray
    outcomes: np.ndarray
    """The inline ground truth (the event's label), -1 where the event carried none."""
    prediction_ids: list[Any]
    codes: dict[str, np.ndarray]
    """Per configured attribute (intersections included): the subgroup code of every accepted event."""
    rejected: Counter[str] = field(default_factory=Counter)
    ignored: Counter[str] = field(default_factory=Counter)
    """Events of no model of ours (another model's, or none), by reason (exporter.stream.route.IGNORE_REASONS)."""
    scores: np.ndarray = field(default_factory=lambda: np.zeros(0))
    """The score of every accepted event when the model emits scores (``events.score_threshold``), else empty."""
    rejected_payloads: list[tuple[bytes, str]] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.timestamps)


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
        self._tables = [(a.columns[0], *code_table(a.groups)) for a in model.base_attributes]
        schema = _schema(model)
        self._decoder: msgspec.json.Decoder[Any] | None = None
        if schema is not None:
            struct, paths = schema
            self._decoder = msgspec.json.Decoder(struct)
            self._get = {role: attrgetter(path) for role, path in paths.items()}
        strict = _schema(model, strict=True) if schema is not None else None
        self._strict = msgspec.json.Decoder(strict[0]) if strict is not None else None
        self._strict_rest = 0
        """Batches to skip the strict schema for, after one it refused."""

    def _structs(self, values: Sequence[bytes]) -> tuple[list[Any], list[int], list[int], Counter[str]]:
        """The schema's pass: (structs of this model's events, their input positions, positions to walk, events
        of no model of ours by reason). Newline-free values (the usual case) are decoded in one call, one event
        per line; a batch the schema refuses anywhere is decoded event by event to find which to walk."""
        decoder = self._decoder
        if decoder is None:
            return [], [], list(range(len(values))), Counter()
        get_model, model_id = self._get["model"], self.model.model_id
        try:
            joined: bytes | None = b"\n".join(values)
        except TypeError:  # a tombstone (None value)
            joined = None
        if joined is not None and not joined.isascii():
            try:  # msgspec does not check the UTF-8 of the fields it skips; orjson refuses the whole event
                joined.decode()
            except UnicodeDecodeError:
                joined = None
        if joined is not None and joined.count(b"\n") == len(values) - 1:
            if self._strict is not None and not self._strict_rest:
                # The usual batch: this model's events with configured group names only. Their strings come back
                # as the schema's own objects (no new string, hashed once) and no model needs comparing.
                try:
                    clean = self._strict.decode_lines(joined)
                    if len(clean) == len(values):
                        return clean, list(range(len(clean))), [], Counter()
                except (msgspec.ValidationError, msgspec.DecodeError):
                    pass
                self._strict_rest = STRICT_PAUSE  # a topic with other models or other values: not every batch
            elif self._strict_rest:
                self._strict_rest -= 1
            structs: list[Any] | None
            try:
                structs = decoder.decode_lines(joined)
            except (msgspec.ValidationError, msgspec.DecodeError):
                structs = None
            if structs is not None and len(structs) == len(values):  # else a blank value: lines skip those
                models = list(map(get_model, structs))
                if models.count(model_id) == len(structs):
                    return structs, list(range(len(structs))), [], Counter()
                at = [i for i, m in enumerate(models) if m == model_id]
                return [structs[i] for i in at], at, [], Counter(map(ignore_reason, (m for m in models
                                                                                     if m != model_id)))
        structs, at, walked = [], [], []
        ignored: Counter[str] = Counter()
        decode = decoder.decode
        for i, raw in enumerate(values):
            try:
                if not raw.isascii():
                    raw.decode()
                event = decode(raw)
            except (msgspec.ValidationError, msgspec.DecodeError, UnicodeDecodeError, AttributeError):
                walked.append(i)  # AttributeError: a tombstone
                continue
            found = get_model(event)
            if found != model_id:
                ignored[ignore_reason(found)] += 1
                continue
            structs.append(event)
            at.append(i)
        return structs, at, walked, ignored

    def decode(self, values: Sequence[bytes], now: float) -> DecodedBatch:
        """Decode a batch; ``now`` (epoch seconds) bounds how far in the future a timestamp may be."""
        latest = now + self.max_future_skew_seconds
        structs, at, walked, ignored = self._structs(values)
        g = self._get if self._decoder is not None else {}
        stamps = epochs(list(map(g["ts"], structs))) if structs else []
        if stamps.__class__ is list and None in stamps:  # an unparseable ISO string: the walk says which reason
            unparsed = {k for k, t in enumerate(stamps) if t is None}
            walked.extend(at[k] for k in unparsed)
            keep = [k for k in range(len(structs)) if k not in unparsed]
            structs, at, stamps = [structs[k] for k in keep], [at[k] for k in keep], [stamps[k] for k in keep]
        timestamps = np.asarray(stamps, dtype=np.float64)
        rejects: list[tuple[int, str]] = []
        future = timestamps > latest
        if future.any():  # the timestamp is valid and comes first among the rules: nothing else is asked
            rejects.extend((at[k], "future_timestamp") for k in np.flatnonzero(future).tolist())
            keep = np.flatnonzero(~future).tolist()
            structs, at, timestamps = [structs[k] for k in keep], [at[k] for k in keep], timestamps[~future]
        if structs:
            if self._threshold is not None:
                scores = np.fromiter(map(g["score"], structs), np.float64, len(structs))
                predictions = (scores >= self._threshold).astype(np.int64)
            else:
                predictions = np.fromiter(map(g["pred"], structs), np.int64, len(structs))
            outcomes = np.fromiter(map(_OUTCOME.__getitem__, map(g["label"], structs)), np.int64, len(structs))
            ids = list(map(g["id"], structs))
            codes = []
            for column, table, unknown in self._tables:
                # a fresh dict per batch: the values it learns (unknown ones) are bounded by the batch
                lookup: defaultdict[str | None, int] = defaultdict(lambda u=unknown: u)  # type: ignore[misc]
                lookup.update(table)
                lookup[None] = unknown  # a missing value: the unknown category, as the gate's blank cell
                codes.append(np.fromiter(map(lookup.__getitem__, map(g[f"attr:{column}"], structs)), np.int64,
                                         len(structs)))  # fmt: skip
        else:
            predictions = outcomes = np.zeros(0, dtype=np.int64)
            ids, codes = [], [np.zeros(0, dtype=np.int64) for _ in self._tables]
        if self._threshold is None or not structs:
            scores = np.zeros(0)

        if walked:
            rows: list[tuple[int, float, int, int, Any, list[int], float]] = []
            for i in sorted(walked):
                outcome = self._walk(values[i], latest)
                if outcome in IGNORE_REASONS:
                    ignored[outcome] += 1
                elif isinstance(outcome, str):
                    rejects.append((i, outcome))
                else:
                    rows.append((i, *outcome))
            if rows:  # merge the walked rows in input order, as every column's consumers expect
                at = at + [r[0] for r in rows]
                order = np.argsort(np.asarray(at), kind="stable")
                timestamps = np.concatenate([timestamps, [r[1] for r in rows]])[order]
                predictions = np.concatenate([predictions, np.array([r[2] for r in rows], dtype=np.int64)])[order]
                outcomes = np.concatenate([outcomes, np.array([r[3] for r in rows], dtype=np.int64)])[order]
                all_ids = ids + [r[4] for r in rows]
                ids = [all_ids[k] for k in order.tolist()]
                codes = [np.concatenate([c, np.array([r[5][k] for r in rows], dtype=np.int64)])[order]
                         for k, c in enumerate(codes)]  # fmt: skip
                if self._threshold is not None:
                    scores = np.concatenate([scores, [r[6] for r in rows]])[order]

        rejected: Counter[str] = Counter(reason for _, reason in rejects)
        bad = [(values[i], reason) for i, reason in sorted(rejects)] if self.keep_rejected else []
        base = {a.columns[0]: c for a, c in zip(self.model.base_attributes, codes, strict=True)}
        return DecodedBatch(
            timestamps=timestamps.astype(np.float64, copy=False),
            predictions=predictions.astype(np.int64, copy=False),
            outcomes=outcomes.astype(np.int64, copy=False),
            prediction_ids=ids,
            codes={a.name: attribute_codes(a, base) for a in self.model.attributes},
            rejected=rejected,
            ignored=ignored,
            rejected_payloads=bad,
            scores=scores.astype(np.float64, copy=False),
        )

    def _walk(self, raw: bytes, latest: float) -> str | tuple[float, int, int, Any, list[int], float]:
        """The rules, over the parsed JSON: why it is ignored (another model's, see IGNORE_REASONS), a rejection
        reason, or the event's row ``(timestamp, prediction, outcome, prediction id, base attribute codes, score or
        NaN)``."""
        try:
            event = orjson.loads(raw)
        except (orjson.JSONDecodeError, TypeError):  # TypeError: a tombstone (None value)
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
            pred = None if score is None else int(score >= self._threshold)
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
        return ts, int(pred), int(label), pid, codes, math.nan if score is None else float(score)
