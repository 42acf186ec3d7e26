"""Soak: the daemon under steady traffic and repeated faults for N minutes, then an exact account.

``python -m bench --only soak --minutes N`` (``--quick``: 3 minutes; default 30). Not part of a plain
``python -m bench`` (which stays short) unless ``--minutes`` is given, and never run by CI.

- Traffic (bench/soak_traffic.py): 2,000 events/s of two models (one with an intersection) and of a model the
  daemon does not monitor, with invalid events (a prediction of 2, no timestamp, a label "yes"), attribute values
  outside the groups or missing, inline labels, and delayed labels on ``kafka.labels_topic`` 1 to 20 s later
  (duplicates, labels of no prediction, invalid label events among them); a burst of malformed events now and then.
- The broker: Tansu on an S3 bucket (moto's server on loopback), restarted with its data every few minutes: the
  memory storage the tests use loses everything on a restart, and Tansu 0.6.0 as shipped has no file storage.
- The daemon: ``python -m exporter.cli serve`` with checkpoints every 10 s, SIGKILLed every few minutes and
  started again at once (``assignment: manual``, as the README advises for one replica: a consumer group would
  wait for the killed member's session to expire at every restart).
- Watchers (bench/soak_watch.py): a scrape every second, a slow scraper (one byte per 100 ms through a 1 KiB
  receive buffer), and the RSS and open files of the daemon and its HTTP worker every 2 s.

At the end (producing stopped, the daemon caught up and computed once more) the 24h window's counts per subgroup
(samples, labelled, positive predictions, each attribute's unknown category) must equal what the logs hold, read
back and counted by the rules the events were made with; bench/soak_report.py compares and writes the section.
"""

from __future__ import annotations

import logging
import random
import signal
import tempfile
import time
import urllib.request
import uuid
from collections.abc import Callable
from pathlib import Path

import yaml
from prometheus_client.parser import text_string_to_metric_families

from bench.report import Section, standalone
from bench.soak_report import Fault, Run, report
from bench.soak_traffic import INTERSECTIONS, MODELS, Traffic, expected
from bench.soak_watch import BUCKET, DaemonProcess, S3Store, Sampler, Scraper, SlowScraper
from exporter.devtools.embedded_broker import EmbeddedBroker, free_port

log = logging.getLogger("bench.soak")
RATE = 2000.0
QUICK_MINUTES, MINUTES = 3.0, 30.0
PARTITIONS = {"soak-predictions": 3, "soak-labels": 1}
OUTAGE_SECONDS = 10.0
"""How long the broker stays down: past the daemon's 5 s check of the broker, so /readyz and
fairness_exporter_kafka_connected must show it."""
BURST = 500
CATCH_UP_SECONDS = 900.0
LABEL_HORIZON = "2m"
"""Labels come at most 21 s after their prediction; a short horizon lets the label join's memory reach its steady
size early in the run, so that a drift of the RSS means something."""


def schedule(minutes: float, seed: int = 24) -> list[tuple[float, str]]:
    """(seconds from the start, fault) for the run, none in its last 30 s: SIGKILL every ~4 min (~50 s in a short
    run), a broker restart every ~9 min (~100 s), a malformed burst every ~3 min (~40 s); each period jittered."""
    rng = random.Random(seed)
    short = minutes <= 5
    every = {"kill": 50.0 if short else 240.0, "broker": 100.0 if short else 540.0, "burst": 40.0 if short else 180.0}
    events = []
    for kind, period in every.items():
        at = period * rng.uniform(0.6, 1.0)
        while at < minutes * 60 - 30:
            events.append((at, kind))
            at += period * rng.uniform(0.8, 1.2)
    return sorted(events)


def daemon_config(bootstrap: str, port: int, state: Path) -> dict:
    return {
        "kafka": {"bootstrap_servers": bootstrap, "topic": "soak-predictions", "labels_topic": "soak-labels",
                  "group_id": f"soak-{uuid.uuid4().hex[:8]}", "assignment": "manual",
                  "client": {"reconnect_backoff_max_ms": 1000}},
        "windows": ["1h", "24h"], "evaluation_interval": "5s", "label_horizon": LABEL_HORIZON,
        "listen": {"address": "127.0.0.1", "port": port},
        "checkpoint": {"path": str(state), "interval": "10s"},
        "models": [{"model_id": model_id, "intersections": INTERSECTIONS.get(model_id, []),
                    "protected_attributes": [{"name": n, "groups": g} for n, g in groups.items()]}
                   for model_id, groups in MODELS.items()],
    }  # fmt: skip


def wait(predicate: Callable[[], bool], timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(1.0)
    return False


def run(quick: bool, minutes: float | None = None) -> Section:
    minutes = minutes or (QUICK_MINUTES if quick else MINUTES)
    with tempfile.TemporaryDirectory(prefix="soak-") as tmp:
        return _soak(minutes, Path(tmp))


def _soak(minutes: float, tmp: Path) -> Section:
    store = S3Store(tmp / "moto.log")
    broker = EmbeddedBroker(storage=f"s3://{BUCKET}/", env=store.env)
    daemon: DaemonProcess | None = None
    watchers: list[Scraper | SlowScraper | Sampler] = []
    try:
        broker.start()
        for topic, partitions in PARTITIONS.items():
            broker.create_topic(topic, partitions)
        port = free_port()
        config = tmp / "soak.yaml"
        config.write_text(yaml.safe_dump(daemon_config(broker.bootstrap_servers, port, tmp / "state")))
        daemon = DaemonProcess(config, tmp / "daemon.log")
        traffic = Traffic(broker.bootstrap_servers, "soak-predictions", "soak-labels", RATE)
        scraper, slow, sampler = Scraper(port, daemon), SlowScraper(port), Sampler(daemon)
        watchers = [scraper, slow, sampler]
        daemon.start()
        for watcher in watchers:
            watcher.start()
        traffic.start()
        started = time.monotonic()
        faults: list[Fault] = []
        for at, kind in schedule(minutes):
            time.sleep(max(0.0, started + at - time.monotonic()))
            faults.append(_fault(kind, daemon, broker, traffic))
            log.warning("soak %.0fs: %s", time.monotonic() - started, kind)
        time.sleep(max(0.0, started + minutes * 60 - time.monotonic()))
        traffic.stop()
        produced = time.monotonic()
        caught_up = wait(lambda: _caught_up(scraper), CATCH_UP_SECONDS)
        at_catch_up = time.time()
        computed = caught_up and wait(lambda: _last(scraper, "fairness_exporter_last_computation_timestamp_seconds")
                                      > at_catch_up, 60)  # fmt: skip
        final = _families(port)
        for watcher in watchers:
            watcher.done.set()
        clean_exit = daemon.end(signal.SIGTERM)
        want = expected(traffic, broker.bootstrap_servers)
        daemon_log = (tmp / "daemon.log").read_text(errors="replace")
        run_ = Run(minutes=minutes, rate=RATE, started=started, produced=produced, caught_up=caught_up and computed,
                   catch_up_seconds=time.monotonic() - produced, faults=faults, traffic=traffic, expected=want,
                   final=final, scrapes=scraper.scrapes, slow=slow.reads, samples=sampler.samples, load=sampler.load,
                   daemon=daemon, sigterm_exit=clean_exit, partitions=PARTITIONS,
                   log_tail=daemon_log[-3000:], restored=daemon_log.count("restored checkpoint"))  # fmt: skip
        return report(run_)
    finally:
        for watcher in watchers:
            watcher.done.set()
        if daemon is not None and daemon.proc is not None:
            daemon.end(signal.SIGKILL)
        broker.stop()
        store.stop()


def _fault(kind: str, daemon: DaemonProcess, broker: EmbeddedBroker, traffic: Traffic) -> Fault:
    at = time.monotonic()
    if kind == "kill":
        daemon.end(signal.SIGKILL)
        daemon.start()
        return Fault("daemon SIGKILL", at, time.monotonic())
    if kind == "broker":
        broker.stop()
        time.sleep(OUTAGE_SECONDS)
        broker.start()
        return Fault("broker restart", at, time.monotonic())
    traffic.burst(BURST)
    return Fault("malformed burst", at, at)


def _last(scraper: Scraper, name: str) -> float:
    fresh = [s for s in scraper.scrapes[-3:] if s.seconds is not None]
    return fresh[-1].values.get(name, 0.0) if fresh else 0.0


def _caught_up(scraper: Scraper) -> bool:
    """Three scrapes in a row with every partition held and none behind."""
    recent = scraper.scrapes[-3:]
    return len(recent) == 3 and all(s.seconds is not None and s.values["lag"] == 0
                                    and s.values["lag_partitions"] == sum(PARTITIONS.values()) for s in recent)


def _families(port: int) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=30) as response:
        text = response.read().decode()
    return {(s.name, frozenset(s.labels.items())): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}  # fmt: skip


if __name__ == "__main__":
    standalone(run)
