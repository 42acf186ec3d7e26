"""The NYC Local Law 144 table: a hand-computed case in JSON and CSV, unknown and small categories, scoring rates."""

from __future__ import annotations

import csv
import hashlib
import json
from pathlib import Path

import pandas as pd
import pytest
import yaml

from exporter.cli import main
from exporter.gate.fairness.audit import sha256_file
from exporter.gate.fairness.ll144 import CSV_COLUMNS


def manifest_of(path: Path) -> str:
    """The manifest hash of a one-file dataset: the SHA-256 of the line `<sha256>  <size>  <name>`."""
    return hashlib.sha256(f"{sha256_file(path)}  {path.stat().st_size}  {path.name}\n".encode()).hexdigest()


def ll144_config(tmp_path: Path, **extra: object) -> Path:
    config = {"model_id": "screener", "min_samples": 1,
              "protected_attributes": [{"name": "gender", "groups": ["male", "female", "non_binary"]},
                                       {"name": "race", "groups": ["white", "black"]}],
              "intersections": [["gender", "race"]],
              "metrics": [{"name": "disparate_impact_ratio", "threshold": 0.8, "severity_on_fail": "warning"}],
              **extra}  # fmt: skip
    path = tmp_path / "ll144.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def block(gender: str, race: str, rows: int, selected: int) -> pd.DataFrame:
    return pd.DataFrame({"gender": gender, "race": race, "prediction": [1] * selected + [0] * (rows - selected)})


def hand_case(tmp_path: Path) -> Path:
    """100 rows. male: white 20/30 selected, black 5/20; female: white 8/20, black 4/20; non_binary: white 1/1
    (1% of the data: a small category); 9 rows whose gender was not disclosed (black, none selected)."""
    frame = pd.concat([block("male", "white", 30, 20), block("male", "black", 20, 5),
                       block("female", "white", 20, 8), block("female", "black", 20, 4),
                       block("non_binary", "white", 1, 1), block("undisclosed", "black", 9, 0)],
                      ignore_index=True)  # fmt: skip
    frame["timestamp"] = pd.date_range("2026-01-05", "2026-03-31", periods=len(frame), tz="UTC")
    path = tmp_path / "hiring.csv"
    frame.sample(frac=1.0, random_state=1).to_csv(path, index=False)
    return path


def test_hand_computed_ll144_table_in_json_and_csv(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    data = hand_case(tmp_path)
    table_path = tmp_path / "ll144.csv"
    code = main(["audit", str(ll144_config(tmp_path)), str(data), "--audit-log", str(tmp_path / "log"),
                 "--impact-ratios-csv", str(table_path)])  # fmt: skip
    table = json.loads(capsys.readouterr().out)["impact_ratios"]
    assert code == 0
    assert table["source"] == {"file": str(data), "manifest_sha256": manifest_of(data)}
    assert table["date_range"] == {"column": "timestamp", "start": "2026-01-05T00:00:00Z",
                                   "end": "2026-03-31T00:00:00Z", "rows_without_date": 0}  # fmt: skip
    assert (table["rate_kind"], table["score_median"], table["small_category_share"]) == ("selection_rate", None, 0.02)

    gender = table["attributes"]["gender"]
    rows = {r["category"]: r for r in gender["categories"]}
    assert (gender["unknown_rows"], gender["reference_category"]) == (9, "male")
    assert rows["male"] == {"category": "male", "samples": 50, "share": 0.5, "rate": 0.5, "impact_ratio": 1.0,
                            "small_category": False}  # fmt: skip
    assert (rows["female"]["rate"], rows["female"]["impact_ratio"]) == (pytest.approx(0.3), pytest.approx(0.6))
    # 1 of 1 selected, 1% of the rows: flagged and kept with its count and rate, never the reference, and left out
    # of the impact ratios as the DCWP rules allow (before: 1.0 / 0.5 = 2.0, a ratio above 1, which is none)
    assert rows["non_binary"] == {"category": "non_binary", "samples": 1, "share": 0.01, "rate": 1.0,
                                  "impact_ratio": None, "small_category": True}  # fmt: skip

    race = {r["category"]: r for r in table["attributes"]["race"]["categories"]}
    assert (race["white"]["samples"], race["black"]["samples"]) == (51, 49)
    assert race["black"]["impact_ratio"] == pytest.approx((9 / 49) / (29 / 51))
    assert table["attributes"]["race"]["unknown_rows"] == 0

    cross = table["attributes"]["gender_x_race"]
    ratios = {r["category"]: r["impact_ratio"] for r in cross["categories"]}
    assert cross["reference_category"] == "male:white" and cross["unknown_rows"] == 9
    assert ratios == pytest.approx({"male:white": 1.0, "male:black": 0.375, "female:white": 0.6, "female:black": 0.3,
                                    "non_binary:white": None, "non_binary:black": None})  # fmt: skip
    empty = next(r for r in cross["categories"] if r["category"] == "non_binary:black")
    assert (empty["samples"], empty["rate"], empty["small_category"]) == (0, None, True)

    with table_path.open() as f:
        lines = list(csv.DictReader(f))
    assert tuple(lines[0]) == CSV_COLUMNS
    by_key = {(r["attribute"], r["category"]): r for r in lines}
    assert len(lines) == 3 + 1 + 2 + 1 + 6 + 1
    assert by_key["gender", "female"] == {
        "model_id": "screener", "data_file": str(data), "data_manifest_sha256": manifest_of(data),
        "date_start": "2026-01-05T00:00:00Z", "date_end": "2026-03-31T00:00:00Z", "attribute": "gender",
        "category": "female", "samples": "40", "share": "0.4000", "rate_kind": "selection_rate", "rate": "0.3000",
        "impact_ratio": "0.6000", "small_category": "false"}  # fmt: skip
    assert (by_key["gender", "non_binary"]["small_category"], by_key["gender", "non_binary"]["impact_ratio"],
            by_key["gender", "non_binary"]["rate"]) == ("true", "", "1.0000")
    assert (by_key["gender", "(unknown)"]["samples"], by_key["gender", "(unknown)"]["share"]) == ("9", "0.0900")
    assert by_key["race", "black"]["impact_ratio"] == f"{(9 / 49) / (29 / 51):.4f}" == "0.3230"


def test_unknown_values_as_other_count_in_the_unknown_category(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    main(["audit", str(ll144_config(tmp_path, unknown_values="other")), str(hand_case(tmp_path)),
          "--audit-log", str(tmp_path / "log")])  # fmt: skip
    table = json.loads(capsys.readouterr().out)["impact_ratios"]["attributes"]
    assert table["gender"]["unknown_rows"] == 9
    assert [r["category"] for r in table["gender"]["categories"]] == ["male", "female", "non_binary"]
    assert table["gender_x_race"]["unknown_rows"] == 9


def test_score_outputs_get_scoring_rates_above_the_median(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # median of the six scores is (0.7 + 0.3) / 2 = 0.5: men 2 of 3 above it, women 1 of 3
    frame = pd.DataFrame({"gender": ["male"] * 3 + ["female"] * 3, "race": ["white", "black"] * 3,
                          "prediction": [1, 1, 0, 1, 0, 0], "score": [0.9, 0.8, 0.3, 0.7, 0.2, 0.1]})  # fmt: skip
    data = tmp_path / "scores.csv"
    frame.to_csv(data, index=False)
    main(["audit", str(ll144_config(tmp_path, columns={"score": "score"})), str(data),
          "--audit-log", str(tmp_path / "log")])  # fmt: skip
    table = json.loads(capsys.readouterr().out)["impact_ratios"]
    assert (table["rate_kind"], table["score_median"], table["date_range"]) == ("scoring_rate", 0.5, None)
    gender = {r["category"]: r for r in table["attributes"]["gender"]["categories"]}
    assert gender["male"]["rate"] == pytest.approx(2 / 3) and gender["female"]["rate"] == pytest.approx(1 / 3)
    assert gender["female"]["impact_ratio"] == pytest.approx(0.5)


def test_missing_or_non_numeric_score_column_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    data = hand_case(tmp_path)
    config = ll144_config(tmp_path, columns={"score": "probability"})
    assert main(["audit", str(config), str(data), "--audit-log", str(tmp_path / "log")]) == 2
    assert "no score column 'probability' (columns.score)" in capsys.readouterr().err
