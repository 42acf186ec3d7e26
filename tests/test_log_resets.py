"""A partition's log that begins again is read from its start exactly once, whatever the layout (issue 24 item 1).

A log begins again when a broker comes back without its data or a topic is deleted and re-created; its records
then reuse the old offsets. The source asks the cluster for the topic's id after every fetch, so records of a new
log are never counted at the old log's positions. The layouts differ in what gave the old rule away: manual and
subscribed assignment, one partition and several, a partition count that changes, a new log shorter or longer
than the old position (tests/test_stream_faults.py has three partitions, each new log longer, on a broker back
empty, manual and subscribed).

Not here, for the test broker's sake (docs/faults.md): deleting a topic under a confluent-kafka consumer crashes
librdkafka 2.16 on Tansu (SIGSEGV in ``rd_kafka_metadata_cache_find``, the library alone), so the deletion layouts
run on kafka-python. A member of a consumer group whose topic gains partitions keeps its first assignment on
Tansu 0.6 (its SyncGroup answers every rejoin of generation 0 with the assignment it already holds): a subscribed
source rejoins as a new member when it sees a topic re-created, and a new member is assigned every partition.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest
from broker_fixture import produce
from daemon_fixture import GROUP_CLIENT, consumed, kafka_config, payloads, sample, scrape, synthetic_rows, wait_for
from kafka import KafkaAdminClient

from exporter.daemon import Daemon
from exporter.devtools.embedded_broker import EmbeddedBroker

# The client reconnects 3 s after the broker went away: the new log is filled by then.
SLOW_RECONNECT = {"kafka-python": {"reconnect_backoff_ms": 3000, "reconnect_backoff_max_ms": 3000},
                  "confluent-kafka": {"reconnect.backoff.ms": 3000, "reconnect.backoff.max.ms": 3000}}  # fmt: skip


def fill(broker: EmbeddedBroker, topic: str, n: int, partitions: int, seed: int) -> None:
    """n events spread evenly over the partitions."""
    produce(broker.bootstrap_servers, topic, payloads(synthetic_rows(n, seed=seed), time.time()),
            partition=lambda i, _: i % partitions)  # fmt: skip


def recreate(broker: EmbeddedBroker, topic: str, partitions: int) -> None:
    """Delete the topic and create it again with this many partitions (checked: creating a topic that still
    exists is silently no creation)."""
    broker.delete_topic(topic)
    with KafkaAdminClient(bootstrap_servers=broker.bootstrap_servers) as admin:
        wait_for(lambda: topic not in admin.list_topics(), timeout=10, what=f"{topic} to be deleted")
        broker.create_topic(topic, partitions)
        assert len(admin.describe_topics([topic])[0]["partitions"]) == partitions


def settled(daemon: Daemon, topic: str, partitions: int, events: int) -> float | None:
    """Once every partition is read to its end: the events in the window (a double count would show here)."""
    def caught_up() -> bool:
        lags = [sample(scrape(daemon.port), "fairness_exporter_consumer_lag_messages", topic=topic,
                       partition=str(p)) for p in range(partitions)]  # fmt: skip
        return consumed(daemon.port) >= events and lags == [0] * partitions

    wait_for(caught_up, timeout=120, what=f"{events} events read and no lag on {partitions} partitions")
    daemon.computer.compute()
    return sample(scrape(daemon.port), "model_subgroup_samples", model_id="m1", attribute="gender", window="1h",
                  subgroup="overall")  # fmt: skip


def resets(daemon: Daemon) -> float | None:
    return sample(scrape(daemon.port), "fairness_exporter_partition_resets_total", reason="new_log")


def test_manual_one_partition_broker_back_empty_with_a_longer_log(
    fresh_broker: EmbeddedBroker, running: Callable[..., Daemon], client_library: str
) -> None:
    """The issue's layout: 200 counted, the broker back empty, 1,000 produced at once. Before: the window ended at
    1,000 (the new log's first 200 skipped) and no reset was counted, whenever the fetch at offset 200 reached the
    new log before the client's metadata did: here always, as the client reconnects after the 1,000 are in."""
    fresh_broker.create_topic("events", partitions=1)
    fill(fresh_broker, "events", 200, 1, seed=1)
    slow = {**kafka_config(fresh_broker.bootstrap_servers, "events", client_library)["kafka"],
            "client": SLOW_RECONNECT[client_library]}  # fmt: skip
    daemon = running(fresh_broker.bootstrap_servers, "events", kafka=slow)
    wait_for(lambda: consumed(daemon.port) == 200, what="200 events before the restart")
    fresh_broker.restart()
    fresh_broker.create_topic("events", partitions=1)
    fill(fresh_broker, "events", 1000, 1, seed=2)
    assert settled(daemon, "events", 1, 1200) == 1200
    assert resets(daemon) == 1


@pytest.mark.parametrize("client_library", ["kafka-python"])
def test_manual_topic_recreated_with_more_partitions_read_from_their_start_even_with_latest(
    kafka_broker: EmbeddedBroker, topic: str, running: Callable[..., Daemon]
) -> None:
    """A topic of one partition (100 events) deleted and re-created with three, 30 events each, while the daemon
    runs with ``auto_offset_reset: latest``. Before: 220 (partition 0 read twice, by two resets); and the new
    partitions started at their end, as ``latest`` says for a partition nothing is known of, though all of them
    appeared after the daemon started."""
    daemon = one_partition_then_three(kafka_broker, topic, running, {
        **kafka_config(kafka_broker.bootstrap_servers, topic, "kafka-python")["kafka"], "auto_offset_reset": "latest"})
    assert settled(daemon, topic, 3, 190) == 190
    assert resets(daemon) == 1


def one_partition_then_three(kafka_broker: EmbeddedBroker, topic: str, running: Callable[..., Daemon],
                             kafka: dict) -> Daemon:  # fmt: skip
    """The topic with one partition and 100 events counted, then deleted and re-created with three, 30 events each."""
    recreate(kafka_broker, topic, 1)
    daemon = running(kafka_broker.bootstrap_servers, topic, kafka=kafka)
    wait_for(lambda: daemon.ready()[0], what="assigned")
    fill(kafka_broker, topic, 100, 1, seed=5)
    wait_for(lambda: consumed(daemon.port) == 100, what="100 events before the topic is re-created")
    recreate(kafka_broker, topic, 3)
    fill(kafka_broker, topic, 90, 3, seed=6)
    return daemon


@pytest.mark.parametrize("client_library", ["kafka-python"])
def test_subscribed_topic_recreated_with_logs_shorter_and_longer(
    kafka_broker: EmbeddedBroker, topic: str, running: Callable[..., Daemon]
) -> None:
    """Deleted and re-created with its three partitions, 100 events each before, then 30, 300 and 150: one new log
    shorter than the old position, two longer. Before: the two longer logs' first 100 events were skipped (and no
    reset counted for them): no error told the consumer, and the new logs' records came at the old positions."""
    fill(kafka_broker, topic, 300, 3, seed=7)
    group = {**kafka_config(kafka_broker.bootstrap_servers, topic, "kafka-python")["kafka"],
             "assignment": "subscribe", "client": GROUP_CLIENT["kafka-python"]}  # fmt: skip
    daemon = running(kafka_broker.bootstrap_servers, topic, kafka=group)
    wait_for(lambda: consumed(daemon.port) == 300, what="300 events before the topic is re-created")
    recreate(kafka_broker, topic, 3)
    for partition, n in enumerate((30, 300, 150)):
        produce(kafka_broker.bootstrap_servers, topic, payloads(synthetic_rows(n, seed=8 + partition), time.time()),
                partition=partition)  # fmt: skip
    assert settled(daemon, topic, 3, 780) == 780
    assert resets(daemon) == 3


@pytest.mark.parametrize("client_library", ["kafka-python"])
def test_subscribed_topic_recreated_with_more_partitions_reads_every_new_partition_from_its_start(
    kafka_broker: EmbeddedBroker, topic: str, running: Callable[..., Daemon]
) -> None:
    """Issue 31 item 3: a topic of one partition (100 events) deleted and re-created with three, 30 events each,
    under ``assignment: subscribe`` and ``auto_offset_reset: latest``. Before: 100 of 190 counted after minutes,
    nothing logged but kafka-python's warning: Tansu hands a rejoining member its old assignment, partition 0 alone.
    Now the source rejoins as a new member once it sees the topic's new id, and starts the partitions nobody counted
    at 0, as under manual assignment: 190."""
    group = {**kafka_config(kafka_broker.bootstrap_servers, topic, "kafka-python")["kafka"],
             "assignment": "subscribe", "client": GROUP_CLIENT["kafka-python"], "auto_offset_reset": "latest"}
    daemon = one_partition_then_three(kafka_broker, topic, running, group)
    assert settled(daemon, topic, 3, 190) == 190
    # partition 0 restarts; 1 and 2 too when the group had already assigned them before the new id was seen
    assert 1 <= (resets(daemon) or 0) <= 3
