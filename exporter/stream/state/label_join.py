"""Join delayed ground truth (outcomes, the "label" of an event) to its predictions, with bounded state.

A prediction without an inline label waits here (keyed by ``prediction_id``) until the labels read are a
``horizon`` past its event time: the labels' clock is the wall clock held back by how far behind the labels were
read (a label's Kafka timestamp against when it was read), so a daemon that lags, or restarts after an outage,
does not give up on predictions whose labels are still unread in the log. A label that arrives before its
prediction waits as an orphan for ``horizon`` seconds. A joined label is counted in the bucket
of the prediction's event time, so TPR/FPR describe when the decision was made. Whatever cannot be joined is
counted by reason: never labelled, unknown prediction, duplicate label, state full, or its model reconfigured.
"""

from __future__ import annotations

from collections import Counter, OrderedDict
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from itertools import count
from typing import Any

import numpy as np

from exporter.core.fairness import outcome_columns


def _pack_ids(prefix: str, ids: list[str]) -> dict[str, np.ndarray]:
    """Ids as one UTF-8 byte string and their lengths: a fixed-width string array would give every id the width
    of the longest one."""
    encoded = [pid.encode() for pid in ids]
    return {f"{prefix}_id_bytes": np.frombuffer(b"".join(encoded), dtype=np.uint8),
            f"{prefix}_id_lengths": np.array([len(e) for e in encoded], dtype=np.int64)}  # fmt: skip


def _unpack_ids(prefix: str, state: dict[str, np.ndarray]) -> list[str]:
    if f"{prefix}_ids" in state:  # written before ids were packed
        return [str(pid) for pid in state[f"{prefix}_ids"]]
    data = state[f"{prefix}_id_bytes"].tobytes()
    ends = np.cumsum(state[f"{prefix}_id_lengths"]).tolist()
    return [data[start:end].decode() for start, end in zip([0, *ends], ends, strict=False)]


@dataclass(frozen=True)
class Joined:
    """Predictions of one model that just got their label: event times, outcome columns and per-attribute codes."""

    timestamps: np.ndarray
    outcomes: np.ndarray
    codes: np.ndarray
    """Shape ``(n, n_attributes)``, attributes in config order."""
    bins: np.ndarray
    """Each prediction's score bin for the estimation counts (exporter/core/estimate.py), -1 when none was kept."""

    def __len__(self) -> int:
        return len(self.timestamps)


Pending = tuple[float, int, tuple[int, ...], str]
"""A prediction waiting for its label: event time, prediction and score bin (:func:`pack`), per-attribute codes,
model id."""
Held = tuple[int, int, int]
"""What a join holds, each kind bounded by ``max_pending``: waiting predictions, orphan labels, joined ids."""

_TICKETS = count()
"""The order ids were joined in across the joins of one process (a staged replica's join tasks): the oldest of them
all is forgotten first, as the direct path's one join forgets its oldest."""


def pack(predictions: np.ndarray, bins: np.ndarray | None) -> np.ndarray:
    """A prediction (0/1) and its score bin (-1: none) in one int, as a pending prediction keeps them: its checkpoint
    column holds them unchanged, and a prediction without a bin is the prediction itself.

    >>> pack(np.array([1, 0, 1]), np.array([3, -1, 0])).tolist(), unpack(np.array([9, 0, 3]))[1].tolist()
    ([9, 0, 3], [3, -1, 0])
    """
    p = np.asarray(predictions, dtype=np.int64)
    return p if bins is None else p + 2 * (np.asarray(bins, dtype=np.int64) + 1)


def unpack(packed: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(predictions, score bins) of :func:`pack`'s ints."""
    return packed % 2, packed // 2 - 1


def score_bits(scores: np.ndarray) -> np.ndarray:
    """Scores as the int64s of their float64 bits: a calibrating model's waiting prediction keeps its score, exactly,
    as the last of its codes (``.view(np.float64)`` gives it back).

    >>> score_bits(np.array([0.25])).view(np.float64).tolist()
    [0.25]
    """
    return np.ascontiguousarray(scores, dtype=np.float64).view(np.int64)


def _first_ticket(join: OutcomeJoin) -> int:
    return next(iter(join.recently_joined.values()))[1]


def _joined(rows: list[tuple[float, int, tuple[int, ...], str, int]]) -> dict[str, Joined]:
    """Joined rows ``(time, prediction, codes, model, label)``, grouped by model."""
    by_model: dict[str, list[tuple[float, int, tuple[int, ...], str, int]]] = {}
    for row in rows:
        by_model.setdefault(row[3], []).append(row)
    out = {}
    for model, mine in by_model.items():
        ts = np.array([r[0] for r in mine], dtype=np.float64)
        preds, bins = unpack(np.array([r[1] for r in mine], dtype=np.int64))
        labels = np.array([r[4] for r in mine], dtype=np.int64)
        codes = np.array([r[2] for r in mine], dtype=np.int64).reshape(len(mine), len(mine[0][2]))
        out[model] = Joined(ts, outcome_columns(preds, labels)[1], codes, bins)
    return out


class ReadClock:
    """How far a delayed input (labels, or a side source's records) has been read: what a waiting prediction's
    expiry is measured against, so that a daemon that lags, or restarts after an outage, does not give up on
    predictions whose partner is still unread in the log."""

    def __init__(self, horizon_seconds: float) -> None:
        self.horizon = horizon_seconds
        self.label_delays: dict[object, tuple[float, float]] = {}
        """Per source of the input (a partition): how far behind its newest record was when read (the read time
        minus the record's Kafka timestamp, in seconds), and when it was read."""
        self.restored_clock: tuple[float, float | None] | None = None
        """The clock a checkpoint recorded, and since when it holds: it stands until a record is read again, for at
        most one horizon."""

    def labels_read(self, source: object, newest_label_time: float | None, now: float) -> None:
        """Note that records of this source were read at ``now``, the newest of them stamped ``newest_label_time``
        (None: the records carry no timestamp, and this source does not hold the clock back)."""
        if newest_label_time is not None and newest_label_time > 0:
            self.label_delays[source] = (max(0.0, now - newest_label_time), now)
            self.restored_clock = None

    def labels_clock(self, now: float) -> float:
        """The time up to which the input has been read: the wall clock held back by the largest delay of a source
        read within the horizon; after a restart, the checkpoint's clock until a record is read again (for at most
        one horizon); else the wall clock."""
        recent = [delay for delay, at in self.label_delays.values() if at >= now - self.horizon]
        if recent:
            return now - max(recent)
        if self.restored_clock is not None:
            clock, since = self.restored_clock
            if since is None or now - since < self.horizon:
                return min(clock, now)
        return now

    def start_restored(self, now: float) -> None:
        """The horizon a restored clock may hold for starts at the first expiry after the restart."""
        if self.restored_clock is not None and self.restored_clock[1] is None:
            self.restored_clock = (self.restored_clock[0], now)


class OutcomeJoin(ReadClock):
    """Pending predictions (of every model) and orphan labels, both bounded in count and in age.

    Labels carry no model: a prediction id is unique among the models one daemon monitors (a request id, a UUID).
    """

    def __init__(self, horizon_seconds: float, max_pending: int = 1_000_000,
                 others: Callable[[], Iterable[OutcomeJoin]] = tuple) -> None:  # fmt: skip
        super().__init__(horizon_seconds)
        self.max_pending = max_pending
        self.others = others
        """What the other joins under the same bound hold (the staged path: the replica's other join tasks, so that
        one replica holds ``max_pending`` as the direct path's one join does, however the ids hash)."""
        self.pending: dict[str, Pending] = {}
        self.orphans: dict[str, tuple[int, float]] = {}
        self.recently_joined: OrderedDict[str, tuple[float, int]] = OrderedDict()
        """Ids joined within the horizon (when their label arrived and their :data:`_TICKETS` number, oldest first),
        so that a second label of one is counted as a duplicate, and a prediction delivered again is not held again;
        bounded in age like the rest, so memory stops growing once a horizon has passed, and in count (in the
        checkpoint too)."""
        self.origins: dict[str, tuple[int, ...]] = {}
        """The source records (:func:`~exporter.stream.stages.records.origin`) of the predictions of an id waiting or
        joined, where their sender named them (a staged counts task's): one of them sent again is a replay
        (:meth:`again`), another record of the id a prediction delivered again, as on the direct path."""

    def held(self) -> Held:
        """How many predictions, orphan labels and joined ids this join holds."""
        return len(self.pending), len(self.orphans), len(self.recently_joined)

    def _others_held(self) -> Held:
        held = [join.held() for join in self.others()]
        return sum(h[0] for h in held), sum(h[1] for h in held), sum(h[2] for h in held)

    def _remember_joined(self, pid: str, at: float) -> None:
        """Remember a joined id; beyond ``max_pending`` ids (with those of the other joins under the bound), the
        oldest of them all is forgotten, wherever it is: never the id just joined, unless the bound is 0."""
        self.recently_joined[pid] = (at, next(_TICKETS))
        joins = [self, *self.others()]
        extra = sum(len(join.recently_joined) for join in joins) - self.max_pending
        for _ in range(max(extra, 0)):
            oldest = min((j for j in joins if j.recently_joined), key=_first_ticket)
            oldest._forget(oldest.recently_joined.popitem(last=False)[0])

    def _forget(self, pid: str) -> None:
        """An id neither waits nor is remembered as joined any more: its source records with it."""
        self.origins.pop(pid, None)

    def again(self, ids: list[str], origins: np.ndarray) -> np.ndarray:
        """Which of these predictions (each from the source record ``origins`` names) this join has had already:
        their id waits or joined from that same record (a counts task's predictions sent again by a new owner)."""
        known = self.origins
        return np.fromiter((o in known.get(pid, ()) for pid, o in zip(ids, origins.tolist(), strict=True)), bool,
                           len(ids))  # fmt: skip

    def _from(self, pid: str, origin: int | None) -> None:
        if origin is not None:
            self.origins[pid] = (*self.origins.get(pid, ()), origin)

    def add_predictions(
        self, model: str, ids: list[Any], timestamps: np.ndarray, predictions: np.ndarray, codes: np.ndarray,
        expired: Counter[str], bins: np.ndarray | None = None, origins: np.ndarray | None = None,
    ) -> Joined | None:  # fmt: skip
        """Hold one model's unlabelled predictions (with their score bins, for a model that estimates; with the
        source record of each, when the sender names it: :meth:`again`); return those whose label was already
        waiting as an orphan."""
        predictions = pack(predictions, bins)
        sources = origins.tolist() if origins is not None else [None] * len(ids)
        rows = []
        others = self._others_held()[0]
        for i, pid in enumerate(ids):
            if pid is None:
                continue
            pid = str(pid)
            orphan = self.orphans.pop(pid, None)
            entry = (float(timestamps[i]), int(predictions[i]), tuple(int(c) for c in codes[i]), model)
            if orphan is not None:
                rows.append((*entry, orphan[0]))
                self._from(pid, sources[i])
                self._remember_joined(pid, orphan[1])
            elif pid in self.pending:
                expired["duplicate_prediction"] += 1  # the later prediction replaces the one held
                self.pending[pid] = entry
                self._from(pid, sources[i])
            elif pid in self.recently_joined:  # its outcome counted: held again, it could only count a label twice
                expired["duplicate_prediction"] += 1
                self._from(pid, sources[i])
            elif len(self.pending) + others >= self.max_pending:
                expired["pending_state_full"] += 1
            else:
                self.pending[pid] = entry
                self._from(pid, sources[i])
        return _joined(rows).get(model)

    def add_outcomes(self, ids: list[str], outcomes: list[int], now: float, expired: Counter[str]) -> dict[str, Joined]:
        """Join outcomes to pending predictions, per model; hold the others as orphans (or count them as
        duplicates)."""
        rows = []
        others = self._others_held()[1]
        for pid, label in zip(ids, outcomes, strict=True):
            pid = str(pid)
            entry = self.pending.pop(pid, None)
            if entry is not None:
                rows.append((*entry, label))
                self._remember_joined(pid, now)
            elif pid in self.recently_joined or pid in self.orphans:
                expired["duplicate_label"] += 1
            elif len(self.orphans) + others >= self.max_pending:
                expired["pending_state_full"] += 1
            else:
                self.orphans[pid] = (label, now)
        return _joined(rows)

    def expire(self, now: float, expired: Counter[str]) -> None:
        """Drop the predictions whose labels would have been read by now (event time a horizon behind the labels'
        clock), and orphan labels that waited a horizon."""
        cutoff = now - self.horizon
        self.start_restored(now)
        labels_cutoff = self.labels_clock(now) - self.horizon
        old = [pid for pid, (ts, _, _, _) in self.pending.items() if ts < labels_cutoff]
        for pid in old:
            del self.pending[pid]
            self._forget(pid)
        expired["never_labelled"] += len(old)
        stale = [pid for pid, (_, arrived) in self.orphans.items() if arrived < cutoff]
        for pid in stale:
            del self.orphans[pid]
        expired["unknown_prediction"] += len(stale)
        joined = self.recently_joined
        while joined and next(iter(joined.values()))[0] < cutoff:
            self._forget(joined.popitem(last=False)[0])

    def forget_models(self, keep: Callable[[str], bool], expired: Counter[str]) -> None:
        """Drop the predictions of models no longer kept as they were (removed, or their attributes changed: the
        codes they wait with mean nothing now); counted as ``model_reconfigured``."""
        gone = [pid for pid, entry in self.pending.items() if not keep(entry[3])]
        for pid in gone:
            del self.pending[pid]
            self._forget(pid)
        if gone:
            expired["model_reconfigured"] += len(gone)

    def give_up(self, expired: Counter[str]) -> None:
        """Drop every waiting prediction and orphan label, counted as ``model_reconfigured``: no labels topic is
        configured any more (a checkpoint of a config that had one), so nothing will ever join them."""
        expired["model_reconfigured"] += len(self.pending) + len(self.orphans)
        self.pending, self.orphans, self.origins = {}, {}, {}
        self.recently_joined.clear()

    def state(self, now: float) -> dict[str, np.ndarray]:
        """Arrays for a checkpoint: the pending predictions grouped by model, each model's codes one row per
        prediction (a per-model table says how many and how wide), so that nothing per prediction is repeated; the
        ids joined within the horizon (a label delivered again after a restart or a rebalance is a duplicate); and
        the labels' clock at ``now`` (a restart holds expiry there until it reads labels again)."""
        by_model: dict[str, list[tuple[str, Pending]]] = {}
        for pid, entry in self.pending.items():
            by_model.setdefault(entry[3], []).append((pid, entry))
        models = sorted(by_model)
        pending = [item for model in models for item in by_model[model]]
        orphans = list(self.orphans.items())
        return {
            **_pack_ids("pending", [p for p, _ in pending]),
            "pending_ts": np.array([e[0] for _, e in pending], dtype=np.float64),
            "pending_pred": np.array([e[1] for _, e in pending], dtype=np.int64),
            "pending_codes_flat": np.array([c for _, e in pending for c in e[2]], dtype=np.int64),
            **_pack_ids("pending_model_name", models),
            "pending_model_size": np.array([len(by_model[m]) for m in models], dtype=np.int64),
            "pending_model_width": np.array([len(by_model[m][0][1][2]) for m in models], dtype=np.int64),
            **_pack_ids("orphan", [p for p, _ in orphans]),
            "orphan_label": np.array([o[0] for _, o in orphans], dtype=np.int64),
            "orphan_arrived": np.array([o[1] for _, o in orphans], dtype=np.float64),
            **_pack_ids("joined", list(self.recently_joined)),
            "joined_at": np.array([at for at, _ in self.recently_joined.values()], dtype=np.float64),
            **_pack_ids("origin", list(self.origins)),
            "origin_count": np.array([len(o) for o in self.origins.values()], dtype=np.int64),
            "origin_flat": np.array([o for found in self.origins.values() for o in found], dtype=np.int64),
            "labels_clock": np.array([self.labels_clock(now)], dtype=np.float64),
        }

    def restore(self, state: dict[str, np.ndarray], single_model: str | None = None) -> None:
        """Load what :meth:`state` produced; ``single_model``: the model of a checkpoint written by a daemon of one
        model (before the join held several), whose pending codes are one row per prediction."""
        ids = _unpack_ids("pending", state)
        if single_model is not None and "pending_model_size" not in state:
            codes = [tuple(int(c) for c in row) for row in state["pending_codes"]]
            models = [single_model] * len(ids)
        else:
            codes, models, flat, at = [], [], state["pending_codes_flat"].tolist(), 0
            for model, size, width in zip(_unpack_ids("pending_model_name", state),
                                          state["pending_model_size"].tolist(),
                                          state["pending_model_width"].tolist(), strict=True):  # fmt: skip
                codes += [tuple(flat[at + i * width : at + (i + 1) * width]) for i in range(size)]
                models += [model] * size
                at += size * width
        self.pending = {
            str(pid): (float(ts), int(pred), code, model)
            for pid, ts, pred, code, model in zip(ids, state["pending_ts"], state["pending_pred"], codes, models,
                                                  strict=True)
        }  # fmt: skip
        orphans = zip(_unpack_ids("orphan", state), state["orphan_label"], state["orphan_arrived"], strict=True)
        self.orphans = {str(pid): (int(label), float(arrived)) for pid, label, arrived in orphans}
        joined = zip(_unpack_ids("joined", state), state["joined_at"].tolist(), strict=True) if "joined_at" in state \
            else ()  # absent from checkpoints written before the joined ids were kept: none restored  # fmt: skip
        self.recently_joined = OrderedDict((str(pid), (float(at), next(_TICKETS))) for pid, at in joined)
        self.origins = {}
        if "origin_flat" in state:  # absent from snapshots written before the predictions' source records were kept
            flat = iter(state["origin_flat"].tolist())
            for pid, n in zip(_unpack_ids("origin", state), state["origin_count"].tolist(), strict=True):
                self.origins[pid] = tuple(next(flat) for _ in range(n))
        clock = state.get("labels_clock")  # absent from checkpoints written before the labels' clock
        self.restored_clock = (float(clock[0]), None) if clock is not None and len(clock) else None
