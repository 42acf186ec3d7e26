"""Read recorded events for ``backtest``: JSON lines through the daemon's own router and decoders, or parquet/CSV
through the gate's encoding, split by model."""

from __future__ import annotations

import base64
import itertools
import math
from collections import Counter
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import orjson

from exporter.config import Config, ModelSpec
from exporter.core import bisg
from exporter.core.encoding import attribute_codes
from exporter.core.side_table import SideTable
from exporter.gate.data.files import GZIP, file_format
from exporter.stream.decode.events import DecodedBatch
from exporter.stream.payloads.payload import PairJoin, PayloadRows, Raw, components, payload_batches, read_halves
from exporter.stream.state.fleet import Fleet

if TYPE_CHECKING:
    import pyarrow as pa

JSONL_CHUNK = 100_000


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
    segments: dict[str, list[Any]] = field(default_factory=dict)
    """Each event's value of every segment column (``segments:``; None: missing), for the explanations."""


Batch = tuple[dict[str, Columns], int, int]
"""Each model's columns of a chunk of events, and the chunk's events of no model and that were no event at all."""


def _sides(config: Config, fleet: Fleet) -> None:
    """The side tables of ``attribute_sources`` read whole from their paths, by the gate's reader (loaded only
    then): each event then looks its id up as the daemon's join does, without waiting."""
    if not fleet.attributes:
        return
    from exporter.gate.data.dataset import DataError
    from exporter.gate.data.side import read_table

    for name, source in fleet.attributes.sources.items():
        try:
            fleet.attributes.tables[name] = read_table(source, fleet.attributes.fields[name], config.source)
        except DataError as exc:
            raise BacktestError(str(exc)) from exc


def _joined(fleet: Fleet, batches: dict[str, DecodedBatch]) -> dict[str, DecodedBatch]:
    """Each model's batch with its attributes joined from the side tables (the batch itself without any)."""
    if not fleet.attributes:
        return batches
    specs = {m.model_id: m for m in fleet.config.models}
    return {m: fleet.attributes.resolve(specs[m], b, Counter(), wait=False) for m, b in batches.items()}


def _jsonl(path: Path, fleet: Fleet) -> Iterator[Batch]:
    """JSON lines through the daemon's own decoding (no future-timestamp bound: the clock is the events')."""
    with path.open("rb") as f:
        while lines := list(itertools.islice(f, JSONL_CHUNK)):
            values = [line.rstrip(b"\r\n") for line in lines if not line.isspace()]  # lines: one parse per batch
            _, decoded, ignored, malformed = fleet.decode(values, math.inf)
            batches = _joined(fleet, decoded)
            own = {model_id: sum(batch.ignored.values()) for model_id, batch in decoded.items()}
            columns = {model_id: Columns(batch.timestamps, batch.predictions, batch.outcomes, batch.codes,
                                         decoded[model_id].rejected, own[model_id], batch.scores,
                                         batch.segments)
                       for model_id, batch in batches.items()}  # fmt: skip
            yield columns, sum(ignored.values()) - sum(own.values()), len(malformed)


def _table(location: str, models: Sequence[ModelSpec], tables: Mapping[str, SideTable]) -> Iterator[Batch]:
    """A parquet/CSV dataset (file, folder, glob or prefix) with the gate's columns (each event's time in
    ``columns.timestamp``, as the gate and Spark read it) plus model_id (no prediction_id: labels are inline), a
    record batch at a time through the gate's encoding; a model's attributes of ``attribute_sources`` joined by id
    from ``tables`` per batch, by the gate's join."""
    import pyarrow as pa  # parquet/CSV only: the daemon image replays JSON lines without pyarrow

    from exporter.gate.data import columns as col
    from exporter.gate.data.dataset import DataError, open_dataset
    from exporter.gate.fairness.frames import csv_text_columns, prediction_column

    try:
        dataset = open_dataset(location, "events", ["model_id", *(c for m in models for c in _read_from(m))],
                               [s.id for m in models for s in m.attribute_sources],
                               [c for m in models for c in csv_text_columns(m)])  # fmt: skip
        needed = {m.model_id: [m.timestamp_column, prediction_column(m), *_read_from(m), *m.counted_columns]
                  for m in models}  # fmt: skip
        for m, columns in [(None, ["model_id"]), *zip(models, needed.values(), strict=True)]:
            missing = [c for c in columns if c not in dataset.columns]
            if missing:
                time = " (columns.timestamp: each event's time)" if m and m.timestamp_column in missing else ""
                raise BacktestError(f"{location}: missing column(s) {missing}{time}; the file has "
                                    f"{dataset.columns}")  # fmt: skip
        labels = [m.label_column for m in models if m.label_column in dataset.columns]
        reading = list(dict.fromkeys(["model_id", *(c for cs in needed.values() for c in cs), *labels]))
        for batch in dataset.batches(reading):
            indices, ids = col.text(batch.column("model_id"))
            out = {}
            for m in models:
                mine = np.array([i == m.model_id for i in ids] + [False])[indices]  # per distinct id; -1: missing
                rows = batch if mine.all() else batch.filter(pa.array(mine))
                if m.attribute_sources:  # the gate's join (loaded only then)
                    from exporter.gate.data.side import join_columns

                    try:
                        for name, joined in join_columns(m, tables, rows).items():
                            rows = rows.append_column(name, joined)
                    except DataError as exc:
                        raise DataError(f"{location}: {exc}") from exc
                out[m.model_id] = _model_rows(location, m, rows, dataset.format == "csv")
            yield out, int(batch.num_rows - sum(len(c.timestamps) + c.rejected.total() for c in out.values())), 0
    except DataError as exc:
        raise BacktestError(str(exc)) from exc


def _read_from(model: ModelSpec) -> list[str]:
    """The columns a model's attributes are read from: the gate's, with the id column of each source in place of
    the attributes joined from it."""
    from exporter.gate.fairness.frames import attribute_columns

    joined = {a.columns[0] for a in model.base_attributes if a.source is not None}
    ids = {s.name: s.id for s in model.attribute_sources}
    return list(dict.fromkeys([*(c for c in attribute_columns(model) if c not in joined),
                               *(ids[name] for name in model.sourced())]))  # fmt: skip


def _model_rows(location: str, config: ModelSpec, batch: pa.RecordBatch, csv: bool) -> Columns:
    """One model's rows of a record batch as the window store counts them (``csv``: a CSV file's, its attribute
    columns the text as written, matched to the groups as the gate's scan matches them); a row without a time is
    rejected (``missing_field``), as the daemon rejects an event without one."""
    import pyarrow as pa

    from exporter.gate.data import columns as col
    from exporter.gate.fairness.frames import Checks, predictions, written_columns

    times = _seconds(location, batch, config.timestamp_column)
    dated = ~np.isnan(times)
    if not dated.all():
        batch, times = batch.filter(pa.array(dated)), times[dated]
    checks = Checks()
    y_pred, scores = predictions(config, batch, checks, 0, None)
    y_true = (col.binary(batch.column(config.label_column), checks.unlabelled, checks.label, 0)
              if config.label_column in batch.schema.names
              else np.full(batch.num_rows, -1, dtype=np.int64))  # fmt: skip
    checks.raise_first(config, location, batch.num_rows)
    # a value outside an attribute's groups (or a blank) is its unknown category (-1), as in the gate and the daemon
    written = written_columns(config) if csv else []
    base = {a.columns[0]: col.group_codes(batch.column(a.columns[0]), a.groups, a.other,
                                          written=a.columns[0] in written) if a.proxy is None else
            bisg.tables().codes(batch.column(a.proxy.surname).to_pylist(), batch.column(a.proxy.zcta).to_pylist())
            for a in config.base_attributes}  # fmt: skip
    codes = {a.name: attribute_codes(a, base) for a in config.attributes}
    segments = {c: [None if col.is_missing(v) else v for v in batch.column(c).to_pylist()]
                for c in config.counted_columns}  # fmt: skip
    return Columns(times, y_pred, y_true, codes, +Counter({"missing_field": int((~dated).sum())}),
                   scores=scores, segments=segments)  # fmt: skip


def _seconds(location: str, batch: pa.RecordBatch, column: str) -> np.ndarray:
    """Event times of the model's time column as epoch seconds, by the gate's reading of a file's times
    (:func:`columns.seconds`)."""
    from exporter.gate.data import columns as col

    times, bad = col.seconds(batch.column(column))
    if bad.any():
        raise BacktestError(f"{location}: column {column!r} (columns.timestamp) holds a cell that is neither epoch "
                            "seconds nor ISO-8601 text")  # fmt: skip
    return times


def _is_table(name: str) -> bool:
    """A parquet/CSV dataset rather than a file of JSON lines: by the gate's rule for a file's format (the suffix,
    or the one before ``.gz``), or a folder, glob or URL."""
    return file_format(name) is not None or Path(name).is_dir() or "*" in name or "://" in name


def _record(line: bytes) -> tuple[str, Raw]:
    """One record of a topic dump as ``kcat -C -J`` writes it (``topic``, ``ts`` in ms, ``headers`` as a flat
    [name, value, ...] list, ``key``, ``payload``), a binary value as ``payload_base64``."""
    record = orjson.loads(line)
    if record.__class__ is not dict:
        raise ValueError("not a record object")
    flat = record.get("headers") or []
    headers = [(str(flat[i]), None if flat[i + 1] is None else str(flat[i + 1]).encode())  # null: no value, as the
               for i in range(0, len(flat) - 1, 2)]  # daemon's client hands it over  # fmt: skip
    value = base64.b64decode(record["payload_base64"]) if "payload_base64" in record else (
        record["payload"].encode() if isinstance(record.get("payload"), str) else None)  # fmt: skip
    key = record.get("key")
    return str(record.get("topic", "")), (value, headers, key.encode() if isinstance(key, str) else None,
                                          int(record.get("ts", -1)))  # fmt: skip


def _payload_dump(path: Path, config: Config, fleet: Fleet) -> Iterator[Batch]:
    """A dump of a payload log's topic(s) (``events.format`` kserve or seldon), in the order recorded: the same
    reading of each record, pair join and rows as the daemon's (exporter/stream/payloads/payload.py); a record's
    Kafka timestamp is its arrival time in the join."""
    form, models = config.models[0].events.format, {m.model_id: m for m in config.models}
    join = PairJoin(config.models[0].events.pair_horizon, config.max_pending_labels)
    rows = {m: PayloadRows(spec, math.inf) for m, spec in models.items()}
    counted = components(config.models)
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
                read = read_halves(form, topic, [raw], models, config.kafka.response_topic, counted)
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
            columns = {m: Columns(b.timestamps, b.predictions, b.outcomes, b.codes, batches[m].rejected)
                       for m, b in _joined(fleet, batches).items()}  # fmt: skip
            if +refused:  # refused before they had rows: counted with the first model's columns
                first = config.models[0].model_id
                columns.setdefault(first, _empty(config.models[0])).rejected.update(+refused)
            yield columns, ignored, malformed


def _empty(spec: ModelSpec) -> Columns:
    none = np.zeros(0, dtype=np.int64)
    return Columns(np.zeros(0), none, none, {a.name: none for a in spec.attributes})


def read_events(paths: Sequence[str | Path], config: Config) -> Iterator[Batch]:
    """The events of every input, in order, split by model: JSON lines (our events, or a dump of a payload log's
    topic with ``events.format`` kserve or seldon), or parquet/CSV datasets (a file, folder, glob or prefix)."""
    fleet = Fleet(config)
    _sides(config, fleet)
    payloads = bool(config.models) and config.models[0].events.format != "json"
    for name in paths:
        if _is_table(str(name)):
            yield from _table(str(name), config.models, fleet.attributes.tables)
            continue
        path = Path(name)
        if not path.is_file():
            raise BacktestError(f"{path}: no such events file")
        if path.suffix.lower() == GZIP:  # JSON lines are read as they are: gzipped ones would be malformed lines
            raise BacktestError(f"{path}: a gzipped file is read only as CSV (.csv.gz, .txt.gz); gunzip JSON lines "
                                "first")  # fmt: skip
        yield from (_payload_dump(path, config, fleet) if payloads else _jsonl(path, fleet))


def reference(model: ModelSpec) -> dict[str, np.ndarray] | None:
    """The model's estimation reference, read as the gate and the daemon read it; None when it estimates nothing."""
    if model.estimation is None:
        return None
    from exporter.gate.fairness.audit import read_reference

    try:
        return read_reference(model)[0]
    except ValueError as exc:
        raise BacktestError(f"{model.source}: estimation.reference: {exc}") from exc
