"""Restarts and broker faults that held-out runs still broke (issue 38 items 1 to 4), on the real broker.

1. A direct daemon SIGKILLed and restarted at once, killed again while it joins and restarted again, took its own
   dead predecessor (still a member of the group until its session timed out) for a second replica and exited 2.
   Now it waits a session timeout for the partitions before refusing, and with static membership
   (``group_instance_id`` / ``group.instance.id``, as the Helm chart sets from the pod name) it takes its
   predecessor's member id and partitions at once. A live second replica is still refused.
2. After a broker came back empty, a subscribed daemon held no partition while /readyz answered 200.
3. kafka-python re-created a deleted events topic within a second (its metadata requests ignore the consumer's
   ``allow_auto_create_topics``), and librdkafka's producer creates a dead-letter topic it does not find.
4. A checkpointed offset beyond the end of the same log (a broker that lost its tail) was read again from 0: 140
   events became 240.
"""

from __future__ import annotations

import importlib.util
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml
from broker_fixture import produce
from daemon_config import make_config
from daemon_fixture import (
    FAST_RECONNECT,
    GROUP_CLIENT,
    consumed,
    kafka_config,
    payloads,
    probe,
    sample,
    scrape,
    synthetic_rows,
    wait_for,
)
from kafka import KafkaAdminClient
from tooling import missing

from exporter.daemon import Daemon
from exporter.devtools.embedded_broker import EmbeddedBroker, free_port, terminate
from exporter.stream.state import checkpoint

INSTANCE_KEY = {"kafka-python": "group_instance_id", "confluent-kafka": "group.instance.id"}
SESSION_KEY = {"kafka-python": "session_timeout_ms", "confluent-kafka": "session.timeout.ms"}
SESSION_SECONDS = 10


def overall(port: int) -> float | None:
    return sample(scrape(port), "model_subgroup_samples", model_id="m1", attribute="gender", window="1h",
                  subgroup="overall")  # fmt: skip


def topics_of(broker: EmbeddedBroker) -> set[str]:
    with KafkaAdminClient(bootstrap_servers=broker.bootstrap_servers) as admin:
        return set(admin.list_topics())


def _library(library: str) -> str:
    if library == "confluent-kafka" and importlib.util.find_spec("confluent_kafka") is None:
        missing("confluent-kafka is not installed (pip install 'fairness-exporter[confluent]')")
    return library


# --- 1. a restarted direct daemon takes its dead predecessor's place ------------------------------------------------


class Serve:
    """``fairness-exporter serve`` processes of one config (a direct daemon, subscribed, with a checkpoint)."""

    def __init__(self, directory: Path, bootstrap: str, topic: str, library: str, client: dict[str, Any]) -> None:
        self.directory = directory
        self.port = free_port()
        self.config = directory / "config.yaml"
        self.config.write_text(yaml.safe_dump({
            "model_id": "m1", "protected_attributes": [{"name": "gender", "groups": ["male", "female"]}],
            "min_samples": 5, "windows": ["1h"], "bucket": "1m", "evaluation_interval": "1s",
            "checkpoint": {"path": str(directory / "state"), "interval": "1s"},
            "kafka": {"bootstrap_servers": bootstrap, "topic": topic, "group_id": f"g-{topic}",
                      "assignment": "subscribe", "client_library": library, "client": client},
            "listen": {"address": "127.0.0.1", "port": self.port}}))  # fmt: skip
        self.processes: list[subprocess.Popen[bytes]] = []

    def start(self) -> subprocess.Popen[bytes]:
        log = self.directory / f"serve-{len(self.processes)}.log"
        process = subprocess.Popen([sys.executable, "-m", "exporter.cli", "serve", "--config", str(self.config)],
                                   stdout=subprocess.DEVNULL, stderr=log.open("wb"))  # fmt: skip
        self.processes.append(process)
        return process

    def ready(self, process: subprocess.Popen[bytes]) -> bool:
        assert process.poll() is None, f"exited {process.returncode}: {self.log(process)[-3000:]}"
        return probe(self.port, "/readyz")[0] == 200

    def log(self, process: subprocess.Popen[bytes]) -> str:
        return (self.directory / f"serve-{self.processes.index(process)}.log").read_text()

    def samples(self) -> float | None:
        return sample(scrape(self.port), "model_subgroup_samples", model_id="m1", attribute="gender",
                      window="1h", subgroup="overall")  # fmt: skip

    def stop(self) -> None:
        for process in self.processes:
            terminate(process, 15)


GHOST = """
import sys
from kafka import KafkaConsumer
bootstrap, group, topic, session, instance = sys.argv[1:]
consumer = KafkaConsumer(bootstrap_servers=bootstrap, group_id=group, client_id=f"fairness-exporter-{group}",
                         session_timeout_ms=int(session), group_instance_id=instance or None)
consumer.subscribe([topic])
while not consumer._coordinator._generation.member_id:
    consumer.poll(100)
print("joined", flush=True)
while True:
    consumer.poll(100)
"""
"""A start of the daemon that dies while it joins, as a consumer of its own settings: it is killed once its join
reached the broker (it has a member id), which the test cannot see of a daemon."""


@pytest.mark.parametrize("membership", ["dynamic", "static"])
@pytest.mark.parametrize("library", ["kafka-python", "confluent-kafka"])
def test_a_direct_daemon_killed_and_restarted_at_once_takes_its_own_place_and_counts_exactly(
    kafka_broker: EmbeddedBroker, tmp_path: Path, library: str, membership: str
) -> None:
    """SIGKILL the daemon, restart it, have that start die while it joins (after its join reached the broker),
    restart at once: the last start serves and counts every event once. Before: once the first dead member's
    session ended the new one led the group, assigned part of the partitions to the second dead one and refused,
    exit 2 "another member of consumer group ... holds 1 of the 3 partitions". Dynamic members (the default): it
    waits for the dead ones' sessions to time out and their partitions to come; static ones take their
    predecessor's member id and partitions at once. Time to ready after the last restart is printed
    (docs/faults.md)."""
    topic = f"restart-{uuid.uuid4().hex[:8]}"
    kafka_broker.create_topic(topic, partitions=3)
    instance = "fairness-exporter-0" if membership == "static" else ""
    # the session timeout is the ghost's too, whatever a library's default
    client = {**FAST_RECONNECT[_library(library)], **({INSTANCE_KEY[library]: instance} if instance else {}),
              SESSION_KEY[library]: SESSION_SECONDS * 1000}  # fmt: skip
    serve = Serve(tmp_path, kafka_broker.bootstrap_servers, topic, library, client)
    ghost: subprocess.Popen[str] | None = None
    try:
        first = serve.start()
        wait_for(lambda: serve.ready(first), 120, "the first daemon ready")
        produce(kafka_broker.bootstrap_servers, topic, payloads(synthetic_rows(120, seed=1), time.time()),
                partition=lambda i, _: i % 3)  # fmt: skip
        wait_for(lambda: serve.samples() == 120, 60, "the first 120 events counted")
        first.send_signal(signal.SIGKILL)
        first.wait()
        killed = time.monotonic()
        ghost = subprocess.Popen([sys.executable, "-c", GHOST, kafka_broker.bootstrap_servers, f"g-{topic}", topic,
                                  str(SESSION_SECONDS * 1000), instance],
                                 stdout=subprocess.PIPE, text=True)  # fmt: skip
        assert ghost.stdout is not None and ghost.stdout.readline() == "joined\n"
        last = serve.start()
        started = time.monotonic()
        wait_for(lambda: probe(serve.port, "/healthz")[0] == 200, 60, "the last start serving HTTP")
        # The first one's session runs out while the second is still a member: the group then forms around the two
        # starts, the second to die now (before, it exited 2 there).
        time.sleep(max(0.0, killed + SESSION_SECONDS + 2 - time.monotonic()))
        ghost.send_signal(signal.SIGKILL)
        ghost.wait()
        wait_for(lambda: serve.ready(last), 180, "the last start ready")
        print(f"{library}, {membership} membership: ready {time.monotonic() - started:.1f} s after its start")
        produce(kafka_broker.bootstrap_servers, topic, payloads(synthetic_rows(60, seed=2), time.time()),
                partition=lambda i, _: i % 3)  # fmt: skip
        wait_for(lambda: (serve.samples() or 0) >= 180, 60, "the 60 later events counted")
        assert serve.samples() == 180  # what was counted before the kills was restored, not read again
        last.send_signal(signal.SIGKILL)  # the plain case: killed, restarted at once
        last.wait()
        again = serve.start()
        started = time.monotonic()
        wait_for(lambda: serve.ready(again), 180, "the daemon ready after a SIGKILL and an immediate restart")
        print(f"{library}, {membership} membership: ready {time.monotonic() - started:.1f} s after a SIGKILL and "
              f"an immediate restart, {serve.samples()} events restored")  # fmt: skip
        # Ready means reading, not caught up: a checkpoint (every 1 s) written before the last events were counted
        # restores fewer, and their offsets, so those are read again after ready (seen in CI: 120 at ready).
        wait_for(lambda: (serve.samples() or 0) >= 180, 60, "every event counted after the restart")
        time.sleep(3)  # three more computations: nothing counted twice
        assert serve.samples() == 180
    finally:
        if ghost is not None:
            terminate(ghost, 5)  # type: ignore[arg-type]
        serve.stop()


# --- 2. ready means reading -------------------------------------------------------------------------------------


# confluent-kafka: a subscribed consumer of a topic that does not exist gets consume() results with a TypeError left
# set inside confluent-kafka 2.16.1 (SystemError at the next call) and, rebuilt, was not assigned the topic once it
# was created again (seen on the code before this change as well): not fixed here (docs/faults.md).
@pytest.mark.parametrize("client_library", ["kafka-python"])
def test_a_subscribed_daemon_is_not_ready_while_a_broker_back_empty_gives_it_nothing_to_read(
    fresh_broker: EmbeddedBroker, running: Callable[..., Daemon], client_library: str
) -> None:
    """After a broker restart with an empty log the topic is gone until its owner creates it again, and then the
    group assigns it: before, /readyz answered 200 "serving computed metrics" throughout (24 s holding no
    partition). Now it names what it waits for, and serves again once it reads: every event counted."""
    fresh_broker.create_topic("events", partitions=3)
    produce(fresh_broker.bootstrap_servers, "events", payloads(synthetic_rows(200, seed=7), time.time()))
    group = {**kafka_config(fresh_broker.bootstrap_servers, "events", client_library)["kafka"],
             "assignment": "subscribe", "client": GROUP_CLIENT[client_library]}  # fmt: skip
    daemon = running(fresh_broker.bootstrap_servers, "events", kafka=group)
    wait_for(lambda: consumed(daemon.port) == 200 and daemon.ready()[0], 120, "200 events and ready")
    fresh_broker.restart()
    wait_for(lambda: daemon.ready() == (False, "topic events does not exist: nothing is read until it is created "
                                                "(the daemon never creates a topic it reads)"), 60,
             "not ready, naming the missing topic")  # fmt: skip
    assert "events" not in topics_of(fresh_broker)
    fresh_broker.create_topic("events", partitions=3)
    produce(fresh_broker.bootstrap_servers, "events", payloads(synthetic_rows(1000, seed=8), time.time()))
    wait_for(lambda: consumed(daemon.port) >= 1200 and daemon.ready()[0], 300, "the 1000 events and ready again")
    daemon.computer.compute()
    assert overall(daemon.port) == 1200


# --- 3. the daemon never creates a topic ----------------------------------------------------------------------------


def test_no_topic_the_daemon_reads_or_dead_letters_to_is_created_by_it(
    kafka_broker: EmbeddedBroker, running: Callable[..., Daemon], client_library: str
) -> None:
    """Events, labels and dead-letter topics that do not exist stay so: /readyz names the topics read; a dead letter
    fails (counted), its topic not created. Before: kafka-python's consumer created the events and labels topics
    with the broker's default partition count (its metadata requests ignore allow_auto_create_topics), and
    librdkafka's producer the dead-letter topic. Once the owner creates them, every event is counted."""
    topic = f"absent-{uuid.uuid4().hex[:8]}"
    labels, dead = f"{topic}-labels", f"{topic}-dlq"
    # Manual assignment (subscribed: the broker-back-empty test above): a subscribed confluent-kafka consumer of a
    # topic not found meets the SystemError of docs/faults.md. No consumer-only keys: the dead-letter producer is
    # given kafka.client too (issue 38 item 5).
    kafka = {**kafka_config(kafka_broker.bootstrap_servers, topic, client_library)["kafka"], "labels_topic": labels,
             "dead_letter_topic": dead}  # fmt: skip
    daemon = running(kafka_broker.bootstrap_servers, topic, kafka=kafka)
    wait_for(lambda: daemon.ready() == (False, f"topic {topic} does not exist: nothing is read until it is created "
                                               "(the daemon never creates a topic it reads)"), 90,
             "not ready, naming the topic")  # fmt: skip
    assert not {topic, labels} & topics_of(kafka_broker)
    kafka_broker.create_topic(topic, partitions=2)
    kafka_broker.create_topic(labels, partitions=1)
    produce(kafka_broker.bootstrap_servers, topic, [*payloads(synthetic_rows(50, seed=9), time.time()), b"{bad"])
    wait_for(lambda: sample(scrape(daemon.port), "fairness_exporter_dead_letters_failed_total",
                            reason="send_failed") == 1, 90, "the dead letter failed")  # fmt: skip
    assert dead not in topics_of(kafka_broker)
    wait_for(lambda: daemon.ready()[0], 60, "ready once the topics exist")
    daemon.computer.compute()
    assert overall(daemon.port) == 50


@pytest.mark.parametrize("client_library", ["kafka-python"])  # librdkafka 2.16 dies on a deletion (docs/faults.md)
def test_a_topic_deleted_under_the_daemon_is_not_created_again_by_it(
    kafka_broker: EmbeddedBroker, topic: str, running: Callable[..., Daemon], client_library: str
) -> None:
    """Deleted while the daemon runs (manual assignment here; subscribed above), the topic stays deleted and /readyz
    names it; re-created by its owner with another partition count, every partition is read from its start. Before:
    it existed again within a second, with the broker's default partition count."""
    produce(kafka_broker.bootstrap_servers, topic, payloads(synthetic_rows(90, seed=10), time.time()))
    daemon = running(kafka_broker.bootstrap_servers, topic)
    wait_for(lambda: consumed(daemon.port) == 90 and daemon.ready()[0], 60, "90 events and ready")
    kafka_broker.delete_topic(topic)
    wait_for(lambda: daemon.ready() == (False, f"topic {topic} does not exist: nothing is read until it is created "
                                               "(the daemon never creates a topic it reads)"), 60,
             "not ready, naming the topic")  # fmt: skip
    assert topic not in topics_of(kafka_broker)
    kafka_broker.create_topic(topic, partitions=2)
    produce(kafka_broker.bootstrap_servers, topic, payloads(synthetic_rows(40, seed=11), time.time()),
            partition=lambda i, _: i % 2)  # fmt: skip
    wait_for(lambda: consumed(daemon.port) >= 130 and daemon.ready()[0], 90, "the 40 new events and ready")
    daemon.computer.compute()
    assert overall(daemon.port) == 130


# --- 4. an offset beyond the end of the same log ------------------------------------------------------------------


def test_a_checkpointed_offset_beyond_the_end_of_the_same_log_reads_on_from_the_end(
    kafka_broker: EmbeddedBroker, topic: str, tmp_path: Path, client_library: str
) -> None:
    """The checkpoint says 100 records more than the log holds, in the same log (a broker that lost its tail):
    before, the partition was read again from 0 and 140 events became 280. Now it reads on from the end: the 140
    stay 140, the events written after are counted, and the reset is counted under ``beyond_end``."""
    config = {**kafka_config(kafka_broker.bootstrap_servers, topic, client_library),
              "checkpoint": {"path": str(tmp_path), "interval": "1s"}}  # fmt: skip
    produce(kafka_broker.bootstrap_servers, topic, payloads(synthetic_rows(140, seed=12), time.time()), partition=0)
    daemon = Daemon(make_config(**config))
    daemon.start()
    try:
        wait_for(lambda: consumed(daemon.port) == 140, 60, "140 events")
    finally:
        daemon.stop()
    path = tmp_path / checkpoint.FLEET_FILE
    loaded = checkpoint.read(path)
    assert loaded is not None
    meta, arrays = loaded
    assert [topic, 0, 140] in meta["offsets"] and meta["topic_ids"].get(topic)
    meta["offsets"] = [[t, p, o + 100 if p == 0 else o] for t, p, o in meta["offsets"]]
    checkpoint.write(path, meta, arrays)

    daemon = Daemon(make_config(**config))
    daemon.start()
    try:
        resets = lambda: sample(scrape(daemon.port), "fairness_exporter_partition_resets_total",  # noqa: E731
                                reason="beyond_end")  # fmt: skip
        wait_for(lambda: resets() == 1, 60, "the reset counted")
        produce(kafka_broker.bootstrap_servers, topic, payloads(synthetic_rows(50, seed=13), time.time()),
                partition=0)  # fmt: skip
        wait_for(lambda: consumed(daemon.port) >= 50, 60, "the 50 later events")
        daemon.computer.compute()
        assert overall(daemon.port) == 190
        assert resets() == 1
        assert sample(scrape(daemon.port), "fairness_exporter_partition_resets_total", reason="new_log") == 0
    finally:
        daemon.stop()
