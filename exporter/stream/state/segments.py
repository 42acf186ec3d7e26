"""A model's counts per (subgroup x segment value), for the explanations of a gap's change (``segments:``).

One more axis of the window store's additive counts, in a ring of its own with coarser buckets: the longest window
over :data:`BUCKETS_PER_WINDOW` (a whole number of the store's buckets). At the store's 1-minute buckets, three
columns of 20 values at 100 models would hold 7.8 GB (bench/explain.py); at 1-hour buckets for a 24h window, 131 MB.
The ring holds two of each window (the current one and the one a period before it, the baseline) plus the allowed
lateness. Each column's values are coded by a bounded table (:class:`exporter.core.explain.SegmentValues`) kept with
the counts in the checkpoint, so a code means the same value after a restart; values past the cap and missing ones
count as ``other``, and are counted.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Final

import numpy as np

from exporter.config import ModelSpec, Windowing
from exporter.core.conditional import CONDITIONAL_METRICS, Stratified, conditional_compare, excluded_rows, known_strata
from exporter.core.explain import STRATA_SEP, SegmentValues, explanations, key_value, segment_keys
from exporter.core.fairness import N_COUNTS

BUCKETS_PER_WINDOW: Final = 24
"""Buckets of the segment ring in the longest window: its explanations' resolution in time."""


def segment_bucket_seconds(windowing: Windowing) -> int:
    """The width of the segment ring's buckets: the longest window over :data:`BUCKETS_PER_WINDOW`, in whole buckets
    of the window store (at least one)."""
    bucket = windowing.bucket_seconds
    return int(max(bucket, windowing.longest_seconds // BUCKETS_PER_WINDOW // bucket * bucket))


class SegmentCounts:
    """The ring ``(buckets, subgroup rows, keys x (cap + 1) values, N_COUNTS)`` and each key's value table (a key:
    a segment column, or the strata's columns together: :func:`exporter.core.explain.segment_keys`); empty (no axis
    at all) for a model without segments or strata. Guarded by the window store's lock."""

    def __init__(self, model: ModelSpec, windowing: Windowing, n_rows: int) -> None:
        self.key_columns = segment_keys(model.segments, model.strata)
        self.columns = tuple(self.key_columns)
        """The keys, the segment columns first (in config order), then the strata's."""
        self.width = model.segment_values + 1
        self.tables = {c: SegmentValues(model.segment_values) for c in self.columns}
        self.bucket_seconds = segment_bucket_seconds(windowing)
        self.window_buckets = {w.name: max(1, round(w.seconds / self.bucket_seconds)) for w in windowing.windows}
        # how far before a window its baseline ends, in buckets: baseline_offset, else the window's own length
        offset = None if model.baseline_offset is None else max(1, round(model.baseline_offset / self.bucket_seconds))
        self.offsets = {name: k if offset is None else offset for name, k in self.window_buckets.items()}
        lateness = math.ceil(windowing.allowed_lateness_seconds / self.bucket_seconds)
        self.n_buckets = max((k + self.offsets[name] for name, k in self.window_buckets.items()), default=2) \
            + lateness + 1 if self.columns else 0  # fmt: skip
        self.counts = np.zeros((self.n_buckets, n_rows, len(self.columns) * self.width, N_COUNTS), np.int64)
        self.bucket_ids = np.full(self.n_buckets, -1, np.int64)
        self.head = -1
        self.overflow_rows = np.zeros(len(self.columns), np.int64)
        self.missing_rows = np.zeros(len(self.columns), np.int64)

    def codes(self, values: Mapping[str, Sequence[Any]]) -> np.ndarray:
        """Each event's value code per column ``(n_events, n_columns)``, offset to the column's block of values;
        counts the events whose value overflowed the cap or is missing."""
        out = []
        for k, column in enumerate(self.columns):
            parts = [values[c] for c in self.key_columns[column]]
            found = parts[0] if len(parts) == 1 else [key_value(v) for v in zip(*parts, strict=True)]
            table = self.tables[column]
            coded = [table.code(v) for v in found]
            self.overflow_rows[k] += sum(over for _, over in coded)
            self.missing_rows[k] += sum(v is None for v in found)
            out.append(np.fromiter((code for code, _ in coded), np.int64, len(coded)) + k * self.width)
        return np.stack(out, axis=1) if out else np.zeros((0, 0), np.int64)

    def count(self, timestamps: np.ndarray, rows: Mapping[str, np.ndarray], predicted: np.ndarray | None,
              outcome: np.ndarray, codes: np.ndarray, now: float) -> None:  # fmt: skip
        """Count events the window store counted (on time): their predicted class (None: a joined label alone) and
        their outcome, when labelled."""
        if predicted is not None:
            self.add(timestamps, rows, predicted, codes, now)
        labelled = outcome >= 0
        self.add(timestamps[labelled], {k: v[labelled] for k, v in rows.items()}, outcome[labelled], codes[labelled],
                 now)  # fmt: skip

    def add(self, timestamps: np.ndarray, rows: Mapping[str, np.ndarray], columns: np.ndarray, codes: np.ndarray,
            now: float) -> None:  # fmt: skip
        """Count events (already on time for the window store) in their bucket: each attribute's state row, its
        count column, its value codes."""
        if not self.columns or not len(timestamps):
            return
        buckets = np.floor(np.asarray(timestamps) / self.bucket_seconds).astype(np.int64)
        self._advance(max(math.floor(now / self.bucket_seconds), int(buckets.max())))
        keep = buckets > self.head - self.n_buckets
        slots = buckets[keep] % self.n_buckets
        self.bucket_ids[slots] = buckets[keep]
        n_rows, n_values = self.counts.shape[1], self.counts.shape[2]
        flat = self.counts.reshape(-1)
        for row in rows.values():
            for k in range(codes.shape[1]):
                cell = (slots * n_rows + row[keep]) * n_values + codes[keep, k]
                np.add.at(flat, cell * N_COUNTS + columns[keep], 1)

    def _advance(self, head: int) -> None:
        if head <= self.head:
            return
        self.head = head
        stale = (self.bucket_ids >= 0) & (self.bucket_ids <= head - self.n_buckets)
        self.counts[stale] = 0
        self.bucket_ids[stale] = -1

    def rewind(self, now: float) -> None:
        """Bring the head back to ``now`` (the window store's was ahead of the clock), the buckets after it dropped."""
        if self.columns and self.head > (head := math.floor(now / self.bucket_seconds)):
            future = self.bucket_ids > head
            self.counts[future] = 0
            self.bucket_ids[future] = -1
            self.head = head

    def windows(self, now: float) -> dict[str, tuple[np.ndarray, np.ndarray]]:
        """Per window: the baseline's and the current's counts ``(n_rows, n_columns x (cap + 1), N_COUNTS)``, the
        current being the window's last buckets up to the head (advanced to ``now``), the baseline as many ending
        ``baseline_offset`` (default: the window's length) before them."""
        self._advance(math.floor(now / self.bucket_seconds))
        out = {}
        for name, k in self.window_buckets.items():
            current = [(self.head - i) % self.n_buckets for i in range(k)]
            baseline = [(self.head - self.offsets[name] - i) % self.n_buckets for i in range(k)]
            out[name] = (self.counts[baseline].sum(axis=0), self.counts[current].sum(axis=0))
        return out

    def state(self) -> dict[str, np.ndarray]:
        """The checkpoint's arrays: the ring, and each column's values in code order."""
        if not self.columns:
            return {}
        return {"segment_counts": self.counts.copy(), "segment_bucket_ids": self.bucket_ids.copy(),
                "segment_head": np.array(self.head), "segment_overflow": self.overflow_rows.copy(),
                "segment_missing": self.missing_rows.copy(),
                **{f"segment_values_{k}": np.array(self.tables[c].values, dtype=np.str_)
                   for k, c in enumerate(self.columns)}}  # fmt: skip

    def restore(self, state: Mapping[str, np.ndarray]) -> None:
        """Load what :meth:`state` produced (the layout check made sure the columns and cap are the same)."""
        if not self.columns or "segment_counts" not in state:
            return
        self.counts[...] = state["segment_counts"]
        self.bucket_ids[...] = state["segment_bucket_ids"]
        self.head = int(state["segment_head"])
        self.overflow_rows[...] = state["segment_overflow"]
        self.missing_rows[...] = state["segment_missing"]
        for k, c in enumerate(self.columns):
            self.tables[c] = SegmentValues(self.width - 1, [str(v) for v in state[f"segment_values_{k}"].tolist()])

    def excluded(self, strata: Sequence[str]) -> dict[str, int]:
        """The events no conditional metric counts, since the counts began (checkpointed): those missing a value of
        the strata's columns, and those whose combination came past the cap (:func:`excluded_rows`)."""
        k = self.columns.index(STRATA_SEP.join(strata))
        return excluded_rows(int(self.missing_rows[k]), int(self.overflow_rows[k]))

    def snapshot(self, now: float) -> tuple[dict[str, tuple[np.ndarray, np.ndarray]], list[tuple[str, ...]], int]:
        """Under the store's lock: every window's baseline and current counts, each column's value names, the
        head bucket (what :func:`explain` needs, copied, so it computes outside the lock)."""
        windows = self.windows(now)
        return windows, [self.tables[c].names for c in self.columns], self.head


def explain(spec: ModelSpec, taken: tuple[dict[str, tuple[np.ndarray, np.ndarray]], list[tuple[str, ...]], int],
            counts: SegmentCounts, split: Callable[[np.ndarray], dict[str, np.ndarray]]) -> dict[str, Any]:
    """Per window: when its baseline and current periods are (epoch seconds), and the explanations of every
    configured difference metric's change from the one to the other (:func:`exporter.core.explain.explanations`,
    the gate's own), per attribute and pair."""
    windows, names, head = taken
    out: dict[str, Any] = {}
    for window, (baseline, current) in windows.items():
        k, width = counts.window_buckets[window], counts.width
        b, c = split(baseline), split(current)
        found = []
        for attribute in spec.attributes:
            n = len(attribute.groups)
            parts = {}
            for j, column in enumerate(spec.segments):
                used = [*range(len(names[j]) - 1), width - 1]
                block = slice(j * width, (j + 1) * width)
                parts[column] = (names[j], b[attribute.name][:n, block][:, used], c[attribute.name][:n, block][:, used])
            found.extend(explanations(attribute, [m.name for m in spec.metrics], parts))
        edge, width_s = (head + 1) * counts.bucket_seconds, counts.bucket_seconds
        back = counts.offsets[window] * width_s
        out[window] = {"baseline": [edge - back - k * width_s, edge - back],
                       "current": [edge - k * width_s, edge], "explanations": found}  # fmt: skip
    return out


def paged(spec: ModelSpec, taken: Any, store: Any, entry: Mapping[str, Any], rate: str | None) -> dict[str, Any] | None:
    """The explanation of a paged comparison (an alert's ``attribute``, ``group_a``, ``group_b``) of one rate, in the
    longest window, with that window's periods; None when no configured difference metric explains the rate."""
    window = max(store.segments.window_buckets, key=store.segments.window_buckets.get)
    found = explain(spec, taken, store.segments, store.layout.split)[window]
    comparison = f"{entry.get('group_a')} vs {entry.get('group_b')}"
    e = next((e for e in found["explanations"] if e["attribute"] == entry["attribute"] and e["rate"] == rate
              and e["comparison"] == comparison), None)  # fmt: skip
    return None if e is None else {"window": window, "baseline": found["baseline"], "current": found["current"], **e}


def conditional(spec: ModelSpec, taken: tuple[dict[str, tuple[np.ndarray, np.ndarray]], list[tuple[str, ...]], int],
                counts: SegmentCounts, split: Callable[[np.ndarray], dict[str, np.ndarray]],
                pairs: Mapping[str, tuple[np.ndarray, np.ndarray]],
                ) -> dict[tuple[str, str], tuple[np.ndarray, dict[str, Stratified]]]:  # fmt: skip
    """The counts per group and known stratum (``strata:``; rows under ``other`` left out:
    :func:`exporter.core.conditional.known_strata`) of every window's current period and attribute, and the
    configured conditional metrics of them for the pairs ``(group_a, group_b)`` of each attribute, by (window,
    attribute)."""
    names = [m.name for m in spec.metrics if m.name in CONDITIONAL_METRICS]
    if not names or not spec.strata:
        return {}
    windows, table_names, _ = taken
    k, width = counts.columns.index(STRATA_SEP.join(spec.strata)), counts.width
    used = [*range(len(table_names[k]) - 1), width - 1]
    out = {}
    for window, (_, current) in windows.items():
        by_attribute = split(current)
        for attribute in spec.attributes:
            strata = known_strata(by_attribute[attribute.name][: len(attribute.groups), k * width : (k + 1) * width]
                                  [:, used])  # fmt: skip
            a, b = pairs[attribute.name]
            out[window, attribute.name] = strata, {name: conditional_compare(name, strata, a, b) for name in names}
    return out
