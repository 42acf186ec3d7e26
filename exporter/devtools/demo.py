"""`fairness-exporter demo`: everything on one machine with nothing set up by hand.

With `--stack` it adds the chain a platform team runs: Prometheus with the shipped rules (every `for:` shortened
to STACK_FOR), Alertmanager with deploy/alertmanager/alertmanager.yml (timers STACK_TIMERS) and a webhook sink
that prints each page, plus the alerts' pending and firing transitions as Prometheus reports them.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import signal
import tempfile
import threading
import urllib.parse
from importlib.resources import files
from pathlib import Path
from typing import Any

from exporter.config import load_config
from exporter.daemon import Daemon
from exporter.devtools.embedded_broker import BrokerError, EmbeddedBroker
from exporter.devtools.monitoring import (
    ALERTMANAGER_CONFIG,
    AlertmanagerServer,
    MissingTool,
    PrometheusServer,
    WebhookSink,
    routing_config,
)
from exporter.devtools.rules import TUNING, rule_file
from exporter.devtools.synthetic import TrafficGenerator

log = logging.getLogger(__name__)
DEMO_CONFIG = files("exporter") / "examples" / "demo.yaml"
STACK_FOR = "20s"
STACK_TIMERS = {"group_wait": "5s", "group_interval": "10s", "repeat_interval": "1h"}
GRAPHED = ("model_disparate_impact_ratio", "model_demographic_parity_difference")


def print_page(receiver: str, body: dict[str, Any]) -> None:
    """One block per notification the sink receives: who was paged, for what, and the runbook."""
    lines = [f"\n  PAGE to {receiver} ({body['status']}, group {body['groupLabels']}):"]
    for alert in body["alerts"]:
        labels = alert["labels"]
        where = " ".join(f"{key}={labels[key]}" for key in ("model_id", "attribute", "dimension", "window")
                         if key in labels)  # fmt: skip
        lines.append(f"    [{alert['status']}] {labels['alertname']} severity={labels.get('severity')} {where}")
        lines.append(f"      {alert['annotations'].get('summary', '')}")
        lines.append(f"      runbook: {alert['annotations'].get('runbook_url', '-')}")
    print("\n".join(lines), flush=True)


class AlertStates(threading.Thread):
    """Prints each alert's transitions (pending, firing, resolved) as Prometheus reports them, every second."""

    def __init__(self, prometheus: PrometheusServer) -> None:
        super().__init__(name="alert-states", daemon=True)
        self.prometheus = prometheus
        self.done = threading.Event()
        self.states: dict[tuple[tuple[str, str], ...], str] = {}

    def run(self) -> None:
        while not self.done.wait(1.0):
            try:
                alerts = self.prometheus.alerts()
            except (OSError, AssertionError, ValueError):
                continue
            now = {tuple(sorted(a["labels"].items())): a["state"] for a in alerts}
            for key, state in now.items():
                if self.states.get(key) != state:
                    print(f"  alert {state:8} {self.describe(key)}", flush=True)
            for key in self.states.keys() - now.keys():
                print(f"  alert resolved {self.describe(key)}", flush=True)
            self.states = now

    @staticmethod
    def describe(key: tuple[tuple[str, str], ...]) -> str:
        labels = dict(key)
        shown = ",".join(f"{k}={labels[k]}" for k in ("model_id", "dimension", "window") if k in labels)
        return f"{labels.get('alertname')}{{{shown}}}"


def start_stack(stack: contextlib.ExitStack, daemon_port: int) -> str:
    """Start the sink, Alertmanager and Prometheus (stopped by `stack`); the lines that tell the user where."""
    if not ALERTMANAGER_CONFIG.is_file():
        raise MissingTool(f"{ALERTMANAGER_CONFIG} is missing: run the stack demo from a clone of the repository")
    directory = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="fairness-demo-")))
    sink = stack.enter_context(WebhookSink(on_page=print_page))
    routing = routing_config(sink.url, STACK_TIMERS)
    alertmanager = stack.enter_context(AlertmanagerServer(directory / "alertmanager", routing))
    prometheus = stack.enter_context(PrometheusServer(
        directory / "prometheus", [f"127.0.0.1:{daemon_port}"], rules=rule_file(for_durations=STACK_FOR),
        alertmanager=alertmanager.address))  # fmt: skip
    states = AlertStates(prometheus)
    states.start()
    stack.callback(states.done.set)
    graph = urllib.parse.urlencode({f"g{i}.{k}": v for i, expr in enumerate(GRAPHED)
                                    for k, v in (("expr", expr), ("tab", "0"), ("range_input", "15m"))})  # fmt: skip
    shipped = dict.fromkeys(tuning.for_ for tuning in TUNING.values())
    return (f"  prometheus:   {prometheus.url} (pid {prometheus.pid}), rules from rules/fairness-exporter.rules.yaml\n"
            f"                every `for:` shortened to {STACK_FOR} for the demo (shipped: {', '.join(shipped)})\n"
            f"  the gap:      {prometheus.page('graph')}?{graph}\n"
            f"  alerts:       {prometheus.page('alerts')}\n"
            f"  alertmanager: {alertmanager.url} (pid {alertmanager.pid}), routing from "
            f"deploy/alertmanager/alertmanager.yml,\n                timers {STACK_TIMERS}\n"
            f"  pages go to a webhook sink at {sink.url} and are printed here.\n")


def run_demo(port: int = 9108, rate: float = 200.0, drift_after: float = 180.0, stack: bool = False) -> int:
    """Start a broker, synthetic traffic and the daemon (and with `stack` Prometheus, Alertmanager and a webhook
    sink); block until SIGINT/SIGTERM; stop them all."""
    done = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: done.set())
    try:
        broker = EmbeddedBroker()
        broker.start()
    except BrokerError as exc:
        log.error("%s", exc)
        return 1
    with broker, contextlib.ExitStack() as monitoring:
        os.environ["FAIRNESS_DEMO_BOOTSTRAP"] = broker.bootstrap_servers
        config = load_config(str(DEMO_CONFIG))
        config = dataclasses.replace(config, listen_port=port)
        broker.create_topic(config.kafka.topic, partitions=3)
        traffic = TrafficGenerator(broker.bootstrap_servers, config.kafka.topic, rate=rate, drift_after=drift_after)
        daemon = Daemon(config)
        daemon.start()
        try:
            where = start_stack(monitoring, daemon.port) if stack else ""
        except MissingTool as exc:
            daemon.stop()
            log.error("demo --stack: %s (or run `make demo-stack`)", exc)
            return 2
        traffic.start()
        print(f"\n  fairness-exporter demo: broker at {broker.bootstrap_servers}, {rate:g} events/s, "
              f"bias drift after {drift_after:g}s\n  metrics:  http://127.0.0.1:{daemon.port}/metrics\n"
              f"  try:      curl -s localhost:{daemon.port}/metrics | grep model_disparate_impact_ratio\n"
              f"{where}  Ctrl-C stops everything.\n", flush=True)  # fmt: skip
        try:
            done.wait()
        finally:
            log.info("stopping the demo (%d events produced)", traffic.produced)
            traffic.stop()
            daemon.stop()
    return 0
