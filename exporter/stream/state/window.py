"""Event-time sliding windows as a ring of fixed-width buckets of per-subgroup counts (never raw rows).

The state is one int64 array of shape ``(n_buckets, n_rows, N_COUNTS)``: a row per subgroup of every attribute
(attributes laid end to end), a bucket per ``bucket`` seconds, as many buckets as the longest window plus the
allowed lateness. Memory is independent of traffic; a window is the sum of its last buckets.

Time: the head is the later of the wall clock and the newest event seen. An event is *late*, counted and
dropped, when its bucket has left the ring (older than the longest window plus ``allowed_lateness``). A head
ahead of the clock by more than ``max_future_skew`` (no event can put it there: the clock ran ahead) is brought
back to the clock (:meth:`WindowStore.follow`). The detectors' steps follow the events alone (detection.py).
"""

from __future__ import annotations

import itertools
import logging
import math
import threading
from collections.abc import Callable
from dataclasses import replace

import numpy as np

from exporter.config import ModelSpec, Windowing
from exporter.core.estimate import LABELLED_NEG, LABELLED_POS, N_SCORE_COUNTS, PREDICTED, score_bins
from exporter.core.fairness import FN, FP, N_COUNTS, TP, outcome_columns
from exporter.stream.state.detection import Detection, quiet_steps
from exporter.stream.state.detectors import DetectorBank, Trace
from exporter.stream.state.layout import RowLayout
from exporter.stream.state.proxy import ProxyRing
from exporter.stream.state.segments import SegmentCounts

log = logging.getLogger(__name__)


class WindowStore:
    """One model's bucket ring plus monotonic totals; thread-safe (one writer, scheduled readers)."""

    def __init__(self, model: ModelSpec, windowing: Windowing, lock: threading.RLock | None = None,
                 max_future_skew_seconds: float = math.inf, on_rewind: Callable[[], object] = lambda: None) -> None:
        # how far ahead of the clock the head may be (the backtest's clock, its newest event, is never behind it),
        # and what counts each time it is brought back (follow)
        self.model_id, self.max_future_skew, self.on_rewind = model.model_id, max_future_skew_seconds, on_rewind
        exact = replace(model, attributes=tuple(a for a in model.attributes if a.proxy is None))
        self.layout = RowLayout.of(exact)  # a proxy attribute's float counts are self.proxy's
        self.min_samples = model.min_samples
        self.bucket_seconds = windowing.bucket_seconds
        self.window_buckets = {w.name: round(w.seconds / windowing.bucket_seconds) for w in windowing.windows}
        self.n_buckets = math.ceil((windowing.longest_seconds + windowing.allowed_lateness_seconds)
                                   / windowing.bucket_seconds) + 1  # fmt: skip
        self.counts = np.zeros((self.n_buckets, self.layout.n_rows, N_COUNTS), dtype=np.int64)
        self.bucket_ids = np.full(self.n_buckets, -1, dtype=np.int64)  # absolute bucket held by each slot
        self.totals = np.zeros((self.layout.n_rows, N_COUNTS), dtype=np.int64)  # never reset: for counters
        # Score histograms (a model that emits scores): per bucket and row, the count of scores in each bin
        # (bin i: bounds[i-1] < score <= bounds[i], the last bin above every bound) and their sum.
        self.score_bounds = np.asarray(model.score_buckets, dtype=np.float64)
        n_bins = len(self.score_bounds) + 1 if len(self.score_bounds) else 0
        self.score_counts = np.zeros((self.n_buckets, self.layout.n_rows, n_bins), dtype=np.int64)
        self.score_sums = np.zeros((self.n_buckets, self.layout.n_rows if n_bins else 0), dtype=np.float64)
        # Estimation (model.estimation) or a score metric (auc_difference): per bucket, row, score bin and predicted
        # class, the predictions and the labelled positives and negatives among them (exporter/core/estimate.py).
        n_est = n_bins if model.estimation is not None or model.compares_scores else 0
        self.estimate_counts = np.zeros((self.n_buckets, self.layout.n_rows, n_est, 2, N_SCORE_COUNTS), np.int64)
        self.estimate_totals = np.zeros((self.layout.n_rows, n_est, 2, N_SCORE_COUNTS), dtype=np.int64)
        # Calibration (calibration_difference): per bucket, row and score bin, the sum of the labelled scores.
        self.labelled_sums = np.zeros((self.n_buckets, self.layout.n_rows, n_bins if model.calibrates else 0))
        self.head = -1  # absolute index of the newest bucket
        self.lock = lock or threading.RLock()
        """The one lock of the stream state (every model's store shares the fleet's): the ingest holds it to count
        a batch, its joins and its offsets as one step; the checkpointer to copy every model's counts, the pending
        predictions and the offsets as one consistent state."""
        self.proxy = ProxyRing(model, self.n_buckets)
        self.detectors = DetectorBank(exact, windowing, self.layout.offsets, self.layout.n_rows)
        self.detection = Detection(self.detectors.initial_state(), np.zeros_like(self.totals), -1, 0,
                                   np.zeros_like(self.estimate_totals))  # fmt: skip
        self.quiet, self.newest = quiet_steps(self.n_buckets), -math.inf
        """The most quiet steps in a row; the newest event time counted (not checkpointed: the steps' times)."""
        self.segments = SegmentCounts(model, windowing, self.layout.n_rows)
        """Counts per (subgroup x segment value) for the explanations (``segments:``), in coarser buckets."""

    def bucket_of(self, timestamps: np.ndarray) -> np.ndarray:
        """Absolute bucket index of epoch-second timestamps."""
        return np.floor(np.asarray(timestamps) / self.bucket_seconds).astype(np.int64)

    def _advance(self, head: int) -> None:
        """Move the head to ``head`` if that is later, emptying the slots whose bucket leaves the ring: only a head
        that moves can make a slot stale (every slot claimed since was within the ring of this head)."""
        if head <= self.head:
            return
        self.head = head
        # an empty slot (-1) holds zeros already: only slots whose bucket left the ring need emptying
        self._empty((self.bucket_ids >= 0) & (self.bucket_ids < self.head - self.n_buckets + 1))

    def _empty(self, slots: np.ndarray) -> None:
        """Empty the slots of every ring (a mask)."""
        for ring in (self.counts, self.score_counts, self.score_sums, self.estimate_counts, self.labelled_sums,
                     self.proxy.counts, self.proxy.evidence):  # fmt: skip
            ring[slots] = 0
        self.bucket_ids[slots] = -1

    def follow(self, now: float) -> None:
        """Advance the head to ``now``. A head (or detector step) beyond it by more than max_future_skew was moved by
        a clock that ran ahead (a checkpoint written then, or the clock set back since): it is brought back to now's
        bucket, the buckets after it dropped, logged and counted (else every event of now is late until then)."""
        bucket, d = self._bucket_at(now), self.detection
        if (ahead := max(self.head, d.last_step) * self.bucket_seconds - now) > self.max_future_skew:
            future = self.bucket_ids > bucket
            self._empty(future)
            self.head, self.detection = min(self.head, bucket), replace(d, last_step=min(d.last_step, bucket))
            self.segments.rewind(now)
            log.warning("model %s: the window's head was %.0f s ahead of the clock, beyond max_future_skew (%g s; the "
                        "clock ran ahead): brought back to now, %d bucket(s) after now dropped", self.model_id, ahead,
                        self.max_future_skew, int(future.sum()))  # fmt: skip
            self.on_rewind()
        self._advance(bucket)

    def add(
        self, timestamps: np.ndarray, codes: dict[str, np.ndarray], predictions: np.ndarray, outcomes: np.ndarray,
        now: float, scores: np.ndarray | None = None, segment_codes: np.ndarray | None = None,
        on_step: Callable[[float], object] | None = None,
    ) -> int:  # fmt: skip
        """Count a decoded batch in its order (and its scores, when the store keeps score histograms; its segment
        values' codes, :meth:`SegmentCounts.codes`, when the model has segments); return how many events were late
        (and therefore not counted). Before an event of a bucket after the open step's, the steps the stream takes
        are queued for :meth:`detect` (detection.py), each reported to ``on_step(time)`` with the head at its bucket
        (the backtest reads its windows there; ``time``: the newest event's, or a quiet bucket's start)."""
        buckets = self.bucket_of(timestamps)
        with self.lock:
            self.follow(now)
            stream = np.maximum.accumulate(np.maximum(buckets, self.detection.last_step))
            edges, late = np.r_[0, np.flatnonzero(np.diff(stream)) + 1, len(buckets)] if len(buckets) else [], 0
            for start, stop in itertools.pairwise(edges):  # the runs of one bucket of the stream
                if (bucket := int(stream[start])) > self.detection.last_step:
                    self.enter(bucket, on_step)
                part = slice(int(start), int(stop))
                late += self._add_part(bucket, np.asarray(timestamps)[part], {k: v[part] for k, v in codes.items()},
                                       np.asarray(predictions)[part], np.asarray(outcomes)[part], now,
                                       scores[part] if scores is not None and len(scores) else scores,
                                       None if segment_codes is None else segment_codes[part])  # fmt: skip
            return late

    def enter(self, bucket: int, on_step: Callable[[float], object] | None = None) -> None:
        """The stream enters ``bucket``: queue the steps it takes (detection.py), each reported to ``on_step``."""
        with self.lock:
            opened = self.detection.last_step
            self.detection, n = self.detection.enter(bucket, self.totals, self.estimate_totals, self.quiet)
            for b in range(opened, opened + n):
                self._advance(b)
                if on_step is not None:
                    on_step(max(self.newest, b * self.bucket_seconds))

    def _add_part(self, bucket: int, timestamps: np.ndarray, codes: dict[str, np.ndarray], predictions: np.ndarray,
                  outcomes: np.ndarray, now: float, scores: np.ndarray | None,
                  segment_codes: np.ndarray | None) -> int:  # fmt: skip
        """:meth:`add`'s counting of events while the stream is in ``bucket``; how many were late."""
        buckets = self.bucket_of(timestamps)
        predicted, outcome = outcome_columns(predictions, outcomes)
        self._advance(bucket)
        self.newest = max(self.newest, float(timestamps.max(initial=-math.inf)))
        on_time = buckets > self.head - self.n_buckets
        late = len(buckets) - int(np.count_nonzero(on_time))
        if late:  # the usual batch has none: nothing to mask
            buckets, predicted, outcome, timestamps, predictions, outcomes = (
                a[on_time] for a in (buckets, predicted, outcome, timestamps, predictions, outcomes))
            codes = {k: v[on_time] for k, v in codes.items()}
            scores = scores[on_time] if scores is not None and len(scores) else scores
            segment_codes = None if segment_codes is None else segment_codes[on_time]
        rows = self.layout.rows(codes, len(buckets))
        self._count(buckets, rows, predicted)
        self._count_outcomes(buckets, rows, outcome)
        if segment_codes is not None:
            self.segments.count(timestamps, dict(zip(self.layout.names, rows, strict=True)), predicted, outcome,
                                segment_codes, now)  # fmt: skip
        if self.proxy.attributes:
            slots, labelled = buckets % self.n_buckets, outcome >= 0
            self.proxy.add(slots, codes, predicted)
            self.proxy.add_evidence(slots, codes)
            self.proxy.add(slots[labelled], {k: v[labelled] for k, v in codes.items()}, outcome[labelled])
        if self.score_counts.shape[2] and scores is not None and len(scores):
            self._count_scores(buckets, rows, scores)
            bins = self.estimate_bins(scores)
            if bins is not None:
                self._count_estimate(buckets, rows, bins, predictions, PREDICTED)
                for value, column in ((1, LABELLED_POS), (0, LABELLED_NEG)):
                    k = outcomes == value
                    self._count_estimate(buckets[k], rows[:, k], bins[k], predictions[k], column)
                self._sum_labelled(buckets, rows, bins, scores, outcomes >= 0)
        return late

    def add_joined(self, timestamps: np.ndarray, codes: dict[str, np.ndarray], outcomes: np.ndarray,
                   bins: np.ndarray | None = None, segment_codes: np.ndarray | None = None,
                   scores: np.ndarray | None = None) -> int:  # fmt: skip
        """Count joined ground truth in its prediction's bucket (and score bin, when ``bins`` holds the predictions'
        bins, -1 for none; and segment values, when the prediction waited with their codes; and its score, for the
        calibration, when it waited with it); return how many predictions had left the ring (those still count in
        the totals)."""
        buckets = self.bucket_of(timestamps)
        with self.lock:
            in_ring = buckets > self.head - self.n_buckets
            rows = self.layout.rows(codes, len(buckets))
            self._count_outcomes(buckets[in_ring], rows[:, in_ring], outcomes[in_ring])
            if segment_codes is not None:
                by_name = dict(zip(self.layout.names, rows[:, in_ring], strict=True))
                self.segments.count(np.asarray(timestamps)[in_ring], by_name, None, outcomes[in_ring],
                                    segment_codes[in_ring], self.head * self.bucket_seconds)  # fmt: skip
            if self.proxy.attributes:
                k = in_ring & (outcomes >= 0)
                self.proxy.add(buckets[k] % self.n_buckets, {n: c[k] for n, c in codes.items()}, outcomes[k])
            if self.estimate_counts.shape[2] and bins is not None:
                k = in_ring & (bins >= 0) & (outcomes >= 0)
                predicted = np.isin(outcomes[k], (TP, FP)).astype(np.int64)
                column = np.where(np.isin(outcomes[k], (TP, FN)), LABELLED_POS, LABELLED_NEG)
                self._count_estimate(buckets[k], rows[:, k], bins[k], predicted, column)
                if scores is not None:
                    self._sum_labelled(buckets, rows, bins, scores, k)
            gone = ~in_ring & (outcomes >= 0)
            self._count_totals(rows[:, gone], outcomes[gone])
        return int(gone.sum())

    def _slots(self, buckets: np.ndarray) -> np.ndarray:
        slots = buckets % self.n_buckets
        # Every bucket passed here is within the ring, so its slot holds either this bucket or nothing:
        # _advance already emptied the slots whose bucket left the ring.
        self.bucket_ids[slots] = buckets
        return slots

    def _bucket_at(self, now: float) -> int:
        """Absolute bucket index of one epoch-second time (as :meth:`bucket_of`, without an array)."""
        return math.floor(now / self.bucket_seconds)

    def _count(self, buckets: np.ndarray, rows: np.ndarray, columns: np.ndarray) -> None:
        """Add 1 to each event's (bucket, row, column) cell for every attribute's row (``rows``: RowLayout.rows)."""
        if not len(buckets):
            return
        slots = self._slots(buckets)
        np.add.at(self.counts.reshape(-1), ((slots * self.layout.n_rows + rows) * N_COUNTS + columns).ravel(), 1)
        self._count_totals(rows, columns)

    def _count_scores(self, buckets: np.ndarray, rows: np.ndarray, scores: np.ndarray) -> None:
        if not len(buckets):
            return
        slots = buckets % self.n_buckets  # _count already claimed these slots for their buckets
        bins = np.searchsorted(self.score_bounds, scores, side="left")  # Prometheus' le: upper bound included
        n_rows, n_bins = self.layout.n_rows, self.score_counts.shape[2]
        # Every attribute's cells at once: an attribute's rows never meet another's, so each cell's scores are
        # added in event order, as one call per attribute added them (the same sums to the bit).
        cells = slots * n_rows + rows
        np.add.at(self.score_counts.reshape(-1), (cells * n_bins + bins).ravel(), 1)
        np.add.at(self.score_sums.reshape(-1), cells.ravel(), np.tile(scores, len(rows)))

    def _count_estimate(self, buckets: np.ndarray, rows: np.ndarray, bins: np.ndarray,
                        predicted: np.ndarray, column: int | np.ndarray) -> None:  # fmt: skip
        """Add to the estimation counts' cells (bucket, row, bin, predicted class) the given column."""
        if not len(buckets):
            return
        slots = buckets % self.n_buckets  # _count already claimed these slots for their buckets
        n_rows, n_bins = self.layout.n_rows, self.estimate_counts.shape[2]
        cell = ((rows * n_bins + bins) * 2 + predicted) * N_SCORE_COUNTS + column  # every attribute's at once
        np.add.at(self.estimate_counts.reshape(-1), (slots * (n_rows * n_bins * 2 * N_SCORE_COUNTS) + cell).ravel(), 1)
        np.add.at(self.estimate_totals.reshape(-1), cell.ravel(), 1)

    def _sum_labelled(self, buckets: np.ndarray, rows: np.ndarray, bins: np.ndarray, scores: np.ndarray,
                      labelled: np.ndarray) -> None:  # fmt: skip
        """Add the labelled predictions' scores (where ``labelled``) to their (bucket, row, bin)'s sum."""
        if not self.labelled_sums.shape[2]:
            return
        k = labelled & (bins >= 0)
        slots, n_rows, n_bins = buckets[k] % self.n_buckets, self.layout.n_rows, self.labelled_sums.shape[2]
        np.add.at(self.labelled_sums.reshape(-1), ((slots * n_rows + rows[:, k]) * n_bins + bins[k]).ravel(),
                  np.tile(scores[k], len(rows)))  # fmt: skip

    def _count_totals(self, rows: np.ndarray, columns: np.ndarray) -> None:
        """Add to the monotonic totals (which, unlike the ring, never forget)."""
        np.add.at(self.totals.reshape(-1), (rows * N_COUNTS + columns).ravel(), 1)

    def _count_outcomes(self, buckets: np.ndarray, rows: np.ndarray, outcome: np.ndarray) -> None:
        labelled = outcome >= 0
        if labelled.any():
            self._count(buckets[labelled], rows[:, labelled], outcome[labelled])

    def window_counts(self, now: float) -> dict[str, np.ndarray]:
        """Counts of every window ending at the head (advanced to ``now``), shape ``(n_rows, N_COUNTS)``."""
        return self._windows(self.counts, now)

    def window_proxy_counts(self, now: float) -> dict[str, np.ndarray]:
        """The proxy attributes' counts of every window ending at the head (:class:`ProxyRing`); empty without."""
        return self._windows(self.proxy.counts, now, bool(self.proxy.attributes))

    def window_proxy_evidence(self, now: float) -> dict[str, np.ndarray]:
        """The proxy attributes' predictions of every window ending at the head by what their posteriors rest on,
        ``(attributes, len(proxy.EVIDENCE))`` (:attr:`ProxyRing.evidence`); empty without."""
        return self._windows(self.proxy.evidence, now, bool(self.proxy.attributes))

    def window_scores(self, now: float) -> dict[str, tuple[np.ndarray, np.ndarray]]:
        """Score histograms of every window ending at the head (advanced to ``now``): per row, the count in each
        bin ``(n_rows, n_bins)`` and the sum of the scores ``(n_rows,)``. Empty without score histograms."""
        with self.lock:  # both of one head
            kept = bool(self.score_counts.shape[2])
            counts, sums = self._windows(self.score_counts, now, kept), self._windows(self.score_sums, now, kept)
            return {name: (counts[name], sums[name]) for name in counts}

    def estimate_bins(self, scores: np.ndarray | None) -> np.ndarray | None:
        """The estimation score bin of each score; None when the model estimates nothing (or has no scores)."""
        if not self.estimate_counts.shape[2] or scores is None or not len(scores):
            return None
        return score_bins(scores, self.score_bounds)

    def window_estimate_counts(self, now: float) -> dict[str, np.ndarray]:
        """Estimation counts of every window ending at the head (advanced to ``now``): ``(n_rows, n_bins, 2,
        N_SCORE_COUNTS)`` each. Empty when the model estimates nothing."""
        return self._windows(self.estimate_counts, now, bool(self.estimate_counts.shape[2]))

    def window_labelled_sums(self, now: float) -> dict[str, np.ndarray]:
        """As :meth:`window_estimate_counts`, the labelled scores' sums ``(n_rows, n_bins)``; empty without."""
        return self._windows(self.labelled_sums, now, bool(self.labelled_sums.shape[2]))

    def _windows(self, ring: np.ndarray, now: float, kept: bool = True) -> dict[str, np.ndarray]:
        """Every window of ``ring`` ending at the head (advanced to ``now``); empty for a ring not ``kept``."""
        with self.lock:
            self.follow(now)
            return {name: self._window_sum(ring, k) for name, k in self.window_buckets.items()} if kept else {}

    def _window_sum(self, ring: np.ndarray, k: int) -> np.ndarray:
        # The window's buckets are the k slots ending at the head's, wrapping at most once; a slot in that range
        # holds its bucket or nothing (_advance emptied the rest), so no mask is needed.
        end = self.head % self.n_buckets + 1
        start = end - k
        total = ring[max(start, 0) : end].sum(axis=0)
        return total + ring[start:].sum(axis=0) if start < 0 else total

    def detect(self, calibration: np.ndarray | None = None) -> Detection:
        """Run the detectors over the steps queued (:meth:`add`), ``calibration`` (:meth:`calibration_rows`) for the
        calibration detectors; their state."""
        with self.lock:
            counts, estimates = self.take_queued()
            if len(counts):
                self.advance_detectors(counts, estimates, calibration)
            return self.detection

    def take_queued(self) -> tuple[np.ndarray, np.ndarray]:
        """The queued steps' counts and estimation counts, off the queue, for :meth:`advance_detectors`."""
        with self.lock:
            taken = self.detection.taken(self.totals, self.estimate_totals)
            self.detection = replace(self.detection, queued=None, queued_estimates=None)
            return taken

    def advance_detectors(self, steps: np.ndarray, labelled: np.ndarray | None = None,
                          calibration: np.ndarray | None = None) -> Trace:  # fmt: skip
        """Run the detectors over steps taken off the queue (:meth:`take_queued`); what they were after each."""
        with self.lock:
            state, trace = self.detectors.advance(self.detection.state, steps, labelled, calibration)
            self.detection = replace(self.detection, state=state)
            return trace

    def calibration_rows(self, reference: dict[str, np.ndarray]) -> np.ndarray | None:
        """The rows' calibration fitted on a reference's score counts (:meth:`RowLayout.calibration`); None when the
        model estimates nothing."""
        n_bins = self.estimate_counts.shape[2]
        return self.layout.calibration(reference, self.min_samples, n_bins) if n_bins else None

    def state(self) -> dict[str, np.ndarray]:
        """Arrays for a checkpoint, taken atomically with the detectors' state (which the computation advances)."""
        with self.lock:
            scores = {"score_counts": self.score_counts.copy(), "score_sums": self.score_sums.copy()}
            if self.estimate_counts.shape[2]:
                scores |= {"estimate_counts": self.estimate_counts.copy(),
                           "estimate_totals": self.estimate_totals.copy()}
            if self.labelled_sums.shape[2]:
                scores["labelled_sums"] = self.labelled_sums.copy()
            return {"counts": self.counts.copy(), "bucket_ids": self.bucket_ids.copy(), "totals": self.totals.copy(),
                    "head": np.array(self.head), **self.detection.arrays(self.detectors),
                    **({"proxy_counts": self.proxy.counts.copy(), "proxy_evidence": self.proxy.evidence.copy()}
                       if self.proxy.attributes else {}),
                    **(scores if self.score_counts.shape[2] else {}), **self.segments.state()}  # fmt: skip

    def restore(self, state: dict[str, np.ndarray]) -> None:
        """Load what :meth:`state` produced."""
        with self.lock:
            self.counts[...] = state["counts"]
            self.bucket_ids[...] = state["bucket_ids"]
            self.totals[...] = state["totals"]
            if self.proxy.attributes:  # the layout check made sure the checkpoint has them
                self.proxy.restore(state["proxy_counts"], state.get("proxy_evidence"))
            if self.score_counts.shape[2]:  # the layout check made sure the checkpoint has them, same bounds
                self.score_counts[...] = state["score_counts"]
                self.score_sums[...] = state["score_sums"]
            if self.estimate_counts.shape[2] and "estimate_counts" in state:  # else (estimation newly configured) 0
                self.estimate_counts[...] = state["estimate_counts"]
                self.estimate_totals[...] = state["estimate_totals"]
            if self.labelled_sums.shape[2]:  # the layout check made sure the checkpoint has them
                self.labelled_sums[...] = state["labelled_sums"]
            self.head = int(state["head"])
            self.detection = Detection.restore(state, self.detectors, self.estimate_totals.shape)
            self.segments.restore(state)

    def totals_copy(self) -> np.ndarray:
        """The monotonic totals since start (or since the checkpoint they were restored from)."""
        with self.lock:
            return self.totals.copy()
