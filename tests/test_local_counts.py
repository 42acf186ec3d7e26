"""The local engine's DuckDB counts (exporter/gate/fairness/local_counts.py) give the row pass's report exactly, and
its counts are an independent DuckDB GROUP BY's, on awkward data: blank and unknown groups, an integer attribute, NaN
and null labels, rows of another model, several files in hive folders."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from exporter.config import parse_config
from exporter.gate.data.dataset import DataError, open_dataset
from exporter.gate.fairness import audit
from exporter.gate.fairness.audit import run_audit
from exporter.gate.fairness.frames import text_columns
from exporter.gate.fairness.local_counts import LocalCounts, local_rows

duckdb = pytest.importorskip("duckdb")
NOW = datetime(2026, 1, 1, tzinfo=UTC)

RAW = {"model_id": "m", "min_samples": 5,
       "protected_attributes": [{"name": "gender", "groups": ["f", "m"], "pairwise_comparisons": "all"},
                                {"name": "age", "groups": ["18", "30"]}],
       "metrics": [{"name": "demographic_parity_difference", "threshold": 0.1},
                   {"name": "equalised_odds_difference", "threshold": 0.1}]}  # fmt: skip


def write(folder: Path, seed: int, rows: int = 5_000, prediction_nulls: int = 0) -> None:
    """A file of awkward rows: gender f/m, an unknown value and blanks; age an integer column with blanks and an
    unknown age; labels 0/1 as floats with NaN and nulls; a tenth of the rows another model's."""
    rng = np.random.default_rng(seed)
    folder.mkdir(parents=True, exist_ok=True)
    gender = rng.choice(np.array(["f", "m", "x"], dtype=object), rows, p=[0.45, 0.45, 0.1])
    gender[rng.random(rows) < 0.05] = None
    label = rng.integers(0, 2, rows).astype(float)
    label[rng.random(rows) < 0.1] = np.nan
    prediction = pa.array(rng.integers(0, 2, rows), mask=np.arange(rows) < prediction_nulls)
    pq.write_table(pa.table({
        "model_id": rng.choice(["m", "other"], rows, p=[0.9, 0.1]), "gender": pa.array(gender, pa.string()),
        "age": pa.array(rng.choice([18, 30, 45], rows), mask=rng.random(rows) < 0.05), "prediction": prediction,
        "label": pa.array(label, mask=rng.random(rows) < 0.1)}), folder / f"part-{seed}.parquet")  # fmt: skip


@pytest.fixture
def config(tmp_path: Path) -> Any:
    path = tmp_path / "config.yaml"
    path.write_text("model_id: m\n")
    return parse_config(RAW, source=str(path)).model()


def row_pass(config: Any, data: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    with monkeypatch.context() as patch:
        patch.setattr(audit, "local_rows", lambda c, d: (d, None))
        return run_audit(config, data, now=NOW)


def independent(data: str, attribute: str, hive: bool = False) -> dict[str, tuple[int, int, int]]:
    """Per value of ``attribute`` (as text; None for a blank): the model's rows, labelled rows and positive
    predictions, by one GROUP BY of DuckDB's."""
    con = duckdb.connect()
    found = con.execute(
        f"SELECT CAST({attribute} AS VARCHAR), count(*), "
        "count(*) FILTER (WHERE label IS NOT NULL AND NOT isnan(label)), "
        f"sum(prediction) FROM read_parquet('{data}/**/*.parquet', hive_partitioning = {str(hive).lower()}) "
        "WHERE model_id = 'm' GROUP BY ALL").fetchall()  # fmt: skip
    return {value: (int(n), int(labelled), int(positive)) for value, n, labelled, positive in found}


def assert_counts(report: dict[str, Any], data: Path, hive: bool = False) -> None:
    for attribute, groups in (("gender", ["f", "m"]), ("age", ["18", "30"])):
        duck = independent(str(data), attribute, hive)
        reported = report["attributes"][attribute]
        for group in groups:
            g = reported["groups"][group]
            assert (g["samples"], g["labelled"], round(g["selection_rate"] * g["samples"])) == duck[group]
        assert reported["excluded_rows"] == sum(n for value, (n, _, _) in duck.items() if value not in groups)
    assert report["rows"] == sum(n for n, _, _ in independent(str(data), "gender", hive).values())


def test_duckdbs_counts_give_the_row_pass_report_and_an_independent_group_by(
        config: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    data = tmp_path / "data"
    for day, seed in (("1", 1), ("1", 2), ("2", 3)):
        write(data / f"day={day}", seed)
    rows, weights = local_rows(config, open_dataset(str(data), "predictions", text_columns(config)))
    assert isinstance(rows, LocalCounts) and weights == "count"
    assert rows.table.num_rows <= 2 * 2 * 4 * 4 * 4  # combinations of values, not rows
    report = run_audit(config, data, now=NOW)
    rows_report = row_pass(config, data, monkeypatch)
    assert {k: v for k, v in report.items() if k != "timestamp"} == \
        {k: v for k, v in rows_report.items() if k != "timestamp"}  # fmt: skip
    assert report["rows_of_other_models"] > 0 and report["attributes"]["gender"]["excluded_rows"] > 0
    assert_counts(report, data)


def test_a_hive_partition_among_the_counted_columns_is_the_row_pass_and_duckdbs_counts(
        config: Any, tmp_path: Path) -> None:  # fmt: skip
    data = tmp_path / "data"
    for k, age in enumerate((18, 30, 45)):
        write(data / f"age={age}", k)
        table = pq.read_table(data / f"age={age}" / f"part-{k}.parquet").drop_columns(["age"])
        pq.write_table(table, data / f"age={age}" / f"part-{k}.parquet")
    dataset = open_dataset(str(data), "predictions", text_columns(config))
    assert local_rows(config, dataset) == (dataset, None)  # pyarrow's parsing of folder names is the reference
    assert_counts(run_audit(config, data, now=NOW), data, hive=True)


def test_a_refusal_found_in_duckdbs_counts_is_worded_by_the_row_pass(
        config: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    data = tmp_path / "data"
    write(data, 1)
    write(data, 2, prediction_nulls=3)
    with pytest.raises(DataError) as by_rows:
        row_pass(config, data, monkeypatch)
    with pytest.raises(DataError) as local:
        run_audit(config, data, now=NOW)
    assert str(local.value) == str(by_rows.value) and "missing values (first rows: [" in str(local.value)


STAMPS = {"float seconds": pa.array([1.8e9 + 0.25, np.nan, None, 1.7e9 + 0.5, 1.75e9], pa.float64()),
          "int seconds": pa.array([1_800_000_000, None, 1_700_000_000, 1_750_000_000, 1_760_000_000], pa.int64()),
          "UTC timestamps": pa.array([1_800_000_000_123_456, None, 1_700_000_000_000_001, 1, 2],
                                     pa.timestamp("us", tz="UTC")),
          "local timestamps": pa.array([1_800_000_000_123, None, 1_700_000_000_000, 5, 6],
                                       pa.timestamp("ms", tz="America/New_York")),
          "naive timestamps": pa.array([1_800_000_000, None, 1_700_000_000, 5, 6], pa.timestamp("s")),
          "text dates": pa.array(["2026-01-02", None, "not a date", "2025-12-31T23:00:00+01:00", "2026-01-01"]),
          "seconds past pandas' range": pa.array([1e300, 1.7e9, None, 1.8e9, -np.inf], pa.float64())}  # fmt: skip
"""Each case's stamps repeat down the rows; the first model's rows see every one of them."""


@pytest.mark.parametrize("case", STAMPS)
def test_the_ll144_date_range_is_the_row_pass_s(config: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                case: str) -> None:  # fmt: skip
    data = tmp_path / "data"
    for seed in (1, 2):
        write(data, seed)
        table = pq.read_table(data / f"part-{seed}.parquet")
        stamps = STAMPS[case].take(pa.array(np.arange(table.num_rows) % len(STAMPS[case])))
        pq.write_table(table.append_column("timestamp", stamps), data / f"part-{seed}.parquet")
    rows, _ = local_rows(config, open_dataset(str(data), "predictions", text_columns(config)))
    assert isinstance(rows, LocalCounts) == (case not in ("text dates", "seconds past pandas' range"))
    report = run_audit(config, data, now=NOW)
    assert report["impact_ratios"]["date_range"] == row_pass(config, data, monkeypatch)["impact_ratios"]["date_range"]
    assert report["impact_ratios"]["date_range"]["start"] is not None


@pytest.mark.parametrize(("column", "kind", "by_duckdb"), [
    ("prediction", pa.bool_(), True), ("age", pa.int8(), True), ("age", pa.float32(), True),
    ("age", pa.string(), True), ("age", pa.decimal128(21, 1), False)])  # fmt: skip
def test_column_types_duckdb_returns_as_pyarrow_reads_them_and_others_by_the_row_pass(
        config: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, column: str, kind: pa.DataType,
        by_duckdb: bool) -> None:  # fmt: skip
    data = tmp_path / "data"
    for seed in (1, 2):
        write(data, seed)
        table = pq.read_table(data / f"part-{seed}.parquet")
        i = table.schema.get_field_index(column)
        pq.write_table(table.set_column(i, column, table.column(column).cast(kind)), data / f"part-{seed}.parquet")
    rows, _ = local_rows(config, open_dataset(str(data), "predictions", text_columns(config)))
    assert isinstance(rows, LocalCounts) == by_duckdb
    report = run_audit(config, data, now=NOW)
    assert {k: v for k, v in report.items() if k != "timestamp"} == \
        {k: v for k, v in row_pass(config, data, monkeypatch).items() if k != "timestamp"}  # fmt: skip
    assert report["attributes"]["gender"]["groups"]["f"]["samples"] > 0


def test_duckdb_out_of_memory_is_the_row_pass(config: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    data = tmp_path / "data"
    write(data, 1, rows=200_000)
    dataset = open_dataset(str(data), "predictions", text_columns(config))
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr("exporter.gate.fairness.local_counts.MEMORY", "1MB")
    assert local_rows(config, dataset) == (dataset, None)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["config.yaml", "data"]  # nothing spilled into the cwd
    assert_counts(run_audit(config, data, now=NOW), data)
