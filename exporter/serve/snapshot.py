"""The scheduled computation: window counts in, one complete immutable Snapshot out."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from exporter.config import Config
from exporter.core.evaluate import Evaluation, evaluate_many
from exporter.serve.self_metrics import Health
from exporter.stream.detectors import DetectorBank
from exporter.stream.window import Detection, WindowStore

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Snapshot:
    """Everything /metrics shows about fairness, as of one computation."""

    model_id: str
    computed_at: float
    evaluations: tuple[tuple[str, Evaluation], ...]
    """(window name, evaluation) for every window and attribute."""
    totals: dict[str, np.ndarray]
    """Monotonic per-attribute counts since start, for the fleet-wide counters."""
    metrics: tuple[str, ...] = ()
    """The pairwise metrics to export (Config.exported_metrics)."""
    thresholds: tuple[tuple[str, float], ...] = ()
    """(metric, threshold) of each exported metric, exported so that rules compare against the config."""
    detection: Detection | None = None
    """The change detectors' statistics after their latest step."""
    detectors: DetectorBank | None = None
    """What each detector watches, and the alarm level."""
    score_bounds: tuple[float, ...] = ()
    """Upper bounds of the score histograms (empty: the model emits no scores)."""
    scores: tuple[tuple[str, str, np.ndarray, np.ndarray], ...] = ()
    """(window, attribute, count per row and bin, sum of scores per row) for each window and attribute; the rows
    are the attribute's groups, then its unknown category."""


class Computer:
    """Builds a Snapshot from the store and swaps it in with one reference assignment."""

    def __init__(
        self, config: Config, store: WindowStore, health: Health, clock: Callable[[], float] = time.time,
        on_snapshot: Callable[[Snapshot], None] | None = None,
    ) -> None:  # fmt: skip
        """``on_snapshot`` runs after each swap, on the computation's thread (the daemon serialises it there)."""
        self.on_snapshot = on_snapshot
        self.config = config
        self.store = store
        self.health = health
        self.clock = clock
        self.latest: Snapshot | None = None
        self._thresholds = tuple(config.thresholds().items())

    def compute(self) -> Snapshot:
        """Compute every window and attribute; publish the result as the latest snapshot."""
        started = time.perf_counter()
        now = self.clock()
        detection = self.store.detect(now)
        with self.store.lock:  # counts and score histograms of the same events
            windows = self.store.window_counts(now)
            window_scores = self.store.window_scores(now)
        keys, blocks = [], []
        for window in self.config.windows:
            by_attribute = self.store.layout.split(windows[window.name])
            for attribute in self.config.attributes:
                keys.append(window.name)
                blocks.append((attribute, by_attribute[attribute.name]))
        evaluated = evaluate_many(blocks, self.config.min_samples, self.config.exported_metrics)
        evaluations = list(zip(keys, evaluated, strict=True))
        scores: list[tuple[str, str, np.ndarray, np.ndarray]] = []
        for window_name, (bins, sums) in window_scores.items():
            bins_of, sums_of = self.store.layout.split(bins), self.store.layout.split(sums)
            scores.extend((window_name, a.name, bins_of[a.name], sums_of[a.name]) for a in self.config.attributes)
        snapshot = Snapshot(self.config.model_id, now, tuple(evaluations),
                            self.store.layout.split(self.store.totals_copy()), self.config.exported_metrics,
                            self._thresholds, detection, self.store.detectors,
                            score_bounds=self.config.score_buckets, scores=tuple(scores))  # fmt: skip
        self.latest = snapshot
        if self.on_snapshot is not None:
            self.on_snapshot(snapshot)
        self.health.last_computation.set(now)
        self.health.computation_duration.set(time.perf_counter() - started)
        return snapshot

    def run_scheduled(self) -> None:
        """The APScheduler job: never raises, counts failures."""
        try:
            self.compute()
        except Exception:
            self.health.computation_errors.inc()
            log.exception("fairness computation failed; /metrics keeps the previous snapshot")
