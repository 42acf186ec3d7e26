"""The checkpoint file: its format, its atomic write, and the checks that refuse a file that cannot be used (cut
short, edited, an array missing or of another shape, an offset no Kafka partition can have) in one line naming it,
before anything is restored from it (exporter/stream/state/checkpoint.py restores and writes it)."""

from __future__ import annotations

import json
import os
import re
import zipfile
from pathlib import Path
from typing import Any

import numpy as np

FORMAT_VERSION = 2
SINGLE_MODEL_VERSION = 1
FLEET_FILE = "fleet.checkpoint.npz"


class CheckpointError(RuntimeError):
    """A checkpoint exists but cannot be used; the message says why and what to do."""


def checkpoint_path(directory: str | Path, model_id: str) -> Path:
    """The checkpoint file of a daemon of one model (format 1) inside the configured directory."""
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


MOVE_AWAY = "move it away to start with an empty window"
MOST_PARTITION, MOST_OFFSET = 2**31 - 1, 2**63 - 1
"""The largest partition and offset Kafka's protocol carries (int32, int64): a checkpoint beyond them is refused
at start, not handed to a client that fails on every seek (which left the daemon retrying forever)."""


def _check_meta(meta: Any, keys: tuple[str, ...]) -> str | None:
    """What is wrong with a checkpoint's metadata, or None (a file edited or cut short fails here, not later)."""
    if not isinstance(meta, dict):
        return f"metadata is {type(meta).__name__}, not a mapping"
    missing = [key for key in ("version", *keys, "offsets", "written_at") if key not in meta]
    if missing:
        return f"metadata lacks {', '.join(missing)}"
    if "layout" in keys and not isinstance(meta["layout"], dict):
        return "layout is not a mapping"
    if "models" in keys and not (isinstance(meta["models"], dict) and all(
            isinstance(m, dict) and isinstance(m.get("layout"), dict) and isinstance(m.get("prefix"), str)
            for m in meta["models"].values())):  # fmt: skip
        return "models is not a mapping of model ids to their layout and array prefix"
    topic_ids = meta.get("topic_ids", {})
    if not (isinstance(topic_ids, dict) and all(isinstance(k, str) and isinstance(v, str)
                                                for k, v in topic_ids.items())):  # fmt: skip
        return "topic_ids is not a mapping of topics to their ids"
    offsets = meta["offsets"]
    if not (isinstance(offsets, list) and all(isinstance(o, list) and len(o) == 3 and isinstance(o[0], str)
                                                and all(isinstance(n, int) for n in o[1:]) for o in offsets)):
        return "offsets are not [topic, partition, offset] triples"
    wrong = [f"{t}[{p}] at {o}" for t, p, o in offsets if not (0 <= p <= MOST_PARTITION and 0 <= o <= MOST_OFFSET)]
    if wrong:
        return (f"offsets: {', '.join(wrong)}; a partition is 0 to {MOST_PARTITION:,} and an offset 0 to "
                f"{MOST_OFFSET:,} (Kafka's int32 and int64)")
    return None


def read(path: Path, version: int = FORMAT_VERSION) -> tuple[dict[str, Any], dict[str, np.ndarray]] | None:
    """The checkpoint's metadata and arrays, None when there is none; CheckpointError when it cannot be read."""
    if not path.exists():
        return None
    try:
        with np.load(path, allow_pickle=False) as data:
            arrays = {k: data[k] for k in data.files}
        meta = json.loads(str(arrays.pop("__meta__")))
    except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile, AttributeError) as exc:
        # AttributeError: np.load of a bare .npy array (not an archive) has no .files
        raise CheckpointError(f"{path}: unreadable checkpoint ({type(exc).__name__}: {exc}); {MOVE_AWAY}") from exc
    if isinstance(meta, dict) and meta.get("version") != version and "version" in meta:
        raise CheckpointError(f"{path}: checkpoint format {meta['version']}, expected {version} here; "
                              f"{MOVE_AWAY}")  # fmt: skip
    problem = _check_meta(meta, ("models",) if version == FORMAT_VERSION else ("layout",))
    if problem:
        raise CheckpointError(f"{path}: unusable checkpoint ({problem}); {MOVE_AWAY}")
    return meta, arrays


def unusable(path: Path, problem: str) -> CheckpointError:
    return CheckpointError(f"{path}: unusable checkpoint ({problem}); {MOVE_AWAY}")


SHAPED = ("counts", "bucket_ids", "totals", "head", "score_counts", "score_sums", "proxy_counts", "proxy_evidence",
          "segment_counts", "segment_bucket_ids", "segment_head", "segment_overflow", "segment_missing")
"""A model's arrays whose shape and kind its layout fixes (the detectors' follow the detectors configured)."""
COUNTED = ("counts", "totals", "score_counts", "proxy_counts", "proxy_evidence", "segment_counts", "segment_overflow",
           "segment_missing")
"""A model's arrays of counts, which no event makes negative."""
NEWLY_CONFIGURED = ("estimate_counts", "estimate_totals", "proxy_evidence")
"""Arrays a checkpoint may lack: estimation configured since it was written starts at 0; a proxy's evidence (counted
since 2026-12-04) as ``unrecorded`` predictions (ProxyRing.restore)."""


def check_arrays(path: Path, model_id: str, state: dict[str, np.ndarray], fresh: dict[str, np.ndarray]) -> None:
    """A model has every array its window store has (its detectors' included), of the shapes and kinds of its
    layout, and no negative count (an edited or mixed-up file fails here in one line, not with a traceback or a
    wrong number later)."""
    for key in fresh:
        if key not in state and key not in NEWLY_CONFIGURED:
            raise unusable(path, f"model {model_id}: its {key} array is missing")
    for key in SHAPED:
        if key not in fresh:
            continue
        got, want = state[key], fresh[key]
        if got.shape != want.shape or got.dtype.kind != want.dtype.kind:
            raise unusable(path, f"model {model_id}: its {key} array is {got.dtype}{list(got.shape)}, expected "
                                  f"{want.dtype}{list(want.shape)} for its layout")  # fmt: skip
    for key in COUNTED:
        if key in fresh and (low := state[key].min(initial=0)) < 0:
            raise unusable(path, f"model {model_id}: its {key} array holds {low}, and counts are 0 or more")
