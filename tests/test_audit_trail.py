"""The audit trail per model version: every record (audit, bias report, safety, red team) names the model id and
version, `audit-log list` filters by them, and the hash chain of an old log stays verifiable."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
import tabular_models as tm
import yaml

from exporter.cli import main
from exporter.gate import audit_log

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


def run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


def test_every_kind_of_record_names_model_and_version_and_list_filters_them(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    log = str(tmp_path / "log.jsonl")
    config = EXAMPLES / "hiring-screener.yaml"
    data = str(EXAMPLES / "hiring-predictions.csv")
    for version in ("1.0", "1.1"):
        assert run(capsys, "audit", str(config), data, "--audit-log", log, "--model-version", version)[0] == 1
    run(capsys, "bias-report", data, "--protected", "gender", "--outcome", "prediction", "--audit-log", log,
        "--model-id", "hiring-screener-v2", "--model-version", "1.1")  # fmt: skip
    pd.DataFrame(tm.credit_data(50, seed=2)[0], columns=tm.COLUMNS).to_csv(tmp_path / "inputs.csv", index=False)
    (tmp_path / "safety.yaml").write_text(yaml.safe_dump({
        "model_id": "hiring-screener-v2", "model_version": "1.1", "feature_count": 4, "valid_output_range": [0, 1],
        "test_inputs": "inputs.csv"}))  # fmt: skip
    assert run(capsys, "safety", "--model", "tabular_models:fair_model", "--config", str(tmp_path / "safety.yaml"),
               "--audit-log", log)[0] == 0  # fmt: skip
    monkeypatch.chdir(EXAMPLES)
    run(capsys, "redteam", "--config", "red-team.yaml", "--target", "example_models:hardened_moderator",
        "--audit-log", log, "--model-version", "3.0")  # fmt: skip

    code, out, err = run(capsys, "audit-log", "list", log)
    rows = [line.split() for line in out.splitlines()]
    assert code == 0 and err == "5 record(s)\n"
    assert [(r[2], r[3], r[4], r[5]) for r in rows] == [
        ("audit", "hiring-screener-v2", "1.0", "FAIL"), ("audit", "hiring-screener-v2", "1.1", "FAIL"),
        ("bias_report", "hiring-screener-v2", "1.1", "PASS"), ("safety", "hiring-screener-v2", "1.1", "PASS"),
        ("redteam", "content-moderator-v3", "3.0", "PASS")]
    code, out, _ = run(capsys, "audit-log", "list", log, "--model", "hiring-screener-v2", "--version", "1.1",
                       "--json")  # fmt: skip
    records = [json.loads(line) for line in out.splitlines()]
    assert [r["type"] for r in records] == ["audit", "bias_report", "safety"]
    assert records[0]["report"]["model_version"] == "1.1"
    _, out, _ = run(capsys, "audit-log", "list", log, "--type", "redteam", "--json")
    [redteam] = [json.loads(line) for line in out.splitlines()]
    # the config's 4 cases, the library's 104, and baseline_detection
    assert len(redteam["report"]["results"]) == 109 and redteam["model_version"] == "3.0"


def test_a_log_written_before_versions_stays_verifiable_and_is_listed(tmp_path: Path,
                                                                      capsys: pytest.CaptureFixture[str]) -> None:
    log = tmp_path / "old.jsonl"
    audit_log.append(log, {"type": "audit", "timestamp": "2025-01-01T00:00:00Z", "model_id": "m", "verdict": "PASS"})
    run(capsys, "audit", str(EXAMPLES / "hiring-screener.yaml"), str(EXAMPLES / "hiring-predictions.csv"),
        "--audit-log", str(log))  # fmt: skip
    assert audit_log.verify(log).problems == []
    _, out, _ = run(capsys, "audit-log", "list", str(log))
    assert [line.split()[4] for line in out.splitlines()] == ["-", "-"]  # no version recorded, none given
    assert run(capsys, "audit-log", "list", str(log), "--version", "1.0") == (0, "", "0 record(s)\n")
    assert run(capsys, "audit-log", "list", str(tmp_path / "missing.jsonl"))[0] == 2
