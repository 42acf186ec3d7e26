"""The Kafka edge on confluent-kafka (librdkafka), for when kafka-python's ~10 µs of Python per record is the limit.

Chosen with ``kafka.client_library: confluent-kafka``; ``kafka.client`` then holds librdkafka properties
(``security.protocol``, ``sasl.mechanism``, ``sasl.username``, ``sasl.password``, ...), not kafka-python names.
:class:`ConfluentSource` is a :class:`~exporter.stream.source.KafkaSource`: the same thread, resume bookkeeping, commit
policy, rebalance hand-over and truncation rule; only the calls into the client differ.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from typing import Any, NamedTuple

from exporter.serve.self_metrics import RateLimitedLog
from exporter.stream.source import MAX_RECORDS, KafkaSource, _Rebalance

try:
    import confluent_kafka as ck
except ImportError as exc:  # an optional extra: this module is imported only when the config selects it
    raise ImportError("kafka.client_library is confluent-kafka, which is not installed: "
                      "pip install 'fairness-exporter[confluent]'") from exc  # fmt: skip

log = logging.getLogger(__name__)

POLL_TIMEOUT_SECONDS = 0.5
METADATA_TIMEOUT_SECONDS = 2.0
# librdkafka's names. Against a broker that is down, librdkafka retried every ~50 ms (its 100 ms start, with jitter,
# never grew): 1 s keeps that to a couple of errors a second. session.timeout.ms is kafka-python's default
# (librdkafka's is 45 s): how long a member that died holds its partitions, and how long a commit waits for an
# unreachable group coordinator.
CLIENT_DEFAULTS: dict[str, Any] = {"reconnect.backoff.ms": 1000, "reconnect.backoff.max.ms": 5000,
                                   "topic.metadata.refresh.interval.ms": 30_000, "session.timeout.ms": 10_000}


class _Record(NamedTuple):
    """What ``Daemon.handle`` reads of a record (confluent-kafka's Message has methods, not attributes)."""

    value: bytes | None
    offset: int


def _record(message: ck.Message) -> _Record:
    return _Record(message.value(), message.offset())


class _Batch:
    """One partition's messages, read as records. Each record is built when read and dropped right after: a list of
    live records kept the garbage collector busy (9.3 instead of 8.0 µs of CPU per event, source + Daemon.handle)."""

    __slots__ = ("messages",)

    def __init__(self, messages: list[ck.Message]) -> None:
        self.messages = messages

    def __len__(self) -> int:
        return len(self.messages)

    def __iter__(self) -> Iterator[_Record]:
        return map(_record, self.messages)

    def __getitem__(self, index: int) -> _Record:
        return _record(self.messages[index])


class ConfluentSource(KafkaSource):
    """Consumes the events topic (and the labels topic, if any) with librdkafka; same arguments as KafkaSource."""

    COMMIT_ERRORS = (ck.KafkaException,)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._closing = False
        self._fatal: ck.KafkaError | None = None
        self._errors = RateLimitedLog(log)

    def _connect(self) -> ck.Consumer:
        self._fatal = None
        settings = {**CLIENT_DEFAULTS, **self.kafka.client}
        if "reconnect.backoff.ms" not in self.kafka.client:  # librdkafka refuses a start above a user's lower maximum
            start, most = CLIENT_DEFAULTS["reconnect.backoff.ms"], int(settings["reconnect.backoff.max.ms"])
            settings["reconnect.backoff.ms"] = min(start, most)
        consumer = ck.Consumer({
            "bootstrap.servers": self.kafka.bootstrap_servers,
            "group.id": self.kafka.group_id,
            "client.id": f"fairness-exporter-{self.kafka.group_id}",
            "auto.offset.reset": self.kafka.auto_offset_reset,
            **settings,
            # Offsets are committed only by commit_now, and only what the daemon says is safe.
            "enable.auto.commit": False,
            "enable.auto.offset.store": False,
            "error_cb": self._on_error,
            "logger": log.getChild("librdkafka"),
        })  # fmt: skip
        if self.manual:
            self._assign_all(consumer, wait=30.0)
        else:
            listener = _Rebalance(self)

            def on_revoke(_: ck.Consumer, revoked: list[ck.TopicPartition]) -> None:
                if not self._closing:  # close() revokes too: keep the positions a rebuilt consumer resumes from
                    listener.on_partitions_revoked(revoked)

            consumer.subscribe(self.topics, on_assign=lambda _, assigned: listener.on_partitions_assigned(assigned),
                               on_revoke=on_revoke)  # fmt: skip
        return consumer

    def _on_error(self, error: ck.KafkaError) -> None:
        """librdkafka reports what it retries by itself (a broker down, a refused connection): count and log it."""
        self.health.consumer_errors.inc()
        self._errors.warning(error.name(), "Kafka consumer error (%s: %s); librdkafka retries", error.name(),
                             error.str())  # fmt: skip
        if error.fatal():
            self._fatal = error

    def _partition_ids(self, consumer: ck.Consumer, topic: str) -> list[int] | None:
        """The topic's partitions ([] if it does not exist); None while no broker answers."""
        try:
            metadata = consumer.list_topics(topic, timeout=METADATA_TIMEOUT_SECONDS).topics.get(topic)
        except ck.KafkaException:
            return None
        return sorted(metadata.partitions) if metadata is not None and metadata.error is None else []

    def _assign_all(self, consumer: ck.Consumer, wait: float = 0.0) -> None:
        """Manual assignment: every partition of the topics, including partitions added since the last call."""
        deadline = time.monotonic() + wait
        partitions: list[tuple[str, int]] = []
        for topic in self.topics:
            ids = self._partition_ids(consumer, topic)
            if ids is None and not wait:
                return  # no broker answers: keep reading the partitions assigned, librdkafka reconnects
            while not ids and time.monotonic() < deadline and not self._stop.is_set():
                time.sleep(0.2)
                ids = self._partition_ids(consumer, topic)
            if not ids:
                missing = f"topic {topic!r} has no partitions (does it exist?)"
                raise ck.KafkaException(ck.KafkaError(ck.KafkaError.UNKNOWN_TOPIC_OR_PART, missing))
            partitions += [(topic, p) for p in ids]
        assigned = {(tp.topic, tp.partition) for tp in consumer.assignment()}
        if set(partitions) != assigned:
            if assigned:
                log.info("partitions changed: now reading %s", sorted(partitions))
            self.seek_to_resume([ck.TopicPartition(t, p) for t, p in partitions], consumer)

    def seek_to_resume(self, partitions: list[ck.TopicPartition], consumer: ck.Consumer | None = None) -> None:
        """Assign the partitions, each after the last record this process counted, else at its checkpointed offset,
        else at Kafka's committed offset (librdkafka takes start offsets with the assignment, not by seek)."""
        consumer = consumer or self.consumer
        if consumer is None:
            return
        start = []
        for tp in partitions:
            key = (tp.topic, tp.partition)
            offset = self.positions.get(key, self.resume.get(key, ck.OFFSET_INVALID))
            start.append(ck.TopicPartition(tp.topic, tp.partition, offset))
        consumer.assign(start)
        if partitions:
            self.assigned.set()

    def _send_commit(self, offsets: dict[tuple[str, int], int], wait: bool) -> None:
        """librdkafka's commit has no timeout of its own: it waits for an unreachable coordinator up to
        ``session.timeout.ms``. ``wait=False`` (the revoke callback) only sends it; librdkafka completes
        outstanding commits before it rejoins the group."""
        assert self.consumer is not None
        commit = [ck.TopicPartition(t, p, o) for (t, p), o in offsets.items()]
        done = self.consumer.commit(offsets=commit, asynchronous=not wait)
        failed = [tp.error for tp in done or () if tp.error is not None]
        if failed:
            raise ck.KafkaException(failed[0])

    def _poll_once(self) -> None:
        assert self.consumer is not None
        batches: dict[tuple[str, int], list[ck.Message]] = {}
        for message in self.consumer.consume(MAX_RECORDS, POLL_TIMEOUT_SECONDS):
            error = message.error()
            if error is not None:
                self._on_error(error)
                continue
            key = (message.topic(), message.partition())
            batch = batches.get(key)
            if batch is None:
                batch = batches[key] = []
            batch.append(message)
        if self._fatal is not None:
            raise ck.KafkaException(self._fatal)  # the consumer cannot go on: rebuild it
        for (topic, partition), messages in batches.items():
            if topic == self.kafka.topic:
                self.health.consumed.inc(len(messages))
            self.handle(topic, partition, _Batch(messages))
            self.positions[(topic, partition)] = messages[-1].offset() + 1
        assignment = self.consumer.assignment()
        for tp in assignment:
            # The high watermark of the last fetch response: Tansu answers ListOffsets (a query) wrongly.
            high = self.consumer.get_watermark_offsets(tp, cached=True)[1]
            key = (tp.topic, tp.partition)
            position = self.positions.get(key, self.resume.get(key))
            if high < 0 or position is None:
                continue
            if position > high:
                log.warning("%s[%d]: next offset %d is beyond the end of the log (%d): the partition was "
                            "truncated or recreated; reading it from the earliest offset", tp.topic, tp.partition,
                            position, high)  # fmt: skip
                self.consumer.seek(ck.TopicPartition(tp.topic, tp.partition, ck.OFFSET_BEGINNING))
                self.forget_positions([key])
                continue
            self.health.lag.labels(tp.topic, str(tp.partition)).set(high - position)
        if batches or assignment:
            self.assigned.set()

    def _close(self) -> None:
        if self.consumer is not None:
            self._closing = True
            try:
                self.consumer.close()
            except Exception:
                log.debug("error closing the consumer", exc_info=True)
            finally:
                self._closing = False
            self.consumer = None
