"""A local monitoring stack for the demo and the end-to-end tests: Prometheus, Alertmanager and a webhook sink.

    with PrometheusServer(tmp, ["127.0.0.1:9108"], rules=rule_file(for_durations="5s"),
                          alertmanager=am.address) as p:
        p.query('up{job="fairness-exporter"}')  # [{"metric": {...}, "value": [ts, "1"]}]

Prometheus scrapes its targets and evaluates its rules every second (job `fairness-exporter`, as in the chart).
Alertmanager runs deploy/alertmanager/alertmanager.yml with its receivers pointed at a WebhookSink and its timers
scaled down. Each server stores into its directory, listens on a free loopback port, is stopped with SIGTERM
(SIGKILL after a timeout), and is killed by the kernel if the thread that started it dies first: nothing is left
running.
"""

from __future__ import annotations

import copy
import ctypes
import json
import shutil
import signal
import subprocess
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import TracebackType
from typing import IO, Any, Self

import yaml

from exporter.devtools.embedded_broker import free_port, terminate

JOB = "fairness-exporter"
ALERTMANAGER_CONFIG = Path(__file__).resolve().parents[2] / "deploy" / "alertmanager" / "alertmanager.yml"
_PR_SET_PDEATHSIG = 1
_LOG_TAIL_BYTES = 4000

try:  # resolved here, not in the forked child, where loading a library could deadlock
    _prctl: Callable[..., int] | None = ctypes.CDLL(None, use_errno=True).prctl
except (OSError, AttributeError):  # not Linux
    _prctl = None


class MissingTool(Exception):
    """An executable the stack needs is not installed; the message says which and how to get it."""


def _die_with_parent() -> None:
    """In the child before exec: have the kernel SIGKILL it when the thread that started it exits."""
    if _prctl is not None:
        _prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


class _Server:
    """One server binary on a free loopback port, ready once GET /-/ready answers 200."""

    name = ""
    package = ""

    def __init__(self, directory: Path, startup_timeout: float = 30.0, stop_timeout: float = 10.0) -> None:
        self.directory = directory
        self.startup_timeout = startup_timeout
        self.stop_timeout = stop_timeout
        self.port = 0
        self._proc: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def url(self) -> str:
        return f"http://{self.address}"

    @property
    def pid(self) -> int | None:
        return None if self._proc is None else self._proc.pid

    def find_binary(self) -> str:
        """The server's executable; MissingTool when it is not on PATH (tests override this to skip or fail)."""
        found = shutil.which(self.name)
        if found is None:
            raise MissingTool(f"`{self.name}` is not installed: apt-get install {self.package}")
        return found

    def write_config(self) -> Path:
        raise NotImplementedError

    def arguments(self, config: Path) -> list[str]:
        raise NotImplementedError

    def start(self) -> Self:
        """Start the server and wait for /-/ready; retry on another port if the free port was taken meanwhile."""
        binary = self.find_binary()
        self.directory.mkdir(parents=True, exist_ok=True)
        config = self.write_config()
        for _attempt in range(3):
            self.port = free_port()
            self._log = (self.directory / f"{self.name}.log").open("ab")
            self._proc = subprocess.Popen(
                [binary, *self.arguments(config)], stdin=subprocess.DEVNULL, stdout=self._log, stderr=self._log,
                preexec_fn=_die_with_parent,
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
        raise AssertionError(f"{self.name} exited during startup:\n{self.log_tail()}")

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
                raise AssertionError(f"{self.name} not ready after {self.startup_timeout:g}s:\n{self.log_tail()}")
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
        path = self.directory / f"{self.name}.log"
        return path.read_bytes()[-_LOG_TAIL_BYTES:].decode(errors="replace") if path.exists() else ""

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, kind: type[BaseException] | None, value: BaseException | None,
                 traceback: TracebackType | None) -> None:  # fmt: skip
        self.stop()

    def get(self, path: str, **params: str | float) -> Any:
        """The JSON body of GET path?params, also for 4xx/5xx answers (which carry the API's error)."""
        query = f"?{urllib.parse.urlencode(params)}" if params else ""
        try:
            with urllib.request.urlopen(f"{self.url}{path}{query}", timeout=10) as response:
                return json.load(response)
        except urllib.error.HTTPError as exc:
            return json.load(exc)


class PrometheusServer(_Server):
    """/usr/bin/prometheus scraping `targets` every `interval`, evaluating `rules` (a rule file dict) as often and
    sending its alerts to the Alertmanager at `alertmanager` (host:port), if given. `jobs`: by job name, the
    settings (scheme, basic_auth, tls_config, ...) of the job scraping `targets`; default one plain job."""

    name = "prometheus"
    package = "prometheus"

    def __init__(self, directory: Path, targets: Sequence[str], rules: Mapping[str, Any] | None = None,
                 interval: str = "1s", alertmanager: str | None = None, startup_timeout: float = 30.0,
                 stop_timeout: float = 10.0, jobs: Mapping[str, Mapping[str, Any]] | None = None) -> None:  # fmt: skip
        super().__init__(directory, startup_timeout, stop_timeout)
        self.targets = list(targets)
        self.jobs = {JOB: {}} if jobs is None else dict(jobs)
        self.rules = rules
        self.interval = interval
        self.alertmanager = alertmanager

    def write_config(self) -> Path:
        config: dict[str, Any] = {
            "global": {"scrape_interval": self.interval, "scrape_timeout": self.interval,
                       "evaluation_interval": self.interval},
            "scrape_configs": [{"job_name": name, **settings, "static_configs": [{"targets": self.targets}]}
                               for name, settings in self.jobs.items()],
        }  # fmt: skip
        if self.rules is not None:
            (self.directory / "rules.yaml").write_text(yaml.safe_dump(dict(self.rules), sort_keys=False))
            config["rule_files"] = ["rules.yaml"]
        if self.alertmanager is not None:
            config["alerting"] = {"alertmanagers": [{"static_configs": [{"targets": [self.alertmanager]}]}]}
        path = self.directory / "prometheus.yml"
        path.write_text(yaml.safe_dump(config, sort_keys=False))
        return path

    def arguments(self, config: Path) -> list[str]:
        return [f"--config.file={config}", f"--storage.tsdb.path={self.directory / 'data'}",
                f"--web.listen-address={self.address}", "--log.level=warn"]  # fmt: skip

    def page(self, name: str) -> str:
        """The URL of the web UI's page `name` ("alerts", "graph"): Debian's build serves only the classic UI,
        under /classic/."""
        for candidate in (f"{self.url}/{name}", f"{self.url}/classic/{name}"):
            try:
                with urllib.request.urlopen(candidate, timeout=5) as response:
                    if response.status == 200:
                        return candidate
            except OSError:
                continue
        raise AssertionError(f"{self.name} at {self.url} serves no {name} page")

    def data(self, path: str, **params: str | float) -> Any:
        """The `data` of a successful API answer; AssertionError with the API's error otherwise."""
        body = self.get(path, **params)
        assert isinstance(body, dict) and body.get("status") == "success", f"GET {path} {params}: {body}"
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


def routing_config(webhook_url: str, timers: Mapping[str, str] | None = None,
                   source: Path = ALERTMANAGER_CONFIG) -> dict[str, Any]:  # fmt: skip
    """The shipped Alertmanager config with every receiver sending to `webhook_url`/<receiver name> and the
    route timers in `timers` (e.g. {"group_wait": "1s"}) replaced wherever a route sets them (and on the root).
    Routes, matchers, grouping and inhibitions stay exactly as shipped."""
    config = copy.deepcopy(yaml.safe_load(source.read_text()))
    for receiver in config["receivers"]:
        receiver.pop("webhook_configs", None)
        receiver["webhook_configs"] = [{"url": f"{webhook_url}/{receiver['name']}", "send_resolved": True}]

    def scale(route: dict[str, Any]) -> None:
        for key, value in (timers or {}).items():
            if key in route or route is config["route"]:
                route[key] = value
        for child in route.get("routes", []):
            scale(child)

    scale(config["route"])
    return dict(config)


class AlertmanagerServer(_Server):
    """/usr/bin/prometheus-alertmanager (Debian's name; `alertmanager` elsewhere) running `config` (a dict)."""

    name = "alertmanager"
    package = "prometheus-alertmanager"

    def __init__(self, directory: Path, config: Mapping[str, Any], startup_timeout: float = 30.0,
                 stop_timeout: float = 10.0) -> None:  # fmt: skip
        super().__init__(directory, startup_timeout, stop_timeout)
        self.config = config

    def find_binary(self) -> str:
        found = shutil.which("prometheus-alertmanager")
        return found if found is not None else super().find_binary()

    def write_config(self) -> Path:
        path = self.directory / "alertmanager.yml"
        path.write_text(yaml.safe_dump(dict(self.config), sort_keys=False))
        return path

    def arguments(self, config: Path) -> list[str]:
        # no cluster peers: a lone instance would otherwise wait for gossip to settle before it sends anything
        return [f"--config.file={config}", f"--storage.path={self.directory / 'data'}",
                f"--web.listen-address={self.address}", "--cluster.listen-address=", "--log.level=warn"]  # fmt: skip

    def alerts(self) -> list[dict[str, Any]]:
        """The alerts Alertmanager holds (v2 API), with their `status.inhibitedBy` and `receivers`."""
        return list(self.get("/api/v2/alerts"))


class WebhookSink:
    """An HTTP server recording Alertmanager webhook notifications: (receiver, payload) in order of arrival.

    The receiver is the last part of the URL path (routing_config sends receiver R to <url>/R). `on_page` is
    called with each one as it arrives (the demo prints it)."""

    def __init__(self, on_page: Callable[[str, dict[str, Any]], None] | None = None) -> None:
        self.pages: list[tuple[str, dict[str, Any]]] = []
        self.lock = threading.Lock()
        self.on_page = on_page
        sink = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))))
                receiver = self.path.rstrip("/").rsplit("/", 1)[-1]
                with sink.lock:
                    sink.pages.append((receiver, body))
                if sink.on_page is not None:
                    sink.on_page(receiver, body)
                self.send_response(200)
                self.end_headers()

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._thread = threading.Thread(target=self._server.serve_forever, name="webhook-sink", daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def start(self) -> Self:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def received(self) -> list[tuple[str, dict[str, Any]]]:
        with self.lock:
            return list(self.pages)

    def alerts(self, receiver: str | None = None) -> list[dict[str, Any]]:
        """Every alert of every notification (to `receiver`, if given), in order of arrival."""
        return [alert for name, body in self.received() if receiver in (None, name) for alert in body["alerts"]]
