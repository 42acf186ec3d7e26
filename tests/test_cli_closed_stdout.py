"""A reader that closes the command's standard output (``fairness-exporter audit ... | head -c 100``) gets one line
and exit 141, not a traceback: the report files and the audit-log record were written before anything was printed,
and the status says the printing was cut short rather than passing for a verdict. Before, Python's
BrokenPipeError traceback, or "Exception ignored ... BrokenPipeError" at the exit flush and exit 120."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import yaml

ROOT = Path(__file__).resolve().parent.parent


def audit(tmp_path: Path, *, read: bool) -> subprocess.CompletedProcess[bytes]:
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump({
        "model_id": "m1", "min_samples": 1,
        "protected_attributes": [{"name": "gender", "groups": ["male", "female"]}],
        "metrics": [{"name": "demographic_parity_difference", "threshold": 0.05, "severity_on_fail": "blocking"}]}))
    data = tmp_path / "preds.csv"
    pd.DataFrame({"gender": ["male"] * 10 + ["female"] * 10, "prediction": [1] * 6 + [0] * 4 + [1] * 3 + [0] * 7,
                  "label": [1, 0] * 10}).to_csv(data, index=False)  # fmt: skip
    command = [sys.executable, "-m", "exporter.cli", "audit", str(config), str(data), "--audit-log",
               str(tmp_path / "log.jsonl"), "--report", str(tmp_path / "report.json")]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    process = subprocess.Popen(command, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert process.stdout is not None and process.stderr is not None
    out = process.stdout.read() if read else b""
    process.stdout.close()  # unread: the reader is gone before the report is printed
    err = process.stderr.read()
    return subprocess.CompletedProcess(command, process.wait(timeout=120), out, err)


def test_a_closed_standard_output_is_one_line_and_exit_141_with_the_report_and_log_written(tmp_path: Path) -> None:
    done = audit(tmp_path, read=False)
    err = done.stderr.decode()
    assert done.returncode == 141, err
    assert "Traceback" not in err and "Exception ignored" not in err, err
    assert "standard output closed by its reader" in err, err
    assert err.count("fairness-exporter audit:") == 1, err
    # nothing already done is lost: the report and the log's record of the blocking failure
    assert json.loads((tmp_path / "report.json").read_text())["verdict"] == "FAIL"
    records = [json.loads(line) for line in (tmp_path / "log.jsonl").read_text().splitlines() if line.strip()]
    assert [r["verdict"] for r in records] == ["FAIL"]


def test_a_read_standard_output_keeps_the_verdicts_exit_status(tmp_path: Path) -> None:
    """Pins the status beside it: the gap 0.6 - 0.3 blocks, exit 1, the report printed whole."""
    done = audit(tmp_path, read=True)
    assert done.returncode == 1, done.stderr.decode()
    assert json.loads(done.stdout)["results"][0]["value"] == 0.3
