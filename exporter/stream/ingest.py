"""Ingest: what the source hands over becomes counts, as one unit per poll.

A poll's predictions (every partition's, as one batch) are split by model (exporter/stream/decode/route.py) and each
model's share decoded by that model's decoder (outside the lock); then, under the fleet's one lock, every share
is counted in its model's window, its unlabelled predictions put to wait for their ground truth, and the
partitions' Kafka offsets recorded, all as one step. Its rejects are counted and forwarded as dead letters
afterwards, which never raises. So an event is counted exactly once, whatever happens to its dead letter. A batch
of ground-truth events (the outcomes topic, ``kafka.labels_topic``) joins its waiting predictions and is counted
in their models' buckets.

A serving platform's payload log (``events.format: kserve | seldon``) takes another road to the same counting:
each record is read as one half of a call, the halves meet in the pair join (exporter/stream/payloads/payload.py,
under the same lock, so the counts, the join and the offsets stay one step), and each joined call becomes its
model's rows.

Nothing a batch holds can stall its partition. One value's failure is its own rejection (exporter/stream/decode/).
A unit (a poll's predictions, one labels partition's batch) that raises anyway is bounded (exporter/stream/bounded.py,
the staged path's entry stages' policy too): tried 3 times, then record by record, and a record that fails alone
is skipped, dead-lettered and counted, so the partition reads on. While a unit fails, :attr:`Ingest.failing` says
why (``/readyz``).
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable, Mapping, Sequence

import numpy as np

from exporter.config import Config, ModelSpec
from exporter.health.counters import Health
from exporter.health.logs import RateLimitedLog
from exporter.health.side import SideHealth
from exporter.stream.bounded import Bound
from exporter.stream.decode.events import REJECT_REASONS, DecodedBatch
from exporter.stream.decode.outcomes import decode_outcomes
from exporter.stream.decode.route import IGNORE_REASONS
from exporter.stream.kafka.client import Batch, Partition, Record, newest_timestamp, values_and_next
from exporter.stream.kafka.dead_letters import DeadLetters
from exporter.stream.payloads.pairs import HalfBlock, PollBlocks, calls, join_units
from exporter.stream.payloads.payload import (
    UNMATCHED_REASONS,
    PayloadRows,
    components,
    payload_batches,
    read_halves,
    records_of,
)
from exporter.stream.payloads.platforms import Half
from exporter.stream.state.attribute_join import JOIN_OUTCOMES, SIDE_REJECTS, SideRecords
from exporter.stream.state.fleet import Fleet, Monitored
from exporter.stream.state.label_join import Joined, score_bits

log = logging.getLogger(__name__)

SideTake = Callable[[str, Partition, SideRecords, Counter[str], float | None, int], None]
"""Takes one side partition's records (source name, partition, records read, rejects to add to, their newest
Kafka timestamp, the next offset) into the tables, and counts the predictions they release."""


class Ingest:
    """Counts predictions and ground-truth outcomes into every model's window, joins them, forwards dead
    letters."""

    def __init__(self, config: Config, fleet: Fleet, health: Health, clock: Callable[[], float],
                 dead_letters: DeadLetters | None = None) -> None:  # fmt: skip
        self.kafka = config.kafka
        self.fleet = fleet
        self.health = health
        self.clock = clock
        self.dead_letters = dead_letters
        self.rejections = RateLimitedLog(log)
        self.bounded = Bound(health, dead_letters, lambda p: fleet.offsets_copy().get(p, -1), fleet.advance_offset)
        """Handles each unit (a poll's predictions, a labels partition's batch) within the bound."""
        self._rows: dict[str, PayloadRows] = {}
        for reason in REJECT_REASONS:  # every reason at 0 from the start, so that a rate() sees the first one
            health.rejected.labels(reason)
        for reason in IGNORE_REASONS:
            health.ignored.labels(reason)
        self.side_topics = {s.topic: name for name, s in config.attribute_sources.items() if s.topic is not None}
        """Side sources' topics (``attribute_sources``): read as tables (exporter/stream/state/attribute_join.py)."""
        self.side_health = SideHealth(health.registry, list(config.attribute_sources), JOIN_OUTCOMES, SIDE_REJECTS) \
            if config.attribute_sources else None  # fmt: skip

    def handle_poll(self, batches: Mapping[Partition, Sequence[Record]]) -> None:
        """Count what one poll returned (the source's handler): the predictions of every partition as one batch, so
        that each model's share of a poll is decoded and counted in one call however many models share the topic;
        then the ground-truth events. Never raises: see :attr:`bounded`."""
        events = self.kafka.reads_events
        predictions = [(partition, records) for partition, records in batches.items()
                       if events(partition[0]) and records]  # fmt: skip
        if predictions:
            self.bounded(predictions, self.predictions)
        for (topic, partition), records in batches.items():
            if topic in self.side_topics and records:
                self.bounded([((topic, partition), records)], lambda parts: self.side(*parts[0][0], parts[0][1]))
            elif not events(topic) and records:
                self.bounded([((topic, partition), records)], lambda parts: self.outcomes(*parts[0][0], parts[0][1]))

    @property
    def failing(self) -> str | None:
        """Why the unit being handled failed, while it is retried (None otherwise): /readyz names it."""
        return self.bounded.failing

    def handle(self, topic: str, partition: int, records: Sequence[Record]) -> None:
        """Count one partition's batch."""
        self.handle_poll({(topic, partition): records})

    def predictions(self, parts: Sequence[tuple[Partition, Sequence[Record]]]) -> None:
        """Count the prediction events of one or more partitions as one unit, with the offsets they reach."""
        if self.fleet.events.format != "json":
            self.payloads(parts)
            return
        now = self.clock()
        values: list[bytes | None] = []
        offsets: dict[Partition, int] = {}
        for partition, records in parts:
            part_values, offsets[partition] = values_and_next(records)
            values += part_values
        fleet = self.fleet
        decoders, decoded, ignored, malformed = fleet.decode(values, now)  # type: ignore[arg-type]  # None
        given_up: Counter[str] = Counter()
        with fleet.lock:
            if decoders is not fleet.decoders:  # a reload swapped the models while this batch was decoded
                decoders, decoded, ignored, malformed = fleet.decode(values, now)  # type: ignore[arg-type]
            late = 0
            for model_id, batch in decoded.items():
                late += self._count(fleet.models[model_id], batch, now, given_up)
            for partition, offset in offsets.items():
                fleet.advance_offset(partition, offset)
            pending = len(fleet.joins.pending)
        self.health.pending_predictions.set(pending)
        self.health.count_outcomes(given_up)
        self.report(decoded, ignored, malformed, late, ", ".join(f"{topic}[{partition}]" for topic, partition in
                                                                 offsets))  # fmt: skip

    def payloads(self, parts: Sequence[tuple[Partition, Sequence[Record]]]) -> None:
        """Count the calls a payload log's records complete, as one unit with the offsets they reach: each record
        read as a half (outside the lock), the halves joined by call id and the joined calls counted (under it)."""
        now = self.clock()
        fleet = self.fleet
        form = fleet.events.format
        models = fleet.decoders
        units: list[HalfBlock | PollBlocks | list[Half]] = []
        rejected, ignored = [], Counter[str]()
        offsets: dict[Partition, int] = {}
        for partition, records in parts:
            read = read_halves(form, partition[0], records_of(records), models, self.kafka.response_topic,
                               components(fleet.config.models), blocks=True)  # fmt: skip
            units += read.blocks or [read.halves]
            rejected += read.rejected
            ignored.update(read.ignored)
            offsets[partition] = records.next_offset() if isinstance(records, Batch) else records[-1].offset + 1
        unmatched: Counter[str] = Counter()
        given_up: Counter[str] = Counter()
        with fleet.lock:
            for _, _, model, pid in rejected:
                if model is not None and pid is not None:
                    self.fleet.pairs.refuse(model, pid, now, unmatched)
            pairs = join_units(self.fleet.pairs, units, now, unmatched)
            rows = {m: self.payload_rows(m) for m in pairs}
            decoded, letters = payload_batches(pairs, rows, now)
            late = sum(self._count(fleet.models[m], batch, now, given_up) for m, batch in decoded.items()
                       if m in fleet.models)  # fmt: skip
            for partition, offset in offsets.items():
                fleet.advance_offset(partition, offset)
            pending = len(fleet.joins.pending)
        self.health.pending_predictions.set(pending)
        self.health.count_outcomes(given_up)
        joined, unmatched_counter = self.health.payload_counters(UNMATCHED_REASONS)
        joined.inc(sum(map(calls, pairs.values())))
        for reason, n in unmatched.items():
            unmatched_counter.labels(reason).inc(n)
        where = ", ".join(f"{topic}[{partition}]" for topic, partition in offsets)
        self.report(decoded, ignored, [], late, where, [(raw, reason) for raw, reason, _, _ in rejected] + letters)

    def payload_rows(self, model_id: str) -> PayloadRows:
        """The rows builder of a model as configured now (rebuilt after a reload changed its spec)."""
        spec = self.fleet.decoders[model_id].model
        rows = self._rows.get(model_id)
        if rows is None or rows.model is not spec:
            rows = self._rows[model_id] = PayloadRows(spec, self.fleet.config.max_future_skew_seconds)
        return rows

    def report(self, decoded: Mapping[str, DecodedBatch], ignored: Counter[str], malformed: list[bytes | None],
               late: int, where: str, refused: Sequence[tuple[bytes | None, str]] = ()) -> None:  # fmt: skip
        """Count a decoded batch's rejects, late and ignored events, and forward its dead letters (never raises).
        ``refused``: payloads refused before they became a batch, with their reason (payload formats)."""
        rejected = Counter({"malformed_json": len(malformed)} if malformed else {})
        rejected.update(reason for _, reason in refused)
        for batch in decoded.values():
            if batch.rejected:  # most have none: Counter.update costs microseconds even when empty
                rejected.update(batch.rejected)
        for reason, n in rejected.items():
            self.health.rejected.labels(reason).inc(n)
        self.rejections.reasons(rejected.items(), where)
        if late:
            self.health.late.inc(late)
            self.rejections.warning("late", "dropped %d late event(s) from %s", late, where)
        for reason, n in ignored.items():
            self.health.ignored.labels(reason).inc(n)
        if self.dead_letters is not None:
            payloads = [*((raw, "malformed_json") for raw in malformed),
                        *(p for batch in decoded.values() for p in batch.rejected_payloads), *refused]  # fmt: skip
            if payloads:
                self.dead_letters.send(payloads)

    def _count(self, model: Monitored, batch: DecodedBatch, now: float, given_up: Counter[str]) -> int:
        """Count one model's share of a batch (under the fleet's lock), its events that wait for side records held
        back; how many of its events were late."""
        joins = self.fleet.attributes
        if joins and model.spec.attribute_sources:
            outcomes: Counter[tuple[str, str]] = Counter()
            batch = joins.resolve(model.spec, batch, outcomes)
            self._side_counted(outcomes)
        return self._add(model, batch, now, given_up)

    def _add(self, model: Monitored, batch: DecodedBatch, now: float, given_up: Counter[str]) -> int:
        """Count events whose attributes are all known (under the fleet's lock); how many were late."""
        segments = model.store.segments.codes(batch.segments) if model.spec.counted_columns and batch.segments \
            else None  # fmt: skip
        late = model.store.add(batch.timestamps, batch.codes, batch.predictions, batch.outcomes, now,
                               scores=batch.scores, segment_codes=segments)  # fmt: skip
        if self.kafka.labels_topic:
            waiting = batch.outcomes < 0
            # a prediction waits with its segment values' codes after its attributes', for its label's cells; a
            # calibrating model's with its score last (its float64's bits: exact), for its bin's sum of labelled scores
            codes = np.column_stack([*(batch.codes[a.name] for a in model.spec.attributes),
                                     *(segments.T if segments is not None else []),
                                     *([score_bits(batch.scores)] if model.spec.calibrates else [])])  # fmt: skip
            ids = [pid for pid, w in zip(batch.prediction_ids, waiting, strict=True) if w]
            bins = model.store.estimate_bins(batch.scores)  # kept with the prediction for its label's cell
            joined = self.fleet.joins.add_predictions(model.spec.model_id, ids, batch.timestamps[waiting],
                                                      batch.predictions[waiting], codes[waiting], given_up,
                                                      None if bins is None else bins[waiting])  # fmt: skip
            if joined is not None:
                self._count_joined(model, joined, given_up)
        return late

    def outcomes(self, topic: str, partition: int, records: Sequence[Record]) -> None:
        """Join ground-truth events to their waiting predictions (or hold them until the prediction arrives)."""
        values, next_offset = values_and_next(records)
        fleet = self.fleet
        decoded = decode_outcomes(values, fleet.events.prediction_id, fleet.events.label)
        given_up: Counter[str] = Counter({"invalid_label_event": decoded.invalid} if decoded.invalid else {})
        now = self.clock()
        with fleet.lock:
            fleet.joins.labels_read((topic, partition), newest_timestamp(records), now)
            joined = fleet.joins.add_outcomes(decoded.prediction_ids, decoded.outcomes, now, given_up)
            for model_id, rows in joined.items():
                model = fleet.models.get(model_id)
                if model is not None:  # forget_models dropped a reload's removed models under this lock
                    self._count_joined(model, rows, given_up)
            fleet.advance_offset((topic, partition), next_offset)
            pending = len(fleet.joins.pending)
        self.health.pending_predictions.set(pending)
        self.health.count_outcomes(given_up)

    def _count_joined(self, model: Monitored, joined: Joined, given_up: Counter[str]) -> None:
        attributes = model.spec.attributes
        codes = {a.name: joined.codes[:, i] for i, a in enumerate(attributes)}
        calibrates = model.spec.calibrates
        segments = joined.codes[:, len(attributes) : joined.codes.shape[1] - calibrates] \
            if model.spec.counted_columns else None  # fmt: skip
        scores = np.ascontiguousarray(joined.codes[:, -1]).view(np.float64) if calibrates else None
        outside = model.store.add_joined(joined.timestamps, codes, joined.outcomes, joined.bins, segments, scores)
        self.health.outcomes_joined.inc(len(joined) - outside)
        given_up["prediction_outside_window"] += outside

    def expire(self) -> None:
        """Give up on predictions and labels older than the label horizon (a scheduled job: it must not wait for
        traffic)."""
        given_up: Counter[str] = Counter()
        unmatched: Counter[str] = Counter()
        now = self.clock()
        with self.fleet.lock:
            if self.fleet.attributes:
                outcomes: Counter[tuple[str, str]] = Counter()
                self._released(self.fleet.attributes.expire(now, self._specs(), outcomes), now, given_up)
                self._side_counted(outcomes)
            self.fleet.joins.expire(now, given_up)
            responses = self.fleet.pairs.expire(now, unmatched)  # done ages too while nothing waits
            pending = len(self.fleet.joins.pending)
            behind = now - self.fleet.joins.labels_clock(now)
        self.health.pending_predictions.set(pending)
        self.health.labels_clock_behind.set(behind)
        self.health.count_outcomes(given_up)
        if unmatched or responses:  # a response with no request ever: a bad payload, rejected and dead-lettered
            counter = self.health.payload_counters(UNMATCHED_REASONS)[1]
            for reason, n in unmatched.items():
                counter.labels(reason).inc(n)
            counter.labels("response_without_request").inc(len(responses))
            self.report({}, Counter(), [], 0, "the pair join", [(h.raw, "response_without_request")
                                                                for h in responses])  # fmt: skip

    # --- side sources (attribute_sources) -----------------------------------------------------------------------

    def side(self, topic: str, partition: int, records: Sequence[Record], take: SideTake | None = None) -> None:
        """Take one side partition's records into its source's table, and count the predictions they release. A
        value that is no JSON object is refused, counted and dead-lettered as a pointer (topic, partition, offset):
        the dead letter never holds the record's values. ``take``: what takes them (the staged path's stages);
        by default the fleet's join."""
        name = self.side_topics[topic]
        next_offset = records.next_offset() if isinstance(records, Batch) else records[-1].offset + 1
        messages = getattr(records, "messages", None)  # confluent-kafka's batch keeps its messages
        offsets = [m.offset() for m in messages] if messages is not None else [r.offset for r in records]
        read = SideRecords.read(name, topic, partition, records_of(records), offsets)
        rejected: Counter[str] = Counter(read.rejected)
        assert self.side_health is not None
        (take or self._take_side)(name, (topic, partition), read, rejected, newest_timestamp(records), next_offset)
        self.side_health.records.labels(name).inc(len(read.keys))
        for reason, n in rejected.items():
            self.side_health.rejected.labels(name, reason).inc(n)
        if read.letters and self.dead_letters is not None:
            self.dead_letters.send(read.letters)

    def _take_side(self, name: str, partition: Partition, read: SideRecords, rejected: Counter[str],
                   newest: float | None, next_offset: int) -> None:  # fmt: skip
        """The direct path's :data:`SideTake`: the fleet's join, and its offsets."""
        assert self.side_health is not None
        now = self.clock()
        given_up: Counter[str] = Counter()
        fleet = self.fleet
        with fleet.lock:
            fleet.attributes.clocks[name].labels_read(partition, newest, now)
            arrived = fleet.attributes.records(name, read, rejected)
            outcomes: Counter[tuple[str, str]] = Counter()
            self._released(fleet.attributes.release(arrived, self._specs(), outcomes), now, given_up)
            fleet.advance_offset(partition, next_offset)
            self._side_counted(outcomes)
            self.side_health.size.labels(name).set(len(fleet.attributes.tables[name]))
        self.health.count_outcomes(given_up)

    def _specs(self) -> dict[str, ModelSpec]:
        return {m: monitored.spec for m, monitored in self.fleet.models.items()}

    def _released(self, batches: Mapping[str, DecodedBatch], now: float, given_up: Counter[str]) -> None:
        """Count predictions released by the attribute join (under the fleet's lock), in their event-time buckets."""
        late = sum(self._add(self.fleet.models[m], batch, now, given_up) for m, batch in batches.items()
                   if m in self.fleet.models)  # fmt: skip
        if late:
            self.health.late.inc(late)

    def _side_counted(self, outcomes: Counter[tuple[str, str]]) -> None:
        if self.side_health is not None:
            self.side_health.count(outcomes)
            self.side_health.waiting.set(len(self.fleet.attributes.held))
