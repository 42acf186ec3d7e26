"""Scale-out that keeps every model whole (kafka.stages: staged), against one daemon of the direct path.

Three models on one 4-partition topic keyed at random, read by three replicas (`fairness-exporter serve`
subprocesses, one of them on confluent-kafka) of one consumer group, and by one direct daemon reading every
partition. Each model is on exactly one
replica, whose series for it (window counts, values, intervals, detector statistics and alarms) equal the direct
daemon's exactly; so they do after a SIGKILL of a replica and the rebalance that follows; and delayed labels,
produced to other partitions than their predictions, all join.

Time is the events': buckets of a day, events days ahead of the wall clock (`max_future_skew: 30d`), so that the
head of every window, and with it every detector step, moves only when the test produces a *tick* (one event per
model in the next bucket). Each round's events fall in the current bucket, and the tick follows only once every
replica and the direct daemon counted them: every step then consumes the same counts on both paths.
"""

from __future__ import annotations

import contextlib
import importlib.util
import math
import signal
import subprocess
import sys
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pytest
import yaml
from broker_fixture import produce, read_partition
from daemon_fixture import Replica, scrape
from kafka import KafkaAdminClient, TopicPartition
from prometheus_fixture import wait_until
from tooling import missing

from exporter.config import parse_config
from exporter.daemon import Daemon
from exporter.devtools.embedded_broker import EmbeddedBroker, free_port, terminate
from exporter.stream.stages.records import Kind, decode

DAY = 86400.0
PARTITIONS = 4
GROUPS = {"gender": ["male", "female"], "age": ["young", "old"]}
# each model's selection rate of men and women: a gap, a smaller one, none
RATES = {"hiring": (0.6, 0.35), "credit": (0.5, 0.42), "moderation": (0.4, 0.4)}
# Tansu holds a new member's JoinGroup for about session_timeout_ms / 2: 6 s keeps a rebalance near 3 s
GROUP_CLIENT = {"kafka-python": {"reconnect_backoff_max_ms": 500, "session_timeout_ms": 6000,
                                 "heartbeat_interval_ms": 1000},
                "confluent-kafka": {"reconnect.backoff.max.ms": 500, "session.timeout.ms": 6000,
                                    "heartbeat.interval.ms": 1000}}  # fmt: skip
LIBRARIES = ("kafka-python", "confluent-kafka", "kafka-python")
"""The replicas' client libraries: one group of both, so that both adapters and producers take part."""
COUNTERS = ("fairness_predictions_total", "fairness_labelled_predictions_total")


def config(bootstrap: str, topic: str, group: str, port: int, stages: str, library: str = "kafka-python"
           ) -> dict[str, Any]:  # fmt: skip
    metrics = [{"name": name, "threshold": threshold, "max_interval_width": 1} for name, threshold in (
        ("demographic_parity_difference", 0.05), ("equalised_odds_difference", 0.05),
        ("disparate_impact_ratio", 0.8))]  # fmt: skip
    kafka = {"bootstrap_servers": bootstrap, "topic": topic, "labels_topic": f"{topic}-labels", "group_id": group,
             "stages": stages, "assignment": "subscribe" if stages == "staged" else "manual",
             "client_library": library, "client": GROUP_CLIENT[library]}  # fmt: skip
    return {"models": [{"model_id": m, "protected_attributes": [{"name": k, "groups": v} for k, v in GROUPS.items()]}
                       for m in RATES],
            "metrics": metrics, "min_samples": 5, "kafka": kafka, "windows": ["7d"], "bucket": "1d",
            "max_future_skew": "30d", "evaluation_interval": "1s", "listen": {"address": "127.0.0.1", "port": port},
            **({"checkpoint": {"interval": "1s"}} if stages == "staged" else {})}  # fmt: skip


@dataclass
class Run:
    """Three staged replicas and a direct daemon on the same topics, and what the test has produced so far."""

    bootstrap: str
    topic: str
    group: str
    replicas: list[Replica]
    direct: Daemon
    t0: float
    rng: np.random.Generator
    rounds: int = 0
    expected: dict[str, Counter[str]] = field(default_factory=lambda: {m: Counter() for m in RATES})
    """Per model: predictions and labelled predictions the test produced."""

    @property
    def alive(self) -> list[Replica]:
        return [r for r in self.replicas if r.process.poll() is None]

    def owners(self) -> dict[str, list[Replica]]:
        """Per model, the replicas that say they own it."""
        owners: dict[str, list[Replica]] = {m: [] for m in RATES}
        for replica in self.alive:
            for (name, labels), value in replica.page().items():
                if name == "fairness_exporter_model_owned" and value == 1:
                    owners[dict(labels)["model_id"]].append(replica)
        return owners

    def produce_events(self, events: list[dict[str, Any]]) -> list[int]:
        """Produce events to random partitions; the partition of each."""
        where = self.rng.integers(0, PARTITIONS, len(events)).tolist()
        produce(self.bootstrap, self.topic, [orjson.dumps(e) for e in events], partition=lambda i, _: where[i])
        return where

    def round(self) -> None:
        """Events of every model in the current bucket (a third labelled inline, a third labelled later on another
        partition of the labels topic), counted everywhere; then the tick, stepped everywhere."""
        self.rounds += 1
        bucket = self.t0 + (self.rounds - 1) * DAY
        events, later = [], []
        for model, (men, women) in RATES.items():
            for i in range(int(self.rng.integers(60, 90))):
                gender = str(self.rng.choice(GROUPS["gender"]))
                prediction = int(self.rng.random() < (men if gender == "male" else women))
                truth = prediction if self.rng.random() < 0.75 else 1 - prediction
                kind = i % 3
                events.append({"model_id": model, "prediction_id": f"{model}-{self.rounds}-{i}",
                               "timestamp": bucket + float(self.rng.uniform(60, DAY / 2)), "prediction": prediction,
                               "label": truth if kind == 0 else None,
                               "attributes": {"gender": gender, "age": str(self.rng.choice(GROUPS["age"]))}})
                self.expected[model]["predictions"] += 1
                if kind < 2:
                    self.expected[model]["labelled"] += 1
                if kind == 1:
                    later.append((len(events) - 1, truth))
        partitions = self.produce_events(events)
        labels = [orjson.dumps({"prediction_id": events[i]["prediction_id"], "label": truth}) for i, truth in later]
        away = [(partitions[i] + 1 + int(self.rng.integers(0, PARTITIONS - 1))) % PARTITIONS for i, _ in later]
        assert all(a != partitions[i] for a, (i, _) in zip(away, later, strict=True))
        produce(self.bootstrap, f"{self.topic}-labels", labels, partition=lambda i, _: away[i])
        self._wait(self.counted, f"round {self.rounds}'s events and labels counted everywhere")
        self.tick()

    def _wait(self, predicate: Callable[[], bool], what: str) -> None:
        try:
            wait_until(predicate, 90, what)
        except AssertionError as exc:
            raise AssertionError(f"{exc}; expected {self.expected}, found {self.found()}") from None

    def found(self) -> dict[str, list[tuple[int, Counter[str], float | None]]]:
        """Per model, what each page that has it counted: (port, totals, steps)."""
        pages = [(r.port, r.page()) for r in self.alive] + [(self.direct.port, scrape(self.direct.port))]
        return {m: [(port, _totals(page, m), _steps(page, m)) for port, page in pages if _steps(page, m) is not None]
                for m in RATES}

    def tick(self) -> None:
        """One event per model in the next bucket: the head moves, and every model's detectors step once."""
        self.produce_events([{"model_id": m, "prediction_id": f"tick-{m}-{self.rounds}",
                              "timestamp": self.t0 + self.rounds * DAY + 1.0, "prediction": 0, "label": None,
                              "attributes": {"gender": "male", "age": "old"}} for m in RATES])  # fmt: skip
        for model in RATES:
            self.expected[model]["predictions"] += 1
        steps = self.rounds  # a step per bucket the events left: round r's (and tick r-1's) as tick r enters the next
        self._wait(lambda: self.counted() and self.stepped(steps), f"tick {self.rounds} stepped everywhere ({steps})")

    def counted(self) -> bool:
        """Whether every model's owner and the direct daemon counted what was produced."""
        owners = self.owners()
        if any(len(o) != 1 for o in owners.values()):
            return False
        direct = scrape(self.direct.port)
        return all(_totals(page, m) == self.expected[m] for m in RATES
                   for page in (owners[m][0].page(), direct))  # fmt: skip

    def stepped(self, steps: int) -> bool:
        owners = self.owners()
        direct = scrape(self.direct.port)
        return all(_steps(page, m) == steps for m in RATES if len(owners[m]) == 1
                   for page in (owners[m][0].page(), direct)) and all(len(o) == 1 for o in owners.values())

    def differences(self) -> dict[str, list[Any]]:
        """Per model, the series where its owner's page differs from the direct daemon's (empty: none)."""
        owners, direct = self.owners(), scrape(self.direct.port)
        out = {}
        for model, found in owners.items():
            if len(found) != 1:
                out[model] = [f"{len(found)} owners"]
                continue
            ours, theirs = _model_series(found[0].page(), model), _model_series(direct, model)
            assert len(theirs) > 100, f"{model}: {len(theirs)} series"  # a comparison of (almost) nothing proves little
            out[model] = sorted((k, ours.get(k), theirs.get(k)) for k in ours.keys() | theirs.keys()
                                if ours.get(k) != theirs.get(k))  # fmt: skip
        return {m: d for m, d in out.items() if d}


def _model_series(page: dict[tuple[str, frozenset], float], model: str) -> dict[tuple[str, frozenset], float]:
    """A model's fairness series (the daemon's own, such as its ownership, excluded)."""
    return {k: v for k, v in page.items() if ("model_id", model) in k[1] and not k[0].startswith("fairness_exporter")
            and not k[0].endswith("_created")}  # fmt: skip


def _totals(page: dict[tuple[str, frozenset], float], model: str) -> Counter[str]:
    """A model's predictions and labelled predictions counted (over one attribute: each event counts once)."""
    found: Counter[str] = Counter()
    for (name, labels), value in page.items():
        d = dict(labels)
        if name in COUNTERS and d.get("model_id") == model and d.get("attribute") == "gender":
            found["predictions" if name == COUNTERS[0] else "labelled"] += int(value)
    return Counter({k: v for k, v in found.items() if v})


def _steps(page: dict[tuple[str, frozenset], float], model: str) -> float | None:
    return page.get(("fairness_detector_steps_total", frozenset({("model_id", model)})))


def _serve(config_path: Path, log: Path) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-m", "exporter.cli", "serve", "--config", str(config_path)],
                            stdout=log.open("ab"), stderr=subprocess.STDOUT)  # fmt: skip


@pytest.fixture(scope="module")
def run(kafka_broker: EmbeddedBroker, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Run]:
    if importlib.util.find_spec("confluent_kafka") is None:
        missing("confluent-kafka is not installed (pip install 'fairness-exporter[confluent]')")
    bootstrap = kafka_broker.bootstrap_servers
    topic = f"staged-{uuid.uuid4().hex[:8]}"
    for name in (topic, f"{topic}-labels"):
        kafka_broker.create_topic(name, partitions=PARTITIONS)
    group = f"g-{topic}"
    directory = tmp_path_factory.mktemp("staged")
    replicas = []
    direct = Daemon(parse_config(config(bootstrap, topic, f"direct-{topic}", 0, "direct"), "direct"))
    try:
        for i, library in enumerate(LIBRARIES):
            port = free_port()
            path = directory / f"replica-{i}.yaml"
            path.write_text(yaml.safe_dump(config(bootstrap, topic, group, port, "staged", library)))
            replicas.append(Replica(port, _serve(path, directory / f"replica-{i}.log"), directory / f"replica-{i}.log"))
        direct.start()
        today = math.floor(time.time() / DAY) * DAY
        result = Run(bootstrap, topic, group, replicas, direct, today + 2 * DAY, np.random.default_rng(23))
        # owned, and computed once (no step yet: a step is a bucket the events left, and none came)
        wait_until(lambda: all(len(o) == 1 and _steps(o[0].page(), m) == 0 for m, o in result.owners().items()), 120,
                   "every model owned by exactly one replica, and computed")  # fmt: skip
        result.tick()
        yield result
    finally:
        for replica in replicas:
            terminate(replica.process, 15)
        direct.stop()
        for replica in replicas:
            with contextlib.suppress(OSError):
                print(f"--- {replica.log.name} (tail)\n{replica.log.read_text()[-3000:]}")


def test_each_model_is_whole_on_exactly_one_replica_and_equals_the_direct_daemon(run: Run) -> None:
    for _ in range(3):
        run.round()
    _assert_whole(run)
    statistics = [v for (name, labels), v in scrape(run.direct.port).items()
                  if name == "fairness_detector_statistic" and ("model_id", "hiring") in labels]
    assert max(statistics) > 0  # the detectors read evidence: a comparison that evaluated nothing proves nothing
    # the owner's window head (what FairnessExporterModelStalled reads) is the newest bucket, the last tick's
    # (events lead the clock here), and so is the open detector step the tick entered
    for model, (owner,) in run.owners().items():
        page, of = owner.page(), frozenset({("model_id", model)})
        head = page[("fairness_exporter_model_head_timestamp_seconds", of)]
        assert head == page[("fairness_exporter_model_last_step_timestamp_seconds", of)] == run.t0 + 3 * DAY, model


def _assert_whole(run: Run, timeout: float = 10) -> None:
    """Every model is on exactly one replica, whose series of it equal the direct daemon's (after the next
    computation of each)."""
    owners = run.owners()
    assert all(len(found) == 1 for found in owners.values()), owners
    for model, (found,) in owners.items():
        others = [r for r in run.alive if r is not found]
        assert not any(_model_series(r.page(), model) for r in others), f"{model}'s series on two replicas"
    try:
        wait_until(lambda: not run.differences(), timeout, "every model's series equal to the direct daemon's")
    except AssertionError as exc:
        raise AssertionError(f"{exc}: {run.differences()}") from None


def test_every_delayed_label_produced_to_another_partition_joins_its_prediction(run: Run) -> None:
    run.round()
    owners = run.owners()
    for model, (owner,) in owners.items():
        assert _totals(owner.page(), model)["labelled"] == run.expected[model]["labelled"]
    expired = [v for r in run.alive for (name, labels), v in r.page().items()
               if name == "fairness_exporter_labels_expired_total"]
    assert sum(expired) == 0  # no label waited the horizon for a prediction it could not find


def _snapshots_cover_everything(run: Run, replica: Replica) -> bool:
    """Whether, in each counts partition the replica holds, nothing but snapshots follows the committed offset:
    its latest snapshot covers every record it counted."""
    held = [int(dict(labels)["partition"]) for (name, labels), value in replica.page().items()
            if name == "fairness_exporter_model_owned" and value == 1]
    counts_topic = f"{run.group}.counts"
    admin = KafkaAdminClient(bootstrap_servers=run.bootstrap)
    try:
        committed = admin.list_group_offsets({run.group: [TopicPartition(counts_topic, p) for p in held]})[run.group]
    finally:
        admin.close()
    for partition in held:
        start = committed.get(TopicPartition(counts_topic, partition))
        after = read_partition(run.bootstrap, counts_topic, partition, start.offset if start and start.offset >= 0
                               else 0)  # fmt: skip
        if any(decode(r.value).kind is not Kind.SNAPSHOT for r in after):
            return False
    return bool(held)


def test_after_a_sigkill_and_the_rebalance_every_model_is_whole_again_on_one_replica(run: Run) -> None:
    owners = run.owners()
    counts = Counter(found[0].port for found in owners.values())
    victim = next(r for r in run.alive if r.port == counts.most_common(1)[0][0])
    survivors = [r for r in run.alive if r is not victim]
    wait_until(lambda: _snapshots_cover_everything(run, victim), 30, "the victim's snapshots to cover its counts")
    restored_before = sum(_restored(r) for r in survivors)
    victim.process.send_signal(signal.SIGKILL)
    victim.process.wait(10)
    wait_until(lambda: all(len(o) == 1 and o[0] is not victim for o in run.owners().values()), 90,
               "every model owned by exactly one surviving replica")  # fmt: skip
    # the new owners restored the victim's models as its snapshot left them: counts and detectors exact
    assert sum(_restored(r) for r in survivors) > restored_before
    _assert_whole(run, timeout=20)
    for _ in range(2):
        run.round()
    _assert_whole(run)


def _restored(replica: Replica) -> float:
    """Counts partitions this replica began from a snapshot."""
    return replica.page().get(("fairness_exporter_state_restores_total",
                               frozenset({("stage", "counts"), ("result", "restored")})), 0.0)
