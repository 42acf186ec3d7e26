"""The Kafka source: one consumer policy over either client library.

It polls batches on its own thread and hands them to the ingest; it owns where each partition starts, what is
committed and when, how a reset log is detected, and what a rebalance does (the contract: ``client.Rebalance``).
Offsets come from one ``client.OffsetsBook`` (the checkpointer): what was counted, what is durable, how to make it so.
Clients are not thread-safe: every call into one happens on this thread (or in its rebalance callbacks). Errors that
escape the client are counted and the client rebuilt with a backoff, resuming after the last record counted.

A subscribed direct replica must hold every partition of its topics (:mod:`exporter.stream.kafka.whole`); ``idle``
says why nothing is read while the client runs (/readyz answers 503 with it): the daemon never creates a topic.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence

from exporter.config import KafkaConfig
from exporter.health.counters import Health
from exporter.health.logs import RateLimitedLog
from exporter.stream.kafka.client import CommitFailed, KafkaClient, Offsets, OffsetsBook, Partition, Record
from exporter.stream.kafka.library import make_client
from exporter.stream.kafka.whole import WholeReplica

log = logging.getLogger(__name__)

MAX_RECORDS = 20_000
POLL_SECONDS = 0.5
COMMIT_EVERY_SECONDS = 1.0
REFRESH_SECONDS = 5.0
"""How often manual assignment looks for new partitions and the source asks whether a broker answers."""
CLOSE_SECONDS = 2.0
Handler = Callable[[Mapping[Partition, Sequence[Record]]], None]
"""Counts what one poll returned, every partition's records at once."""


def _same_id(now: str | None, known: str | None) -> bool:
    """Whether a topic's id now and the one its offsets were counted under name the same log (an id not known
    cannot tell otherwise)."""
    return now is None or known is None or now == known


class KafkaSource:
    """Consumes the events topics (and the labels topic, if any); ``handle({partition: records})`` gets each poll."""

    def __init__(self, kafka: KafkaConfig, handle: Handler, book: OffsetsBook, health: Health,
                 topics: list[str] | None = None, prepare: Callable[[], None] | None = None,
                 on_refusal: Callable[[str], None] | None = None,
                 from_start: frozenset[str] = frozenset()) -> None:  # fmt: skip
        """``topics``: what to read (default: the events and labels topics); ``prepare`` runs before each new client
        connects (the staged path creates its internal topics there), and is retried as the client is;
        ``on_refusal(line)``: a subscribed direct replica found another member in its group at start, and stopped."""
        self.kafka = kafka
        self.topics = topics or [*kafka.events_topics(), *([kafka.labels_topic] if kafka.labels_topic else [])]
        self._named = list(self.topics)  # kafka.topic_pattern adds those the cluster has that match
        self.from_start = from_start  # read from their start when nothing of them was counted (side tables)
        self.prepare = prepare
        self.handle = handle
        self.book = book
        self.health = health
        self.manual = kafka.assignment == "manual"
        self.on_refusal = on_refusal
        self.assigned_once = threading.Event()
        self.whole = WholeReplica(kafka.group_id, self.topics, health, self.assigned_once) \
            if kafka.stages == "direct" and not self.manual else None  # fmt: skip
        """A subscribed direct replica: it must hold every partition of its topics, or count nothing."""
        self.idle: str | None = None
        """Why nothing is read although the client runs (None: it reads)."""
        self._absent: list[str] = []
        self._recreated: set[str] = set()  # topics re-created while the source ran (subscribed): new partitions at 0
        self._rejoin = False
        self._errors = RateLimitedLog(log)
        self.client: KafkaClient | None = None
        self.broker_up = False
        self.failing: str | None = None
        """Why the last poll's handler raised (None: it did not), until a poll is handled."""
        self._handler_failed = False
        self._lag: dict[Partition, int] = {}
        self._committed: Offsets = {}
        self._partitions_seen: set[Partition] = set()
        """Every partition manual assignment has held; one not among them appeared while the source ran."""
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="kafka-source", daemon=True)

    # --- seen from other threads ----------------------------------------------------------------------------

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout: float = 10.0) -> None:
        self._stop.set()
        self._thread.join(timeout)

    @property
    def refusal(self) -> str | None:
        return None if self.whole is None else self.whole.refusal

    @property
    def shared(self) -> str | None:
        return None if self.whole is None else self.whole.shared

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    def lag(self) -> dict[Partition, int]:
        """Messages between each held partition's high watermark and the next offset to read, as of the last
        poll; a partition handed over leaves it at once."""
        return self._lag

    # --- the rebalance contract (see exporter.stream.kafka.client.Rebalance) ----------------------------------------

    def revoked(self, partitions: list[Partition]) -> None:
        self.book.flush()
        self._commit(wait=False)
        if self.whole is None:  # a direct replica keeps them: one it gets back resumes where it stopped
            self.book.forget(partitions)
        self._lag = {p: n for p, n in self._lag.items() if p not in partitions}
        for p in partitions:
            self._committed.pop(p, None)

    def assigned(self, partitions: list[Partition], committed: Offsets | None) -> Offsets:
        if self.whole is None:
            if partitions:  # a direct replica is assigned once it knows it holds them all
                self.assigned_once.set()
        else:
            self.whole.pending = True
        starts = self.book.starts(partitions, committed)
        starts.update({p: 0 for p in partitions if p[0] in self.from_start and p not in starts})
        if committed is not None:  # a partition of a re-created topic that nobody counted: none of it to skip
            starts.update({p: 0 for p in partitions if p[0] in self._recreated and p not in starts | committed})
        return starts

    # --- the consumer thread --------------------------------------------------------------------------------

    def _client_error(self, name: str, text: str) -> None:
        """What a client retries by itself (a broker down, a refused connection): count and log it."""
        self.health.consumer_errors.inc()
        self._errors.warning(name, "Kafka consumer error (%s: %s); the client retries", name, text)

    def _connect(self) -> KafkaClient:
        if self.prepare is not None:
            self.prepare()
        client = make_client(self.kafka, self._client_error, MAX_RECORDS)
        self._committed = {}
        self.topics = self.kafka.topics_now(client.topic_names, self._named) or self.topics
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
                if ids == []:  # a broker answers that it is absent: /readyz names it while we wait, not after
                    self._absent, self.idle = [topic], self._why_idle(set())
                time.sleep(0.2)
                ids = client.partitions(topic)
            if not ids:
                self._absent, self.idle = ([topic], self._why_idle(set())) if ids == [] else (self._absent, self.idle)
                raise RuntimeError(f"topic {topic!r} has no partitions (does it exist?)")
            partitions += [(topic, p) for p in ids]
        self._absent = []  # every topic read has partitions now
        held = client.assignment()
        if set(partitions) != held:
            if held:
                log.info("partitions changed: now reading %s", sorted(partitions))
            counted = self.book.counted()
            # A partition that appeared while the source ran (the topic grew, or came back with more partitions)
            # is read from its start whatever auto_offset_reset says: none of it was there to skip.
            new = 0 if self._partitions_seen else None
            client.assign({p: counted.get(p, 0 if p[0] in self.from_start else None if p in self._partitions_seen
                                          else new) for p in partitions})  # fmt: skip
            self._partitions_seen.update(partitions)
            self.assigned_once.set()

    def _commit(self, wait: bool = True) -> None:
        """Commit what the book says is committable and has not been committed, for the partitions held (during a
        revocation, still those being revoked: one handed over earlier would rewind its new owner), and only into
        the log its offsets were counted in: an old log's offset committed to a new one would make the next reader
        skip. A commit that fails is counted and retried later; it never blocks consumption for long."""
        client = self.client
        if client is None:
            return
        held = client.assignment()
        commit = {p: o for p, o in self.book.committable().items() if p in held and self._committed.get(p) != o}
        if commit and wait:  # not from a rebalance callback: the client's own thread cannot be waited on there
            ids = client.topic_ids({t for t, _ in commit})
            if ids is None:
                return
            commit = {p: o for p, o in commit.items() if _same_id(ids.get(p[0]), self.book.topic_ids.get(p[0]))}
        if not commit:
            return
        try:
            client.commit(commit, wait)
        except CommitFailed as exc:
            self.health.consumer_errors.inc()
            log.warning("offset commit failed (%s); will retry", exc)
            return
        self._committed.update(commit)

    def _restart(self, client: KafkaClient, topic: str, topic_id: str | None, partitions: list[Partition],
                 why: str) -> None:  # fmt: skip
        """Read these partitions again from the start of their new log, and forget the old log's offsets."""
        log.warning("%s: %s; reading %s again from the start of the log", ", ".join(f"{t}[{p}]" for t, p in
                    partitions) or topic, why, "it" if len(partitions) == 1 else "them")  # fmt: skip
        for p in partitions:
            client.seek(p, 0)
        self._committed = {p: o for p, o in self._committed.items() if p[0] != topic}
        if not self.manual and topic_id != self.book.topic_ids.get(topic):
            self._recreated.add(topic)
            self._rejoin = True
        self.book.restart(topic, topic_id, partitions)
        self.health.log_resets.labels("new_log").inc(len(partitions))

    def _same_log(self, client: KafkaClient, topic: str, topic_id: str | None) -> bool:
        """Whether the topic's id, as the cluster gives it now, names the log its counted offsets belong to; if
        not, every partition of it starts over at offset 0 of the new log. An id not known (a broker without topic
        ids, a topic just deleted, offsets counted before any id was seen) cannot tell: the log is the same."""
        known = self.book.topic_ids.get(topic)
        if _same_id(topic_id, known):
            if known is None and topic_id is not None:
                self.book.topic_ids[topic] = topic_id
            return True
        self._restart(client, topic, topic_id, sorted(p for p in client.assignment() if p[0] == topic),
                      f"the topic was re-created (id {known} is now {topic_id})")  # fmt: skip
        return False

    def _same_logs(self, client: KafkaClient, topics: set[str]) -> set[str] | None:
        """The topics whose records just fetched belong to the log their counted offsets belong to, or None when
        no broker answered (nothing can be told). The id is asked of the cluster *after* the fetch: a cached id
        can be older than the records (a broker back empty on the same address serves its new log to the old
        connection at once; a topic deleted and re-created raises no error at all), and records of a new log
        were counted at the old log's positions."""
        ids = client.topic_ids(topics)
        return None if ids is None else {t for t in topics if self._same_log(client, t, ids.get(t))}

    def _beyond_end(self, client: KafkaClient, beyond: Offsets) -> None:
        """Partitions whose next offset lies beyond the end of their log (some brokers answer such a fetch with
        nothing rather than OFFSET_OUT_OF_RANGE): a new log if the topic's id changed (all its partitions start
        over), else the same log cut short (a broker lost its tail): each reads on from its end, below which every
        record was counted (read from 0, 140 events became 240); what the cut log got before it was seen is lost."""
        topics = {t for t, _ in beyond}
        ids = client.topic_ids(topics)
        if ids is None:
            return  # told after a later poll
        counted = self.book.counted()
        for topic in sorted(topics):
            if not self._same_log(client, topic, ids.get(topic)):
                continue
            ends = {p: end for p, end in sorted(beyond.items()) if p[0] == topic}
            log.error("%s: the next offset to read lies beyond the end of the same log (%s: a broker lost its tail?): "
                      "reading on from the end, so that nothing is counted twice", ", ".join(f"{t}[{p}]" for t, p in
                      ends), ", ".join(f"{counted.get(p)} > {end}" for p, end in ends.items()))  # fmt: skip
            for partition, end in ends.items():
                client.seek(partition, end)
                self.book.resume_at(partition, end)
            self.health.log_resets.labels("beyond_end").inc(len(ends))

    def _poll_once(self, client: KafkaClient) -> None:
        batches: Mapping[Partition, Sequence[Record]] = client.poll(POLL_SECONDS, MAX_RECORDS)
        if self.whole is not None and self.whole.due():
            self.whole.judge(client)
            if self.refusal is not None:
                self._stop.set()  # the daemon says it, in one line
                if self.on_refusal is not None:
                    self.on_refusal(self.refusal)
        if batches and (self.shared is not None or self.refusal is not None):  # not counted: read again later
            held = client.assignment()
            for partition, records in batches.items():
                if partition in held:
                    client.seek(partition, records[0].offset)
            batches = {}
        if batches:
            same = self._same_logs(client, {t for t, _ in batches})
            if same is None:  # not told which log these records are of: fetch them again later
                for partition, records in batches.items():
                    client.seek(partition, records[0].offset)
            kept = {p: records for p, records in batches.items() if same is not None and p[0] in same}
            self.health.consumed.inc(sum(len(r) for (topic, _), r in kept.items() if self.kafka.reads_events(topic)))
            if kept:
                try:
                    self.handle(kept)
                except Exception as exc:  # the handler's failure, not the broker's: /readyz names it
                    self.failing = f"handling a poll failed ({type(exc).__name__}: {exc}); the consumer is rebuilt " \
                                   "and reads again from what was acknowledged"  # fmt: skip
                    self._handler_failed = True
                    raise
                self.failing = None
        counted, held = self.book.counted(), client.assignment()
        lag, beyond = {}, {}
        for p in held:
            end = client.bounds(p).end
            position = counted.get(p, 0 if p[0] in self.from_start else None)  # a side topic not read yet: from 0
            if end is None or position is None:
                continue
            if position > end:
                beyond[p] = end
                continue
            lag[p] = end - position
        if beyond:
            self._beyond_end(client, beyond)
        self._lag = lag
        self.idle = self._why_idle(held)

    def _why_idle(self, held: set[Partition]) -> str | None:
        """Why nothing is read now, though the client runs (None: it reads)."""
        if self._absent:
            return (f"topic {', '.join(self._absent)} does not exist: nothing is read until it is created (the daemon "
                    "never creates a topic it reads)")  # fmt: skip
        if self.whole is not None and not held:
            return (f"this replica holds no partition of {', '.join(self.topics)} (its consumer group is "
                    "rebalancing): nothing is read")  # fmt: skip
        return None

    def _look_for_topics(self, client: KafkaClient) -> None:
        """Note which topics read do not exist now (a broker that does not answer leaves what was known). One that
        appears is read from its start, and a subscribed source rejoins its group as a new member for it (a member
        that rejoins may be handed the assignment it held: none of the new topic's partitions)."""
        found = {topic: client.partitions(topic) for topic in self.topics}
        if any(ids is None for ids in found.values()):
            return
        absent = [topic for topic, ids in found.items() if not ids]
        appeared = set(self._absent) - set(absent)
        if appeared and not self.manual:
            self._recreated.update(appeared)
            self._rejoin = True
        self._absent = absent

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
                if self._rejoin:
                    self._rejoin = False
                    log.warning("rejoining consumer group %r as a new member, so that it assigns every partition of "
                                "the re-created (or new) topic (a member that rejoins may be handed its old "
                                "assignment)", self.kafka.group_id)  # fmt: skip
                    self._close()
                    continue
                now = time.monotonic()
                if now - last_refresh >= REFRESH_SECONDS:
                    self.broker_up = self.client.connected()
                    if (new := self.kafka.topics_now(self.client.topic_names, self._named)) not in (None, self.topics):
                        self.topics = new
                        if not self.manual:  # manual assignment takes them below
                            self.client.subscribe(self.topics, self)
                    if self.broker_up:
                        self._look_for_topics(self.client)
                    if self.manual:
                        self._assign_all(self.client)
                    last_refresh = now
                if now - last_commit >= COMMIT_EVERY_SECONDS:
                    self._commit()
                    last_commit = now
            except Exception as exc:
                self.health.consumer_errors.inc()
                if not self._handler_failed:  # the client's failure: the handler's, if any, is not the cause now
                    self.broker_up, self.failing = False, None
                self._handler_failed = False
                log.warning("Kafka consumer error (%s: %s); retrying in %.0fs", type(exc).__name__, exc, backoff)
                self._close()
                self._stop.wait(backoff)
                backoff = min(backoff * 2, 30.0)
        if self.refusal is not None:  # it counted nothing: nothing to write, and no offset of its to commit
            self._close()
            return
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
