"""`audit --engine spark` counts the rows the local engine counts, read as it reads them: the gate's listed data
files only (not every file of a folder), CSV columns by each file's header names (not by position after the first
file's header), the local engine's missing markers (not only the empty cell), hive partitions as their folders' text,
and the same refusal of files that differ. Each case gives the local report, or the local refusal, with Spark."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
import yaml
from test_spark import spark  # noqa: F401  (the local SparkSession fixture)

from exporter.gate.data.dataset import DataError
from exporter.gate.fairness.audit import run_audit

NOW = datetime(2026, 1, 1, tzinfo=UTC)
CONFIG = {"model_id": "m", "min_samples": 5,
          "protected_attributes": [{"name": "gender", "groups": ["male", "female"]}],
          "metrics": [{"name": "demographic_parity_difference", "threshold": 0.2, "severity_on_fail": "blocking"},
                      {"name": "equalised_odds_difference", "threshold": 0.2,
                       "severity_on_fail": "blocking"}]}  # fmt: skip


def rows(n: int, selected_men: int) -> pd.DataFrame:
    """n men then n women, ``selected_men`` of the men predicted positive, every woman's prediction 0; labels 1, 0."""
    return pd.DataFrame({"model_id": "m", "gender": ["male"] * n + ["female"] * n,
                         "prediction": [1] * selected_men + [0] * (2 * n - selected_men),
                         "label": [1, 0] * n})  # fmt: skip


def reports(tmp_path: Path, data: Path) -> tuple[dict, dict | str]:
    """The local report and Spark's (or the one line Spark's run was refused with)."""
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump(CONFIG))
    local = run_audit(config, data, now=NOW)
    try:
        return local, run_audit(config, data, now=NOW, engine="spark")
    except DataError as exc:
        return local, f"refused: {str(exc)[:300]}"


def summary(report: dict | str) -> Any:
    if isinstance(report, str):
        return report
    groups = report["attributes"]["gender"]["groups"]
    return report["rows"], report["verdict"], {g: v["samples"] for g, v in groups.items()}


@pytest.mark.parametrize("ext", ["csv", "parquet"])
def test_spark_reads_only_the_data_files_the_gate_lists(spark: Any, tmp_path: Path, ext: str) -> None:  # noqa: F811
    """A folder of two data files and a README.md (docs/ml/gate.md: a folder is "every parquet or CSV file under
    it"; the manifest lists the two): 400 rows on both engines. Loading the folder, Spark read README.md too: as a
    CSV row (401 rows, a male row more) or, among parquet files, as a file without a footer (refused)."""
    folder = tmp_path / "preds"
    folder.mkdir()
    for k in range(2):
        part = rows(100, 40)
        part.to_csv(folder / f"part-{k}.csv", index=False) if ext == "csv" else part.to_parquet(
            folder / f"part-{k}.parquet")
    (folder / "README.md").write_text("model_id,gender,prediction,label\nm,male,1,1\n")
    local, with_spark = reports(tmp_path, folder)
    assert [f["path"] for f in local["data_manifest"]] == [f"part-0.{ext}", f"part-1.{ext}"] and local["rows"] == 400
    assert summary(with_spark) == summary(local)
    assert with_spark == local


def test_spark_reads_csv_columns_by_name_as_the_local_engine(spark: Any, tmp_path: Path) -> None:  # noqa: F811
    """Two CSV files with the same columns, the second written in another order (label before prediction): each
    file's columns by its header, 400 rows on both engines. Spark's CSV reader by default applies the first file's
    header by position and keeps the second file's header line as a data row (its prediction column held text and
    the audit was refused; columns of one type would have been swapped in silence)."""
    folder = tmp_path / "preds"
    folder.mkdir()
    rows(100, 40).to_csv(folder / "part-0.csv", index=False)
    rows(100, 40)[["model_id", "gender", "label", "prediction"]].to_csv(folder / "part-1.csv", index=False)
    local, with_spark = reports(tmp_path, folder)
    assert local["rows"] == 400 and local["attributes"]["gender"]["groups"]["male"]["selection_rate"] == 0.4
    assert summary(with_spark) == summary(local)
    assert with_spark == local


def test_spark_reads_a_csv_files_missing_markers_as_the_local_engine(spark: Any, tmp_path: Path) -> None:  # noqa: F811
    """docs/contract.md (Event format): "A CSV file is read by pandas, whose missing-value markers (NA, N/A, null,
    None, NaN, ...) are empty cells", on the local engine, backtest and --engine spark alike. A label written NA is
    an unlabelled row on both engines (labelled 90 of 100 men), where Spark's own reading took "NA" for text and
    refused the label column."""
    frame = rows(100, 40).astype({"label": object})
    frame.loc[:9, "label"] = "NA"
    frame.to_csv(tmp_path / "preds.csv", index=False)
    local, with_spark = reports(tmp_path, tmp_path / "preds.csv")
    assert local["attributes"]["gender"]["groups"]["male"]["labelled"] == 90
    assert summary(with_spark) == summary(local)
    assert with_spark == local


@pytest.mark.parametrize("ext", ["csv", "parquet"])
def test_spark_reads_hive_partitions_as_their_folders_text(spark: Any, tmp_path: Path, ext: str) -> None:  # noqa: F811
    """gender=male/ and gender=female/ folders beside grade=01/ and grade=02/ ones: a partition named like a number
    is the text of its folder on both engines (Spark's partition type inference would make grade=01 the integer 1)."""
    frame = rows(100, 40).assign(grade=["01", "02"] * 100)
    for (grade, gender), part in frame.groupby(["grade", "gender"]):
        folder = tmp_path / "hive" / f"grade={grade}" / f"gender={gender}"
        folder.mkdir(parents=True)
        part = part.drop(columns=["grade", "gender"])
        part.to_csv(folder / "part-0.csv", index=False) if ext == "csv" else part.to_parquet(folder / "p.parquet")
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump({**CONFIG, "protected_attributes": [
        {"name": "gender", "groups": ["male", "female"]}, {"name": "grade", "groups": ["01", "02"]}]}))
    local = run_audit(config, tmp_path / "hive", now=NOW)
    assert {g: v["samples"] for g, v in local["attributes"]["grade"]["groups"].items()} == {"01": 100, "02": 100}
    assert run_audit(config, tmp_path / "hive", now=NOW, engine="spark") == local


@pytest.mark.parametrize("ext", ["csv", "parquet"])
def test_spark_reads_numbers_widened_across_files_as_the_local_engine(spark: Any, tmp_path: Path, ext: str) -> None:  # noqa: F811
    """part-1 writes its predictions as floats (1.0, 0.0) and its labels as blanks only, beside part-0's integers:
    one table of doubles on both engines, part-1's rows unlabelled. Spark reads a parquet folder by one file's types
    (int64 beside double was refused), so files of another type are read apart and widened."""
    folder = tmp_path / "preds"
    folder.mkdir()
    second = rows(100, 60).astype({"prediction": float, "label": object})
    second["label"] = None
    for k, part in enumerate((rows(100, 40), second)):
        part.to_csv(folder / f"part-{k}.csv", index=False) if ext == "csv" else part.to_parquet(
            folder / f"part-{k}.parquet")
    local, with_spark = reports(tmp_path, folder)
    assert local["rows"] == 400 and local["attributes"]["gender"]["groups"]["male"]["labelled"] == 100
    assert with_spark == local


def test_spark_refuses_a_folder_whose_files_differ_as_the_local_engine(spark: Any, tmp_path: Path) -> None:  # noqa: F811
    """part-1 lacks the label column: refused on both engines in the same words, before Spark reads a row."""
    folder = tmp_path / "preds"
    folder.mkdir()
    rows(100, 40).to_parquet(folder / "part-0.parquet")
    rows(100, 40).drop(columns="label").to_parquet(folder / "part-1.parquet")
    local, with_spark = reports_or_refusals(tmp_path, folder)
    assert local == with_spark and "'part-1.parquet' has no column 'label'" in local


def reports_or_refusals(tmp_path: Path, data: Path) -> tuple[str, str]:
    """The one line each engine refused the data with."""
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump(CONFIG))
    found = []
    for engine in ("local", "spark"):
        with pytest.raises(DataError) as refused:
            run_audit(config, data, now=NOW, engine=engine)
        found.append(str(refused.value))
    return found[0], found[1]


def test_spark_is_given_each_listed_file_as_the_location_names_it(tmp_path: Path) -> None:
    """A URL keeps its own scheme and host for Spark (``s3a://``, ``abfss://container@account...``), whatever fsspec
    calls the files, and the root where hive partitions start is Spark's basePath: a folder, a file and a glob."""
    from exporter.gate.data.dataset import open_dataset
    from exporter.spark import _paths

    for name in ("d=1/part-0.csv", "d=2/part-0.csv"):
        (tmp_path / "preds" / name).parent.mkdir(parents=True)
        rows(2, 1).to_csv(tmp_path / "preds" / name, index=False)
    (tmp_path / "preds" / "README.md").write_text("not data")
    url = f"file://{tmp_path}/preds"
    expected = (url, [f"{url}/d=1/part-0.csv", f"{url}/d=2/part-0.csv"])
    assert _paths(open_dataset(url + "/")) == _paths(open_dataset(url + "/d=*/*.csv")) == expected
    assert _paths(open_dataset(f"{url}/d=1/part-0.csv")) == (f"{url}/d=1", [f"{url}/d=1/part-0.csv"])
    local = str(tmp_path / "preds")
    assert _paths(open_dataset(local)) == (local, [f"{local}/d=1/part-0.csv", f"{local}/d=2/part-0.csv"])
