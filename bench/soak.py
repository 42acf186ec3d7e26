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
  wait for the killed member's session to expire at every restart). With ``--stages staged --replicas N``: N
  replicas of one consumer group on the staged path (their state in the internal topics), one of them SIGKILLed
  at a time, by turns; each model's counts are read from the replica that owns it.
- Watchers (bench/soak_watch.py): a scrape of each replica every second, slow clients (a slow reader through a
  1 KiB receive buffer and a slow request, one byte per 100 ms, 30 s each), and the RSS, open files and threads of
  each daemon and its HTTP worker every 2 s.

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
INTERNAL_PARTITIONS = 4
"""Staged: the join and counts topics' partitions (each a log Tansu lists on S3 at every fetch: fewer than the
default 12 keep the broker's work near the direct path's)."""
GROUP_CLIENT = {"reconnect_backoff_max_ms": 1000, "session_timeout_ms": 10000, "heartbeat_interval_ms": 2000}
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


def daemon_config(bootstrap: str, port: int, state: Path, group: str, stages: str) -> dict:
    staged = stages == "staged"
    internal = {"partitions": INTERNAL_PARTITIONS}
    return {
        "kafka": {"bootstrap_servers": bootstrap, "topic": "soak-predictions", "labels_topic": "soak-labels",
                  "group_id": group, "stages": stages, "assignment": "subscribe" if staged else "manual",
                  "client": GROUP_CLIENT if staged else {"reconnect_backoff_max_ms": 1000},
                  **({"internal_topics": {"join": internal, "counts": internal}} if staged else {})},
        "windows": ["1h", "24h"], "evaluation_interval": "5s", "label_horizon": LABEL_HORIZON,
        "listen": {"address": "127.0.0.1", "port": port},
        "checkpoint": {"interval": "10s"} if staged else {"path": str(state), "interval": "10s"},
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


def run(quick: bool, minutes: float | None = None, stages: str = "direct", replicas: int = 1) -> Section:
    minutes = minutes or (QUICK_MINUTES if quick else MINUTES)
    with tempfile.TemporaryDirectory(prefix="soak-") as tmp:
        return _soak(minutes, Path(tmp), stages, replicas)


def _soak(minutes: float, tmp: Path, stages: str, replicas: int) -> Section:
    if stages == "direct" and replicas != 1:
        raise ValueError("the soak runs one replica on the direct path (its window is the whole of the traffic)")
    store = S3Store(tmp / "moto.log")
    broker = EmbeddedBroker(storage=f"s3://{BUCKET}/", env=store.env)
    daemons: list[DaemonProcess] = []
    watchers: list[Scraper | SlowScraper | Sampler] = []
    try:
        broker.start()
        for topic, partitions in PARTITIONS.items():
            broker.create_topic(topic, partitions)
        group = f"soak-{uuid.uuid4().hex[:8]}"
        ports = [free_port() for _ in range(replicas)]
        for i, port in enumerate(ports):
            name = "daemon" if replicas == 1 else f"replica {i + 1}"
            config = tmp / f"soak-{i}.yaml"
            config.write_text(yaml.safe_dump(daemon_config(broker.bootstrap_servers, port, tmp / "state", group,
                                                           stages)))  # fmt: skip
            daemons.append(DaemonProcess(config, tmp / f"daemon-{i}.log", name))
        traffic = Traffic(broker.bootstrap_servers, "soak-predictions", "soak-labels", RATE)
        scrapers = [Scraper(port, daemon, PARTITIONS) for port, daemon in zip(ports, daemons, strict=True)]
        slow, sampler = SlowScraper(ports[0]), Sampler(daemons)
        watchers = [*scrapers, slow, sampler]
        for daemon in daemons:
            daemon.start()
        for watcher in watchers:
            watcher.start()
        traffic.start()
        started = time.monotonic()
        faults: list[Fault] = []
        for at, kind in schedule(minutes):
            time.sleep(max(0.0, started + at - time.monotonic()))
            kills = sum(1 for f in faults if f.kind == "daemon SIGKILL")
            faults.append(_fault(kind, daemons[kills % replicas], broker, traffic))
            log.warning("soak %.0fs: %s", time.monotonic() - started, kind)
        time.sleep(max(0.0, started + minutes * 60 - time.monotonic()))
        traffic.stop()
        produced = time.monotonic()
        caught_up = wait(lambda: _caught_up(scrapers, sum(PARTITIONS.values())), CATCH_UP_SECONDS)
        caught_at = time.monotonic()
        at_catch_up = time.time()
        computed = caught_up and wait(lambda: all(
            _last(s, "fairness_exporter_last_computation_timestamp_seconds") > at_catch_up for s in scrapers), 60)
        finals, settled = _settled(ports)
        for watcher in watchers:
            watcher.done.set()
        clean_exits = [daemon.end(signal.SIGTERM) for daemon in daemons]
        want = expected(traffic, broker.bootstrap_servers)
        logs = [daemon.log.read_text(errors="replace") for daemon in daemons]
        run_ = Run(minutes=minutes, rate=RATE, started=started, produced=produced, caught_up=caught_up and computed,
                   catch_up_seconds=caught_at - produced,
                   settle_seconds=settled, faults=faults, traffic=traffic, expected=want,
                   final=_owned(finals), owners=_owners(finals, daemons),
                   scrapes=sorted((s for scraper in scrapers for s in scraper.scrapes), key=lambda s: s.at),
                   slow=slow.reads, samples=sampler.samples, load=sampler.load, daemons=daemons, stages=stages,
                   sigterm_exits=clean_exits, partitions=PARTITIONS, log_tail="\n".join(x[-3000:] for x in logs),
                   restored=sum(x.count("restored checkpoint") for x in logs))  # fmt: skip
        return report(run_)
    finally:
        for watcher in watchers:
            watcher.done.set()
        for daemon in daemons:
            if daemon.proc is not None:
                daemon.end(signal.SIGKILL)
        broker.stop()
        store.stop()


Families = dict[tuple[str, frozenset[tuple[str, str]]], float]


def _settled(ports: list[int], every: float = 10.0, timeout: float = 300.0) -> tuple[list[Families], float]:
    """Every replica's series once the models' series stopped changing between two scrapes ``every`` seconds apart
    (two evaluations): on the staged path rows can still be on their way between stages when every lag is 0 (a
    join's output not yet sent); and how long that took."""
    started = time.monotonic()
    finals = [_families(port) for port in ports]
    while time.monotonic() - started < timeout:
        time.sleep(every)
        again = [_families(port) for port in ports]
        if all(_models(a) == _models(b) for a, b in zip(finals, again, strict=True)):
            break
        finals = again
    return finals, time.monotonic() - started


def _models(final: Families) -> Families:
    return {k: v for k, v in final.items() if _model_of(k) is not None and "timestamp" not in k[0]}


def _model_of(key: tuple[str, frozenset[tuple[str, str]]]) -> str | None:
    return dict(key[1]).get("model_id")


def _owned(finals: list[Families]) -> Families:
    """The model series of every replica (each model is on the one replica that owns it), and the first replica's
    own health series."""
    merged = dict(finals[0])
    for final in finals[1:]:
        merged.update({key: v for key, v in final.items() if _model_of(key) is not None})
    return merged


def _owners(finals: list[Families], daemons: list[DaemonProcess]) -> dict[str, list[str]]:
    """Which replicas export each model at the end: one each, or the counts would be read from two."""
    owners: dict[str, list[str]] = {}
    for final, daemon in zip(finals, daemons, strict=True):
        for model in sorted({m for key in final if key[0] == "model_subgroup_samples" and (m := _model_of(key))}):
            owners.setdefault(model, []).append(daemon.name)
    return owners


def _fault(kind: str, daemon: DaemonProcess, broker: EmbeddedBroker, traffic: Traffic) -> Fault:
    at = time.monotonic()
    if kind == "kill":
        daemon.end(signal.SIGKILL)
        daemon.start()
        return Fault("daemon SIGKILL", at, time.monotonic(), daemon.name)
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


def _caught_up(scrapers: list[Scraper], partitions: int) -> bool:
    """Three scrapes in a row of each replica with none behind, and every input and labels partition held by one of
    them."""
    recent = [scraper.scrapes[-3:] for scraper in scrapers]
    return all(len(r) == 3 and all(s.seconds is not None and s.values["lag"] == 0 for s in r) for r in recent) \
        and sum(r[-1].values["lag_partitions"] for r in recent) == partitions


def _families(port: int) -> Families:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=30) as response:
        text = response.read().decode()
    return {(s.name, frozenset(s.labels.items())): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}  # fmt: skip


if __name__ == "__main__":
    standalone(run)
