"""Two replicas of the direct path (``kafka.stages: direct``, ``assignment: subscribe``) in one consumer group, on
the real broker (issue 30 item 3): never a split window or a partial count, or a clear refusal.

Three models on a 4-partition topic keyed at random, with and without a labels topic keyed at random too. Before,
the second replica took half the partitions: every model's window was split over both, and half the delayed
labels never met their prediction, silently. Now a replica whose first assignment lacks partitions refuses before
it counts anything (exit 2, one line naming the group and ``kafka.stages: staged``), and one that loses partitions
later counts nothing until it holds them all again, then resumes each where *it* stopped: its window is the whole
traffic, whatever the other member counted meanwhile.

The replicas are ``fairness-exporter serve`` processes, one on each client library.
"""

from __future__ import annotations

import importlib.util
import os
import signal
import subprocess
import sys
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import daemon_fixture
import numpy as np
import orjson
import pytest
import yaml
from broker_fixture import produce
from daemon_fixture import GROUP_CLIENT
from prometheus_fixture import wait_until
from tooling import missing

from exporter.devtools.embedded_broker import EmbeddedBroker, free_port, terminate

PARTITIONS = 4
GROUPS = {"gender": ["male", "female"], "age": ["young", "old"]}
RATES = {"hiring": (0.6, 0.35), "credit": (0.5, 0.42), "moderation": (0.4, 0.4)}
COUNTERS = ("fairness_predictions_total", "fairness_labelled_predictions_total")
SHARED = "fairness_exporter_partitions_shared"


class Replica(daemon_fixture.Replica):
    """A direct replica, with its readiness and per-model totals."""

    def readyz(self) -> tuple[int, str]:
        return daemon_fixture.probe(self.port, "/readyz")

    def totals(self) -> dict[str, Counter[str]]:
        """Per model: predictions and labelled predictions counted (over one attribute: each event counts once)."""
        found: dict[str, Counter[str]] = {m: Counter() for m in RATES}
        for (name, labels), value in self.page().items():
            d = dict(labels)
            if name in COUNTERS and d.get("attribute") == "gender":
                found[d["model_id"]]["predictions" if name == COUNTERS[0] else "labelled"] += int(value)
        return {m: Counter({k: v for k, v in c.items() if v}) for m, c in found.items()}


@dataclass
class Group:
    """A topic (and maybe a labels topic), its consumer group, the replicas started, what was produced."""

    bootstrap: str
    topic: str
    labels: bool
    directory: Path
    rng: np.random.Generator = field(default_factory=lambda: np.random.default_rng(30))
    replicas: list[Replica] = field(default_factory=list)
    expected: dict[str, Counter[str]] = field(default_factory=lambda: {m: Counter() for m in RATES})
    rounds: int = 0

    def start(self, library: str) -> Replica:
        """A ``serve`` process of the direct path in the group."""
        if library == "confluent-kafka" and importlib.util.find_spec("confluent_kafka") is None:
            missing("confluent-kafka is not installed (pip install 'fairness-exporter[confluent]')")
        port, i = free_port(), len(self.replicas)
        kafka = {"bootstrap_servers": self.bootstrap, "topic": self.topic, "group_id": f"g-{self.topic}",
                 "assignment": "subscribe", "client_library": library, "client": GROUP_CLIENT[library],
                 **({"labels_topic": f"{self.topic}-labels"} if self.labels else {})}  # fmt: skip
        config = {"models": [{"model_id": m, "protected_attributes": [{"name": k, "groups": v}
                                                                        for k, v in GROUPS.items()]} for m in RATES],
                  "min_samples": 5, "kafka": kafka, "windows": ["1h"], "bucket": "1m", "evaluation_interval": "1s",
                  "listen": {"address": "127.0.0.1", "port": port}}  # fmt: skip
        path = self.directory / f"replica-{i}.yaml"
        path.write_text(yaml.safe_dump(config))
        log = self.directory / f"replica-{i}.log"
        process = subprocess.Popen([sys.executable, "-m", "exporter.cli", "serve", "--config", str(path)],
                                   stdout=subprocess.DEVNULL, stderr=log.open("wb"))  # fmt: skip
        replica = Replica(port, process, log)
        self.replicas.append(replica)
        return replica

    def round(self) -> int:
        """Events of every model at random partitions, now; with a labels topic, half of them labelled later on a
        random partition of it (a third of the rest inline). How many events."""
        self.rounds += 1
        events, later = [], []
        for model, (men, women) in RATES.items():
            for i in range(int(self.rng.integers(60, 90))):
                gender = str(self.rng.choice(GROUPS["gender"]))
                prediction = int(self.rng.random() < (men if gender == "male" else women))
                truth = prediction if self.rng.random() < 0.75 else 1 - prediction
                delayed = self.labels and i % 2 == 0
                inline = not delayed and i % 3 == 0
                events.append({"model_id": model, "prediction_id": f"{model}-{self.rounds}-{i}",
                               "timestamp": time.time(), "prediction": prediction,
                               "label": truth if inline else None,
                               "attributes": {"gender": gender, "age": str(self.rng.choice(GROUPS["age"]))}})
                self.expected[model]["predictions"] += 1
                self.expected[model]["labelled"] += delayed or inline
                if delayed:
                    later.append((events[-1]["prediction_id"], truth))
        where = self.rng.integers(0, PARTITIONS, len(events)).tolist()
        produce(self.bootstrap, self.topic, [orjson.dumps(e) for e in events], partition=lambda i, _: where[i])
        if later:
            labels = [orjson.dumps({"prediction_id": p, "label": truth}) for p, truth in later]
            away = self.rng.integers(0, PARTITIONS, len(labels)).tolist()
            produce(self.bootstrap, f"{self.topic}-labels", labels, partition=lambda i, _: away[i])
        return len(events)

    def wait_counted(self, replica: Replica, what: str) -> None:
        """Until the replica counted exactly what was produced, every model whole (more would fail at once)."""
        def whole() -> bool:
            found = replica.totals()
            assert all(found[m]["predictions"] <= self.expected[m]["predictions"] for m in RATES), found
            return found == self.expected

        try:
            wait_until(whole, 120, what)
        except AssertionError as exc:
            raise AssertionError(f"{exc}: expected {self.expected}, counted {replica.totals()}") from None


@pytest.fixture
def group(kafka_broker: EmbeddedBroker, tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Group]:
    topic = f"direct-{uuid.uuid4().hex[:8]}"
    labels = bool(getattr(request, "param", True))
    for name in (topic, f"{topic}-labels") if labels else (topic,):
        kafka_broker.create_topic(name, partitions=PARTITIONS)
    found = Group(kafka_broker.bootstrap_servers, topic, labels, tmp_path)
    try:
        yield found
    finally:
        for replica in found.replicas:
            if replica.process.poll() is None:
                os.kill(replica.process.pid, signal.SIGCONT)
            terminate(replica.process, 15)
            print(f"--- {replica.log.name} (tail)\n{replica.log.read_text()[-3000:]}")


def _ready(replica: Replica) -> bool:
    return replica.readyz()[0] == 200


def _shared(replica: Replica) -> bool:
    return replica.page().get((SHARED, frozenset())) == 1


@pytest.mark.parametrize("group", [False, True], ids=["no-labels-topic", "labels-topic"], indirect=True)
def test_a_second_direct_replica_refuses_in_one_line_and_the_first_counts_every_event(group: Group) -> None:
    first = group.start("kafka-python")
    wait_until(lambda: _ready(first), 90, "the first replica ready")
    group.round()
    group.wait_counted(first, "the first round counted")

    second = group.start("confluent-kafka")
    assert second.process.wait(120) == 2
    stderr = second.log.read_text()
    assert "Traceback" not in stderr, stderr
    line = stderr.strip().splitlines()[-1]
    assert line.startswith(f"fairness-exporter serve: {group.directory / 'replica-1.yaml'}: kafka.group_id: "
                           f"another member of consumer group 'g-{group.topic}' holds "), line
    assert line.endswith("use kafka.stages: staged to run several"), line

    group.round()
    group.wait_counted(first, "both rounds counted, every model whole on the first replica, every label joined")
    wait_until(lambda: _ready(first), 60, "the first replica ready again")
    assert first.page()[(SHARED, frozenset())] == 0
    expired = sum(v for (name, _), v in first.page().items() if name == "fairness_exporter_labels_expired_total")
    assert expired == 0


@pytest.mark.parametrize("group", [True], ids=["labels-topic"], indirect=True)
def test_a_direct_replica_that_loses_partitions_later_counts_nothing_split_then_every_event(group: Group) -> None:
    """The other member arrives long after start: the first is stopped (SIGSTOP) past its session timeout, so the
    second gets every partition and counts; woken up, the first rejoins and both hold part. Both then count
    nothing and say why (/readyz, ``fairness_exporter_partitions_shared``); once the second stops, the first holds
    everything again and resumes each partition where it stopped, not where the second did: every event counted,
    every label joined."""
    first = group.start("confluent-kafka")
    wait_until(lambda: _ready(first), 90, "the first replica ready")
    group.round()
    group.wait_counted(first, "the first round counted")

    os.kill(first.process.pid, signal.SIGSTOP)
    second = group.start("kafka-python")
    wait_until(lambda: _ready(second), 120, "the second replica ready once the first left the group")
    produced = group.round()
    wait_until(lambda: sum(c["predictions"] for c in second.totals().values()) >= produced, 90,
               "the second round counted by the second replica (from where the first committed)")

    os.kill(first.process.pid, signal.SIGCONT)
    for replica in (first, second):
        wait_until(lambda: _shared(replica), 90, "both replicas sharing")  # noqa: B023 (waited for at once)
        status, why = replica.readyz()
        assert status == 503 and f"another member of consumer group 'g-{group.topic}' holds" in why, why
    group.round()  # read by nobody while the group is split

    terminate(second.process, 15)
    group.wait_counted(first, "all three rounds counted by the first replica, every model whole")
    wait_until(lambda: _ready(first), 60, "the first replica ready again")
    assert first.page()[(SHARED, frozenset())] == 0
