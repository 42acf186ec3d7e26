"""The gate's counts as one Spark aggregation, for data past one machine (``audit --engine spark``).

Everything the audit computes is a function of per-group counts, so Spark only has to count: one ``groupBy`` over
the columns the gate reads (model_id, prediction or score, label, the base attributes) returns each combination of
values with its number of rows, a table of a few hundred rows however large the data. The gate then reads that
table exactly as it reads a file, each combination weighted by its count (:func:`exporter.gate.fairness.frames.scan`),
so the encoding, the checks, the core, the report and the audit log are the local path's.

The master comes from the usual Spark settings (``spark-defaults.conf``, ``PYSPARK_SUBMIT_ARGS``, or a session the
caller already started); without any, pyspark runs locally. Needs the ``spark`` extra (pyspark) and a Java runtime.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from exporter.config import ModelSpec
from exporter.gate.data.dataset import BATCH_ROWS, DataError, open_dataset
from exporter.gate.fairness.frames import prediction_column

COUNT = "count"
"""The aggregation's column of rows per combination of values."""


def counted_columns(config: ModelSpec, columns: Sequence[str]) -> list[str]:
    """The columns the gate reads, of those the data has: what the aggregation groups by."""
    wanted = ["model_id", prediction_column(config), config.label_column,
              *(a.columns[0] for a in config.base_attributes)]  # fmt: skip
    return [c for c in dict.fromkeys(wanted) if c in columns]


def counts(df: Any, config: ModelSpec) -> Any:
    """One aggregation of a Spark DataFrame: the rows of each combination of the values the gate reads, as a
    DataFrame with those columns and ``count``."""
    return df.groupBy(*counted_columns(config, df.columns)).count().withColumnRenamed("count", COUNT)


@dataclass(frozen=True)
class CountedRows:
    """An engine's counts as the gate's rows: each row a combination of values, ``count`` its weight."""

    table: pa.Table

    @property
    def columns(self) -> list[str]:
        return [c for c in self.table.column_names if c != COUNT]

    def batches(self, columns: Sequence[str], batch_rows: int = BATCH_ROWS) -> Iterator[pa.RecordBatch]:
        yield from self.table.select(list(columns)).to_batches(batch_rows)


def read(spark: Any, location: str) -> Any:
    """A dataset as Spark reads it (parquet, or CSV with a header and inferred types; folders, globs and hive
    partitions as Spark knows them)."""
    kind = open_dataset(location, "predictions").format
    reader = spark.read.format(kind)
    if kind == "csv":
        reader = reader.option("header", True).option("inferSchema", True)
    return reader.load(location)


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
        df = read(spark, location)
        return CountedRows(counts(df, config).toArrow())
    except Exception as exc:  # Spark's analysis and IO errors arrive through py4j
        if isinstance(exc, DataError):
            raise
        raise DataError(f"{location}: Spark cannot count it: {' '.join(str(exc).split())[:300]}") from exc
