"""Faults of the stream against the real broker, on both client libraries: a dead letter that cannot be sent, a
broker that comes back empty, a lost broker, and a rebalance that takes partitions (and their lag) away.

Each test failed before its fix (issue 16 cases 1, 3, 8; issue 11 item 2).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import orjson
import pytest
from broker_fixture import CLIENT_CONFIG, produce
from daemon_config import make_config
from daemon_fixture import GROUP_CLIENT, consumed, kafka_config, payloads, sample, scrape, synthetic_rows, wait_for
from kafka import KafkaProducer, TopicPartition
from kafka.structs import MemberState

from exporter.daemon import EXPIRY_EVERY_SECONDS, Daemon
from exporter.devtools.embedded_broker import EmbeddedBroker


def overall(port: int) -> float | None:
    return sample(scrape(port), "model_subgroup_samples", model_id="m1", attribute="gender", window="1h",
                  subgroup="overall")  # fmt: skip


def test_a_dead_letter_too_large_to_send_is_counted_once_and_dropped(
    kafka_broker: EmbeddedBroker, topic: str, running: Callable[..., Daemon], client_library: str
) -> None:
    # 10 valid events and a 1.1 MB malformed one in one batch: over the dead-letter producer's default limit
    big = b"{" + b"x" * 1_100_000
    producer = KafkaProducer(bootstrap_servers=kafka_broker.bootstrap_servers, max_request_size=4_000_000,
                             enable_idempotence=False, **CLIENT_CONFIG)  # fmt: skip
    try:
        for value in [*payloads(synthetic_rows(10, seed=1), time.time()), big]:
            producer.send(topic, value=value, partition=0)
        producer.flush(timeout=30)
    finally:
        producer.close(timeout=5)
    daemon = running(kafka_broker.bootstrap_servers, topic, kafka={
        **kafka_config(kafka_broker.bootstrap_servers, topic, client_library)["kafka"],
        "dead_letter_topic": f"{topic}-dlq"})  # fmt: skip
    wait_for(lambda: consumed(daemon.port) >= 11, what="the 11 events")
    # Later events on the same partition: once they are counted, a re-read of the first batch would have been too.
    produce(kafka_broker.bootstrap_servers, topic, payloads(synthetic_rows(5, seed=2), time.time()), partition=0)
    wait_for(lambda: consumed(daemon.port) >= 16, what="the 5 later events")
    daemon.computer.compute()
    s = scrape(daemon.port)
    assert sample(s, "fairness_exporter_events_consumed_total") == 16
    assert overall(daemon.port) == 15
    assert sample(s, "fairness_exporter_events_rejected_total", reason="malformed_json") == 1
    assert sample(s, "fairness_exporter_dead_letters_failed_total", reason="too_large") == 1
    assert sample(s, "fairness_exporter_consumer_errors_total") == 0


def test_after_the_broker_comes_back_empty_the_window_keeps_its_counts_and_reads_every_new_event(
    fresh_broker: EmbeddedBroker, running: Callable[..., Daemon]
) -> None:
    fresh_broker.create_topic("events", partitions=3)
    produce(fresh_broker.bootstrap_servers, "events", payloads(synthetic_rows(200, seed=5), time.time()))
    daemon = running(fresh_broker.bootstrap_servers, "events")
    wait_for(lambda: consumed(daemon.port) == 200, what="200 events before the restart")
    fresh_broker.restart()  # the test broker keeps nothing: the topic and its offsets are gone
    fresh_broker.create_topic("events", partitions=3)
    # at once: each partition's new log grows past the old position before the daemon fetches again
    produce(fresh_broker.bootstrap_servers, "events", payloads(synthetic_rows(1000, seed=6), time.time()))
    wait_for(lambda: consumed(daemon.port) >= 1200, timeout=90, what="the 1000 events after the restart")
    daemon.computer.compute()
    assert overall(daemon.port) == 1200
    assert sample(scrape(daemon.port), "fairness_exporter_partition_resets_total", reason="new_log") == 3
    assert daemon.healthy()[0]


def test_readiness_and_the_connected_gauge_follow_a_lost_broker(
    fresh_broker: EmbeddedBroker, running: Callable[..., Daemon]
) -> None:
    fresh_broker.create_topic("events", partitions=1)
    produce(fresh_broker.bootstrap_servers, "events", [orjson.dumps({"model_id": "m1"})])
    daemon = running(fresh_broker.bootstrap_servers, "events")
    wait_for(lambda: daemon.ready()[0], what="ready")
    # /metrics is published to the HTTP worker every 0.5 s: the gauge follows within that
    wait_for(lambda: sample(scrape(daemon.port), "fairness_exporter_kafka_connected") == 1, what="connected 1")
    fresh_broker.stop()
    wait_for(lambda: not daemon.ready()[0], what="not ready without a broker")
    assert daemon.ready() == (False, "no Kafka broker answers")
    wait_for(lambda: sample(scrape(daemon.port), "fairness_exporter_kafka_connected") == 0, what="connected 0")
    assert daemon.healthy()[0]  # alive: restarting the pod would not bring the broker back
    fresh_broker.start()
    fresh_broker.create_topic("events", partitions=1)  # the test broker comes back empty
    wait_for(lambda: daemon.ready()[0], timeout=90, what="ready again")


@pytest.mark.parametrize("client_library", ["kafka-python"])
def test_a_partition_handed_to_another_replica_takes_its_lag_series_with_it(
    kafka_broker: EmbeddedBroker, topic: str, client_library: str
) -> None:
    base = kafka_config(kafka_broker.bootstrap_servers, topic, client_library)
    # staged: two direct replicas in one group refuse to share (tests/test_direct_replicas.py)
    group = {**base["kafka"], "assignment": "subscribe", "stages": "staged",
             "client": {"reconnect_backoff_max_ms": 500, "session_timeout_ms": 6000, "heartbeat_interval_ms": 1000}}
    from daemon_config import make_config

    produce(kafka_broker.bootstrap_servers, topic, payloads(synthetic_rows(90, seed=3), time.time()),
            partition=lambda i, _: i % 3)  # fmt: skip
    first = Daemon(make_config(**{**base, "kafka": group}))
    second = Daemon(make_config(**{**base, "kafka": group}))
    try:
        first.start()
        wait_for(lambda: len(lag_series(first, topic)) == 3, what="lag of all 3 partitions on the only replica")
        second.start()
        wait_for(lambda: len(lag_series(first, topic)) < 3, timeout=60,
                 what="the first replica to hand partitions over")  # fmt: skip
        produce(kafka_broker.bootstrap_servers, topic, payloads(synthetic_rows(30, seed=4), time.time()),
                partition=lambda i, _: i % 3)  # fmt: skip
        wait_for(lambda: len(lag_series(second, topic)) >= 1
                 and len(lag_series(first, topic)) + len(lag_series(second, topic)) == 3,
                 timeout=60, what="each partition's lag series on exactly one replica")  # fmt: skip
        assert not set(lag_series(first, topic)) & set(lag_series(second, topic))
    finally:
        second.stop()
        first.stop()


def lag_series(daemon: Daemon, topic: str | None = None) -> dict[str, float]:
    return {dict(labels)["partition"]: v for (name, labels), v in scrape(daemon.port).items()
            if name == "fairness_exporter_consumer_lag_messages" and topic in (None, dict(labels)["topic"])}


def test_a_consumer_group_reads_a_topic_recreated_on_a_broker_that_came_back_empty(
    fresh_broker: EmbeddedBroker, running: Callable[..., Daemon], client_library: str
) -> None:
    fresh_broker.create_topic("events", partitions=3)
    produce(fresh_broker.bootstrap_servers, "events", payloads(synthetic_rows(200, seed=7), time.time()))
    group = {**kafka_config(fresh_broker.bootstrap_servers, "events", client_library)["kafka"],
             "assignment": "subscribe", "client": GROUP_CLIENT[client_library]}  # fmt: skip
    daemon = running(fresh_broker.bootstrap_servers, "events", kafka=group)
    wait_for(lambda: consumed(daemon.port) == 200, what="200 events before the restart")
    fresh_broker.restart()
    fresh_broker.create_topic("events", partitions=3)
    produce(fresh_broker.bootstrap_servers, "events", payloads(synthetic_rows(1000, seed=8), time.time()))
    wait_for(lambda: consumed(daemon.port) >= 1200, timeout=300, what="the 1000 events after the restart")
    daemon.computer.compute()
    assert overall(daemon.port) == 1200


def test_label_expiry_runs_on_the_schedule_not_only_when_a_batch_arrives(
    kafka_broker: EmbeddedBroker, topic: str, running: Callable[..., Daemon], client_library: str
) -> None:
    kafka_broker.create_topic(f"{topic}-labels", partitions=1)
    daemon = running(kafka_broker.bootstrap_servers, topic, kafka={
        **kafka_config(kafka_broker.bootstrap_servers, topic, client_library)["kafka"],
        "labels_topic": f"{topic}-labels"})  # fmt: skip
    job = daemon.scheduler.get_job("expire")
    assert job is not None and job.func == daemon.ingest.expire
    assert job.trigger.interval.total_seconds() == EXPIRY_EVERY_SECONDS


class _GroupDefaults:
    """A Rebalance that keeps nothing: every partition starts where the group says."""

    def revoked(self, partitions: list[tuple[str, int]]) -> None:
        pass

    def assigned(self, partitions: list[tuple[str, int]], committed: dict[tuple[str, int], int] | None
                 ) -> dict[tuple[str, int], int]:  # fmt: skip
        return {}


def _lose_the_coordinator(coordinator: Any) -> None:
    coordinator.coordinator_dead("the test")  # what kafka-python does when it loses it


def _hang_in_the_join(coordinator: Any) -> None:
    coordinator.state = MemberState.REBALANCING  # what a join whose SyncGroup answer never comes leaves


@pytest.mark.parametrize("unsettle", [_lose_the_coordinator, _hang_in_the_join], ids=["no-coordinator", "join-hangs"])
def test_a_subscribed_consumer_without_a_settled_membership_for_too_long_asks_to_be_rebuilt(
    kafka_broker: EmbeddedBroker, topic: str, monkeypatch: pytest.MonkeyPatch, unsettle: Callable[[Any], None]
) -> None:
    """After a broker came back empty, kafka-python was seen looping in coordinator discovery for good, and waiting
    for good on the SyncGroup answer of its rejoin; the adapter raises once the membership has not been settled for
    GROUP_UNSETTLED_SECONDS while a broker answers, and the source rebuilds the consumer (as after any consumer
    error)."""
    from exporter.stream.kafka import kafka_python as client_kafka

    # the group settings of the daemon tests
    config = make_config(kafka={**kafka_config(kafka_broker.bootstrap_servers, topic, "kafka-python")["kafka"],
                                "client": GROUP_CLIENT["kafka-python"]})  # fmt: skip
    client = client_kafka.KafkaPythonClient(config.kafka, max_records=100)
    try:
        client.subscribe([topic], _GroupDefaults())
        # The coordinator found is enough: the test broker's first join takes from 3 s to, now and then, for good
        # (seen here: a fresh consumer still REBALANCING after 300 s), which is what the rule is for.
        monkeypatch.setattr(client_kafka, "GROUP_UNSETTLED_SECONDS", 600.0)  # no rebuild while the test waits
        wait_for(lambda: client.poll(0.2, 100) == {} and not client.consumer._coordinator.coordinator_unknown(),
                 what="the group's coordinator")  # fmt: skip
        monkeypatch.setattr(client_kafka, "GROUP_UNSETTLED_SECONDS", 0.05)
        coordinator = client.consumer._coordinator
        assert client.connected()
        unsettle(coordinator)  # again before each check: the client's IO thread may finish a join meanwhile
        client._check_membership(fetched=False)  # the first poll without a settled membership starts the clock
        time.sleep(0.1)
        unsettle(coordinator)
        client._check_membership(fetched=True)  # records arrived: nothing is wrong, the clock stops
        unsettle(coordinator)
        client._check_membership(fetched=False)
        time.sleep(0.1)
        unsettle(coordinator)
        with pytest.raises(client_kafka.GroupUnsettled, match="rebuilding the consumer"):
            client._check_membership(fetched=False)
    finally:
        client.close()



@pytest.mark.parametrize("placed", [False, True], ids=["left-where-it-was", "placed-by-the-handler"])
def test_records_a_poll_returned_before_a_rebalance_in_its_fill_are_read_again_once(
    kafka_broker: EmbeddedBroker, monkeypatch: pytest.MonkeyPatch, placed: bool
) -> None:
    """kafka-python fills a batch with further polls (FILL_SECONDS); one that runs a rebalance discards what the
    earlier polls returned, never counted. kafka-python keeps a retained partition's position across the rejoin,
    past those records: where the source's handler left it there (a replica that counted nothing of it yet), the
    client seeks it back, else they were skipped for good; where the handler placed it, what the poll fetched from
    there is the batch. The rebalance is the listener's part of it, run inside the fill's poll (a real group's
    rejoin takes the test broker from seconds to minutes): its count, and the handler's seek."""
    from exporter.stream.kafka import kafka_python as client_kafka

    name = f"fill-rebalance-{time.time_ns()}"
    kafka_broker.create_topic(name, partitions=1)
    produce(kafka_broker.bootstrap_servers, name, [orjson.dumps({"n": i}) for i in range(10)], partition=0)
    config = make_config(**kafka_config(kafka_broker.bootstrap_servers, name, "kafka-python"))
    client = client_kafka.KafkaPythonClient(config.kafka, max_records=100)
    real_poll, polls = client.consumer.poll, []

    def poll(**kwargs: Any) -> Any:
        if polls and polls[-1] > 0:  # the fill's poll: a rebalance runs in it before it fetches
            client.consumer.poll = real_poll
            client.rebalances += 1
            if placed:
                client.consumer.seek(TopicPartition(name, 0), 0)
                client.placed.add((name, 0))
        found = real_poll(**kwargs)
        polls.append(sum(map(len, found.values())))
        return found

    try:
        client.assign({(name, 0): 0})
        client.consumer.poll = poll
        monkeypatch.setattr(client_kafka, "FILL_SECONDS", 5.0)
        seen: list[int] = []
        deadline = time.monotonic() + 30
        while len(seen) < 10 and time.monotonic() < deadline:
            for records in client.poll(0.5, 100).values():
                seen += [r.offset for r in records]
        assert polls[0] == 10 and client.rebalances == 1  # the batch's first poll had them all, then the rebalance
        for records in client.poll(0.5, 100).values():  # nothing more: none read twice
            seen += [r.offset for r in records]
        assert sorted(seen) == list(range(10))
    finally:
        client.close()


def _fill_client(broker: EmbeddedBroker, monkeypatch: pytest.MonkeyPatch, fill: Callable[[Any], None]) -> Any:
    """A kafka-python client assigned one partition holding ten records, whose batch's second poll (the fill's)
    first runs ``fill(client)``."""
    from exporter.stream.kafka import kafka_python as client_kafka

    name = f"fill-{time.time_ns()}"
    broker.create_topic(name, partitions=1)
    produce(broker.bootstrap_servers, name, [orjson.dumps({"n": i}) for i in range(10)], partition=0)
    client = client_kafka.KafkaPythonClient(make_config(**kafka_config(broker.bootstrap_servers, name,
                                                                        "kafka-python")).kafka, max_records=100)
    client.assign({(name, 0): 0})
    real_poll, polls = client.consumer.poll, []

    def poll(**kwargs: Any) -> Any:
        if not polls or polls[-1] == 0:
            found = real_poll(**kwargs)
        else:  # the fill's poll
            client.consumer.poll = real_poll
            fill(client)  # which may put a poll of its own in the consumer's place
            found = client.consumer.poll(**kwargs)
        polls.append(sum(map(len, found.values())))
        return found

    client.consumer.poll = poll
    monkeypatch.setattr(client_kafka, "FILL_SECONDS", 5.0)
    return client


def _offsets(client: Any, n: int) -> list[int]:
    seen: list[int] = []
    deadline = time.monotonic() + 30
    while len(seen) < n and time.monotonic() < deadline:
        for records in client.poll(0.5, 100).values():
            seen += [r.offset for r in records]
    for records in client.poll(0.5, 100).values():  # nothing more
        seen += [r.offset for r in records]
    return seen


def test_a_fetch_error_a_fill_poll_raises_leaves_the_earlier_records_as_the_batch(
    kafka_broker: EmbeddedBroker, monkeypatch: pytest.MonkeyPatch
) -> None:
    """kafka-python raises one partition's fetch error (no read permission, a corrupt batch) at the poll after the
    one that returned the records before it: in the fill, that dropped the whole batch, other partitions' records
    included, and a partition that always fails kept every other from being counted. The batch is what the earlier
    polls returned; the error is raised by the next poll. After a rebalance in that poll it is raised at once."""
    from kafka.errors import TopicAuthorizationFailedError

    def refused(client: Any) -> None:
        def poll(**kwargs: Any) -> Any:
            raise TopicAuthorizationFailedError({"labels"})

        client.consumer.poll = poll

    # a poll returns once it has records: a long timeout only spares a loaded machine's slow first fetch (CI once
    # read nothing within 0.5 s, so no fill poll ran and nothing was raised)
    client = _fill_client(kafka_broker, monkeypatch, refused)
    try:
        batch = client.poll(10.0, 100)
        assert [r.offset for records in batch.values() for r in records] == list(range(10))
        with pytest.raises(TopicAuthorizationFailedError):
            client.poll(0.5, 100)  # the error, at the next poll
    finally:
        client.close()

    def rebalanced_then_refused(client: Any) -> None:
        client.rebalances += 1
        refused(client)

    client = _fill_client(kafka_broker, monkeypatch, rebalanced_then_refused)
    try:
        with pytest.raises(TopicAuthorizationFailedError):
            client.poll(10.0, 100)
    finally:
        client.close()


def test_a_partition_an_eviction_took_and_gave_back_in_a_fill_starts_where_the_group_says(
    kafka_broker: EmbeddedBroker, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An evicted member's partitions lose their positions (kafka-python drops their state): one assigned again in
    the same poll starts at the group's committed offset, which another member may have moved past the records
    this one's earlier polls returned. It is not sought back to them (read twice across the group), unlike a
    partition a rebalance retained. The eviction is the listener's own on_partitions_lost, run inside the fill's
    poll; the fresh position (another member committed 6) a seek."""
    import asyncio

    from exporter.stream.kafka import kafka_python as client_kafka

    def evicted(client: Any) -> None:
        (tp,) = client.consumer.assignment()
        asyncio.run(client_kafka._Listener(client, _GroupDefaults()).on_partitions_lost([tp]))
        client.consumer.seek(tp, 6)  # assigned again: from the group's committed offset

    client = _fill_client(kafka_broker, monkeypatch, evicted)
    try:
        assert _offsets(client, 4) == [6, 7, 8, 9]
        assert client.rebalances == 1 and client.lost == {next(iter(client.assignment()))}
    finally:
        client.close()


def test_the_topic_id_lookup_never_waits_for_a_broker_nor_leaves_threads_behind(fresh_broker: EmbeddedBroker) -> None:
    """The topic-id lookups' consumer is made with the consumer's broker version: kafka-python's constructor starts
    its IO thread before it contacts a broker, and one that could not reach any left the thread and its sockets
    behind, at every lookup while the broker was away (about every 3.5 s, by the commits)."""
    import threading

    from exporter.stream.kafka import kafka_python as client_kafka

    fresh_broker.create_topic("ids", partitions=1)
    client = client_kafka.KafkaPythonClient(make_config(**kafka_config(fresh_broker.bootstrap_servers, "ids",
                                                                        "kafka-python")).kafka, max_records=100)
    try:
        fresh_broker.stop()
        before = sum(t.name.startswith("kafka-io") for t in threading.enumerate())
        assert [client.topic_ids({"ids"}) for _ in range(3)] == [None, None, None]
        assert sum(t.name.startswith("kafka-io") for t in threading.enumerate()) == before + 1  # the lookup's own
    finally:
        client.close()
