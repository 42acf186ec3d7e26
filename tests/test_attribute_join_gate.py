"""The gate joins attributes by id from a side table (attribute_sources.path) in its streamed pass: the report is
the one the merged table gives."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import orjson
import pandas as pd
import pytest
import yaml

from exporter.config import load_config
from exporter.gate.data.dataset import DataError
from exporter.gate.fairness.audit import run_audit

CONFIG = {
    "model_id": "credit-v2",
    "attribute_sources": {"applicants": {"path": "demographics.parquet", "id": "applicant_id"}},
    "protected_attributes": [
        {"name": "gender", "groups": ["male", "female"], "source": "applicants"},
        {"name": "race", "groups": ["white", "black", "asian"], "source": "applicants"},
        {"name": "channel", "groups": ["web", "branch"]},
    ],
    "intersections": [["gender", "race"]],
    "metrics": [{"name": "demographic_parity_difference", "threshold": 0.1},
                {"name": "disparate_impact_ratio", "threshold": 0.8},
                {"name": "equalised_odds_difference", "threshold": 0.2}],
    "min_samples": 10,
}  # fmt: skip


def data(n: int = 3000, seed: int = 3) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Predictions with the id only, and demographics: some ids absent, some written twice (the latest wins)."""
    rng = np.random.default_rng(seed)
    ids = [f"A{i:05d}" for i in rng.integers(0, n, n)]  # some applicants apply twice
    gender = rng.choice(["male", "female", "x"], n, p=[0.5, 0.45, 0.05])
    predictions = pd.DataFrame({"applicant_id": ids, "prediction": (rng.random(n) < np.where(gender == "male", 0.6,
                                                                                          0.45)).astype(int),
                                "label": rng.integers(0, 2, n), "channel": rng.choice(["web", "branch"], n)})
    people = [f"A{i:05d}" for i in range(n) if i % 20]  # every 20th applicant has no record
    demographics = pd.DataFrame({"applicant_id": people, "gender": rng.choice(["male", "female", "x"], len(people)),
                                 "race": rng.choice(["white", "black", "asian", None], len(people))})  # fmt: skip
    stale = demographics.sample(n // 15, random_state=1).assign(gender="female", race="black")
    return predictions, pd.concat([stale, demographics], ignore_index=True)  # the stale rows come first


def written(rows: pd.DataFrame, demographics: pd.DataFrame, folder: Path, split: int) -> Path:
    """``rows`` as a folder of two parquet parts (split at row ``split``), demographics.parquet beside it."""
    folder.mkdir()
    rows.iloc[:split].to_parquet(folder / "part-0.parquet")
    rows.iloc[split:].to_parquet(folder / "part-1.parquet")
    demographics.to_parquet(folder.parent / "demographics.parquet")
    return folder


def comparable(report: dict) -> dict:
    return {k: report[k] for k in ("rows", "attributes", "results", "verdict")} | {
        "impact_ratios": {k: v for k, v in report["impact_ratios"].items() if k != "source"}}


def test_a_predictions_folder_with_ids_only_gives_the_report_of_the_merged_table(tmp_path: Path) -> None:
    predictions, demographics = data()
    folder = written(predictions, demographics, tmp_path / "predictions", 1700)
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(CONFIG))
    joined = run_audit(tmp_path / "config.yaml", folder)
    latest = demographics.drop_duplicates("applicant_id", keep="last")
    merged = predictions.merge(latest, on="applicant_id", how="left")
    plain = {**CONFIG, "attribute_sources": None,
             "protected_attributes": [{k: v for k, v in a.items() if k != "source"}
                                      for a in CONFIG["protected_attributes"]]}  # fmt: skip
    (tmp_path / "plain.yaml").write_text(yaml.safe_dump({k: v for k, v in plain.items() if v is not None}))
    expected = run_audit(tmp_path / "plain.yaml", merged)
    assert comparable(joined) == comparable(expected)
    assert joined["attributes"]["gender"]["excluded_rows"] > 150  # the missing ids and the "x" values


def test_small_batches_give_the_same_counts(tmp_path: Path) -> None:
    from exporter.gate.data.side import JoinedRows
    from exporter.gate.fairness.frames import FrameRows, scan

    predictions, demographics = data(500)
    demographics.to_parquet(tmp_path / "demographics.parquet")
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(CONFIG))
    model = load_config(tmp_path / "config.yaml").model()
    whole = scan(model, JoinedRows.of(model, FrameRows(predictions), "p"), "p").tally.counts()
    small = scan(model, JoinedRows.of(model, FrameRows(predictions), "p", batch_rows=7), "p").tally.counts()
    assert all((whole[k] == small[k]).all() for k in whole)


@pytest.mark.parametrize(("change", "line"), [
    ("no_id_in_predictions", "no column 'applicant_id', the id attribute_sources.applicants.id joins by"),
    ("no_id_in_table", "attribute_sources.applicants.path: .*missing column\\(s\\) \\['applicant_id'\\]"),
    ("no_path", "attribute_sources.applicants.path: required by the gate"),
])  # fmt: skip
def test_bad_input_is_refused_in_one_line_naming_the_field(tmp_path: Path, change: str, line: str) -> None:
    predictions, demographics = data(200)
    config = {**CONFIG, "attribute_sources": {"applicants": {"path": "demographics.parquet", "id": "applicant_id"}}}
    if change == "no_id_in_predictions":
        predictions = predictions.rename(columns={"applicant_id": "customer"})
    if change == "no_id_in_table":
        demographics = demographics.rename(columns={"applicant_id": "person"})
    if change == "no_path":
        config["attribute_sources"] = {"applicants": {"topic": "demographics", "id": "applicant_id"}}
    predictions.to_parquet(tmp_path / "predictions.parquet")
    demographics.to_parquet(tmp_path / "demographics.parquet")
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(config))
    with pytest.raises(DataError, match=line):
        run_audit(tmp_path / "config.yaml", tmp_path / "predictions.parquet")
    cli = subprocess.run([sys.executable, "-m", "exporter.cli", "audit", str(tmp_path / "config.yaml"),
                          str(tmp_path / "predictions.parquet")], capture_output=True, text=True)  # fmt: skip
    assert cli.returncode == 2 and len(cli.stderr.strip().splitlines()) == 1, cli.stderr
    assert "female" not in cli.stderr and "black" not in cli.stderr


def test_backtest_of_events_with_ids_only_reports_what_the_events_with_their_attributes_report(
        tmp_path: Path) -> None:  # fmt: skip
    from exporter.backtest.replay import backtest
    from exporter.config import parse_config

    rng = np.random.default_rng(9)
    n, t0 = 6000, 1_800_000_000.0
    people = {f"A{i:04d}": (str(rng.choice(["male", "female"])), str(rng.choice(["white", "black", "asian"])))
              for i in range(1500)}  # fmt: skip
    ids = [f"A{i:04d}" for i in rng.integers(0, 1600, n)]  # some have no record
    inline, by_id = [], []
    for k, aid in enumerate(ids):
        gender, race = people.get(aid, (None, None))
        rate = 0.6 if gender == "male" or k < n // 2 else 0.3  # a drift in the second half
        event = {"model_id": "credit-v2", "prediction_id": f"p{k}", "timestamp": t0 + 3 * k,
                 "prediction": int(rng.random() < rate)}  # fmt: skip
        inline.append({**event, "attributes": {"gender": gender, "race": race}})
        by_id.append({**event, "attributes": {"applicant_id": aid}})
    for name, rows in (("inline.jsonl", inline), ("ids.jsonl", by_id)):
        (tmp_path / name).write_bytes(b"\n".join(orjson.dumps(r) for r in rows))
    pd.DataFrame([{"applicant_id": k, "gender": g, "race": r} for k, (g, r) in people.items()]).to_parquet(
        tmp_path / "demographics.parquet")
    plain = {"model_id": "credit-v2", "min_samples": 20, "windows": ["1h"], "bucket": "1m",
             "protected_attributes": [{"name": "gender", "groups": ["male", "female"]},
                                      {"name": "race", "groups": ["white", "black", "asian"]}]}  # fmt: skip
    joined = {**plain, "attribute_sources": {"applicants": {"path": "demographics.parquet", "id": "applicant_id"}},
              "protected_attributes": [{**a, "source": "applicants"} for a in plain["protected_attributes"]]}
    expected = backtest(parse_config(plain, str(tmp_path / "plain.yaml")), [tmp_path / "inline.jsonl"])
    got = backtest(parse_config(joined, str(tmp_path / "joined.yaml")), [tmp_path / "ids.jsonl"])
    assert got["alerts"] == expected["alerts"] and expected["alerts"]
    assert {k: v for k, v in got.items() if k != "alerts"} == {k: v for k, v in expected.items() if k != "alerts"}
