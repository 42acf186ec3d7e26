"""The change detectors' state as of one step, as the store keeps it and the checkpoint saves it."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from exporter.stream.state.detectors import DetectorBank, DetectorState

PER_DETECTOR = ("statistic", "evidence", "active")


@dataclass(frozen=True)
class Detection:
    """The detectors' state as of one step: statistics, what of the totals they have consumed, which step."""

    state: DetectorState
    seen: np.ndarray
    """The monotonic totals as of the last step: the next step consumes totals - seen."""
    last_step: int
    """Absolute bucket of the head at the last step (-1 before the first)."""
    steps: int
    estimate_seen: np.ndarray | None = None
    """The estimation totals as of the last step (None before the first: the first step consumes nothing)."""

    def arrays(self, bank: DetectorBank) -> dict[str, np.ndarray]:
        """The checkpoint's detector arrays (per-detector state keyed by detector, so a changed config keeps the
        detectors it still has)."""
        per_detector = {f"detector_{name}": getattr(self.state, name).copy() for name in PER_DETECTOR}
        return {"detector_keys": bank.keys, **per_detector,
                "detector_history": self.state.history.copy(), "detector_seen": self.seen.copy(),
                "detector_last_step": np.array(self.last_step), "detector_steps": np.array(self.steps),
                **({"detector_estimate_seen": self.estimate_seen.copy()} if self.estimate_seen is not None
                   else {})}  # fmt: skip

    @classmethod
    def restore(cls, arrays: dict[str, np.ndarray], bank: DetectorBank) -> Detection:
        """The state a checkpoint holds (every one has detector state: one without is refused before); detectors
        it lacks start at 0."""
        state = bank.initial_state()
        index = {key: i for i, key in enumerate(arrays["detector_keys"].tolist())}
        for name in PER_DETECTOR:
            saved, fresh = arrays[f"detector_{name}"], getattr(state, name)
            fresh[...] = [saved[index[key]] if key in index else fresh[j] for j, key in enumerate(bank.keys.tolist())]
        state.history[...] = arrays["detector_history"]
        seen_estimate = arrays.get("detector_estimate_seen")
        return cls(state, arrays["detector_seen"].copy(), int(arrays["detector_last_step"]),
                   int(arrays["detector_steps"]), None if seen_estimate is None else seen_estimate.copy())  # fmt: skip
