"""Ingest: what the source hands over becomes counts, as one unit per batch.

A batch of predictions is decoded (outside the lock), then counted in the window, its unlabelled predictions put
to wait for their ground truth, and its Kafka offset recorded, all under the stream state's one lock; then its
rejects are counted and forwarded as dead letters, which never raises. So an event is counted exactly once,
whatever happens to its dead letter. A batch of ground-truth events (the outcomes topic, ``kafka.labels_topic``)
joins its waiting predictions and is counted in their buckets.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable, Sequence

import numpy as np

from exporter.config import Config
from exporter.serve.self_metrics import Health, RateLimitedLog
from exporter.stream.client import Record, values_and_next
from exporter.stream.dead_letters import DeadLetters
from exporter.stream.decode import EventDecoder
from exporter.stream.decode_outcomes import decode_outcomes
from exporter.stream.label_join import Joined, OutcomeJoin
from exporter.stream.window import WindowStore

log = logging.getLogger(__name__)


class Ingest:
    """Counts predictions and ground-truth outcomes into the window, joins them, forwards dead letters."""

    def __init__(self, config: Config, store: WindowStore, joins: OutcomeJoin, health: Health,
                 clock: Callable[[], float], dead_letters: DeadLetters | None = None) -> None:  # fmt: skip
        self.config = config
        self.store = store
        self.joins = joins
        self.health = health
        self.clock = clock
        self.dead_letters = dead_letters
        self.decoder = EventDecoder(config, keep_rejected=dead_letters is not None)
        self.rejections = RateLimitedLog(log)

    def handle(self, topic: str, partition: int, records: Sequence[Record]) -> None:
        """Count one partition's batch (the source's handler)."""
        if topic == self.config.kafka.topic:
            self.predictions(topic, partition, records)
        else:
            self.outcomes(topic, partition, records)

    def predictions(self, topic: str, partition: int, records: Sequence[Record]) -> None:
        now = self.clock()
        values, next_offset = values_and_next(records)
        batch = self.decoder.decode(values, now)  # type: ignore[arg-type]  # None (a tombstone): malformed
        given_up: Counter[str] = Counter()
        with self.store.lock:
            late = self.store.add(batch.timestamps, batch.codes, batch.predictions, batch.outcomes, now,
                                  offsets={(topic, partition): next_offset},
                                  scores=batch.scores)  # fmt: skip
            if self.config.kafka.labels_topic:
                waiting = batch.outcomes < 0
                codes = np.column_stack([batch.codes[a.name] for a in self.config.attributes])
                ids = [pid for pid, w in zip(batch.prediction_ids, waiting, strict=True) if w]
                joined = self.joins.add_predictions(ids, batch.timestamps[waiting], batch.predictions[waiting],
                                                    codes[waiting], given_up)  # fmt: skip
                self._count_joined(joined, given_up)
            pending = len(self.joins.pending)
        self.health.pending_predictions.set(pending)
        self.health.count_outcomes(given_up)
        for reason, n in batch.rejected.items():
            self.health.rejected.labels(reason).inc(n)
        self.rejections.reasons(batch.rejected.items(), f"{topic}[{partition}]")
        if late:
            self.health.late.inc(late)
            self.rejections.warning("late", "dropped %d late event(s) from %s[%d]", late, topic, partition)
        if batch.ignored:
            self.health.ignored.inc(batch.ignored)
        if batch.rejected_payloads and self.dead_letters is not None:
            self.dead_letters.send(batch.rejected_payloads)  # type: ignore[arg-type]

    def outcomes(self, topic: str, partition: int, records: Sequence[Record]) -> None:
        """Join ground-truth events to their waiting predictions (or hold them until the prediction arrives)."""
        fields = self.config.events
        values, next_offset = values_and_next(records)
        decoded = decode_outcomes(values, fields.prediction_id, fields.label)
        given_up: Counter[str] = Counter({"invalid_label_event": decoded.invalid} if decoded.invalid else {})
        with self.store.lock:
            joined = self.joins.add_outcomes(decoded.prediction_ids, decoded.outcomes, self.clock(), given_up)
            self._count_joined(joined, given_up)
            self.store.advance_offset((topic, partition), next_offset)
            pending = len(self.joins.pending)
        self.health.pending_predictions.set(pending)
        self.health.count_outcomes(given_up)

    def _count_joined(self, joined: Joined, given_up: Counter[str]) -> None:
        if not len(joined):
            return
        codes = {a.name: joined.codes[:, i] for i, a in enumerate(self.config.attributes)}
        outside = self.store.add_joined(joined.timestamps, codes, joined.outcomes)
        self.health.outcomes_joined.inc(len(joined) - outside)
        given_up["prediction_outside_window"] += outside

    def expire(self) -> None:
        """Give up on predictions and labels older than the label horizon (a scheduled job: it must not wait for
        traffic)."""
        given_up: Counter[str] = Counter()
        with self.store.lock:
            self.joins.expire(self.clock(), given_up)
            pending = len(self.joins.pending)
        self.health.pending_predictions.set(pending)
        self.health.count_outcomes(given_up)
