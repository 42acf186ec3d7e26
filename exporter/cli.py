"""The ``fairness-exporter`` command: ``audit``, ``bias-report``, ``safety``, ``redteam``, ``audit-log verify``,
``serve``, ``backtest`` and ``demo``."""

from __future__ import annotations

import argparse
import csv
import json
import logging
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from exporter import __version__
from exporter.config import ConfigError, load_config

if TYPE_CHECKING:
    from exporter.gate.audit_log import Head

EXIT_OK, EXIT_BLOCKED, EXIT_BAD_INPUT = 0, 1, 2
DEFAULT_AUDIT_LOG = "fairness-audit-log.jsonl"
SUMMARY_LINES = 15


def _file_facts(path: str) -> dict[str, Any]:
    from exporter.gate.audit import sha256_file

    p = Path(path)
    return {"file": path, "sha256": sha256_file(p) if p.is_file() else None}


def _summary(report: dict[str, Any]) -> str:
    lines = [f"{report['model_id']}: {report['verdict']} — {report['passed']}/{report['total_tests']} passed, "
             f"{report['blocking_failures']} blocking, {report['warning_failures']} warning, "
             f"{report['insufficient_samples']} with insufficient samples"]  # fmt: skip
    failures = [r for r in report["results"] if not r["passed"]]
    for r in failures[:SUMMARY_LINES]:
        value = "n/a" if r["value"] is None else r["value"]
        lines.append(f"  {r['status'].upper():<21} {r['severity']:<8} {r['attribute']} {r['metric']} "
                     f"{r['groups']}: {value} (threshold {r['threshold']}, samples {r['samples']})")  # fmt: skip
    if len(failures) > SUMMARY_LINES:
        lines.append(f"  ... and {len(failures) - SUMMARY_LINES} more in the JSON report")
    return "\n".join(lines)


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
    from exporter.gate import audit_log  # the gate needs pandas; `serve` must not load it
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
            report = run_audit(args.config, args.predictions, override=override)
        except (ConfigError, DataError) as exc:
            _log_run("audit", log_path, {"type": "audit_error", "error": str(exc), "config": _file_facts(args.config),
                                         "data": _file_facts(args.predictions)})  # fmt: skip
            print(f"fairness-exporter audit: {exc}", file=sys.stderr)
            return EXIT_BAD_INPUT
        head = _log_run("audit", log_path, {"type": "audit", "timestamp": report["timestamp"],
                                            "model_id": report["model_id"], "verdict": report["verdict"],
                                            "config": _file_facts(args.config), "data": _file_facts(args.predictions),
                                            "override": report["override"], "report": report})  # fmt: skip
    except audit_log.AuditLogError as exc:
        print(f"fairness-exporter audit: --audit-log {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    report["audit_log"] = {"path": str(log_path), "seq": head.seq, "hash": head.hash}
    text = json.dumps(report, indent=2, allow_nan=False)
    if args.report:
        Path(args.report).parent.mkdir(parents=True, exist_ok=True)
        Path(args.report).write_text(text + "\n")
    if args.impact_ratios_csv:
        _write_impact_ratios(Path(args.impact_ratios_csv), report)
    if args.html and not _write_html(Path(args.html), audit_html, report):
        return EXIT_BAD_INPUT
    print(text)
    print(_summary(report), file=sys.stderr)
    return exit_code(report)


def _write_html(path: Path, render: Callable[[Any], str], report: Any) -> bool:
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
        print(f"fairness-exporter bias-report: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    if args.html and not _write_html(Path(args.html), bias_html, reports):
        return EXIT_BAD_INPUT
    print(json.dumps(reports[args.data[0]] if len(args.data) == 1 else reports, indent=2, allow_nan=False))
    biased = [f"{src}: {f}" for src, rep in reports.items() for f, r in rep.items() if r["is_biased"]]
    for line in biased:
        print(f"  BIASED {line}", file=sys.stderr)
    return EXIT_BLOCKED if biased else EXIT_OK


def _emit(report: dict[str, Any], report_path: str | None, summary: str) -> None:
    """The JSON report on stdout (and in ``--report``), a human summary on stderr."""
    text = json.dumps(report, indent=2, allow_nan=False)
    if report_path:
        Path(report_path).parent.mkdir(parents=True, exist_ok=True)
        Path(report_path).write_text(text + "\n")
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
    from exporter.gate import audit_log
    from exporter.gate.audit import DataError
    from exporter.gate.targets import TargetError

    facts = {"config": _file_facts(args.config), "model": model}
    try:
        try:
            report = run()
        except (ConfigError, DataError, TargetError, ImportError) as exc:
            _log_run(suite, args.audit_log, {"type": f"{suite}_error", "error": str(exc), **facts})
            print(f"fairness-exporter {suite}: {exc}", file=sys.stderr)
            return EXIT_BAD_INPUT
        head = _log_run(suite, args.audit_log, {"type": suite, "timestamp": report["timestamp"],
                                                "model_id": report["model_id"], "verdict": report["verdict"],
                                                **facts, "report": report})  # fmt: skip
    except audit_log.AuditLogError as exc:
        print(f"fairness-exporter {suite}: --audit-log {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    report["audit_log"] = {"path": str(args.audit_log), "seq": head.seq, "hash": head.hash}
    _emit(report, args.report, _suite_summary(report))
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


def _configure_logging(level: str) -> None:
    logging.basicConfig(level=level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    quiet = max(logging.WARNING, logging.getLevelName(level.upper()))
    for noisy in ("kafka", "apscheduler"):
        logging.getLogger(noisy).setLevel(quiet)


def cmd_serve(args: argparse.Namespace) -> int:
    """Run the monitoring daemon until SIGTERM/SIGINT."""
    from exporter.daemon import Daemon
    from exporter.serve.http import ListenError
    from exporter.stream.checkpoint import CheckpointError

    _configure_logging(args.log_level)
    try:
        Daemon(load_config(args.config)).run_forever()
    except (ConfigError, CheckpointError) as exc:  # their messages name the file
        print(f"fairness-exporter serve: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except ListenError as exc:  # names the listen field of the config
        print(f"fairness-exporter serve: {args.config}: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    return EXIT_OK


def cmd_backtest(args: argparse.Namespace) -> int:
    """Replay recorded events through the daemon's path; write the alerts it would have raised as JSON."""
    from exporter.backtest import BacktestError, backtest

    try:
        config = load_config(args.config)
        report = backtest(config, args.events)
    except (ConfigError, BacktestError) as exc:
        print(f"fairness-exporter backtest: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    text = json.dumps(report, indent=2, allow_nan=False)
    if args.output:
        Path(args.output).parent.mkdir(parents=True, exist_ok=True)
        Path(args.output).write_text(text + "\n")
    else:
        print(text)
    firing = sum(a["resolved_at"] is None for a in report["alerts"])
    print(f"{report['model_id']}: {report['events']} events replayed in {report['steps']} steps, "
          f"{len(report['alerts'])} alert(s), {firing} still firing at the end", file=sys.stderr)  # fmt: skip
    return EXIT_OK


def cmd_demo(args: argparse.Namespace) -> int:
    """A local broker, synthetic traffic that drifts into bias, and the daemon; Ctrl-C stops all three."""
    from exporter.devtools.demo import run_demo

    _configure_logging(args.log_level)
    drift_after = args.drift_after if args.drift_after is not None else (60.0 if args.stack else 180.0)
    return run_demo(port=args.port, rate=args.rate, drift_after=drift_after, stack=args.stack)


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of every subcommand."""
    parser = argparse.ArgumentParser(prog="fairness-exporter", description=__doc__)
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)

    audit = sub.add_parser("audit", help="CI bias-audit gate: exit 1 on any blocking failure, 2 on bad input")
    audit.add_argument("config", help="YAML config (model_id, protected_attributes, metrics)")
    audit.add_argument("predictions", help="parquet or CSV file with prediction, label and attribute columns")
    audit.add_argument("--report", help="also write the JSON report to this file")
    audit.add_argument("--impact-ratios-csv", help="also write an NYC LL144-style table: selection rate and impact "
                       "ratio (vs the most selected category) per category and intersectional category")  # fmt: skip
    audit.add_argument("--html", help="also write a self-contained HTML report with plots to this file")
    audit.add_argument("--audit-log", default=os.environ.get("FAIRNESS_AUDIT_LOG", DEFAULT_AUDIT_LOG),
                       help="append-only, hash-chained log of every run (default: $FAIRNESS_AUDIT_LOG or "
                            f"{DEFAULT_AUDIT_LOG}); HMAC-keyed when $FAIRNESS_AUDIT_LOG_KEY is set")  # fmt: skip
    audit.add_argument("--override-justification", help="ship despite blocking failures, with this written reason")
    audit.add_argument("--override-author", help="who takes responsibility for the override")
    audit.set_defaults(func=cmd_audit)

    bias = sub.add_parser("bias-report", help="group means of an outcome per protected feature and their gap; "
                          "exit 1 when any gap exceeds the threshold, 2 on bad input")  # fmt: skip
    bias.add_argument("data", nargs="+", help="one or more CSV or parquet files")
    bias.add_argument("--protected", required=True,
                      help="comma-separated feature columns; join columns with + for an intersection "
                           "(gender,race,gender+race)")  # fmt: skip
    bias.add_argument("--outcome", required=True, help="numeric outcome column (0/1 or continuous)")
    bias.add_argument("--threshold", type=float, default=0.1, help="largest acceptable gap (default 0.1)")
    bias.add_argument("--html", help="also write a self-contained HTML report with plots to this file")
    bias.set_defaults(func=cmd_bias_report)

    audit_log_default = os.environ.get("FAIRNESS_AUDIT_LOG", DEFAULT_AUDIT_LOG)
    safety = sub.add_parser("safety", help="safety suite for a tabular model: exit 1 on a critical failure, "
                            "2 on a bad config or a model that cannot be loaded")  # fmt: skip
    safety.add_argument("--model", required=True, help="MODULE:OBJECT with predict (and predict_proba), "
                        "imported from the working directory and PYTHONPATH")  # fmt: skip
    safety.add_argument("--config", required=True, help="YAML: model_id, feature_count, valid_output_range, "
                        "test_inputs, seed, thresholds")  # fmt: skip
    safety.add_argument("--report", help="also write the JSON report to this file")
    safety.add_argument("--audit-log", default=audit_log_default, help="the audit gate's hash-chained log")
    safety.set_defaults(func=cmd_safety)

    redteam = sub.add_parser("redteam", help="red-team suite for a text classifier: exit 1 on a critical "
                             "failure, 2 on a bad config or a target that cannot be loaded")  # fmt: skip
    redteam.add_argument("--config", required=True, help="YAML: model_id, seed, red_team_tests, include_library")
    redteam.add_argument("--target", required=True, help="MODULE:CALLABLE from text to a label or score, "
                         "or an http(s):// URL that takes and returns JSON")  # fmt: skip
    redteam.add_argument("--request-field", default="text",
                         help="HTTP targets: where the text goes in the JSON body, dotted; "
                              "instances.0 for KServe v1, inputs.0 for MLflow (default: text)")  # fmt: skip
    redteam.add_argument("--response-field", default="prediction",
                         help="HTTP targets: the dotted field holding the label or score, "
                              "e.g. predictions.0 (default: prediction)")  # fmt: skip
    redteam.add_argument("--report", help="also write the JSON report to this file")
    redteam.add_argument("--audit-log", default=audit_log_default, help="the audit gate's hash-chained log")
    redteam.set_defaults(func=cmd_redteam)

    log = sub.add_parser("audit-log", help="inspect the audit log")
    log_sub = log.add_subparsers(dest="log_command", required=True)
    verify = log_sub.add_parser("verify", help="detect edited, reordered or deleted records (with "
                                "$FAIRNESS_AUDIT_LOG_KEY set: check every record's HMAC too)")  # fmt: skip
    verify.add_argument("path")
    verify.add_argument("--expect-head", help="the hash of the last record, as published by the last audit")
    verify.set_defaults(func=cmd_audit_log_verify)

    serve = sub.add_parser("serve", help="run the monitoring daemon (Kafka in, Prometheus /metrics out)")
    serve.add_argument("--config", "--config.file", dest="config", required=True, help="YAML config")
    serve.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    serve.set_defaults(func=cmd_serve)

    backtest = sub.add_parser("backtest", help="replay recorded events through the daemon's path and list the "
                              "alerts its rules would have raised")  # fmt: skip
    backtest.add_argument("--config", "--config.file", dest="config", required=True, help="YAML config")
    backtest.add_argument("events", nargs="+", help="JSON lines in the topic's event format, or parquet/CSV with "
                          "the gate's columns plus timestamp, model_id and prediction_id")  # fmt: skip
    backtest.add_argument("--output", help="write the JSON report here instead of stdout")
    backtest.set_defaults(func=cmd_backtest)

    demo = sub.add_parser("demo", help="local broker + synthetic drifting traffic + the daemon")
    demo.add_argument("--port", type=int, default=9108, help="metrics port (default 9108)")
    demo.add_argument("--rate", type=float, default=200.0, help="synthetic events per second (default 200)")
    demo.add_argument("--drift-after", type=float, default=None,
                      help="seconds of fair traffic before women's selection rate drops (default 180, 60 with --stack)")
    demo.add_argument("--stack", action="store_true",
                      help="also run Prometheus with the shipped rules, Alertmanager with the example routing and a "
                           "webhook sink that prints each page (needs `prometheus` and `alertmanager` installed)")
    demo.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    demo.set_defaults(func=cmd_demo)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point of the console script."""
    args = build_parser().parse_args(argv)
    return int(args.func(args))


if __name__ == "__main__":
    sys.exit(main())
