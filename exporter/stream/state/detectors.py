"""The model's change detectors: which comparisons are watched, their alternatives, their state, and when they page.

One detector per (attribute pair, metric family, direction) and per (subgroup, direction). A step consumes the
counts added to the window since the previous step (see :meth:`WindowStore.detect`), so every prediction and
every delayed label enters the detectors exactly once, when it is counted. Each detector's null is "the
comparison meets its threshold" (a pair: its gap or impact ratio threshold; a subgroup: within ``rate_shift`` of
its baseline); the null's edge and the alternative of each step come from earlier steps only (exponentially
weighted history with the longest window as time constant) and the step's own trials, which keeps each
detector's likelihood-ratio products test supermartingales under its null (exporter/core/detect.py).

:data:`ALERTS` is the one statement of what pages: the rules generator writes it as PromQL and the backtest
evaluates it on the same statistics.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Final, Literal

import numpy as np
from numpy.typing import NDArray

from exporter.config import ModelSpec, Windowing
from exporter.core import detect
from exporter.core.attributes import OTHER_GROUP
from exporter.core.estimate import CALIBRATION_SHIFT, calibration_log_lr
from exporter.core.fairness import FN, FP, N_COUNTS, PRED_NEG, PRED_POS, TN, TP, wilson_interval

FloatArray = NDArray[np.float64]

SHIFT_BASELINE_Z: Final = 4.0
"""The subgroup shift detector's null is ``rate_shift`` beyond the edge of its baseline's Wilson interval at this z
(one-sided miss probability 3e-5), so an estimated baseline does not turn noise into evidence."""


@dataclass(frozen=True)
class Family:
    """A rate compared between two groups: its counts columns and the configured metric that sets its threshold."""

    name: str
    """The `metric` label of the detector."""
    config_metric: str
    positive: int
    columns: tuple[int, int]
    kind: Literal["gap", "ratio"]


FAMILIES: Final = (
    Family("demographic_parity_difference", "demographic_parity_difference", PRED_POS, (PRED_POS, PRED_NEG), "gap"),
    Family("disparate_impact_ratio", "disparate_impact_ratio", PRED_POS, (PRED_POS, PRED_NEG), "ratio"),
    Family("true_positive_rate_difference", "equalised_odds_difference", TP, (TP, FN), "gap"),
    Family("false_positive_rate_difference", "equalised_odds_difference", FP, (FP, TN), "gap"),
)
SUBGROUP_METRIC: Final = "positive_prediction_rate"
CALIBRATION_METRIC: Final = "calibration"
"""The metric of the calibration detectors (estimation:): a subgroup's labels against its calibrated scores."""
CHUNK_TERMS: Final = 1_000_000
"""How many (step x detector) likelihood ratios one vectorised pass of :meth:`DetectorBank.advance` may hold."""


@dataclass(frozen=True)
class Alert:
    """A paging condition: a detector of one of `metrics` in alarm (see :meth:`DetectorBank.advance`)."""

    name: str
    severity: Literal["critical", "warning"]
    metrics: tuple[str, ...]
    shown: str
    """The /metrics family (with _lower/_upper) whose value and interval the alert shows."""


ALERTS: Final = (
    Alert("FairnessDemographicParityDrift", "critical", ("demographic_parity_difference",),
          "model_demographic_parity_difference"),
    Alert("FairnessDisparateImpactViolation", "critical", ("disparate_impact_ratio",), "model_disparate_impact_ratio"),
    Alert("FairnessEqualisedOddsDrift", "critical",
          ("true_positive_rate_difference", "false_positive_rate_difference"), "model_equalised_odds_difference"),
    Alert("SubgroupPredictionRateShift", "warning", (SUBGROUP_METRIC,), "model_positive_prediction_rate"),
    Alert("FairnessEstimateInvalid", "warning", (CALIBRATION_METRIC,), "model_calibration_statistic"),
)  # fmt: skip
ALERT_OF_METRIC: Final = {m: a for a in ALERTS for m in a.metrics}


@dataclass(frozen=True)
class Detector:
    """What one detector watches; `dimension`, `group_a`, `group_b` are empty for a subgroup detector."""

    attribute: str
    metric: str
    direction: str
    """`a_higher` / `b_higher` for a pair (whose rate the alternative puts higher), `up` / `down` for a subgroup."""
    dimension: str = ""
    group_a: str = ""
    group_b: str = ""
    subgroup: str = ""
    predicted: str = ""
    """The predicted class (``0``/``1``) whose labelled rows a calibration detector reads; empty for the others."""

    @property
    def key(self) -> str:
        """A stable identity, for matching checkpointed state to the configured detectors."""
        parts = (self.attribute, self.metric, self.direction, self.dimension, self.subgroup)
        return "|".join((*parts, self.predicted) if self.predicted else parts)


@dataclass
class DetectorState:
    """Per detector (any leading batch shape): the evidence, the alarm, and the history of the alternatives."""

    statistic: FloatArray
    """(..., n_detectors) CUSUM of the log likelihood ratios: the evidence of a change now (nats)."""
    evidence: FloatArray
    """(..., n_detectors) log of the Shiryaev-Roberts statistic, reset to -inf (R = 0) at each alarm."""
    active: NDArray[np.bool_]
    """(..., n_detectors) the alarm holds: raised when the evidence reaches the level, until the CUSUM is 0."""
    history: FloatArray
    """(..., n_rows, N_COUNTS): exponentially weighted counts of earlier steps."""


@dataclass(frozen=True)
class Trace:
    """What the detectors were after every step of an :meth:`DetectorBank.advance`, shape (T, ..., n_detectors)."""

    statistic: FloatArray
    active: NDArray[np.bool_]


@dataclass(frozen=True)
class _CountGroup:
    """Pair detectors that read the same counts (e.g. parity and impact ratio both read selections): one pooled
    rate of the history per pair centres all their nulls' edges."""

    positive: int
    columns: tuple[int, int]
    rows_a: NDArray[np.int64]
    """(P,) pairs"""
    rows_b: NDArray[np.int64]
    thresholds: FloatArray
    """(J,) detectors per pair: family threshold, repeated for each direction"""
    is_ratio: NDArray[np.bool_]
    signs: FloatArray
    """(J,) 1 where the alternative puts group a higher (`a_higher`), -1 where b"""

    def counts(self, counts: NDArray, rows: NDArray[np.int64]) -> tuple[NDArray, NDArray]:
        """(positives, trials) of the given rows, shape (..., P)."""
        cells = counts[..., rows, :]
        return cells[..., self.positive], cells[..., self.columns[0]] + cells[..., self.columns[1]]

    def log_lr(self, history: FloatArray, step: NDArray) -> FloatArray:
        """(..., P * J) log LRs of one step against each detector's null "the pair meets its threshold"; the
        null's edge and the alternative come from the history (and the step's trials) only."""
        hk_a, hn_a = self.counts(history, self.rows_a)
        hk_b, hn_b = self.counts(history, self.rows_b)
        with np.errstate(invalid="ignore", divide="ignore"):
            pooled = (hk_a + hk_b) / (hn_a + hn_b)
        a = self.counts(step, self.rows_a)
        b = self.counts(step, self.rows_b)
        out = np.stack([
            detect.two_sample_log_lr(*(a + b if self.signs[j] > 0 else b + a),
                                     (detect.ratio_edge if self.is_ratio[j] else detect.gap_edge)(
                                         pooled, float(self.thresholds[j])))
            for j in range(len(self.thresholds))
        ], axis=-1)  # fmt: skip
        return out.reshape((*out.shape[:-2], -1))


class DetectorBank:
    """Every detector of one model, vectorised; pure: state in, state out (the window store keeps it)."""

    def __init__(self, model: ModelSpec, windowing: Windowing, offsets: tuple[int, ...], n_rows: int) -> None:
        """``offsets``: the first row of each attribute in the window store's counts, ``n_rows`` their number
        (RowLayout: each attribute's groups, then its unknown row, which no detector reads)."""
        thresholds = {m.name: m.threshold for m in model.metrics}
        detectors: list[Detector] = []
        self._groups: list[_CountGroup] = []
        for columns in dict.fromkeys((f.positive, f.columns) for f in FAMILIES):
            families = [f for f in FAMILIES if (f.positive, f.columns) == columns and f.config_metric in thresholds]
            if not families:
                continue
            rows_a, rows_b = [], []
            for attribute, offset in zip(model.attributes, offsets, strict=True):
                for a, b in attribute.pairs:
                    ga, gb = attribute.groups[a], attribute.groups[b]
                    rows_a.append(offset + a)
                    rows_b.append(offset + b)
                    detectors += [Detector(attribute.name, f.name, direction, f"{ga}_vs_{gb}", ga, gb)
                                  for f in families for direction in ("a_higher", "b_higher")]  # fmt: skip
            self._groups.append(_CountGroup(
                columns[0], columns[1], np.array(rows_a, dtype=np.int64), np.array(rows_b, dtype=np.int64),
                thresholds=np.array([thresholds[f.config_metric] for f in families for _ in (1, -1)]),
                is_ratio=np.array([f.kind == "ratio" for f in families for _ in (1, -1)]),
                signs=np.array([sign for _ in families for sign in (1.0, -1.0)]),
            ))  # fmt: skip
        self.n_pairs = len(detectors)
        subgroup_rows, subgroup_signs = [], []
        for attribute, offset in zip(model.attributes, offsets, strict=True):
            for i, group in enumerate(attribute.groups):
                if attribute.catch_all(group) and group == OTHER_GROUP:
                    continue
                for sign, direction in ((1.0, "up"), (-1.0, "down")):
                    detectors.append(Detector(attribute.name, SUBGROUP_METRIC, direction, subgroup=group))
                    subgroup_rows.append(offset + i)
                    subgroup_signs.append(sign)
        self.n_before_calibration = len(detectors)
        calibration_rows, calibration_classes, calibration_signs = [], [], []
        if model.estimation is not None:
            for attribute, offset in zip(model.attributes, offsets, strict=True):
                for i, group in enumerate(attribute.groups):
                    for predicted in (0, 1):
                        for sign, direction in ((1.0, "up"), (-1.0, "down")):
                            detectors.append(Detector(attribute.name, CALIBRATION_METRIC, direction, subgroup=group,
                                                      predicted=str(predicted)))  # fmt: skip
                            calibration_rows.append(offset + i)
                            calibration_classes.append(predicted)
                            calibration_signs.append(sign)
        self._calibration = (np.array(calibration_rows, dtype=np.int64), np.array(calibration_classes, np.int64),
                             np.array(calibration_signs))  # fmt: skip
        self.detectors = tuple(detectors)
        self.keys = np.array([d.key for d in detectors])
        self.n_rows = n_rows
        self._subgroup_rows = np.array(subgroup_rows, dtype=np.int64)
        self._subgroup_sign = np.array(subgroup_signs)
        self.rate_shift = model.alerting.rate_shift
        self.decay = math.exp(-windowing.bucket_seconds / windowing.longest_seconds)
        self.level = detect.alarm_level(max(len(detectors), 1), detect.SECONDS_PER_DAY / windowing.bucket_seconds,
                                        model.alerting.false_pages_per_day)  # fmt: skip

    def __len__(self) -> int:
        return len(self.detectors)

    def initial_state(self, batch: tuple[int, ...] = ()) -> DetectorState:
        shape = (*batch, len(self))
        return DetectorState(np.zeros(shape), np.full(shape, -np.inf), np.zeros(shape, dtype=bool),
                             np.zeros((*batch, self.n_rows, N_COUNTS)))  # fmt: skip

    def _subgroup_log_lr(self, history: FloatArray, step: NDArray[np.int64]) -> FloatArray:
        rows = self._subgroup_rows
        k0 = history[..., rows, PRED_POS]
        n0 = k0 + history[..., rows, PRED_NEG]
        lower, upper = wilson_interval(k0, n0, SHIFT_BASELINE_Z)
        with np.errstate(invalid="ignore", divide="ignore"):
            rate = k0 / n0
        up = self._subgroup_sign > 0
        # the null: the rate within rate_shift of its baseline (of the baseline's far edge: it is estimated)
        reference = np.where(up, upper, lower) + self._subgroup_sign * self.rate_shift
        margin = detect.RATE_MARGIN
        alternative = np.clip(rate + self._subgroup_sign * 2.0 * self.rate_shift, margin, 1.0 - margin)
        reference = np.clip(reference, margin, 1.0 - margin)
        # Evidence only where the alternative lies beyond the reference (a baseline exists and is precise enough).
        useful = np.where(up, alternative > reference, alternative < reference) & (n0 > 0)
        k = step[..., rows, PRED_POS]
        n = k + step[..., rows, PRED_NEG]
        safe_ref = np.where(useful, reference, 0.5)
        safe_alt = np.where(useful, alternative, 0.5)
        return np.where(useful, detect.one_sample_log_lr(k, n, safe_ref, safe_alt), 0.0)

    def _calibration_log_lr(self, labelled: NDArray | None, calibration: NDArray | None,
                            shape: tuple[int, ...]) -> FloatArray:  # fmt: skip
        """(T, ..., calibration detectors) log LRs of an odds shift of CALIBRATION_SHIFT up or down against the
        calibration and its sampling spread ``(2, n_rows, n_bins)``, from each step's labelled estimation counts; 0
        without them."""
        rows, classes, signs = self._calibration
        if labelled is None or calibration is None or not len(rows):
            return np.zeros((*shape, len(rows)))
        shifts = np.array([CALIBRATION_SHIFT, -CALIBRATION_SHIFT])
        with np.errstate(invalid="ignore"):
            lr = calibration_log_lr(calibration[0], labelled, shifts, calibration[1])  # (T, ..., n_rows, 2, 2)
        picked = lr[..., rows, classes, (signs < 0).astype(np.int64)]
        return np.nan_to_num(picked, nan=0.0)  # a row without a calibration (its unknown category) has no evidence

    def advance(self, state: DetectorState, steps: NDArray[np.int64], labelled: NDArray | None = None,
                calibration: NDArray | None = None) -> tuple[DetectorState, Trace]:  # fmt: skip
        """Run the detectors over ``steps`` of shape (T, ..., n_rows, N_COUNTS): the counts of each step
        (``labelled``: each step's estimation counts, (T, ..., n_rows, n_bins, 2, N_SCORE_COUNTS), and
        ``calibration`` the rows' calibration and its spread, for the calibration detectors).

        Per step and detector, with LR the step's likelihood ratio (expectation at most 1 while the detector's null
        holds: a pair that meets its threshold, a subgroup within ``rate_shift`` of its baseline):

        * Shiryaev-Roberts ``R = (1 + R) x LR``; an alarm when ``R >= e^h``, and R restarts at 0. ``R - t`` is a
          supermartingale, so the expected number of alarms in T steps is at most ``T e^-h`` (optional stopping);
        * CUSUM ``S = max(0, S + log LR)`` (never above log R): the evidence of a change now. An alarm holds until
          S is back at 0, so a persisting change pages once and a page resolves when its evidence is gone.

        The steps go in chunks: the nulls and alternatives depend only on the counts, so the likelihood ratios of a
        chunk take one vectorised pass, and CUSUM is ``S_t = C_t - min(-S_0, min_{j<=t} C_j)`` with ``C`` the
        cumulative log LR; only the alarms' resets are a (cheap) loop over the steps.
        """
        steps = np.asarray(steps)
        statistic, evidence, active, history = state.statistic, state.evidence, state.active, state.history
        statistics = np.empty((len(steps), *statistic.shape))
        actives = np.empty((len(steps), *statistic.shape), dtype=bool)
        per_chunk = max(1, CHUNK_TERMS // max(1, int(np.prod(statistic.shape))))
        t = 0
        while t < len(steps):
            stop = min(t + per_chunk, len(steps))
            chunk = steps[t:stop]
            histories = np.empty((len(chunk) + 1, *history.shape))  # before each step, and after the last
            histories[0] = history
            for i, step in enumerate(chunk):
                np.multiply(histories[i], self.decay, out=histories[i + 1])
                histories[i + 1] += step
            history = histories[-1].copy()
            log_lr = np.concatenate([*(g.log_lr(histories[:-1], chunk) for g in self._groups),
                                     self._subgroup_log_lr(histories[:-1], chunk),
                                     self._calibration_log_lr(None if labelled is None else labelled[t:stop],
                                                              calibration, chunk.shape[:-2])], axis=-1)  # fmt: skip
            cumulative = np.cumsum(log_lr, axis=0)
            statistics[t:stop] = cumulative - np.minimum(np.minimum.accumulate(cumulative, axis=0), -statistic)
            alarms = np.empty(log_lr.shape, dtype=bool)
            for i in range(len(chunk)):
                evidence, alarms[i] = detect.shiryaev_roberts(evidence, log_lr[i], self.level)
            # active = alarm | (the step before's active & statistic > 0): the alarm of the last step that was an
            # alarm or had its statistic at 0 (cleared), or the chunk's initial active if none was
            index = np.arange(len(chunk)).reshape(-1, *(1,) * (log_lr.ndim - 1))
            last = np.maximum.accumulate(np.where(alarms | ~(statistics[t:stop] > 0.0), index, -1), axis=0)
            actives[t:stop] = np.where(last >= 0, np.take_along_axis(alarms, np.maximum(last, 0), axis=0), active)
            active = actives[stop - 1].copy()
            statistic = statistics[stop - 1]
            t = stop
        return DetectorState(statistic.copy(), evidence, active, history), Trace(statistics, actives)
