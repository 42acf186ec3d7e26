"""A report file that cannot be written (a path that is a folder, a full disk, a read-only mount).

A failed write exits 2 with one line naming the flag, the path and the OS's reason, and leaves nothing half-done:
every report is written (atomically: a temporary file beside it, then renamed) before the run's audit-log record,
so a run whose reports could not be written is not logged, and the reports it had already written are taken back
(an earlier run's files at those paths put back).
Before, the record was appended first, then an OSError escaped ``main`` as a traceback and Python exited 1, the
gate's "blocking failure" code, for a model that passed, while the log recorded a PASS run whose reports did not
exist.
"""

from __future__ import annotations

import errno
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent


def cli(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("FAIRNESS_AUDIT_LOG_KEY", None)
    return subprocess.run([sys.executable, "-m", "exporter.cli", *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=300)  # fmt: skip


def passing_audit(tmp_path: Path) -> tuple[Path, Path]:
    """500 of 1,000 men and 500 of 1,000 women selected: every comparison passes, verdict PASS, exit 0."""
    rows = ["gender,prediction,label"]
    rows += [f"{g},{int(i < 500)},{int(i % 2 == 0)}" for g in ("male", "female") for i in range(1000)]
    data = tmp_path / "preds.csv"
    data.write_text("\n".join(rows) + "\n")
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump({
        "model_id": "m1", "min_samples": 30,
        "protected_attributes": [{"name": "gender", "groups": ["male", "female"]}],
        "metrics": [{"name": "demographic_parity_difference", "threshold": 0.05, "severity_on_fail": "blocking"}]}))
    return config, data


def test_the_passing_audit_itself_exits_0(tmp_path: Path) -> None:
    """Control: the same run with writable paths passes (so the failures below are the write's alone)."""
    config, data = passing_audit(tmp_path)
    done = cli("audit", str(config), str(data), "--audit-log", str(tmp_path / "log.jsonl"),
               "--report", str(tmp_path / "report.json"))  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert json.loads((tmp_path / "report.json").read_text())["verdict"] == "PASS"


@pytest.mark.parametrize("flag", ["--report", "--junit", "--summary-md", "--impact-ratios-csv", "--html"])
def test_an_unwritable_report_exits_2_in_one_line_and_logs_no_passing_run(tmp_path: Path, flag: str) -> None:
    config, data = passing_audit(tmp_path)
    log = tmp_path / "log.jsonl"
    target = tmp_path / "reports-folder"  # an existing folder where the file should go: open() fails (EISDIR)
    target.mkdir()
    done = cli("audit", str(config), str(data), "--audit-log", str(log), flag, str(target))
    # before: a Python traceback ending in IsADirectoryError, exit 1 (the code of a blocking fairness failure)
    assert "Traceback" not in done.stderr, done.stderr[-400:]
    assert done.returncode == 2, f"exit {done.returncode} for a model that passed: {done.stderr[-300:]}"
    assert done.stderr == f"fairness-exporter audit: {flag} {target}: Is a directory (the run was not logged; no " \
        "report of it was left)\n"
    # before: the log holds a complete `audit` record, verdict PASS, for a run whose report was never written
    records = [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []
    assert [r for r in records if r.get("type") == "audit"] == []


def test_the_safety_suite_too_exits_2_and_logs_nothing(tmp_path: Path) -> None:
    """The shipped safety example passes (exit 0); with ``--report`` on a folder it exits 2 without a record (before:
    the run logged, then a traceback, exit 1, "a critical failure")."""
    log = tmp_path / "log.jsonl"
    control = cli("safety", "--config", "safety.yaml", "--audit-log", str(tmp_path / "control.jsonl"),
                  cwd=ROOT / "examples")  # fmt: skip
    assert control.returncode == 0, control.stderr[-300:]
    target = tmp_path / "reports-folder"
    target.mkdir()
    done = cli("safety", "--config", "safety.yaml", "--audit-log", str(log), "--report", str(target),
               cwd=ROOT / "examples")  # fmt: skip
    assert "Traceback" not in done.stderr, done.stderr[-400:]
    assert done.returncode == 2, f"exit {done.returncode} for a suite that passed: {done.stderr[-300:]}"
    records = [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []
    assert [r for r in records if r.get("type") == "safety"] == []


def test_the_bias_report_too_exits_2_and_logs_nothing(tmp_path: Path) -> None:
    _, data = passing_audit(tmp_path)
    log, target = tmp_path / "log.jsonl", tmp_path / "reports-folder"
    target.mkdir()
    done = cli("bias-report", str(data), "--protected", "gender", "--outcome", "label", "--audit-log", str(log),
               "--junit", str(target))  # fmt: skip
    assert (done.returncode, done.stdout) == (2, ""), done.stderr[-300:]
    assert f"--junit {target}: Is a directory" in done.stderr and "Traceback" not in done.stderr
    assert not log.exists() or log.read_text() == ""


def test_a_failed_write_leaves_no_report_of_the_run_and_no_temporary_file(tmp_path: Path) -> None:
    """``--report`` and ``--junit`` can be written, ``--html`` cannot: none of the three is left."""
    config, data = passing_audit(tmp_path)
    out = tmp_path / "out"
    (out / "page.html").mkdir(parents=True)
    done = cli("audit", str(config), str(data), "--audit-log", str(tmp_path / "log.jsonl"),
               "--report", str(out / "report.json"), "--junit", str(out / "junit.xml"),
               "--html", str(out / "page.html"))  # fmt: skip
    assert done.returncode == 2 and f"--html {out / 'page.html'}: Is a directory" in done.stderr
    assert sorted(p.name for p in out.iterdir()) == ["page.html"]  # the folder in the way, nothing else


def test_a_log_that_fails_after_the_reports_were_written_leaves_none_of_them(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The reports are written under the log's lock, then the record; a disk that fills up in between takes the
    reports back: none claims a record the log does not hold."""
    from exporter.cli import main
    from exporter.gate import audit_log

    append = audit_log.append

    def disk_full_after(path: Any, entry: Any, key: Any = None, before: Any = None) -> audit_log.Head:
        def then_fail(head: audit_log.Head) -> None:
            before(head)
            assert (tmp_path / "report.json").exists()  # written, and named the head to come
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

        return append(path, entry, key, before=then_fail)

    monkeypatch.setattr(audit_log, "append", disk_full_after)
    monkeypatch.delenv("FAIRNESS_AUDIT_LOG_KEY", raising=False)
    config, data = passing_audit(tmp_path)
    log = tmp_path / "log.jsonl"
    code = main(["audit", str(config), str(data), "--audit-log", str(log), "--report", str(tmp_path / "report.json")])
    err = capsys.readouterr().err
    assert code == 2 and f"--audit-log {log}: No space left on device" in err
    assert not (tmp_path / "report.json").exists()
    assert log.read_text() == ""


def test_a_failed_run_gives_back_the_reports_an_earlier_run_left_at_its_paths(tmp_path: Path) -> None:
    """A run logged earlier left report.json and junit.xml; a later run whose ``--html`` cannot be written is not
    logged, and the earlier run's files are back at their paths, byte for byte (they were removed with the failed
    run's: the earlier run's record then named reports that no longer existed). A logged run keeps no copy."""
    config, data = passing_audit(tmp_path)
    out, log = tmp_path / "out", tmp_path / "log.jsonl"
    first = cli("audit", str(config), str(data), "--audit-log", str(log), "--report", str(out / "report.json"),
                "--junit", str(out / "junit.xml"))  # fmt: skip
    assert first.returncode == 0, first.stderr
    earlier = {name: (out / name).read_bytes() for name in ("report.json", "junit.xml")}
    assert sorted(p.name for p in out.iterdir()) == ["junit.xml", "report.json"]  # no hidden copy stays
    (out / "page.html").mkdir()
    done = cli("audit", str(config), str(data), "--audit-log", str(log), "--report", str(out / "report.json"),
               "--junit", str(out / "junit.xml"), "--html", str(out / "page.html"))  # fmt: skip
    assert done.returncode == 2 and f"--html {out / 'page.html'}: Is a directory" in done.stderr
    assert {name: (out / name).read_bytes() for name in earlier} == earlier
    assert sorted(p.name for p in out.iterdir()) == ["junit.xml", "page.html", "report.json"]
    assert json.loads(earlier["report.json"])["audit_log"]["seq"] == len(log.read_text().splitlines()) - 1


def test_a_log_that_fails_after_the_reports_were_written_gives_back_the_earlier_report(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from exporter.cli import main
    from exporter.gate import audit_log

    config, data = passing_audit(tmp_path)
    log, report = tmp_path / "log.jsonl", tmp_path / "report.json"
    monkeypatch.delenv("FAIRNESS_AUDIT_LOG_KEY", raising=False)
    assert main(["audit", str(config), str(data), "--audit-log", str(log), "--report", str(report)]) == 0
    earlier = report.read_bytes()
    append = audit_log.append

    def disk_full_after(path: Any, entry: Any, key: Any = None, before: Any = None) -> audit_log.Head:
        def then_fail(head: audit_log.Head) -> None:
            before(head)
            assert report.read_bytes() != earlier  # the new report was in place, naming the head to come
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

        return append(path, entry, key, before=then_fail)

    monkeypatch.setattr(audit_log, "append", disk_full_after)
    capsys.readouterr()
    assert main(["audit", str(config), str(data), "--audit-log", str(log), "--report", str(report)]) == 2
    assert report.read_bytes() == earlier
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".")) == []
