"""The Kafka edge: poll batches on one thread, hand them over, commit only the offsets the daemon says are safe.

kafka-python's consumer is not thread-safe, so everything that touches it (poll, seek, commit, lag) happens on
this thread; other threads only *request* a commit. A broker that goes away is retried by kafka-python itself;
errors that escape it are counted and the consumer is rebuilt with a backoff, never crashing the daemon.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

from kafka import KafkaConsumer, TopicPartition
from kafka.consumer.subscription_state import ConsumerRebalanceListener
from kafka.errors import KafkaError
from kafka.structs import OffsetAndMetadata

from exporter.config import KafkaConfig
from exporter.serve.self_metrics import Health

log = logging.getLogger(__name__)

Offsets = dict[tuple[str, int], int]
"""Next offset to read, per (topic, partition)."""

MAX_RECORDS = 20_000
COMMIT_TIMEOUT_MS = 5000
PARTITION_REFRESH_SECONDS = 5.0
# kafka-python 3 backs off up to 30 s between reconnects; a monitor should notice a returning broker sooner.
CLIENT_DEFAULTS: dict[str, Any] = {"reconnect_backoff_max_ms": 5000, "metadata_max_age_ms": 30_000}


class _Rebalance(ConsumerRebalanceListener):
    def __init__(self, source: KafkaSource) -> None:
        self.source = source

    def on_partitions_revoked(self, revoked: list[TopicPartition]) -> None:
        # Hand the partitions over at exactly what this replica counted: make that durable, commit it, and
        # forget our positions so a later re-assignment resumes from the committed offset, not from ours.
        # kafka-python 3 calls this on its IO thread, where a blocking commit raises: commit asynchronously.
        if self.source.flush is not None:
            self.source.flush()
        self.source.commit_now(wait=False)
        self.source.forget_positions([(tp.topic, tp.partition) for tp in revoked])

    def on_partitions_assigned(self, assigned: list[TopicPartition]) -> None:
        self.source.seek_to_resume(assigned)


class KafkaSource:
    """Consumes the events topic (and the labels topic, if any) and calls ``handle(topic, partition, records)``."""

    COMMIT_ERRORS: tuple[type[Exception], ...] = (KafkaError,)

    def __init__(
        self, kafka: KafkaConfig, handle: Callable[[str, int, list[Any]], None], health: Health,
        resume_offsets: Mapping[tuple[str, int], int] | None = None, manual_assignment: bool = False,
        commit_interval: float | None = 5.0, safe_offsets: Callable[[], Offsets] | None = None,
        flush: Callable[[], object] | None = None, forget: Callable[[list[tuple[str, int]]], None] | None = None,
    ) -> None:  # fmt: skip
        """``commit_interval``: commit ``safe_offsets()`` that often (None: only on ``request_commit``);
        ``flush`` makes the state durable and requests a commit of what it covers (a checkpoint); it runs on the
        consumer thread before partitions are handed to another replica and after the last batch; ``forget`` is told
        which partitions were handed over, so no later commit or checkpoint carries their stale offsets."""
        self.kafka = kafka
        self.topics = [t for t in (kafka.topic, kafka.labels_topic) if t]
        self.handle = handle
        self.health = health
        self.resume = dict(resume_offsets or {})
        self.manual = manual_assignment
        self.commit_interval = commit_interval
        self.safe_offsets = safe_offsets or (lambda: {})
        self.flush = flush
        self.forget = forget
        self.consumer: KafkaConsumer | None = None
        self.positions: Offsets = {}
        self.assigned = threading.Event()
        self._stop = threading.Event()
        self._requested: Offsets | None = None
        self._thread = threading.Thread(target=self._run, name="kafka-source", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout: float = 10.0) -> None:
        self._stop.set()
        self._thread.join(timeout)

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    def forget_positions(self, keys: list[tuple[str, int]]) -> None:
        """Drop what we knew of these partitions (handed to another replica, or truncated): no later seek, commit or
        checkpoint may carry their old offsets."""
        for key in keys:
            self.positions.pop(key, None)
            self.resume.pop(key, None)
        if self.forget is not None:
            self.forget(keys)

    def request_commit(self, offsets: Offsets) -> None:
        """Ask the consumer thread to commit these offsets (e.g. once a checkpoint covering them is durable)."""
        self._requested = dict(offsets)

    def _connect(self) -> KafkaConsumer:
        consumer = KafkaConsumer(
            bootstrap_servers=self.kafka.bootstrap_servers.split(","),
            group_id=self.kafka.group_id,
            enable_auto_commit=False,
            auto_offset_reset=self.kafka.auto_offset_reset,
            max_poll_records=MAX_RECORDS,
            client_id=f"fairness-exporter-{self.kafka.group_id}",
            **{**CLIENT_DEFAULTS, **self.kafka.client},
        )
        if self.manual:
            self._assign_all(consumer, wait=30.0)
        else:
            consumer.subscribe(self.topics, listener=_Rebalance(self))
        return consumer

    def _assign_all(self, consumer: KafkaConsumer, wait: float = 0.0) -> None:
        """Manual assignment: every partition of the topics, including partitions added since the last call."""
        deadline = time.monotonic() + wait
        partitions: list[TopicPartition] = []
        for topic in self.topics:
            ids = consumer.partitions_for_topic(topic)
            while not ids and time.monotonic() < deadline and not self._stop.is_set():
                time.sleep(0.2)
                ids = consumer.partitions_for_topic(topic)
            if not ids:
                raise KafkaError(f"topic {topic!r} has no partitions (does it exist?)")
            partitions += [TopicPartition(topic, p) for p in sorted(ids)]
        if set(partitions) != consumer.assignment():
            if consumer.assignment():
                log.info("partitions changed: now reading %s", sorted((tp.topic, tp.partition) for tp in partitions))
            consumer.assign(partitions)
            self.seek_to_resume(partitions, consumer)

    def seek_to_resume(self, partitions: list[TopicPartition], consumer: KafkaConsumer | None = None) -> None:
        """Start each partition after the last record this process counted, else at its checkpointed offset,
        else at Kafka's committed offset (a rebuilt consumer must not count anything twice)."""
        consumer = consumer or self.consumer
        for tp in partitions:
            key = (tp.topic, tp.partition)
            offset = self.positions.get(key, self.resume.get(key))
            if offset is not None and consumer is not None:
                consumer.seek(tp, offset)
        if partitions:
            self.assigned.set()

    def commit_now(self, wait: bool = True) -> None:
        """Commit the offsets requested (checkpoint mode) or the safe ones (plain mode).

        A commit that fails or times out is counted and retried later; it never blocks consumption for long.
        ``wait=False`` sends it without waiting (from inside a rebalance callback).
        """
        if self.consumer is None:
            return
        requested = self._requested
        offsets = requested if requested is not None else (
            self.safe_offsets() if self.commit_interval is not None else None)  # fmt: skip
        # Only the partitions this replica holds (during a revocation, still those being revoked): the offset of
        # one handed over earlier is stale and would rewind its new owner, who would then count events again.
        held = {(tp.topic, tp.partition) for tp in self.consumer.assignment()}
        commit = {key: offset for key, offset in (offsets or {}).items() if key in held}
        if not commit:
            return
        try:
            self._send_commit(commit, wait)
        except self.COMMIT_ERRORS as exc:
            self.health.consumer_errors.inc()
            log.warning("offset commit failed (%s: %s); will retry", type(exc).__name__, exc)
            return
        if self._requested is requested:
            self._requested = None

    def _send_commit(self, offsets: Offsets, wait: bool) -> None:
        """The client call of a commit; raises one of COMMIT_ERRORS when it fails."""
        assert self.consumer is not None
        commit = {TopicPartition(t, p): OffsetAndMetadata(o, "", -1) for (t, p), o in offsets.items()}
        if wait:
            self.consumer.commit(commit, timeout_ms=COMMIT_TIMEOUT_MS)
        else:
            # kafka-python 3 runs rebalance callbacks on its IO thread, where a blocking commit raises
            self.consumer.commit_async(commit)

    def _poll_once(self) -> None:
        assert self.consumer is not None
        batches = self.consumer.poll(timeout_ms=500, max_records=MAX_RECORDS)
        for tp, records in batches.items():
            if tp.topic == self.kafka.topic:
                self.health.consumed.inc(len(records))
            self.handle(tp.topic, tp.partition, records)
            self.positions[(tp.topic, tp.partition)] = records[-1].offset + 1
        for tp in self.consumer.assignment():
            high = self.consumer.highwater(tp)
            key = (tp.topic, tp.partition)
            position = self.positions.get(key, self.resume.get(key))
            if high is None or position is None:
                continue
            if position > high:
                # The log is shorter than what we read: the topic was recreated or the broker lost its data.
                # Some brokers answer such fetches with nothing rather than OFFSET_OUT_OF_RANGE, so reset here.
                log.warning("%s[%d]: next offset %d is beyond the end of the log (%d): the partition was "
                            "truncated or recreated; reading it from the earliest offset", tp.topic, tp.partition,
                            position, high)  # fmt: skip
                self.consumer.seek_to_beginning(tp)
                self.forget_positions([key])
                continue
            self.health.lag.labels(tp.topic, str(tp.partition)).set(high - position)
        if batches or self.consumer.assignment():
            self.assigned.set()

    def _run(self) -> None:
        backoff = 1.0
        last_commit = last_refresh = time.monotonic()
        while not self._stop.is_set():
            try:
                if self.consumer is None:
                    self.consumer = self._connect()
                    backoff = 1.0
                self._poll_once()
                if self.manual and time.monotonic() - last_refresh >= PARTITION_REFRESH_SECONDS:
                    self._assign_all(self.consumer)
                    last_refresh = time.monotonic()
                since = time.monotonic() - last_commit
                due = self.commit_interval is not None and since >= self.commit_interval
                if (self._requested is not None and since >= 1.0) or due:
                    self.commit_now()
                    last_commit = time.monotonic()
            except Exception as exc:
                self.health.consumer_errors.inc()
                log.warning("Kafka consumer error (%s: %s); retrying in %.0fs", type(exc).__name__, exc, backoff)
                self._close()
                self._stop.wait(backoff)
                backoff = min(backoff * 2, 30.0)
        try:
            if self.flush is not None:
                self.flush()
            self.commit_now()
        except Exception as exc:
            log.warning("final checkpoint or commit failed: %s", exc)
        self._close()

    def _close(self) -> None:
        if self.consumer is not None:
            try:
                self.consumer.close(autocommit=False)
            except Exception:
                log.debug("error closing the consumer", exc_info=True)
            self.consumer = None
