"""The staged path's internal topics: their names, their creation at start, and which partition a key goes to.

``<group_id>.join`` carries unlabelled predictions and delayed labels re-keyed by prediction id, so that a label
meets its prediction however the input topics are keyed; ``<group_id>.counts`` carries each model's counts to the
partition of its model id, whose holder evaluates the model. A missing topic is created with the configured
partitions and retention; an existing topic's partition count is the truth (the model -> partition map follows
it). Partitions are computed here for both client libraries, never by a library's partitioner (librdkafka's
default differs from the Java client's).
"""

from __future__ import annotations

import logging
import zlib
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np
from kafka.partitioner.default import murmur2

from exporter.config import Config, KafkaConfig

log = logging.getLogger(__name__)

DAY_SECONDS = 86400.0
DEFAULT_COUNTS_RETENTION = DAY_SECONDS
ADMIN_TIMEOUT_SECONDS = 10.0


@dataclass(frozen=True)
class Topic:
    """One internal topic as the daemon uses it: its name, partition count and (for creation) retention."""

    name: str
    partitions: int
    retention_seconds: float


@dataclass(frozen=True)
class InternalTopics:
    join: Topic
    counts: Topic

    @property
    def names(self) -> list[str]:
        return [self.join.name, self.counts.name]

    def counts_of(self, model_id: str) -> tuple[str, int]:
        """The counts partition of a model (the replica that holds it evaluates the model)."""
        return self.counts.name, model_partition(model_id, self.counts.partitions)

    def join_of(self, ids: Iterable[str]) -> np.ndarray:
        """The join partition of each prediction id."""
        return id_partitions(ids, self.join.partitions)


def wanted(config: Config) -> InternalTopics:
    """The internal topics the config asks for (partition counts as configured, before the broker says)."""
    kafka = config.kafka
    join, counts = kafka.internal_topics.join, kafka.internal_topics.counts
    return InternalTopics(
        Topic(join.name or f"{kafka.group_id}.join", join.partitions,
              join.retention_seconds or config.label_horizon_seconds + DAY_SECONDS),
        Topic(counts.name or f"{kafka.group_id}.counts", counts.partitions,
              counts.retention_seconds or DEFAULT_COUNTS_RETENTION),
    )  # fmt: skip


def model_partition(model_id: str, partitions: int) -> int:
    """The counts partition of a model: Kafka's default partitioning of the model id as a key (murmur2)."""
    return (murmur2(model_id.encode()) & 0x7FFFFFFF) % partitions


def id_partitions(ids: Iterable[str], partitions: int) -> np.ndarray:
    """The join partition of each prediction id. CRC-32 (zlib, C) rather than murmur2, whose kafka-python
    implementation is pure Python (3.6 to 8 us an id, as much as decoding the event): nothing outside the daemon
    reads the join topic's partitioning, and both halves of a join are placed by this one function."""
    return np.fromiter((zlib.crc32(pid.encode()) for pid in ids), np.int64) % partitions


def ensure(kafka: KafkaConfig, topics: InternalTopics) -> InternalTopics:
    """Create the missing internal topics; return them with the partition counts the broker has. Raises what the
    admin client raises (the source retries)."""
    create = _create_confluent if kafka.client_library == "confluent-kafka" else _create_kafka_python
    counts = create(kafka, [topics.join, topics.counts])
    for topic in (topics.join, topics.counts):
        if not counts.get(topic.name):
            raise RuntimeError(f"internal topic {topic.name} has no partitions yet (being created?)")
    found = InternalTopics(*(Topic(t.name, counts[t.name], t.retention_seconds) for t in (topics.join,
                                                                                          topics.counts)))
    for before, now in zip((topics.join, topics.counts), (found.join, found.counts), strict=True):
        if before.partitions != now.partitions:
            log.info("internal topic %s has %d partitions (configured: %d; an existing topic's count is kept)",
                     now.name, now.partitions, before.partitions)  # fmt: skip
    return found


def _configs(topic: Topic) -> dict[str, str]:
    return {"retention.ms": str(round(topic.retention_seconds * 1000))}


def _create_kafka_python(kafka: KafkaConfig, topics: list[Topic]) -> dict[str, int]:
    from kafka import KafkaAdminClient
    from kafka.errors import TopicAlreadyExistsError

    settings = {k: v for k, v in kafka.client.items() if k in KafkaAdminClient.DEFAULT_CONFIG}
    admin = KafkaAdminClient(bootstrap_servers=kafka.bootstrap_servers.split(","),
                             request_timeout_ms=round(ADMIN_TIMEOUT_SECONDS * 1000), **settings)  # fmt: skip
    try:
        existing = set(admin.list_topics())
        missing = {t.name: {"num_partitions": t.partitions, "configs": _configs(t)} for t in topics
                   if t.name not in existing}  # fmt: skip
        if missing:
            try:
                admin.create_topics(missing, wait_for_metadata=True)
                log.info("created the internal topics %s", ", ".join(missing))
            except TopicAlreadyExistsError:  # another replica created them meanwhile
                pass
        described: list[dict[str, Any]] = admin.describe_topics([t.name for t in topics])
        return {d["name"]: len(d["partitions"]) for d in described if d["error_code"] == 0 and d["partitions"]}
    finally:
        admin.close()


def _create_confluent(kafka: KafkaConfig, topics: list[Topic]) -> dict[str, int]:
    import confluent_kafka as ck
    from confluent_kafka.admin import AdminClient, NewTopic

    settings: dict[str, Any] = {"bootstrap.servers": kafka.bootstrap_servers, **kafka.client,
                                "logger": log.getChild("librdkafka")}  # fmt: skip
    admin = AdminClient(settings)
    existing = admin.list_topics(timeout=ADMIN_TIMEOUT_SECONDS).topics
    missing = [NewTopic(t.name, num_partitions=t.partitions, config=_configs(t)) for t in topics
               if t.name not in existing]  # fmt: skip
    for name, future in (admin.create_topics(missing) if missing else {}).items():
        try:
            future.result(ADMIN_TIMEOUT_SECONDS)
            log.info("created the internal topic %s", name)
        except ck.KafkaException as exc:
            if exc.args[0].code() != ck.KafkaError.TOPIC_ALREADY_EXISTS:
                raise
    metadata = admin.list_topics(timeout=ADMIN_TIMEOUT_SECONDS).topics
    return {t.name: len(metadata[t.name].partitions) for t in topics if t.name in metadata}
