"""Durable checkpoints of the daemon's state: every model's window counts and detectors, the pending labels and
the Kafka offsets they cover, in one file.

Written atomically (temp file, fsync, rename, fsync of the directory), so a crash leaves either the previous
checkpoint or the new one, never half of one. Offsets are committed to Kafka only after the checkpoint that
covers them is durable; on start the daemon resumes from the checkpoint's offsets, so an event is counted
exactly once across a crash. A model whose layout (groups, windows, bucket, ...) differs from the one it was written
under starts afresh, as it does on a reload; the other models keep their state, and the state it had is kept on
disk in a dated file beside the checkpoint (:meth:`Checkpointer.keep`), said in one log line and counted in
``fairness_exporter_model_resets_total``. A file that cannot be used (cut short, edited, an array missing or of
another shape) stops the start with one line naming it. A checkpoint of a daemon of
one model (format 1, ``<model_id>.checkpoint.npz``) is read into the fleet's when the config has that model alone.
A window head ahead of the clock by more than ``max_future_skew`` (written while the clock ran ahead) is brought
back to now (:meth:`WindowStore.follow`); predictions and labels waiting in the join of a checkpoint restored
without ``kafka.labels_topic`` are given up (``model_reconfigured``): nothing would ever join or expire them.
"""

from __future__ import annotations

import logging
import os
import shutil
from collections import Counter
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np

from exporter.config import Config, layout, layout_changes
from exporter.health.counters import Health
from exporter.stream.kafka.client import Offsets, Partition
from exporter.stream.state.checkpoint_file import (
    FLEET_FILE,
    FORMAT_VERSION,
    MOVE_AWAY,
    SINGLE_MODEL_VERSION,
    CheckpointError,
    check_arrays,
    checkpoint_path,
    read,
    unusable,
    write,
)
from exporter.stream.state.fleet import Fleet

__all__ = ["FLEET_FILE", "FORMAT_VERSION", "CheckpointError", "Checkpointer", "checkpoint_path", "read", "write"]

log = logging.getLogger(__name__)


class Checkpointer:
    """The stream state's offsets book and its checkpoint file: restores the state on start, writes it on a
    schedule and on demand (before partitions are handed over, at shutdown), and says which offsets are counted
    and which are durable (only those may be committed to Kafka). Without a configured path nothing is written
    and the counted offsets are the committable ones."""

    def __init__(self, config: Config, fleet: Fleet, health: Health, clock: Callable[[], float]) -> None:
        self.fleet = fleet
        self.health = health
        self.clock = clock
        self.directory = Path(config.checkpoint_path) if config.checkpoint_path else None
        self.path = self.directory / FLEET_FILE if self.directory is not None else None
        self.topic_ids: dict[str, str] = {}
        self._durable: Offsets = {}
        self._migrated: Path | None = None
        """A single-model checkpoint read into the fleet's, renamed once the fleet's is durable."""

    def restore(self) -> None:
        """Load the checkpoint, if there is one (CheckpointError when it exists but cannot be used)."""
        if self.path is None or self.directory is None:
            return
        loaded = read(self.path)
        if loaded is None:
            loaded = self._single_model()
            if loaded is None:
                log.info("no checkpoint at %s: starting with an empty window", self.path)
                return
        meta, arrays = loaded
        source = self._migrated or self.path
        try:
            restored, resets, given_up = self._restore(meta, arrays, source)
        except CheckpointError:
            raise
        except Exception as exc:  # any other damage: one line, never a traceback
            raise unusable(source, f"{type(exc).__name__}: {exc}") from exc
        self.health.count_outcomes(given_up)
        if resets:
            self.keep(resets, source)
        self.topic_ids.update(meta.get("topic_ids", {}))
        log.info("restored checkpoint %s written at %s: %d of %d models, %d partitions, %d pending predictions",
                 source, meta["written_at"], len(restored), len(self.fleet.models), len(meta["offsets"]),
                 len(self.fleet.joins.pending))  # fmt: skip

    def _restore(self, meta: dict[str, Any], arrays: dict[str, np.ndarray],
                 source: Path) -> tuple[set[str], dict[str, tuple[str, str]], Counter[str]]:  # fmt: skip
        """Load the state of every model whose layout is the config's; (restored, reset ones with the layout keys
        that changed and how, labels given up)."""
        offsets = {(t, int(p)): int(o) for t, p, o in meta["offsets"]}
        fleet, given_up, now = self.fleet, Counter[str](), self.clock()
        windowing = fleet.config.windowing
        with fleet.lock:
            restored, resets = set(), {}
            for model_id, monitored in fleet.models.items():
                written = meta["models"].get(model_id)
                if written is None:
                    continue
                changed = layout_changes(written["layout"], layout(monitored.spec, windowing))
                if changed is not None:
                    resets[model_id] = changed
                    continue
                prefix = written["prefix"]
                state = {k[len(prefix):]: v for k, v in arrays.items() if k.startswith(prefix)}
                check_arrays(source, model_id, state, monitored.store.state())
                monitored.store.restore(state)
                monitored.store.follow(now)  # a head the clock is far behind is not trusted
                restored.add(model_id)
            fleet.joins.restore({k[len("join."):]: v for k, v in arrays.items() if k.startswith("join.")},
                                meta.get("single_model"))  # fmt: skip
            fleet.joins.forget_models(restored.__contains__, given_up)
            if not fleet.config.kafka.labels_topic and (fleet.joins.pending or fleet.joins.orphans):
                log.warning("the checkpoint holds %d predictions waiting for labels and %d labels waiting for their "
                            "predictions, and no kafka.labels_topic is configured to join them: given up "
                            "(model_reconfigured)", len(fleet.joins.pending), len(fleet.joins.orphans))  # fmt: skip
                fleet.joins.give_up(given_up)
            fleet.pairs.restore({k[len("pairs."):]: v for k, v in arrays.items() if k.startswith("pairs.")})
            offsets = self._restore_sides(arrays, offsets, restored, given_up)
            fleet.offsets = dict(offsets)
            self._durable = dict(offsets)
        return restored, resets, given_up

    # --- attribute_sources: side tables (exporter/stream/state/attribute_join.py) ---------------------------------

    def _restore_sides(self, arrays: dict[str, np.ndarray], offsets: Offsets, restored: set[str],
                       given_up: Counter[str]) -> Offsets:  # fmt: skip
        """Restore the side tables and the predictions waiting for them (those of a model not restored, or waiting
        for a source no longer configured, are counted as ``model_reconfigured``); the offsets without those of a
        side topic whose table was not kept (its fields changed, or it is new), which is then read again from its
        start."""
        attributes = self.fleet.attributes
        if not attributes:
            return offsets
        kept, dropped = attributes.restore({k[len("side."):]: v for k, v in arrays.items() if k.startswith("side.")})
        if dropped := dropped + attributes.forget_models(restored):
            given_up["model_reconfigured"] += dropped
        again = {s.topic for name, s in attributes.sources.items() if name not in kept}
        if again & {t for t, _ in offsets}:
            log.warning("side topic(s) %s are read again from their start: the checkpoint's tables hold other "
                        "fields", ", ".join(sorted(t for t in again if t)))  # fmt: skip
        return {p: o for p, o in offsets.items() if p[0] not in again}

    # --- end of attribute_sources ------------------------------------------------------------------------------

    def kept_path(self) -> Path:
        """A new dated name beside the checkpoint for a state set aside (``fleet.checkpoint.<UTC time>.npz``)."""
        assert self.path is not None
        stamp = datetime.fromtimestamp(self.clock(), UTC).strftime("%Y%m%dT%H%M%SZ")
        path, n = self.path.with_name(f"{FLEET_FILE.removesuffix('.npz')}.{stamp}.npz"), 1
        while path.exists():
            n += 1
            path = self.path.with_name(f"{FLEET_FILE.removesuffix('.npz')}.{stamp}-{n}.npz")
        return path

    def keep(self, resets: Mapping[str, tuple[str, str]], source: Path | None = None) -> Path | None:
        """Models start afresh because their layout changed (``resets``: model id -> :func:`layout_changes`): keep
        the state
        they had in a dated file beside the checkpoint (``source``: the file read at start, linked; else the
        state now, written), count each in ``fairness_exporter_model_resets_total{reason}``, and say so in one
        line. Without checkpoints there is no file to keep: the line says that their counts are dropped. OSError
        when the file cannot be written (nothing counted: the caller keeps the models as they are)."""
        models = "; ".join(f"{model_id} ({differs})" for model_id, (_, differs) in resets.items())
        if self.path is None:
            self._count_resets(resets)
            log.warning("models reset (their layout changed): %s; no checkpoint file keeps state (checkpoint.path "
                        "unset, or kafka.stages: staged), so their previous counts are dropped", models)  # fmt: skip
            return None
        kept = self.kept_path()
        if source is not None:
            try:
                os.link(source, kept)  # the file as read, before the next checkpoint replaces it
            except OSError:
                shutil.copy2(source, kept)
        else:
            meta, arrays, _ = self.snapshot()
            write(kept, meta, arrays)
        self._count_resets(resets)
        log.warning("models reset (their layout changed): %s; their previous state is kept in %s (to resume it, "
                    "stop, restore the config it was written with and move that file to %s)", models, kept,
                    self.path)  # fmt: skip
        return kept

    def _count_resets(self, resets: Mapping[str, tuple[str, str]]) -> None:
        for model_id, (reason, _) in resets.items():
            self.health.model_resets.labels(model_id, reason).inc()

    def _single_model(self) -> tuple[dict[str, Any], dict[str, np.ndarray]] | None:
        """The checkpoint of a daemon of one model (format 1) in the fleet's form; CheckpointError when the config
        has several models (each such file has offsets of its own daemon's, which cannot be merged exactly)."""
        assert self.directory is not None
        models = list(self.fleet.models)
        found = [m for m in models if checkpoint_path(self.directory, m).exists()]
        if not found:
            return None
        if len(models) > 1:
            names = ", ".join(checkpoint_path(self.directory, m).name for m in found)
            raise CheckpointError(f"{self.directory}: {names} {'was' if len(found) == 1 else 'were'} written by a "
                                  f"daemon of one model; a daemon of several keeps one checkpoint ({FLEET_FILE}), "
                                  "and offsets of separate daemons cannot be merged exactly: start once with that "
                                  f"model alone to carry its state over, or {MOVE_AWAY}")  # fmt: skip
        path = checkpoint_path(self.directory, found[0])
        loaded = read(path, SINGLE_MODEL_VERSION)
        assert loaded is not None
        meta, arrays = loaded
        join_keys = ("pending_", "orphan_")
        self._migrated = path
        return ({**meta, "models": {found[0]: {"layout": meta["layout"], "prefix": ""}}, "single_model": found[0]},
                {**{k: v for k, v in arrays.items() if not k.startswith(join_keys)},
                 **{f"join.{k}": v for k, v in arrays.items() if k.startswith(join_keys)}})  # fmt: skip

    def counted(self) -> Offsets:
        return self.fleet.offsets_copy()

    def starts(self, partitions: list[Partition], committed: Offsets | None) -> Offsets:
        """After the last record this process counted, else (left out) the group's committed offset."""
        counted = self.counted()
        return {p: counted[p] for p in partitions if p in counted}

    def committable(self) -> Offsets:
        if self.path is None:
            return self.counted()
        with self.fleet.lock:
            return dict(self._durable)

    def forget(self, partitions: list[Partition]) -> None:
        with self.fleet.lock:
            self.fleet.forget_offsets(partitions)
            for partition in partitions:
                self._durable.pop(partition, None)

    def restart(self, topic: str, topic_id: str | None, partitions: list[Partition]) -> None:
        with self.fleet.lock:
            old = [p for p in self.fleet.offsets_copy() if p[0] == topic] if topic_id != self.topic_ids.get(topic) \
                else partitions  # fmt: skip
            self.forget(old)
            for partition in partitions:
                self.fleet.advance_offset(partition, 0)
            if topic_id is not None:
                self.topic_ids[topic] = topic_id

    def resume_at(self, partition: Partition, offset: int) -> None:
        with self.fleet.lock:
            self.fleet.advance_offset(partition, offset)
            if partition in self._durable:  # nothing beyond the log's end is committed
                self._durable[partition] = min(self._durable[partition], offset)

    def snapshot(self) -> tuple[dict[str, Any], dict[str, np.ndarray], Offsets]:
        """A checkpoint's metadata and arrays of the state now, and the offsets they cover."""
        fleet = self.fleet
        with fleet.lock:
            models, arrays = {}, {}
            for i, (model_id, monitored) in enumerate(fleet.models.items()):
                prefix = f"m{i}."
                models[model_id] = {"layout": layout(monitored.spec, fleet.config.windowing), "prefix": prefix}
                arrays.update({prefix + k: v for k, v in monitored.store.state().items()})
            arrays.update({f"join.{k}": v for k, v in fleet.joins.state(self.clock()).items()})
            if fleet.attributes:  # attribute_sources: the side tables and the predictions waiting for them
                arrays.update({f"side.{k}": v for k, v in fleet.attributes.state(self.clock()).items()})
            if fleet.pairs.pending or fleet.pairs.done:  # payload formats: the calls' halves waiting
                arrays.update({f"pairs.{k}": v for k, v in fleet.pairs.state().items()})
            offsets, topic_ids = fleet.offsets_copy(), dict(self.topic_ids)  # of one log each (see restart)
        meta = {"models": models, "written_at": self.clock(), "topic_ids": topic_ids,
                "offsets": [[t, p, o] for (t, p), o in offsets.items()]}  # fmt: skip
        return meta, arrays, offsets

    def write(self) -> Offsets:
        """Write a durable checkpoint of every model's counts, the pending predictions and the offsets; return the
        offsets it covers. Raises what the file system raises (counted in ``checkpoint_failures``)."""
        assert self.path is not None
        fleet = self.fleet
        meta, arrays, offsets = self.snapshot()
        written_at = meta["written_at"]
        try:
            write(self.path, meta, arrays)
        except Exception:
            self.health.checkpoint_failures.inc()
            raise
        with fleet.lock:
            held = fleet.offsets_copy()  # a partition forgotten while the file was written stays forgotten
            self._durable = {p: o for p, o in offsets.items() if p in held}
        self.health.last_checkpoint.set(written_at)
        if self._migrated is not None:
            migrated, self._migrated = self._migrated, None
            migrated.rename(migrated.with_name(migrated.name + ".migrated"))
            log.info("the state of %s now lives in %s (renamed to %s.migrated)", migrated.name, self.path.name,
                     migrated.name)  # fmt: skip
        return offsets

    def flush(self) -> None:
        """Write a checkpoint now if checkpoints are configured; a failure is counted and logged, not raised."""
        if self.path is None:
            return
        try:
            self.write()
        except Exception as exc:
            log.error("checkpoint %s failed (%s: %s); offsets stay uncommitted until one succeeds", self.path,
                      type(exc).__name__, exc)  # fmt: skip
