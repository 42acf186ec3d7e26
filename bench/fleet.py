"""Fleet: 1, 10 and 100 models in one daemon, each a COMPAS-like model (three attributes, eight groups, five
pairs, the seed's three metrics) in two windows, against the one-model daemon in the same run.

Measured per fleet size, the events spread evenly over the models (each event its own timestamp, as real traffic):

- ingest CPU per event through ``Ingest.handle_poll`` without Kafka (polls of 20,000 records over 3 partitions,
  interleaved rounds), and the events per second of the daemon's own Kafka source draining a topic of the
  embedded broker: the throughput a deployment sees, the routing target's measure;
- one evaluation (``Computer.compute``) of windows filled with 20,000 events per model, against the 15 s interval;
- the /metrics page: series, plain and gzip bytes, and the scrape p99 of 10 concurrent curl scrapers while a thread
  ingests back to back and the computation runs every 15 s (served by the daemon's HTTP worker process);
- the resident memory of a process holding the filled, computed and rendered fleet (a fresh interpreter each).
"""

from __future__ import annotations

import contextlib
import gzip
import json
import subprocess
import sys
import threading
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import orjson
from prometheus_client import CollectorRegistry

from bench.ingest import DRAIN_TIMEOUT, PARTITIONS, produce, started_heap
from bench.report import Section, fmt, median, percentile, standalone, table
from bench.scrape import Ingest, curl_load
from exporter.config import Config, parse_config
from exporter.core.fairness import PRED_NEG, PRED_POS
from exporter.daemon import Daemon
from exporter.devtools.embedded_broker import EmbeddedBroker

SIZES = (1, 10, 100)
ATTRIBUTES = {"race": ["African-American", "Caucasian", "Hispanic"], "sex": ["Male", "Female"],
              "age": ["<25", "25-45", ">45"]}  # fmt: skip
POLL = 20_000  # records per poll (the source's MAX_RECORDS), over PARTITIONS partitions
FILL_PER_MODEL = 20_000
INTERVAL_SECONDS = 15.0
TARGET_ROUTING = 0.9
TARGET_EVALUATION = 0.05
TARGET_SCRAPE_SECONDS = 1.0


def model_specs(models: int) -> list[dict[str, Any]]:
    """``models`` COMPAS-like models: race (3 groups, all pairs), sex, age (<25 vs >45)."""
    attributes = [{"name": "race", "groups": ATTRIBUTES["race"]}, {"name": "sex", "groups": ATTRIBUTES["sex"]},
                  {"name": "age", "groups": ATTRIBUTES["age"], "pairwise_comparisons": [["<25", ">45"]]}]  # fmt: skip
    return [{"model_id": model_id(i), "protected_attributes": attributes} for i in range(models)]


def config(models: int, bootstrap: str = "127.0.0.1:9", topic: str = "predictions") -> Config:
    """``models`` COMPAS-like models in one config (:func:`model_specs`)."""
    return parse_config({
        "models": model_specs(models),
        "windows": ["1h", "24h"], "evaluation_interval": f"{INTERVAL_SECONDS:g}s",
        "kafka": {"bootstrap_servers": bootstrap, "topic": topic, "assignment": "manual",
                  "group_id": f"bench-{uuid.uuid4().hex[:8]}"},
        "listen": {"address": "127.0.0.1", "port": 0},
    }, "bench-fleet")  # fmt: skip


def model_id(i: int) -> str:
    return f"model-{i:03d}"


def payloads(n: int, models: int, seed: int = 3) -> list[bytes]:
    """n events of ``models`` models, round robin, each with its own ISO timestamp within the last minute."""
    rng = np.random.default_rng(seed)
    start = time.time() - 60.0
    values = {name: rng.integers(0, len(groups), n) for name, groups in ATTRIBUTES.items()}
    out = []
    for i in range(n):
        stamp = datetime.fromtimestamp(start + 60.0 * i / n, UTC).isoformat(timespec="microseconds")
        out.append(orjson.dumps({
            "model_id": model_id(i % models), "prediction_id": f"p{i}", "timestamp": stamp.replace("+00:00", "Z"),
            "prediction": int(rng.random() < 0.3), "label": None,
            "attributes": {name: ATTRIBUTES[name][values[name][i]] for name in ATTRIBUTES}}))  # fmt: skip
    return out


class _Record:
    __slots__ = ("offset", "value")

    def __init__(self, value: bytes, offset: int) -> None:
        self.value, self.offset = value, offset


def polls(values: list[bytes]) -> list[dict[tuple[str, int], list[_Record]]]:
    """The values as the source hands them over: polls of POLL records, each split over the partitions."""
    share = POLL // PARTITIONS
    records = [_Record(v, i) for i, v in enumerate(values)]
    parts = [records[i : i + share] for i in range(0, len(records), share)]
    return [{("predictions", j): part for j, part in enumerate(parts[i : i + PARTITIONS])}
            for i in range(0, len(parts), PARTITIONS)]  # fmt: skip


def counted(daemon: Daemon) -> int:
    """Predictions counted by every model (each event counts once per attribute: read the first one's)."""
    total = 0
    for monitored in daemon.fleet.models.values():
        first = monitored.store.layout.split(monitored.store.totals_copy())["race"]
        total += int(first[:, PRED_POS].sum() + first[:, PRED_NEG].sum())
    return total


def micro(values: dict[int, list[bytes]], rounds: int) -> dict[int, float]:
    """CPU seconds per event of ``Ingest.handle_poll`` per fleet size: the median of interleaved rounds."""
    seconds: dict[int, list[float]] = {n: [] for n in values}
    prepared = {n: polls(v) for n, v in values.items()}
    for _ in range(rounds):
        for n, batches in prepared.items():
            daemon = Daemon(config(n), registry=CollectorRegistry())
            started = time.process_time()
            for batch in batches:
                daemon.ingest.handle_poll(batch)
            seconds[n].append((time.process_time() - started) / len(values[n]))
            if counted(daemon) != len(values[n]):
                raise RuntimeError(f"{n} models counted {counted(daemon)} of {len(values[n])} events")
    return {n: median(s) for n, s in seconds.items()}


def kafka_path(broker: EmbeddedBroker, topic: str, models: int, n: int) -> float:
    """Events per second of the daemon's own source (kafka-python, manual assignment) draining the topic, with the
    garbage collector as a started daemon has it (bench.ingest.started_heap). The drain is done when the offsets the
    fleet recorded with its counts reach the topic's end (its n messages from offset 0), every 20 ms: a look at the
    100 models' store totals (`counted`) took 0.6 ms of the GIL each time, the source's time; the totals are
    checked once at the end."""
    daemon = Daemon(config(models, broker.bootstrap_servers, topic), registry=CollectorRegistry())
    deadline = time.monotonic() + DRAIN_TIMEOUT
    with started_heap():
        started = time.perf_counter()
        daemon.source.start()
        try:
            while sum(daemon.fleet.offsets_copy().values()) < n:
                if time.monotonic() > deadline or not daemon.source.alive:
                    raise TimeoutError(f"{models} models counted {counted(daemon)} of {n} events")
                time.sleep(0.02)
            rate = n / (time.perf_counter() - started)
        finally:
            daemon.source.stop()
    if counted(daemon) != n:
        raise RuntimeError(f"{models} models counted {counted(daemon)} of {n} events")
    return rate


def filled(models: int) -> Daemon:
    """A daemon of ``models`` models with FILL_PER_MODEL events per model over the last day, computed once."""
    daemon = Daemon(config(models), registry=CollectorRegistry())
    rng = np.random.default_rng(5)
    now = time.time()
    for monitored in daemon.fleet.models.values():
        codes = {a.name: rng.integers(0, len(a.groups), FILL_PER_MODEL) for a in monitored.spec.attributes}
        predictions = (rng.random(FILL_PER_MODEL) < 0.3).astype(np.int64)
        labels = np.where(rng.random(FILL_PER_MODEL) < 0.3, predictions, -1)
        monitored.store.add(rng.uniform(now - 86_000, now, FILL_PER_MODEL), codes, predictions, labels, now)
    daemon.computer.compute()
    return daemon


def evaluation(models: int, reps: int) -> float:
    """Median seconds of one computation of every model."""
    daemon = filled(models)
    times = []
    for _ in range(reps):
        started = time.perf_counter()
        daemon.computer.compute()
        times.append(time.perf_counter() - started)
    return median(times)


def page_facts(models: int) -> tuple[int, int, int]:
    """Series on /metrics, and its bytes as text and gzipped."""
    page = filled(models).metrics_page().encode()
    series = sum(1 for line in page.splitlines() if line and not line.startswith(b"#"))
    return series, len(page), len(gzip.compress(page, 6))


def resident_bytes(models: int) -> int:
    """VmRSS of a fresh interpreter holding the filled, computed and rendered fleet."""
    code = (f"from bench.fleet import filled\nd = filled({models})\nd.metrics_page()\n"
            "print(next(int(l.split()[1]) * 1024 for l in open('/proc/self/status') if l.startswith('VmRSS')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         cwd=Path(__file__).resolve().parents[1])  # fmt: skip
    return int(out.stdout.strip())


def scrape_under_ingest(models: int, per_scraper: int) -> tuple[list[float], int, float, list[float]]:
    """Scrape latencies with a thread ingesting back to back and the computation every 15 s, after a first
    scrape (timed apart: it waits for the format's first rendering); errors; events/s; the first scrape."""
    daemon = filled(models)
    records = [_Record(v, i) for i, v in enumerate(payloads(50_000, models))]
    stop = threading.Event()

    def compute_every_interval() -> None:
        while not stop.wait(INTERVAL_SECONDS):
            daemon.computer.compute()

    computing = threading.Thread(target=compute_every_interval, daemon=True)
    with contextlib.ExitStack() as stack:
        daemon.serve()
        stack.callback(daemon.stop)
        computing.start()
        stack.callback(stop.set)
        with Ingest(daemon, records, None, max_seconds=600) as ingest:  # type: ignore[arg-type]
            time.sleep(1.0)
            first = curl_load(daemon.port, 1, 1, 600)  # the first scrape of a format waits for its rendering
            load = curl_load(daemon.port, 10, per_scraper, 600)
    return load.latencies, len(load.errors) + len(first.errors), ingest.rate, first.latencies


def run(quick: bool = False) -> Section:
    events = 60_000 if quick else 300_000
    section = Section("Fleet: many models in one daemon, against one model in the same run")
    values = {n: payloads(events, n) for n in SIZES}
    cpu = micro({n: v[: 60_000] for n, v in values.items()}, 3 if quick else 5)
    rates: dict[int, list[float]] = {n: [] for n in SIZES}
    with EmbeddedBroker() as broker:
        for n in SIZES:
            broker.create_topic(f"fleet-{n}", partitions=PARTITIONS)
            produce(broker.bootstrap_servers, values[n], topic=f"fleet-{n}")
        for _ in range(2 if quick else 3):
            for n in SIZES:
                rates[n].append(kafka_path(broker, f"fleet-{n}", n, events))
    rate = {n: median(r) for n, r in rates.items()}
    evaluations = {n: evaluation(n, 5 if quick else 20) for n in SIZES}
    pages = {n: page_facts(n) for n in SIZES}
    memory = {n: resident_bytes(n) for n in SIZES}
    latencies, errors, ingest_rate, first = scrape_under_ingest(SIZES[-1], 10 if quick else 30)
    rows = []
    for n in SIZES:
        series, plain, gzipped = pages[n]
        rows.append((n, fmt(cpu[n] * 1e6), fmt(cpu[SIZES[0]] / cpu[n]), f"{rate[n]:,.0f}",
                     fmt(rate[n] / rate[SIZES[0]]), fmt(evaluations[n] * 1e3),
                     f"{evaluations[n] / INTERVAL_SECONDS:.2%}", f"{series:,}", f"{plain / 1024:,.0f} KiB",
                     f"{gzipped / 1024:,.0f} KiB", f"{memory[n] / 2**20:,.0f} MiB"))  # fmt: skip
    section.add(f"{events:,} events spread evenly over the models (their share of one topic of {PARTITIONS} "
                f"partitions); windows 1h and 24h, filled with {FILL_PER_MODEL:,} events per model for the "
                "evaluation and the page. Ingest CPU: `Ingest.handle_poll` on polls of 20,000 records, no Kafka "
                "(median of interleaved rounds). Kafka: the daemon's own kafka-python source draining the topic "
                "(median of rounds, interleaved by fleet size). Memory: VmRSS of a fresh interpreter holding the "
                "filled, computed and rendered fleet.")  # fmt: skip
    section.add(table(["models", "ingest CPU (µs/event)", "vs 1 model", "Kafka path (events/s)", "vs 1 model",
                       "one evaluation (ms)", "of the 15 s interval", "series on /metrics", "page", "page, gzip",
                       "RSS"], rows))  # fmt: skip
    p99 = percentile(latencies, 99) if latencies else float("nan")
    section.add(f"Scrapes of the {SIZES[-1]}-model page while a thread ingests back to back ({ingest_rate:,.0f} "
                f"events/s) and the computation runs every 15 s: {len(latencies)} scrapes by 10 concurrent curl "
                f"clients, {errors} errors, median {fmt(median(latencies) * 1e3)} ms, p99 {fmt(p99 * 1e3)} ms. The "
                "first scrape after start, which waits for its format's first rendering, took "
                f"{fmt(first[0] * 1e3) if first else 'n/a'} ms.")
    big = SIZES[-1]
    section.target(f"routing at {big} models: Kafka-path events/s >= {TARGET_ROUTING} of one model's",
                   fmt(rate[big] / rate[SIZES[0]]), rate[big] / rate[SIZES[0]] >= TARGET_ROUTING)
    share = evaluations[big] / INTERVAL_SECONDS
    section.target(f"one evaluation of {big} models < {TARGET_EVALUATION:.0%} of the 15 s interval", f"{share:.2%}",
                   share < TARGET_EVALUATION)
    section.target(f"scrape p99 of {big} models with ingest saturated < {TARGET_SCRAPE_SECONDS:g} s",
                   f"{fmt(p99 * 1e3)} ms", errors == 0 and p99 < TARGET_SCRAPE_SECONDS)
    section.add("```json\n" + json.dumps({"cpu_us": {n: cpu[n] * 1e6 for n in SIZES}, "kafka_rates": rates},
                                         indent=None) + "\n```")  # fmt: skip
    return section


if __name__ == "__main__":
    standalone(run)
