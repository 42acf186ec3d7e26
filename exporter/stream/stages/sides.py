"""The staged path's side sources (``attribute_sources``): each replica reads every side topic whole into a table of
its own, and the counts task that owns a model joins its predictions by id there.

A model's predictions reach one replica only (its counts partition's owner), and any replica may own it after a
rebalance; so every replica reads each side topic from its start with a consumer of its own (manual assignment of
every partition: no member of the group, and nothing committed), into one :class:`AttributeJoin` of tables and read
clocks. Each counts task joins through it with the direct path's code (``AttributeJoin.resolve``, ``release``,
``expire``), the predictions waiting for their records its own and part of its snapshot: a new owner restores them
with the counts and finds their records in its own table. The tables are not in any snapshot: a replica that
starts reads the side topics again, and until it has read them to the ends it saw at start it is not ready and
gives up on no waiting prediction (its table would not have had the chance to hold the record).
"""

from __future__ import annotations

import threading
import uuid
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import replace

import numpy as np

from exporter.config import Config
from exporter.health.counters import Health
from exporter.stream.decode.events import DecodedBatch
from exporter.stream.ingest import Ingest
from exporter.stream.kafka.client import Offsets, Partition, Record
from exporter.stream.kafka.internal_producer import InternalProducer
from exporter.stream.kafka.internal_topics import InternalTopics
from exporter.stream.kafka.source import KafkaSource
from exporter.stream.stages.counts import CountsTask
from exporter.stream.stages.records import Kind, codes_layout, codes_matrix, encode_rows, pending_rows, untagged
from exporter.stream.state.attribute_join import AttributeJoin, SideRecords


class SideBook:
    """The offsets book of a side source: where each partition has been read; nothing is ever committed."""

    def __init__(self, observe: Callable[[], None]) -> None:
        self.read: Offsets = {}
        self.topic_ids: dict[str, str] = {}
        self.observe = observe
        """Called on the source's thread before each use of the offsets (each poll's lag is measured from them)."""

    def counted(self) -> Offsets:
        self.observe()
        return dict(self.read)

    def committable(self) -> Offsets:
        return {}

    def flush(self) -> None:
        return None

    def forget(self, partitions: list[Partition]) -> None:
        return None

    def restart(self, topic: str, topic_id: str | None, partitions: list[Partition]) -> None:
        """A re-created side topic is read again from its start (its records replace what the table holds)."""
        for partition in partitions:
            self.read[partition] = 0
        if topic_id is not None:
            self.topic_ids[topic] = topic_id

    def resume_at(self, partition: Partition, offset: int) -> None:
        self.read[partition] = offset

    def starts(self, partitions: list[Partition], committed: Offsets | None) -> Offsets:
        return {p: self.read.get(p, 0) for p in partitions}


class SideStage:
    """This replica's side tables, the consumer that fills them, and the counts tasks' joins through them."""

    def __init__(self, config: Config, ingest: Ingest, health: Health, lock: threading.RLock,
                 tasks: Callable[[], Iterable[object]], producer: InternalProducer,
                 topics: Callable[[], InternalTopics]) -> None:  # fmt: skip
        self.join = AttributeJoin(config)
        """The tables and read clocks (no waiting prediction: those are the counts tasks')."""
        self.ingest = ingest
        self.health = health
        self.lock = lock
        """The stages' lock: a side record's release and a counts record's count are never interleaved."""
        self.tasks = tasks
        self.producer, self.topics_now = producer, topics
        self.log = uuid.uuid4().hex
        """The log this replica's PENDING rows are in (their positions count from 0 in it): a new owner's rows are
        never taken for its predecessor's. No position of this log could name a prediction alike on two owners (each
        side table releases the waiting ones when it reads their records), so each row also carries its source
        record (``origin``, records.py :func:`origins`): the join skips one it had from that record as a replayed
        row (``OutcomeJoin.again``), and takes another record of the id as the direct path does."""
        self.sent = 0
        self.book = SideBook(self._observe)
        self.topics = sorted(ingest.side_topics)
        self.source = KafkaSource(replace(config.kafka, assignment="manual"), self.handle_poll, self.book, health,
                                  self.topics, from_start=frozenset(self.topics))  # fmt: skip
        self.ends: Offsets | None = None
        """The ends of the side partitions when they were first measured: reaching them is being caught up."""
        self._last: Offsets | None = None
        self.caught_up = False

    def live(self) -> list[CountsTask]:
        return [t for t in self.tasks() if isinstance(t, CountsTask) and t.restoring is None and t.attributes]

    # --- the side consumer's handler (its own thread) -----------------------------------------------------------

    def handle_poll(self, batches: Mapping[Partition, Sequence[Record]]) -> None:
        for (topic, partition), records in batches.items():
            if records:
                self.ingest.side(topic, partition, records, self._take)

    def _take(self, name: str, partition: Partition, read: SideRecords, rejected: Counter[str],
              newest: float | None, next_offset: int) -> None:  # fmt: skip
        """The staged :data:`~exporter.stream.ingest.SideTake`: into this replica's table; each live counts task
        counts the predictions of its own that the records release."""
        with self.lock:
            now = self.ingest.clock()
            self.join.clocks[name].labels_read(partition, newest, now)
            tasks = self.live()
            waited = {w for t in tasks for w in t.attributes.waiting}  # type: ignore[union-attr]  # live(): joins
            arrived = self.join.records(name, read, rejected, waited.__contains__)
            specs = {m: monitored.spec for m, monitored in self.ingest.fleet.models.items()}
            for task in tasks:
                assert task.attributes is not None
                task.count(task.attributes.release(arrived, specs, task.side_outcomes))
            self.book.read[partition] = next_offset
            self.counted(tasks)
            assert self.ingest.side_health is not None
            self.ingest.side_health.size.labels(name).set(len(self.join.tables[name]))

    def _observe(self) -> None:
        """Before each poll's lag is measured (on the source's thread, through the book): the ends of every side
        partition as the first poll that measured them all saw them; caught up once each is read to its end."""
        if self.caught_up:
            return
        lag, last, self._last = self.source.lag(), self._last, dict(self.book.read)
        client = self.source.client
        if self.ends is None and last is not None and client is not None:
            wanted = {(t, p) for t in self.topics for p in client.partitions(t) or []}
            if wanted and wanted <= lag.keys():
                self.ends = {p: last.get(p, 0) + lag[p] for p in wanted}
        if self.ends is not None:
            self.caught_up = all(self.book.read.get(p, 0) >= end for p, end in self.ends.items())

    @property
    def behind(self) -> str | None:
        """Why this replica is not ready: its side consumer fails or reads nothing (a side topic absent), or its
        tables have not been read to their ends yet (None: they were)."""
        if why := self.source.failing or self.source.idle:
            return f"attribute sources: {why}"
        if self.caught_up:
            return None
        return f"reading the attribute sources' topics {', '.join(self.topics)} from their start (their records " \
               "join the predictions of the models this replica owns)"  # fmt: skip

    # --- the counts tasks' joins ----------------------------------------------------------------------------------

    def live_now(self, task: CountsTask) -> None:
        """A counts task went live (restored, with its waiting predictions): those whose records this replica's
        table already holds (read while the task was restored, or before it came here) count now."""
        assert task.attributes is not None
        if self.ingest.kafka.labels_topic:
            task.forward = self.forward
        with self.lock:
            waits = list(task.attributes.waiting)
            arrived = []
            for name, table in self.join.tables.items():
                mine = [w for w in waits if w[0] == name]
                if mine:
                    found = table.get(np.array([h for _, h in mine], dtype=np.uint64))[0]
                    arrived += [w for w, f in zip(mine, found.tolist(), strict=True) if f]
            specs = {m: monitored.spec for m, monitored in self.ingest.fleet.models.items()}
            task.count(task.attributes.release(arrived, specs, task.side_outcomes))
            self.counted(self.live())

    def forward(self, partition: Partition, model: str, batch: DecodedBatch) -> None:
        """A counts task counted predictions of a model with sources: those without a label wait for it in the join
        partition of their id, with their attributes joined (the entry stage sends those of the other models)."""
        monitored = self.ingest.fleet.models.get(model)
        if monitored is None or not monitored.spec.sourced():
            return
        spec = monitored.spec
        at = np.flatnonzero((batch.outcomes < 0) & np.fromiter((p is not None for p in batch.prediction_ids), bool,
                                                               len(batch)))  # fmt: skip
        if not len(at):
            return
        ids, found = zip(*map(untagged, (batch.prediction_ids[i] for i in at.tolist())), strict=True)
        rows: dict[str, np.ndarray] = {
                "source": np.zeros(len(at), dtype=np.int32), "position": np.arange(self.sent, self.sent + len(at)),
                "timestamp": batch.timestamps[at], "prediction": batch.predictions[at].astype(np.int8),
                "codes": codes_matrix(spec, {k: v[at] for k, v in batch.codes.items()}),
                "score": batch.scores[at] if len(batch.scores) else batch.scores,
                "origin": np.array(found, dtype=np.int64)}  # fmt: skip
        self.sent += len(at)
        meta: dict[str, object] = {"model": model, "layout": codes_layout(spec), "sources": [[*partition, self.log]]}
        topics = self.topics_now()
        where = topics.join_of(ids)
        for q in np.unique(where).tolist():
            mine = np.flatnonzero(where == q)
            for value in encode_rows(Kind.PENDING, meta, pending_rows(rows, mine),
                                     [ids[i] for i in mine.tolist()]):  # fmt: skip
                self.producer.send(topics.join.name, q, value)

    def expire(self) -> None:
        """Count the waiting predictions of every live counts task whose records would have been read by now (not
        before the side topics were read once to their ends: until then a record may be in the unread part)."""
        with self.lock:
            tasks = self.live()
            if self.caught_up:
                now = self.ingest.clock()
                specs = {m: monitored.spec for m, monitored in self.ingest.fleet.models.items()}
                self.join.expire(now, specs, Counter())  # the tables' replaced versions: forgotten when old
                for task in tasks:
                    assert task.attributes is not None
                    task.count(task.attributes.expire(now, specs, task.side_outcomes))
            self.counted(tasks)

    def counted(self, tasks: list[CountsTask]) -> None:
        """The outcomes of the ids looked up by the tasks since last time, and the predictions waiting, on /metrics."""
        side_health = self.ingest.side_health
        assert side_health is not None
        for task in tasks:
            side_health.count(task.side_outcomes)
            task.side_outcomes.clear()
        side_health.waiting.set(sum(len(t.attributes.held) for t in tasks if t.attributes is not None))
