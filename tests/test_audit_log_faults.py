"""The audit trail under faults, through the command line: a torn last line, two crashes in a row, a line Python's
JSON reader refuses, a log path that is a directory, a device or a FIFO, a numeric attribute column with a blank
cell, and what the plain and the keyed chains each detect."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from test_audit_gate import balanced, run, write_config, write_rows

from exporter.cli import main
from exporter.gate import audit_log
from exporter.gate.audit_log import record_hash

KEY_ENV = "FAIRNESS_AUDIT_LOG_KEY"
ROOT = Path(__file__).resolve().parent.parent


def audit(tmp_path: Path, capsys: pytest.CaptureFixture[str], log: Path) -> tuple[int, dict | None, str]:
    return run(capsys, "audit", str(write_config(tmp_path)), str(write_rows(tmp_path, balanced())),
               "--audit-log", str(log))  # fmt: skip


def verify(capsys: pytest.CaptureFixture[str], log: Path, *extra: str) -> tuple[int, str, str]:
    code = main(["audit-log", "verify", str(log), *extra])
    out, err = capsys.readouterr()
    return code, out, err


def cli(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """A separate process: a FIFO that blocks, a read that eats memory, a traceback are seen as a user sees them."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop(KEY_ENV, None)
    return subprocess.run([sys.executable, "-m", "exporter.cli", *args], capture_output=True, text=True,
                          timeout=timeout, env=env, cwd=ROOT)  # fmt: skip


def gate(tmp_path: Path, log: Path) -> subprocess.CompletedProcess[str]:
    return cli("audit", str(write_config(tmp_path)), str(write_rows(tmp_path, balanced())), "--audit-log", str(log))


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


def test_two_crashes_in_a_row_are_both_recorded_and_the_log_verifies(tmp_path: Path) -> None:
    """Crash 1 tears run 2's record; run 3 starts to write the torn_record for it and is cut short too (disk full
    twice, a killed job); run 4 records both torn lines. Before, it recorded only the newest one: nobody edited
    anything, yet the first torn line stayed 'no torn_record after it' (an edit) for ever."""
    log = tmp_path / "log.jsonl"
    audit_log.append(log, {"type": "audit", "verdict": "PASS"})
    one = log.read_bytes()
    audit_log.append(log, {"type": "audit", "verdict": "FAIL", "report": "r" * 2000})
    log.write_bytes(log.read_bytes()[: len(one) + 300])  # crash 1: 300 bytes of run 2's record
    audit_log.append(log, {"type": "audit", "verdict": "PASS", "report": "s" * 2000})
    after_run3 = log.read_bytes()
    end_of_torn_1 = after_run3.index(b"\n", len(one)) + 1  # run 3 first ended the torn line ...
    log.write_bytes(after_run3[: end_of_torn_1 + 40])  # crash 2: ... then wrote 40 bytes of its torn_record
    proc = gate(tmp_path, log)  # run 4, a whole run through the CLI
    assert proc.returncode == 0, proc.stderr

    result = cli("audit-log", "verify", str(log))
    # seen: exit 1, "line 2: not a record (...) and no torn_record after it" although both lines are crashes
    assert result.returncode == 0, result.stderr
    assert "line 2: torn record" in result.stderr and "line 3: torn record" in result.stderr


def test_a_crash_while_recording_the_second_of_two_torn_lines_is_recorded_too(tmp_path: Path) -> None:
    # a run with two torn lines to record writes the first torn_record whole and is cut inside the second
    log = tmp_path / "log.jsonl"
    audit_log.append(log, {"type": "audit", "verdict": "PASS"})
    one = log.read_bytes()
    audit_log.append(log, {"type": "audit", "verdict": "FAIL", "report": "r" * 2000})
    log.write_bytes(log.read_bytes()[: len(one) + 300])  # crash 1: 300 bytes of run 2's record
    audit_log.append(log, {"type": "audit", "verdict": "PASS"})
    after_run3 = log.read_bytes()
    log.write_bytes(after_run3[: after_run3.index(b"\n", len(one)) + 1 + 40])  # crash 2: 40 bytes of its torn_record
    audit_log.append(log, {"type": "audit", "verdict": "PASS"})  # run 4: torn_records for lines 2 and 3, its own
    lines = log.read_bytes().splitlines(keepends=True)
    log.write_bytes(b"".join(lines[:4]) + lines[4][:25])  # crash 3: line 2's torn_record whole, 25 bytes of line 3's
    head = audit_log.append(log, {"type": "audit", "verdict": "PASS"})

    result = audit_log.verify(log, expect_head=head.hash)
    assert result.problems == [] and [n[:19] for n in result.notes] == ["line 2: torn record", "line 3: torn record",
                                                                        "line 5: torn record"]  # fmt: skip


def test_the_last_two_records_damaged_are_not_passed_off_as_two_crashes(tmp_path: Path) -> None:
    # a writer without the key breaks the last two records (a FAIL among them) and lets the next run record them:
    # a second torn line must be the start of the first one's torn_record, as a crash leaves it; a record is not
    key = b"s3cret shared with CI only"
    log = tmp_path / "log.jsonl"
    heads = [audit_log.append(log, {"type": "audit", "verdict": v}, key) for v in ("PASS", "FAIL", "PASS")]
    lines = log.read_bytes().splitlines(keepends=True)
    log.write_bytes(lines[0] + lines[1][:-2] + b"\n" + lines[2][:-2] + b"\n")  # each loses its closing brace
    audit_log.append(log, {"type": "audit", "verdict": "PASS"}, key)  # records both, to lose nothing

    result = audit_log.verify(log, key=key, expect_records=[heads[1].hash])
    assert result.problems[0].startswith("line 3: not a record (Expecting ',' delimiter at byte ")
    assert "not the start of the torn_record for line 2 that a crashed run was writing" in result.problems[0]
    assert result.problems[1].startswith(f"no record has the published hash {heads[1].hash}")
    assert len(result.problems) == 2


@pytest.mark.parametrize("line", [b'{"seq": ' + b"9" * 5000 + b"}",  # an int past Python's 4300 digits
                                  b'{"seq": 0, "x": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"])  # fmt: skip
def test_a_line_json_parses_but_python_refuses_is_a_problem_named_not_a_traceback(tmp_path: Path, line: bytes) -> None:
    log = tmp_path / "log.jsonl"
    audit_log.append(log, {"type": "audit", "verdict": "FAIL"})
    log.write_bytes(log.read_bytes() + line + b"\n")  # an edit: a line added

    result = cli("audit-log", "verify", str(log))
    # seen: a ValueError / RecursionError traceback, exit 1
    assert "Traceback" not in result.stderr, result.stderr[-400:]
    assert result.returncode == 1 and "line 2" in result.stderr

    proc = gate(tmp_path, log)  # every later gate run: a traceback and exit 1 (the code of a blocking failure)
    assert "Traceback" not in proc.stderr, proc.stderr[-400:]
    assert proc.returncode in (0, 2)


def test_a_line_nested_too_deep_to_hash_is_a_problem_named_and_list_goes_on(tmp_path: Path) -> None:
    # json.loads takes a few levels more than json.dumps (hashing, `list --json`) at the depth verify calls it:
    # before, a line in that band raised RecursionError while hashing. Where the band lies depends on the stack, so
    # every depth up to past what loads takes is tried.
    for depth in [200, *range(900, 1100, 2)]:
        log = tmp_path / f"log{depth}.jsonl"
        audit_log.append(log, {"type": "audit", "verdict": "FAIL"})
        log.write_bytes(log.read_bytes() + b'{"seq": 1, "x": ' + b"[" * depth + b"]" * depth + b"}\n")
        result = audit_log.verify(log)
        assert result.records == 1 and [p[:13] for p in result.problems] == ["line 2: torn:"], (depth, result)
        assert [r["seq"] for r in audit_log.records(log)] == [0]


def test_a_torn_line_says_where_its_json_breaks(tmp_path: Path) -> None:
    log = tmp_path / "log.jsonl"
    audit_log.append(log, {"type": "audit", "verdict": "FAIL", "report": "é" * 50})
    whole = log.read_bytes()
    cut = whole.index(b'"report": "') + len(b'"report": "') + 20  # after 10 "é", 2 bytes each
    log.write_bytes(whole + whole[:cut] + b"\n")  # a write cut inside the report string, then ended by a newline
    result = cli("audit-log", "verify", str(log))
    # before: "(Invalid control character at)", the place cut off; the place counts bytes, not characters
    assert result.returncode == 1 and f"(Invalid control character at byte {cut})" in result.stderr, result.stderr


def test_audit_log_list_refuses_a_device_instead_of_reading_it_forever(tmp_path: Path) -> None:
    # verify and audit refuse /dev/zero (test_a_log_that_is_a_device_is_refused_...); list reads it as one endless
    # line until memory runs out (seen: MemoryError traceback, exit 1, after eating all memory)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run(["bash", "-c", f"ulimit -v 3000000; exec {sys.executable} -m exporter.cli audit-log list "
                           "/dev/zero"], capture_output=True, text=True, timeout=60, env=env, cwd=ROOT)  # fmt: skip
    assert proc.returncode == 2, proc.stderr[-300:]
    assert proc.stderr.strip().endswith("not a regular file (an audit log is a file of its own)")


@pytest.mark.parametrize("command", ["verify", "list"])
def test_audit_log_commands_refuse_a_fifo_instead_of_waiting_for_ever(tmp_path: Path, command: str) -> None:
    fifo = tmp_path / "log.jsonl"
    os.mkfifo(fifo)
    try:
        result = cli("audit-log", command, str(fifo), timeout=15)
    except subprocess.TimeoutExpired:  # seen: open() blocks waiting for a writer, before _regular is asked
        pytest.fail(f"audit-log {command} on a FIFO did not return in 15 s")
    assert result.returncode == 2 and "not a regular file" in result.stderr


def test_the_gate_refuses_a_fifo_log_naming_the_problem_not_none(tmp_path: Path) -> None:
    # seen: "fairness-exporter audit: --audit-log PATH: None" (io.UnsupportedOperation from open("a+b"), whose
    # strerror is None, before _regular is asked)
    fifo = tmp_path / "log.jsonl"
    os.mkfifo(fifo)
    proc = gate(tmp_path, fifo)
    assert proc.returncode == 2 and "not a regular file" in proc.stderr
