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
from exporter.gate.data.dataset import BATCH_ROWS, WHOLE_FLOAT_ID, DataError, open_dataset
from exporter.gate.fairness.frames import attribute_columns, csv_text_columns, prediction_column

COUNT = "count"
"""The aggregation's column of rows per combination of values."""


def counted_columns(config: ModelSpec, columns: Sequence[str]) -> list[str]:
    """The columns the gate reads, of those the data has: what the aggregation groups by."""
    wanted = ["model_id", prediction_column(config), config.label_column, *attribute_columns(config)]
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


def read(spark: Any, location: str, ids: Sequence[str] = (), texts: Sequence[str] = (), times: Sequence[str] = ()
         ) -> Any:  # fmt: skip
    """A dataset as Spark reads it (parquet, or CSV with a header and inferred types; folders, globs and hive
    partitions as Spark knows them). ``ids``: id columns, read from CSV as the local engine reads them (their text,
    an integer followed by ``.0`` as that integer: exporter/gate/data/dataset.py); ``texts``: columns read from CSV
    as their text as written, as the local engine reads attribute, segment and strata columns
    (:func:`exporter.gate.fairness.frames.csv_text_columns`; the gate's encoding matches them);
    ``times``: time columns, read from CSV as their text where Spark would infer dates or timestamps (which it
    reads in its session's time zone), so that the gate's reading of times gives ISO 8601 text without an offset
    as UTC, as everywhere else (exporter/gate/data/columns.py, ``seconds``)."""
    kind = open_dataset(location, "predictions").format
    reader = spark.read.format(kind)
    if kind != "csv":
        return reader.load(location)
    reader = reader.option("header", True).option("inferSchema", True)
    if not ids and not texts and not times:
        return reader.load(location)
    from pyspark.sql import functions as F
    from pyspark.sql.types import DateType, StringType, StructField, StructType, TimestampNTZType, TimestampType

    inferred = reader.load(location).schema
    dated = {f.name for f in inferred.fields if f.name in times and isinstance(f.dataType, (DateType, TimestampType,
                                                                                              TimestampNTZType))}
    schema = StructType([StructField(f.name, StringType()) if f.name in ids or f.name in texts or f.name in dated
                         else f for f in inferred.fields])  # fmt: skip
    df = spark.read.format("csv").option("header", True).schema(schema).load(location)
    for name in (f.name for f in inferred.fields if f.name in ids):
        df = df.withColumn(name, F.regexp_replace(F.col(name), WHOLE_FLOAT_ID, "$1"))
    return df


def spark_rows(config: ModelSpec, location: str) -> CountedRows:
    """Count a dataset with Spark: the aggregated combinations of values, for :func:`run_audit` to weigh."""
    if config.score_column is not None:
        raise DataError(f"{config.source}: columns.score (the LL144 scoring rate) ranks every score against their "
                        "median, which one aggregation cannot give; audit this model with --engine local")  # fmt: skip
    try:
        from pyspark.sql import SparkSession
    except ImportError as exc:
        raise DataError(f"--engine spark needs pyspark: pip install 'fairness-exporter[spark]' ({exc})") from exc
    spark = SparkSession.builder.appName(f"fairness-exporter audit {config.model_id}").getOrCreate()
    try:
        df = read(spark, location, [s.id for s in config.attribute_sources], csv_text_columns(config),
                  [config.timestamp_column])
        return CountedRows(counts(joined(spark, df, config, location), config).toArrow(), date_range(df, config))
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
