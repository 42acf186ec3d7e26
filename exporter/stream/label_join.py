"""Join delayed ground truth (outcomes, the "label" of an event) to its predictions, with bounded state.

A prediction without an inline label waits here (keyed by ``prediction_id``) for at most ``horizon`` seconds; a
label that arrives before its prediction waits as an orphan for as long. A joined label is counted in the bucket
of the prediction's event time, so TPR/FPR describe when the decision was made. Whatever cannot be joined is
counted by reason: never labelled, unknown prediction, duplicate label, or state full.
"""

from __future__ import annotations

from collections import Counter, OrderedDict
from dataclasses import dataclass
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
    """Predictions that just got their label: event times, outcome columns and per-attribute codes."""

    timestamps: np.ndarray
    outcomes: np.ndarray
    codes: np.ndarray
    """Shape ``(n, n_attributes)``, attributes in config order."""

    def __len__(self) -> int:
        return len(self.timestamps)


class OutcomeJoin:
    """Pending predictions and orphan labels, both bounded in count and in age."""

    def __init__(self, n_attributes: int, horizon_seconds: float, max_pending: int = 1_000_000) -> None:
        self.n_attributes = n_attributes
        self.horizon = horizon_seconds
        self.max_pending = max_pending
        self.pending: dict[str, tuple[float, int, tuple[int, ...]]] = {}
        self.orphans: dict[str, tuple[int, float]] = {}
        self.recently_joined: OrderedDict[str, None] = OrderedDict()

    def _joined(self, rows: list[tuple[float, int, tuple[int, ...], int]]) -> Joined:
        ts = np.array([r[0] for r in rows], dtype=np.float64)
        preds = np.array([r[1] for r in rows], dtype=np.int64)
        labels = np.array([r[3] for r in rows], dtype=np.int64)
        codes = np.array([r[2] for r in rows], dtype=np.int64).reshape(len(rows), self.n_attributes)
        return Joined(ts, outcome_columns(preds, labels)[1], codes)

    def _remember_joined(self, pid: str) -> None:
        self.recently_joined[pid] = None
        while len(self.recently_joined) > self.max_pending:
            self.recently_joined.popitem(last=False)

    def add_predictions(
        self, ids: list[Any], timestamps: np.ndarray, predictions: np.ndarray, codes: np.ndarray, expired: Counter[str]
    ) -> Joined:
        """Hold unlabelled predictions; return those whose label was already waiting as an orphan."""
        rows = []
        for i, pid in enumerate(ids):
            if pid is None:
                continue
            pid = str(pid)
            orphan = self.orphans.pop(pid, None)
            entry = (float(timestamps[i]), int(predictions[i]), tuple(int(c) for c in codes[i]))
            if orphan is not None:
                rows.append((*entry, orphan[0]))
                self._remember_joined(pid)
            elif pid in self.pending:
                expired["duplicate_prediction"] += 1  # the later prediction replaces the one held
                self.pending[pid] = entry
            elif len(self.pending) >= self.max_pending:
                expired["pending_state_full"] += 1
            else:
                self.pending[pid] = entry
        return self._joined(rows)

    def add_outcomes(self, ids: list[str], outcomes: list[int], now: float, expired: Counter[str]) -> Joined:
        """Join outcomes to pending predictions; hold the others as orphans (or count them as duplicates)."""
        rows = []
        for pid, label in zip(ids, outcomes, strict=True):
            pid = str(pid)
            entry = self.pending.pop(pid, None)
            if entry is not None:
                rows.append((*entry, label))
                self._remember_joined(pid)
            elif pid in self.recently_joined or pid in self.orphans:
                expired["duplicate_label"] += 1
            elif len(self.orphans) >= self.max_pending:
                expired["pending_state_full"] += 1
            else:
                self.orphans[pid] = (label, now)
        return self._joined(rows)

    def expire(self, now: float, expired: Counter[str]) -> None:
        """Drop predictions and orphan labels older than the horizon."""
        cutoff = now - self.horizon
        old = [pid for pid, (ts, _, _) in self.pending.items() if ts < cutoff]
        for pid in old:
            del self.pending[pid]
        expired["never_labelled"] += len(old)
        stale = [pid for pid, (_, arrived) in self.orphans.items() if arrived < cutoff]
        for pid in stale:
            del self.orphans[pid]
        expired["unknown_prediction"] += len(stale)

    def state(self) -> dict[str, np.ndarray]:
        """Arrays for a checkpoint."""
        pending = list(self.pending.items())
        orphans = list(self.orphans.items())
        return {
            **_pack_ids("pending", [p for p, _ in pending]),
            "pending_ts": np.array([e[0] for _, e in pending], dtype=np.float64),
            "pending_pred": np.array([e[1] for _, e in pending], dtype=np.int64),
            "pending_codes": np.array([e[2] for _, e in pending], dtype=np.int64).reshape(-1, self.n_attributes),
            **_pack_ids("orphan", [p for p, _ in orphans]),
            "orphan_label": np.array([o[0] for _, o in orphans], dtype=np.int64),
            "orphan_arrived": np.array([o[1] for _, o in orphans], dtype=np.float64),
        }

    def restore(self, state: dict[str, np.ndarray]) -> None:
        """Load what :meth:`state` produced."""
        self.pending = {
            str(pid): (float(ts), int(pred), tuple(int(c) for c in codes))
            for pid, ts, pred, codes in zip(_unpack_ids("pending", state), state["pending_ts"], state["pending_pred"],
                                            state["pending_codes"], strict=True)
        }  # fmt: skip
        orphans = zip(_unpack_ids("orphan", state), state["orphan_label"], state["orphan_arrived"], strict=True)
        self.orphans = {str(pid): (int(label), float(arrived)) for pid, label, arrived in orphans}
