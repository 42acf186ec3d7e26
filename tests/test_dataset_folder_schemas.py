"""A folder of predictions is one table only when its files agree. A file that lacks a column the others have, a
column whose type changes from one file to the next, or a bad value in one file of several is refused in one line
(exit 2), never counted on part of the rows, and never a traceback."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
import yaml

from exporter.cli import main

CONFIG = {"model_id": "m", "min_samples": 5,
          "protected_attributes": [{"name": "gender", "groups": ["male", "female"]}],
          "metrics": [{"name": "demographic_parity_difference", "threshold": 0.2, "severity_on_fail": "blocking"},
                      {"name": "equalised_odds_difference", "threshold": 0.2,
                       "severity_on_fail": "blocking"}]}  # fmt: skip


def fair(n: int) -> pd.DataFrame:
    """Rows where every group has the same selection rate, TPR and FPR (a pass)."""
    block = pd.DataFrame({"model_id": "m", "gender": ["male"] * 4 + ["female"] * 4,
                          "prediction": [1, 0, 1, 0] * 2, "label": [1, 1, 0, 0] * 2})  # fmt: skip
    return pd.concat([block] * (n // 8), ignore_index=True)


def biased(n: int) -> pd.DataFrame:
    """Rows where men are always selected and women never (DP difference 1.0: a blocking failure)."""
    return pd.DataFrame({"model_id": "m", "gender": ["male", "female"] * (n // 2), "prediction": [1, 0] * (n // 2),
                         "label": [1, 1] * (n // 2)})  # fmt: skip


def write(frame: pd.DataFrame, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    frame.to_parquet(path) if path.suffix == ".parquet" else frame.to_csv(path, index=False)


def audit(tmp_path: Path, data: Path, capsys: pytest.CaptureFixture[str]) -> tuple[int, dict | None, str]:
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump(CONFIG))
    code = main(["audit", str(config), str(data), "--audit-log", str(tmp_path / "log")])
    out, err = capsys.readouterr()
    return code, (json.loads(out) if out.strip().startswith("{") else None), err


@pytest.mark.parametrize("ext", ["parquet", "csv"])
@pytest.mark.parametrize("dropped", ["model_id", "gender", "label"])
def test_a_file_lacking_a_column_another_file_has_is_refused_not_read_as_blanks(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], ext: str, dropped: str
) -> None:
    """part-0 is fair, part-1 (the same number of rows) is wholly biased but lacks one column. Read as blanks, part-1's
    rows would be other models', the unknown gender, or unlabelled, and the gate would pass (exit 0) on the half it
    could count, where the same rows in one file with the column fail (exit 1). The folder is refused instead
    (exit 2, one line naming the file and the column)."""
    first, second = fair(400), biased(400)
    write(pd.concat([first, second]), tmp_path / "one" / f"all.{ext}")
    whole, _, _ = audit(tmp_path, tmp_path / "one" / f"all.{ext}", capsys)
    assert whole == 1  # every row counted: the biased half fails the gate
    write(first, tmp_path / "parts" / f"part-0.{ext}")
    write(second.drop(columns=dropped), tmp_path / "parts" / f"part-1.{ext}")
    code, report, err = audit(tmp_path, tmp_path / "parts", capsys)
    assert code == 2, (code, report and (report["rows"], report["rows_of_other_models"], report["verdict"]))
    assert "part-1" in err and dropped in err and len(err.strip().splitlines()) == 1


def test_a_column_typed_boolean_in_one_file_and_integer_in_the_next_is_refused_not_cast(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The contract (docs/contract.md, Event format): a label is 0/1 or a boolean; ``2`` makes the gate refuse the
    file. part-1 alone (int64 labels 0 and 2) is refused, exit 2, "found [2]". Beside part-0, whose labels are
    booleans, one type for the folder would cast part-1's 2 to True and count it as a positive: the folder is
    refused too, naming the column."""
    first = fair(400).astype({"prediction": bool, "label": bool})
    second = fair(400)
    second["label"] = second["label"] * 2  # 0 or 2
    write(second, tmp_path / "alone" / "part-1.parquet")
    alone, _, err = audit(tmp_path, tmp_path / "alone", capsys)
    assert alone == 2 and "found [2]" in err
    write(first, tmp_path / "parts" / "part-0.parquet")
    write(second, tmp_path / "parts" / "part-1.parquet")
    code, report, err = audit(tmp_path, tmp_path / "parts", capsys)
    assert code == 2, (code, report and report["attributes"]["gender"]["groups"]["male"])
    assert "label" in err


@pytest.mark.parametrize("ext", ["parquet", "csv"])
def test_a_value_outside_0_1_in_one_file_of_a_folder_is_one_line_and_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], ext: str
) -> None:
    """One file holds a prediction of 5 on a labelled woman's row, the other file none: counted, the first batch's
    cells would run past the table's end and not add up with the second's (numpy's broadcast error, a traceback).
    The folder is refused in one line, exit 2, as the same value in one file is."""
    bad = fair(40)
    bad.loc[(bad.gender == "female") & (bad.label == 1), "prediction"] = 5
    write(bad, tmp_path / "alone" / f"a.{ext}")
    alone, _, err = audit(tmp_path, tmp_path / "alone", capsys)
    assert alone == 2 and "found [5]" in err
    write(bad, tmp_path / "parts" / f"a.{ext}")
    write(fair(40), tmp_path / "parts" / f"b.{ext}")
    escaped: Exception | None = None
    try:
        code, _, err = audit(tmp_path, tmp_path / "parts", capsys)
    except Exception as exc:  # numpy's broadcast error, had the bad batch been counted
        escaped = exc
    assert escaped is None, f"traceback instead of exit 2: {escaped!r}"
    assert code == 2 and "found [5]" in err and len(err.strip().splitlines()) == 1


@pytest.mark.parametrize("ext", ["parquet", "csv"])
def test_files_differing_in_column_order_blank_columns_and_number_widths_are_read_as_one(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], ext: str
) -> None:
    """What the folder check must not refuse: part-1 writes its columns in another order, no label at all (a blank
    column: its rows are unlabelled), its predictions as another number type (int32 in parquet; 1.0 and 0.0 in CSV)
    and a column no other file has, which the audit does not read. The folder gives the report of the same rows in
    one file."""
    first = biased(400)
    second = fair(400)[["label", "prediction", "gender", "model_id"]]
    second["label"] = None
    second["prediction"] = second["prediction"].astype("int32" if ext == "parquet" else "float64")
    second["note"] = "written by another job"
    write(pd.concat([first, second]), tmp_path / "one" / f"all.{ext}")
    whole, one, _ = audit(tmp_path, tmp_path / "one" / f"all.{ext}", capsys)
    write(first, tmp_path / "parts" / f"part-0.{ext}")
    write(second, tmp_path / "parts" / f"part-1.{ext}")
    code, parts, err = audit(tmp_path, tmp_path / "parts", capsys)
    assert code == whole == 1 and one is not None and parts is not None, err
    assert parts["attributes"] == one["attributes"] and parts["results"] == one["results"]
    assert one["attributes"]["gender"]["groups"]["male"]["labelled"] == 200
