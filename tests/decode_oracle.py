"""The pre-msgspec event decoder, kept as a test oracle: the shipped decoder must give the same batch, the same
rejection reasons and the same dead letters on every input (tests/test_decode_oracle.py). It changes only with
the rules themselves (issue 20: booleans count as 0/1; an attribute value is read as the gate reads a cell: a whole
float as the integer, a missing one as the unknown category even when a group is named "None"; a number beyond
a float, valid JSON that orjson refuses, makes the event malformed only in a field the rules read)."""

from __future__ import annotations

import json
import math
import sys
from collections import Counter
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from typing import Any, TypeGuard

import numpy as np
import orjson

from exporter.config import Config
from exporter.core.encoding import attribute_codes, code_table, value_text
from exporter.stream.decode.events import MAX_PREDICTION_ID_LENGTH, DecodedBatch
from exporter.stream.decode.route import NO_MODEL_ID, UNCONFIGURED

YEAR_1 = datetime(1, 1, 1, tzinfo=UTC).timestamp()
YEAR_10000 = 253_402_300_800
"""Epoch seconds are a timestamp only within the years an ISO 8601 string can name (1 to 9999): below the first
second of year 10000."""


def _valid_id(pid: object) -> bool:
    """A prediction id the ground-truth join can hold: None (no join), an int, or a string of bounded length."""
    return pid is None or pid.__class__ is int or (pid.__class__ is str and len(pid) <= MAX_PREDICTION_ID_LENGTH)


def _binary(value: object) -> TypeGuard[int | float]:
    """0 or 1 (a float 0.0/1.0 too, and a boolean: true is 1, false is 0 — issue 20), never a string."""
    return value.__class__ is not str and value in (0, 1)


def _flattener(paths: Sequence[str]) -> Callable[[dict[str, Any]], dict[str, Any]] | None:
    """For configured dotted paths, a function that lifts them into a flat dict keyed by the paths themselves,
    so the decoder's hot loop is the same plain ``event.get(path)`` for flat and nested events. None when every
    path is a top-level key (the default), where no copy is needed."""
    nested = [(p, p.split(".")) for p in paths if "." in p]
    if not nested:
        return None

    def flatten(event: dict[str, Any]) -> dict[str, Any]:
        flat = dict(event)
        for path, keys in nested:
            value: Any = event
            for key in keys:
                value = value.get(key) if value.__class__ is dict else None
            flat[path] = value
        return flat

    return flatten


BIG = object()
"""A number beyond a float (``1e400``, a 400-digit integer), where the event holds one."""


def _tolerant(raw: bytes, error: orjson.JSONDecodeError) -> Any:
    """A body orjson refused only for numbers beyond a float, parsed by Python's json with each such number as
    :data:`BIG` and the others as orjson reads them (an integer beyond 64 bits as a float); None when refused."""
    if error.msg != "number is infinity when parsed as double":
        return None

    def number(text: str) -> Any:
        return BIG if math.isinf(value := float(text)) else value

    def integer(text: str) -> Any:
        if len(text.lstrip("-")) > 309:  # beyond a float (and Python's limit on the digits of an int)
            return BIG
        value = int(text)
        return value if -(2**63) <= value < 2**64 else number(text)

    def constant(text: str) -> Any:
        raise ValueError(text)  # NaN, Infinity: not JSON

    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(max(limit, 5 * MAX_DEPTH))  # json recurses a level a container: orjson reads 1024
    try:
        event = json.loads(raw, parse_float=number, parse_int=integer, parse_constant=constant)
    except (ValueError, RecursionError):
        return None
    finally:
        sys.setrecursionlimit(limit)
    return event if _json_as_orjson_reads_it(event) else None


MAX_DEPTH = 1024
"""The containers orjson reads nested (a body nested deeper is refused)."""


def _json_as_orjson_reads_it(event: Any) -> bool:
    """Whether orjson would read what Python's json read: nested no deeper than :data:`MAX_DEPTH`, and no lone
    surrogate (an escape such as ``\\ud800``, which Python's json reads and orjson refuses) in a key or a string."""
    todo = [(event, 0)]
    while todo:
        node, depth = todo.pop()
        if isinstance(node, dict | list):
            if depth == MAX_DEPTH:
                return False
            children = [*node, *node.values()] if isinstance(node, dict) else node
            todo.extend((child, depth + 1) for child in children)
        elif isinstance(node, str):
            try:
                node.encode()
            except UnicodeEncodeError:
                return False
    return True


def _at(event: Any, path: str) -> Any:
    for key in path.split("."):
        event = event.get(key) if isinstance(event, dict) else None
    return event


def _holds_big(event: Any, path: str, whole: bool) -> bool:
    """Whether a step of ``path`` is :data:`BIG`, or its value is (``whole``: or holds one at any depth)."""
    for key in path.split("."):
        if event is BIG:
            return True
        event = event.get(key) if isinstance(event, dict) else None
    if not whole:
        return event is BIG
    todo = [event]
    while todo:
        node = todo.pop()
        if node is BIG:
            return True
        todo.extend(node.values() if isinstance(node, dict) else node if isinstance(node, list) else ())
    return False


class OracleDecoder:
    """Turns raw Kafka message values into a :class:`DecodedBatch` for one configured model."""

    def __init__(self, full: Config, keep_rejected: bool = False) -> None:
        config = full.model()
        self.config = config
        self.max_future_skew_seconds = full.max_future_skew_seconds
        self.keep_rejected = keep_rejected
        f = config.events
        self._paths = (f.model_id, f.prediction_id, f.timestamp, f.prediction, f.score, f.label, f.attributes)
        self._flatten = _flattener(self._paths)
        self._threshold = f.score_threshold
        self._tables = [(a.columns[0], *code_table(a.groups, a.other)) for a in config.base_attributes]
        read = [f.prediction_id, f.timestamp, f.score, f.label, *([f.prediction] if f.score_threshold is None else [])]
        self._read = [*((p, True) for p in read), (f.attributes, False),
                      *((f"{f.attributes}.{column}", True) for column, *_ in self._tables)]  # fmt: skip
        """The fields the rules read (of this model's events), and whether all of each value is read."""

    def decode(self, values: Sequence[bytes], now: float) -> DecodedBatch:
        """Decode a batch; ``now`` (epoch seconds) bounds how far in the future a timestamp may be.

        The loop is written for speed (it is most of the daemon's CPU after kafka-python): exact-type checks
        (orjson only produces exact types), locals instead of attributes, group codes by dict lookup.
        """
        k_model, k_id, k_ts, k_pred, k_score, k_label, k_attrs = self._paths
        flatten, threshold, tables = self._flatten, self._threshold, self._tables
        keep_rejected, model_id = self.keep_rejected, self.config.model_id
        latest = now + self.max_future_skew_seconds
        loads, bad_json, fromiso, isfinite = orjson.loads, orjson.JSONDecodeError, datetime.fromisoformat, math.isfinite
        rejected: Counter[str] = Counter()
        bad: list[tuple[bytes, str]] = []
        ignored: Counter[str] = Counter()
        ts_out: list[float] = []
        pred_out: list[int] = []
        label_out: list[int] = []
        ids: list[Any] = []
        code_columns: list[list[int]] = [[] for _ in tables]  # -1: outside the groups or missing (unknown)

        for raw in values:
            try:
                event = loads(raw)
            except bad_json as error:
                event = _tolerant(raw, error)
                if isinstance(event, dict) and (_holds_big(event, k_model, True) or (
                        _at(event, k_model) == model_id and any(_holds_big(event, p, w) for p, w in self._read))):
                    event = None  # such a number in a field read: malformed
            except TypeError:  # a tombstone (None value)
                event = None
            reason: str | None = "malformed_json"
            if event.__class__ is dict:
                if flatten is not None:
                    event = flatten(event)
                get = event.get
                if get(k_model) != model_id:
                    ignored[UNCONFIGURED if isinstance(get(k_model), str) else NO_MODEL_ID] += 1
                    continue
                reason = None
                t = get(k_ts)
                ts: Any = None
                pred: Any  # pred, label and codes are set whenever reason stays None
                if t.__class__ is str:
                    try:
                        d = fromiso(t)
                        ts = (d if d.tzinfo is not None else d.replace(tzinfo=UTC)).timestamp()
                    except ValueError:
                        pass
                elif t.__class__ is float or t.__class__ is int:
                    ts = float(t) if isfinite(t) and YEAR_1 <= t < YEAR_10000 else None
                score = get(k_score)
                if ts is None:
                    reason = "missing_field" if t is None else "invalid_timestamp"
                elif ts > latest:
                    reason = "future_timestamp"
                elif score is not None and ((score.__class__ is not float and score.__class__ is not int)
                                            or not 0.0 <= score <= 1.0):  # fmt: skip
                    reason = "invalid_score"
                elif threshold is not None:
                    pred = None if score is None else int(score >= threshold)
                else:
                    pred = get(k_pred)
                    if pred is not None and not _binary(pred):
                        reason = "invalid_prediction"
                if reason is None and pred is None:
                    reason = "missing_field"
                if reason is None:
                    label = get(k_label)
                    if label is None:
                        label = -1
                    elif not _binary(label):
                        reason = "invalid_label"
                if reason is None:
                    pid = get(k_id)
                    if not _valid_id(pid):
                        reason = "invalid_prediction_id"
                if reason is None:
                    attrs = get(k_attrs)
                    if attrs is None:
                        attrs = {}  # every attribute missing: unknown for each, still counted overall
                    codes = []
                    if attrs.__class__ is not dict:
                        reason = "missing_field"
                    else:
                        for column, table, unknown in tables:
                            v = attrs.get(column)
                            code = None if v is None else table.get(v if v.__class__ is str else value_text(v))
                            codes.append(unknown if code is None else code)
                if reason is None:
                    ts_out.append(ts)
                    pred_out.append(int(pred))
                    label_out.append(int(label))
                    ids.append(pid)
                    for codes_of, code in zip(code_columns, codes, strict=True):
                        codes_of.append(code)
                    continue
            assert reason is not None
            rejected[reason] += 1
            if keep_rejected:
                bad.append((raw, reason))

        base = {a.columns[0]: np.array(c, dtype=np.int64) for a, c in zip(self.config.base_attributes, code_columns,
                                                                          strict=True)}  # fmt: skip
        return DecodedBatch(
            timestamps=np.asarray(ts_out, dtype=np.float64),
            predictions=np.asarray(pred_out, dtype=np.int64),
            outcomes=np.asarray(label_out, dtype=np.int64),
            prediction_ids=ids,
            codes={a.name: attribute_codes(a, base) for a in self.config.attributes},
            rejected=rejected,
            ignored=ignored,
            rejected_payloads=bad,
        )
