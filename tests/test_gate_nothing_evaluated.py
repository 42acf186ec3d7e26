"""The gate never passes what evaluated nothing, and its audit log survives torn writes and shows removed runs:
what a review of the gate and the audit log found (review11), each test failing before its fix.

Rules attacked (README.md, docs/ml/gate.md, docs/auditor/numbers.md, docs/auditor/audit-log.md, docs/faults.md):

1. "a check that evaluated nothing never passes"; exit 0 pass, 1 blocking failure (including a blocking metric
   whose groups are too small to judge), 2 bad input.
2. the audit log: "A torn last line left by a crash is recorded by the next run, which goes on; verify names it."

Every expectation is written down from the docs and from the rows the tests write, never from the project's code.
Every run goes through the command line in a subprocess, as CI runs it (a crash is then an exit code, not an
exception inside pytest).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def cli(*args: str, cwd: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    environment = {k: v for k, v in os.environ.items() if k not in ("FAIRNESS_AUDIT_LOG_KEY", "FAIRNESS_AUDIT_LOG")}
    environment["PYTHONPATH"] = str(ROOT)
    environment.update(env or {})
    return subprocess.run([sys.executable, "-m", "exporter.cli", *args], cwd=cwd, env=environment,
                          capture_output=True, text=True, timeout=120)  # fmt: skip


def write_rows(path: Path, genders: list[str]) -> Path:
    """One row per gender: predictions and labels alternate 0/1 within each gender, so every rate of every group
    is 0.5 (every difference 0, every ratio 1) wherever a group has rows."""
    lines = ["gender,prediction,label"]
    seen: dict[str, int] = {}
    for g in genders:
        k = seen.get(g, 0)
        seen[g] = k + 1
        lines.append(f"{g},{k % 2},{(k // 2) % 2}")
    path.write_text("\n".join(lines) + "\n")
    return path


BALANCED = ["male", "female"] * 400  # 400 each: every metric 0 / 1, far inside every threshold
NOBODY_KNOWN = ["undisclosed"] * 800  # no row in any configured group: every comparison evaluated nothing


def config(path: Path, extra: str = "", pairs: str | None = None, metrics: str | None = None) -> Path:
    pairs_line = f"\n    pairwise_comparisons: {pairs}" if pairs is not None else ""
    metrics_block = metrics if metrics is not None else (
        "\n  - {name: demographic_parity_difference, threshold: 0.05, severity_on_fail: blocking}"
        "\n  - {name: equalised_odds_difference, threshold: 0.05, severity_on_fail: blocking}")
    path.write_text(f"""model_id: review11-model
protected_attributes:
  - name: gender
    groups: [male, female]{pairs_line}
min_samples: 30
metrics:{metrics_block}
{extra}""")
    return path


def audit(tmp_path: Path, cfg: Path, data: Path, log: str = "log.jsonl", *extra: str,
          env: dict[str, str] | None = None) -> tuple[subprocess.CompletedProcess[str], dict | None]:  # fmt: skip
    report = tmp_path / "report.json"
    report.unlink(missing_ok=True)
    proc = cli("audit", str(cfg), str(data), "--audit-log", str(tmp_path / log), "--report", str(report),
               *extra, cwd=tmp_path, env=env)  # fmt: skip
    return proc, (json.loads(report.read_text()) if report.exists() else None)


def verify(tmp_path: Path, log: str = "log.jsonl", *extra: str) -> subprocess.CompletedProcess[str]:
    return cli("audit-log", "verify", str(tmp_path / log), *extra, cwd=tmp_path)


# --- rule 1: a check that evaluated nothing never passes -------------------------------------------------------


def test_control_a_blocking_check_that_evaluated_nothing_blocks_by_default(tmp_path: Path) -> None:
    """Control (passes today): the default decision blocks on a comparison of two empty groups."""
    proc, report = audit(tmp_path, config(tmp_path / "c.yaml"), write_rows(tmp_path / "d.csv", NOBODY_KNOWN))
    assert proc.returncode == 1, proc.stderr
    assert report is not None and report["verdict"] == "FAIL"


def test_decision_evidence_with_inconclusive_warn_must_not_pass_checks_that_evaluated_nothing(tmp_path: Path) -> None:
    """Before: with `decision: evidence` and `failure_policy.inconclusive: warn`, a blocking comparison of two
    groups that have no row at all (status insufficient_samples, support 0) counts as a warning, and the gate exits
    0 with verdict PASS. numbers.md: insufficient_samples is "no value; a blocking one blocks"; gate.md: exit 1 on a
    blocking failure "including a blocking metric whose groups are too small to judge"; README: "a check that
    evaluated nothing never passes". `inconclusive: warn` is documented for an interval that straddles the
    threshold, i.e. for a comparison that has a value."""
    cfg = config(tmp_path / "c.yaml", "decision: evidence\nfailure_policy: {inconclusive: warn}\n")
    data = write_rows(tmp_path / "d.csv", NOBODY_KNOWN)
    junit, md = tmp_path / "junit.xml", tmp_path / "summary.md"
    proc, report = audit(tmp_path, cfg, data, "log.jsonl", "--junit", str(junit), "--summary-md", str(md))
    assert report is not None
    # what the rows say, independently: 0 rows of male and of female -> nothing was compared
    assert report["attributes"]["gender"]["groups"]["male"]["samples"] == 0
    assert report["attributes"]["gender"]["groups"]["female"]["samples"] == 0
    assert all(r["status"] == "insufficient_samples" and r["severity"] == "blocking" for r in report["results"])
    # the rule: such a blocking check never passes, in any form of the report
    assert (proc.returncode, report["verdict"]) == (1, "FAIL"), proc.stderr
    assert report["blocking_failures"] == 2
    assert all(r["counts_as"] == "blocking" for r in report["results"])
    cases = ET.parse(junit).getroot().iter("testcase")
    assert all(case.find("failure") is not None for case in cases)
    assert "FAIL" in md.read_text().splitlines()[0]


def test_an_empty_pairwise_comparisons_list_must_not_pass_a_gate_that_compared_nothing(tmp_path: Path) -> None:
    """Before: `pairwise_comparisons: []` loads, the gate runs 0 checks and exits 0 with verdict PASS
    ("0/0 passed"). The attribute is configured, its metrics are blocking, nothing was compared. Expected: the
    config refused (exit 2, one message naming the field), or the run not passing (exit 1)."""
    proc, report = audit(tmp_path, config(tmp_path / "c.yaml", pairs="[]"),
                         write_rows(tmp_path / "d.csv", NOBODY_KNOWN))  # fmt: skip
    assert proc.returncode != 0, f"exit 0 with {report and report['total_tests']} checks: {proc.stderr}"
    if proc.returncode == 2:
        assert "pairwise_comparisons" in proc.stderr
    else:
        assert report is not None and report["verdict"] == "FAIL"


def test_an_empty_metrics_list_must_not_pass_a_gate_that_computed_nothing(tmp_path: Path) -> None:
    """Before: `metrics: []` loads, the gate computes no metric at all (0 checks) and exits 0 with verdict PASS.
    docs/contract.md: metrics are "any of the metric table's; default: the first and third below". Expected: the
    defaults, or a refusal (exit 2 naming `metrics`), or no pass; not a PASS of nothing."""
    proc, report = audit(tmp_path, config(tmp_path / "c.yaml", metrics=" []"),
                         write_rows(tmp_path / "d.csv", NOBODY_KNOWN))  # fmt: skip
    if proc.returncode == 2:
        assert "metrics" in proc.stderr
        return
    assert report is not None
    assert report["total_tests"] > 0 and proc.returncode == 1, (proc.returncode, report["total_tests"], proc.stderr)


def test_bias_report_of_a_feature_with_a_single_group_must_not_pass(tmp_path: Path) -> None:
    """Before: `bias-report` on a feature whose every row is one group compares nothing (the gap
    max - min of one group is 0 by construction) and exits 0, "not biased". No rows at all is refused (exit 2:
    "no row has both ..."), one group is not. README: the rule "a check that evaluated nothing never passes" runs
    through "every report"."""
    data = write_rows(tmp_path / "d.csv", ["male"] * 800)
    proc = cli("bias-report", str(data), "--protected", "gender", "--outcome", "label", "--audit-log",
               str(tmp_path / "log.jsonl"), cwd=tmp_path)  # fmt: skip
    assert proc.returncode in (1, 2), proc.stdout[:300]


# --- rule 2: the audit log ---------------------------------------------------------------------------------------


def test_control_every_documented_tampering_is_detected(tmp_path: Path) -> None:
    """Control (passes today): edit, middle deletion, reordering, duplication; tail deletion with --expect-head."""
    cfg, data = config(tmp_path / "c.yaml"), write_rows(tmp_path / "d.csv", BALANCED)
    for _ in range(4):
        proc, report = audit(tmp_path, cfg, data)
        assert proc.returncode == 0, proc.stderr
    assert report is not None
    head = report["audit_log"]["hash"]
    lines = (tmp_path / "log.jsonl").read_bytes().splitlines(keepends=True)
    assert verify(tmp_path).returncode == 0
    tampered = {
        "edit": [lines[0], lines[1].replace(b'"rows": 800', b'"rows": 801'), *lines[2:]],
        "delete middle": [lines[0], lines[2], lines[3]],
        "reorder": [lines[0], lines[2], lines[1], lines[3]],
        "duplicate": [lines[0], lines[1], lines[1], lines[2], lines[3]],
    }
    for name, content in tampered.items():
        assert content != lines
        (tmp_path / "t.jsonl").write_bytes(b"".join(content))
        assert verify(tmp_path, "t.jsonl").returncode == 1, name
    (tmp_path / "t.jsonl").write_bytes(b"".join(lines[:3]))
    assert verify(tmp_path, "t.jsonl", "--expect-head", head).returncode == 1


def test_a_last_record_without_its_newline_is_not_merged_with_the_next_run(tmp_path: Path) -> None:
    """Before: a crash that cuts the write of a record just before its newline (a torn write: any prefix of the
    write can survive) leaves a whole record without "\\n". The next `audit` appends its own record on the same
    line, so that line is no record at all: both the earlier record and the new one drop out of the chain,
    `verify` then says TAMPERED (exit 1), and the head the new run published names a record verify cannot find.
    One run later the merged line is "recovered" as a torn write and verify says intact, two whole audit records
    gone. faults.md: "A torn last line (a crash mid-write): the next audit keeps the torn bytes as they are,
    appends a torn_record ... then its own record"; audit-log.md: "the next run ... goes on"."""
    cfg, data = config(tmp_path / "c.yaml"), write_rows(tmp_path / "d.csv", BALANCED)
    for _ in range(2):
        proc, _ = audit(tmp_path, cfg, data)
        assert proc.returncode == 0, proc.stderr
    log = tmp_path / "log.jsonl"
    log.write_bytes(log.read_bytes().removesuffix(b"\n"))  # the last write lost only its final byte
    proc, report = audit(tmp_path, cfg, data)
    assert proc.returncode == 0 and report is not None, proc.stderr
    # whatever the log does with the cut record, the new run's record must be a record of its own, on its line,
    # and the chain must verify against the head the run published
    checked = verify(tmp_path, "log.jsonl", "--expect-head", report["audit_log"]["hash"])
    assert checked.returncode == 0, checked.stdout + checked.stderr
    lines = [line for line in log.read_bytes().splitlines() if line.strip()]
    assert len(lines) == 3, f"{len(lines)} lines for 3 runs"  # one line per run
    records = [json.loads(line) for line in lines]
    assert records[-1]["hash"] == report["audit_log"]["hash"]
    assert [r["seq"] for r in records] == [0, 1, 2]


def test_a_torn_write_cut_inside_a_multibyte_character_is_recorded_and_the_log_goes_on(tmp_path: Path) -> None:
    """Before: records are written as UTF-8 with ensure_ascii=False, so a name such as the override author
    "José Núñez" is multi-byte. A crash that cuts the write inside such a character leaves a torn line that is not
    valid UTF-8. `audit-log verify` then dies with a UnicodeDecodeError traceback instead of naming the torn line,
    and every later `audit` dies the same way before writing its report or its record (exit 1 by traceback, no
    report: the gate is stuck until someone edits the log by hand). faults.md: a torn last line is named by verify
    ("line N: torn: ...", exit 1), recorded by the next audit, which goes on."""
    cfg, data = config(tmp_path / "c.yaml"), write_rows(tmp_path / "d.csv", BALANCED)
    proc, _ = audit(tmp_path, cfg, data)
    assert proc.returncode == 0, proc.stderr
    log = tmp_path / "log.jsonl"
    whole = log.read_bytes()
    # a second run's record, torn inside the two bytes of "é" (independently: the bytes a crash could leave)
    second = json.dumps({"type": "audit", "override": {"author": "José Núñez"}}, ensure_ascii=False).encode()
    cut = second.index("é".encode()) + 1
    torn = second[:cut]
    log.write_bytes(whole + torn)

    checked = verify(tmp_path)
    assert "Traceback" not in checked.stderr, checked.stderr[-600:]
    assert checked.returncode == 1 and "line 2: torn" in checked.stderr

    proc, report = audit(tmp_path, cfg, data)
    assert "Traceback" not in proc.stderr, proc.stderr[-600:]
    assert proc.returncode == 0 and report is not None
    assert "torn" in proc.stderr
    assert verify(tmp_path, "log.jsonl", "--expect-head", report["audit_log"]["hash"]).returncode == 0


def test_records_removed_from_the_end_before_later_runs_are_found_by_the_heads_the_removed_runs_published(
        tmp_path: Path) -> None:  # fmt: skip
    """Runs A and B, B's record removed, run C appended: the chain is whole again and C's head is the last, so
    ``--expect-head`` of C's head cannot see B gone. Each published head kept and given as ``--expect-record``
    names it (before: no way to check an earlier run's head)."""
    cfg, data = config(tmp_path / "c.yaml"), write_rows(tmp_path / "d.csv", BALANCED)
    heads = []
    for _ in range(2):
        proc, report = audit(tmp_path, cfg, data)
        assert proc.returncode == 0 and report is not None, proc.stderr
        heads.append(report["audit_log"]["hash"])
    log = tmp_path / "log.jsonl"
    log.write_bytes(b"".join(log.read_bytes().splitlines(keepends=True)[:-1]))  # B's record gone
    proc, report = audit(tmp_path, cfg, data)
    assert report is not None
    heads.append(report["audit_log"]["hash"])
    assert verify(tmp_path, "log.jsonl", "--expect-head", heads[2]).returncode == 0  # the last head sees nothing
    kept = [arg for head in heads for arg in ("--expect-record", head)]
    checked = verify(tmp_path, "log.jsonl", *kept)
    assert checked.returncode == 1 and f"no record has the published hash {heads[1]}" in checked.stderr
    assert heads[0] not in checked.stderr and heads[2] not in checked.stderr
    whole = verify(tmp_path, "log.jsonl", "--expect-record", heads[0], "--expect-record", heads[2])
    assert whole.returncode == 0 and "2 published record(s) present" in whole.stdout
