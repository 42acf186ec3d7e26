"""The local engine's counts of a parquet dataset on this machine, by DuckDB where that is the faster way.

Measured (``python -m bench --only anysize``, docs/sre/performance.md): for 10^7 rows in ten files, DuckDB's one
``GROUP BY`` over the columns the gate reads took 0.23-0.42 s in the gate's process, where the gate's own pass
(pyarrow batches, codes, bincounts) took 0.84 s, 0.38 s of it decoding parquet alone; DuckDB reading through
pyarrow's dataset took 0.72 s, no gain, so DuckDB reads the files itself. The aggregation is the Spark engine's
(:mod:`exporter.spark`): every combination of the values the gate reads with its number of rows, a table of a few
hundred rows, which :func:`exporter.gate.fairness.frames.scan` reads weighted by ``count``: the value rules, the
checks, the core and the report are the row pass's.

Used only where an aggregation gives every number the row pass gives: local parquet files, the columns counted as
the files hold them (no hive partition among them: pyarrow's parsing of folder names is the reference), types cast
to the dataset's schema as pyarrow reads it, and a model without what needs each row (LL144 scores, scores against
a threshold, BISG proxies, side sources, segments and strata, dates written as text). The LL144 date range is the
row pass's function on DuckDB's earliest and latest stamp. Anything else, or DuckDB absent or failing, and the row
pass runs as before; a refusal is worded by the row pass, which names rows.
"""

from __future__ import annotations

from typing import Any

import pyarrow as pa

from exporter.config import ModelSpec
from exporter.gate.data.dataset import Dataset
from exporter.spark import COUNT, CountedRows, counted_columns

MEMORY = "512MB"
"""DuckDB's memory limit: its hash table of combinations stays small for categorical data; data whose combinations
would not fit (free text in an attribute column) fails there and is counted by the row pass in the memory of a
batch."""


class LocalCounts(CountedRows):
    """DuckDB's counts, told apart from another engine's: a refusal found in them is worded by the row pass."""


def usable(config: ModelSpec, dataset: Dataset) -> bool:
    """Whether one aggregation of this dataset gives the model's every number."""
    import pyarrow.dataset as ds
    from pyarrow import fs as pafs

    partitions = {key for f in dataset.arrow.get_fragments() for key in ds.get_partition_keys(f.partition_expression)}
    columns = counted_columns(config, dataset.columns)
    return (dataset.format == "parquet" and isinstance(dataset.arrow.filesystem, pafs.LocalFileSystem)
            and config.score_column is None and config.events.score_threshold is None
            and not any(a.proxy for a in config.base_attributes) and not config.attribute_sources
            and not config.segments and not config.strata and _dated(config, dataset)
            and not partitions & {*columns, config.timestamp_column}
            and dataset.problem([*columns, config.timestamp_column]) is None  # else the row pass refuses the files
            and all(_plain(_read_type(dataset.schema.field(c).type)) for c in columns)
            and len({c.lower() for c in dataset.columns}) == len(dataset.columns)  # DuckDB's names ignore case
            and not any(ch in f for f in dataset.arrow.files for ch in "*?[{"))  # fmt: skip


def local_rows(config: ModelSpec, dataset: Dataset) -> tuple[Any, str | None]:
    """The rows the local engine counts: DuckDB's counts and their weight column where usable, else the dataset
    and no weights (the row pass)."""
    if not usable(config, dataset):
        return dataset, None
    try:
        import duckdb
    except ImportError:  # the same numbers, from the row pass
        return dataset, None
    columns = counted_columns(config, dataset.columns)
    source = "read_parquet($files, hive_partitioning = false, union_by_name = true)"
    params = {"files": list(dataset.arrow.files)}
    con = duckdb.connect(config={"memory_limit": MEMORY, "temp_directory": ""})  # no spilling into the cwd's .tmp
    try:
        con.execute("SET enable_progress_bar = false")
        table = con.sql(f"SELECT {', '.join(map(_name, columns))}, count(*) AS {COUNT} FROM {source} GROUP BY ALL",
                        params=params).to_arrow_table()  # fmt: skip
        dates = _date_range(con, config, dataset, source, params)
        arrays = [table.column(i).cast(_read_type(dataset.schema.field(c).type)) for i, c in enumerate(columns)]
    except (duckdb.Error, pa.ArrowInvalid, pa.ArrowNotImplementedError):  # out of memory, a file DuckDB cannot
        return dataset, None  # read, values pyarrow's schema cannot hold: the row pass reads them or says why
    finally:
        con.close()
    if dates is False:
        return dataset, None
    return LocalCounts(pa.table([*arrays, table.column(COUNT)], names=[*columns, COUNT]), dates or None), COUNT


def _plain(kind: pa.DataType) -> bool:
    """Text, integers, floats and booleans: the types whose values DuckDB returns as pyarrow reads them (a
    nanosecond timestamp, a half float or a nested type is counted by the row pass)."""
    return (pa.types.is_string(kind) or pa.types.is_large_string(kind) or pa.types.is_integer(kind)
            or kind in (pa.float32(), pa.float64(), pa.bool_()))  # fmt: skip


def _name(column: str) -> str:
    return '"' + column.replace('"', '""') + '"'


def _dated(config: ModelSpec, dataset: Dataset) -> bool:
    """Whether the LL144 date range is DuckDB's to give: no timestamp column, or one of numbers (epoch seconds) or
    of timestamps to the microsecond (their order is the instants'), with model_id absent or text; text dates are
    parsed row by row as pandas parses them, by the row pass."""
    if config.timestamp_column not in dataset.columns:
        return True
    kind = _read_type(dataset.schema.field(config.timestamp_column).type)
    ids = _read_type(dataset.schema.field("model_id").type) if "model_id" in dataset.columns else pa.string()
    return (pa.types.is_string(ids) or pa.types.is_large_string(ids)) and (
        pa.types.is_integer(kind) or pa.types.is_floating(kind)
        or (pa.types.is_timestamp(kind) and kind.unit in ("s", "ms", "us")))  # fmt: skip


def _date_range(con: Any, config: ModelSpec, dataset: Dataset, source: str, params: dict[str, Any]) -> Any:
    """The model's date range as the row pass states it (:func:`exporter.gate.fairness.ll144.date_range` on the
    earliest and the latest stamp; NaN and null are rows without a date), None without a timestamp column, False
    when a stamp lies outside pandas' range (the row pass counts those as without a date)."""
    import pandas as pd

    from exporter.gate.fairness import ll144

    column = config.timestamp_column
    if column not in dataset.columns:
        return None
    kind = _read_type(dataset.schema.field(column).type)
    t = _name(column)
    dated = f"NOT isnan({t})" if pa.types.is_floating(kind) else "true"
    shared = "model_id" in dataset.columns
    bounds = con.sql(f"SELECT min({t}) FILTER ({dated}), max({t}) FILTER ({dated}), "
                     f"count(*) FILTER ({t} IS NULL OR NOT ({dated})) FROM {source} "
                     f"WHERE {'model_id = $model' if shared else 'true'}",
                     params={**params, **({"model": config.model_id} if shared else {})}).fetchall()[0]  # fmt: skip
    found = ll144.date_range(pd.DataFrame({column: pa.array(bounds[:2], type=kind).to_pandas()}), column)
    assert found is not None
    if found["rows_without_date"] != sum(b is None for b in bounds[:2]):
        return False
    return {**found, "rows_without_date": int(bounds[2])}


def _read_type(kind: pa.DataType) -> pa.DataType:
    """The type the row pass gives a column's values (a dictionary's values)."""
    return kind.value_type if pa.types.is_dictionary(kind) else kind
