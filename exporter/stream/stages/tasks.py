"""The staged path's stateful tasks: one per partition of an internal topic that this replica holds.

A :class:`JoinTask` holds the label join of one ``.join`` partition (the same :class:`OutcomeJoin` as the direct
path) and sends each joined outcome to its model's ``.counts`` partition; with a payload log it also pairs the
halves of the calls whose id falls on its partition (the direct path's :class:`PairJoin`), and sends each joined
call's rows on as predictions (the halves too large for one record put together first: stages/halves.py). The
:class:`Task` base is also the counts task's (stages/counts.py). Every task skips rows whose source position it
already applied (a high-water mark per source), so a stage that re-reads its input after a crash or a rebalance
never counts twice; each restores from and writes inline snapshots (exporter/stream/stages/snapshots.py).
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Callable, Iterable
from typing import Any

import numpy as np
import orjson

from exporter.config import ModelSpec
from exporter.health.counters import Health, StageHealth
from exporter.stream.kafka.client import Partition
from exporter.stream.payloads.payload import REFUSED_ROWS, UNMATCHED_REASONS, PairJoin, PayloadRows, half_of
from exporter.stream.payloads.platforms import Half
from exporter.stream.stages.halves import PIECE_REASONS, Pieces
from exporter.stream.stages.records import (
    ROW_BITS,
    Kind,
    Record,
    codes_layout,
    codes_matrix,
    encode_rows,
    joined_columns,
    pending_rows,
    side_ids,
    waiting_codes,
)
from exporter.stream.stages.snapshots import Restoring
from exporter.stream.state.label_join import Joined, OutcomeJoin

log = logging.getLogger(__name__)

Out = tuple[str, int, bytes | None, bytes]
"""A record to send: topic, partition, key, value."""
_REASONS = (*UNMATCHED_REASONS, *PIECE_REASONS)
"""Why a payload half was never counted on the staged path: the pair join's reasons and those of halves in pieces."""
Source = tuple[str, ...]
"""What a high-water mark is kept for: (topic, partition) of a source, with the model first in a counts task."""


class Task:
    """What every task shares: its position in its partition, its snapshot search, its high-water marks."""

    stage: str = ""

    def __init__(self, partition: Partition, start: int, stage_health: StageHealth) -> None:
        self.partition = partition
        self.consumed = start
        """The next offset to read in the partition."""
        self.fetched = False
        """Whether a batch of it was read since the assignment (before, a client's cached log end may be stale)."""
        self.covered: int | None = None
        """The offset the last acknowledged snapshot covers: what may be committed."""
        self.restoring: Restoring | None = Restoring(start) if start else None
        self.dirty = False
        """Data applied since the last snapshot."""
        self.snapshot_at = time.monotonic()
        """When its last snapshot was written (time.monotonic)."""
        self.hwm: dict[Source, int] = {}
        self.stage_health = stage_health

    def fresh(self, record: Record, prefix: Source = ()) -> np.ndarray:
        """Which rows of a record are beyond their source's high-water mark (and move the marks past them)."""
        source, position = record.arrays["source"], record.arrays["position"]
        keep = np.ones(len(position), dtype=bool)
        for i, (topic, partition, log_id) in enumerate(record.sources):
            rows = source == i
            if not rows.any():
                continue
            key = (*prefix, topic, str(partition), log_id)
            mark = self.hwm.get(key, -1)
            keep[rows] = position[rows] >= mark
            self.hwm[key] = max(mark, int(position[rows].max()) + 1)
        skipped = int((~keep).sum())
        if skipped:
            self.stage_health.replayed.labels(self.stage).inc(skipped)
        return keep

    def hwm_arrays(self) -> dict[str, np.ndarray]:
        keys = sorted(self.hwm)
        return {"hwm_keys": np.array(["\x1f".join(k) for k in keys], dtype=str),
                "hwm_marks": np.array([self.hwm[k] for k in keys], dtype=np.int64)}  # fmt: skip

    def restore_hwm(self, arrays: dict[str, np.ndarray]) -> None:
        self.hwm = {tuple(str(k).split("\x1f")): int(m) for k, m in zip(arrays["hwm_keys"].tolist(),
                                                                       arrays["hwm_marks"].tolist(), strict=True)}

    def apply(self, record: Record, offset: int) -> list[Out]:
        raise NotImplementedError

    def state(self) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
        raise NotImplementedError

    def restore(self, meta: dict[str, Any], arrays: dict[str, np.ndarray]) -> None:
        raise NotImplementedError


class JoinTask(Task):
    """The label join of one ``.join`` partition."""

    stage = "join"

    def __init__(self, partition: Partition, start: int, stage_health: StageHealth, health: Health,
                 join: OutcomeJoin, spec_of: Callable[[str], ModelSpec | None], counts: Callable[[str], Partition],
                 clock: Callable[[], float], logs: dict[str, str], pairs: PairJoin | None = None,
                 payload_rows: Callable[[str], PayloadRows] | None = None,
                 pending_to: Callable[[list[str]], np.ndarray] | None = None) -> None:  # fmt: skip
        super().__init__(partition, start, stage_health)
        self.pairs = pairs or PairJoin(0.0)
        """The payload formats' halves of calls whose id falls on this partition, waiting for their partner."""
        self.pieces = Pieces()
        """The halves too large for one record (stages/halves.py) of which some pieces are in."""
        self.payload_rows = payload_rows
        self.pending_to = pending_to
        """The join partition of each prediction id, when delayed labels are read (a joined call's rows wait)."""
        self.logs = logs
        """Each topic's id (the log this partition's offsets, the joined outcomes' positions, are in)."""
        self.join = join
        self.health = health
        self.spec_of = spec_of
        self.counts = counts
        """The counts partition of a model."""
        self.clock = clock

    def apply(self, record: Record, offset: int) -> list[Out]:
        """Hold a PENDING record's predictions or join a LABELS record's outcomes; the joined outcomes to send."""
        # a model's predictions and the labels have marks of their own: rows of several models from one source
        # partition interleave, each model's in order
        if record.kind is Kind.HALVES:
            return self._calls([t for t, k in zip(record.ids, self.fresh(record, ("payload",)).tolist(), strict=True)
                                if k], offset)  # fmt: skip
        if record.kind is Kind.PIECES:
            unmatched: Counter[str] = Counter()
            whole = self.pieces.add(record, self.fresh(record, ("pieces",)), self.clock(), self.pairs.max_pending,
                                    unmatched)  # fmt: skip
            return self._calls(whole, offset, unmatched)
        model = str(record.meta.get("model", ""))
        keep = self.fresh(record, (model,) if record.kind is Kind.PENDING else ())
        sent = record.arrays.get("origin")  # a counts task's joined predictions (attribute_sources), by their record
        if sent is not None:
            keep = self._sent_again(record, sent, keep)
        a = record.arrays
        given_up: Counter[str] = Counter()
        joined: dict[str, Joined] = {}
        if record.kind is Kind.PENDING:
            spec = self.spec_of(model)
            if spec is None or codes_layout(spec) != record.meta["layout"]:
                given_up["model_reconfigured"] += int(keep.sum())
            else:
                ids = [pid for pid, k in zip(record.ids, keep.tolist(), strict=True) if k]
                found = self.join.add_predictions(model, ids, a["timestamp"][keep], a["prediction"][keep].astype(
                    np.int64), waiting_codes(spec, a, keep), given_up,
                    origins=None if sent is None else sent[keep])  # fmt: skip
                if found is not None:
                    joined[model] = found
        elif record.kind is Kind.LABELS:
            ids = [pid for pid, k in zip(record.ids, keep.tolist(), strict=True) if k]
            now = self.clock()
            label_time = record.meta.get("label_time")  # absent from records written before the labels' clock
            if keep.any() or not len(keep):  # rows read again (below the high-water mark) are of an earlier time
                topic, partition, _ = record.sources[0]
                self.join.labels_read((topic, partition), float(label_time) if label_time else None, now)
            if not len(keep):
                return []  # the labels' timestamp alone: no state of the snapshot changed
            joined = self.join.add_outcomes(ids, a["outcome"][keep].astype(np.int64).tolist(), now, given_up)
        out = self._joined(joined, offset, given_up)
        self.health.count_outcomes(given_up)
        self.dirty = True
        return out

    def _sent_again(self, record: Record, sent: np.ndarray, keep: np.ndarray) -> np.ndarray:
        """A counts task's joined predictions (attribute_sources): those this join has had from the same source
        record are a new owner's replay (its side table releases them at other times than its predecessor's, so no
        position of the counts task's own log names them alike), skipped as replayed rows; another record of an id
        held is a prediction delivered again, as on the direct path."""
        at = np.flatnonzero(keep)
        again = self.join.again([record.ids[i] for i in at.tolist()], sent[at])
        if again.any():
            keep = keep.copy()
            keep[at[again]] = False
            self.stage_health.replayed.labels(self.stage).inc(int(again.sum()))
        return keep

    def _joined(self, joined: dict[str, Joined], offset: int, given_up: Counter[str]) -> list[Out]:
        out: list[Out] = []
        at = offset << ROW_BITS
        for model, rows in joined.items():
            spec = self.spec_of(model)
            if spec is None:  # removed by a reload since its prediction was held
                given_up["model_reconfigured"] += len(rows)
                continue
            topic, partition = self.counts(model)
            table: dict[str, np.ndarray] = {"source": np.zeros(len(rows), dtype=np.int32),
                     "position": np.arange(at, at + len(rows), dtype=np.int64), "timestamp": rows.timestamps,
                     "outcome": rows.outcomes.astype(np.int8), **joined_columns(spec, rows)}  # fmt: skip
            at += len(rows)
            meta = {"model": model, "layout": codes_layout(spec),
                    "sources": [[*self.partition, self.logs.get(self.partition[0], "")]]}  # fmt: skip
            out += [(topic, partition, model.encode(), v) for v in encode_rows(Kind.JOINED, meta, table)]
        return out

    def _calls(self, texts: list[str], offset: int, unmatched: Counter[str] | None = None) -> list[Out]:
        """Pair a join record's halves (as JSON) with those waiting; each joined call's rows as PREDICTIONS to its
        model's counts partition (and, when labels are read, as PENDING to the join partition of each row's id);
        ``unmatched``: halves already given up (in pieces)."""
        now = self.clock()
        unmatched = Counter(unmatched)
        pairs: dict[str, list[tuple[Half, Half]]] = {}
        for text in texts:
            half = half_of(orjson.loads(text))
            if half.rows == REFUSED_ROWS:
                self.pairs.refuse(half.model or "", half.pair, now, unmatched)
                continue
            pair = self.pairs.add(half, now, unmatched)
            if pair is not None:
                pairs.setdefault(half.model or "", []).append(pair)
        out: list[Out] = []
        at = offset << ROW_BITS
        rejected, given_up = Counter[str](), Counter[str]()
        for model, mine in pairs.items():
            spec = self.spec_of(model)
            if spec is None or self.payload_rows is None:
                given_up["model_reconfigured"] += len(mine)
                continue
            batch, _ = self.payload_rows(model).batch(mine, now)  # refused pairs: counted, not dead-lettered here
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
                    "sources": [[*self.partition, self.logs.get(self.partition[0], "")]]}  # fmt: skip
            topic, partition = self.counts(model)
            out += [(topic, partition, model.encode(), v) for v in encode_rows(Kind.PREDICTIONS, meta, table,
                                                                                side_ids(spec, batch))]
            if self.pending_to is not None and not spec.sourced():  # else its counts task sends them, joined
                ids = [str(pid) for pid in batch.prediction_ids]
                where = self.pending_to(ids)
                for q, rows in ((q, np.flatnonzero(where == q)) for q in np.unique(where).tolist()):
                    out += [(self.partition[0], q, None, v) for v in encode_rows(
                        Kind.PENDING, meta, pending_rows(table, rows), [ids[i] for i in rows.tolist()])]
        joined, unmatched_counter = self.health.payload_counters(_REASONS)
        joined.inc(sum(map(len, pairs.values())))
        for reason, n in unmatched.items():
            unmatched_counter.labels(reason).inc(n)
        for reason, n in rejected.items():
            self.health.rejected.labels(reason).inc(n)
        self.health.count_outcomes(given_up)
        self.dirty = True
        return out

    def state(self) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
        pairs = {f"pairs.{k}": v for k, v in self.pairs.state().items()} if self.pairs.pending or self.pairs.done \
            else {}  # fmt: skip
        pieces = {f"pieces.{k}": v for k, v in self.pieces.state().items()} if self.pieces.parts else {}
        return {}, {**{f"join.{k}": v for k, v in self.join.state(self.clock()).items()}, **pairs, **pieces,
                    **self.hwm_arrays()}  # fmt: skip

    def restore(self, meta: dict[str, Any], arrays: dict[str, np.ndarray]) -> None:
        self.join.restore({k[len("join."):]: v for k, v in arrays.items() if k.startswith("join.")})
        self.pairs.restore({k[len("pairs."):]: v for k, v in arrays.items() if k.startswith("pairs.")})
        self.pieces.restore({k[len("pieces."):]: v for k, v in arrays.items() if k.startswith("pieces.")},
                            self.clock())
        self.restore_hwm(arrays)


def expire_joins(tasks: Iterable[Task], health: Health) -> None:
    """Give up on predictions and labels older than the label horizon, in every live join task of ``tasks``."""
    given_up: Counter[str] = Counter()
    unmatched: Counter[str] = Counter()
    lone = 0
    behind = 0.0
    for task in tasks:
        if isinstance(task, JoinTask) and task.restoring is None:
            before = sum(given_up.values())
            now = task.clock()
            task.join.expire(now, given_up)
            responses = task.pairs.expire(now, unmatched) if task.pairs.pending or task.pairs.done else []
            task.pieces.expire(now, task.pairs.horizon, unmatched)
            lone += len(responses)
            task.dirty = task.dirty or sum(given_up.values()) > before or bool(unmatched) or bool(responses)
            behind = max(behind, now - task.join.labels_clock(now))
    health.labels_clock_behind.set(behind)  # the furthest behind of this replica's join tasks
    health.count_outcomes(given_up)
    if unmatched or lone:  # a response with no request ever: a bad payload (counted; its value is not kept)
        counter = health.payload_counters(_REASONS)[1]
        for reason, n in (+(unmatched + Counter(response_without_request=lone))).items():
            counter.labels(reason).inc(n)
        if lone:
            health.rejected.labels("response_without_request").inc(lone)


def pending(tasks: Iterable[Task]) -> int:
    """The predictions waiting for their labels in the join tasks of ``tasks``."""
    return sum(len(t.join.pending) for t in tasks if isinstance(t, JoinTask))
