"""The staged path (``kafka.stages: staged``): ingest, label join and evaluation as stages of one consumer group,
joined by two internal topics, so that each model lives whole on one replica however the input is keyed.

Every replica runs one consumer (exporter/stream/kafka/source.py, the one consumer policy) on the input topic, the
labels topic, ``<group>.join`` and ``<group>.counts``; the group's assignor spreads each topic's partitions over
the replicas, and this module handles each record by its topic:

- **ingest** and **labels** (an input or labels partition): exporter/stream/stages/entry.py sends each model's
  decoded rows to its counts partition, and unlabelled predictions and labels to the join partition of their id;
- **join** (a join partition): a :class:`~exporter.stream.stages.tasks.JoinTask`; what it joins goes to the
  model's counts partition;
- **evaluate** (a counts partition): a :class:`~exporter.stream.stages.counts.CountsTask`, which counts into the
  window stores of the models whose id hashes to that partition: this replica owns them, computes them and
  exports their series; with ``attribute_sources`` it first joins their side records by id (stages/sides.py).

Exactly once without transactions: every row carries its source position and receivers skip what they applied;
an input offset is committed once all that was produced before it is acknowledged, and a task's offset once a
snapshot of its state (written into its own partition) covers it. This object is the source's offsets book.

No input record stalls its partition: entry units are bounded as the direct path's (exporter/stream/bounded.py; a
retry re-sends rows at the same positions, which receivers skip; a failure of the internal producer is never
skipped); a task never drops a record it cannot apply (stages/failures.py).
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence

from exporter.config import Config, ModelSpec
from exporter.health.counters import Health, Owned, StageHealth
from exporter.stream.bounded import Bound
from exporter.stream.ingest import Ingest
from exporter.stream.kafka import internal_topics
from exporter.stream.kafka.client import Offsets, Partition, Record
from exporter.stream.kafka.dead_letters import DeadLetters
from exporter.stream.kafka.internal_producer import InternalProducer, ProduceFailed
from exporter.stream.payloads.payload import PairJoin
from exporter.stream.stages.counts import CountsTask
from exporter.stream.stages.entry import EntryStages
from exporter.stream.stages.failures import TaskFailures
from exporter.stream.stages.records import Kind, RecordError, decode
from exporter.stream.stages.records import Record as InternalRecord
from exporter.stream.stages.restoring import give_up_caught_up, go_live, restored
from exporter.stream.stages.sides import SideStage
from exporter.stream.stages.snapshots import CHUNK_BYTES, chunks, pack
from exporter.stream.stages.tasks import JoinTask, Task, expire_joins, pending
from exporter.stream.state.fleet import Changes, Fleet
from exporter.stream.state.label_join import OutcomeJoin

log = logging.getLogger(__name__)


class Stages:
    """Every stage of one replica, under one lock: the handler of the source's polls and its offsets book."""

    def __init__(self, config: Config, health: Health, stage_health: StageHealth, clock: Callable[[], float],
                 dead_letters: DeadLetters | None = None) -> None:  # fmt: skip
        self.kafka, self.health, self.stage_health, self.clock = config.kafka, health, stage_health, clock
        self.lock = threading.RLock()
        """Serialises the stages: a poll's handling, snapshots, rebalances, reloads (the window stores have the
        fleet's lock, so a computation never waits for a flush)."""
        self.topics = internal_topics.wanted(config)
        self.tasks: dict[Partition, Task] = {}
        self.live_counts: set[int] = set()
        """The counts partitions whose models this replica owns now."""
        self.fleet = Fleet(config, keep_rejected=dead_letters is not None, owns=self.owns,
                           on_rewind=health.window_rewinds.inc)  # fmt: skip
        self.ingest = Ingest(config, self.fleet, health, clock, dead_letters)
        self.producer = InternalProducer(config.kafka)
        self.sides = SideStage(config, self.ingest, health, self.lock, self.tasks.values, self.producer,
                               lambda: self.topics) if config.attribute_sources else None  # fmt: skip
        self.topic_ids: dict[str, str] = {}
        """Each topic's id, kept current by the source: the log a row's position is in."""
        self.entry = EntryStages(self.ingest, self.producer, lambda: self.topics, self.topic_ids)
        self.produced: Offsets = {}
        """Input and labels partitions: the next offset after what the stages sent on."""
        self.acked: Offsets = {}
        """... after what the broker acknowledged: what may be committed."""
        self.bounded = Bound(health, dead_letters, lambda p: self.produced.get(p, -1),
                             lambda p, offset: self.produced.__setitem__(p, offset), (ProduceFailed,))  # fmt: skip
        self.failures = TaskFailures(health, stage_health)
        self.lag: Callable[[], Mapping[Partition, int]] = dict
        """The source's lag per partition (the daemon sets it): a restoring task that caught up gives up."""
        self.released: Callable[[], None] = lambda: None
        """Called when models leave this replica, so that their series leave /metrics now (the daemon sets it)."""
        self._snapshot_at = time.monotonic()
        self.broken: str | None = None
        """Why the tasks were dropped between polls (a restoring task failed going live): the next poll fails, and
        the source reads again from what was acknowledged (a new consumer), as after a failure mid-poll."""
        self.chunk_bytes = CHUNK_BYTES
        """The most bytes of state in one snapshot record."""

    @property
    def source_topics(self) -> list[str]:
        return [*self.kafka.events_topics(), *([self.kafka.labels_topic] if self.kafka.labels_topic else []),
                *self.topics.names]  # fmt: skip

    def prepare(self) -> None:
        """Create the missing internal topics and learn their partition counts (before each new consumer)."""
        self.topics = internal_topics.ensure(self.kafka, self.topics)

    # --- where things go ------------------------------------------------------------------------------------

    def counts_partition(self, model_id: str) -> Partition:
        return self.topics.counts_of(model_id)

    def owns(self, model_id: str) -> bool:
        """Whether this replica holds the model's counts partition, live (the fleet keeps its state)."""
        return self.counts_partition(model_id)[1] in self.live_counts

    def models_of(self, partition: int) -> list[str]:
        return [m for m in self.fleet.config.model_ids if self.counts_partition(m)[1] == partition]

    def spec_of(self, model_id: str) -> ModelSpec | None:
        return next((m for m in self.fleet.config.models if m.model_id == model_id), None)

    def owned(self) -> list[Owned]:
        """Every configured model: its counts partition, whether this replica owns it, its last step (the bucket its
        events' time left last: an event-time clock) and its window's head (advanced to the wall clock at every count
        and computation: what stops when its evaluation stage does)."""
        out: list[Owned] = []
        bucket, models = self.fleet.config.windowing.bucket_seconds, self.fleet.models
        for model_id in self.fleet.config.model_ids:
            (topic, partition), monitored = self.counts_partition(model_id), models.get(model_id)
            store = monitored.store if monitored is not None else None
            last, head = (store.detection.last_step, store.head) if store is not None else (-1, -1)
            out.append((model_id, topic, partition, monitored is not None, last * bucket if last >= 0 else None,
                        head * bucket if head >= 0 else None))
        return out

    # --- the handler ----------------------------------------------------------------------------------------

    def handle_poll(self, batches: Mapping[Partition, Sequence[Record]]) -> None:
        """Handle one poll, every stage's share of it, then wait until what it produced is acknowledged."""
        with self.lock:
            try:
                if self.broken is not None:
                    raise RuntimeError(self.broken)
                inputs = [(p, r) for p, r in batches.items() if self.kafka.reads_events(p[0]) and r]
                if inputs:
                    self.bounded(inputs, lambda parts: self.entry.predictions(parts, self.produced))
                for partition, records in batches.items():
                    if not records:
                        continue
                    if partition[0] == self.kafka.labels_topic:
                        self.bounded([(partition, records)], lambda parts: self.entry.labels(parts, self.produced))
                    elif partition in self.tasks:
                        self._task_records(self.tasks[partition], records)
                give_up_caught_up(self)
                self.producer.flush()
            except Exception:
                self._abandon()
                raise
            self.acked.update(self.produced)
            self.health.pending_predictions.set(pending(self.tasks.values()))

    def _abandon(self) -> None:
        """After a failure mid-poll, no snapshot may cover the tasks' state: drop every task (restored from its last
        snapshot at the next assignment), send the input again from what was acknowledged (a new consumer)."""
        for partition in list(self.tasks):
            self._drop(partition)
        self.produced, self.broken = dict(self.acked), None

    def _task_records(self, task: Task, records: Sequence[Record]) -> None:
        """A join or counts partition's records, through its task (buffered while it looks for its snapshot)."""
        task.fetched = True
        for message in records:
            offset = message.offset
            task.consumed = offset + 1
            try:
                record = decode(message.value)
            except RecordError as exc:
                self.stage_health.unreadable.labels(task.partition[0]).inc()
                log.error("%s[%d] offset %d skipped: %s", *task.partition, offset, exc)
                continue
            restoring = task.restoring
            if record.kind is Kind.SNAPSHOT:
                if restoring is not None and (whole := restoring.offer(record)) is not None:
                    restored(self, task, whole)
            elif restoring is not None:
                restoring.buffered.append((offset, record))
            elif not self._apply(task, record, offset):
                return

    failing = property(lambda self: self.bounded.failing or self.failures.failing or (self.sides and self.sides.behind),
                       doc="Why not all is handled, or the side topics not yet read to their ends.")  # fmt: skip

    def _apply(self, task: Task, record: InternalRecord, offset: int) -> bool:
        """A task applies one internal record and its output is sent; False: the task stopped on it (dropped)."""
        try:
            out = task.apply(record, offset)
        except Exception as exc:
            held = ", ".join(self.models_of(task.partition[1])) if isinstance(task, CountsTask) else None
            if not self.failures.failed(task.partition, task.stage, offset, exc, held):
                raise
            self._drop(task.partition)
            return False
        self.failures.applied(task.partition, offset)
        for topic, partition, key, value in out:
            self.producer.send(topic, partition, value, key)
        return True

    # --- the offsets book (exporter.stream.kafka.client.OffsetsBook) ----------------------------------------------

    def counted(self) -> Offsets:
        """Where each partition's reading has got to (a task's only once it was fetched: a log end cached from an
        earlier assignment would make its committed offset look beyond the end of the log)."""
        with self.lock:
            return {**self.produced, **{p: t.consumed for p, t in self.tasks.items() if t.fetched}}

    def committable(self) -> Offsets:
        with self.lock:
            return {**self.acked, **{p: t.covered for p, t in self.tasks.items() if t.covered is not None}}

    def starts(self, partitions: list[Partition], committed: Offsets | None) -> Offsets:
        """An internal partition starts a task at its committed offset (0: none yet), which then looks for the snapshot
        covering it; an input partition resumes after what this process sent on, else (left out) at its commit."""
        with self.lock:
            starts = {}
            for partition in partitions:
                if partition[0] not in self.topics.names:
                    if partition in self.acked:
                        starts[partition] = self.acked[partition]
                    continue
                if partition in self.failures.stopped and committed is not None:  # read, not applied, nothing committed
                    starts[partition] = committed.get(partition, 0)
                    continue
                if committed is None:
                    raise RuntimeError(f"the committed offset of {partition[0]}[{partition[1]}] is not known: its "
                                       "state cannot be restored; the consumer is rebuilt to ask again")
                self._drop(partition)  # a task of a consumer that was rebuilt: restored again from the commit
                start = committed.get(partition, 0)
                self.tasks[partition] = task = self._task(partition, start)
                starts[partition] = start
                if not start:
                    self.stage_health.restores.labels(task.stage, "fresh").inc()
                    go_live(self, task)
            return starts

    def _task(self, partition: Partition, start: int) -> Task:
        if partition[0] == self.topics.join.name:
            config = self.fleet.config
            return JoinTask(partition, start, self.stage_health, self.health, OutcomeJoin(
                                config.label_horizon_seconds, config.max_pending_labels,
                                lambda: self._other_joins(partition)), self.spec_of, self.counts_partition,
                            self.clock, self.topic_ids, PairJoin(self.fleet.events.pair_horizon,
                                                                 self._pairs_share(config)), self.ingest.payload_rows,
                            (lambda ids: self.topics.join_of(ids)) if self.kafka.labels_topic else None)  # fmt: skip
        return CountsTask(partition, start, self.stage_health, self.health, self.fleet, lambda: self.models_of(
            partition[1]), self.clock, self.sides.join if self.sides else None)  # fmt: skip

    def _pairs_share(self, config: Config) -> int:
        """A join task's bound on the payload halves waiting (and on those in pieces): its share of
        ``max_pending_labels``, rounded up (the halves of a call meet on its join partition alone)."""
        return -(-config.max_pending_labels // self.topics.join.partitions)

    def _other_joins(self, partition: Partition) -> list[OutcomeJoin]:
        """The replica's other join tasks' joins: ``max_pending_labels`` bounds the replica's joins together (the ids
        joined forgotten oldest first across them), as it bounds the direct path's one join, whichever partitions
        the ids hash to."""
        return [t.join for p, t in self.tasks.items() if p != partition and isinstance(t, JoinTask)]

    def forget(self, partitions: list[Partition]) -> None:
        """Revoked (or reset): no commit of this replica carries them; a counts partition's models leave now."""
        with self.lock:
            for partition in partitions:
                self.produced.pop(partition, None)
                self.acked.pop(partition, None)
                self.failures.forget(partition)
                self._drop(partition)

    def restart(self, topic: str, topic_id: str | None, partitions: list[Partition]) -> None:
        """These partitions start again at offset 0 of a new log (a re-created topic, a broker back empty). Rows
        from it name the new log, so receivers count them afresh; a task keeps its state (the counts and pending
        labels it holds are still true) and goes on from offset 0, its next snapshot in the new log."""
        with self.lock:
            if topic_id != self.topic_ids.get(topic):
                for offsets in (self.produced, self.acked):
                    for partition in [p for p in offsets if p[0] == topic and p not in partitions]:
                        offsets.pop(partition)
            for partition in partitions:
                if (task := self.tasks.get(partition)) is not None and task.restoring is not None:  # in the old log
                    task.restoring.buffered.clear()
                    restored(self, task, None)
                self.resume_at(partition, 0)
            if topic_id is not None:
                self.topic_ids[topic] = topic_id

    def resume_at(self, partition: Partition, offset: int) -> None:  # rows of positions applied: skipped (replays)
        with self.lock:
            if (task := self.tasks.get(partition)) is None:
                self.produced[partition] = self.acked[partition] = offset
            else:
                task.consumed, task.covered, task.fetched, task.dirty = offset, None, False, True

    def _drop(self, partition: Partition) -> None:
        task = self.tasks.pop(partition, None)
        if isinstance(task, CountsTask) and partition[1] in self.live_counts:
            self.live_counts.discard(partition[1])
            self.fleet.release(task.models())
            self.released()

    def flush(self) -> None:
        """Snapshot every task with new state and wait for everything sent: what is counted becomes committable
        (before a revocation, at shutdown). Never raises: a failure is counted and logged, nothing new committable."""
        self._round(force=True)

    # --- scheduled --------------------------------------------------------------------------------------------

    def tick(self) -> None:
        """The scheduled job (every second): snapshots when due, and restoring tasks that caught up; never raises."""
        self._round(force=False)

    def _round(self, force: bool) -> None:
        """Restoring tasks that caught up go live (not a snapshot: its failure is logged apart), then a snapshot round
        whose failure is counted (FairnessExporterStateSnapshotFailing reads the last whole one) and logged."""
        with self.lock:
            try:
                lag = self.lag()
            except Exception as exc:
                log.error("starting the restoring tasks that caught up failed (%s: %s); tried again at the next poll "
                          "or round, not a snapshot failure", type(exc).__name__, exc)  # fmt: skip
                lag = {}
            try:
                give_up_caught_up(self, lag)
            except Exception as exc:  # a task live with part of what it buffered applied: no snapshot may cover it
                self._abandon()
                self.broken = f"a restoring task failed going live between polls ({type(exc).__name__}: {exc})"
                log.error("%s: every task dropped, read again from what was acknowledged", self.broken)
        try:
            self.snapshot(force)
        except Exception as exc:
            self.stage_health.snapshot_failures.inc()
            log.error("snapshots of the staged tasks failed (%s: %s); their offsets stay uncommitted until a round "
                      "succeeds", type(exc).__name__, exc)  # fmt: skip

    def snapshot(self, force: bool = False) -> None:
        """Write a snapshot of each live task with new state (when ``checkpoint.interval`` has passed, or now when
        forced) into its own partition; once all is acknowledged, its offset is committable. A quiet task's state is
        written again after a quarter of its topic's retention, so that retention never takes its last snapshot.
        A task is marked written only then: after a failure (sending or flushing), the next round writes it again."""
        with self.lock:
            now = time.monotonic()
            if not force and now - self._snapshot_at < self.fleet.config.checkpoint_interval_seconds:
                return
            self._snapshot_at = now
            retention = {t.name: t.retention_seconds for t in (self.topics.join, self.topics.counts)}
            due = [(task, task.consumed) for (topic, _), task in self.tasks.items() if task.restoring is None and (
                task.dirty or (task.covered is not None and now - task.snapshot_at > retention[topic] / 4))]
            for task, consumed in due:
                (topic, partition), state = task.partition, pack(*task.state())
                for value in chunks(task.stage, partition, consumed, state, self.chunk_bytes):
                    self.producer.send(topic, partition, value)
            self.producer.flush()
            self.acked.update(self.produced)
            for task, covers in due:
                task.covered, task.dirty, task.snapshot_at = covers, False, now
                self.stage_health.snapshots.labels(task.stage).inc()
            self.stage_health.last_snapshot.set(self.clock())

    def expire(self) -> None:
        """Give up on predictions waiting past their horizon (for labels, or for side records) in every task held."""
        with self.lock:
            expire_joins(self.tasks.values(), self.health)
            self.health.pending_predictions.set(pending(self.tasks.values()))
            if self.sides is not None:
                self.sides.expire()

    def apply(self, config: Config) -> tuple[Changes, Counter[str]]:
        """A reload: the fleet's models, and the tasks forget the waiting predictions of models reconfigured."""
        with self.lock:
            changes, given_up = self.fleet.apply(config)
            carried = set(changes.kept) | set(changes.updated)
            for task in self.tasks.values():
                if isinstance(task, JoinTask):
                    task.join.forget_models(carried.__contains__, given_up)
                    task.join.horizon, task.pairs.horizon = config.label_horizon_seconds, self.fleet.events.pair_horizon
                    task.join.max_pending, task.pairs.max_pending = config.max_pending_labels, self._pairs_share(config)
                elif isinstance(task, CountsTask) and task.attributes is not None:
                    given_up["model_reconfigured"] += task.attributes.forget_models(carried)
        return changes, given_up

    def close(self) -> None:
        if self.sides is not None and self.sides.source.alive:
            self.sides.source.stop()
        self.producer.close()
