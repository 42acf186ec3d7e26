"""A payload log's halves on the staged path: re-keyed as JSON to the join partition of their call id, in pieces when
one internal record cannot hold one, put together again and paired in that partition's join task.

A half the direct path counts may be as large as the payload limit (64 MiB unzipped), and an internal record stays
under the broker's record limit (:data:`~exporter.stream.stages.records.MAX_RECORD_BYTES`, real Kafka's default 1 MB,
which the daemon does not raise: it does not own the broker's or a managed cluster's settings). So a half whose JSON
is larger than :data:`MAX_HALF_BYTES` travels as PIECES rows, one a record, each at its source position times
2^:data:`PIECE_BITS` plus its index (a high-water mark of their own skips the pieces a join task already has when
the entry stage sends them again), and waits in the task's snapshot until its last piece is in: the same half, so
the same rows, as the direct path's. The re-keyed half leaves out the record's raw bytes: they serve dead letters,
which the staged path writes as it reads a record (a pair refused when its halves meet is counted only).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import replace
from typing import TYPE_CHECKING, Final

import numpy as np
import orjson

from exporter.stream.decode.payload import REFUSED_ROWS, UNMATCHED_REASONS, half_json, half_of
from exporter.stream.decode.platforms import Half
from exporter.stream.stages.records import (
    HEADER_ROOM,
    MAX_RECORD_BYTES,
    ROW_BITS,
    Kind,
    Record,
    codes_layout,
    codes_matrix,
    encode_rows,
    pending_rows,
    side_ids,
)

if TYPE_CHECKING:
    from exporter.stream.stages.tasks import JoinTask, Out

MAX_HALF_BYTES: Final = MAX_RECORD_BYTES - HEADER_ROOM - 1024
"""The largest half (as JSON) one HALVES row carries; a larger one travels in pieces of this size."""
PIECE_BITS: Final = 16
"""A piece's position: its half's source offset times 2^16 plus its index (65,536 pieces: 58 GB of JSON)."""


def rekeyed(half: Half) -> bytes:
    """A half as the JSON its join task reads (:func:`half_json`), without the record's raw bytes."""
    return orjson.dumps(half_json(replace(half, raw=None)))


def pieces_of(text: bytes, size: int = MAX_HALF_BYTES) -> list[str]:
    """``text`` (UTF-8) cut into strings of at most ``size`` bytes, never inside a character."""
    out, start = [], 0
    while start < len(text):
        stop = min(start + size, len(text))
        while stop < len(text) and text[stop] & 0xC0 == 0x80:  # a continuation byte: the cut moves back
            stop -= 1
        out.append(text[start:stop].decode())
        start = stop
    return out


def piece_rows(halves: list[tuple[int, int, bytes]]) -> tuple[dict[str, np.ndarray], list[str]]:
    """The PIECES rows of halves ``(source, offset, JSON)``: source, position, pieces (their half's count)."""
    source, position, count, texts = [], [], [], []
    for i, offset, text in halves:
        mine = pieces_of(text)
        source += [i] * len(mine)
        position += [(offset << PIECE_BITS) + j for j in range(len(mine))]
        count += [len(mine)] * len(mine)
        texts += mine
    return {"source": np.array(source, dtype=np.int32), "position": np.array(position, dtype=np.int64),
            "pieces": np.array(count, dtype=np.int32)}, texts  # fmt: skip


class Pieces:
    """The pieces of the halves a join task has in part, by their source (topic, partition, log) and offset."""

    def __init__(self) -> None:
        self.parts: dict[tuple[str, ...], list[str]] = {}

    def add(self, record: Record, keep: np.ndarray) -> list[str]:
        """Take a PIECES record's new pieces; the halves (as JSON) whose last piece this was."""
        whole = []
        a = record.arrays
        sources = record.sources
        for i, position, count, text, k in zip(a["source"].tolist(), a["position"].tolist(), a["pieces"].tolist(),
                                               record.ids, keep.tolist(), strict=True):  # fmt: skip
            if not k:
                continue
            topic, partition, log = sources[i]
            key = (topic, str(partition), log, str(position >> PIECE_BITS))
            parts = self.parts.setdefault(key, [])
            parts.append(text)
            if len(parts) == count:
                whole.append("".join(self.parts.pop(key)))
        return whole

    def state(self) -> dict[str, np.ndarray]:
        keys = list(self.parts)
        texts = [t.encode() for k in keys for t in self.parts[k]]
        return {"keys": np.array(["\x1f".join(k) for k in keys], dtype=str),
                "sizes": np.array([len(self.parts[k]) for k in keys], dtype=np.int64),
                "bytes": np.frombuffer(b"".join(texts), dtype=np.uint8),
                "lengths": np.array([len(t) for t in texts], dtype=np.int64)}  # fmt: skip

    def restore(self, state: dict[str, np.ndarray]) -> None:
        """What :meth:`state` wrote (none: a snapshot of a task that had no half in part)."""
        self.parts = {}
        if "keys" not in state:
            return
        data, at = state["bytes"].tobytes(), 0
        lengths = iter(state["lengths"].tolist())
        for key, size in zip(state["keys"].tolist(), state["sizes"].tolist(), strict=True):
            parts = self.parts[tuple(str(key).split("\x1f"))] = []
            for _ in range(size):
                n = next(lengths)
                parts.append(data[at : at + n].decode())
                at += n


def joined_calls(task: JoinTask, texts: list[str], offset: int) -> list[Out]:
    """Pair a join record's halves (as JSON) with those waiting; each joined call's rows as PREDICTIONS to its
    model's counts partition (and, when labels are read, as PENDING to the join partition of each row's id)."""
    now = task.clock()
    unmatched: Counter[str] = Counter()
    pairs: dict[str, list[tuple[Half, Half]]] = {}
    for text in texts:
        half = half_of(orjson.loads(text))
        if half.rows == REFUSED_ROWS:
            task.pairs.refuse(half.model or "", half.pair, now, unmatched)
            continue
        pair = task.pairs.add(half, now, unmatched)
        if pair is not None:
            pairs.setdefault(half.model or "", []).append(pair)
    out: list[Out] = []
    at = offset << ROW_BITS
    rejected, given_up = Counter[str](), Counter[str]()
    for model, mine in pairs.items():
        spec = task.spec_of(model)
        if spec is None or task.payload_rows is None:
            given_up["model_reconfigured"] += len(mine)
            continue
        batch, _ = task.payload_rows(model).batch(mine, now)  # refused pairs: counted, not dead-lettered here
        rejected.update(batch.rejected)
        n = len(batch)
        if not n:
            continue
        table: dict[str, np.ndarray] = {"source": np.zeros(n, dtype=np.int32),
                 "position": np.arange(at, at + n, dtype=np.int64), "timestamp": batch.timestamps,
                 "prediction": batch.predictions.astype(np.int8), "outcome": batch.outcomes.astype(np.int8),
                 "codes": codes_matrix(spec, batch.codes), "score": batch.scores}  # fmt: skip
        at += n
        meta = {"model": model, "layout": codes_layout(spec),
                "sources": [[*task.partition, task.logs.get(task.partition[0], "")]]}  # fmt: skip
        topic, partition = task.counts(model)
        out += [(topic, partition, model.encode(), v) for v in encode_rows(Kind.PREDICTIONS, meta, table,
                                                                            side_ids(spec, batch))]
        if task.pending_to is not None and not spec.sourced():  # else its counts task sends them, joined
            ids = [str(pid) for pid in batch.prediction_ids]
            where = task.pending_to(ids)
            for q, rows in ((q, np.flatnonzero(where == q)) for q in np.unique(where).tolist()):
                out += [(task.partition[0], q, None, v) for v in encode_rows(
                    Kind.PENDING, meta, pending_rows(table, rows), [ids[i] for i in rows.tolist()])]
    joined, unmatched_counter = task.health.payload_counters(UNMATCHED_REASONS)
    joined.inc(sum(map(len, pairs.values())))
    for reason, n in unmatched.items():
        unmatched_counter.labels(reason).inc(n)
    for reason, n in rejected.items():
        task.health.rejected.labels(reason).inc(n)
    task.health.count_outcomes(given_up)
    task.dirty = True
    return out
