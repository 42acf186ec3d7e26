"""``fairness-exporter counterfactual SUITE.yaml --target URL --model NAME``: run the suite, log the run in the
hash-chained audit log (target, model, suite hash, answers hash), print the JSON report; exit 0 (pass), 1 (a
blocking failure), 2 (a bad suite, a budget too small, an endpoint that answers nothing).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any, Final

from exporter.config import ConfigError

DEFAULT_CACHE: Final = ".fairness-exporter-cache/counterfactual"


def add_parser(sub: Any, audit_log_default: str, ci_flags: Any) -> None:
    """Register the subcommand (``sub`` is the CLI's subparsers; ``ci_flags`` adds --junit and --summary-md)."""
    p = sub.add_parser("counterfactual", help="counterfactual fairness audit of an LLM's decisions (names swapped, "
                       "paired tests, LL144 table): exit 1 on a blocking failure, 2 on a bad suite")  # fmt: skip
    p.add_argument("config", metavar="SUITE", help="YAML suite: template, attributes, items, decision, metrics")
    p.add_argument("--target", help="base URL of the OpenAI-compatible endpoint (default: the suite's target.url)")
    p.add_argument("--model", help="the model it serves (default: the suite's target.model); the key is read from "
                   "$OPENAI_API_KEY or the suite's target.api_key_env")  # fmt: skip
    p.add_argument("--cache", default=os.environ.get("FAIRNESS_COUNTERFACTUAL_CACHE", DEFAULT_CACHE),
                   help="folder of cached answers by request hash: a rerun sends nothing it has an answer for "
                        f"(default: $FAIRNESS_COUNTERFACTUAL_CACHE or {DEFAULT_CACHE})")  # fmt: skip
    p.add_argument("--max-calls", type=int, help="the budget of HTTP calls, retries included (default: the suite's "
                   "requests.max_calls); checked before the first call")  # fmt: skip
    p.add_argument("--report", help="also write the JSON report to this file")
    p.add_argument("--html", help="also write a self-contained HTML report, flipped items side by side")
    p.add_argument("--audit-log", default=audit_log_default, help="the audit gate's hash-chained log")
    p.add_argument("--model-version", help="the model version the report and the audit-log record name")
    ci_flags(p)
    p.set_defaults(func=cmd_counterfactual)


def cmd_counterfactual(args: argparse.Namespace) -> int:
    """Run a counterfactual suite with the gate's semantics and reports."""
    from exporter.gate import audit_log
    from exporter.gate.commands import (
        EXIT_BLOCKED,
        EXIT_OK,
        add_ci_reports,
        bad_input,
        file_facts,
        log_run,
        not_written,
    )
    from exporter.gate.counterfactual.render import ci_report, counterfactual_html, summary
    from exporter.gate.reports.files import ReportWriteError, RunReports
    from exporter.gate.suite import audit_entry
    from exporter.gate.targets.objects import TargetError

    facts: dict[str, Any] = {"suite": file_facts(args.config), "target": {"url": args.target, "model": args.model}}
    if args.max_calls is not None and args.max_calls < 1:
        return bad_input(args, "counterfactual", f"--max-calls {args.max_calls}: expected a whole number >= 1")
    loaded: list[Any] = []
    try:
        try:
            report = run_suite(args, loaded)
        except (ConfigError, TargetError, ImportError) as exc:
            run = loaded[0] if loaded else None
            log_run("counterfactual", args.audit_log, {
                "type": "counterfactual_error", "error": str(exc), "model_id": getattr(run, "model_id", None),
                "model_version": args.model_version or getattr(run, "model_version", None), **facts})  # fmt: skip
            return bad_input(args, "counterfactual", str(exc))
        files = RunReports()
        files.add("--report", args.report, lambda: json.dumps(report, indent=2, allow_nan=False) + "\n")
        add_ci_reports(files, args, lambda: ci_report(report))
        files.add("--html", args.html, lambda: counterfactual_html(report))
        log_run("counterfactual", args.audit_log, audit_entry(
            report, target=report["target"], suite={"file": report["suite_file"], "sha256": report["suite_sha256"]},
            cache=report["cache"]), files, report)  # fmt: skip
    except audit_log.AuditLogError as exc:
        return bad_input(args, "counterfactual", f"--audit-log {exc}")
    except ReportWriteError as exc:
        return not_written("counterfactual", exc)
    print(json.dumps(report, indent=2, allow_nan=False))
    print(summary(report), file=sys.stderr)
    if report["cache"].get("not_written"):
        print(f"fairness-exporter counterfactual: warning: {report['cache']['not_written']} answer(s) could not be "
              f"kept in the cache, asked again next run (first: {report['cache']['first_error']})", file=sys.stderr)
    return EXIT_BLOCKED if report["verdict"] == "FAIL" else EXIT_OK


def run_suite(args: argparse.Namespace, loaded: list[Any]) -> dict[str, Any]:
    """Load the suite by its kind and run it; its run settings are appended to ``loaded`` once they are valid (the
    error record of a later failure names its model)."""
    from exporter.gate.counterfactual.suite import load_suite, suite_kind

    options = {"model_version": args.model_version, "max_calls": args.max_calls}
    if suite_kind(args.config) == "ambiguous":
        from exporter.gate.counterfactual.ambiguous import load_ambiguous, run_ambiguous  # scipy: ImportError, exit 2

        ambiguous = load_ambiguous(args.config, args.target, args.model)
        loaded.append(ambiguous.run)
        return run_ambiguous(ambiguous, args.cache, **options)
    from exporter.gate.counterfactual.run import run_counterfactual

    suite = load_suite(args.config, args.target, args.model)
    loaded.append(suite.run)
    return run_counterfactual(suite, args.cache, **options)
