"""Replicas of the daemon as real processes (`python -m exporter.cli serve`) on the embedded broker: what the
scale and alerts benchmarks start, scrape and stop.

Each replica is its own interpreter with its own config file and log, in one consumer group; a replica's models
are those it says it owns (``fairness_exporter_model_owned``), its CPU seconds are read from /proc.
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any, Self

import yaml
from prometheus_client.parser import text_string_to_metric_families

from bench.report import broker_cpu_seconds
from exporter.devtools.embedded_broker import free_port, terminate

Page = dict[tuple[str, frozenset[tuple[str, str]]], float]
# Tansu holds a new member's JoinGroup for about session_timeout_ms / 2: 6 s keeps a rebalance near 3 s
GROUP_CLIENT = {"reconnect_backoff_max_ms": 500, "session_timeout_ms": 6000, "heartbeat_interval_ms": 1000}
STARTUP_TIMEOUT = 180.0


def serve_config(base: dict[str, Any], bootstrap: str, topic: str, group: str, port: int, stages: str
                 ) -> dict[str, Any]:  # fmt: skip
    """``base`` (models, windows, ...) read from ``topic`` by one replica of ``group`` on the staged or the direct
    path (the direct path reads every partition)."""
    kafka = {"bootstrap_servers": bootstrap, "topic": topic, "group_id": group, "stages": stages,
             "assignment": "subscribe" if stages == "staged" else "manual", "client": GROUP_CLIENT}  # fmt: skip
    return {**base, "kafka": kafka, "listen": {"address": "127.0.0.1", "port": port}}


def scrape(port: int, names: tuple[str, ...] = ()) -> Page:
    """The samples on a replica's /metrics, keyed by (name, labels): every one, or those whose name starts with
    one of ``names`` (parsing a fleet's whole page takes longer than its scrape); empty when it does not answer."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
            text = response.read().decode()
    except OSError:
        return {}
    if names:
        text = "\n".join(line for line in text.splitlines() if line.startswith(names))
    return {(s.name, frozenset(s.labels.items())): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}  # fmt: skip


def owned(page: Page) -> set[str]:
    """The models a page says its replica owns."""
    return {dict(labels)["model_id"] for (name, labels), value in page.items()
            if name == "fairness_exporter_model_owned" and value == 1}  # fmt: skip


def wait_until(predicate: Callable[[], bool], timeout: float, what: str, every: float = 0.1) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(every)


@dataclass
class Replica:
    port: int
    process: subprocess.Popen[bytes]
    log: Path

    def page(self, names: tuple[str, ...] = ()) -> Page:
        return scrape(self.port, names)

    def cpu_seconds(self) -> float:
        return broker_cpu_seconds(self.process.pid)


class Replicas:
    """``n`` replicas of one config (``base`` as in :func:`serve_config`) in one consumer group; a context manager
    that stops them (SIGTERM, then SIGKILL) and, when the block failed, prints the tail of each log."""

    def __init__(self, n: int, base: dict[str, Any], bootstrap: str, topic: str, group: str, stages: str) -> None:
        self._directory = tempfile.TemporaryDirectory(prefix="bench-replicas-")
        self.replicas: list[Replica] = []
        for i in range(n):
            port = free_port()
            path = Path(self._directory.name) / f"replica-{i}.yaml"
            path.write_text(yaml.safe_dump(serve_config(base, bootstrap, topic, group, port, stages)))
            log = path.with_suffix(".log")
            process = subprocess.Popen([sys.executable, "-m", "exporter.cli", "serve", "--config", str(path)],
                                       stdout=log.open("ab"), stderr=subprocess.STDOUT)  # fmt: skip
            self.replicas.append(Replica(port, process, log))

    def pages(self, names: tuple[str, ...] = ()) -> list[Page]:
        """Each replica's page (see :func:`scrape`); an error once one has exited."""
        dead = [r.log.name for r in self.replicas if r.process.poll() is not None]
        if dead:
            raise RuntimeError(f"replicas exited: {', '.join(dead)}")
        return [r.page(names) for r in self.replicas]

    def owners(self, models: list[str]) -> dict[str, list[int]]:
        """Per model, the indices of the replicas that say they own it."""
        found: dict[str, list[int]] = {m: [] for m in models}
        for i, page in enumerate(self.pages(("fairness_exporter_model_owned",))):
            for model in owned(page) & found.keys():
                found[model].append(i)
        return found

    def wait_owned(self, models: list[str], timeout: float = STARTUP_TIMEOUT) -> dict[str, int]:
        """Wait until every model is owned by exactly one replica; its owner's index."""
        wait_until(lambda: all(len(o) == 1 for o in self.owners(models).values()), timeout,
                   f"each of {len(models)} models owned by exactly one of {len(self.replicas)} replicas", 0.5)
        return {m: o[0] for m, o in self.owners(models).items()}

    def cpu_seconds(self) -> float:
        return sum(r.cpu_seconds() for r in self.replicas)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, kind: type[BaseException] | None, value: BaseException | None,
                 traceback: TracebackType | None) -> None:  # fmt: skip
        for replica in self.replicas:
            terminate(replica.process, 15)
        if kind is not None:
            for replica in self.replicas:
                print(f"--- {replica.log.name} (tail)\n{replica.log.read_text(errors='replace')[-3000:]}",
                      file=sys.stderr)
        self._directory.cleanup()
