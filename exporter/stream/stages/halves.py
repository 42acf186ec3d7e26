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
from typing import Final

import numpy as np
import orjson

from exporter.stream.payloads.payload import half_json
from exporter.stream.payloads.platforms import Half
from exporter.stream.stages.records import (
    HEADER_ROOM,
    MAX_RECORD_BYTES,
    Record,
)

MAX_HALF_BYTES: Final = MAX_RECORD_BYTES - HEADER_ROOM - 1024
"""The largest half (as JSON) one HALVES row carries; a larger one travels in pieces of this size."""
PIECE_BITS: Final = 16
"""A piece's position: its half's source offset times 2^16 plus its index (65,536 pieces: 58 GB of JSON)."""
PIECE_REASONS: Final = ("pieces_missing",)
"""Why a half in pieces was never counted, beside the pair join's reasons (``pending_state_full`` among them):
its pieces did not all come within ``events.pair_horizon``."""


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
    """The pieces of the halves a join task has in part, by their source (topic, partition, log) and offset.

    A half whose other pieces never come (a piece record unreadable, or gone with the topic's retention; an entry
    stage that read its record again under a config that ignores it) is given up as the pair join gives up a half:
    after ``events.pair_horizon``, counted under ``pieces_missing``; and at most as many halves are in part as the
    task's pair join holds halves, the oldest given up first (``pending_state_full``): a half's pieces come one
    after the other, so a half in part for long is one whose pieces stopped."""

    def __init__(self) -> None:
        self.parts: dict[tuple[str, ...], list[str]] = {}
        self.since: dict[tuple[str, ...], float] = {}
        """When each half in part had its first piece (in that order: the oldest first)."""

    def add(self, record: Record, keep: np.ndarray, now: float, most: int, unmatched: Counter[str]) -> list[str]:
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
            parts = self.parts.get(key)
            if parts is None:
                while self.parts and len(self.parts) >= most:
                    self._give_up(next(iter(self.parts)), "pending_state_full", unmatched)
                parts = self.parts[key] = []
                self.since[key] = now
            parts.append(text)
            if len(parts) == count:
                whole.append("".join(self.parts.pop(key)))
                del self.since[key]
        return whole

    def expire(self, now: float, horizon: float, unmatched: Counter[str]) -> None:
        """Give up the halves whose first piece came more than ``horizon`` seconds ago."""
        for key in [k for k, at in self.since.items() if at < now - horizon]:
            self._give_up(key, "pieces_missing", unmatched)

    def _give_up(self, key: tuple[str, ...], reason: str, unmatched: Counter[str]) -> None:
        del self.parts[key], self.since[key]
        unmatched[reason] += 1

    def state(self) -> dict[str, np.ndarray]:
        keys = list(self.parts)
        texts = [t.encode() for k in keys for t in self.parts[k]]
        return {"keys": np.array(["\x1f".join(k) for k in keys], dtype=str),
                "sizes": np.array([len(self.parts[k]) for k in keys], dtype=np.int64),
                "since": np.array([self.since[k] for k in keys], dtype=np.float64),
                "bytes": np.frombuffer(b"".join(texts), dtype=np.uint8),
                "lengths": np.array([len(t) for t in texts], dtype=np.int64)}  # fmt: skip

    def restore(self, state: dict[str, np.ndarray], now: float) -> None:
        """What :meth:`state` wrote (none: a snapshot of a task that had no half in part); a half written without
        the time of its first piece (before pieces expired) waits from ``now``."""
        self.parts, self.since = {}, {}
        if "keys" not in state:
            return
        data, at = state["bytes"].tobytes(), 0
        lengths = iter(state["lengths"].tolist())
        keys, sizes = state["keys"].tolist(), state["sizes"].tolist()
        since = state["since"].tolist() if "since" in state else [now] * len(keys)
        for key, size, first in zip(keys, sizes, since, strict=True):
            mine = tuple(str(key).split("\x1f"))
            parts = self.parts[mine] = []
            self.since[mine] = float(first)
            for _ in range(size):
                n = next(lengths)
                parts.append(data[at : at + n].decode())
                at += n
