"""The confluent-kafka (librdkafka) adapter of :class:`~exporter.stream.kafka.client.KafkaClient`: calls into the
library, no policy. For when kafka-python's ~10 µs of Python per record is the limit.

Chosen with ``kafka.client_library: confluent-kafka``; ``kafka.client`` then holds librdkafka properties
(``security.protocol``, ``sasl.mechanism``, ``sasl.username``, ``sasl.password``, ...), not kafka-python names.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import itertools
import logging
import uuid
from collections.abc import Callable, Collection, Mapping
from typing import Any

from exporter.config import KafkaConfig
from exporter.stream.kafka.client import (
    FILL_SECONDS,
    Batch,
    CommitFailed,
    LogBounds,
    Offsets,
    Partition,
    Rebalance,
    SimpleRecord,
)

try:
    import confluent_kafka as ck
    from confluent_kafka.admin import AdminClient
except ImportError as exc:  # an optional extra: this module is imported only when the config selects it
    raise ImportError("kafka.client_library is confluent-kafka, which is not installed: "
                      "pip install 'fairness-exporter[confluent]'") from exc  # fmt: skip

log = logging.getLogger(__name__)

METADATA_TIMEOUT_SECONDS = 2.0
# librdkafka's names. Against a broker that is down, librdkafka retried every ~50 ms (its 100 ms start, with jitter,
# never grew): 1 s keeps that to a couple of errors a second. session.timeout.ms 10 s (librdkafka's default is 45 s,
# as is kafka-python 3's; ours is 10 s on both): how long a member that died holds its partitions, and how long a
# commit waits for an unreachable group coordinator. allow.auto.create.topics is off by default for a consumer.
CLIENT_DEFAULTS: dict[str, Any] = {"reconnect.backoff.ms": 1000, "reconnect.backoff.max.ms": 5000,
                                   "topic.metadata.refresh.interval.ms": 30_000, "session.timeout.ms": 10_000}
FETCH_DEFAULTS: dict[str, Any] = {"fetch.queue.backoff.ms": 10} if ck.libversion()[1] >= 0x02040000 else {}
"""librdkafka stops fetching a partition whose local queue holds ``queued.min.messages`` (100,000) and then waits
``fetch.queue.backoff.ms`` (1 s) before it asks again: a consumer behind by more than 100,000 events per partition
(a backlog, a restart) idled a second at a time. Measured (bench/ingest.py's data, 500,000 events on 3 partitions
of the embedded broker, a bare ``consume(10000)`` + ``orjson.loads`` loop, 3 interleaved rounds, best): 105,831/s
with librdkafka's defaults, 237,799/s with a 10 ms backoff, 192,405/s with ``queued.min.messages`` 1,000,000, and no
further gain from 10 MB partition fetches (200,190/s). The backoff keeps librdkafka's memory bounds (64 MB of queued
messages). Older librdkafka (< 2.4) has no such setting. ``kafka.client`` overrides it."""


class _Batch(Batch):
    """One partition's messages. Its values and next offset go to the ingest straight from the messages; a record
    is built only when one is read as such. (A list of live records also kept the garbage collector busy: 9.3
    instead of 8.0 µs of CPU per event, source + ingest.)"""

    __slots__ = ("messages",)

    def __init__(self, messages: list[ck.Message]) -> None:
        self.messages = messages

    def __len__(self) -> int:
        return len(self.messages)

    def __getitem__(self, index: int) -> SimpleRecord:  # type: ignore[override]  # no slices needed
        message = self.messages[index]
        return SimpleRecord(message.value(), message.offset(), message.timestamp()[1])  # type: ignore[arg-type]

    def values(self) -> list[bytes | None]:
        return list(map(_VALUE, self.messages))

    def next_offset(self) -> int:
        return self.messages[-1].offset() + 1  # type: ignore[operator]  # consumed: has an offset

    def newest_timestamp_ms(self) -> int:
        return max(_TIMESTAMP(m)[1] for m in self.messages)


_VALUE, _ERROR, _TOPIC, _PARTITION = ck.Message.value, ck.Message.error, ck.Message.topic, ck.Message.partition
_TIMESTAMP = ck.Message.timestamp


def _by_partition(messages: list[ck.Message], on_error: Callable[[ck.KafkaError], None]
                  ) -> dict[Partition, list[ck.Message]]:  # fmt: skip
    """Each partition's messages in the order consumed. The usual poll (no error, one topic) in C-level passes
    (0.08 instead of 0.25 µs per message); else message by message, handing errors to ``on_error``."""
    if messages and list(map(_ERROR, messages)).count(None) == len(messages):
        topics = list(map(_TOPIC, messages))
        if topics.count(topics[0]) == len(topics):
            runs: dict[Partition, list[ck.Message]] = {}
            for partition, run in itertools.groupby(messages, _PARTITION):
                runs.setdefault((topics[0], partition), []).extend(run)  # type: ignore[arg-type]  # consumed: set
            return runs
    batches: dict[Partition, list[ck.Message]] = {}
    for message in messages:
        error = message.error()
        if error is not None:
            on_error(error)
            continue
        key: Partition = (message.topic(), message.partition())  # type: ignore[assignment]  # consumed: set
        batch = batches.get(key)
        if batch is None:
            batch = batches[key] = []
        batch.append(message)
    return batches


class ConfluentClient:
    """A :class:`~exporter.stream.kafka.client.KafkaClient` on confluent-kafka. ``on_error(name, text)`` hears what
    librdkafka retries by itself (a broker down, a refused connection); a fatal error is raised by the next poll."""

    def __init__(self, kafka: KafkaConfig, on_error: Callable[[str, str], None]) -> None:
        self.on_error = on_error
        self._fatal: ck.KafkaError | None = None
        self._closing = False
        self._down = False
        settings = {**CLIENT_DEFAULTS, **FETCH_DEFAULTS, **kafka.client}
        if "reconnect.backoff.ms" not in kafka.client:  # librdkafka refuses a start above a user's lower maximum
            start, most = CLIENT_DEFAULTS["reconnect.backoff.ms"], int(settings["reconnect.backoff.max.ms"])
            settings["reconnect.backoff.ms"] = min(start, most)
        self._admin_settings = {"bootstrap.servers": kafka.bootstrap_servers, **kafka.client,
                                "logger": log.getChild("librdkafka")}  # fmt: skip
        self._admin: AdminClient | None = None
        self.session_seconds = int(settings["session.timeout.ms"]) / 1000
        self.consumer = ck.Consumer({
            "bootstrap.servers": kafka.bootstrap_servers,
            "group.id": kafka.group_id,
            "client.id": f"fairness-exporter-{kafka.group_id}",
            "auto.offset.reset": kafka.auto_offset_reset,
            **settings,
            # Offsets are committed only by the source, and only what it says is safe.
            "enable.auto.commit": False,
            "enable.auto.offset.store": False,
            "error_cb": self._on_error,
            "logger": log.getChild("librdkafka"),
        })  # fmt: skip

    def _on_error(self, error: ck.KafkaError) -> None:
        if error.code() == ck.KafkaError._ALL_BROKERS_DOWN:
            self._down = True
        if error.fatal():
            self._fatal = error
        self.on_error(error.name(), error.str())

    def subscribe(self, topics: list[str], rebalance: Rebalance) -> None:
        def on_assign(consumer: ck.Consumer, assigned: list[ck.TopicPartition]) -> None:
            # librdkafka takes start offsets with the assignment, not by seek
            committed: Offsets | None
            try:
                found = consumer.committed(assigned, timeout=METADATA_TIMEOUT_SECONDS)
                committed = {(tp.topic, tp.partition): tp.offset for tp in found if tp.error is None and tp.offset >= 0}
            except ck.KafkaException:
                committed = None
            starts = rebalance.assigned([(tp.topic, tp.partition) for tp in assigned], committed)
            consumer.assign([ck.TopicPartition(tp.topic, tp.partition,
                                               starts.get((tp.topic, tp.partition), ck.OFFSET_INVALID))
                             for tp in assigned])  # fmt: skip

        def on_revoke(_: ck.Consumer, revoked: list[ck.TopicPartition]) -> None:
            if not self._closing:  # close() revokes too: keep the offsets a rebuilt consumer resumes from
                rebalance.revoked([(tp.topic, tp.partition) for tp in revoked])

        self.consumer.subscribe(topics, on_assign=on_assign, on_revoke=on_revoke)

    def assign(self, starts: Mapping[Partition, int | None]) -> None:
        """A partition to start at its committed offset has it asked here, before the assignment: assigned with
        none (``OFFSET_INVALID``) before librdkafka knew the group coordinator, the first records came 0.5-0.6 s
        after the assignment (its offset query timer waits out a coordinator not yet known), against 0.03-0.1 s.
        One not answered starts as librdkafka decides (the committed offset, else ``auto.offset.reset``)."""
        unknown = [ck.TopicPartition(t, p) for (t, p), o in starts.items() if o is None]
        committed: dict[Partition, int] = {}
        if unknown:
            with contextlib.suppress(ck.KafkaException):
                committed = {(tp.topic, tp.partition): tp.offset for tp in
                             self.consumer.committed(unknown, timeout=METADATA_TIMEOUT_SECONDS)
                             if tp.error is None and tp.offset >= 0}  # fmt: skip
        self.consumer.assign([ck.TopicPartition(t, p, committed.get((t, p), ck.OFFSET_INVALID) if o is None else o)
                              for (t, p), o in starts.items()])  # fmt: skip

    def assignment(self) -> set[Partition]:
        return {(tp.topic, tp.partition) for tp in self.consumer.assignment()}

    def partitions(self, topic: str) -> list[int] | None:
        try:
            metadata = self.consumer.list_topics(topic, timeout=METADATA_TIMEOUT_SECONDS).topics.get(topic)
        except ck.KafkaException:
            return None
        self._down = False
        return sorted(metadata.partitions) if metadata is not None and metadata.error is None else []

    def poll(self, timeout: float, max_records: int) -> Mapping[Partition, Batch]:
        """librdkafka's ``consume`` waits until it has ``max_records`` or its timeout passed: the last records of a
        backlog, fewer than that, waited the whole poll timeout (0.5 s of a 50,000-event drain's 0.8 s). It is given
        :data:`FILL_SECONDS` first, then, if nothing came, the rest of the timeout."""
        messages = self.consumer.consume(max_records, min(timeout, FILL_SECONDS))
        if not messages and timeout > FILL_SECONDS:
            messages = self.consumer.consume(max_records, timeout - FILL_SECONDS)
        batches = _by_partition(messages, self._on_error)
        if self._fatal is not None:
            raise ck.KafkaException(self._fatal)  # the consumer cannot go on: the source rebuilds it
        # No batch clears _down: librdkafka hands over what it fetched before the broker went, after its one "all
        # brokers down" event, and only a metadata answer (connected(), every 5 s while down) proves one is back.
        return {key: _Batch(messages) for key, messages in batches.items()}

    def pause(self, partitions: list[Partition]) -> None:
        self.consumer.pause([ck.TopicPartition(*p) for p in partitions])

    def resume(self, partitions: list[Partition]) -> None:
        self.consumer.resume([ck.TopicPartition(*p) for p in partitions])

    def seek(self, partition: Partition, offset: int) -> None:
        self.consumer.seek(ck.TopicPartition(*partition, offset))

    def bounds(self, partition: Partition) -> LogBounds:
        # From the last fetch response: Tansu answers ListOffsets (a query) wrongly.
        low, high = self.consumer.get_watermark_offsets(ck.TopicPartition(*partition), cached=True)
        return LogBounds(low if low >= 0 else None, high if high >= 0 else None)

    def topic_ids(self, topics: Collection[str]) -> dict[str, str | None] | None:
        """From the admin API (the consumer's metadata has no ids), written as kafka-python writes them, so that a
        checkpoint's ids mean the same under either library."""
        if self._admin is None:
            self._admin = AdminClient(self._admin_settings)
        futures = self._admin.describe_topics(ck.TopicCollection(list(topics)),
                                              request_timeout=METADATA_TIMEOUT_SECONDS)  # fmt: skip
        ids: dict[str, str | None] = {}
        for topic, future in futures.items():
            try:
                found = future.result(timeout=METADATA_TIMEOUT_SECONDS).topic_id
            except ck.KafkaException as exc:
                if exc.args[0].code() != ck.KafkaError.UNKNOWN_TOPIC_OR_PART:
                    return None
                ids[topic] = None
            except concurrent.futures.TimeoutError:
                return None
            else:
                high, low = found.get_most_significant_bits(), found.get_least_significant_bits()
                ids[topic] = str(uuid.UUID(int=(high % 2**64) << 64 | low % 2**64))  # Java's signed longs
        return ids

    def topic_names(self) -> set[str] | None:
        try:
            return set(self.consumer.list_topics(timeout=METADATA_TIMEOUT_SECONDS).topics)
        except ck.KafkaException:
            return None

    def connected(self) -> bool:
        """False from librdkafka's "all brokers down" until a metadata request succeeds again."""
        if self._down:
            try:
                self.consumer.list_topics(timeout=METADATA_TIMEOUT_SECONDS)
                self._down = False
            except ck.KafkaException:
                pass
        return not self._down

    def commit(self, offsets: Offsets, wait: bool) -> None:
        """librdkafka's commit has no timeout of its own: it waits for an unreachable coordinator up to
        ``session.timeout.ms``. ``wait=False`` (the revoke callback) only sends it; librdkafka completes
        outstanding commits before it rejoins the group."""
        commit = [ck.TopicPartition(t, p, o) for (t, p), o in offsets.items()]
        try:
            if wait:
                done = self.consumer.commit(offsets=commit, asynchronous=False)
            else:
                self.consumer.commit(offsets=commit, asynchronous=True)
                done = []
        except ck.KafkaException as exc:
            raise CommitFailed(str(exc)) from exc
        failed = [tp.error for tp in done if tp.error is not None]
        if failed:
            raise CommitFailed(str(failed[0]))

    def close(self) -> None:
        self._closing = True
        self._admin = None  # librdkafka has no close for it: dropped, its threads and connections end with it
        try:
            self.consumer.close()
        finally:
            self._closing = False
