"""A hive partition value is the text of its folder name: ``grade=01`` is group "01", as the cell ``01`` of a file
is (pyarrow's type inference would make it the integer 1, no group), and as Spark reads it with partition type
inference off: the same rows give the same counts from one file and from hive folders."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest
import yaml

from exporter.cli import main
from exporter.gate.fairness.audit import run_audit

CONFIG = {"model_id": "m", "min_samples": 5, "protected_attributes": [{"name": "grade", "groups": ["01", "02"]}],
          "metrics": [{"name": "demographic_parity_difference", "threshold": 0.2,
                       "severity_on_fail": "blocking"}]}  # fmt: skip


@pytest.mark.parametrize("ext", ["parquet", "csv"])
def test_a_hive_partition_named_like_a_number_is_the_group_its_folder_names(tmp_path: Path, ext: str) -> None:
    """100 rows, grade "01" and "02" (50 each). From one file (parquet or CSV; docs/contract.md: a CSV cell is its
    text as written, ``01`` is group "01") the groups hold 50 and 50; split into grade=01/ and grade=02/ folders,
    the same (read as the integers 1 and 2, all 100 rows were excluded as unknown)."""
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump(CONFIG))
    frame = pd.DataFrame({"model_id": "m", "grade": ["01", "02"] * 50, "prediction": [1, 0] * 50})
    write = (lambda f, p: f.to_parquet(p)) if ext == "parquet" else (lambda f, p: f.to_csv(p, index=False))
    write(frame, tmp_path / f"all.{ext}")
    for grade, part in frame.groupby("grade"):
        (tmp_path / "hive" / f"grade={grade}").mkdir(parents=True)
        write(part.drop(columns="grade"), tmp_path / "hive" / f"grade={grade}" / f"part-0.{ext}")
    one = run_audit(config, tmp_path / f"all.{ext}")["attributes"]["grade"]
    assert {g: v["samples"] for g, v in one["groups"].items()} == {"01": 50, "02": 50}
    hive = run_audit(config, tmp_path / "hive")["attributes"]["grade"]
    assert ({g: v["samples"] for g, v in hive["groups"].items()}, hive["excluded_rows"]) == ({"01": 50, "02": 50}, 0)


def test_a_partition_folder_naming_a_column_of_the_files_is_one_line_naming_both(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """gender=male/ holding files that have a gender column themselves: which value is meant cannot be said, so the
    folder is refused (exit 2) in one line saying that a partition folder names a column of the files."""
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump({**CONFIG, "protected_attributes": [{"name": "gender",
                                                                          "groups": ["male", "female"]}]}))
    frame = pd.DataFrame({"model_id": "m", "gender": ["male", "female"] * 50, "prediction": [1, 0] * 50})
    for gender in ("male", "female"):
        (tmp_path / "hive" / f"gender={gender}").mkdir(parents=True)
        frame.to_parquet(tmp_path / "hive" / f"gender={gender}" / "part-0.parquet")
    assert main(["audit", str(config), str(tmp_path / "hive"), "--audit-log", str(tmp_path / "log")]) == 2
    err = capsys.readouterr().err
    assert "partition folder gender=" in err and "names a column the files also hold" in err
    assert len(err.strip().splitlines()) == 1


def test_a_file_outside_the_partition_folders_is_refused_not_counted_as_unknown(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Beside grade=01/ and grade=02/, a file at the root has no grade: read as blank, its rows would be excluded as
    unknown in silence. It is refused, naming the file and the partition column."""
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump(CONFIG))
    frame = pd.DataFrame({"model_id": "m", "prediction": [1, 0] * 50})
    for grade in ("01", "02"):
        (tmp_path / "hive" / f"grade={grade}").mkdir(parents=True)
        frame.to_parquet(tmp_path / "hive" / f"grade={grade}" / "part-0.parquet")
    frame.to_parquet(tmp_path / "hive" / "stray.parquet")
    assert main(["audit", str(config), str(tmp_path / "hive"), "--audit-log", str(tmp_path / "log")]) == 2
    err = capsys.readouterr().err
    assert "'stray.parquet' has no column 'grade'" in err and len(err.strip().splitlines()) == 1


def test_a_glob_matching_one_file_of_a_partitioned_table_keeps_its_partition(tmp_path: Path) -> None:
    """``hive/grade=*/part-0.parquet`` matching one file: the partition column is there, as for two."""
    from exporter.gate.data.dataset import read_batches

    (tmp_path / "hive" / "grade=01").mkdir(parents=True)
    pd.DataFrame({"prediction": [1, 0]}).to_parquet(tmp_path / "hive" / "grade=01" / "part-0.parquet")
    (batch,) = read_batches(str(tmp_path / "hive" / "grade=*" / "part-0.parquet"), ["grade", "prediction"])
    assert batch.to_pydict() == {"grade": ["01", "01"], "prediction": [1, 0]}
