"""The gate's counts as one Spark aggregation, for data past one machine (``audit --engine spark``).

Everything the audit computes is a function of per-group counts, so Spark only has to count: one ``groupBy`` over
the columns the gate reads (model_id, prediction or score, label, the base attributes) returns each combination of
values with its number of rows, a table of a few hundred rows however large the data. The gate then reads that
table exactly as it reads a file, each combination weighted by its count (:func:`exporter.gate.fairness.frames.scan`),
so the encoding, the checks, the core, the report and the audit log are the local path's. Attributes joined by id
(``attribute_sources``) are joined before the aggregation by the gate's own side table and join (:func:`joined`).

The master comes from the usual Spark settings (``spark-defaults.conf``, ``PYSPARK_SUBMIT_ARGS``, or a session the
caller already started); without any, pyspark runs locally. Needs the ``spark`` extra (pyspark) and a Java runtime.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from exporter.config import ModelSpec
from exporter.gate import storage
from exporter.gate.data.dataset import BATCH_ROWS, PANDAS_NULLS, WHOLE_FLOAT_ID, DataError, Dataset, csv_values
from exporter.gate.data.files import filesystem, join
from exporter.gate.fairness.frames import attribute_columns, prediction_column

COUNT = "count"
"""The aggregation's column of rows per combination of values."""


def counted_columns(config: ModelSpec, columns: Sequence[str]) -> list[str]:
    """The columns the gate reads, of those the data has: what the aggregation groups by (the segments' and the
    strata's too: the gate's segment tally counts the weighted combinations as it counts rows)."""
    wanted = ["model_id", prediction_column(config), config.label_column, *attribute_columns(config),
              *config.counted_columns]
    return [c for c in dict.fromkeys(wanted) if c in columns]


def counts(df: Any, config: ModelSpec) -> Any:
    """One aggregation of a Spark DataFrame: the rows of each combination of the values the gate reads, as a
    DataFrame with those columns and ``count``."""
    return df.groupBy(*counted_columns(config, df.columns)).count().withColumnRenamed("count", COUNT)


@dataclass(frozen=True)
class CountedRows:
    """An engine's counts as the gate's rows: each row a combination of values, ``count`` its weight; and the
    data's date range (the LL144 table's), which no combination of values carries."""

    table: pa.Table
    date_range: dict[str, Any] | None = None

    @property
    def columns(self) -> list[str]:
        return [c for c in self.table.column_names if c != COUNT]

    def batches(self, columns: Sequence[str], batch_rows: int = BATCH_ROWS) -> Iterator[pa.RecordBatch]:
        yield from self.table.select(list(columns)).to_batches(batch_rows)


def read(spark: Any, dataset: Dataset, columns: Sequence[str], ids: Sequence[str] = (),
         times: Sequence[str] = ()) -> Any:  # fmt: skip
    """``columns``, ``ids`` and ``times`` of a dataset (those it has) as Spark reads them, read as the local engine
    reads them: only the files the gate lists (exporter/gate/data/files.py; a README.md beside them is no data),
    hive partitions as their folders' text (partition type inference off), each file's columns by name (a CSV
    file's by its own header), a number of one file widened to the dataset's type (an int64 file beside a double
    one: Spark reads a folder by one file's types). A CSV cell is its text, the local engine's missing markers null
    (``PANDAS_NULLS``); :func:`spark_rows` converts the counted cells by the local engine's own conversion
    (:func:`exporter.gate.data.dataset.csv_values`), and attribute, segment and strata cells stay their text as
    written, as there (:func:`exporter.gate.fairness.frames.csv_text_columns`). ``ids``: id columns, a CSV id's
    ``12.0`` read as ``12`` (exporter/gate/data/dataset.py); ``times``: time columns, a CSV one numbers where the
    local engine reads numbers, else its text, which the gate reads as it reads text times (ISO 8601 without an
    offset as UTC, whatever Spark's session time zone: exporter/gate/data/columns.py)."""
    from pyspark.sql.types import StringType, StructField, StructType

    base, paths = _paths(dataset)
    wanted = [c for c in dict.fromkeys([*columns, *ids, *times]) if c in dataset.columns]
    groups: dict[pa.Schema, list[str]] = {}  # files read alike: the same header, or the same columns and types
    for path, schema in zip(paths, dataset.file_schemas, strict=True):
        key = pa.schema([(n, pa.string()) for n in schema.names]) if dataset.format == "csv" else schema
        groups.setdefault(key.remove_metadata(), []).append(path)
    conf = "spark.sql.sources.partitionColumnTypeInference.enabled"
    before = spark.conf.get(conf, None)
    spark.conf.set(conf, "false")
    try:
        reader = spark.read.format(dataset.format).option("basePath", base)
        if dataset.format == "csv":
            reader = reader.options(header=True, enforceSchema=False, escape='"', mode="FAILFAST")
        frames = [(reader.schema(StructType([StructField(c, StringType()) for c in key.names]))
                   if dataset.format == "csv" else reader).load(files).select(
                      *(_column(dataset, key, c, c in ids, c in times) for c in wanted))
                  for key, files in groups.items()]  # fmt: skip
    finally:
        spark.conf.set(conf, before) if before is not None else spark.conf.unset(conf)
    df = frames[0]
    for other in frames[1:]:
        df = df.unionByName(other)
    return df


def _column(dataset: Dataset, schema: pa.Schema, name: str, is_id: bool, is_time: bool) -> Any:
    """A column of files of one ``schema`` as the local engine reads it: a CSV cell's missing marker null, a CSV
    id's ``12.0`` as ``12``, a CSV time column the local engine reads as numbers cast to them; a number of one file
    cast to the dataset's type. A hive partition as it is."""
    from pyspark.sql import functions as F

    column = F.col(name)
    kind = dataset.schema.field(name).type
    number = "bigint" if pa.types.is_integer(kind) else "double" if pa.types.is_floating(kind) else None
    if name not in schema.names:
        return column
    if dataset.format != "csv":
        return column.cast(number).alias(name) if number and schema.field(name).type != kind else column
    column = F.when(column.isin(*PANDAS_NULLS), F.lit(None)).otherwise(column)
    column = F.regexp_replace(column, WHOLE_FLOAT_ID, "$1") if is_id else column
    return (column.cast(number) if is_time and number else column).alias(name)


def _paths(dataset: Dataset) -> tuple[str, list[str]]:
    """The dataset's root and each listed file as the location names them (its scheme and host as given:
    ``s3a://``, ``abfss://container@account...``), for Spark: the root is its ``basePath``, where hive partitions
    start."""
    if not storage.is_url(dataset.location):
        return dataset.root, [join(dataset.root, f.path) for f in dataset.files]
    _, path = filesystem(dataset.location)
    location, beyond = dataset.location.rstrip("/"), path.rstrip("/")[len(dataset.root):]
    base = location[: len(location) - len(beyond)] if beyond else location
    return base, [join(base, f.path) for f in dataset.files]


def spark_rows(config: ModelSpec, dataset: Dataset) -> CountedRows:
    """Count a dataset with Spark: the aggregated combinations of values, for :func:`run_audit` to weigh."""
    if config.score_column is not None:
        raise DataError(f"{config.source}: columns.score (the LL144 scoring rate) ranks every score against their "
                        "median, which one aggregation cannot give; audit this model with --engine local")  # fmt: skip
    ids = [s.id for s in config.attribute_sources]
    problem = dataset.problem([*counted_columns(config, dataset.columns), *ids, config.timestamp_column])
    if problem:
        raise DataError(problem)
    try:
        from pyspark.sql import SparkSession
    except ImportError as exc:
        raise DataError(f"--engine spark needs pyspark: pip install 'fairness-exporter[spark]' ({exc})") from exc
    spark = SparkSession.builder.appName(f"fairness-exporter audit {config.model_id}").getOrCreate()
    location = dataset.location
    try:
        df = read(spark, dataset, counted_columns(config, dataset.columns), ids, [config.timestamp_column])
        table = counts(joined(spark, df, config, location), config).toArrow()
        table = csv_values(table, dataset.schema) if dataset.format == "csv" else table
        return CountedRows(table, date_range(df, config))
    except pa.ArrowInvalid as exc:  # a counted cell the local engine's conversion refuses too
        raise DataError(f"{location}: cannot read {dataset.what}: {' '.join(str(exc).split())}") from exc
    except Exception as exc:  # Spark's analysis and IO errors arrive through py4j
        if isinstance(exc, DataError):
            raise
        module = re.search(r"No module named '([^']+)'", str(exc))
        if module:  # the attribute join runs our code in the executors' Python
            raise DataError(f"{location}: attribute_sources: the Spark executors' Python cannot import "
                            f"{module[1]!r}: set PYSPARK_PYTHON to an interpreter with fairness-exporter") from exc
        raise DataError(f"{location}: Spark cannot count it: {' '.join(str(exc).split())[:300]}") from exc


def joined(spark: Any, df: Any, config: ModelSpec, location: str) -> Any:
    """The rows with the attributes of ``attribute_sources`` joined by id (the rows themselves without any): each
    side table is read by the gate's own reader on the driver (exporter/gate/data/side.py: the same latest row per
    id or its versions, the same values), broadcast, and looked up a record batch at a time by the gate's own join
    (at each row's time, for a source with versions), so the counts are the local engine's. The executors' Python
    must import ``exporter`` (the package installed with pyspark)."""
    from pyspark.sql.types import StringType, StructField, StructType

    from exporter.gate.data.side import check_columns, join_columns, read_tables, versioned

    names = [a.columns[0] for a in config.base_attributes if a.source is not None]
    if not names:
        return df
    ids = [s.id for s in config.attribute_sources if s.name in config.sourced()]
    check_columns(config, df.columns, location)
    tables = spark.sparkContext.broadcast(read_tables(config))
    timed = [config.timestamp_column] if versioned(config) else []  # each row's time, for sources with versions
    df = df.select(*dict.fromkeys([*(c for c in counted_columns(config, df.columns) if c not in names), *ids, *timed]))
    schema = StructType([*df.schema.fields, *(StructField(name, StringType()) for name in names)])

    def join(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for batch in batches:
            found = join_columns(config, tables.value, batch)
            yield pa.RecordBatch.from_arrays([*batch.columns, *(found[n].cast(pa.string()) for n in names)],
                                             names=[*batch.schema.names, *names])  # fmt: skip

    return df.mapInArrow(join, schema)


def date_range(df: Any, config: ModelSpec) -> dict[str, Any] | None:
    """The first and last timestamp of the model's rows and the rows without one, as the LL144 table states them
    (:func:`exporter.gate.fairness.ll144.date_range` on the earliest and the latest); None without a timestamp
    column. Epoch seconds and timestamps are ordered as instants by Spark; text is parsed as the local path
    parses it, so its range is computed on the column's distinct values."""
    import pandas as pd
    from pyspark.sql import functions as F

    from exporter.gate.fairness import ll144

    column = config.timestamp_column
    if column not in df.columns:
        return None
    if "model_id" in df.columns:
        df = df.where(F.col("model_id").cast("string") == config.model_id)
    kind = dict(df.dtypes)[column]
    if kind == "string":
        values = df.groupBy(column).count().toArrow()
        stamps = pd.to_datetime(pd.Series(values.column(column).to_pylist(), dtype=object), utc=True,
                                errors="coerce", format="mixed")  # fmt: skip
        weights = values.column("count").to_numpy()
        valid = stamps.notna().to_numpy()
        iso = (lambda t: t.isoformat().replace("+00:00", "Z"))  # noqa: E731
        return {"column": column, "start": iso(stamps[valid].min()) if valid.any() else None,
                "end": iso(stamps[valid].max()) if valid.any() else None,
                "rows_without_date": int(weights[~valid].sum())}  # fmt: skip
    bounds = df.agg(F.min(column).alias("start"), F.max(column).alias("end"),
                    F.count(F.when(F.col(column).isNull(), 1)).alias("blank")).toArrow()  # fmt: skip
    ends = pa.concat_arrays([bounds.column("start").combine_chunks(), bounds.column("end").combine_chunks()])
    found = ll144.date_range(pd.DataFrame({column: ends.to_pandas()}), column)
    assert found is not None  # every number and timestamp is a date: the rows without one are the blank ones
    return {**found, "rows_without_date": int(bounds.column("blank")[0].as_py())}
