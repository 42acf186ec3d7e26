"""The gate's side of ``attribute_sources``: the predictions' rows with their protected attributes joined by id
from a side table (a dataset: file, folder, glob or prefix), in the same streamed pass.

The side dataset is read once, a batch at a time, into the daemon's own table (exporter/core/side_table.py: the
latest row of an id wins, held as hashed ids and value codes), so memory follows the number of ids and never
their rows' width; each batch of predictions then looks its ids up and gains the attribute columns, as if they
had been columns of the predictions. Values stay in the process: errors name columns and counts, never a value.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa

from exporter.config import ModelSpec
from exporter.config.types import AttributeSource
from exporter.core.side_table import SideTable, id_hashes
from exporter.gate import storage
from exporter.gate.data import columns as col
from exporter.gate.data.dataset import BATCH_ROWS, DataError, read_batches
from exporter.gate.fairness.frames import Rows


def _ids(array: pa.Array) -> tuple[np.ndarray, np.ndarray]:
    """Each row's index into the column's distinct ids (-1: missing), and the hashes of those ids as text."""
    indices, values = col.distinct(array)
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
    try:
        for batch in read_batches(location, [source.id, *fields], what=f"side table ({where})",
                                  batch_rows=batch_rows, ids=[source.id]):  # fmt: skip
            indices, hashes = _ids(batch.column(source.id))
            named = indices >= 0
            codes = np.column_stack([table.encode_column(f, [None if col.is_missing(v) else v for v in values])[i]
                                     for f in fields for i, values in [col.distinct(batch.column(f))]])
            if not table.load(hashes[indices[named]], codes[named]):
                raise DataError(f"{location}: more than {source.max_records:,} ids ({where}: "
                                "attribute_sources.max_records)")  # fmt: skip
    except DataError as exc:
        raise DataError(f"{where}: {exc}") from exc
    return table


def read_tables(model: ModelSpec, batch_rows: int = BATCH_ROWS) -> dict[str, SideTable]:
    """The side table of every source the model's attributes name, with the fields they read from it."""
    sources = {s.name: s for s in model.attribute_sources}
    return {name: read_table(sources[name], [a.columns[0] for a in attributes], model.source, batch_rows)
            for name, attributes in model.sourced().items()}  # fmt: skip


@dataclass(frozen=True)
class JoinedRows:
    """Rows whose sourced attribute columns come from side tables, by the id column each source names."""

    rows: Rows
    model: ModelSpec
    tables: dict[str, SideTable]

    @classmethod
    def of(cls, model: ModelSpec, rows: Rows, name: str, batch_rows: int = BATCH_ROWS) -> Rows:
        """``rows`` joined to every side source the model's attributes name (the rows themselves when none);
        DataError when the rows lack a source's id column."""
        sourced = model.sourced()
        if not sourced:
            return rows
        for source in model.attribute_sources:
            if source.id not in rows.columns:
                raise DataError(f"{name}: no column {source.id!r}, the id attribute_sources.{source.name}.id joins "
                                f"by; the file has {rows.columns}")  # fmt: skip
        return cls(rows, model, read_tables(model, batch_rows))

    @property
    def columns(self) -> list[str]:
        return [*self.rows.columns, *(a.columns[0] for a in self.model.base_attributes if a.source is not None)]

    def batches(self, columns: Sequence[str], batch_rows: int = BATCH_ROWS) -> Iterator[pa.RecordBatch]:
        joined = {a.columns[0]: a.source for a in self.model.base_attributes if a.source is not None}
        ids = {s.name: s.id for s in self.model.attribute_sources}
        reading = list(dict.fromkeys([*(c for c in columns if c not in joined),
                                      *(ids[joined[c]] for c in columns if c in joined)]))
        for batch in self.rows.batches(reading, batch_rows):
            found = join_columns(self.model, self.tables, batch)
            yield pa.RecordBatch.from_arrays([found[c] if c in joined else batch.column(c) for c in columns],
                                             names=list(columns))  # fmt: skip


def join_columns(model: ModelSpec, tables: Mapping[str, SideTable], batch: pa.RecordBatch) -> dict[str, pa.Array]:
    """The model's sourced attribute columns for a batch that holds its sources' id columns: each row's value of
    its id's record (a dictionary array of the values' text; null for a missing id, an id without a record or a
    record without the field). The one join of the gate, ``backtest``'s tables and ``--engine spark``."""
    ids = {s.name: s.id for s in model.attribute_sources}
    found: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    out = {}
    for attribute in model.base_attributes:
        source = attribute.source
        if source is None:
            continue
        table = tables[source]
        if source not in found:
            indices, hashes = _ids(batch.column(ids[source]))
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
