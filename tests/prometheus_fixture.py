"""Real Prometheus and Alertmanager servers for integration tests, and the rules generator.

    with PrometheusServer(tmp_path, ["127.0.0.1:9108"], rules=load_rule_generator().rule_file(for_durations="5s")) as p:
        p.query('up{job="fairness-exporter"}')  # [{"metric": {...}, "value": [ts, "1"]}]

The servers are exporter.devtools.monitoring's (the demo runs the same ones); here a missing binary skips the
test on a laptop and fails it under CI=true. See that module for ports, configs and how they are stopped.
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Callable
from types import ModuleType
from typing import Any

from tooling import require_binary

from exporter.devtools import monitoring
from exporter.devtools.monitoring import JOB

__all__ = ["JOB", "AlertmanagerServer", "PrometheusServer", "alertmanager_binary", "load_rule_generator", "wait_until"]


def load_rule_generator() -> ModuleType:
    """The rules generator module."""
    from exporter.devtools import rules

    return rules


def wait_until(predicate: Callable[[], Any], timeout: float, what: str, every: float = 0.2) -> Any:
    """Poll until predicate() returns something truthy and return it; AssertionError naming `what` on timeout."""
    deadline = time.monotonic() + timeout
    while True:
        result = predicate()
        if result:
            return result
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout:g}s waiting for {what}")
        time.sleep(every)


class PrometheusServer(monitoring.PrometheusServer):
    """exporter.devtools.monitoring's Prometheus, skipped (or failed under CI=true) when not installed."""

    def find_binary(self) -> str:
        return require_binary("prometheus")


def alertmanager_binary() -> str:
    """Debian's /usr/bin/prometheus-alertmanager, else `alertmanager`; skip or fail when neither is installed."""
    return shutil.which("prometheus-alertmanager") or require_binary("alertmanager")


class AlertmanagerServer(monitoring.AlertmanagerServer):
    """exporter.devtools.monitoring's Alertmanager, skipped (or failed under CI=true) when not installed."""

    def find_binary(self) -> str:
        return alertmanager_binary()
