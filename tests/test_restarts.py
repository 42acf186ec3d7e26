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

import daemon_fixture
import orjson
import pytest
import yaml
from broker_fixture import produce
from daemon_config import make_config
from daemon_fixture import (FAST_RECONNECT, GROUP_CLIENT, consumed, kafka_config, payloads, probe, sample, scrape,
                            synthetic_rows, wait_for)  # fmt: skip
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
    client = {**FAST_RECONNECT[_library(library)], **({INSTANCE_KEY[library]: instance} if instance else {}),
              SESSION_KEY[library]: SESSION_SECONDS * 1000}  # the ghost's too, whatever a library's default  # fmt: skip
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
                                  str(SESSION_SECONDS * 1000), instance], stdout=subprocess.PIPE, text=True)  # fmt: skip
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
              "an immediate restart")  # fmt: skip
        assert serve.samples() == 180
    finally:
        if ghost is not None:
            terminate(ghost, 5)  # type: ignore[arg-type]
        serve.stop()
