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


def read(path: Path, layout: dict[str, Any]) -> tuple[dict[str, Any], dict[str, np.ndarray]] | None:
    """The checkpoint's metadata and arrays, None when there is none; CheckpointError when it does not fit."""
    if not path.exists():
        return None
    try:
        with np.load(path, allow_pickle=False) as data:
            arrays = {k: data[k] for k in data.files}
        meta = json.loads(str(arrays.pop("__meta__")))
    except (OSError, ValueError, KeyError) as exc:
        raise CheckpointError(f"{path}: unreadable checkpoint ({exc}); move it away to start with an empty "
                              "window") from exc  # fmt: skip
    if meta.get("version") != FORMAT_VERSION:
        raise CheckpointError(f"{path}: checkpoint format {meta.get('version')}, this version reads {FORMAT_VERSION}")
    written = meta.get("layout", {})
    if written != layout:
        differs = sorted(k for k in set(layout) | set(written) if layout.get(k) != written.get(k))
        raise CheckpointError(
            f"{path}: written for a different configuration ({', '.join(differs)} differ: checkpoint "
            f"{ {k: written.get(k) for k in differs} }, config { {k: layout.get(k) for k in differs} }). "
            "Counts of other groups or windows cannot be mixed: restore the config it was written with, "
            "or move the file away to start with an empty window."
        )
    return meta, arrays
