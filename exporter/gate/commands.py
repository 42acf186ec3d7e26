"""The gate's commands (``audit``, ``bias-report``, ``safety``, ``redteam``, ``audit-log verify``): run, log every
run in the hash-chained audit log, print the JSON report; exit 0 (pass), 1 (blocked), 2 (bad input).

Everything that needs pandas is imported inside the commands, so ``fairness-exporter serve`` never loads it.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import sys
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from exporter.config import ConfigError
from exporter.core.metric_table import METRICS

if TYPE_CHECKING:
    from exporter.gate.audit_log import Head
    from exporter.gate.ci_reports import CiReport

EXIT_OK, EXIT_BLOCKED, EXIT_BAD_INPUT = 0, 1, 2
SUMMARY_LINES = 15


def _file_facts(path: str) -> dict[str, Any]:
    from exporter.gate.audit import sha256_file

    p = Path(path)
    return {"file": path, "sha256": sha256_file(p) if p.is_file() else None}


def _summary(report: dict[str, Any]) -> str:
    """The verdict, then every result in full: its value with its interval and evidence."""
    lines = [f"{report['model_id']}: {report['verdict']} — {report['passed']}/{report['total_tests']} passed, "
             f"{report['blocking_failures']} blocking, {report['warning_failures']} warning, "
             f"{report['insufficient_samples']} with insufficient samples, {report['inconclusive']} inconclusive "
             f"(decision: {report['decision']})"]  # fmt: skip
    lines += [f"  {_result_line(r, report['min_samples'], report['decision'])}" for r in report["results"]]
    return "\n".join(lines)


def _result_line(r: dict[str, Any], min_samples: int, decision: str) -> str:
    """``FAIL blocking race equalised_odds_difference a vs b: 0.276 [0.197, 0.353], evidence fail``; an
    inconclusive row says how many samples per group would decide it, an insufficient one why it has no value."""
    head = f"{r['status'].upper()} {r['severity']} {r['attribute']} {r['metric']} {r['groups']}"
    if r["value"] is None:
        why = (f"the smallest count of {METRICS[r['metric']].counted} in a group is {r['support']}, below "
               f"min_samples {min_samples}" if r["support"] < min_samples
               else "undefined (a group has no positive prediction)")  # fmt: skip
        text = f"{head}: no value: {why}; evidence {r['evidence']}"
    else:
        lo, hi = r["ci_95"]
        text = f"{head}: {r['exact_value']:.3f} [{lo:.3f}, {hi:.3f}], evidence {r['evidence']}"
    if r["evidence"] == "inconclusive" and r["value"] is not None:
        need = r["samples_to_decide"]
        text += ("; about " + " and ".join(f"{n:,} ({g})" for g, n in need.items()) + " samples would decide it"
                 if need else "; the value is on the threshold: no sample size decides it")  # fmt: skip
    return text + (f"; counts as {r['counts_as']}" if decision == "evidence" else "")


def _audit_log_key() -> bytes | None:
    from exporter.gate.audit_log import KEY_ENV

    key = os.environ.get(KEY_ENV)
    return key.encode() if key else None


def _log_run(command: str, path: str, entry: dict[str, Any]) -> Head:
    """Append a run to the audit log (HMAC-keyed when $FAIRNESS_AUDIT_LOG_KEY is set); say what it recovered."""
    from exporter.gate import audit_log

    head = audit_log.append(path, entry, _audit_log_key())
    for note in head.recovered:
        print(f"fairness-exporter {command}: audit log {path}: {note}", file=sys.stderr)
    return head


def cmd_audit(args: argparse.Namespace) -> int:
    """Run the gate, log the run, print the JSON report; exit 0 / 1 / 2."""
    from exporter.gate import audit_log, ci_reports  # the gate needs pandas; `serve` must not load it
    from exporter.gate.audit import DataError, Override, exit_code, run_audit
    from exporter.gate.html import audit_html

    log_path = args.audit_log
    override = None
    if args.override_justification is not None or args.override_author is not None:
        override = Override(args.override_justification or "", args.override_author or "")
    try:
        try:
            if override and override.problems():
                raise ConfigError("; ".join(override.problems()))
            report = run_audit(args.config, args.predictions, override=override, model_id=args.model)
        except (ConfigError, DataError) as exc:
            _log_run("audit", log_path, {"type": "audit_error", "error": str(exc), "config": _file_facts(args.config),
                                         "data": _file_facts(args.predictions)})  # fmt: skip
            return _bad_input(args, "audit", str(exc))
        head = _log_run("audit", log_path, {"type": "audit", "timestamp": report["timestamp"],
                                            "model_id": report["model_id"], "verdict": report["verdict"],
                                            "config": _file_facts(args.config), "data": _file_facts(args.predictions),
                                            "override": report["override"], "report": report})  # fmt: skip
    except audit_log.AuditLogError as exc:
        return _bad_input(args, "audit", f"--audit-log {exc}")
    report["audit_log"] = {"path": str(log_path), "seq": head.seq, "hash": head.hash}
    text = json.dumps(report, indent=2, allow_nan=False)
    if args.report:
        write_report(Path(args.report), text)
    write_ci_reports(args, ci_reports.from_audit(report))
    if args.impact_ratios_csv:
        _write_impact_ratios(Path(args.impact_ratios_csv), report)
    if args.html and not write_html(Path(args.html), audit_html, report):
        return EXIT_BAD_INPUT
    print(text)
    print(_summary(report), file=sys.stderr)
    return exit_code(report)


def write_report(path: Path, text: str) -> None:
    """Write a JSON report file (its folder made as needed)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text + "\n")


def _now() -> str:
    return datetime.now(UTC).isoformat().replace("+00:00", "Z")


def write_ci_reports(args: argparse.Namespace, report: CiReport) -> None:
    """``--junit`` and ``--summary-md``: what CI systems show of a run (exporter/gate/ci_reports.py)."""
    from exporter.gate import ci_reports

    if args.junit:
        write_report(Path(args.junit), ci_reports.junit_xml(report))
    if args.summary_md:
        write_report(Path(args.summary_md), ci_reports.markdown(report))


def _bad_input(args: argparse.Namespace, command: str, message: str) -> int:
    """A run that could not evaluate anything: one line on stderr, an errored check in the CI reports, exit 2."""
    from exporter.gate import ci_reports

    print(f"fairness-exporter {command}: {message}", file=sys.stderr)
    subject = getattr(args, "config", None) or ", ".join(getattr(args, "data", []))
    write_ci_reports(args, ci_reports.from_error(command, subject, message, _now()))
    return EXIT_BAD_INPUT


def write_html(path: Path, render: Callable[[Any], str], report: Any) -> bool:
    """Render a report to an HTML file; False (and one line on stderr) when matplotlib is not installed."""
    try:
        page = render(report)
    except ImportError as exc:
        print(f"fairness-exporter: --html {path}: {exc}", file=sys.stderr)
        return False
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(page, encoding="utf-8")
    return True


def cmd_bias_report(args: argparse.Namespace) -> int:
    """The bias auditor over one or more data files; exit 1 when any feature's gap exceeds the threshold."""
    from exporter.gate import ci_reports
    from exporter.gate.audit import DataError, read_predictions
    from exporter.gate.bias import BiasAuditor
    from exporter.gate.html import bias_html

    features: list[str | list[str]] = [f.split("+") if "+" in f else f for f in args.protected.split(",") if f]
    try:
        if not features or any("" in f for f in features if isinstance(f, list)):
            raise DataError(f"--protected {args.protected!r}: expected features such as gender,race,gender+race")
        auditor = BiasAuditor(features, args.outcome, bias_threshold=args.threshold)
        reports = {}
        for name in args.data:
            path = Path(name)
            if not path.is_file():
                raise DataError(f"{path}: no such data file")
            reports[name] = auditor.evaluate_bias(read_predictions(path), source=name)
    except (DataError, ImportError) as exc:
        return _bad_input(args, "bias-report", str(exc))
    if args.html and not write_html(Path(args.html), bias_html, reports):
        return EXIT_BAD_INPUT
    print(json.dumps(reports[args.data[0]] if len(args.data) == 1 else reports, indent=2, allow_nan=False))
    write_ci_reports(args, ci_reports.from_bias(reports, _now()))
    biased = [f"{src}: {f}" for src, rep in reports.items() for f, r in rep.items() if r["is_biased"]]
    for line in biased:
        print(f"  BIASED {line}", file=sys.stderr)
    return EXIT_BLOCKED if biased else EXIT_OK


def _emit(report: dict[str, Any], report_path: str | None, summary: str) -> None:
    """The JSON report on stdout (and in ``--report``), a human summary on stderr."""
    text = json.dumps(report, indent=2, allow_nan=False)
    if report_path:
        write_report(Path(report_path), text)
    print(text)
    print(summary, file=sys.stderr)


def _suite_summary(report: dict[str, Any]) -> str:
    lines = [f"{report['model_id']}: {report['verdict']} — {report['passed']}/{report['total_tests']} "
             f"{report['suite']} tests passed, {report['critical_failures']} critical failure(s)"]  # fmt: skip
    failures = [r for r in report["results"] if not r["passed"]]
    for r in failures[:SUMMARY_LINES]:
        lines.append(f"  FAIL {r['severity']:<8} {r['category']} {r['test_name']}")
    if len(failures) > SUMMARY_LINES:
        lines.append(f"  ... and {len(failures) - SUMMARY_LINES} more in the JSON report")
    return "\n".join(lines)


def _run_suite(args: argparse.Namespace, suite: str, run: Callable[[], dict[str, Any]], model: str) -> int:
    """Run the safety or red-team suite with the gate's semantics: log every run (failed ones too), print the
    report, exit 0 / 1 (a critical failure) / 2 (bad config, model not loadable)."""
    from exporter.gate import audit_log, ci_reports
    from exporter.gate.audit import DataError
    from exporter.gate.targets import TargetError

    facts = {"config": _file_facts(args.config), "model": model}
    try:
        try:
            report = run()
        except (ConfigError, DataError, TargetError, ImportError) as exc:
            _log_run(suite, args.audit_log, {"type": f"{suite}_error", "error": str(exc), **facts})
            return _bad_input(args, suite, str(exc))
        head = _log_run(suite, args.audit_log, {"type": suite, "timestamp": report["timestamp"],
                                                "model_id": report["model_id"], "verdict": report["verdict"],
                                                **facts, "report": report})  # fmt: skip
    except audit_log.AuditLogError as exc:
        return _bad_input(args, suite, f"--audit-log {exc}")
    report["audit_log"] = {"path": str(args.audit_log), "seq": head.seq, "hash": head.hash}
    _emit(report, args.report, _suite_summary(report))
    write_ci_reports(args, ci_reports.from_suite(report))
    return EXIT_BLOCKED if report["verdict"] == "FAIL" else EXIT_OK


def cmd_safety(args: argparse.Namespace) -> int:
    """Output bounds, perturbation stability, edge inputs and counterfactual consistency of a tabular model."""
    from exporter.gate.safety import run_safety
    from exporter.gate.targets import load_object

    return _run_suite(args, "safety", lambda: run_safety(args.config, load_object(args.model), args.model),
                      args.model)  # fmt: skip


def cmd_redteam(args: argparse.Namespace) -> int:
    """Adversarial rewrites of harmful texts against a text classifier (a Python callable or an HTTP endpoint)."""
    from exporter.gate.redteam import run_redteam
    from exporter.gate.targets import text_target

    def run() -> dict[str, Any]:
        target = text_target(args.target, args.request_field, args.response_field)
        return run_redteam(args.config, target, args.target)

    return _run_suite(args, "redteam", run, args.target)


def _write_impact_ratios(path: Path, report: dict[str, Any]) -> None:
    """The NYC LL144-style table: rows, selection (or scoring) rate and impact ratio per category."""
    from exporter.gate import ll144

    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(ll144.CSV_COLUMNS)
        writer.writerows(ll144.csv_rows(report))


def cmd_audit_log_verify(args: argparse.Namespace) -> int:
    """Verify a hash-chained audit log (every HMAC with $FAIRNESS_AUDIT_LOG_KEY); exit 1 when it was changed."""
    from exporter.gate import audit_log

    try:
        result = audit_log.verify(args.path, expect_head=args.expect_head, key=_audit_log_key())
    except OSError as exc:
        print(f"fairness-exporter audit-log verify: {args.path}: {exc.strerror}", file=sys.stderr)
        return EXIT_BAD_INPUT
    mode = f"keyed ({audit_log.KEYED})" if result.keyed else "plain sha256 chain"
    for note in result.notes:
        print(f"  note: {note}", file=sys.stderr)
    if result.problems:
        print(f"{args.path}: TAMPERED or damaged ({len(result.problems)} problem(s) in {result.records} records, "
              f"checked as {mode})", file=sys.stderr)  # fmt: skip
        for p in result.problems:
            print(f"  {p}", file=sys.stderr)
        return EXIT_BLOCKED
    print(f"{args.path}: intact, {result.records} records ({mode}"
          f"{', head as expected' if args.expect_head else ', not checked against a published head'})")  # fmt: skip
    return EXIT_OK
