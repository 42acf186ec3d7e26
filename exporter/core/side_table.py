"""A side table of protected attribute values by entity id (``attribute_sources:``), in bounded memory.

Kafka Streams' KTable semantics: the latest record of an id wins, and a tombstone (None) deletes it. The gate fills
one from a dataset, the daemon from a compacted topic; both look up each row's id through :meth:`SideTable.get`,
so a prediction meets the same values on every path.

A record is in force from its time (the side record's Kafka timestamp, or a dataset row's ``timestamp`` column, loaded
by :meth:`SideTable.load` as :meth:`SideTable.put` in time order; none: always), as in Kafka Streams' versioned
stream-table joins: a row looks up the version in force at its own event time, and a row older than every
version of its id takes the first one, if it came within the horizon. The versions of an id are held in the order
of their times whatever order their records come in (a record older than the current version, come later in the
topic, takes its place among the replaced ones: a backfill, or two producers whose times interleave), so the daemon
holds what the gate holds from the same rows. So a correction applies to the predictions made after it, whatever
order the topics are read in (a restart that reads a correction before replaying older predictions counts them as
the first run did). The version a correction replaced is kept while a prediction of its time may still be read
(:meth:`SideTable.forget_before`); a tombstone removes every version of its id.

An id is held as a 64-bit hash of its UTF-8 text (:func:`id_hashes`), and a record as one small code per field
(the index of its value among the values seen for that field, 0 for none) and the second it starts: a sorted
``uint64`` array, a ``uint16`` matrix and a ``uint32`` array, with recent writes in a dict merged in when it grows,
so that 10^7 ids of two fields take about 160 MB instead of the gigabytes a dict of dicts would. Two ids collide with
probability about n^2 / 2^65 (3e-6 at 10^7 ids). Values stay in the process: the table holds codes and the values'
vocabulary, never a log line.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Mapping, Sequence
from typing import Final

import numpy as np

from exporter.core.encoding import code_table, value_text

MAX_VALUES: Final = 4096
"""Distinct values kept per field: a demographic field has a handful; a field that holds one value per person (a
name sent by mistake) stops growing here, and its further values read as missing (the daemon counts them
``too_many_values``; the gate refuses such a dataset: exporter/gate/data/side.py)."""
MERGE_BEFORE_READ: Final = 256
"""Recent writes a lookup reads beside the sorted arrays; more are merged in first."""
_MIX: Final = (np.uint64(0xFF51AFD7ED558CCD), np.uint64(0xC4CEB9FE1A85EC53))
_SEED: Final = np.uint64(0x9E3779B97F4A7C15)


def id_text(value: object) -> str | int | None:
    """An id as the table keys it (a Kafka key's UTF-8 text): a number as :func:`value_text` writes it; None for a
    missing id (or an object or list, which names no id)."""
    if value is None or isinstance(value, dict | list):
        return None
    return value if isinstance(value, str | int) and not isinstance(value, bool) else value_text(value)


def _fmix(h: np.ndarray) -> np.ndarray:
    h = h ^ (h >> np.uint64(33))
    h = h * _MIX[0]
    h = h ^ (h >> np.uint64(33))
    h = h * _MIX[1]
    return h ^ (h >> np.uint64(33))


def id_hashes(ids: Sequence[str | int]) -> np.ndarray:
    """64-bit hashes of ids' UTF-8 text (an int: its decimal text), vectorised over the batch: each id's bytes 8 at
    a time, then its length, so that an id hashes the same in every batch.

    >>> h = id_hashes(["a-1", "a-2", "a-1", "a-1-and-more"]); bool(h[0] == h[2]), bool(h[0] == h[1])
    (True, False)
    >>> bool(id_hashes(["a-1"])[0] == h[0]), bool(id_hashes([17])[0] == id_hashes(["17"])[0])
    (True, True)
    """
    n = len(ids)
    if not n:
        return np.zeros(0, dtype=np.uint64)
    try:
        fixed = np.array(ids, dtype=np.bytes_)  # ASCII text and ints, in one pass in C
    except UnicodeEncodeError:
        fixed = np.array([i.encode() if isinstance(i, str) else str(i).encode() for i in ids], dtype=np.bytes_)
    words = (fixed.dtype.itemsize + 7) // 8
    lengths = np.char.str_len(fixed).astype(np.uint64)
    matrix = fixed.astype(f"S{words * 8}").view("<u8").reshape(n, words)
    h = np.full(n, _SEED, dtype=np.uint64)
    for j in range(words):
        mixed = _fmix(h ^ matrix[:, j])
        h = mixed if j == 0 else np.where(lengths > 8 * j, mixed, h)  # only the words within each id
    return _fmix(h ^ lengths)


class SideTable:
    """Records of one source by id hash: the latest wins, a tombstone deletes; at most ``max_records`` ids."""

    def __init__(self, fields: Sequence[str], max_records: int) -> None:
        self.fields = tuple(fields)
        self.max_records = max_records
        self.keys = np.zeros(0, dtype=np.uint64)
        self.codes = np.zeros((0, len(self.fields)), dtype=np.uint16)
        self.since = np.zeros(0, dtype=np.uint32)
        """The second each id's record is in force from (its time, rounded up; 0: always)."""
        self._shift = np.uint64(64)
        self._directory = np.zeros(2, dtype=np.int64)
        """Where the keys of each value of a hash's top bits begin (about 8 keys apart): a lookup searches only
        among its own few keys, a handful of vectorised steps instead of a binary search of the whole table."""
        self.previous: dict[int, list[tuple[tuple[int, ...], int]]] = {}
        """The versions corrections replaced (codes, since), oldest first, per id, each until
        :meth:`forget_before` drops it (one kept alone let a third version lose the first: a prediction older
        than it took the second)."""
        self.values: list[list[str]] = [[] for _ in self.fields]
        """Per field, the values seen (code i + 1 is values[i]); in the process and its checkpoint only."""
        self._value_codes: list[dict[str, int]] = [{} for _ in self.fields]
        self._recent: dict[int, tuple[tuple[int, ...], int] | None] = {}
        """Writes since the last merge (None: deleted), read before the sorted arrays."""
        self.size = 0

    def __len__(self) -> int:
        return self.size

    def nbytes(self) -> int:
        """Bytes of the sorted arrays (the bulk of the table once merged)."""
        return self.keys.nbytes + self.codes.nbytes + self.since.nbytes + self._directory.nbytes

    def encode(self, record: Mapping[str, object], problems: dict[str, int]) -> tuple[int, ...]:
        """A record's code per field (0: the field is missing, null, or past :data:`MAX_VALUES`)."""
        out = []
        for k, name in enumerate(self.fields):
            value = record.get(name)
            if value is None:
                out.append(0)
                continue
            text = value if isinstance(value, str) else value_text(value)
            code = self._value_codes[k].get(text)
            if code is None:
                if len(self.values[k]) >= MAX_VALUES:
                    problems["too_many_values"] = problems.get("too_many_values", 0) + 1
                    out.append(0)
                    continue
                self.values[k].append(text)
                code = self._value_codes[k][text] = len(self.values[k])
            out.append(code)
        return tuple(out)

    def _current(self, key: int) -> tuple[tuple[int, ...], int] | None:
        if key in self._recent:
            return self._recent[key]
        at = int(np.searchsorted(self.keys, np.uint64(key)))
        if at < len(self.keys) and int(self.keys[at]) == key:
            return tuple(int(c) for c in self.codes[at]), int(self.since[at])
        return None

    def put(self, key: int, codes: tuple[int, ...] | None, time: float = 0.0) -> bool:
        """Write one record (None: a tombstone) in force from ``time`` (epoch seconds; 0: always), among its id's
        versions by time, whatever order the records come in; False when it is a new id and the table is full."""
        held = self._current(key)
        if codes is not None and held is None and self.size >= self.max_records:
            return False
        since = math.ceil(max(time, 0.0))
        if codes is not None and held is not None and since < held[1]:
            self._keep_earlier(key, (codes, since))
            return True
        self.size += (codes is not None) - (held is not None)
        if codes is None:
            self.previous.pop(key, None)
        elif held is not None and held[1] < since:
            self.previous.setdefault(key, []).append(held)
        self._recent[key] = None if codes is None else (codes, since)
        if len(self._recent) > max(65536, len(self.keys) // 4):
            self.merge()
        return True

    def _keep_earlier(self, key: int, version: tuple[tuple[int, ...], int]) -> None:
        """A version in force from before the id's current one, come late (a backfill, or producers whose times
        interleave): among the replaced versions at its time, in place of one of the same second (the later to
        come wins, as for the current one), so the versions stay in time order whatever order they came in.
        :meth:`forget_before` bounds them as any replaced version."""
        versions = self.previous.setdefault(key, [])
        at = bisect.bisect_left(versions, version[1], key=lambda v: v[1])
        if at < len(versions) and versions[at][1] == version[1]:
            versions[at] = version
        else:
            versions.insert(at, version)

    def forget_before(self, time: float) -> None:
        """Drop the replaced versions whose successor is in force since before ``time``: no prediction read from
        now on is older (it would be late, and dropped)."""
        if not self.previous:
            return
        hashes = np.fromiter(self.previous, np.uint64, len(self.previous))
        found, _, since = self._lookup(hashes)
        for key, current, in_force in zip(hashes.tolist(), found.tolist(), since.tolist(), strict=True):
            versions = self.previous[key]
            # a version stays while its successor came in force at ``time`` or later
            successors = [s for _, s in versions[1:]] + [in_force if current else -1]
            kept = [v for v, s in zip(versions, successors, strict=True) if s >= time]
            if kept:
                self.previous[key] = kept
            else:
                del self.previous[key]

    def load(self, hashes: np.ndarray, codes: np.ndarray, times: np.ndarray | None = None) -> bool:
        """Write many records at once, as :meth:`put` of each in order would (a later record of an id wins); False
        when the ids would be more than ``max_records`` (nothing is written then).

        With ``times`` (epoch seconds), as :meth:`put` of these records and the versions already held, each id's in
        the order of the seconds they are in force from and, within a second, as they came (held ones first): a
        dataset loaded a batch at a time then holds what a topic of its rows in time order leaves in the table."""
        if times is not None:
            return self._load_versions(hashes, codes, np.ceil(np.maximum(times, 0.0)).astype(np.int64))
        last = len(hashes) - 1 - np.unique(hashes[::-1], return_index=True)[1]  # each id's last record
        self.merge()
        at = np.searchsorted(self.keys, hashes[last])
        held = at < len(self.keys)
        held[held] = self.keys[at[held]] == hashes[last][held]
        if self.size + int((~held).sum()) > self.max_records:
            return False
        self.codes[at[held]] = codes[last][held]
        self.since[at[held]] = 0
        self._insert(at[~held], hashes[last[~held]], codes[last[~held]], np.zeros(int((~held).sum()), np.uint32))
        return True

    def _load_versions(self, hashes: np.ndarray, codes: np.ndarray, since: np.ndarray) -> bool:
        """:meth:`load` with each record's second: the held versions of its ids and the records, sorted by id, second
        and arrival; the last of each (id, second) is a version, the last of each id the current one."""
        self.merge()
        ids = np.sort(hashes)
        ids = ids[np.append(True, ids[1:] != ids[:-1])]  # the distinct ids (np.unique hashes uint64 slowly)
        at = np.searchsorted(self.keys, ids)
        held = at < len(self.keys)
        held[held] = self.keys[at[held]] == ids[held]
        if self.size + int((~held).sum()) > self.max_records:
            return False
        kept: list[tuple[int, tuple[tuple[int, ...], int]]] = []
        if self.previous:  # the versions these ids' corrections replaced, oldest first (np.isin is slower)
            replaced, mine = np.sort(np.fromiter(self.previous, np.uint64, len(self.previous))), ids[held]
            mine = mine[replaced[np.minimum(np.searchsorted(replaced, mine), len(replaced) - 1)] == mine]
            kept = [(k, v) for k in mine.tolist() for v in self.previous.pop(k)]
        keys = np.concatenate([np.array([k for k, _ in kept], np.uint64), ids[held], hashes])
        rows = np.vstack([np.array([v[0] for _, v in kept], np.uint16).reshape(len(kept), len(self.fields)),
                          self.codes[at[held]], codes.astype(np.uint16)])  # fmt: skip
        seconds = np.concatenate([np.array([v[1] for _, v in kept], np.int64),
                                  self.since[at[held]].astype(np.int64), since])  # fmt: skip
        order = np.lexsort((seconds, keys))  # a stable sort: within an (id, second), as they came
        keys, rows, seconds = keys[order], rows[order], seconds[order]
        version = np.ones(len(keys), bool)  # the last record of each (id, second)
        version[:-1] = (keys[1:] != keys[:-1]) | (seconds[1:] != seconds[:-1])
        keys, rows, seconds = keys[version], rows[version], seconds[version]
        current = np.ones(len(keys), bool)
        current[:-1] = keys[1:] != keys[:-1]
        for k, row, second in zip(keys[~current].tolist(), rows[~current].tolist(), seconds[~current].tolist(),
                                  strict=True):  # fmt: skip
            self.previous.setdefault(k, []).append((tuple(row), second))
        self.codes[at[held]] = rows[current][held]
        self.since[at[held]] = seconds[current][held]
        self._insert(at[~held], ids[~held], rows[current][~held], seconds[current][~held].astype(np.uint32))
        return True

    def _insert(self, at: np.ndarray, keys: np.ndarray, codes: np.ndarray, since: np.ndarray) -> None:
        """Insert new ids' records at their sorted positions ``at`` (the ids' insertion points, in order)."""
        self.keys = np.insert(self.keys, at, keys)
        self.codes = np.insert(self.codes, at, codes.astype(np.uint16), axis=0)
        self.since = np.insert(self.since, at, since)
        self._index()
        self.size = len(self.keys)

    def encode_column(self, field: str, values: Sequence[object], problems: dict[str, int]) -> np.ndarray:
        """The code of each distinct value of a field (:meth:`encode`'s codes, ``problems`` counted as it counts
        them), then 0 for a missing cell (index -1 of a column's distinct values)."""
        return np.array([*(self.encode({field: v}, problems)[self.fields.index(field)] if field in self.fields
                           else 0 for v in values), 0], dtype=np.uint16)  # fmt: skip

    def merge(self) -> None:
        """Fold the recent writes into the sorted arrays."""
        if not self._recent:
            return
        written = np.fromiter(self._recent.keys(), np.uint64, len(self._recent))
        at = np.searchsorted(self.keys, written)
        found = at < len(self.keys)
        found[found] = self.keys[at[found]] == written[found]
        keep = np.ones(len(self.keys), dtype=bool)
        keep[at[found]] = False
        live = [(k, v) for k, v in self._recent.items() if v is not None]
        keys, codes, since = self.keys[keep], self.codes[keep], self.since[keep]
        new = np.fromiter((k for k, _ in live), np.uint64, len(live))
        rows = np.array([v[0] for _, v in live], dtype=np.uint16).reshape(len(live), len(self.fields))
        starts = np.array([v[1] for _, v in live], dtype=np.uint32)
        order = np.argsort(new)
        new, rows, starts = new[order], rows[order], starts[order]
        where = np.searchsorted(keys, new)
        self.keys = np.insert(keys, where, new)
        self.codes = np.insert(codes, where, rows, axis=0)
        self.since = np.insert(since, where, starts)
        self._recent = {}
        self._index()

    def _index(self) -> None:
        """Rebuild :attr:`_directory` after the keys changed."""
        bits = max(0, len(self.keys).bit_length() - 3)
        self._shift = np.uint64(64 - bits)
        starts = np.arange(1 << bits, dtype=np.uint64) << np.uint64(64 - bits) if bits else np.zeros(1, np.uint64)
        self._directory = np.append(np.searchsorted(self.keys, starts), len(self.keys)).astype(np.int64)

    def _positions(self, hashes: np.ndarray) -> np.ndarray:
        """Each hash's insertion point among the keys: a binary search within its directory range, all at once."""
        top = (hashes >> self._shift).astype(np.int64) if self._shift < 64 else np.zeros(len(hashes), np.int64)
        lo, hi = self._directory[top], self._directory[top + 1]
        last = len(self.keys) - 1
        while (active := lo < hi).any():
            mid = (lo + hi) >> 1
            right = active & (self.keys[np.minimum(mid, last)] < hashes)
            lo = np.where(right, mid + 1, lo)
            hi = np.where(active & ~right, mid, hi)
        return lo

    def _lookup(self, hashes: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The current version of each id hash: whether one is held, its codes and since (zeros where none)."""
        if len(self._recent) > MERGE_BEFORE_READ:
            self.merge()  # one O(n) merge, rather than a look at the recent writes for every row read
        n = len(hashes)
        if not len(self.keys):
            codes, since, found = np.zeros((n, len(self.fields)), np.uint16), np.zeros(n, np.int64), np.zeros(n, bool)
        else:
            at = np.minimum(self._positions(hashes), len(self.keys) - 1)
            found = self.keys[at] == hashes
            codes, since = self.codes[at], self.since[at].astype(np.int64)
            if not found.all():
                codes[~found], since[~found] = 0, 0
        if self._recent:  # the writes since the last merge override: only the rows they hit are visited
            hit = np.flatnonzero(np.isin(hashes, np.fromiter(self._recent, np.uint64, len(self._recent))))
            for i, key in zip(hit.tolist(), hashes[hit].tolist(), strict=True):
                recent = self._recent[key]
                found[i] = recent is not None
                codes[i], since[i] = recent if recent is not None else (0, 0)
        return found, codes, since

    def get(self, hashes: np.ndarray, times: np.ndarray | None = None,
            horizon: float = math.inf) -> tuple[np.ndarray, np.ndarray, np.ndarray]:  # fmt: skip
        """For each id hash (and the event time of its row; None: now): whether a version applies, its codes (zeros
        where none), and whether the id's records all came later than ``horizon`` after the row (never joined).

        The version in force at the row's time; for a row older than every version, the first one."""
        found, codes, since = self._lookup(hashes)
        if times is None:
            return found, codes, np.zeros(len(hashes), dtype=bool)
        times = np.asarray(times)
        if self.previous:  # only rows older than their id's current version may need one it replaced
            for i in np.flatnonzero(found & (since > times)).tolist():
                versions = self.previous.get(int(hashes[i]))
                if versions:  # the latest in force at the row's time, else the first
                    earlier = next((v for v in reversed(versions) if v[1] <= times[i]), versions[0])
                    codes[i], since[i] = earlier[0], earlier[1]
        beyond = found & (since > times + horizon)
        if beyond.any():
            found, codes = found & ~beyond, np.where(beyond[:, None], 0, codes).astype(np.uint16)
        return found, codes, beyond

    def lut(self, field: str, groups: Sequence[str], other: bool) -> np.ndarray:
        """Group code of each value code of a field (code 0, and values outside the groups: the unknown code)."""
        table, unknown = code_table(groups, other)
        return np.array([unknown, *(table.get(v, unknown) for v in self.values[self.fields.index(field)])],
                        dtype=np.int64)  # fmt: skip

    def state(self) -> dict[str, np.ndarray]:
        """Arrays for a checkpoint (recent writes merged first)."""
        self.merge()
        previous = [(k, v) for k, versions in self.previous.items() for v in versions]  # oldest first per id
        out: dict[str, np.ndarray] = {
            "keys": self.keys, "codes": self.codes, "since": self.since,
            "previous_keys": np.array([k for k, _ in previous], dtype=np.uint64),
            "previous_codes": np.array([v[0] for _, v in previous], dtype=np.uint16).reshape(len(previous),
                                                                                             len(self.fields)),
            "previous_since": np.array([v[1] for _, v in previous], dtype=np.uint32)}  # fmt: skip
        for k, values in enumerate(self.values):
            encoded = [v.encode() for v in values]
            out[f"values{k}_bytes"] = np.frombuffer(b"".join(encoded), dtype=np.uint8)
            out[f"values{k}_lengths"] = np.array([len(e) for e in encoded], dtype=np.int64)
        return out

    def restore(self, state: Mapping[str, np.ndarray]) -> None:
        """Load what :meth:`state` produced for the same fields."""
        self.keys = state["keys"].astype(np.uint64)
        self.codes = state["codes"].astype(np.uint16).reshape(len(self.keys), len(self.fields))
        self.since = state["since"].astype(np.uint32)
        self.previous = {}
        for k, codes, since in zip(state["previous_keys"].tolist(), state["previous_codes"],
                                   state["previous_since"].tolist(), strict=True):  # fmt: skip
            self.previous.setdefault(int(k), []).append((tuple(int(c) for c in codes), int(since)))
        self.size, self._recent = len(self.keys), {}
        self._index()
        for k in range(len(self.fields)):
            data = state[f"values{k}_bytes"].tobytes()
            ends = np.cumsum(state[f"values{k}_lengths"]).tolist()
            self.values[k] = [data[a:b].decode() for a, b in zip([0, *ends], ends, strict=False)]
            self._value_codes[k] = {v: i + 1 for i, v in enumerate(self.values[k])}
