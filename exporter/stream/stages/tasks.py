"""The staged path's stateful tasks: one per partition of an internal topic that this replica holds.

A :class:`JoinTask` holds the label join of one ``.join`` partition (the same :class:`OutcomeJoin` as the direct
path) and sends each joined outcome to its model's ``.counts`` partition; with a payload log it also pairs the
halves of the calls whose id falls on its partition (the direct path's :class:`PairJoin`), and sends each joined
call's rows on as predictions. A :class:`CountsTask` counts the records
of one ``.counts`` partition into the window stores of the models it owns, with the direct path's
``WindowStore.add`` and ``add_joined``. Both skip rows whose source position they already applied (a high-water
mark per source), so a stage that re-reads its input after a crash or a rebalance never counts twice; both
restore from and write inline snapshots (exporter/stream/stages/snapshots.py).
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import numpy as np

from exporter.config import ModelSpec, layout
from exporter.health.counters import Health, StageHealth
from exporter.stream.decode.events import DecodedBatch
from exporter.stream.decode.payload import UNMATCHED_REASONS, PairJoin, PayloadRows
from exporter.stream.kafka.client import Partition
from exporter.stream.stages.halves import Pieces, joined_calls
from exporter.stream.stages.records import (
    ROW_BITS,
    Kind,
    Record,
    codes_columns,
    codes_layout,
    encode_rows,
    joined_columns,
    joined_scores,
    rows_at,
    waiting_codes,
    with_side_ids,
)
from exporter.stream.stages.snapshots import Restoring
from exporter.stream.state.attribute_join import AttributeJoin
from exporter.stream.state.fleet import Fleet
from exporter.stream.state.label_join import Joined, OutcomeJoin

log = logging.getLogger(__name__)

Out = tuple[str, int, bytes | None, bytes]
"""A record to send: topic, partition, key, value."""
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
            return joined_calls(self, [t for t, k in zip(record.ids, self.fresh(record, ("payload",)).tolist(),
                                                         strict=True) if k], offset)  # fmt: skip
        if record.kind is Kind.PIECES:
            return joined_calls(self, self.pieces.add(record, self.fresh(record, ("pieces",))), offset)
        model = str(record.meta.get("model", ""))
        keep = self.fresh(record, (model,) if record.kind is Kind.PENDING else ())
        if record.kind is Kind.PENDING and record.sources and record.sources[0][0] == self.counts(model)[0]:
            keep = self._sent_again(model, record, keep)
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
                    np.int64), waiting_codes(spec, a, keep), given_up)  # fmt: skip
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

    def _sent_again(self, model: str, record: Record, keep: np.ndarray) -> np.ndarray:
        """A counts task's joined predictions (attribute_sources): those this join has had already are a new owner's
        replay (its side table releases them at other times than its predecessor's, so no position names them
        alike), skipped as replayed rows."""
        at = np.flatnonzero(keep)
        again = self.join.again(model, [record.ids[i] for i in at.tolist()], record.arrays["timestamp"][at])
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

    def state(self) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
        pairs = {f"pairs.{k}": v for k, v in self.pairs.state().items()} if self.pairs.pending or self.pairs.done \
            else {}  # fmt: skip
        pieces = {f"pieces.{k}": v for k, v in self.pieces.state().items()} if self.pieces.parts else {}
        return {}, {**{f"join.{k}": v for k, v in self.join.state(self.clock()).items()}, **pairs, **pieces,
                    **self.hwm_arrays()}  # fmt: skip

    def restore(self, meta: dict[str, Any], arrays: dict[str, np.ndarray]) -> None:
        self.join.restore({k[len("join."):]: v for k, v in arrays.items() if k.startswith("join.")})
        self.pairs.restore({k[len("pairs."):]: v for k, v in arrays.items() if k.startswith("pairs.")})
        self.pieces.restore({k[len("pieces."):]: v for k, v in arrays.items() if k.startswith("pieces.")})
        self.restore_hwm(arrays)


class CountsTask(Task):
    """The evaluation of the models of one ``.counts`` partition: their window stores live in the fleet, taken
    when this task goes live and released when it is revoked."""

    stage = "counts"

    def __init__(self, partition: Partition, start: int, stage_health: StageHealth, health: Health, fleet: Fleet,
                 models: Callable[[], list[str]], clock: Callable[[], float],
                 sides: AttributeJoin | None = None) -> None:  # fmt: skip
        super().__init__(partition, start, stage_health)
        self.fleet = fleet
        self.health = health
        self.models = models
        """The configured models of this partition."""
        self.clock = clock
        self.attributes = AttributeJoin(fleet.config, sides) if sides else None
        """With ``attribute_sources``: the direct path's join over this replica's side tables (``sides``), the
        predictions waiting for their records this task's own (in its snapshot)."""
        self.side_outcomes: Counter[tuple[str, str]] = Counter()
        """What became of the ids looked up since the stages last counted them (exporter/health/side.py)."""
        self.forward: Callable[[Partition, str, DecodedBatch], None] | None = None
        """Sends a model's joined predictions on to wait for their labels (stages/sides.py, as the task goes live)."""
        self._restored: tuple[dict[str, Any], dict[str, np.ndarray]] = ({"models": {}}, {})

    def apply(self, record: Record, offset: int) -> list[Out]:
        """Count a PREDICTIONS or JOINED record in its model's window store."""
        model = str(record.meta.get("model"))
        monitored = self.fleet.models.get(model)
        if monitored is None or codes_layout(monitored.spec) != record.meta.get("layout"):
            # a model this replica does not monitor as configured (a reload reaches the replicas one at a time)
            self.health.ignored.labels("unconfigured_model").inc(len(record))
            return []
        keep = self.fresh(record, (model,))
        if not keep.any():
            return []
        a = rows_at(record.arrays, keep, len(keep))
        codes = codes_columns(monitored.spec, a["codes"])
        store = monitored.store
        if record.kind is Kind.PREDICTIONS:
            batch = DecodedBatch(a["timestamp"], a["prediction"].astype(np.int64), a["outcome"].astype(np.int64),
                                 [None] * len(a["timestamp"]), codes, scores=a["score"])  # fmt: skip
            if self.attributes is not None and monitored.spec.sourced():
                ids = [text for text, k in zip(record.ids, keep.tolist(), strict=True) if k]
                batch = self.attributes.resolve(monitored.spec, with_side_ids(monitored.spec, batch, ids),
                                                self.side_outcomes)  # fmt: skip
            self.count({model: batch})
        elif record.kind is Kind.JOINED:
            bins, scores = joined_scores(monitored.spec, store, a)  # its prediction's, for the score counts
            outside = store.add_joined(a["timestamp"], codes, a["outcome"].astype(np.int64), bins, scores=scores)
            self.health.outcomes_joined.inc(len(a["position"]) - outside)
            self.health.count_outcomes({"prediction_outside_window": outside} if outside else {})
        self.dirty = True
        return []

    def count(self, batches: Mapping[str, DecodedBatch]) -> None:
        """Count models' predictions whose attributes are known (those released by the join too, in their own
        event-time buckets)."""
        late = 0
        for model, batch in batches.items():
            if (monitored := self.fleet.models.get(model)) is not None and len(batch):
                late += monitored.store.add(batch.timestamps, batch.codes, batch.predictions, batch.outcomes,
                                            self.clock(), scores=batch.scores)  # fmt: skip
                self.dirty = True
                if self.forward is not None:
                    self.forward(self.partition, model, batch)
        if late:
            self.health.late.inc(late)

    def state(self) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
        models, arrays = {}, self.hwm_arrays()
        if self.attributes is not None:
            arrays.update({f"side.{k}": v for k, v in self.attributes.held_state().items()})
        windowing = self.fleet.config.windowing
        with self.fleet.lock:
            for i, model in enumerate(self.models()):
                monitored = self.fleet.models.get(model)
                if monitored is None:
                    continue
                models[model] = {"layout": layout(monitored.spec, windowing), "prefix": f"m{i}."}
                arrays.update({f"m{i}.{k}": v for k, v in monitored.store.state().items()})
        return {"models": models}, arrays

    def restore(self, meta: dict[str, Any], arrays: dict[str, np.ndarray]) -> None:
        """Restore the hwm marks; the models' arrays are taken by :meth:`take` (with the fleet's current specs)."""
        self.restore_hwm(arrays)
        if self.attributes is not None:
            self.attributes.restore({k[len("side."):]: v for k, v in arrays.items() if k.startswith("side.")})
        self._restored = (meta, arrays)

    def take(self) -> None:
        """Go live: the fleet keeps this partition's models from now, restored from the snapshot where it holds
        them under the same layout, else empty."""
        (meta, arrays), self._restored = self._restored, ({"models": {}}, {})
        specs = {m.model_id: m for m in self.fleet.config.models}
        windowing = self.fleet.config.windowing
        states: dict[str, dict[str, np.ndarray] | None] = {}
        for model in self.models():
            written = meta["models"].get(model)
            if written is not None and written["layout"] == layout(specs[model], windowing):
                prefix = written["prefix"]
                states[model] = {k[len(prefix):]: v for k, v in arrays.items() if k.startswith(prefix)}
            else:
                if written is not None:
                    log.warning("model %s was snapshotted under another layout: it starts afresh", model)
                states[model] = None
        self.fleet.take(states)


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
            lone += len(responses)
            task.dirty = task.dirty or sum(given_up.values()) > before or bool(unmatched) or bool(responses)
            behind = max(behind, now - task.join.labels_clock(now))
    health.labels_clock_behind.set(behind)  # the furthest behind of this replica's join tasks
    health.count_outcomes(given_up)
    if unmatched or lone:  # a response with no request ever: a bad payload (counted; its value is not kept)
        counter = health.payload_counters(UNMATCHED_REASONS)[1]
        for reason, n in (+(unmatched + Counter(response_without_request=lone))).items():
            counter.labels(reason).inc(n)
        if lone:
            health.rejected.labels("response_without_request").inc(lone)


def pending(tasks: Iterable[Task]) -> int:
    """The predictions waiting for their labels in the join tasks of ``tasks``."""
    return sum(len(t.join.pending) for t in tasks if isinstance(t, JoinTask))
