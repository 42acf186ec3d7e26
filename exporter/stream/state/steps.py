"""Many steps of a window store at once: a batch of events during which the stream crosses several buckets,
counted with the detectors' step and the windows' counts at each step it takes, in a few vectorised calls.

The result is, to the count, what :meth:`WindowStore.add` with an ``on_step`` reading :meth:`WindowStore.window_counts`
gives, the steps taken off its queue (the backtest's per-bucket path; tests/test_window_steps.py checks the two
against each other, late and out-of-order events and quiet buckets included). It is for a store that counts
predictions and labels only (:func:`batchable`): score histograms, estimation counts, proxy attributes and
segment counts keep the per-bucket path.

How: the steps are those the stream takes (detection.py: the open bucket's as the stream leaves it, then the
quiet ones). An event counted after ``M`` of them, of bucket ``b``, is in a window of ``k`` buckets at the steps
from the ``M``-th on to the last of a bucket ``<= b + k - 1``: a range of steps. Each window's counts per step are
then the running sum of +1 at a range's first step and -1 after its last (one ``bincount`` each), plus the ring's
earlier contents taken the same way. Integers throughout: nothing rounds.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from exporter.core.fairness import N_COUNTS, outcome_columns
from exporter.stream.state.detection import Detection, steps_entering
from exporter.stream.state.window import WindowStore


@dataclass(frozen=True)
class Steps:
    """The steps a batch took: per step, its time (as :meth:`WindowStore.add` reports it), its counts (as
    :meth:`WindowStore.take_queued` gives them) and every window's counts (``window_counts``); and the batch's late
    events."""

    times: np.ndarray
    counts: np.ndarray
    """(steps, n_rows, N_COUNTS)"""
    windows: dict[str, np.ndarray]
    """window name -> (steps, n_rows, N_COUNTS)"""
    late: int


def batchable(store: WindowStore, counts_segments: bool) -> bool:
    """Whether the store counts nothing but predictions and labels (``counts_segments``: its model's segments)."""
    return not (store.score_counts.shape[2] or store.estimate_counts.shape[2] or store.labelled_sums.shape[2]
                or store.proxy.attributes or counts_segments)  # fmt: skip


def add_stepped(store: WindowStore, timestamps: np.ndarray, codes: dict[str, np.ndarray], predictions: np.ndarray,
                outcomes: np.ndarray, heads: np.ndarray, now: float) -> Steps:  # fmt: skip
    """Count a batch in order, each event when the stream's time is ``heads`` (the running newest time, epoch
    seconds >= 0, not decreasing, from ``now``: the newest before the batch, -inf before any event), taking the
    steps the stream takes (detection.py). The store's queue of steps stays as it was (empty, in the backtest)."""
    n, width, cells = store.n_buckets, store.bucket_seconds, store.layout.n_rows * N_COUNTS
    with store.lock:
        d = store.detection
        head_buckets = np.maximum(np.floor(heads / width).astype(np.int64), d.last_step)
        starts = np.r_[0, np.flatnonzero(np.diff(head_buckets)) + 1]
        ends = np.r_[starts[1:], len(heads)]
        part_heads = head_buckets[starts]  # each part's bucket of the stream, increasing
        opens = np.r_[d.last_step, part_heads[:-1]]  # the open step's bucket as each part begins
        taken = steps_entering(opens, part_heads, store.quiet)  # the steps taken before each part is counted
        before = np.cumsum(taken)  # steps taken before each part: its events enter the windows at that step
        n_steps = int(before[-1])
        first = np.repeat(before - taken, taken)  # each step's first of its part's steps
        step_heads = np.repeat(opens, taken) + np.arange(n_steps) - first
        stream = np.r_[now, heads[ends[:-1] - 1]]  # the stream's time as each part begins
        times = np.maximum(np.repeat(stream, taken), step_heads * width)
        buckets = store.bucket_of(timestamps)
        on_time = buckets > head_buckets - n
        predicted, outcome = outcome_columns(predictions, outcomes)
        part, bucket = np.repeat(np.arange(len(starts)), ends - starts), buckets
        if not on_time.all():  # an event older than the ring's oldest bucket is counted nowhere
            codes = {k: v[on_time] for k, v in codes.items()}
            predicted, outcome, part, bucket = predicted[on_time], outcome[on_time], part[on_time], buckets[on_time]
        rows = store.layout.rows(codes, len(predicted))
        size = (n_steps + 1) * cells
        at = before[part] * cells  # each event's step's first cell: it opens there
        # An event of its part's head bucket (most: the head is the newest event) counts by its part's rows; an
        # older one (late or out of order) on its own.
        is_older = bucket != part_heads[part]
        labelled = np.flatnonzero(outcome >= 0)
        flat = np.zeros(size, dtype=np.int64)
        older_events, older_cells = [], []
        for events, columns in ((None, predicted), (labelled, outcome[labelled])):  # predictions, then labels
            for r in rows:  # each attribute's row of every event (its own bincount: integers add exactly)
                cell = (r if events is None else r[events]) * N_COUNTS + columns
                flat += np.bincount(cell + (at if events is None else at[events]), minlength=size)
                older = np.flatnonzero(is_older if events is None else is_older[events])
                older_events.append(older if events is None else events[older])
                older_cells.append(cell[older])
        opened = flat.reshape(-1, cells)
        older_event, older_cell = np.concatenate(older_events), np.concatenate(older_cells)
        older_buckets = bucket[older_event]
        per_part = opened[before]  # the parts open at distinct steps (every part after the first takes one)
        opened_older = np.bincount(before[part[older_event]] * cells + older_cell, minlength=size)
        current = per_part - opened_older.reshape(-1, cells)[before]  # each part's events of its head bucket
        counts = np.zeros((n_steps, cells), dtype=np.int64)
        counts[before[:-1]] = per_part[:-1]  # a part's counts are the step its stream's bucket takes
        if n_steps:
            counts[0] += (store.totals - d.seen).reshape(-1)  # what was counted since the last step, before this batch
        ring = store.counts.reshape(n, cells)
        held = np.flatnonzero(store.bucket_ids >= 0)
        ids = store.bucket_ids[held]
        windows = {}
        for name, k in store.window_buckets.items():  # a count leaves a window at the first step past b + k - 1
            span = opened.copy()
            leaves = np.searchsorted(step_heads, part_heads + k - 1, side="right")
            _add_runs(span, np.maximum(leaves, before), -current)  # both grow with the part: so does the step
            leaves = np.searchsorted(step_heads, older_buckets + k - 1, side="right")
            span -= np.bincount(np.maximum(leaves, before[part[older_event]]) * cells + older_cell,
                                minlength=size).reshape(-1, cells)  # fmt: skip
            np.add.at(span, np.searchsorted(step_heads, ids, side="left"), ring[held])
            np.add.at(span, np.searchsorted(step_heads, ids + k - 1, side="right"), -ring[held])
            windows[name] = np.cumsum(span[:-1], axis=0).reshape(n_steps, store.layout.n_rows, N_COUNTS)
        store._advance(int(head_buckets[-1]))
        kept = part_heads > store.head - n  # a count whose bucket left the ring since was emptied with it
        ring[store._slots(part_heads[kept])] += current[kept]  # the parts' buckets differ, within the ring: so do slots
        kept = older_buckets > store.head - n
        ring += np.bincount(store._slots(older_buckets[kept]) * cells + older_cell[kept],
                            minlength=n * cells).reshape(n, cells)  # fmt: skip
        store.totals += per_part.sum(axis=0).reshape(-1, N_COUNTS)
        store.newest = max(store.newest, float(heads[-1]))
        seen = store.totals - per_part[-1].reshape(-1, N_COUNTS) if n_steps else d.seen  # the last part: open
        store.detection = Detection(d.state, seen, int(part_heads[-1]), d.steps + n_steps,
                                    store.estimate_totals.copy() if n_steps else d.estimate_seen, d.queued,
                                    d.queued_estimates)  # fmt: skip
    return Steps(times, counts.reshape(n_steps, store.layout.n_rows, N_COUNTS), windows, int((~on_time).sum()))


def _add_runs(target: np.ndarray, rows: np.ndarray, values: np.ndarray) -> None:
    """``np.add.at(target, rows, values)`` for rows that do not decrease: each run of a row's values summed once."""
    if len(rows):
        runs = np.flatnonzero(np.r_[True, rows[1:] != rows[:-1]])
        target[rows[runs]] += np.add.reduceat(values, runs, axis=0)
