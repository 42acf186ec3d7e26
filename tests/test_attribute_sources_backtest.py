"""``backtest`` of parquet/CSV events whose attributes are joined by id (attribute_sources.path): the side table is
the gate's and the daemon's, joined in the same streamed pass, so the replay equals the replay of the merged table,
and its counts equal the gate's."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
from s3_fixture import S3
from test_attribute_join_gate import written

from exporter.backtest.input import BacktestError
from exporter.backtest.replay import backtest
from exporter.config import parse_config
from exporter.gate.fairness.audit import run_audit

PLAIN: dict[str, Any] = {
    "model_id": "credit-v2", "min_samples": 20, "windows": ["24h"], "bucket": "1m",
    "protected_attributes": [{"name": "gender", "groups": ["male", "female"]},
                             {"name": "race", "groups": ["white", "black", "asian"]}],
    "metrics": [{"name": "demographic_parity_difference", "threshold": 0.1},
                {"name": "equalised_odds_difference", "threshold": 0.2}],
}  # fmt: skip
JOINED = {**PLAIN, "attribute_sources": {"applicants": {"path": "demographics.parquet", "id": "applicant_id"}},
          "protected_attributes": [{**a, "source": "applicants"} for a in PLAIN["protected_attributes"]]}


def recorded(n: int = 6000, seed: int = 9) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Events with the applicant's id only (some ids without a record, a drift against women halfway), and the
    demographics: stale rows of some ids first (the latest row wins), a blank race here and there."""
    rng = np.random.default_rng(seed)
    people = pd.DataFrame({"applicant_id": [f"A{i:04d}" for i in range(1500)],
                           "gender": rng.choice(["male", "female", "x"], 1500, p=[0.48, 0.48, 0.04]),
                           "race": rng.choice(["white", "black", "asian", None], 1500)})  # fmt: skip
    stale = people.sample(100, random_state=2).assign(gender="female", race="black")
    ids = np.array([f"A{i:04d}" for i in rng.integers(0, 1600, n)])  # ids past A1499 have no record
    male = np.isin(ids, people.loc[people["gender"] == "male", "applicant_id"])
    rate = np.where(male | (np.arange(n) < n // 2), 0.6, 0.3)
    events = pd.DataFrame({"model_id": "credit-v2", "prediction_id": [f"p{k}" for k in range(n)],
                           "timestamp": 1_800_000_000.0 + 3 * np.arange(n), "applicant_id": ids,
                           "prediction": (rng.random(n) < rate).astype(int), "label": rng.integers(0, 2, n)})
    return events, pd.concat([stale, people], ignore_index=True)


def test_backtest_of_an_id_only_folder_equals_the_merged_table_and_the_gates_counts(tmp_path: Path) -> None:
    events, demographics = recorded()
    folder = written(events, demographics, tmp_path / "events", 3500)
    merged = events.merge(demographics.drop_duplicates("applicant_id", keep="last"), on="applicant_id", how="left")
    merged.drop(columns="applicant_id").to_parquet(tmp_path / "merged.parquet")
    joined = parse_config(JOINED, str(tmp_path / "joined.yaml"))
    expected = backtest(parse_config(PLAIN, str(tmp_path / "plain.yaml")), [tmp_path / "merged.parquet"])
    got = backtest(joined, [folder])
    assert got == expected
    assert expected["alerts"] and expected["series"] and expected["events"] == 6000
    for form in ("csv", "glob"):  # a CSV file and a glob of the parquet parts: the same replay
        location = tmp_path / "events.csv" if form == "csv" else f"{folder}/part-*.parquet"
        if form == "csv":
            events.to_csv(location, index=False)
        assert backtest(joined, [location]) == expected
    # the gate on the same folder: the replay's last step over a window holding every event gives its numbers
    gate = run_audit(joined.model(), folder)
    replayed = {(w["attribute"], w["metric"]): {k: v for k, v in w.items() if k != "window"} for w in got["worst"]}
    assert len(gate["worst"]) == 4 and all(replayed[(w["attribute"], w["metric"])] == {k: w[k] for k in (
        "attribute", "metric", "dimension", "value", "ci_simultaneous", "comparisons_judged")}
        for w in gate["worst"])  # fmt: skip


def test_backtest_of_a_bucket_prefix_joins_as_the_local_folder(s3: S3, tmp_path: Path) -> None:
    events, demographics = recorded(2000, seed=3)
    folder = written(events, demographics, tmp_path / "events", 800)
    fs = s3.filesystem()
    fs.mkdir("lake")
    fs.put(f"{folder}/", "lake/credit/2026-01/", recursive=True)
    joined = parse_config(JOINED, str(tmp_path / "joined.yaml"))
    local = backtest(joined, [folder])
    assert backtest(joined, ["s3://lake/credit/"]) == local and local["events"] == 2000


def test_backtest_of_a_table_without_the_id_column_is_one_line(tmp_path: Path) -> None:
    events, demographics = recorded(300)
    events.rename(columns={"applicant_id": "customer"}).to_parquet(tmp_path / "events.parquet")
    demographics.to_parquet(tmp_path / "demographics.parquet")
    with pytest.raises(BacktestError, match=r"missing column\(s\) \['applicant_id'\]") as caught:
        backtest(parse_config(JOINED, str(tmp_path / "joined.yaml")), [tmp_path / "events.parquet"])
    assert "\n" not in str(caught.value) and "female" not in str(caught.value)
