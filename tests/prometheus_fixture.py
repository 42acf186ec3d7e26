"""A real Prometheus server for integration tests, and the rule generator loaded by path.

    with PrometheusServer(tmp_path, ["127.0.0.1:9108"], rules=load_rule_generator().rule_file(for_durations="5s")) as p:
        p.query('up{job="fairness-exporter"}')  # [{"metric": {...}, "value": [ts, "1"]}]

The server scrapes its targets and evaluates its rules every second (job `fairness-exporter`, as in the chart),
stores into a temporary TSDB, and listens on a free loopback port. It is stopped with SIGTERM (SIGKILL after a
timeout) on exit, and the kernel kills it if the test process dies first: no test leaves a Prometheus running.
"""

from __future__ import annotations

import ctypes
import json
import signal
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from types import ModuleType, TracebackType
from typing import IO, Any, Self

import yaml
from tooling import require_binary

from exporter.devtools.embedded_broker import free_port, terminate

JOB = "fairness-exporter"
_PR_SET_PDEATHSIG = 1
_LOG_TAIL_BYTES = 4000


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


try:  # resolved here, not in the forked child, where loading a library could deadlock
    _prctl: Callable[..., int] | None = ctypes.CDLL(None, use_errno=True).prctl
except (OSError, AttributeError):  # not Linux
    _prctl = None


def _die_with_parent() -> None:
    """In the child before exec: have the kernel SIGKILL it when the thread that started it exits."""
    if _prctl is not None:
        _prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


class PrometheusServer:
    """/usr/bin/prometheus scraping `targets` every `interval`, evaluating `rules` (a rule file dict) as often."""

    def __init__(self, directory: Path, targets: Sequence[str], rules: Mapping[str, Any] | None = None,
                 interval: str = "1s", startup_timeout: float = 30.0, stop_timeout: float = 10.0) -> None:  # fmt: skip
        self.directory = directory
        self.targets = list(targets)
        self.rules = rules
        self.interval = interval
        self.startup_timeout = startup_timeout
        self.stop_timeout = stop_timeout
        self.port = 0
        self._proc: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _write_config(self) -> Path:
        self.directory.mkdir(parents=True, exist_ok=True)
        config: dict[str, Any] = {
            "global": {"scrape_interval": self.interval, "scrape_timeout": self.interval,
                       "evaluation_interval": self.interval},
            "scrape_configs": [{"job_name": JOB, "static_configs": [{"targets": self.targets}]}],
        }  # fmt: skip
        if self.rules is not None:
            (self.directory / "rules.yaml").write_text(yaml.safe_dump(dict(self.rules), sort_keys=False))
            config["rule_files"] = ["rules.yaml"]
        path = self.directory / "prometheus.yml"
        path.write_text(yaml.safe_dump(config, sort_keys=False))
        return path

    def start(self) -> Self:
        """Start the server and wait for /-/ready; retry on another port if the free port was taken meanwhile."""
        binary = require_binary("prometheus")
        config = self._write_config()
        for _attempt in range(3):
            self.port = free_port()
            self._log = (self.directory / "prometheus.log").open("ab")
            self._proc = subprocess.Popen(
                [binary, f"--config.file={config}", f"--storage.tsdb.path={self.directory / 'data'}",
                 f"--web.listen-address=127.0.0.1:{self.port}", "--log.level=warn"],
                stdin=subprocess.DEVNULL, stdout=self._log, stderr=self._log, preexec_fn=_die_with_parent,
            )  # fmt: skip
            try:
                if self._wait_ready():
                    return self
            except BaseException:
                self.stop()
                raise
            in_use = "address already in use" in self.log_tail()
            self.stop()
            if not in_use:
                break
        raise AssertionError(f"prometheus exited during startup:\n{self.log_tail()}")

    def _wait_ready(self) -> bool:
        """True once /-/ready answers 200; False if the process exits; AssertionError on timeout."""
        assert self._proc is not None
        deadline = time.monotonic() + self.startup_timeout
        while self._proc.poll() is None:
            try:
                with urllib.request.urlopen(f"{self.url}/-/ready", timeout=2) as response:
                    if response.status == 200:
                        return True
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise AssertionError(f"prometheus not ready after {self.startup_timeout:g}s:\n{self.log_tail()}")
            time.sleep(0.1)
        return False

    def stop(self) -> None:
        """SIGTERM, SIGKILL after stop_timeout, and reap; no-op when not running."""
        proc, self._proc = self._proc, None
        terminate(proc, self.stop_timeout)
        if self._log is not None:
            self._log.close()
            self._log = None

    def log_tail(self) -> str:
        path = self.directory / "prometheus.log"
        return path.read_bytes()[-_LOG_TAIL_BYTES:].decode(errors="replace") if path.exists() else ""

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, kind: type[BaseException] | None, value: BaseException | None,
                 traceback: TracebackType | None) -> None:  # fmt: skip
        self.stop()

    # --- HTTP API -------------------------------------------------------------------------------------------

    def get(self, path: str, **params: str | float) -> dict[str, Any]:
        """The JSON body of GET path?params, also for 4xx/5xx answers (which carry the API's error)."""
        query = f"?{urllib.parse.urlencode(params)}" if params else ""
        try:
            with urllib.request.urlopen(f"{self.url}{path}{query}", timeout=10) as response:
                body = json.load(response)
        except urllib.error.HTTPError as exc:
            body = json.load(exc)
        assert isinstance(body, dict)
        return body

    def data(self, path: str, **params: str | float) -> Any:
        """The `data` of a successful API answer; AssertionError with the API's error otherwise."""
        body = self.get(path, **params)
        assert body.get("status") == "success", f"GET {path} {params}: {body}"
        return body["data"]

    def query(self, expr: str, at: float | None = None) -> list[dict[str, Any]]:
        """The instant vector `expr` at `at` (default: now) as [{"metric": labels, "value": [ts, "v"]}]."""
        data = self.data("/api/v1/query", query=expr, **({} if at is None else {"time": at}))
        assert data["resultType"] == "vector", data
        return list(data["result"])

    def values(self, expr: str, at: float | None = None) -> dict[frozenset[tuple[str, str]], float]:
        """The instant vector `expr` as {frozenset(labels): float value}."""
        return {frozenset(s["metric"].items()): float(s["value"][1]) for s in self.query(expr, at)}

    def alerts(self) -> list[dict[str, Any]]:
        """Pending and firing alerts: [{"labels", "annotations", "state", "activeAt", "value"}]."""
        return list(self.data("/api/v1/alerts")["alerts"])

    def active_targets(self) -> list[dict[str, Any]]:
        """The scrape targets with their health ("up", "down", "unknown") and lastError."""
        return list(self.data("/api/v1/targets", state="active")["activeTargets"])
