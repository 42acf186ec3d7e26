"""Durable checkpoints of the daemon's state: window counts, pending labels and the Kafka offsets they cover.

Written atomically (temp file, fsync, rename, fsync of the directory), so a crash leaves either the previous
checkpoint or the new one, never half of one. Offsets are committed to Kafka only after the checkpoint that
covers them is durable; on start the daemon resumes from the checkpoint's offsets, so an event is counted
exactly once across a crash. A checkpoint written under another layout (groups, windows, bucket) is refused.
"""

from __future__ import annotations

import json
import logging
import os
import re
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from exporter.config import Config
from exporter.serve.self_metrics import Health
from exporter.stream.client import Offsets, Partition
from exporter.stream.label_join import OutcomeJoin
from exporter.stream.window import WindowStore

log = logging.getLogger(__name__)

FORMAT_VERSION = 1


class CheckpointError(RuntimeError):
    """A checkpoint exists but cannot be used; the message says why and what to do."""


def checkpoint_path(directory: str | Path, model_id: str) -> Path:
    """The checkpoint file of a model inside the configured directory."""
    return Path(directory) / f"{re.sub(r'[^A-Za-z0-9_.-]', '_', model_id)}.checkpoint.npz"


def write(path: Path, meta: dict[str, Any], arrays: dict[str, np.ndarray]) -> None:
    """Atomically replace the checkpoint at path."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    try:
        with tmp.open("wb") as f:
            contents: dict[str, Any] = {"__meta__": np.array(json.dumps({"version": FORMAT_VERSION, **meta})), **arrays}
            np.savez(f, **contents)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)  # a full or read-only disk must not leave half a checkpoint behind
        raise
    fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


_MOVE_AWAY = "move it away to start with an empty window"


def _check_meta(meta: Any) -> str | None:
    """What is wrong with a checkpoint's metadata, or None (a file edited or cut short fails here, not later)."""
    if not isinstance(meta, dict):
        return f"metadata is {type(meta).__name__}, not a mapping"
    missing = [key for key in ("version", "layout", "offsets", "written_at") if key not in meta]
    if missing:
        return f"metadata lacks {', '.join(missing)}"
    if not isinstance(meta["layout"], dict):
        return "layout is not a mapping"
    offsets = meta["offsets"]
    if not (isinstance(offsets, list) and all(isinstance(o, list) and len(o) == 3 and isinstance(o[0], str)
                                                and all(isinstance(n, int) for n in o[1:]) for o in offsets)):
        return "offsets are not [topic, partition, offset] triples"
    return None


def read(path: Path, layout: dict[str, Any]) -> tuple[dict[str, Any], dict[str, np.ndarray]] | None:
    """The checkpoint's metadata and arrays, None when there is none; CheckpointError when it does not fit."""
    if not path.exists():
        return None
    try:
        with np.load(path, allow_pickle=False) as data:
            arrays = {k: data[k] for k in data.files}
        meta = json.loads(str(arrays.pop("__meta__")))
    except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile, AttributeError) as exc:
        # AttributeError: np.load of a bare .npy array (not an archive) has no .files
        raise CheckpointError(f"{path}: unreadable checkpoint ({type(exc).__name__}: {exc}); {_MOVE_AWAY}") from exc
    problem = _check_meta(meta)
    if problem:
        raise CheckpointError(f"{path}: unusable checkpoint ({problem}); {_MOVE_AWAY}")
    if meta["version"] != FORMAT_VERSION:
        raise CheckpointError(f"{path}: checkpoint format {meta['version']}, this version reads {FORMAT_VERSION}; "
                              f"{_MOVE_AWAY}")  # fmt: skip
    written = meta["layout"]
    if written != layout:
        differs = sorted(k for k in set(layout) | set(written) if layout.get(k) != written.get(k))
        raise CheckpointError(
            f"{path}: written for a different configuration ({', '.join(differs)} differ: checkpoint "
            f"{ {k: written.get(k) for k in differs} }, config { {k: layout.get(k) for k in differs} }). "
            "Counts of other groups or windows cannot be mixed: restore the config it was written with, "
            "or move the file away to start with an empty window."
        )
    return meta, arrays


class Checkpointer:
    """The stream state's offsets book and its checkpoint file: restores the state on start, writes it on a
    schedule and on demand (before partitions are handed over, at shutdown), and says which offsets are counted
    and which are durable (only those may be committed to Kafka). Without a configured path nothing is written
    and the counted offsets are the committable ones."""

    def __init__(self, config: Config, store: WindowStore, joins: OutcomeJoin, health: Health,
                 clock: Callable[[], float]) -> None:  # fmt: skip
        self.config = config
        self.store = store
        self.joins = joins
        self.health = health
        self.clock = clock
        self.path = checkpoint_path(config.checkpoint_path, config.model_id) if config.checkpoint_path else None
        self.topic_ids: dict[str, str] = {}
        self._durable: Offsets = {}

    def restore(self) -> None:
        """Load the checkpoint, if there is one (CheckpointError when it exists but cannot be used)."""
        if self.path is None:
            return
        loaded = read(self.path, self.config.layout())
        if loaded is None:
            log.info("no checkpoint at %s: starting with an empty window", self.path)
            return
        meta, arrays = loaded
        offsets = {(t, int(p)): int(o) for t, p, o in meta["offsets"]}
        with self.store.lock:
            self.store.restore(arrays, offsets)
            self.joins.restore(arrays)
            self._durable = dict(offsets)
        self.topic_ids.update(meta.get("topic_ids", {}))
        log.info("restored checkpoint %s written at %s: %d partitions, %d pending predictions", self.path,
                 meta["written_at"], len(offsets), len(self.joins.pending))  # fmt: skip

    def counted(self) -> Offsets:
        return self.store.offsets_copy()

    def committable(self) -> Offsets:
        if self.path is None:
            return self.counted()
        with self.store.lock:
            return dict(self._durable)

    def forget(self, partitions: list[Partition]) -> None:
        with self.store.lock:
            self.store.forget_offsets(partitions)
            for partition in partitions:
                self._durable.pop(partition, None)

    def restart(self, topic: str, topic_id: str | None, partitions: list[Partition]) -> None:
        with self.store.lock:
            old = [p for p in self.store.offsets_copy() if p[0] == topic] if topic_id != self.topic_ids.get(topic) \
                else partitions  # fmt: skip
            self.forget(old)
            for partition in partitions:
                self.store.advance_offset(partition, 0)
            if topic_id is not None:
                self.topic_ids[topic] = topic_id

    def write(self) -> Offsets:
        """Write a durable checkpoint of the counts, pending predictions and offsets; return the offsets it covers.
        Raises what the file system raises (counted in ``checkpoint_failures``)."""
        assert self.path is not None
        with self.store.lock:
            arrays = {**self.store.state(), **self.joins.state()}
            offsets, topic_ids = self.store.offsets_copy(), dict(self.topic_ids)  # of one log each (see restart)
        written_at = self.clock()
        meta = {"layout": self.config.layout(), "written_at": written_at, "topic_ids": topic_ids,
                "offsets": [[t, p, o] for (t, p), o in offsets.items()]}  # fmt: skip
        try:
            write(self.path, meta, arrays)
        except Exception:
            self.health.checkpoint_failures.inc()
            raise
        with self.store.lock:
            held = self.store.offsets_copy()  # a partition forgotten while the file was written stays forgotten
            self._durable = {p: o for p, o in offsets.items() if p in held}
        self.health.last_checkpoint.set(written_at)
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
