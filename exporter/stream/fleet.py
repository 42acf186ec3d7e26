"""The stream state of every model one daemon monitors, under one lock: each model's window store (counts and
change detectors) and decoder, the one label join, and the Kafka offsets all of it covers.

The topic is read once: the router splits each batch by model id and each model counts only its own events, so a
model's numbers are exactly those of a daemon configured with that model alone. A reload (:meth:`Fleet.apply`)
swaps the models in one step: a model that is unchanged, or changed without changing the shape of its counts
(thresholds, metrics, budget), keeps its counts and detector state; one whose attributes, windows or
``model_version`` changed starts afresh; a removed one is gone at the next publication.
"""

from __future__ import annotations

import logging
import threading
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field

from exporter.config import Config, EventFields, ModelSpec, layout
from exporter.stream.client import Offsets, Partition
from exporter.stream.decode import DecodedBatch, EventDecoder
from exporter.stream.decode_fleet import SharedDecoder, shareable
from exporter.stream.label_join import OutcomeJoin
from exporter.stream.route import Router
from exporter.stream.window import WindowStore

log = logging.getLogger(__name__)


Decoded = tuple[dict[str, "Monitored"], dict[str, DecodedBatch], Counter[str], list[bytes | None]]
"""The models as of a batch, each one's share of it decoded, the events of none by reason, and the malformed ones."""


@dataclass(frozen=True)
class Monitored:
    """One model as the stream keeps it: its spec, its window store (with its detectors) and its decoder."""

    spec: ModelSpec
    store: WindowStore
    decoder: EventDecoder


@dataclass
class Changes:
    """What a reload did to the models, by model id."""

    added: list[str] = field(default_factory=list)
    updated: list[str] = field(default_factory=list)
    """Changed without changing the shape of their counts: counts and detector state kept."""
    restarted: list[str] = field(default_factory=list)
    """Their attributes, groups, windows or model_version changed: they start afresh."""
    removed: list[str] = field(default_factory=list)
    kept: list[str] = field(default_factory=list)

    def __str__(self) -> str:
        parts = [f"{name} {', '.join(ids)}" for name, ids in (
            ("added", self.added), ("updated", self.updated), ("restarted afresh", self.restarted),
            ("removed", self.removed), ("unchanged", self.kept)) if ids]  # fmt: skip
        return "; ".join(parts) or "no models"


class Fleet:
    """Every model's stream state; ``lock`` guards all of it (the ingest counts a batch, its joins and its offsets
    as one step under it, and the checkpointer copies everything under it)."""

    def __init__(self, config: Config, keep_rejected: bool = False) -> None:
        self.lock = threading.RLock()
        self.keep_rejected = keep_rejected
        self.config = config
        self.joins = OutcomeJoin(config.label_horizon_seconds, config.max_pending_labels)
        self.offsets: Offsets = {}
        """The next Kafka offset after what the counts include, per (topic, partition)."""
        self.models: dict[str, Monitored] = {m.model_id: self._monitored(m) for m in config.models}
        """Replaced whole on a reload, never mutated: a reader holding it sees one configuration."""
        self.readers = self._readers()

    def _monitored(self, spec: ModelSpec) -> Monitored:
        return Monitored(spec, WindowStore(spec, self.config.windowing, self.lock),
                         EventDecoder(spec, self.config.max_future_skew_seconds, self.keep_rejected))  # fmt: skip

    def _readers(self) -> tuple[dict[str, Monitored], SharedDecoder | Router | None]:
        """The models, with what splits a batch among them: for one model nothing (its decoder tells its events
        from the others' itself, as it always has); for models whose events share their paths, one parse for
        all (exporter/stream/decode_fleet.py); else a router reading only each event's model id."""
        decoders = {model_id: m.decoder for model_id, m in self.models.items()}
        if len(self.models) == 1:
            return self.models, None
        if shareable(decoders):
            return self.models, SharedDecoder(decoders)
        return self.models, Router(self.events.model_id, self.models)

    @property
    def events(self) -> EventFields:
        """The paths every model shares: the model id's, and the label events' (checked by the config)."""
        return self.config.models[0].events if self.config.models else EventFields()

    def decode(self, values: Sequence[bytes], now: float) -> Decoded:
        """The models as of now, each one's share of a batch decoded, the events of none by reason, and the values
        that are no event at all (rejected as malformed_json)."""
        models, split = self.readers  # one configuration, even across a reload
        if isinstance(split, SharedDecoder):
            batches, ignored, malformed = split.decode(values, now)
        elif isinstance(split, Router):
            routed = split.route(values)
            batches = {m: models[m].decoder.decode(share, now) for m, share in routed.by_model.items()}
            ignored, malformed = Counter(routed.ignored), routed.malformed
        else:
            batches = {model_id: m.decoder.decode(values, now) for model_id, m in models.items()}
            ignored, malformed = Counter(), []
        for batch in batches.values():
            ignored.update(batch.ignored)
        return models, batches, ignored, malformed

    # --- offsets (the Kafka source's book of what is counted) -------------------------------------------------

    def offsets_copy(self) -> Offsets:
        with self.lock:
            return dict(self.offsets)

    def advance_offset(self, partition: Partition, offset: int) -> None:
        """Everything before ``offset`` in this partition is counted."""
        with self.lock:
            self.offsets[partition] = offset

    def forget_offsets(self, partitions: Sequence[Partition]) -> None:
        """Drop the offsets of partitions handed to another replica or reset."""
        with self.lock:
            for partition in partitions:
                self.offsets.pop(partition, None)

    # --- reload -----------------------------------------------------------------------------------------------

    def apply(self, config: Config) -> tuple[Changes, Counter[str]]:
        """Take a new (validated) config's models: what changed, and the waiting predictions given up."""
        changes, given_up = Changes(), Counter[str]()
        with self.lock:
            old, old_windowing = self.models, self.config.windowing
            self.config = config
            models: dict[str, Monitored] = {}
            for spec in config.models:
                was = old.get(spec.model_id)
                if was is None:
                    models[spec.model_id] = self._monitored(spec)
                    changes.added.append(spec.model_id)
                elif layout(was.spec, old_windowing) != layout(spec, config.windowing):
                    models[spec.model_id] = self._monitored(spec)
                    changes.restarted.append(spec.model_id)
                elif was.spec == spec and old_windowing == config.windowing and \
                        was.decoder.max_future_skew_seconds == config.max_future_skew_seconds:  # fmt: skip
                    models[spec.model_id] = was
                    changes.kept.append(spec.model_id)
                else:  # same counts, other thresholds, metrics, budget or paths: the state carries over
                    fresh = self._monitored(spec)
                    fresh.store.restore(was.store.state())
                    models[spec.model_id] = fresh
                    changes.updated.append(spec.model_id)
            changes.removed = [model_id for model_id in old if model_id not in models]
            carried = set(changes.kept) | set(changes.updated)
            self.joins.forget_models(carried.__contains__, given_up)
            self.joins.horizon = config.label_horizon_seconds
            self.joins.max_pending = config.max_pending_labels
            self.models = models
            self.readers = self._readers()
        if changes.restarted:
            log.warning("reload: the attributes, groups, windows or model_version of %s changed: %s afresh",
                        ", ".join(changes.restarted), "it starts" if len(changes.restarted) == 1 else "they start")
        return changes, given_up
