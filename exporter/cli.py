"""The ``fairness-exporter`` command: ``audit``, ``bias-report``, ``safety``, ``redteam``, ``counterfactual``,
``audit-log verify``, ``serve``, ``backtest`` and ``demo``."""

from __future__ import annotations

import argparse
import json
import logging
import os
import select
import sys

from exporter import __version__
from exporter.config import ConfigError, load_config, parse_duration
from exporter.gate.commands import (
    EXIT_BAD_INPUT,
    EXIT_OK,
    cmd_audit,
    cmd_audit_log_list,
    cmd_audit_log_verify,
    cmd_bias_report,
    cmd_redteam,
    cmd_safety,
)
from exporter.gate.counterfactual.command import add_parser as add_counterfactual

DEFAULT_AUDIT_LOG = "fairness-audit-log.jsonl"
EXIT_BROKEN_PIPE = 141
"""Standard output closed by its reader: 128 + SIGPIPE, the status a shell reports for a command killed by it."""
EXTRA_OF_MODULE = {"pandas": "gate", "pyarrow": "gate", "fsspec": "gate"}
"""The modules a daemon-only install (the daemon image) leaves out, and the extra of pyproject.toml that has each."""
MODEL_VERSION_HELP = ("the model version the report and the audit-log record name (default: the config's "
                      "model_version, else the SHA-256 of the model file when there is one)")


def _configure_logging(level: str) -> None:
    logging.basicConfig(level=level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    quiet = max(logging.WARNING, logging.getLevelName(level.upper()))
    for noisy in ("kafka", "apscheduler"):
        logging.getLogger(noisy).setLevel(quiet)


def cmd_serve(args: argparse.Namespace) -> int:
    """Run the monitoring daemon until SIGTERM/SIGINT."""
    from exporter.daemon import Daemon
    from exporter.serve.http import ListenError
    from exporter.serve.web_config import WebConfigError
    from exporter.stream.state.checkpoint import CheckpointError

    _configure_logging(args.log_level)
    try:
        watch = parse_duration(args.config_watch_interval) if args.config_watch_interval not in ("0", "0s") else 0.0
    except ValueError as exc:
        print(f"fairness-exporter serve: --config.watch-interval: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    try:
        Daemon(load_config(args.config), loader=lambda: load_config(args.config), web_config_file=args.web_config_file,
               lifecycle=args.web_enable_lifecycle, watch_seconds=watch).run_forever()
    except (ConfigError, CheckpointError, WebConfigError) as exc:  # their messages name the file
        print(f"fairness-exporter serve: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except ListenError as exc:  # names the listen field of the config
        print(f"fairness-exporter serve: {args.config}: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    return EXIT_OK


def cmd_backtest(args: argparse.Namespace) -> int:
    """Replay recorded events through the daemon's path; write the alerts it would have raised as JSON."""
    from exporter.backtest.input import BacktestError
    from exporter.backtest.replay import backtest
    from exporter.gate.reports.files import ReportWriteError, RunReports
    from exporter.gate.reports.html import backtest_html  # matplotlib only when rendering

    try:
        config = load_config(args.config)
        report = backtest(config, args.events)
    except (ConfigError, BacktestError) as exc:
        print(f"fairness-exporter backtest: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    ids = ", ".join(config.model_ids)
    reasons = ", ".join(f"{reason}: {n:,}" for reason, n in report["rejected_reasons"].items())
    refused = (f"{report['rejected']:,} rejected" + (f" ({reasons})" if reasons else "") + f", {report['ignored']:,} "
               f"of no configured model (model_id {ids})")  # fmt: skip
    if not report["events"]:  # a replay of nothing never passes: "0 alerts" would mean nothing
        print(f"fairness-exporter backtest: {', '.join(args.events)}: no event replayed: {refused}; expected JSON "
              "lines in the topic's event format (the config's events: paths), or parquet/CSV with the gate's "
              "columns (each event's time in columns.timestamp) plus model_id",
              file=sys.stderr)  # fmt: skip
        return EXIT_BAD_INPUT
    text = json.dumps(report, indent=2, allow_nan=False)
    files = RunReports()
    files.add("--output", args.output, lambda: text + "\n")
    files.add("--html", args.html, lambda: backtest_html(report))
    try:
        files.write()
    except ReportWriteError as exc:  # no report is left: each is written whole, and a failure takes the others back
        print(f"fairness-exporter backtest: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    files.done()
    if not args.output:
        print(text)
    if report["rejected"] > report["events"]:  # of the configured models' events, most were refused
        print(f"fairness-exporter backtest: warning: most events were rejected: {report['events']:,} replayed, "
              f"{refused}", file=sys.stderr)  # fmt: skip
    for a in report["alerts"]:  # each page's explanation (segments:), as /explain said it then
        if a.get("explanation"):
            print(f"{a['fired_at']} {a['alert']} {a['attribute']} {a.get('dimension')}: {a['explanation']['summary']}",
                  file=sys.stderr)  # fmt: skip
    firing = sum(a["resolved_at"] is None for a in report["alerts"])
    steps = f" in {report['steps']} steps" if "steps" in report else ""  # a fleet's models each take their own
    print(f"{ids}: {report['events']} events replayed{steps}, {len(report['alerts'])} alert(s), {firing} still "
          "firing at the end", file=sys.stderr)  # fmt: skip
    return EXIT_OK


def cmd_demo(args: argparse.Namespace) -> int:
    """A local broker, synthetic traffic that drifts into bias, and the daemon; Ctrl-C stops all three."""
    from exporter.devtools.demo import run_demo

    _configure_logging(args.log_level)
    drift_after = args.drift_after if args.drift_after is not None else (60.0 if args.stack else 180.0)
    return run_demo(port=args.port, rate=args.rate, drift_after=drift_after, stack=args.stack)


def _ci_report_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--junit", metavar="PATH", help="also write JUnit XML for the CI's test report: one test "
                        "case per check, a blocking failure as a failure, a warning as skipped")  # fmt: skip
    parser.add_argument("--summary-md", metavar="PATH", help="also write a Markdown summary (verdict, then every "
                        "check) for a GitHub job summary or a merge-request note")  # fmt: skip


def _suite_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--trust-model-file", action="store_true", help="load a pickle-based model file (.joblib, "
                        ".pkl, .pickle), which runs code from the file: only for files you trust as your own code "
                        "(skops and ONNX files need no trust)")  # fmt: skip
    parser.add_argument("--html", help="also write a self-contained HTML report to this file")


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of every subcommand."""
    parser = argparse.ArgumentParser(prog="fairness-exporter", description=__doc__)
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)

    audit_log_default = os.environ.get("FAIRNESS_AUDIT_LOG", DEFAULT_AUDIT_LOG)
    audit = sub.add_parser("audit", help="CI bias-audit gate: exit 1 on any blocking failure, 2 on bad input")
    audit.add_argument("config", help="YAML config (model_id, protected_attributes, metrics)")
    audit.add_argument("predictions", nargs="?", help="parquet or CSV data: a file, a folder, a glob or a prefix "
                       "(local or a URL: s3://, gs://, az://, file://; hive partitions are columns) with prediction, "
                       "label and attribute columns; default: the config's evaluation_dataset")
    audit.add_argument("--engine", choices=("local", "spark"), default="local",
                       help="who counts the rows: local (record batches in bounded memory, the default) or spark (one "
                       "aggregation on the Spark master of the usual Spark settings; the spark extra)")  # fmt: skip
    audit.add_argument("--baseline", help="data of an earlier period (read like the predictions): the report then "
                       "explains each gap's change from it over the config's segments")
    audit.add_argument("--model", help="the model to audit when the config lists several (models: or models_dir:)")
    audit.add_argument("--report", help="also write the JSON report to this file")
    audit.add_argument("--impact-ratios-csv", help="also write an NYC LL144-style table: selection rate and impact "
                       "ratio (vs the most selected category) per category and intersectional category")  # fmt: skip
    audit.add_argument("--html", help="also write a self-contained HTML report with plots to this file")
    audit.add_argument("--audit-log", default=audit_log_default,
                       help="append-only, hash-chained log of every run (default: $FAIRNESS_AUDIT_LOG or "
                            f"{DEFAULT_AUDIT_LOG}); HMAC-keyed when $FAIRNESS_AUDIT_LOG_KEY is set")  # fmt: skip
    audit.add_argument("--override-justification", help="ship despite blocking failures, with this written reason")
    audit.add_argument("--override-author", help="who takes responsibility for the override")
    audit.add_argument("--model-version", help=MODEL_VERSION_HELP)
    _ci_report_flags(audit)
    audit.set_defaults(func=cmd_audit)

    bias = sub.add_parser("bias-report", help="group means of an outcome per protected feature and their gap; "
                          "exit 1 when any gap exceeds the threshold, 2 on bad input")  # fmt: skip
    bias.add_argument("data", nargs="+", help="one or more CSV or parquet datasets (file, folder, glob or "
                      "prefix)")
    bias.add_argument("--protected", required=True,
                      help="comma-separated feature columns; join columns with + for an intersection "
                           "(gender,race,gender+race)")  # fmt: skip
    bias.add_argument("--outcome", required=True, help="numeric outcome column (0/1 or continuous)")
    bias.add_argument("--threshold", type=float, default=0.1, help="largest acceptable gap (default 0.1)")
    bias.add_argument("--html", help="also write a self-contained HTML report with plots to this file")
    bias.add_argument("--audit-log", default=audit_log_default, help="the audit gate's hash-chained log")
    bias.add_argument("--model-id", help="the model the audit-log record names")
    bias.add_argument("--model-version", help="the model version the audit-log record names")
    _ci_report_flags(bias)
    bias.set_defaults(func=cmd_bias_report)

    safety = sub.add_parser("safety", help="safety suite for a tabular model: exit 1 on a critical failure, "
                            "2 on a bad config or a model that cannot be loaded")  # fmt: skip
    safety.add_argument("--model", help="a model file (.skops, .joblib/.pkl, .onnx; local or a URL) or MODULE:OBJECT "
                        "with predict (and predict_proba), imported from the working directory and PYTHONPATH; a "
                        "class is instantiated (default: the config's model)")  # fmt: skip
    safety.add_argument("--config", required=True, help="YAML: model_id, feature_count, valid_output_range, "
                        "test_inputs, seed, thresholds")  # fmt: skip
    safety.add_argument("--report", help="also write the JSON report to this file")
    safety.add_argument("--audit-log", default=audit_log_default, help="the audit gate's hash-chained log")
    safety.add_argument("--model-version", help=MODEL_VERSION_HELP)
    _suite_flags(safety)
    _ci_report_flags(safety)
    safety.set_defaults(func=cmd_safety)

    redteam = sub.add_parser("redteam", help="red-team suite for a text classifier or a chat model: exit 1 on a "
                             "critical failure, 2 on a bad config or a target that cannot be loaded")  # fmt: skip
    redteam.add_argument("--config", required=True, help="YAML: model_id, seed, red_team_tests, include_library")
    redteam.add_argument("--target", help="MODULE:CALLABLE from text to a label or score, an http(s):// URL that "
                         "takes and returns JSON, or with --chat-model the base URL of an OpenAI-compatible "
                         "chat-completions endpoint (default: the config's target section)")  # fmt: skip
    redteam.add_argument("--chat-model", help="the model an OpenAI-compatible --target serves (vLLM, llama.cpp, "
                         "Ollama, TGI); its key is read from $OPENAI_API_KEY or the config's target.api_key_env")
    redteam.add_argument("--request-field", default="text",
                         help="HTTP targets: where the text goes in the JSON body, dotted; "
                              "instances.0 for KServe v1, inputs.0 for MLflow (default: text)")  # fmt: skip
    redteam.add_argument("--response-field", default="prediction",
                         help="HTTP targets: the dotted field holding the label or score, "
                              "e.g. predictions.0 (default: prediction)")  # fmt: skip
    redteam.add_argument("--report", help="also write the JSON report to this file")
    redteam.add_argument("--audit-log", default=audit_log_default, help="the audit gate's hash-chained log")
    redteam.add_argument("--model-version", help=MODEL_VERSION_HELP)
    _suite_flags(redteam)
    _ci_report_flags(redteam)
    redteam.set_defaults(func=cmd_redteam)

    add_counterfactual(sub, audit_log_default, _ci_report_flags)

    log = sub.add_parser("audit-log", help="inspect the audit log")
    log_sub = log.add_subparsers(dest="log_command", required=True)
    verify = log_sub.add_parser("verify", help="detect edited, reordered or deleted records (with "
                                "$FAIRNESS_AUDIT_LOG_KEY set: check every record's HMAC too)")  # fmt: skip
    verify.add_argument("path")
    verify.add_argument("--expect-head", help="the hash of the last record, as published by the last audit")
    verify.add_argument("--expect-record", action="append", default=[], metavar="HASH",
                        help="a hash an earlier run published (its report's audit_log.hash), still in the chain; "
                             "repeat it for each kept head")  # fmt: skip
    verify.set_defaults(func=cmd_audit_log_verify)
    listing = log_sub.add_parser("list", help="the records of a model and version: audits, bias reports, safety "
                                 "and red-team runs, one line each")  # fmt: skip
    listing.add_argument("path")
    listing.add_argument("--model", help="only this model id")
    listing.add_argument("--version", help="only this model version")
    listing.add_argument("--type", help="only this type of record: audit, bias_report, safety, redteam, "
                         "counterfactual, or an *_error type")  # fmt: skip
    listing.add_argument("--json", action="store_true", help="print the whole records as JSON lines")
    listing.set_defaults(func=cmd_audit_log_list)

    serve = sub.add_parser("serve", help="run the monitoring daemon (Kafka in, Prometheus /metrics out)")
    serve.add_argument("--config", "--config.file", dest="config", required=True, help="YAML config")
    serve.add_argument("--config.watch-interval", dest="config_watch_interval", default="5s",
                       help="how often the config file and models_dir are checked for a change, which reloads them "
                            "once unchanged at the next check (default 5s; 0: only SIGHUP or POST /-/reload, which "
                            "reload at once)")  # fmt: skip
    serve.add_argument("--web.enable-lifecycle", dest="web_enable_lifecycle", action="store_true",
                       help="serve POST /-/reload, which reloads the config (off by default, as in Prometheus; "
                            "behind the same --web.config.file rules as every other path)")  # fmt: skip
    serve.add_argument("--web.config.file", dest="web_config_file",
                       help="who may read /metrics and the probes: the Prometheus exporter-toolkit web configuration "
                            "(TLS, client certificates, basic auth users with bcrypt hashes; docs/faults.md)")
    serve.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    serve.set_defaults(func=cmd_serve)

    backtest = sub.add_parser("backtest", help="replay recorded events through the daemon's path and list the "
                              "alerts its rules would have raised")  # fmt: skip
    backtest.add_argument("--config", "--config.file", dest="config", required=True, help="YAML config")
    backtest.add_argument("events", nargs="+", help="JSON lines in the topic's event format, or parquet/CSV "
                          "datasets (file, folder, glob or prefix) with the gate's columns (the time in "
                          "columns.timestamp) plus model_id")  # fmt: skip
    backtest.add_argument("--output", help="write the JSON report here instead of stdout")
    backtest.add_argument("--html", help="also write a self-contained HTML report with plots to this file")
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
    """Entry point of the console script; a command that needs an extra this install lacks exits 2 naming it."""
    args = build_parser().parse_args(argv)
    try:
        status = int(args.func(args))
        sys.stdout.flush()  # a pipe buffers what was printed: a closed one fails here, not at exit
        return status
    except BrokenPipeError:
        if not _stdout_unread():  # a broken pipe of a socket or child, not of our output: a fault to show
            raise
        # its reader stopped reading (`| head`): the reports and the audit log are written before anything is
        # printed; stdout goes to /dev/null so the interpreter's exit flush does not fail a second time
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        print(f"fairness-exporter {args.command}: standard output closed by its reader: what was printed is cut "
              f"short (exit {EXIT_BROKEN_PIPE}, not the verdict)", file=sys.stderr)  # fmt: skip
        return EXIT_BROKEN_PIPE
    except ModuleNotFoundError as exc:
        module = (exc.name or "").partition(".")[0]
        if module not in EXTRA_OF_MODULE:
            raise
        extra = EXTRA_OF_MODULE[module]
        print(f"fairness-exporter {args.command}: needs {module}, which this install leaves out (the daemon image "
              f"does): pip install 'fairness-exporter[{extra}]', or run the full image", file=sys.stderr)
        return EXIT_BAD_INPUT



def _stdout_unread() -> bool:
    """Whether standard output is a pipe or socket no one reads any more (the poll's POLLERR of a write end whose
    readers closed), as opposed to another connection's broken pipe."""
    try:
        poller = select.poll()
        poller.register(sys.stdout.fileno(), select.POLLOUT)
        return any(events & select.POLLERR for _, events in poller.poll(0))
    except (AttributeError, OSError, ValueError):  # no poll (Windows), or no stdout descriptor
        return False


if __name__ == "__main__":
    sys.exit(main())
