"""A CSV file's segment and strata columns are read as their text as written, on every engine, as the daemon reads
its JSON strings (found by review 19: with type inference, branch codes ``007``, ``7`` and ``012`` became the numbers
7, 7 and 12, two branches merged into one segment and one stratum, and the conditional gap 0.008 read 0.149). Oracle:
the same rows read as text (pandas ``dtype=str``) through the same gate; ``backtest`` of the CSV file against its
replay of the same rows as JSON events; Spark's reading of the file.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pandas as pd
import pytest
import yaml
from test_spark import spark  # noqa: F401  (a local SparkSession; skipped without pyspark or Java, failed under CI)

from exporter.backtest.replay import backtest
from exporter.config import load_config
from exporter.gate.fairness.audit import run_audit
from exporter.gate.fairness.frames import open_rows

CDPD = "conditional_demographic_parity_difference"


def _rows(rng: np.random.Generator, n: int, rate_007: float) -> pd.DataFrame:
    """Branch codes as text; in branch 007 women are approved at ``rate_007``, everyone else at 0.5; men mostly go to
    branch 7, women to 007 (so merging the two mixes a gap into the stratum)."""
    gender = rng.choice(["female", "male"], n)
    branch = np.where(gender == "female", rng.choice(["007", "7", "012"], n, p=[0.6, 0.2, 0.2]),
                      rng.choice(["007", "7", "012"], n, p=[0.2, 0.6, 0.2]))  # fmt: skip
    rate = np.where(branch == "007", 0.2, 0.6)
    rate = np.where((gender == "female") & (branch == "007"), rate_007, rate)
    return pd.DataFrame({"gender": gender, "branch": branch, "prediction": (rng.random(n) < rate).astype(int)})


def _config(tmp_path: Path) -> Path:
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump({
        "model_id": "m", "protected_attributes": [{"name": "gender", "groups": ["female", "male"]}],
        "segments": ["branch"], "strata": ["branch"],
        "metrics": [{"name": "demographic_parity_difference", "threshold": 0.05}, {"name": CDPD, "threshold": 0.05}]}))
    return path


def _as_text(path: Path) -> pd.DataFrame:
    return pd.read_csv(path, dtype=str).assign(prediction=lambda f: f.prediction.astype(int))


def test_a_csv_files_segment_and_strata_values_are_their_text(tmp_path: Path) -> None:
    rng = np.random.default_rng(7)
    _rows(rng, 6000, 0.2).to_csv(tmp_path / "before.csv", index=False)
    _rows(rng, 6000, 0.05).to_csv(tmp_path / "after.csv", index=False)
    config = _config(tmp_path)
    from_csv = run_audit(config, str(tmp_path / "after.csv"), baseline=str(tmp_path / "before.csv"))
    oracle = run_audit(config, _as_text(tmp_path / "after.csv"), baseline=_as_text(tmp_path / "before.csv"))
    assert {s["value"] for s in oracle["explanations"][0]["segments"]} == {"007", "7", "012"}
    # before: {'7', '12'}: branches 007 and 7 merged
    assert {s["value"] for s in from_csv["explanations"][0]["segments"]} == {"007", "7", "012"}


def test_a_csv_files_strata_are_not_merged_by_their_numeric_reading(tmp_path: Path) -> None:
    rng = np.random.default_rng(8)
    _rows(rng, 20_000, 0.2).to_csv(tmp_path / "rows.csv", index=False)
    config = _config(tmp_path)
    got = next(r for r in run_audit(config, str(tmp_path / "rows.csv"))["results"] if r["metric"] == CDPD)
    want = next(r for r in run_audit(config, _as_text(tmp_path / "rows.csv"))["results"] if r["metric"] == CDPD)
    assert want["strata"]["used"] == 3
    # before: 2 strata used and a conditional gap of 0.149, where the three branches give 0.008
    assert (got["strata"]["used"], got["exact_value"]) == (3, pytest.approx(want["exact_value"], abs=1e-12))


T0 = 1_800_000_000


def test_backtest_replays_a_csv_files_strata_as_the_daemons_json_strings(tmp_path: Path) -> None:
    """The same rows as a CSV file and as JSON events (``"branch": "007"``, as a producer sends them): ``backtest``
    reports the same conditional comparisons and explanations, and their value is the gate's of the rows as text."""
    rows = _rows(np.random.default_rng(9), 6000, 0.2).assign(model_id="m", timestamp=T0 + 0.5 * np.arange(6000))
    rows.to_csv(tmp_path / "rows.csv", index=False)
    events = [orjson.dumps({"model_id": "m", "prediction_id": f"p{i}", "timestamp": float(r.timestamp),
                            "prediction": int(r.prediction), "label": None,
                            "attributes": {"gender": r.gender, "branch": r.branch}})
              for i, r in enumerate(rows.itertuples())]  # fmt: skip
    (tmp_path / "rows.jsonl").write_bytes(b"\n".join(events) + b"\n")
    config = _config(tmp_path)
    config.write_text(yaml.safe_dump({**yaml.safe_load(config.read_text()), "windows": ["1h"], "bucket": "1m"}))
    parsed = load_config(config)
    from_csv, from_json = backtest(parsed, [tmp_path / "rows.csv"]), backtest(parsed, [tmp_path / "rows.jsonl"])
    assert from_csv == from_json
    (replayed,) = [c for c in from_csv["conditional"]["comparisons"] if c["metric"] == CDPD]
    gate = next(r for r in run_audit(config, _as_text(tmp_path / "rows.csv"))["results"] if r["metric"] == CDPD)
    # before: 0.149 from the CSV file (branches 007 and 7 one stratum), 0.008 from the JSON events
    assert replayed["value"] == pytest.approx(gate["exact_value"], abs=1e-9)


def test_spark_reads_a_csv_files_segment_and_strata_columns_as_text(spark: Any, tmp_path: Path) -> None:  # noqa: F811
    """Spark's reading of a CSV file keeps the branch codes as written, as the local engine's does (its audit counts
    no segments or strata yet: it refuses them, and would read them as text)."""
    from exporter.spark import read

    _rows(np.random.default_rng(10), 300, 0.2).to_csv(tmp_path / "rows.csv", index=False)
    config = load_config(_config(tmp_path)).model()
    df = read(spark, open_rows(str(tmp_path / "rows.csv"), "predictions", config), ["branch"])
    assert dict(df.dtypes)["branch"] == "string"
    assert {r.branch for r in df.select("branch").distinct().collect()} == {"007", "7", "012"}
