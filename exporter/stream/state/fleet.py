"""The stream state of every model one daemon monitors, under one lock: each model's window store (counts and
change detectors) and decoder, the one label join, and the Kafka offsets all of it covers.

The topic is read once: the router splits each batch by model id and each model counts only its own events, so a
model's numbers are exactly those of a daemon configured with that model alone. A reload (:meth:`Fleet.apply`)
swaps the models in one step: a model that is unchanged, or changed without changing the shape of its counts
(thresholds, metrics, budget), keeps its counts and detector state; one whose attributes, windows or
``model_version`` changed starts afresh (:meth:`Fleet.resets`: the daemon first keeps its state on disk, says so and
counts it); a removed one is gone at the next publication.

Every model is decoded here, but a replica of the staged path keeps the window state only of the models it owns
(``owns``, from exporter/stream/stages/replica.py); the direct path owns them all.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

import numpy as np

from exporter.config import Config, EventFields, ModelSpec, layout, layout_changes
from exporter.stream.decode.events import DecodedBatch, EventDecoder
from exporter.stream.decode.fleet import SharedDecoder, shareable
from exporter.stream.decode.route import Router
from exporter.stream.kafka.client import Offsets, Partition
from exporter.stream.payloads.payload import PairJoin
from exporter.stream.state.attribute_join import AttributeJoin
from exporter.stream.state.label_join import OutcomeJoin
from exporter.stream.state.window import WindowStore

Decoded = tuple[dict[str, EventDecoder], dict[str, DecodedBatch], Counter[str], list[bytes | None]]
"""The decoders as of a batch, each model's share of it decoded (``positions``: in the whole batch), the events of
none by reason, and the malformed ones."""


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

    def __init__(self, config: Config, keep_rejected: bool = False, owns: Callable[[str], bool] | None = None,
                 on_rewind: Callable[[], object] = lambda: None) -> None:  # fmt: skip
        self.lock = threading.RLock()
        self.on_rewind = on_rewind
        """Counts each time a model's window head, ahead of the clock, is brought back to it (WindowStore.follow)."""
        self.keep_rejected = keep_rejected
        self.config = config
        self.owns = owns
        """Whether this replica keeps a model's window state (None: every model's)."""
        self.joins = OutcomeJoin(config.label_horizon_seconds, config.max_pending_labels)
        self.pairs = PairJoin(self.events.pair_horizon, config.max_pending_labels)
        """Halves of calls waiting for their partner (payload formats: exporter/stream/payloads/payload.py)."""
        self.attributes = AttributeJoin(config)
        """Side sources' tables and the predictions waiting for their records (``attribute_sources``)."""
        self.offsets: Offsets = {}
        """The next Kafka offset after what the counts include, per (topic, partition)."""
        self.decoders: dict[str, EventDecoder] = {m.model_id: self._decoder(m) for m in config.models}
        """Every configured model's decoder; replaced whole on a reload, with :attr:`models`."""
        self.models: dict[str, Monitored] = {m.model_id: self._monitored(m) for m in config.models if self._owned(m)}
        """The models whose state this replica keeps. Replaced whole, never mutated: a reader holding it sees one
        configuration."""
        self.readers = self._readers()

    def _owned(self, spec: ModelSpec) -> bool:
        return self.owns is None or self.owns(spec.model_id)

    def _decoder(self, spec: ModelSpec) -> EventDecoder:
        return EventDecoder(spec, self.config.max_future_skew_seconds, self.keep_rejected)

    def _monitored(self, spec: ModelSpec, decoder: EventDecoder | None = None) -> Monitored:
        store = WindowStore(spec, self.config.windowing, self.lock, self.config.max_future_skew_seconds,
                            self.on_rewind)  # fmt: skip
        return Monitored(spec, store, decoder or self.decoders[spec.model_id])

    def _readers(self) -> tuple[dict[str, EventDecoder], SharedDecoder | Router | None]:
        """Every model's decoder, with what splits a batch among them: for one model nothing (its decoder tells its
        events from the others' itself, as it always has); for models whose events share their paths, one parse for
        all (exporter/stream/decode/fleet.py); else a router reading only each event's model id."""
        decoders = self.decoders
        if len(decoders) == 1:
            return decoders, None
        if shareable(decoders):
            return decoders, SharedDecoder(decoders)
        return decoders, Router(self.events.model_id, decoders)

    @property
    def events(self) -> EventFields:
        """The paths every model shares: the model id's, and the label events' (checked by the config)."""
        return self.config.models[0].events if self.config.models else EventFields()

    def decode(self, values: Sequence[bytes], now: float) -> Decoded:
        """Every decoder as of now, each model's share of a batch decoded (its events' positions in the whole
        batch), the events of none by reason, and the values that are no event at all (rejected as
        malformed_json)."""
        decoders, split = self.readers  # one configuration, even across a reload
        if isinstance(split, SharedDecoder):
            batches, ignored, malformed = split.decode(values, now)
        elif isinstance(split, Router):
            routed = split.route(values)
            batches = {m: decoders[m].decode(share, now) for m, share in routed.by_model.items()}
            for m, batch in batches.items():
                batch.positions = routed.positions[m][batch.positions]
            ignored, malformed = Counter(routed.ignored), routed.malformed
        else:
            batches = {model_id: d.decode(values, now) for model_id, d in decoders.items()}
            ignored, malformed = Counter(), []
        for batch in batches.values():
            if batch.ignored:  # most have none: Counter.update costs microseconds even when empty
                ignored.update(batch.ignored)
        return decoders, batches, ignored, malformed

    # --- the models this replica owns (the staged path's evaluation stage) -----------------------------------

    def take(self, states: dict[str, dict[str, np.ndarray] | None]) -> None:
        """Keep the state of these configured models from now: restored from their arrays, or empty (None)."""
        with self.lock:
            specs = {m.model_id: m for m in self.config.models}
            models = dict(self.models)
            for model_id, state in states.items():
                monitored = self._monitored(specs[model_id])
                if state is not None:
                    monitored.store.restore(state)
                models[model_id] = monitored
            self.models = models

    def release(self, model_ids: Iterable[str]) -> None:
        """Drop these models' state (their series leave /metrics at the next publication)."""
        gone = set(model_ids)
        with self.lock:
            self.models = {k: v for k, v in self.models.items() if k not in gone}

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

    def resets(self, config: Config) -> dict[str, tuple[str, str]]:
        """The models that taking ``config`` starts afresh (their layout changed), each with
        :func:`~exporter.config.layout_changes`: the daemon keeps their state on disk before (Checkpointer.keep)."""
        with self.lock:
            old = {m.model_id: m for m in self.config.models}
            changes = {spec.model_id: layout_changes(layout(old[spec.model_id], self.config.windowing),
                                                     layout(spec, config.windowing))
                       for spec in config.models if spec.model_id in old}  # fmt: skip
        return {model_id: changed for model_id, changed in changes.items() if changed is not None}

    def apply(self, config: Config) -> tuple[Changes, Counter[str]]:
        """Take a new (validated) config's models: what changed, and the waiting predictions given up."""
        changes, given_up = Changes(), Counter[str]()
        resets = self.resets(config)
        with self.lock:
            old_specs = {m.model_id: m for m in self.config.models}
            old, old_decoders, old_config = self.models, self.decoders, self.config
            self.config = config
            models: dict[str, Monitored] = {}
            decoders: dict[str, EventDecoder] = {}
            for spec in config.models:
                was_spec, was = old_specs.get(spec.model_id), old.get(spec.model_id)
                if was_spec is None:
                    changes.added.append(spec.model_id)
                elif spec.model_id in resets:
                    changes.restarted.append(spec.model_id)
                elif was_spec == spec and old_config.windowing == config.windowing and \
                        old_config.max_future_skew_seconds == config.max_future_skew_seconds:  # fmt: skip
                    decoders[spec.model_id] = old_decoders[spec.model_id]
                    if was is not None:
                        models[spec.model_id] = was
                    changes.kept.append(spec.model_id)
                    continue
                else:  # same counts, other thresholds, metrics, budget or paths: the state carries over
                    changes.updated.append(spec.model_id)
                decoders[spec.model_id] = self._decoder(spec)
                if not self._owned(spec):
                    continue
                fresh = self._monitored(spec, decoders[spec.model_id])
                if was is not None and spec.model_id in changes.updated:
                    fresh.store.restore(was.store.state())
                models[spec.model_id] = fresh
            changes.removed = [model_id for model_id in old_specs if model_id not in decoders]
            carried = set(changes.kept) | set(changes.updated)
            self.joins.forget_models(carried.__contains__, given_up)
            if waited := self.attributes.forget_models(carried):  # predictions waiting for side records
                given_up["model_reconfigured"] += waited
            self.joins.horizon = config.label_horizon_seconds
            self.joins.max_pending = config.max_pending_labels
            self.pairs.horizon, self.pairs.max_pending = self.events.pair_horizon, config.max_pending_labels
            self.decoders = decoders
            self.models = models
            self.readers = self._readers()
        return changes, given_up
