"""The change detectors' state as the store keeps it and the checkpoint saves it, and what one of their steps is.

A step is one bucket of the events' own time. The stream's time is the newest event counted, in the order
counted (the topic's, the recording's); the bucket it is in is the *open* step's. When an event of a later bucket
arrives, before it is counted, the open step is taken: everything counted since the step before (its bucket's
events, and late events and joined labels of earlier buckets counted meanwhile, each exactly once), then one empty
step for each bucket the stream passed over without an event (at most :func:`quiet_steps` of them in a row). The
wall clock moves the windows, never the steps: the daemon, its restarts and ``backtest`` take the same steps from
the same stream, whenever they compute and however the stream is cut into batches. Like Kafka Streams' stream
time, the open step waits for an event of a later bucket.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from exporter.stream.state.detectors import DetectorBank, DetectorState

PER_DETECTOR = ("statistic", "evidence", "active")


def quiet_steps(n_buckets: int) -> int:
    """The most empty steps a quiet spell takes: the ring's length (the longest window plus the allowed lateness),
    after which every window is empty. A longer spell (a daemon restarted after days down, two recordings a month
    apart) takes no more, so its cost is bounded; the detectors' guarantee counts the steps taken, so it holds."""
    return n_buckets


def steps_entering(opens: np.ndarray, buckets: np.ndarray, quiet: int) -> np.ndarray:
    """How many steps the stream takes when it moves from the open bucket ``opens`` to ``buckets`` (each pair):
    the open one and the quiet ones between, at most ``quiet`` of those; none before the first event (-1) or
    within the open bucket."""
    moved = (opens >= 0) & (buckets > opens)
    return np.where(moved, 1 + np.minimum(buckets - opens - 1, quiet), 0)


@dataclass(frozen=True)
class Detection:
    """The detectors' state: statistics, what of the totals the steps have taken, the open step, and the steps
    taken but not yet run through the detectors."""

    state: DetectorState
    """As of the steps run (``steps`` minus the queued ones)."""
    seen: np.ndarray
    """The monotonic totals as of the last step taken: the open step holds totals - seen."""
    last_step: int
    """The open step's bucket: the newest bucket of the stream, in which the last step was taken (the first
    event's before the first step; -1 before any event)."""
    steps: int
    """Steps taken, the queued ones included."""
    estimate_seen: np.ndarray | None = None
    """The estimation totals as of the last step (None after a checkpoint without them: the next step takes none)."""
    queued: np.ndarray | None = None
    """(k, n_rows, N_COUNTS): the steps taken since the detectors last ran (:meth:`WindowStore.detect`)."""
    queued_estimates: np.ndarray | None = None
    """(k, n_rows, n_bins, 2, N_SCORE_COUNTS): their estimation counts."""

    def enter(self, bucket: int, totals: np.ndarray, estimate_totals: np.ndarray, quiet: int) -> tuple[Detection, int]:
        """The stream entered ``bucket``: the steps it takes (:func:`steps_entering`) queued; how many."""
        n = int(steps_entering(np.array([self.last_step]), np.array([bucket]), quiet)[0])
        if not n:
            return (replace(self, last_step=bucket) if bucket > self.last_step else self), 0
        seen_estimate = self.estimate_seen if self.estimate_seen is not None else estimate_totals
        counts = np.zeros((n, *totals.shape), totals.dtype)
        counts[0] = totals - self.seen
        estimates = np.zeros((n, *estimate_totals.shape), estimate_totals.dtype)
        estimates[0] = estimate_totals - seen_estimate
        queued, queued_estimates = self.taken(totals, estimate_totals)
        return Detection(self.state, totals.copy(), bucket, self.steps + n, estimate_totals.copy(),
                         np.concatenate([queued, counts]), np.concatenate([queued_estimates, estimates])), n

    def taken(self, totals: np.ndarray, estimate_totals: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The queued steps' counts and estimation counts (shaped as ``totals`` and ``estimate_totals``, per step)."""
        return (self.queued if self.queued is not None else np.zeros((0, *totals.shape), totals.dtype),
                self.queued_estimates if self.queued_estimates is not None else
                np.zeros((0, *estimate_totals.shape), estimate_totals.dtype))  # fmt: skip

    def arrays(self, bank: DetectorBank) -> dict[str, np.ndarray]:
        """The checkpoint's detector arrays (per-detector state keyed by detector, so a changed config keeps the
        detectors it still has), the queued steps included when there are any."""
        per_detector = {f"detector_{name}": getattr(self.state, name).copy() for name in PER_DETECTOR}
        queued = {"detector_queued": self.queued.copy()} if self.queued is not None and len(self.queued) else {}
        if queued and self.queued_estimates is not None:
            queued["detector_queued_estimates"] = self.queued_estimates.copy()
        return {"detector_keys": bank.keys, **per_detector,
                "detector_history": self.state.history.copy(), "detector_seen": self.seen.copy(),
                "detector_last_step": np.array(self.last_step), "detector_steps": np.array(self.steps),
                **({"detector_estimate_seen": self.estimate_seen.copy()} if self.estimate_seen is not None
                   else {}), **queued}  # fmt: skip

    @classmethod
    def restore(cls, arrays: dict[str, np.ndarray], bank: DetectorBank, estimate_shape: tuple[int, ...]) -> Detection:
        """The state a checkpoint holds (every one has detector state: one without is refused before); detectors
        it lacks start at 0. Queued steps without their estimation counts (estimation configured since) have none."""
        state = bank.initial_state()
        index = {key: i for i, key in enumerate(arrays["detector_keys"].tolist())}
        for name in PER_DETECTOR:
            saved, fresh = arrays[f"detector_{name}"], getattr(state, name)
            fresh[...] = [saved[index[key]] if key in index else fresh[j] for j, key in enumerate(bank.keys.tolist())]
        state.history[...] = arrays["detector_history"]
        seen_estimate = arrays.get("detector_estimate_seen")
        queued = arrays.get("detector_queued")
        estimates = arrays.get("detector_queued_estimates")
        if queued is not None and (estimates is None or estimates.shape[1:] != estimate_shape):
            estimates = np.zeros((len(queued), *estimate_shape), np.int64)
        return cls(state, arrays["detector_seen"].copy(), int(arrays["detector_last_step"]),
                   int(arrays["detector_steps"]), None if seen_estimate is None else seen_estimate.copy(),
                   None if queued is None else queued.copy(), None if estimates is None else estimates.copy())
