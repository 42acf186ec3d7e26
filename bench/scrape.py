"""Scrape: /metrics latency of a big daemon under 10 concurrent scrapers while ingest runs.

A daemon with 5 attributes x 10 groups x 3 windows (5m, 1h, 24h) and all 45 pairs of every attribute, its window
filled (every comparison has enough samples, so every series is present), its HTTP server and its computation
scheduler running, and a thread feeding it through ``Daemon.handle`` (the whole ingest path without the Kafka
client): at a steady 10,000 events/s (a busy production feed), and back to back (a consumer catching up on a
backlog, the worst case for the GIL). The scrapers are ``curl --parallel`` (libcurl, C: like Prometheus, a client
whose own threads do not queue on a GIL), each request timed by curl (``time_total``), asking for the text format
with gzip as Prometheus does, on a new connection. One row repeats the saturated phase with the client used before:
Python ``http.client`` threads in one process, whose own GIL queueing shows in their timings.

The daemon is measured as it runs: ``Daemon.serve`` binds the port and starts the HTTP worker process
(exporter.serve.worker), which serves the pages the daemon publishes, so no scrape waits for the GIL ingest holds.
For comparison in the same run, the design before it: HTTP threads in the daemon's own process (one page assembled
per scrape from the live registry and the cached snapshot, 1 ms GIL slices), on the same daemon under the same
saturated ingest.

Baseline for the ratio: ``generate_latest`` of the same page (the snapshot's collector and the daemon's live
registry), one call at a time, no ingest: what a scrape costs when prometheus-client renders the page per scrape.
The ratio p99 / baseline shows what the HTTP path, gzip, concurrency and ingest cost against it (below 1: the
cached rendering wins). A scrape of a daemon with only the health metrics, under the same load, is shown too: the
floor of the HTTP path itself. (Until this change the baseline rendered the live registry only, 0.6 ms.)
"""

from __future__ import annotations

import contextlib
import gzip
import http.client
import multiprocessing
import shutil
import subprocess
import sys
import threading
import time
from concurrent.futures import ProcessPoolExecutor
from typing import Any, NamedTuple

import numpy as np
import orjson
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.exposition import choose_encoder

from bench.report import Section, fmt, median, percentile, standalone, table
from exporter.config import Config, parse_config
from exporter.daemon import Daemon
from exporter.serve.collector import SnapshotCollector
from exporter.serve.exposition import Page, Rendered, gzip_one_member
from exporter.serve.http import HttpServer, bind, make_app

N_ATTRIBUTES = 5
N_GROUPS = 10
WINDOWS = ["5m", "1h", "24h"]
SCRAPERS = 10
REQUEST_TIMEOUT = 30.0
PHASE_TIMEOUT = 300.0
INGEST_BATCH = 5_000
TARGET_P99 = 0.050
STEADY_RATE = 10_000  # a busy production feed; the daemon's ingest capacity is several times more
HEADERS = {"Accept": "text/plain;version=0.0.4", "Accept-Encoding": "gzip"}
BEFORE_SWITCH = 0.001  # the GIL slice the daemon set while its HTTP threads shared its process


class _Record(NamedTuple):
    value: bytes
    offset: int


def config() -> Config:
    return parse_config({
        "model_id": "bench",
        "protected_attributes": [{"name": f"attr_{a}", "groups": [f"g{g}" for g in range(N_GROUPS)],
                                  "pairwise_comparisons": "all"} for a in range(N_ATTRIBUTES)],
        "windows": WINDOWS,
        "bucket": "1m",
        "min_samples": 30,
        "evaluation_interval": "15s",
        "listen": {"address": "127.0.0.1", "port": 0},
    }, "bench-scrape")  # fmt: skip


def fill(daemon: Daemon, n: int, now: float, seed: int = 11) -> None:
    """n events over the last 24h, straight into the store (vectorised, no JSON)."""
    rng = np.random.default_rng(seed)
    (model,) = daemon.fleet.models.values()
    for start in range(0, n, 1_000_000):
        m = min(1_000_000, n - start)
        codes = {a.name: rng.integers(0, N_GROUPS, m) for a in model.spec.attributes}
        predictions = (rng.random(m) < 0.3).astype(np.int64)
        labels = np.where(rng.random(m) < 0.3, (rng.random(m) < 0.5).astype(np.int64), -1)
        late = model.store.add(rng.uniform(now - 86_400 + 60, now, m), codes, predictions, labels, now)
        if late:
            raise RuntimeError(f"{late} fill events fell outside the ring")


def ingest_records(n: int, now: float, seed: int = 12) -> list[_Record]:
    """Valid events in the default format for this config, timestamped now."""
    rng = np.random.default_rng(seed)
    groups = rng.integers(0, N_GROUPS, (n, N_ATTRIBUTES))
    return [_Record(orjson.dumps({
        "model_id": "bench", "prediction_id": f"p{i}", "timestamp": now, "prediction": int(i % 3 == 0),
        "label": int(i % 2) if i % 10 < 3 else None,
        "attributes": {f"attr_{a}": f"g{groups[i, a]}" for a in range(N_ATTRIBUTES)},
    }), i) for i in range(n)]  # fmt: skip


class Ingest:
    """A thread feeding the daemon through Daemon.handle: ``rate`` events/s in batches of ``batch`` events, or
    back to back when ``rate`` is None (a consumer catching up on a backlog); bounded by a deadline."""

    def __init__(self, daemon: Daemon, records: list[_Record], rate: float | None, max_seconds: float,
                 batch: int = 500) -> None:  # fmt: skip
        self.daemon = daemon
        self.batches = [records[i : i + batch] for i in range(0, len(records), batch)] if rate else [records]
        self.interval = batch / rate if rate else 0.0
        self.max_seconds = max_seconds
        self.events = 0
        self.rate = 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="bench-ingest", daemon=True)

    def _run(self) -> None:
        deadline = time.monotonic() + self.max_seconds
        due = time.monotonic()
        topic = self.daemon.config.kafka.topic
        i = 0
        while not self._stop.is_set() and time.monotonic() < deadline:
            records = self.batches[i % len(self.batches)]
            i += 1
            self.daemon.ingest.handle(topic, 0, records)
            self.events += len(records)
            if self.interval:
                due = max(due + self.interval, time.monotonic() - 1.0)  # fall behind by a second at most
                self._stop.wait(max(0.0, due - time.monotonic()))

    def __enter__(self) -> Ingest:
        self._started = time.perf_counter()
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        self._thread.join(60)
        self.rate = self.events / (time.perf_counter() - self._started)


class Load(NamedTuple):
    latencies: list[float]
    errors: list[str]
    bytes: int


def curl_load(port: int, scrapers: int, per_scraper: int, max_seconds: float) -> Load:
    """``curl --parallel``: ``scrapers`` requests in flight at any time, ``scrapers x per_scraper`` in all, each on
    a new connection and timed by curl itself."""
    headers = [arg for name, value in HEADERS.items() for arg in ("-H", f"{name}: {value}")]
    url = f"http://127.0.0.1:{port}/metrics?n=[1-{scrapers * per_scraper}]"  # curl's URL glob: one URL per request
    out = subprocess.run(["curl", "--silent", "--parallel", "--parallel-immediate", "--parallel-max", str(scrapers),
                          "--no-keepalive", "--max-time", str(REQUEST_TIMEOUT), *headers, "--output", "/dev/null",
                          "--write-out", "%{http_code} %{time_total} %{size_download}\\n", url],
                         capture_output=True, text=True, timeout=max_seconds + REQUEST_TIMEOUT)  # fmt: skip
    latencies, errors, sizes = [], [], []
    for line in out.stdout.splitlines():
        status, seconds, size = line.split()
        if status == "200":
            latencies.append(float(seconds))
            sizes.append(int(size))
        else:
            errors.append(f"HTTP {status}")
    return Load(latencies, errors, int(median(sizes)) if sizes else 0)


def scrape_load(port: int, threads: int, per_thread: int, max_seconds: float) -> Load:
    """In a child process: ``threads`` scrapers (Python threads), each ``per_thread`` GETs of /metrics back to
    back (the client of earlier runs)."""
    latencies: list[float] = []
    errors: list[str] = []
    sizes: list[int] = []
    lock = threading.Lock()
    deadline = time.monotonic() + max_seconds

    def scraper() -> None:
        for _ in range(per_thread):
            if time.monotonic() > deadline:
                return
            start = time.perf_counter()
            try:
                conn = http.client.HTTPConnection("127.0.0.1", port, timeout=REQUEST_TIMEOUT)
                conn.request("GET", "/metrics", headers=HEADERS)
                response = conn.getresponse()
                body = response.read()
                conn.close()
                status = response.status
            except OSError as exc:
                with lock:
                    errors.append(f"{type(exc).__name__}: {exc}")
                continue
            elapsed = time.perf_counter() - start
            with lock:
                if status == 200:
                    latencies.append(elapsed)
                    sizes.append(len(body))
                else:
                    errors.append(f"HTTP {status}")

    workers = [threading.Thread(target=scraper) for _ in range(threads)]
    for w in workers:
        w.start()
    for w in workers:
        w.join(max_seconds + REQUEST_TIMEOUT)
    return Load(latencies, errors, int(median(sizes)) if sizes else 0)


def page(port: int) -> bytes:
    """One plain-text page, uncompressed."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=REQUEST_TIMEOUT)
    try:
        conn.request("GET", "/metrics", headers={"Accept": HEADERS["Accept"]})
        return conn.getresponse().read()
    finally:
        conn.close()


def in_process_server(daemon: Daemon) -> HttpServer:
    """The design before the worker process: HTTP threads in the daemon's process, each scrape rendering the live
    registry and joining it to the snapshot's cached deflate stream (as CachedExposition.page did per scrape)."""
    encoder, content_type = choose_encoder(HEADERS["Accept"])
    snapshot = CollectorRegistry(auto_describe=False)
    snapshot.register(SnapshotCollector(lambda: daemon.computer.latest, "15s"))
    head = Rendered.of(encoder(snapshot))

    def page(accept_encoding: str, accept: str) -> Page:
        live = encoder(daemon.registry)
        if "gzip" in accept_encoding:
            return Page(gzip_one_member(head, live), content_type, True)
        return Page(head.text + live, content_type, False)

    app = make_app(page, daemon.config.model().model_id, daemon.healthy, daemon.ready)
    server = HttpServer(app, bind("127.0.0.1", 0))
    server.start()
    return server


def run(quick: bool = False) -> Section:
    if shutil.which("curl") is None:
        raise SystemExit("bench/scrape.py: curl times the scrapes; install it (apt-get install curl)")
    fill_events = 200_000 if quick else 2_000_000
    per_scraper = 10 if quick else 30
    section = Section("Scrape: /metrics under concurrent scrapers while ingesting")
    cfg = config()
    now = time.time()
    with contextlib.ExitStack() as stack:
        daemon = Daemon(cfg)
        health_only = Daemon(cfg)  # never computes: its /metrics has the health metrics only
        fill(daemon, fill_events, now)
        state_bytes = sum(m.store.counts.nbytes for m in daemon.fleet.models.values())
        daemon.computer.compute()
        for served in (daemon, health_only):
            served.serve()
            stack.callback(served.stop)
        before = in_process_server(daemon)
        stack.callback(before.stop)
        daemon.scheduler.start()
        stack.callback(daemon.scheduler.shutdown, wait=True)

        collector = SnapshotCollector(lambda: daemon.computer.latest, "15s")
        snapshot = CollectorRegistry(auto_describe=False)
        snapshot.register(collector)
        renders = []
        for _ in range(5 if quick else 20):  # the whole page: the snapshot's series and the live registry's
            start = time.perf_counter()
            text = generate_latest(snapshot) + generate_latest(daemon.registry)
            renders.append(time.perf_counter() - start)
        collects = []
        for _ in range(5 if quick else 20):
            start = time.perf_counter()
            list(collector.collect())
            collects.append(time.perf_counter() - start)
        gzips = []
        for _ in range(3 if quick else 10):
            start = time.perf_counter()
            gzip.compress(text)
            gzips.append(time.perf_counter() - start)
        plain = page(daemon.port)
        series = sum(1 for line in plain.splitlines() if line and not line.startswith(b"#"))
        compressed = len(gzip.compress(plain))

        results: dict[str, tuple[Load, float]] = {}
        records = ingest_records(INGEST_BATCH, time.time())
        pool = stack.enter_context(ProcessPoolExecutor(max_workers=1, mp_context=multiprocessing.get_context("spawn")))
        pool.submit(time.sleep, 0).result()  # start the child before measuring
        steady = f"steady ingest {STEADY_RATE:,} events/s"
        saturated = "saturated ingest (backlog catch-up)"
        phases = [
            (f"{SCRAPERS} concurrent scrapers, full page, {steady}", daemon.port, SCRAPERS, STEADY_RATE, curl_load),
            (f"{SCRAPERS} concurrent scrapers, full page, {saturated}", daemon.port, SCRAPERS, None, curl_load),
            (f"{SCRAPERS} concurrent scrapers, full page, {saturated}; client: Python http.client threads",
             daemon.port, SCRAPERS, None, scrape_load),
            (f"{SCRAPERS} concurrent scrapers, full page, {saturated}; before: HTTP threads in the daemon's "
             f"process, {BEFORE_SWITCH * 1e3:g} ms GIL slices", before.port, SCRAPERS, None, curl_load),
            (f"1 scraper, full page, {steady}", daemon.port, 1, STEADY_RATE, curl_load),
            (f"{SCRAPERS} concurrent scrapers, health metrics only, {steady}", health_only.port, SCRAPERS,
             STEADY_RATE, curl_load),
        ]  # fmt: skip
        shipped = sys.getswitchinterval()
        for name, port, threads, rate, client in phases:
            sys.setswitchinterval(BEFORE_SWITCH if port == before.port else shipped)
            with Ingest(daemon, records, rate, PHASE_TIMEOUT + REQUEST_TIMEOUT) as ingest:
                load = pool.submit(client, port, threads, per_scraper, PHASE_TIMEOUT).result()
            results[name] = (load, ingest.rate)
        sys.setswitchinterval(shipped)

    base = median(renders)
    rows = []
    for name, (load, rate) in results.items():
        lat = load.latencies
        rows.append((name, len(lat), len(load.errors), fmt(median(lat) * 1e3), fmt(percentile(lat, 99) * 1e3),
                     fmt(max(lat) * 1e3), f"{load.bytes / 1024:,.0f} KiB", fmt(percentile(lat, 99) / base),
                     f"{rate:,.0f}"))  # fmt: skip
    pairs = sum(len(a.pairs) for a in cfg.model().attributes)
    section.add(f"{N_ATTRIBUTES} attributes x {N_GROUPS} groups, {len(WINDOWS)} windows ({', '.join(WINDOWS)}), "
                f"{pairs} pairs, the window filled with {fill_events:,} events (window state "
                f"{state_bytes / 1e6:.1f} MB); computation every 15 s in the "
                f"background. Page: {series:,} series, {len(plain) / 1024:,.0f} KiB as text, "
                f"{compressed / 1024:,.0f} KiB gzipped. Baseline: `generate_latest` of the same page, median "
                f"{base * 1e3:.1f} ms, of which {median(collects) * 1e3:.1f} ms building the metric families "
                "(`SnapshotCollector.collect`) and the rest formatting them; gzip of the page, as prometheus-client "
                f"does for `Accept-Encoding: gzip`, takes {median(gzips) * 1e3:.1f} ms more. Each scraper makes "
                f"{per_scraper} requests back to back (curl: {SCRAPERS} requests in flight, "
                f"{SCRAPERS * per_scraper} in all). The daemon serves HTTP from a separate worker process "
                "(`python -m exporter.serve.worker`) fed with the pages every 0.5 s and after each computation; "
                "the \"before\" row serves the same daemon from HTTP threads in its own process, as it did "
                f"before, with the {BEFORE_SWITCH * 1e3:g} ms GIL slices it set then.")  # fmt: skip
    section.add(table(["scrape load", "scrapes", "errors", "median (ms)", "p99 (ms)", "max (ms)",
                       "body", "p99 / baseline", "ingest events/s meanwhile"], rows))  # fmt: skip
    for name, what in ((phases[0][0], steady), (phases[1][0], "saturated ingest")):
        load = results[name][0]
        if load.errors:
            section.add(f"{name}: {len(load.errors)} errors, first: {load.errors[0]}")
        p99 = percentile(load.latencies, 99)
        section.target(f"scrape p99 < {TARGET_P99 * 1e3:.0f} ms ({SCRAPERS} concurrent scrapers, {what})",
                       f"{p99 * 1e3:,.0f} ms", p99 < TARGET_P99 and not load.errors)  # fmt: skip
    return section


if __name__ == "__main__":
    standalone(run)
