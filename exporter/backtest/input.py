"""Read recorded events for ``backtest``: JSON lines through the daemon's own router and decoders, or parquet/CSV
through the gate's encoding, split by model."""

from __future__ import annotations

import itertools
import math
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from exporter.config import Config, ModelSpec
from exporter.core.encoding import attribute_codes
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


def read_events(paths: Sequence[str | Path], config: Config) -> Iterator[Batch]:
    """The events of every file, in order, split by model: JSON lines, or parquet/CSV by suffix."""
    fleet = Fleet(config)
    for name in paths:
        path = Path(name)
        if not path.is_file():
            raise BacktestError(f"{path}: no such events file")
        yield from (_table(path, config.models) if path.suffix.lower() in TABLE_SUFFIXES else _jsonl(path, fleet))
