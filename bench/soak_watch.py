"""The soak's moving parts besides the traffic: the S3 store behind the broker, the daemon as a subprocess (killed
and started again), a scraper every second, a slow scraper, and the /proc sampler of the daemon and its HTTP worker.
Each watcher runs on its own thread and keeps what it saw, with ``time.monotonic()`` stamps, for the report."""

from __future__ import annotations

import itertools
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Collection
from dataclasses import dataclass, field
from pathlib import Path

import boto3  # type: ignore[import-untyped]

from exporter.devtools.embedded_broker import free_port, terminate

BUCKET = "tansu-soak"
WATCHED = ("fairness_exporter_events_consumed_total", "fairness_exporter_consumer_errors_total",
           "fairness_exporter_kafka_connected", "fairness_exporter_partition_resets_total",
           "fairness_exporter_checkpoint_failures_total", "fairness_exporter_labels_joined_total",
           "fairness_exporter_last_computation_timestamp_seconds", "fairness_exporter_pending_predictions",
           "fairness_exporter_http_worker_restarts_total", "fairness_exporter_events_rejected_total",
           "fairness_exporter_events_ignored_total", "fairness_exporter_events_late_total",
           "fairness_exporter_labels_dropped_total", "fairness_exporter_labels_expired_total",
           "fairness_exporter_state_restores_total")  # fmt: skip


class S3Store:
    """moto's S3 server in a process of its own, with one bucket: the broker's storage, kept across its restarts."""

    def __init__(self, log: Path) -> None:
        self.port = free_port()
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self.proc = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(self.port)],
                                     stdout=log.open("wb"), stderr=subprocess.STDOUT)  # fmt: skip
        client = boto3.client("s3", endpoint_url=self.endpoint, aws_access_key_id="soak", aws_secret_access_key="soak",
                              region_name="us-east-1")  # fmt: skip
        deadline = time.monotonic() + 30
        while True:
            try:
                client.create_bucket(Bucket=BUCKET)
                break
            except Exception:
                if time.monotonic() > deadline or self.proc.poll() is not None:
                    raise
                time.sleep(0.2)

    @property
    def env(self) -> dict[str, str]:
        """What Tansu's S3 client (the object_store crate) reads."""
        return {"AWS_ENDPOINT": self.endpoint, "AWS_ALLOW_HTTP": "true", "AWS_ACCESS_KEY_ID": "soak",
                "AWS_SECRET_ACCESS_KEY": "soak", "AWS_DEFAULT_REGION": "us-east-1"}  # fmt: skip

    def stop(self) -> None:
        terminate(self.proc, 10)


def children(pid: int) -> list[int]:
    """The processes whose parent is ``pid``."""
    out = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    if int(f.read().rsplit(")", 1)[1].split()[1]) == pid:
                        out.append(int(entry))
            except (OSError, IndexError, ValueError):
                continue
    return out


def cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class DaemonProcess:
    """``python -m exporter.cli serve --config CONFIG``, started again after each SIGKILL; ``name``: which replica."""

    def __init__(self, config: Path, log: Path, name: str = "daemon") -> None:
        self.config, self.log, self.name = config, log, name
        self.proc: subprocess.Popen[bytes] | None = None
        self.started: list[float] = []
        self.exit_codes: list[int] = []
        self.cpu = 0.0  # CPU seconds of the daemons (and their HTTP workers) that ended

    def start(self) -> None:
        self.proc = subprocess.Popen([sys.executable, "-m", "exporter.cli", "serve", "--config", str(self.config)],
                                     stdout=self.log.open("ab"), stderr=subprocess.STDOUT)  # fmt: skip
        self.started.append(time.monotonic())

    def worker(self) -> int | None:
        """The pid of the daemon's HTTP worker process, if it runs."""
        return next(iter(children(self.proc.pid)), None) if self.proc is not None else None

    def end(self, sig: signal.Signals, timeout: float = 30) -> int:
        """Send ``sig``, wait for the daemon and its worker to be gone; the daemon's exit code."""
        assert self.proc is not None
        worker = self.worker()
        self.cpu += self._cpu(worker)
        self.proc.send_signal(sig)
        code = self.proc.wait(timeout)
        deadline = time.monotonic() + timeout
        while worker is not None and os.path.exists(f"/proc/{worker}") and time.monotonic() < deadline:
            time.sleep(0.05)  # the worker exits when its connection to the daemon ends
        self.exit_codes.append(code)
        self.proc = None
        return code

    def _cpu(self, worker: int | None) -> float:
        assert self.proc is not None
        try:
            return cpu_seconds(self.proc.pid) + (cpu_seconds(worker) if worker else 0.0)
        except OSError:
            return 0.0


@dataclass
class Scrape:
    at: float
    replica: str
    pid: int | None
    seconds: float | None  # None: the scrape failed (the daemon down, or its port not bound yet)
    values: dict[str, float] = field(default_factory=dict)
    error: str = ""


class Scraper(threading.Thread):
    """GET /metrics every ``every`` seconds; keeps its latency, the daemon's own counters, its lag (over every
    partition it holds) and how many partitions of ``topics`` it holds (the staged path's internal partitions carry
    a lag series only once they held a record)."""

    def __init__(self, port: int, daemon_process: DaemonProcess, topics: Collection[str], every: float = 1.0) -> None:
        super().__init__(name="soak-scraper", daemon=True)
        self.url, self.owner, self.every = f"http://127.0.0.1:{port}/metrics", daemon_process, every
        self.topics = tuple(f'topic="{topic}"' for topic in topics)
        self.scrapes: list[Scrape] = []
        self.done = threading.Event()

    def run(self) -> None:
        while not self.done.wait(self.every):
            self.scrapes.append(self.scrape())

    def scrape(self) -> Scrape:
        pid = self.owner.proc.pid if self.owner.proc is not None else None
        started = time.monotonic()
        try:
            with urllib.request.urlopen(self.url, timeout=30) as response:
                text = response.read().decode()
        except OSError as exc:
            return Scrape(started, self.owner.name, pid, None, error=f"{type(exc).__name__}: {exc}"[:120])
        seconds = time.monotonic() - started
        values: dict[str, float] = {"lag": 0.0, "lag_partitions": 0.0}  # of ``topics`` (the input and labels)
        for line in text.splitlines():
            if not line.startswith("fairness_exporter_"):
                continue
            name, _, value = line.rpartition(" ")
            if name.startswith("fairness_exporter_consumer_lag_messages{"):  # summed over the partitions held
                values["lag"] += float(value)
                values["lag_partitions"] += any(topic in name for topic in self.topics)
            elif name.split("{", 1)[0] in WATCHED:
                values[name] = float(value)
        return Scrape(started, self.owner.name, pid, seconds, values)


@dataclass
class SlowRead:
    mode: str  # "slow reader" or "slow request"
    started: float
    seconds: float
    received: int
    ended: str


REQUEST = b"GET /metrics HTTP/1.1\r\nHost: soak\r\nConnection: close\r\n\r\n"


class SlowScraper(threading.Thread):
    """A slow client, again and again until stopped, each attempt for at most ``longest`` seconds (so that each
    talks to the daemon's current HTTP worker): by turns a *slow reader*, which sends its request and reads the
    answer one byte per ``pause`` seconds through a 1 KiB receive buffer, and a *slow request*, which sends its
    request one byte per ``pause`` seconds and then reads the answer at once."""

    def __init__(self, port: int, pause: float = 0.1, longest: float = 30.0) -> None:
        super().__init__(name="soak-slow-scraper", daemon=True)
        self.port, self.pause, self.longest = port, pause, longest
        self.reads: list[SlowRead] = []
        self.done = threading.Event()

    def run(self) -> None:
        for attempt in itertools.count():
            if self.done.is_set():
                return
            mode = ("slow reader", "slow request")[attempt % 2]
            started, received, ended = time.monotonic(), 0, "answered and closed by the server"
            deadline = started + self.longest
            try:
                with socket.socket() as sock:
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1024)
                    sock.settimeout(60)
                    sock.connect(("127.0.0.1", self.port))
                    if mode == "slow request":
                        for byte in REQUEST:
                            if self.done.is_set() or time.monotonic() > deadline:
                                break
                            sock.sendall(bytes([byte]))
                            time.sleep(self.pause)
                        else:
                            while chunk := sock.recv(65536):
                                received += len(chunk)
                    else:
                        sock.sendall(REQUEST)
                        while sock.recv(1):
                            received += 1
                            if self.done.is_set() or time.monotonic() > deadline:
                                break
                            time.sleep(self.pause)
                    if self.done.is_set() or time.monotonic() > deadline:
                        ended = f"given up by the client after {self.longest:g} s"
            except OSError as exc:
                ended = type(exc).__name__
                if received == 0 and time.monotonic() - started < 1:
                    self.done.wait(1.0)  # the daemon is down: try again in a second
                    continue
            self.reads.append(SlowRead(mode, started, time.monotonic() - started, received, ended))


@dataclass
class Sample:
    at: float
    age: float  # seconds since this daemon process started
    process: str  # the replica's name ("daemon" with one), and "... http worker" for its worker
    rss_mb: float
    open_files: int
    threads: int


class Sampler(threading.Thread):
    """Reads VmRSS and Threads (/proc/PID/status) and the open file descriptors (/proc/PID/fd) of each daemon and
    its HTTP worker every ``every`` seconds."""

    def __init__(self, daemons: list[DaemonProcess], every: float = 2.0) -> None:
        super().__init__(name="soak-sampler", daemon=True)
        self.owners, self.every = daemons, every
        self.samples: list[Sample] = []
        self.load: list[float] = []
        self.done = threading.Event()

    def run(self) -> None:
        while not self.done.wait(self.every):
            self.load.append(os.getloadavg()[0])
            for owner in self.owners:
                self._sample(owner)

    def _sample(self, owner: DaemonProcess) -> None:
        proc = owner.proc
        if proc is None or not owner.started:
            return
        age = time.monotonic() - owner.started[-1]
        for name, pid in ((owner.name, proc.pid), (f"{owner.name} http worker", owner.worker())):
            if pid is None:
                continue
            try:
                with open(f"/proc/{pid}/status") as f:
                    status = dict(line.split(":", 1) for line in f if ":" in line)
                fds = len(os.listdir(f"/proc/{pid}/fd"))
                rss, threads = int(status["VmRSS"].split()[0]), int(status["Threads"])
            except (OSError, KeyError, ValueError):
                continue
            self.samples.append(Sample(time.monotonic(), age, name, rss / 1024, fds, threads))
