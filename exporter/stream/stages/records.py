"""The records of the staged path's internal topics: compact, versioned binary, never above :data:`MAX_RECORD_BYTES`.

A record is ``b"FXI"``, a format version byte, a kind byte, the length of a JSON header (4 bytes, little-endian),
the header ``{"meta": {...}, "arrays": [[name, dtype, shape], ...]}``, then each array's bytes in that order.
Row tables (every array one row per event) are cut into as many records as the size limit needs, so a stage can
hand over a batch of any size; a snapshot is cut into chunks by :mod:`exporter.stream.stages.snapshots`.

Every row carries the position of the event it derives from in its source (a topic-partition offset; for a joined
label, the join record's offset and the row's index in it), so that a receiver can skip what it already applied; a
source is named by topic, partition and log (the topic's id: a re-created topic's positions start again at 0).

=============  =========  ================================================================================
kind           topic      meta; rows
=============  =========  ================================================================================
PREDICTIONS    counts     model, layout, sources; source, position, timestamp, prediction, outcome (inline
                          label or -1), codes (one column per attribute), score (empty without scores); for a
                          model with attribute_sources, ids (each row's side ids, :func:`side_ids`)
JOINED         counts     model, layout, sources; source, position, timestamp, outcome (TP/FP/TN/FN column),
                          codes, score (the prediction's, for its score bin and calibration; empty without)
PENDING        join       model, layout, sources; source, position, timestamp, prediction, codes, score (empty
                          without scores; absent from records written before it), ids (a model
                          with attribute_sources: from its counts task once joined, the source its counts
                          partition in a log of the replica's own, stages/sides.py, and origin: each row's
                          source record, :func:`origins`; one the join had from that record is skipped)
LABELS         join       sources; source, position, outcome (0/1), ids
HALVES         join       sources; source, position, ids (each a payload log's request or response as JSON,
                          exporter/stream/stages/halves.py rekeyed), to the join partition of its call id
PIECES         join       sources; source, position (offset * 2^16 + piece), pieces (how many), ids (a piece of
                          a half too large for a record, stages/halves.py), to the join partition of its call id
SNAPSHOT       both       task, partition, covers, id, chunk, chunks; data (bytes of one chunk)
=============  =========  ================================================================================
"""

from __future__ import annotations

import hashlib
import itertools
import struct
import zlib
from dataclasses import dataclass, field
from enum import IntEnum
from typing import Any, Final

import numpy as np
import orjson

from exporter.config import ModelSpec
from exporter.stream.decode.events import DecodedBatch
from exporter.stream.state.label_join import Joined, score_bits
from exporter.stream.state.window import WindowStore

MAGIC: Final = b"FXI"
VERSION: Final = 1
MAX_RECORD_BYTES: Final = 900_000
"""Real Kafka refuses records above 1 MB by default (message.max.bytes): every internal record stays below."""
ROW_BITS: Final = 20
"""A row a join task derives from a record (a joined outcome, a joined call's row) is at the offset of that record,
times 2^20, plus its index among the rows it derived (a record of at most 900 KB holds far fewer than 2^20 rows)."""
HEADER_ROOM: Final = 4096
"""What a row table's record keeps for its header when rows are fitted under the size limit."""
_PREFIX = struct.Struct("<3sBBI")


class Kind(IntEnum):
    PREDICTIONS = 1
    JOINED = 2
    PENDING = 3
    LABELS = 4
    SNAPSHOT = 5
    HALVES = 6
    PIECES = 7


class RecordError(ValueError):
    """Bytes that are not an internal record of a version this daemon reads."""


@dataclass
class Record:
    """One decoded internal record."""

    kind: Kind
    meta: dict[str, Any]
    arrays: dict[str, np.ndarray]
    ids: list[str] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.arrays["position"]) if "position" in self.arrays else 0

    @property
    def sources(self) -> list[tuple[str, int, str]]:
        """(topic, partition, log) of each source: the log is the topic's id ("" unknown), so that the positions
        of a re-created topic's new log are not taken for the old log's."""
        return [(str(t), int(p), str(log)) for t, p, log in self.meta.get("sources", [])]


def codes_layout(spec: ModelSpec) -> int:
    """What the codes of a model's rows mean (its attributes and their groups, in order): a receiver configured
    otherwise (a reload that reached the replicas one at a time) does not count them."""
    return zlib.crc32(orjson.dumps([[a.name, list(a.groups), *([a.proxy.method] if a.proxy else [])]
                                    for a in spec.attributes]))  # fmt: skip


def encode(kind: Kind, meta: dict[str, Any], arrays: dict[str, np.ndarray]) -> bytes:
    """One record (the caller keeps it under the size limit: :func:`encode_rows` does for row tables)."""
    contiguous = {name: np.ascontiguousarray(a) for name, a in arrays.items()}
    header = orjson.dumps({"meta": meta, "arrays": [[n, a.dtype.str, list(a.shape)] for n, a in contiguous.items()]})
    return b"".join([_PREFIX.pack(MAGIC, VERSION, int(kind), len(header)), header,
                     *(a.tobytes() for a in contiguous.values())])  # fmt: skip


def decode(value: bytes | None) -> Record:
    """The record in a message value; RecordError when it is none of this version."""
    if value is None or len(value) < _PREFIX.size:
        raise RecordError("not an internal record (too short)")
    magic, version, kind, length = _PREFIX.unpack_from(value)
    if magic != MAGIC:
        raise RecordError("not an internal record (no FXI prefix)")
    if version != VERSION:
        raise RecordError(f"internal record format {version}, this daemon reads {VERSION}")
    try:
        header = orjson.loads(value[_PREFIX.size : _PREFIX.size + length])
        at = _PREFIX.size + length
        arrays = {}
        for name, dtype, shape in header["arrays"]:
            count = int(np.prod(shape, dtype=np.int64))
            array = np.frombuffer(value, dtype=np.dtype(dtype), count=count, offset=at).reshape(shape)
            arrays[name] = array
            at += array.nbytes
        record = Record(Kind(kind), header["meta"], arrays)
    except (orjson.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
        raise RecordError(f"a corrupt internal record ({type(exc).__name__}: {exc})") from exc
    if "id_bytes" in arrays:
        data = arrays.pop("id_bytes").tobytes()
        ends = np.cumsum(arrays.pop("id_lengths")).tolist()
        record.ids = [data[start:end].decode() for start, end in zip([0, *ends], ends, strict=False)]
    return record


def encode_rows(kind: Kind, meta: dict[str, Any], rows: dict[str, np.ndarray], ids: list[str] | None = None,
                limit: int = MAX_RECORD_BYTES) -> list[bytes]:  # fmt: skip
    """A row table as records of at most ``limit`` bytes, in row order (``ids``: one string per row)."""
    n = len(rows["position"])
    encoded = [pid.encode() for pid in ids] if ids is not None else []
    widths = np.full(n, sum(a.dtype.itemsize * int(np.prod(a.shape[1:], dtype=np.int64)) for a in rows.values()
                            if len(a) == n), dtype=np.int64)  # fmt: skip
    if ids is not None:
        widths += np.fromiter(map(len, encoded), np.int64, n) + 4
    cuts = _cuts(widths, limit - HEADER_ROOM)
    out = []
    for start, stop in itertools.pairwise(cuts):
        arrays = {name: a[start:stop] if len(a) == n else a for name, a in rows.items()}
        if ids is not None:
            part = encoded[start:stop]
            arrays["id_bytes"] = np.frombuffer(b"".join(part), dtype=np.uint8)
            arrays["id_lengths"] = np.fromiter(map(len, part), np.int32, len(part))
        out.append(encode(kind, meta, arrays))
    return out


def _cuts(widths: np.ndarray, budget: int) -> list[int]:
    """Row indices that cut rows of these byte widths into runs of at most ``budget`` bytes (one row at least)."""
    cuts, start, total = [0], 0, np.cumsum(widths)
    while start < len(widths):
        base = total[start - 1] if start else 0
        stop = max(start + 1, int(np.searchsorted(total, base + budget, side="right")))
        cuts.append(stop)
        start = stop
    return cuts


def codes_matrix(spec: ModelSpec, codes: dict[str, np.ndarray]) -> np.ndarray:
    """A batch's codes as one int32 column per attribute (in the spec's order); int64 for a model with a proxy
    attribute, whose codes name a surname and a ZCTA (exporter/core/bisg.py Tables.codes)."""
    return np.column_stack([codes[a.name] for a in spec.attributes]).astype(codes_dtype(spec), copy=False)


def codes_dtype(spec: ModelSpec) -> type[np.signedinteger]:
    """The integer type of a model's codes on the internal topics."""
    return np.int64 if any(a.proxy for a in spec.attributes) else np.int32


def codes_columns(spec: ModelSpec, matrix: np.ndarray) -> dict[str, np.ndarray]:
    """The codes of a record's rows per attribute, as the window store counts them."""
    return {a.name: matrix[:, i].astype(np.int64) for i, a in enumerate(spec.attributes)}


def side_ids(spec: ModelSpec, batch: DecodedBatch) -> list[str] | None:
    """Each row's prediction id and its ids in the model's side sources (``attribute_sources``), one JSON array per
    row (the sources in the order of ``spec.sourced()``), for the join of its counts task (the sourced attributes'
    codes are -1 until then; a prediction waits for its label from there); None: the model has no source."""
    names = list(spec.sourced())
    if not names:
        return None
    return [orjson.dumps(ids).decode() for ids in zip(batch.prediction_ids, *(batch.side_ids[name] for name in names),
                                                      strict=True)]  # fmt: skip


def with_side_ids(spec: ModelSpec, batch: DecodedBatch, ids: list[str], origins: np.ndarray) -> DecodedBatch:
    """A batch rebuilt from a record (:func:`side_ids` inverted): its prediction ids, each with its row's
    :func:`origins` (:func:`tagged`: it goes where the prediction goes, through the attribute join's hold and the
    counts task's snapshot), and ``side_ids`` per source."""
    rows = [orjson.loads(text) for text in ids]
    batch.prediction_ids = [None if row[0] is None else tagged(row[0], o)
                            for row, o in zip(rows, origins.tolist(), strict=True)]  # fmt: skip
    batch.side_ids = {name: [row[k + 1] for row in rows] for k, name in enumerate(spec.sourced())}
    return batch


def origins(record: Record, keep: np.ndarray) -> np.ndarray:
    """The source record of each kept row (its topic, partition, log and position) as one nonzero int64, the first
    8 bytes of their BLAKE2b: the same on every counts task that derives a prediction from that row (a new owner's
    replay), another for another record of the same id (a prediction delivered again); two records of one id are
    taken for one once in 2^64."""
    sources = record.sources
    found = []
    for i, position in zip(record.arrays["source"][keep].tolist(), record.arrays["position"][keep].tolist(),
                           strict=True):  # fmt: skip
        digest = hashlib.blake2b("\x1f".join(map(str, (*sources[i], position))).encode(), digest_size=8).digest()
        found.append(int.from_bytes(digest, "little", signed=True) or 1)
    return np.array(found, dtype=np.int64)


def tagged(pid: object, origin: int) -> str:
    """A prediction id with its source record (:func:`origins`) in front, as 16 hex digits and a unit separator."""
    return f"{origin % 2**64:016x}\x1f{pid}"


def untagged(pid: object) -> tuple[str, int]:
    """(prediction id, source record) of :func:`tagged`; an id held before the source records were (a counts task's
    snapshot of an earlier version): itself, and 0 (none known)."""
    text = str(pid)
    if len(text) > 16 and text[16] == "\x1f" and all(c in "0123456789abcdef" for c in text[:16]):
        origin = int(text[:16], 16)
        return text[17:], origin - 2**64 if origin >= 2**63 else origin
    return text, 0


PENDING_COLUMNS: Final = ("source", "position", "timestamp", "prediction", "codes", "score", "origin")


def rows_at(rows: dict[str, np.ndarray], at: np.ndarray, n: int) -> dict[str, np.ndarray]:
    """The rows ``at`` (indices or a mask) of a row table of ``n`` rows; a column of another length (an empty
    score: a model without scores) is kept whole."""
    return {k: v[at] if len(v) == n else v for k, v in rows.items()}


def pending_rows(rows: dict[str, np.ndarray], at: np.ndarray) -> dict[str, np.ndarray]:
    """The PENDING columns of a row table's rows ``at``: a waiting prediction takes its score to its label (the
    score bin of the estimation and AUC counts, the calibration's sums), as the direct path's waiting ones do."""
    return rows_at({k: rows[k] for k in PENDING_COLUMNS if k in rows}, at, len(rows["position"]))


def waiting_codes(spec: ModelSpec, arrays: dict[str, np.ndarray], keep: np.ndarray) -> np.ndarray:
    """The codes a PENDING record's kept predictions wait with in the join: a model that emits scores keeps each
    score last, as its float64's bits (NaN from a record written without scores: its label joins without a bin)."""
    codes = arrays["codes"][keep].astype(np.int64)
    if spec.events.score_threshold is None:
        return codes
    score = arrays.get("score", np.zeros(0))
    scores = score[keep] if len(score) == len(keep) else np.full(int(keep.sum()), np.nan)
    return np.column_stack([codes, score_bits(scores)])


def joined_columns(spec: ModelSpec, rows: Joined) -> dict[str, np.ndarray]:
    """The codes and scores of a JOINED record (:func:`waiting_codes` split again)."""
    n = len(spec.attributes)
    score = np.ascontiguousarray(rows.codes[:, n]).view(np.float64) if rows.codes.shape[1] > n else np.zeros(0)
    return {"codes": rows.codes[:, :n].astype(codes_dtype(spec)), "score": score}


def joined_scores(spec: ModelSpec, store: WindowStore, arrays: dict[str, np.ndarray]
                  ) -> tuple[np.ndarray | None, np.ndarray | None]:  # fmt: skip
    """``add_joined``'s score bins and scores of a JOINED record's rows (None, None without scores)."""
    scores = arrays.get("score", np.zeros(0))
    if not len(scores):
        return None, None
    bins = store.estimate_bins(scores)
    if bins is not None:
        bins = np.where(np.isnan(scores), -1, bins)
    return bins, scores if spec.calibrates else None
