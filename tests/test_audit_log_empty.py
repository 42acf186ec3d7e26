"""``audit-log verify`` of a log with no record never says "intact": a check that evaluated nothing never passes.

A log emptied by someone hiding every failed audit (``: > audit.jsonl``), truncated, or replaced by a file of blank
lines has no record to check: verify says so in one line ("no record ... nothing was verified") and exits 1, in the
keyed mode too (no HMAC was checked). Before, it printed ``PATH: intact, 0 records (...)`` and exited 0. A missing
log stays exit 2, naming it.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def verify(path: Path, key: str | None) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("FAIRNESS_AUDIT_LOG_KEY", None)
    if key is not None:
        env["FAIRNESS_AUDIT_LOG_KEY"] = key
    return subprocess.run([sys.executable, "-m", "exporter.cli", "audit-log", "verify", str(path)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120)  # fmt: skip


@pytest.mark.parametrize("content", [b"", b"\n\n"], ids=["empty", "blank-lines"])
@pytest.mark.parametrize("key", [None, "a-ci-secret"], ids=["plain", "keyed"])
def test_a_log_without_records_is_not_verified_as_intact(tmp_path: Path, content: bytes, key: str | None) -> None:
    log = tmp_path / "audit.jsonl"
    log.write_bytes(content)
    done = verify(log, key)
    said = done.stdout + done.stderr
    # before: "...: intact, 0 records (plain sha256 chain, not checked against a published head)", exit 0
    assert "intact" not in said, said
    assert "empty" in said or "no record" in said, said
    assert done.returncode == 1, said
    assert said.count("\n") == 1, said  # one line


def test_a_missing_log_is_exit_2_naming_it(tmp_path: Path) -> None:
    """Pins the correct behaviour beside it: a log that is not there is named, exit 2."""
    done = verify(tmp_path / "missing.jsonl", None)
    assert done.returncode == 2
    assert f"{tmp_path / 'missing.jsonl'}: No such file or directory" in done.stderr
