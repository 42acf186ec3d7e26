"""``audit-log verify`` checks the bytes of each record, not only what a JSON parser makes of them.

The writer (``_line`` in exporter/gate/audit_log.py) writes a record as
``json.dumps(record, sort_keys=True, ensure_ascii=False)``, and the chain hashes the parsed record. Python's json
keeps the LAST of two equal keys, so whoever can write the file (no key needed) could put ``"verdict": "PASS"`` in
front of a record's real ``"verdict": "FAIL"``: the parsed record, its hash and its HMAC were unchanged and verify
said "intact", while grep, a human reading the line and first-key parsers read a passing audit. Verify now
requires each line to be exactly the writer's serialisation of the record it parses to: a repeated key, reordered
keys or changed spacing are an edit, named with the line number; logs this writer wrote still verify.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from exporter.gate import audit_log

ROOT = Path(__file__).resolve().parent.parent


def cli(*args: str, key: str | None) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("FAIRNESS_AUDIT_LOG_KEY", None)
    if key is not None:
        env["FAIRNESS_AUDIT_LOG_KEY"] = key
    return subprocess.run([sys.executable, "-m", "exporter.cli", *args], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=300)  # fmt: skip


@pytest.mark.parametrize("key", [None, "a-ci-secret"], ids=["plain", "keyed"])
def test_a_duplicated_verdict_key_flipping_a_failed_audit_to_pass_is_detected(tmp_path: Path, key: str | None) -> None:
    log = tmp_path / "audit.jsonl"
    report = tmp_path / "report.json"
    run = cli("audit", "examples/hiring-screener.yaml", "examples/hiring-predictions.csv", "--audit-log", str(log),
              "--report", str(report), key=key)  # fmt: skip
    assert run.returncode == 1  # the shipped example blocks
    head = json.loads(report.read_text())["audit_log"]["hash"]
    assert cli("audit-log", "verify", str(log), "--expect-head", head, key=key).returncode == 0
    line = log.read_text()
    assert line.count("\n") == 1 and json.loads(line)["verdict"] == "FAIL"

    # the tamper: the attacker (who has no key) prepends a PASS verdict to the FAIL record
    log.write_text('{"verdict": "PASS", ' + line[1:])
    first_wins = json.loads(log.read_text(), object_pairs_hook=lambda pairs: dict(reversed(pairs)))
    assert first_wins["verdict"] == "PASS"  # what grep, a human and first-key parsers now read

    done = cli("audit-log", "verify", str(log), "--expect-head", head, key=key)
    # before: exit 0, "intact, 1 records (..., head as expected)"
    assert done.returncode == 1, done.stdout + done.stderr
    assert "line 1: key 'verdict' written twice" in done.stderr


def a_log(tmp_path: Path) -> Path:
    log = tmp_path / "audit.jsonl"
    for verdict in ("PASS", "FAIL", "PASS"):
        audit_log.append(log, {"type": "audit", "model_id": "m", "verdict": verdict, "author": "José Núñez"})
    return log


def test_a_log_the_writer_wrote_verifies(tmp_path: Path) -> None:
    """The check of the bytes accepts the writer's own lines, non-ASCII text included."""
    log = a_log(tmp_path)
    assert audit_log.verify(log).problems == []
    assert audit_log.verify(log).records == 3


@pytest.mark.parametrize("edit", ["reordered", "respaced", "ascii-escaped"])
def test_a_line_rewritten_to_the_same_record_is_an_edit_named_by_its_line(tmp_path: Path, edit: str) -> None:
    """Same parsed record, same hash, other bytes: reported on its line (the chain itself stays whole)."""
    log = a_log(tmp_path)
    lines = log.read_text(encoding="utf-8").splitlines()
    record = json.loads(lines[1])
    lines[1] = {"reordered": json.dumps(dict(reversed(record.items())), ensure_ascii=False),
                "respaced": json.dumps(record, sort_keys=True, ensure_ascii=False, indent=None, separators=(",", ":")),
                "ascii-escaped": json.dumps(record, sort_keys=True)}[edit]  # fmt: skip
    log.write_text("\n".join(lines) + "\n", encoding="utf-8")
    assert json.loads(lines[1]) == record
    assert audit_log.verify(log).problems == [
        "line 2: not the bytes the gate writes for its record (keys reordered or respaced: it was edited)"]
