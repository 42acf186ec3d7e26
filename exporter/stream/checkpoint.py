"""Durable checkpoints of the daemon's state: window counts, pending labels and the Kafka offsets they cover.

Written atomically (temp file, fsync, rename, fsync of the directory), so a crash leaves either the previous
checkpoint or the new one, never half of one. Offsets are committed to Kafka only after the checkpoint that
covers them is durable; on start the daemon resumes from the checkpoint's offsets, so an event is counted
exactly once across a crash. A checkpoint written under another layout (groups, windows, bucket) is refused.
"""

from __future__ import annotations

import json
import os
import re
import zipfile
from pathlib import Path
from typing import Any

import numpy as np

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
    with tmp.open("wb") as f:
        np.savez(f, __meta__=np.array(json.dumps({"version": FORMAT_VERSION, **meta})), **arrays)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
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
