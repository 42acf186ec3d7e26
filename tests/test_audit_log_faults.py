"""The audit trail under faults, through the command line: a torn last line, a log path that is a directory, a
numeric attribute column with a blank cell, and what the plain and the keyed chains each detect."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
from test_audit_gate import balanced, run, write_config, write_rows

from exporter.cli import main
from exporter.gate.audit_log import record_hash

KEY_ENV = "FAIRNESS_AUDIT_LOG_KEY"


def audit(tmp_path: Path, capsys: pytest.CaptureFixture[str], log: Path) -> tuple[int, dict | None, str]:
    return run(capsys, "audit", str(write_config(tmp_path)), str(write_rows(tmp_path, balanced())),
               "--audit-log", str(log))  # fmt: skip


def verify(capsys: pytest.CaptureFixture[str], log: Path, *extra: str) -> tuple[int, str, str]:
    code = main(["audit-log", "verify", str(log), *extra])
    out, err = capsys.readouterr()
    return code, out, err


def test_a_torn_last_line_is_reported_recorded_and_the_log_goes_on(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    log = tmp_path / "log.jsonl"
    audit(tmp_path, capsys, log)
    whole = log.read_bytes()
    torn = whole[: len(whole) // 2]  # a crash half way through writing a second record
    log.write_bytes(whole + torn)

    code, _, err = verify(capsys, log)
    assert code == 1
    assert f"line 2: torn: its {len(torn)} bytes are not a record" in err

    code, report, err = audit(tmp_path, capsys, log)  # before: JSONDecodeError, and no record written
    assert code == 0 and report is not None and report["audit_log"]["seq"] == 2
    assert f"line 2 was torn ({len(torn)} bytes, not a record: a write cut short); recorded as record 1" in err
    lines = log.read_bytes().splitlines()
    assert lines[1] == torn  # kept as evidence
    recovery = json.loads(lines[2])
    assert recovery["type"] == "torn_record" and recovery["line"] == 2 and recovery["bytes"] == len(torn)
    assert recovery["sha256"] == hashlib.sha256(torn).hexdigest()

    code, out, err = verify(capsys, log, "--expect-head", report["audit_log"]["hash"])
    assert code == 0 and "intact, 3 records" in out
    assert f"line 2: torn record ({len(torn)} bytes, a write cut short), recorded by record 1 on line 3" in err

    lines[1] = lines[1][:-1] + b"X"  # editing the torn bytes afterwards is an edit
    log.write_bytes(b"\n".join(lines) + b"\n")
    code, _, err = verify(capsys, log)
    assert code == 1 and "line 2: not a record" in err and "not a recorded torn write" in err


def test_an_audit_log_that_is_a_directory_is_a_clean_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    log = tmp_path / "logs"
    log.mkdir()
    code, report, err = audit(tmp_path, capsys, log)
    assert (code, report) == (2, None)
    assert err.strip() == f"fairness-exporter audit: --audit-log {log}: Is a directory"


def test_a_blank_cell_leaves_a_numeric_attribute_column_in(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # an integer column with one blank cell reaches pandas as floats: "1.0" matched no group "1" before
    rows = {**balanced(), "band": [1, 2] * 10}
    rows["band"][0] = None
    config = write_config(tmp_path, protected_attributes=[
        {"name": "gender", "groups": ["male", "female"]}, {"name": "band", "groups": [1, 2]}])  # fmt: skip
    _, report, _ = run(capsys, "audit", str(config), str(write_rows(tmp_path, rows)),
                       "--audit-log", str(tmp_path / "l.jsonl"))  # fmt: skip
    assert report is not None
    groups = report["attributes"]["band"]["groups"]
    assert (groups["1"]["samples"], groups["2"]["samples"]) == (9, 10)  # the blank row is band's unknown only
    assert report["attributes"]["gender"]["groups"]["male"]["samples"] == 10  # and still counts for gender


def _rewrite_second_record(log: Path, key: bytes | None) -> None:
    """What a writer of the file can do: change a record and recompute every later hash (with the key or not)."""
    records = [json.loads(line) for line in log.read_text().splitlines()]
    records[1]["verdict"] = "FAIL"
    for i in range(1, len(records)):
        if key is None:
            records[i].pop("chain", None)
        else:
            records[i]["chain"] = "hmac-sha256"
        records[i]["prev_hash"] = records[i - 1]["hash"]
        records[i]["hash"] = record_hash(records[i], key)
    log.write_text("".join(json.dumps(r, sort_keys=True) + "\n" for r in records))


def test_a_recomputed_plain_chain_needs_the_published_head(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    log = tmp_path / "log.jsonl"
    head = [audit(tmp_path, capsys, log)[1] for _ in range(3)][-1]["audit_log"]["hash"]  # type: ignore[index]
    _rewrite_second_record(log, key=None)
    assert verify(capsys, log)[0] == 0  # what the plain chain cannot see on its own
    code, _, err = verify(capsys, log, "--expect-head", head)
    assert code == 1 and "expected head" in err


def test_a_keyed_chain_detects_a_rewrite_without_the_key(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(KEY_ENV, "s3cret shared with CI only")
    log = tmp_path / "log.jsonl"
    for _ in range(3):
        audit(tmp_path, capsys, log)
    assert all(json.loads(line)["chain"] == "hmac-sha256" for line in log.read_text().splitlines())
    code, out, _ = verify(capsys, log)
    assert code == 0 and "intact, 3 records (keyed (hmac-sha256)" in out

    _rewrite_second_record(log, key=None)  # recomputed as a plain chain: refused
    code, _, err = verify(capsys, log)
    assert code == 1 and "line 2: the record is not keyed" in err
    _rewrite_second_record(log, key=b"a guessed key")  # recomputed with another key: refused
    code, _, err = verify(capsys, log)
    assert code == 1 and "line 2: hash does not match the record's content" in err

    monkeypatch.delenv(KEY_ENV)
    code, _, err = verify(capsys, log)
    assert code == 1 and f"the record is keyed (hmac-sha256); set {KEY_ENV} to verify it" in err


@pytest.mark.parametrize("device", ["/dev/zero", "/dev/null"])
def test_a_log_that_is_a_device_is_refused_in_one_line_not_read_forever(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], device: str
) -> None:
    # /dev/zero reads as one endless line: appending to it or verifying it never returned before
    code, report, err = audit(tmp_path, capsys, Path(device))
    assert code == 2 and report is None
    assert err.strip().splitlines()[-1].endswith(f"{device}: not a regular file (an audit log is a file of its own)")
    assert not list(tmp_path.glob("*.json"))  # no report claims a record that was never written

    code, out, err = verify(capsys, Path(device))
    assert code == 2 and out == ""
    assert err.strip() == (f"fairness-exporter audit-log verify: {device}: not a regular file (an audit log is a "
                           "file of its own)")
