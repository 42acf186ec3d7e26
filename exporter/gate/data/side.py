"""The gate's side of ``attribute_sources``: the predictions' rows with their protected attributes joined by id
from a side table (a dataset: file, folder, glob or prefix), in the same streamed pass.

The side dataset is read once, a batch at a time, into the daemon's own table (exporter/core/side_table.py: the
latest row of an id wins, held as hashed ids and value codes), so memory follows the number of ids and never
their rows' width; each batch of predictions then looks its ids up and gains the attribute columns, as if they
had been columns of the predictions. With a time column (``attribute_sources.<name>.timestamp``) each row is a
version in force from its time, as a record from its Kafka timestamp in the daemon's topic, and each prediction
meets the version in force at its own time, as in the daemon; without one, the latest row of an id is in force
always (a snapshot). Values stay in the process: errors name columns and counts, never a value.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa

from exporter.config import ModelSpec
from exporter.config.types import AttributeSource
from exporter.core.side_table import MAX_VALUES, SideTable, id_hashes
from exporter.gate import storage
from exporter.gate.data import columns as col
from exporter.gate.data.dataset import BATCH_ROWS, DataError, read_batches
from exporter.gate.fairness.frames import Rows


def _ids(array: pa.Array, column: str) -> tuple[np.ndarray, np.ndarray]:
    """Each row's index into the column's distinct ids (-1: missing), and the hashes of those ids as text (a binary
    column's as its UTF-8 text, the daemon's key)."""
    try:
        indices, values = col.distinct(array)
    except DataError as exc:
        raise DataError(f"column {column!r} (an id): {exc}") from exc
    texts = ["" if col.is_missing(v) else v if isinstance(v, str) else col.value_text(v) for v in values]
    return indices, id_hashes(texts)


def read_table(source: AttributeSource, fields: Sequence[str], config_source: str,
               batch_rows: int = BATCH_ROWS) -> SideTable:  # fmt: skip
    """One source's dataset as a side table of ``fields`` (a relative path is the config file's neighbour)."""
    where = f"attribute_sources.{source.name}.path"
    if source.path is None:
        raise DataError(f"{config_source}: {where}: required by the gate and backtest (a dataset with the "
                        f"{source.id!r} column); a topic is read by the daemon only")  # fmt: skip
    location = storage.resolve(source.path, Path(config_source.split("#")[0]).parent)
    table = SideTable(fields, source.max_records)
    stamp = source.timestamp_column
    past: Counter[str] = Counter()
    offset = 0
    try:
        for batch in read_batches(location, [source.id, *fields, *([stamp] if stamp else [])],
                                  what=f"side table ({where})", batch_rows=batch_rows, ids=[source.id],
                                  private=True):  # fmt: skip
            try:
                indices, hashes = _ids(batch.column(source.id), source.id)
                codes = np.column_stack([_codes(table, f, batch.column(f), past) for f in fields])
            except DataError as exc:  # bytes that are no UTF-8 text
                raise DataError(f"{location}: {exc}") from exc
            named = indices >= 0
            times = None if stamp is None else _record_times(batch.column(stamp), source, location, offset)[named]
            if not table.load(hashes[indices[named]], codes[named], times):
                raise DataError(f"{location}: more than {source.max_records:,} ids ({where}: "
                                "attribute_sources.max_records)")  # fmt: skip
            offset += batch.num_rows
        if past:
            raise DataError(f"{location}: " + ", ".join(f"field {f!r} has {n:,} rows past its first {MAX_VALUES:,} "
                                                         "distinct values" for f, n in past.items())
                            + f"; a side field holds at most {MAX_VALUES:,} (the daemon reads the rest as missing, "
                            "counted too_many_values): map its spellings to the groups' values")  # fmt: skip
    except DataError as exc:
        raise DataError(f"{where}: {exc}") from exc
    return table


def _codes(table: SideTable, field: str, array: pa.Array, past: Counter[str]) -> np.ndarray:
    """Each row's code of a field; ``past``: the rows whose value is beyond the field's cap (:data:`MAX_VALUES`),
    which the table reads as missing. The gate refuses a table with such rows (as one past ``max_records``), so that
    an audit never reads a value as missing in silence."""
    try:
        indices, values = col.distinct(array)
    except DataError as exc:
        raise DataError(f"column {field!r}: {exc}") from exc
    problems: dict[str, int] = {}
    lut = table.encode_column(field, [None if col.is_missing(v) else v for v in values], problems)
    if problems:
        known = np.array([not col.is_missing(v) for v in values] + [False])  # index -1: a missing cell
        past[field] += int(((lut == 0) & known)[indices].sum())
    return lut[indices]


LAST_SECOND = 2**32 - 1
"""The last second a record can be in force from (the table holds it in 32 bits: 2106-02-07)."""


def _record_times(array: pa.Array, source: AttributeSource, location: str, offset: int) -> np.ndarray:
    """Each side row's time (epoch seconds); DataError naming the first row without one: a version never read as
    "always" or dropped, since either would join predictions to a value the daemon never gave them."""
    times, bad = col.seconds(array)
    wrong = bad | ~((times >= 0) & (times <= LAST_SECOND))  # NaN: missing
    if wrong.any():
        row = int(np.argmax(wrong))
        what = ("is neither epoch seconds nor ISO 8601 text" if bad[row] else "is empty" if np.isnan(times[row])
                else "is outside 1970-01-01 to 2106-02-07, the seconds a record's time can name")  # fmt: skip
        raise DataError(f"{location}: row {offset + row} of column {source.timestamp_column!r} "
                        f"(attribute_sources.{source.name}.timestamp) {what}; each row needs the time it is in "
                        "force from")  # fmt: skip
    return times


def read_tables(model: ModelSpec, batch_rows: int = BATCH_ROWS) -> dict[str, SideTable]:
    """The side table of every source the model's attributes name, with the fields they read from it."""
    sources = {s.name: s for s in model.attribute_sources}
    return {name: read_table(sources[name], [a.columns[0] for a in attributes], model.source, batch_rows)
            for name, attributes in model.sourced().items()}  # fmt: skip


def check_columns(model: ModelSpec, columns: Sequence[str], name: str) -> None:
    """DataError unless the predictions hold what the join reads: each source's id column, and each row's time
    for a source with versions."""
    for source in model.attribute_sources:
        if source.id not in columns:
            raise DataError(f"{name}: no column {source.id!r}, the id attribute_sources.{source.name}.id joins by; the "
                            f"file has {list(columns)}")  # fmt: skip
        if source.timestamp_column is not None and model.timestamp_column not in columns:
            raise DataError(f"{name}: no column {model.timestamp_column!r} (columns.timestamp), each row's time "
                            f"that attribute_sources.{source.name}.timestamp joins at; the file has "
                            f"{list(columns)}")  # fmt: skip


@dataclass(frozen=True)
class JoinedRows:
    """Rows whose sourced attribute columns come from side tables, by the id column each source names."""

    rows: Rows
    model: ModelSpec
    tables: dict[str, SideTable]
    name: str = "<predictions>"
    """The rows' file, named by a refusal of a row's time."""

    @classmethod
    def of(cls, model: ModelSpec, rows: Rows, name: str, batch_rows: int = BATCH_ROWS) -> Rows:
        """``rows`` joined to every side source the model's attributes name (the rows themselves when none);
        DataError when the rows lack a source's id column."""
        sourced = model.sourced()
        if not sourced:
            return rows
        check_columns(model, rows.columns, name)
        return cls(rows, model, read_tables(model, batch_rows), name)

    @property
    def columns(self) -> list[str]:
        return [*self.rows.columns, *(a.columns[0] for a in self.model.base_attributes if a.source is not None)]

    def batches(self, columns: Sequence[str], batch_rows: int = BATCH_ROWS) -> Iterator[pa.RecordBatch]:
        joined = {a.columns[0]: a.source for a in self.model.base_attributes if a.source is not None}
        ids = {s.name: s.id for s in self.model.attribute_sources}
        timed = [self.model.timestamp_column] if versioned(self.model) else []
        reading = list(dict.fromkeys([*(c for c in columns if c not in joined),
                                      *(ids[joined[c]] for c in columns if c in joined), *timed]))  # fmt: skip
        for batch in self.rows.batches(reading, batch_rows):
            try:
                found = join_columns(self.model, self.tables, batch)
            except DataError as exc:
                raise DataError(f"{self.name}: {exc}") from exc
            yield pa.RecordBatch.from_arrays([found[c] if c in joined else batch.column(c) for c in columns],
                                             names=list(columns))  # fmt: skip


def versioned(model: ModelSpec) -> bool:
    """Whether a side source the model's attributes read has versions (a time column): its join needs each
    prediction's time."""
    sourced = model.sourced()
    return any(s.timestamp_column is not None for s in model.attribute_sources if s.name in sourced)


def join_columns(model: ModelSpec, tables: Mapping[str, SideTable], batch: pa.RecordBatch) -> dict[str, pa.Array]:
    """The model's sourced attribute columns for a batch that holds its sources' id columns: each row's value of
    its id's record (a dictionary array of the values' text; null for a missing id, an id without a record or a
    record without the field). A source with versions is looked up at each row's time, in the model's
    ``columns.timestamp``, as the daemon looks a prediction up at its event time, within the source's horizon.
    The one join of the gate, ``backtest``'s tables and ``--engine spark``."""
    ids = {s.name: s.id for s in model.attribute_sources}
    sources = {s.name: s for s in model.attribute_sources}
    times = _event_times(batch, model.timestamp_column) if versioned(model) else None
    found: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    out = {}
    for attribute in model.base_attributes:
        source = attribute.source
        if source is None:
            continue
        table = tables[source]
        if source not in found:
            indices, hashes = _ids(batch.column(ids[source]), ids[source])
            if times is not None and sources[source].timestamp_column is not None:  # each row at its own time
                held, codes, _ = table.get(np.append(hashes, np.uint64(0))[indices], times,
                                           sources[source].horizon_seconds)  # fmt: skip
                held &= indices >= 0  # a missing id joins nothing
                indices = np.arange(len(indices))
            else:
                held, codes, _ = table.get(hashes)
            held = np.append(held, False)  # index -1, a missing id, joins nothing
            codes = np.vstack([codes, np.zeros((1, len(table.fields)), dtype=codes.dtype)])
            found[source] = (held[indices], codes[indices])
        held_rows, codes = found[source]
        k = table.fields.index(attribute.columns[0])
        values = codes[:, k].astype(np.int32) - 1
        out[attribute.columns[0]] = pa.DictionaryArray.from_arrays(pa.array(values, mask=~held_rows | (values < 0)),
                                                                   pa.array(table.values[k], type=pa.string()))
    return out


def _event_times(batch: pa.RecordBatch, column: str) -> np.ndarray:
    """Each prediction's time for a versioned join: epoch seconds as the file's times are read; a row without one
    meets the latest version (+inf), as without versions; DataError for a cell that holds no time."""
    times, bad = col.seconds(batch.column(column))
    if bad.any():
        raise DataError(f"column {column!r} (each row's time, which attribute_sources' timestamp joins at) holds a "
                        "cell that is neither epoch seconds nor ISO 8601 text")  # fmt: skip
    return np.where(np.isnan(times), np.inf, times)
