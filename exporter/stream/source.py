"""The Kafka source: one consumer policy over either client library.

It polls batches on its own thread and hands each partition's records to the ingest; it owns where each partition
starts, what is committed and when, how a reset log is detected, and what a rebalance does (the contract is
written once, on :class:`~exporter.stream.client.Rebalance`). What it knows of offsets comes from one
:class:`OffsetsBook` (the checkpointer): what was counted, what is durable, and how to make it durable.

Clients are not thread-safe, so every call into one happens on this thread (or in the rebalance callbacks the
client runs). Errors that escape the client are counted and the client is rebuilt with a backoff: the source
never crashes the daemon, and a rebuilt client resumes after the last record counted.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Protocol

from exporter.config import KafkaConfig
from exporter.serve.self_metrics import Health, RateLimitedLog
from exporter.stream.client import CommitFailed, KafkaClient, Offsets, Partition, Record

log = logging.getLogger(__name__)

MAX_RECORDS = 20_000
POLL_SECONDS = 0.5
COMMIT_EVERY_SECONDS = 1.0
REFRESH_SECONDS = 5.0
"""How often manual assignment looks for new partitions and the source asks whether a broker answers."""
CLOSE_SECONDS = 2.0

Handler = Callable[[Mapping[Partition, Sequence[Record]]], None]
"""Counts what one poll returned, every partition's records at once."""


class OffsetsBook(Protocol):
    """What the source needs to know of offsets, from the one object that keeps them (the checkpointer)."""

    topic_ids: dict[str, str]
    """The id of each topic the counted offsets belong to; the source keeps it current."""

    def counted(self) -> Offsets:
        """The next offset after the records counted, per partition: where to resume."""

    def committable(self) -> Offsets:
        """What may be committed to Kafka: the offsets a durable checkpoint covers (or, without checkpoints, the
        counted ones)."""

    def flush(self) -> None:
        """Make what is counted durable now (a checkpoint), so that :meth:`committable` covers it."""

    def forget(self, partitions: list[Partition]) -> None:
        """These partitions were handed over or reset: no later commit or checkpoint may carry their offsets."""

    def starts(self, partitions: list[Partition], committed: Offsets | None) -> Offsets:
        """Where newly assigned partitions start, given the group's committed offsets (None: not known); one left
        out starts at its committed offset (``auto_offset_reset`` if none)."""


def make_client(kafka: KafkaConfig, on_error: Callable[[str, str], None]) -> KafkaClient:
    """The adapter of the configured client library."""
    if kafka.client_library == "confluent-kafka":
        from exporter.stream.client_confluent import ConfluentClient

        return ConfluentClient(kafka, on_error)
    from exporter.stream.client_kafka import KafkaPythonClient

    return KafkaPythonClient(kafka, MAX_RECORDS)


class KafkaSource:
    """Consumes the events topic (and the labels topic, if any) and calls ``handle({partition: records})`` with
    what each poll returned."""

    def __init__(self, kafka: KafkaConfig, handle: Handler, book: OffsetsBook, health: Health,
                 topics: list[str] | None = None, prepare: Callable[[], None] | None = None) -> None:  # fmt: skip
        """``topics``: what to read (default: the events and labels topics); ``prepare`` runs before each new client
        connects (the staged path creates its internal topics there), and is retried as the client is."""
        self.kafka = kafka
        self.topics = topics or [t for t in (kafka.topic, kafka.labels_topic) if t]
        self.prepare = prepare
        self.handle = handle
        self.book = book
        self.health = health
        self.manual = kafka.assignment == "manual"
        self._errors = RateLimitedLog(log)
        self.client: KafkaClient | None = None
        self.assigned_once = threading.Event()
        self.broker_up = False
        self._lag: dict[Partition, int] = {}
        self._committed: Offsets = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="kafka-source", daemon=True)

    # --- seen from other threads ----------------------------------------------------------------------------

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout: float = 10.0) -> None:
        self._stop.set()
        self._thread.join(timeout)

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    def lag(self) -> dict[Partition, int]:
        """Messages between each held partition's high watermark and the next offset to read, as of the last
        poll; a partition handed over leaves it at once."""
        return self._lag

    # --- the rebalance contract (see exporter.stream.client.Rebalance) ----------------------------------------

    def revoked(self, partitions: list[Partition]) -> None:
        self.book.flush()
        self._commit(wait=False)
        self.book.forget(partitions)
        self._lag = {p: n for p, n in self._lag.items() if p not in partitions}
        for p in partitions:
            self._committed.pop(p, None)

    def assigned(self, partitions: list[Partition], committed: Offsets | None) -> Offsets:
        if partitions:
            self.assigned_once.set()
        return self.book.starts(partitions, committed)

    # --- the consumer thread --------------------------------------------------------------------------------

    def _client_error(self, name: str, text: str) -> None:
        """What a client retries by itself (a broker down, a refused connection): count and log it."""
        self.health.consumer_errors.inc()
        self._errors.warning(name, "Kafka consumer error (%s: %s); the client retries", name, text)

    def _connect(self) -> KafkaClient:
        if self.prepare is not None:
            self.prepare()
        client = make_client(self.kafka, self._client_error)
        self._committed = {}
        if self.manual:
            self._assign_all(client, wait=30.0)
        else:
            client.subscribe(self.topics, self)
        return client

    def _assign_all(self, client: KafkaClient, wait: float = 0.0) -> None:
        """Manual assignment: every partition of the topics, including partitions added since the last call."""
        deadline = time.monotonic() + wait
        partitions: list[Partition] = []
        for topic in self.topics:
            ids = client.partitions(topic)
            if not ids and not wait:
                return  # no broker answers, or the topic is being re-created: keep reading the partitions held
            while not ids and time.monotonic() < deadline and not self._stop.is_set():
                time.sleep(0.2)
                ids = client.partitions(topic)
            if not ids:
                raise RuntimeError(f"topic {topic!r} has no partitions (does it exist?)")
            partitions += [(topic, p) for p in ids]
        held = client.assignment()
        if set(partitions) != held:
            if held:
                log.info("partitions changed: now reading %s", sorted(partitions))
            counted = self.book.counted()
            client.assign({p: counted.get(p) for p in partitions})
            self.assigned_once.set()

    def _commit(self, wait: bool = True) -> None:
        """Commit what the book says is committable and has not been committed, for the partitions held (during a
        revocation, still those being revoked: one handed over earlier would rewind its new owner). A commit that
        fails is counted and retried later; it never blocks consumption for long."""
        client = self.client
        if client is None:
            return
        held = client.assignment()
        commit = {p: o for p, o in self.book.committable().items() if p in held and self._committed.get(p) != o}
        if not commit:
            return
        try:
            client.commit(commit, wait)
        except CommitFailed as exc:
            self.health.consumer_errors.inc()
            log.warning("offset commit failed (%s); will retry", exc)
            return
        self._committed.update(commit)

    def _reset(self, client: KafkaClient, partitions: list[Partition], why: str) -> None:
        """Read these partitions again from the start of their log and forget their old offsets."""
        log.warning("%s: %s; reading %s again from the start of the log", ", ".join(f"{t}[{p}]" for t, p in
                    partitions), why, "it" if len(partitions) == 1 else "them")  # fmt: skip
        for p in partitions:
            client.rewind(p)
            self._committed.pop(p, None)
        self.book.forget(partitions)
        self.health.log_resets.inc(len(partitions))

    def _recreated(self, client: KafkaClient, topics: set[str]) -> set[str]:
        """Topics whose id changed since their offsets were counted (re-created, or a broker that lost its data);
        their partitions are read again from the start. Checked before a batch of theirs is counted."""
        changed = set()
        for topic in topics:
            topic_id = client.topic_id(topic)
            if topic_id is None:
                continue
            known = self.book.topic_ids.get(topic)
            self.book.topic_ids[topic] = topic_id
            if known is not None and known != topic_id:
                changed.add(topic)
                self._reset(client, sorted(p for p in client.assignment() if p[0] == topic),
                            f"the topic was re-created (id {known} is now {topic_id})")  # fmt: skip
        return changed

    def _poll_once(self, client: KafkaClient) -> None:
        batches: Mapping[Partition, Sequence[Record]] = client.poll(POLL_SECONDS, MAX_RECORDS)
        if batches:
            recreated = self._recreated(client, {t for t, _ in batches})
            # records of a re-created topic's new log at the old positions: read again from its start
            kept = {p: records for p, records in batches.items() if p[0] not in recreated}
            self.health.consumed.inc(sum(len(r) for (topic, _), r in kept.items() if topic == self.kafka.topic))
            if kept:
                self.handle(kept)
        counted = self.book.counted()
        lag = {}
        for p in client.assignment():
            end = client.bounds(p).end
            position = counted.get(p)
            if end is None or position is None:
                continue
            if position > end:
                # Some brokers answer a fetch beyond the end of the log with nothing rather than OFFSET_OUT_OF_RANGE
                self._reset(client, [p], f"next offset {position} is beyond the end of the log ({end})")
                continue
            lag[p] = end - position
        self._lag = lag

    def _run(self) -> None:
        backoff = 1.0
        last_commit = last_refresh = time.monotonic()
        while not self._stop.is_set():
            try:
                if self.client is None:
                    self.client = self._connect()
                    self.broker_up = True
                    backoff = 1.0
                self._poll_once(self.client)
                now = time.monotonic()
                if now - last_refresh >= REFRESH_SECONDS:
                    self.broker_up = self.client.connected()
                    if self.manual:
                        self._assign_all(self.client)
                    last_refresh = now
                if now - last_commit >= COMMIT_EVERY_SECONDS:
                    self._commit()
                    last_commit = now
            except Exception as exc:
                self.health.consumer_errors.inc()
                self.broker_up = False
                log.warning("Kafka consumer error (%s: %s); retrying in %.0fs", type(exc).__name__, exc, backoff)
                self._close()
                self._stop.wait(backoff)
                backoff = min(backoff * 2, 30.0)
        try:
            self.book.flush()
            if self.broker_up:  # committing to a broker that does not answer would only delay the shutdown
                self._commit()
        except Exception as exc:
            log.warning("final checkpoint or commit failed: %s", exc)
        self._close()

    def _close(self) -> None:
        self._lag = {}
        if self.client is not None:
            try:
                self.client.close()
            except Exception:
                log.debug("error closing the consumer", exc_info=True)
            self.client = None
