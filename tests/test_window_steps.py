"""`add_stepped` (the backtest's batched counting) against the store's own per-bucket path: the same steps, the
same windows, the same state, to the count, late and out-of-order events, quiet buckets (a jump of the stream
past the ring's length) and batches cut anywhere included."""

from __future__ import annotations

import itertools
import math

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from exporter.config import parse_config
from exporter.stream.state.steps import add_stepped, batchable
from exporter.stream.state.window import WindowStore

CONFIG = parse_config({"model_id": "m", "windows": ["3m", "10m"], "bucket": "1m", "allowed_lateness": "2m",
                       "protected_attributes": [{"name": "g", "groups": ["a", "b"]},
                                                {"name": "h", "groups": ["x", "y", "z"]}]})  # fmt: skip


def per_bucket(store: WindowStore, batch: dict[str, np.ndarray], now: float) -> tuple[list, int, float]:
    """The backtest's per-bucket path: the store's own add, reading the windows at each step it takes (on_step),
    the steps then taken off its queue."""
    observed, late = [], 0
    heads = np.maximum.accumulate(np.maximum(batch["t"], now))
    late += store.add(batch["t"], {"g": batch["g"], "h": batch["h"]}, batch["p"], batch["y"],
                      now if now > -math.inf else float(heads[0]),
                      on_step=lambda t: observed.append((t, store.window_counts(t))))  # fmt: skip
    counts, _ = store.take_queued()
    assert len(counts) == len(observed)
    return [(t, c, w) for (t, w), c in zip(observed, counts, strict=True)], late, float(heads[-1])


def batches(seed: int, events: int, cuts: list[int]) -> list[dict[str, np.ndarray]]:
    rng = np.random.default_rng(seed)
    t = 1_800_000_000.0 + np.sort(rng.uniform(0, 1800, events))
    t += np.where(rng.random(events) < 0.2, -rng.uniform(0, 900, events), 0.0)  # late or out of order
    t[rng.random(events) < 0.02] += 3600.0  # the head jumps (the ring empties)
    columns = {"t": t.round(3), "g": rng.integers(-1, 2, events), "h": rng.integers(-1, 3, events),
               "p": rng.integers(0, 2, events), "y": rng.integers(-1, 3, events)}  # fmt: skip
    bounds = [0, *sorted({min(c, events) for c in cuts}), events]
    return [{k: v[a:b] for k, v in columns.items()} for a, b in itertools.pairwise(bounds) if b > a]


@settings(max_examples=40, deadline=None)
@given(st.integers(0, 2**31), st.integers(1, 3000), st.lists(st.integers(0, 3000), max_size=4))
def test_add_stepped_equals_the_per_bucket_path(seed: int, events: int, cuts: list[int]) -> None:
    ours, theirs = WindowStore(CONFIG.model(), CONFIG.windowing), WindowStore(CONFIG.model(), CONFIG.windowing)
    assert batchable(ours, counts_segments=False)
    expected, got, late, now = [], [], 0, -math.inf
    for batch in batches(seed, events, cuts):
        steps, n_late, _ = per_bucket(theirs, batch, now)
        expected += steps
        late += n_late
        heads = np.maximum.accumulate(np.maximum(batch["t"], now))
        taken = add_stepped(ours, batch["t"], {"g": batch["g"], "h": batch["h"]}, batch["p"], batch["y"], heads, now)
        got += [(t, taken.counts[i], {w: c[i] for w, c in taken.windows.items()})
                for i, t in enumerate(taken.times.tolist())]  # fmt: skip
        assert taken.late <= len(batch["t"])
        late -= taken.late
        now = float(heads[-1])
    assert late == 0
    for (t, step, windows), (t_ref, step_ref, windows_ref) in zip(got, expected, strict=True):
        assert t == t_ref
        np.testing.assert_array_equal(step, step_ref)
        for name in ("3m", "10m"):
            np.testing.assert_array_equal(windows[name], windows_ref[name])
    for name in ("counts", "bucket_ids", "totals"):
        np.testing.assert_array_equal(getattr(ours, name), getattr(theirs, name))
    assert ours.head == theirs.head
    d, d_ref = ours.detection, theirs.detection
    assert (d.last_step, d.steps) == (d_ref.last_step, d_ref.steps)
    np.testing.assert_array_equal(d.seen, d_ref.seen)
    # the next step (the open bucket's) is the same too
    for store in (ours, theirs):
        store.enter(d.last_step + 1)
    (step,), (step_ref,) = ours.take_queued()[0], theirs.take_queued()[0]
    np.testing.assert_array_equal(step, step_ref)


def test_a_store_that_keeps_scores_is_not_batched() -> None:
    config = parse_config({"model_id": "m", "windows": ["1h"], "bucket": "1m",
                           "events": {"score_threshold": 0.5, "score_buckets": [0.25, 0.5, 0.75]},
                           "protected_attributes": [{"name": "g", "groups": ["a", "b"]}]})  # fmt: skip
    assert not batchable(WindowStore(config.model(), config.windowing), counts_segments=False)
    assert not batchable(WindowStore(CONFIG.model(), CONFIG.windowing), counts_segments=True)
