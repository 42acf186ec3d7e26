"""Read recorded events for ``backtest``: JSON lines through the daemon's own router and decoders, or parquet/CSV
through the gate's encoding, split by model."""

from __future__ import annotations

import base64
import itertools
import math
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import orjson

from exporter.config import Config, ModelSpec
from exporter.core.encoding import attribute_codes
from exporter.stream.decode.payload import PairJoin, PayloadRows, Raw, payload_batches, read_halves
from exporter.stream.state.fleet import Fleet

JSONL_CHUNK = 100_000
TABLE_SUFFIXES = (".parquet", ".pq", ".csv")


class BacktestError(ValueError):
    """An events file cannot be replayed; the message names the file and what is wrong."""


@dataclass
class Columns:
    """A batch of accepted events as the window store counts them."""

    timestamps: np.ndarray
    predictions: np.ndarray
    labels: np.ndarray
    codes: dict[str, np.ndarray]
    rejected: Counter[str] = field(default_factory=Counter)
    """Events not replayed, by reason: the decoder's, or a table's value outside its column's groups."""
    ignored: int = 0
    scores: np.ndarray | None = None
    """Each event's score, for a model that emits scores (its histograms and estimation counts)."""


Batch = tuple[dict[str, Columns], int, int]
"""Each model's columns of a chunk of events, and the chunk's events of no model and that were no event at all."""


def _jsonl(path: Path, fleet: Fleet) -> Iterator[Batch]:
    """JSON lines through the daemon's own decoding (no future-timestamp bound: the clock is the events')."""
    with path.open("rb") as f:
        while lines := list(itertools.islice(f, JSONL_CHUNK)):
            values = [line.rstrip(b"\r\n") for line in lines if not line.isspace()]  # lines: one parse per batch
            _, batches, ignored, malformed = fleet.decode(values, math.inf)
            own = {model_id: sum(batch.ignored.values()) for model_id, batch in batches.items()}
            columns = {model_id: Columns(batch.timestamps, batch.predictions, batch.outcomes, batch.codes,
                                         batch.rejected, own[model_id], batch.scores)
                       for model_id, batch in batches.items()}  # fmt: skip
            yield columns, sum(ignored.values()) - sum(own.values()), len(malformed)


def _table(path: Path, models: Sequence[ModelSpec]) -> Iterator[Batch]:
    """A parquet/CSV file with the gate's columns plus timestamp, model_id and prediction_id (gate encoding)."""
    from exporter.gate.fairness.audit import DataError, model_ids, read_predictions

    try:
        frame = read_predictions(path)
    except DataError as exc:
        raise BacktestError(str(exc)) from exc
    if "model_id" not in frame.columns:
        raise BacktestError(f"{path}: missing column(s) ['model_id']; the file has {list(frame.columns)}")
    ids = model_ids(frame)
    columns = {m.model_id: _model_rows(path, m, frame[(ids == m.model_id).to_numpy()]) for m in models}
    yield columns, int((~ids.isin([m.model_id for m in models])).sum()), 0


def _model_rows(path: Path, config: ModelSpec, frame: Any) -> Columns:
    """One model's rows of a parquet/CSV file as the window store counts them."""
    import pandas as pd

    from exporter.gate.fairness.audit import DataError, binary_column, predicted, prediction_column, scores_of
    from exporter.gate.fairness.frames import encode

    required = ["timestamp", prediction_column(config), *(a.columns[0] for a in config.base_attributes)]
    missing = [c for c in required if c not in frame.columns]
    if missing:
        raise BacktestError(f"{path}: missing column(s) {missing}; the file has {list(frame.columns)}")
    stamps = frame["timestamp"]
    if pd.api.types.is_numeric_dtype(stamps):
        seconds = stamps.to_numpy(dtype=np.float64)
    else:
        try:
            parsed = pd.to_datetime(stamps, utc=True, format="ISO8601")
            seconds = parsed.dt.as_unit("ns").astype("int64").to_numpy() / 1e9  # any resolution, exact division
        except (ValueError, TypeError) as exc:
            raise BacktestError(f"{path}: column 'timestamp' is neither epoch seconds nor ISO-8601: {exc}") from exc
    try:
        y_pred = predicted(frame, config, path)
        scores = scores_of(frame, config, path) if config.events.score_threshold is not None else None
        y_true = (binary_column(frame, config.label_column, path, allow_missing=True)
                  if config.label_column in frame.columns else np.full(len(frame), -1, dtype=np.int64))  # fmt: skip
    except DataError as exc:
        raise BacktestError(str(exc)) from exc
    # a value outside an attribute's groups (or a blank) is its unknown category (-1), as in the gate and the daemon
    base = {a.columns[0]: encode(frame[a.columns[0]], a.groups) for a in config.base_attributes}
    codes = {a.name: attribute_codes(a, base) for a in config.attributes}
    return Columns(seconds, y_pred, y_true, codes, scores=scores)


def _record(line: bytes) -> tuple[str, Raw]:
    """One record of a topic dump as ``kcat -C -J`` writes it (``topic``, ``ts`` in ms, ``headers`` as a flat
    [name, value, ...] list, ``key``, ``payload``), a binary value as ``payload_base64``."""
    record = orjson.loads(line)
    if record.__class__ is not dict:
        raise ValueError("not a record object")
    flat = record.get("headers") or []
    headers = [(str(flat[i]), str(flat[i + 1]).encode()) for i in range(0, len(flat) - 1, 2)]
    value = base64.b64decode(record["payload_base64"]) if "payload_base64" in record else (
        record["payload"].encode() if isinstance(record.get("payload"), str) else None)  # fmt: skip
    key = record.get("key")
    return str(record.get("topic", "")), (value, headers, key.encode() if isinstance(key, str) else None,
                                          int(record.get("ts", -1)))  # fmt: skip


def _payload_dump(path: Path, config: Config) -> Iterator[Batch]:
    """A dump of a payload log's topic(s) (``events.format`` kserve or seldon), in the order recorded: the same
    reading of each record, pair join and rows as the daemon's (exporter/stream/decode/payload.py); a record's
    Kafka timestamp is its arrival time in the join."""
    form, models = config.models[0].events.format, {m.model_id: m for m in config.models}
    join = PairJoin(config.models[0].events.pair_horizon, config.max_pending_labels)
    rows = {m: PayloadRows(spec, math.inf) for m, spec in models.items()}
    with path.open("rb") as f:
        while lines := list(itertools.islice(f, JSONL_CHUNK)):
            unmatched: Counter[str] = Counter()
            pairs: dict[str, list] = {}
            refused: Counter[str] = Counter()
            ignored = malformed = 0
            for line in lines:
                if line.isspace():
                    continue
                try:
                    topic, raw = _record(line)
                except (ValueError, KeyError, TypeError):  # orjson.JSONDecodeError is a ValueError
                    malformed += 1
                    continue
                read = read_halves(form, topic, [raw], models)
                ignored += sum(read.ignored.values())
                arrival = raw[3] / 1000
                for _, reason, model, pid in read.rejected:
                    refused[reason] += 1
                    if model is not None and pid is not None:
                        join.refuse(model, pid, arrival, unmatched)
                for half in read.halves:
                    pair = join.add(half, arrival, unmatched)
                    if pair is not None:
                        pairs.setdefault(half.model, []).append(pair)  # type: ignore[arg-type]  # a model's
                refused["response_without_request"] += len(join.expire(arrival, unmatched))
            batches, _ = payload_batches(pairs, rows, math.inf)
            columns = {m: Columns(b.timestamps, b.predictions, b.outcomes, b.codes, b.rejected)
                       for m, b in batches.items()}  # fmt: skip
            if +refused:  # refused before they had rows: counted with the first model's columns
                first = config.models[0].model_id
                columns.setdefault(first, _empty(config.models[0])).rejected.update(+refused)
            yield columns, ignored, malformed


def _empty(spec: ModelSpec) -> Columns:
    none = np.zeros(0, dtype=np.int64)
    return Columns(np.zeros(0), none, none, {a.name: none for a in spec.attributes})


def read_events(paths: Sequence[str | Path], config: Config) -> Iterator[Batch]:
    """The events of every file, in order, split by model: JSON lines (our events, or a dump of a payload log's
    topic with ``events.format`` kserve or seldon), or parquet/CSV by suffix."""
    fleet = Fleet(config)
    payloads = bool(config.models) and config.models[0].events.format != "json"
    for name in paths:
        path = Path(name)
        if not path.is_file():
            raise BacktestError(f"{path}: no such events file")
        if path.suffix.lower() in TABLE_SUFFIXES:
            yield from _table(path, config.models)
        else:
            yield from (_payload_dump(path, config) if payloads else _jsonl(path, fleet))
