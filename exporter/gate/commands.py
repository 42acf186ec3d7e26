"""The gate's commands (``audit``, ``bias-report``, ``safety``, ``redteam``, ``audit-log verify``): run, write the
report files, log every run in the hash-chained audit log, print the JSON report; exit 0 (pass), 1 (blocked), 2 (bad
input, or a report file that could not be written: then nothing is logged and no report of the run is left).
Everything that needs pandas is imported inside the commands, so ``fairness-exporter serve`` never loads it.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import math
import sys
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from exporter.config import ConfigError, load_config
from exporter.core.attributes import titled
from exporter.gate.reports.files import ReportWriteError, RunReports

if TYPE_CHECKING:
    from exporter.gate.audit_log import Head
    from exporter.gate.reports.ci import CiReport

EXIT_OK, EXIT_BLOCKED, EXIT_BAD_INPUT = 0, 1, 2
SUMMARY_LINES = 15


def file_facts(path: str | None) -> dict[str, Any]:
    from exporter.gate.fairness.audit import sha256_file

    p = Path(path) if path else None
    return {"file": path, "sha256": sha256_file(p) if p and p.is_file() else None}


def _summary(report: dict[str, Any]) -> str:
    """The verdict, then every result in full: its value with its interval and evidence."""
    lines = [f"{report['model_id']}: {report['verdict']} — {report['passed']}/{report['total_tests']} passed, "
             f"{report['blocking_failures']} blocking, {report['warning_failures']} warning, "
             f"{report['insufficient_samples']} with insufficient samples, {report['inconclusive']} inconclusive "
             f"(decision: {report['decision']}); {report['comparisons_judged']} comparisons judged, a fail among "
             f"each metric's of an attribute by {report['multiplicity']}"]  # fmt: skip
    lines += [f"  {_result_line(r, report['min_samples'], report['decision'])}" for r in report["results"]]
    return "\n".join(lines)


def _result_line(r: dict[str, Any], min_samples: int, decision: str) -> str:
    """``FAIL blocking race equalised_odds_difference a vs b: 0.2762 [0.1970, 0.3530], evidence fail``: the value
    as every report shows it (exporter/gate/reports/ci.py); an inconclusive row says how many samples per group
    would decide it (an estimate: that none would), an insufficient one which count fell short."""
    from exporter.gate.reports.ci import estimated_value, insufficient, shown_value, with_interval

    head = f"{r['status'].upper()} {r['severity']} {titled(r['attribute'], r.get('proxy'))} {r['metric']} {r['groups']}"
    text = f"{head}: {estimated_value(with_interval(shown_value(r), r['ci_95']), r)}, evidence {r['evidence']}"
    if r["status"] == "insufficient_samples":
        text += f"; {insufficient(r, min_samples)}"
    if r["evidence"] == "inconclusive" and r.get("exact_value") is not None:
        if need := r["samples_to_decide"]:
            text += "; about " + " and ".join(f"{n:,} ({g})" for g, n in need.items()) + " samples would decide it"
        elif r.get("estimated"):  # most of an estimate's interval is the calibration's: audited rows do not narrow it
            text += "; an estimate: more labelled reference rows (or the labels) narrow it, not more audited rows"
        else:
            text += "; the value is on the threshold: no sample size decides it"
    return text + (f"; counts as {r['counts_as']}" if decision == "evidence" else "")


def _audit_log_key() -> bytes | None:
    from exporter.gate.audit_log import key_from_env

    return key_from_env()


def log_run(command: str, path: str, entry: dict[str, Any], files: RunReports | None = None,
            report: dict[str, Any] | None = None) -> Head:  # fmt: skip
    """Append a run to the audit log (HMAC-keyed when $FAIRNESS_AUDIT_LOG_KEY is set); say what it recovered.
    ``files``, the run's report files, are written first, under the log's lock, ``report`` naming the head the
    record will have: a file that cannot be written raises ReportWriteError and nothing is logged; a log that
    cannot be appended to raises AuditLogError and the files are taken back (an earlier run's put back)."""
    from exporter.gate import audit_log

    reports = files or RunReports()

    def write_files(head: Head) -> None:
        if report is not None:
            report["audit_log"] = {"path": str(path), "seq": head.seq, "hash": head.hash}
        reports.write()

    try:
        head = audit_log.append(path, entry, _audit_log_key(), before=write_files)
    except audit_log.AuditLogError:
        reports.remove()
        raise
    reports.done()
    for note in head.recovered:
        print(f"fairness-exporter {command}: audit log {path}: {note}", file=sys.stderr)
    return head


def not_written(command: str, exc: ReportWriteError) -> int:
    """A report file that could not be written: one line, exit 2 (the run was not logged, no report of it left)."""
    print(f"fairness-exporter {command}: {exc} (the run was not logged; no report of it was left)", file=sys.stderr)
    return EXIT_BAD_INPUT


def cmd_audit(args: argparse.Namespace) -> int:
    """Run the gate, log the run, print the JSON report, file it at the config's report_destination; exit 0 / 1 /
    2 (bad input, or a report that could not be filed)."""
    from exporter.gate import audit_log, storage  # the gate needs pandas; `serve` must not load it
    from exporter.gate.fairness import ll144
    from exporter.gate.fairness.audit import DataError, Override, dataset_location, exit_code, run_audit
    from exporter.gate.reports import ci as ci_reports
    from exporter.gate.reports.html import audit_html
    from exporter.gate.reports.publish import publish

    log_path = args.audit_log
    override = None
    if args.override_justification is not None or args.override_author is not None:
        override = Override(args.override_justification or "", args.override_author or "")
    config, data = None, args.predictions
    try:
        try:
            if override and override.problems():
                raise ConfigError("; ".join(override.problems()))
            config = load_config(args.config).model(args.model)
            if args.model_version is not None:
                config = dataclasses.replace(config, model_version=args.model_version)
            data = dataset_location(config, args.predictions)
            report = run_audit(config, data, override=override, engine=args.engine, baseline=args.baseline)
            files = RunReports()
            files.add("--report", args.report, lambda: json.dumps(report, indent=2, allow_nan=False) + "\n")
            add_ci_reports(files, args, lambda: ci_reports.from_audit(report))
            files.add("--impact-ratios-csv", args.impact_ratios_csv, lambda: ll144.csv_text(report))
            files.add("--html", args.html, lambda: audit_html(report))
        except (ConfigError, DataError) as exc:
            log_run("audit", log_path, {"type": "audit_error", "error": str(exc), **_model_facts(config, args),
                                         "config": file_facts(args.config), "data": file_facts(data)})  # fmt: skip
            return bad_input(args, "audit", str(exc))
        log_run("audit", log_path, {"type": "audit", "timestamp": report["timestamp"],
                                    "model_id": report["model_id"], "model_version": report["model_version"],
                                    "verdict": report["verdict"], "config": file_facts(args.config),
                                    "data": {"file": report["data_file"],
                                             "manifest_sha256": report["data_manifest_sha256"]},
                                    "override": report["override"], "report": report}, files, report)  # fmt: skip
    except audit_log.AuditLogError as exc:
        return bad_input(args, "audit", f"--audit-log {exc}")
    except ReportWriteError as exc:
        return not_written("audit", exc)
    text = json.dumps(report, indent=2, allow_nan=False)
    side_files = [(suffix, Path(path)) for suffix, path in (("ll144.csv", args.impact_ratios_csv), ("html", args.html))
                  if path]  # fmt: skip
    print(text)
    print(_summary(report), file=sys.stderr)
    if config.report_destination is not None:
        destination = storage.resolve(config.report_destination, Path(config.source).parent)
        if not publish("audit", "failure_policy.report_destination", destination, report, text, side_files):
            return EXIT_BAD_INPUT
    return exit_code(report)


def _model_facts(config: Any, args: argparse.Namespace) -> dict[str, Any]:
    """The model id and version an error record names, as far as they are known."""
    version = getattr(args, "model_version", None) or getattr(config, "model_version", None)
    return {"model_id": getattr(config, "model_id", None), "model_version": version}


def _now() -> str:
    return datetime.now(UTC).isoformat().replace("+00:00", "Z")


def add_ci_reports(files: RunReports, args: argparse.Namespace, report: Callable[[], CiReport]) -> None:
    """``--junit`` and ``--summary-md``: what CI systems show of a run (exporter/gate/reports/ci.py), both from one
    ``report()``, made when the files are written (after the log's head is in the report)."""
    from exporter.gate.reports import ci as ci_reports

    once = functools.cache(report)
    files.add("--junit", args.junit, lambda: ci_reports.junit_xml(once()) + "\n")
    files.add("--summary-md", args.summary_md, lambda: ci_reports.markdown(once()) + "\n")


def bad_input(args: argparse.Namespace, command: str, message: str) -> int:
    """A run that could not evaluate anything: one line on stderr, an errored check in the CI reports, exit 2."""
    from exporter.gate.reports import ci as ci_reports

    print(f"fairness-exporter {command}: {message}", file=sys.stderr)
    subject = getattr(args, "config", None) or ", ".join(getattr(args, "data", []))
    files = RunReports()
    add_ci_reports(files, args, lambda: ci_reports.from_error(command, subject, message, _now()))
    try:
        files.write()
    except ReportWriteError as exc:
        print(f"fairness-exporter {command}: {exc}", file=sys.stderr)
    return EXIT_BAD_INPUT


def cmd_bias_report(args: argparse.Namespace) -> int:
    """The bias auditor over one or more data files; exit 1 when any feature's gap exceeds the threshold."""
    from exporter.config import ConfigError
    from exporter.gate.data.dataset import DataError, open_dataset
    from exporter.gate.fairness.bias import BiasAuditor, json_report
    from exporter.gate.reports import ci as ci_reports
    from exporter.gate.reports.html import bias_html

    features: list[str | list[str]] = [f.split("+") if "+" in f else f for f in args.protected.split(",") if f]
    if not (math.isfinite(args.threshold) and args.threshold >= 0):  # a gap is >= 0: no gap exceeds nan or inf
        return bad_input(args, "bias-report", f"--threshold {args.threshold}: not a finite number >= 0 (the largest "
                         "acceptable gap between group means, default 0.1)")  # fmt: skip
    try:
        if not features or any("" in f for f in features if isinstance(f, list)):
            raise DataError(f"--protected {args.protected!r}: expected features such as gender,race,gender+race")
        auditor = BiasAuditor(features, args.outcome, bias_threshold=args.threshold)
        reports, manifests = {}, {}
        for name in args.data:
            dataset = open_dataset(name)  # one listing: the manifest refuses a file changed while it was read
            reports[name] = json_report(auditor.evaluate_opened(dataset))
            manifests[name] = dataset.manifest().sha256
            # the seed's API gives one group (beside groups without outcome values) a gap of 0, and none a gap of
            # NaN, not biased; the command, which passes or blocks, compared nothing
            alone = [f"{f} (" + "; ".join(f"{g}: no outcome values" if g in r["groups_without_outcome"] else g
                                          for g in r["group_stats"]) + ")"
                     for f, r in reports[name].items()
                     if len(r["group_stats"]) - len(r["groups_without_outcome"]) < 2]  # fmt: skip
            if alone:
                raise DataError(f"{name}: one group with outcome values at most in {'; '.join(alone)}: a gap needs "
                                "two, nothing was compared")  # fmt: skip
    except (ConfigError, DataError, ImportError) as exc:
        return bad_input(args, "bias-report", str(exc))
    biased = [f"{src}: {f}" for src, rep in reports.items() for f, r in rep.items() if r["is_biased"]]
    from exporter.gate.audit_log import AuditLogError

    files = RunReports()
    files.add("--html", args.html, lambda: bias_html(reports))
    add_ci_reports(files, args, lambda: ci_reports.from_bias(reports, _now()))
    try:
        log_run("bias-report", args.audit_log, {
            "type": "bias_report", "timestamp": _now(), "model_id": args.model_id,
            "model_version": args.model_version, "verdict": "FAIL" if biased else "PASS",
            "data": [{"file": name, "manifest_sha256": manifests[name]} for name in args.data],
            "report": reports}, files)  # fmt: skip
    except AuditLogError as exc:
        return bad_input(args, "bias-report", f"--audit-log {exc}")
    except ReportWriteError as exc:
        return not_written("bias-report", exc)
    print(json.dumps(reports[args.data[0]] if len(args.data) == 1 else reports, indent=2, allow_nan=False))
    for line in biased:
        print(f"  BIASED {line}", file=sys.stderr)
    for src, rep in reports.items():  # listed by the seed's API with a NaN mean: never passed by omission
        for f, r in rep.items():
            for g, rows in r["groups_without_outcome"].items():
                print(f"  NOT COMPARED {src}: {f} group {g}: no outcome values in its {rows} rows", file=sys.stderr)
    return EXIT_BLOCKED if biased else EXIT_OK


def _suite_summary(report: dict[str, Any]) -> str:
    """The verdict, then each failed test with its summary (a red-team test's evasions and baseline failures, and
    its attempts that measured nothing)."""
    from exporter.gate.suite import unmeasured

    head = (f"{report['model_id']}: {report['verdict']} — {report['passed']}/{report['total_tests']} "
            f"{report['suite']} tests passed, {report['critical_failures']} critical failure(s)")  # fmt: skip
    if report["suite"] == "redteam":
        head += f"; {report['evasions']} evasion(s), {report['baseline_failures']} baseline failure(s)"
        head += unmeasured(report)
    lines = [head]
    failures = [r for r in report["results"] if not r["passed"]]
    for r in failures[:SUMMARY_LINES]:
        said = r["details"].get("summary")
        lines.append(f"  FAIL {r['severity']:<8} {r['category']} {r['test_name']}" + (f": {said}" if said else ""))
    if len(failures) > SUMMARY_LINES:
        lines.append(f"  ... and {len(failures) - SUMMARY_LINES} more in the JSON report")
    return "\n".join(lines)


def _run_suite(args: argparse.Namespace, suite: str, run: Callable[[], dict[str, Any]], model: str | None) -> int:
    """Run the safety or red-team suite with the gate's semantics: log every run (failed ones too), print the
    report, exit 0 / 1 (a critical failure) / 2 (bad config, model not loadable or not callable)."""
    from exporter.gate import audit_log
    from exporter.gate.fairness.audit import DataError
    from exporter.gate.reports import ci as ci_reports
    from exporter.gate.reports.suite_html import suite_html  # matplotlib only when rendering
    from exporter.gate.suite import audit_entry
    from exporter.gate.targets.objects import TargetError

    facts = {"config": file_facts(args.config), "model": model}
    try:
        try:
            report = run()
        except (ConfigError, DataError, TargetError, ImportError) as exc:
            log_run(suite, args.audit_log, {"type": f"{suite}_error", "error": str(exc),
                                             **_model_facts(None, args), **facts})  # fmt: skip
            return bad_input(args, suite, str(exc))
        facts["model"] = report.get("model", model)  # what was loaded: a class spec, a file
        reporting = report.get("reporting") or {}
        if reporting.get("notify_on_critical") and report["critical_failures"]:
            report["notifications"] = _notify(suite, report, reporting["notify_on_critical"])
        files = RunReports()
        files.add("--report", args.report, lambda: json.dumps(report, indent=2, allow_nan=False) + "\n")
        add_ci_reports(files, args, lambda: ci_reports.from_suite(report))
        files.add("--html", args.html, lambda: suite_html(report))
        log_run(suite, args.audit_log, audit_entry(report, **facts), files, report)
    except audit_log.AuditLogError as exc:
        return bad_input(args, suite, f"--audit-log {exc}")
    except ReportWriteError as exc:
        return not_written(suite, exc)
    print(json.dumps(report, indent=2, allow_nan=False))
    print(_suite_summary(report), file=sys.stderr)
    if reporting.get("destination"):
        from exporter.gate import storage
        from exporter.gate.reports.publish import publish

        destination = storage.resolve(reporting["destination"], Path(args.config).parent)
        if not publish(suite, "reporting.destination", destination, report, json.dumps(report, indent=2)):
            return EXIT_BAD_INPUT
    return EXIT_BLOCKED if report["verdict"] == "FAIL" else EXIT_OK


def _notify(suite: str, report: dict[str, Any], recipients: list[str]) -> dict[str, Any]:
    """E-mail each recipient about the critical failures; a failure is one line on stderr, counted, and changes
    nothing else."""
    from exporter.gate.reports import notify

    outcome = notify.send(report, recipients)
    for error in outcome["errors"]:
        print(f"fairness-exporter {suite}: reporting.notify_on_critical: not sent to {error}", file=sys.stderr)
    return outcome


def cmd_safety(args: argparse.Namespace) -> int:
    """Output bounds, perturbation stability, edge inputs and counterfactual consistency of a tabular model."""
    from exporter.gate.safety.config import run_safety

    return _run_suite(args, "safety", lambda: run_safety(args.config, args.model, model_version=args.model_version,
                                                         trust_model_file=args.trust_model_file), args.model)


def cmd_redteam(args: argparse.Namespace) -> int:
    """Adversarial attacks on a text classifier (a Python callable or an HTTP endpoint) or a chat model (an
    OpenAI-compatible endpoint, from --chat-model or the config's target section)."""
    from exporter.gate.redteam.run import run_redteam
    from exporter.gate.targets.text import text_target

    def run() -> dict[str, Any]:
        if args.chat_model is not None or args.target is None:
            return run_redteam(args.config, args.target, chat_model=args.chat_model, model_version=args.model_version)
        target = text_target(args.target, args.request_field, args.response_field, trust_file=args.trust_model_file)
        return run_redteam(args.config, target, args.target, model_version=args.model_version)

    return _run_suite(args, "redteam", run, args.target)


def cmd_audit_log_list(args: argparse.Namespace) -> int:
    """List the records of a model (and version, and type): one line each, or the records as JSON lines."""
    from exporter.gate import audit_log

    try:
        entries = audit_log.select(audit_log.records(args.path), args.model, args.version, args.type)
    except OSError as exc:
        print(f"fairness-exporter audit-log list: {args.path}: {exc.strerror or exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    for r in entries:
        if args.json:
            print(json.dumps(r, sort_keys=True, ensure_ascii=False))
        else:
            fields = [r.get("model_id"), r.get("model_version"), r.get("verdict")]
            print(f"{r.get('seq')!s:>5}  {r.get('timestamp') or '-':<27}  {r.get('type')!s:<14}  "
                  + "  ".join(str(f) if f is not None else "-" for f in fields))  # fmt: skip
    print(f"{len(entries)} record(s)", file=sys.stderr)
    return EXIT_OK


def cmd_audit_log_verify(args: argparse.Namespace) -> int:
    """Verify a hash-chained audit log (every HMAC with $FAIRNESS_AUDIT_LOG_KEY); exit 1 when it was changed or
    holds no record, 2 when it cannot be read."""
    from exporter.gate import audit_log

    try:
        result = audit_log.verify(args.path, expect_head=args.expect_head, key=_audit_log_key(),
                                  expect_records=args.expect_record)  # fmt: skip
    except OSError as exc:
        print(f"fairness-exporter audit-log verify: {args.path}: {exc.strerror or exc}", file=sys.stderr)
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
    if not result.records:  # an emptied or truncated log looks like this: a check of nothing never passes
        print(f"{args.path}: no record (empty or blank lines only): nothing was verified", file=sys.stderr)
        return EXIT_BLOCKED
    heads = (["head as expected"] if args.expect_head else []) + \
        ([f"{len(set(args.expect_record))} published record(s) present"] if args.expect_record else [])
    print(f"{args.path}: intact, {result.records} records ({mode}, "
          f"{', '.join(heads) or 'not checked against a published head'})")  # fmt: skip
    return EXIT_OK
