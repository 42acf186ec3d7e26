"""Inline snapshots: the state of a task (a join or counts partition) written into its own partition.

A task that has consumed its partition up to offset X writes its state as a compressed npz cut into chunks of at
most :data:`CHUNK_BYTES`, each a SNAPSHOT record stamped (task, covers X, snapshot id, chunk i of n), and commits X
once every chunk is acknowledged. A task assigned at committed offset X reads forward from X, collecting the chunks
of a snapshot whose ``covers`` is X (other snapshots are ignored: one written later and never committed, or its
own new ones) and buffering the data records it reads meanwhile; once a snapshot is whole it restores it and
applies the buffered records in order. Nothing here needs compaction, commit metadata or transactions.
"""

from __future__ import annotations

import io
import json
import math
import uuid
from dataclasses import dataclass, field
from typing import Any, Final

import numpy as np

from exporter.stream.stages.records import HEADER_ROOM, MAX_RECORD_BYTES, Kind, Record, encode

FORMAT_VERSION: Final = 1
CHUNK_BYTES: Final = MAX_RECORD_BYTES - HEADER_ROOM


def pack(meta: dict[str, Any], arrays: dict[str, np.ndarray]) -> bytes:
    """A task's state as the bytes of one compressed npz (metadata as JSON inside it, as in a checkpoint)."""
    buffer = io.BytesIO()
    contents: dict[str, Any] = {"__meta__": np.array(json.dumps({"version": FORMAT_VERSION, **meta})), **arrays}
    np.savez_compressed(buffer, **contents)
    return buffer.getvalue()


def unpack(data: bytes) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """What :func:`pack` made (ValueError when it is not a snapshot of this format)."""
    with np.load(io.BytesIO(data), allow_pickle=False) as npz:
        arrays = {k: npz[k] for k in npz.files}
    meta = json.loads(str(arrays.pop("__meta__")))
    if meta.get("version") != FORMAT_VERSION:
        raise ValueError(f"snapshot format {meta.get('version')}, this daemon reads {FORMAT_VERSION}")
    return meta, arrays


def chunks(task: str, partition: int, covers: int, data: bytes, limit: int = CHUNK_BYTES) -> list[bytes]:
    """A snapshot's SNAPSHOT records, each at most ``limit`` bytes of state (one at least)."""
    n = max(1, math.ceil(len(data) / limit))
    snapshot = uuid.uuid4().hex
    return [encode(Kind.SNAPSHOT, {"task": task, "partition": partition, "covers": covers, "id": snapshot,
                                   "chunk": i, "chunks": n},
                   {"data": np.frombuffer(data[i * limit : (i + 1) * limit], dtype=np.uint8)})
            for i in range(n)]  # fmt: skip


@dataclass
class Restoring:
    """A task's search for the snapshot that covers its committed offset, and the data records read meanwhile."""

    covers: int
    buffered: list[tuple[int, Record]] = field(default_factory=list)
    """(offset, record) of the data records read since the committed offset, in order."""
    _parts: dict[str, dict[int, bytes]] = field(default_factory=dict)

    def offer(self, record: Record) -> bytes | None:
        """Take a SNAPSHOT record; the whole snapshot's bytes once its last chunk is in, else None."""
        meta = record.meta
        if meta.get("covers") != self.covers:
            return None
        parts = self._parts.setdefault(str(meta["id"]), {})
        parts[int(meta["chunk"])] = record.arrays["data"].tobytes()
        if len(parts) < int(meta["chunks"]):
            return None
        return b"".join(parts[i] for i in range(int(meta["chunks"])))

    @property
    def chunks_seen(self) -> int:
        return sum(map(len, self._parts.values()))
