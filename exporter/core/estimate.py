"""Label-based fairness before the labels: rates and gaps estimated from per-group calibrated scores.

With a calibrated probability ``p`` per prediction, a group's expected true positives are ``sum p * yhat`` and its
expected positives ``sum p``, so its TPR is estimated by ``sum p yhat / sum p`` and its FPR by
``sum (1 - p) yhat / sum (1 - p)``; precision and accuracy follow from the same expected counts.

Pure functions of additive counts per (group, score bin, predicted class), numpy only:

* a **score-counts array** has shape ``(n_groups, n_bins, 2, N_SCORE_COUNTS)``: axis 2 is the prediction (0, 1),
  the last axis the predictions and the labelled positives and negatives among them;
* the **calibration** is per group: isotonic over the score bins, each group's bin rates shrunk toward the pooled
  curve by ``prior_strength`` pseudo-counts per bin, so a small group borrows the pooled shape and a large group
  keeps its own (one global calibrator turns one group's miscalibration into a gap that is not there);
* the **interval** is a parametric bootstrap with a fixed seed (the same counts give the same interval in the gate,
  the daemon and ``backtest``): each replicate redraws the reference's labels from the fitted calibration and
  refits it (the calibrator's uncertainty), then draws the window's labels from that refit (the Poisson-binomial
  variance of the counts). So it is an interval for the gap the labels will show when they arrive;
* the **calibration statistic** ``(sum y - sum p) / sqrt(sum p (1 - p))`` per group and predicted class, and the
  likelihood ratio of an odds shift for the sequential detectors, test the calibration once labels arrive (under
  concept shift the estimate is confidently wrong, and this is how it is caught).
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from functools import cache, lru_cache
from typing import Final

import numpy as np
from numpy.typing import NDArray

from exporter.core.attributes import Attribute
from exporter.core.detect import RATE_MARGIN, logit, one_sample_log_lr
from exporter.core.fairness import (
    FN,
    FP,
    N_COUNTS,
    PRED_NEG,
    PRED_POS,
    RATES,
    TN,
    TP,
    FloatArray,
    IntArray,
    abs_interval,
    ratio,
)
from exporter.core.metric_table import CONFIDENCE, METRICS, MetricValues

PREDICTED, LABELLED_POS, LABELLED_NEG = range(3)
N_SCORE_COUNTS: Final = 3
SCORE_COUNT_NAMES: Final = ("predictions", "labelled_positives", "labelled_negatives")

PRIOR_STRENGTH: Final = 4.0
"""Pseudo-counts per score bin that pull a group's calibration toward the pooled curve."""
REPLICATES: Final = 1000
SEED: Final = 33
"""The bootstrap's fixed seed: an estimate is a function of its counts alone."""
ESTIMATED_METRICS: Final = tuple(name for name, m in METRICS.items()
                                 if m.needs_labels and m.kind == "difference" and not m.scores)
"""The label-based metrics that have an estimate."""
CALIBRATION_SHIFT: Final = 0.5
"""The calibration detector's alternatives: the log odds of a positive label shifted by this much, up or down."""
CALIBRATION_BOUND_Z: Final = 2.0
"""The calibration detectors' null: the fitted calibration moved this many of its bootstrap standard deviations
toward the alternative, so the reference's own sampling error (shared by every step) does not page."""


def score_bins(scores: NDArray, bounds: NDArray) -> IntArray:
    """Bin of each score: bin i holds ``bounds[i-1] < score <= bounds[i]`` (Prometheus' ``le``), the last bin the
    scores above every bound; the daemon's score histograms bin by the same rule.

    >>> score_bins(np.array([0.1, 0.15, 0.5, 0.95]), np.array([0.1, 0.5, 0.9])).tolist()
    [0, 1, 1, 3]
    """
    bounds = np.asarray(bounds, dtype=np.float64)
    return np.searchsorted(bounds, np.asarray(scores, dtype=np.float64), side="left").astype(np.int64)


def score_counts(
    codes: NDArray, n_groups: int, bins: NDArray, n_bins: int, y_pred: NDArray, y_true: NDArray | None = None,
    weights: NDArray | None = None,
) -> IntArray:
    """Reduce per-row group codes (``-1`` = excluded), score bins, 0/1 predictions and optional labels (``-1`` =
    unlabelled) to a ``(n_groups, n_bins, 2, N_SCORE_COUNTS)`` score-counts array; ``weights``: how many rows each
    row stands for (counts an engine already aggregated).

    >>> score_counts(np.array([0, 0, 1]), 2, np.array([0, 1, 1]), 2, np.array([0, 1, 1]),
    ...              np.array([1, 0, -1]))[0].tolist()
    [[[1, 1, 0], [0, 0, 0]], [[0, 0, 0], [1, 0, 1]]]
    """
    codes = np.asarray(codes, dtype=np.int64)
    bins = np.asarray(bins, dtype=np.int64)
    y_pred = np.asarray(y_pred, dtype=np.int64)
    y_true = np.full_like(y_pred, -1) if y_true is None else np.asarray(y_true, dtype=np.int64)
    keep = (codes >= 0) & ((y_pred == 0) | (y_pred == 1))
    cell = ((codes * n_bins + bins) * 2 + y_pred)[keep] * N_SCORE_COUNTS
    label = y_true[keep]
    w = None if weights is None else np.asarray(weights, dtype=np.float64)[keep]
    size = n_groups * n_bins * 2 * N_SCORE_COUNTS
    out = np.bincount(cell + PREDICTED, weights=w, minlength=size)
    for value, slot in ((1, LABELLED_POS), (0, LABELLED_NEG)):
        out += np.bincount(cell[label == value] + slot, weights=None if w is None else w[label == value],
                           minlength=size)  # fmt: skip
    return np.rint(out).astype(np.int64).reshape(n_groups, n_bins, 2, N_SCORE_COUNTS)


def isotonic(values: NDArray, weights: NDArray) -> FloatArray:
    """Weighted least-squares non-decreasing fit along the last axis, vectorised over the others.

    The min-max formula ``x_i = max_{j<=i} min_{k>=i} mean(j..k)`` costs O(bins^2) per curve: nothing, for the few
    bins a calibration has, and no Python loop over replicates.

    >>> isotonic(np.array([0.1, 0.3, 0.2, 0.6]), np.array([1.0, 1.0, 1.0, 2.0])).round(3).tolist()
    [0.1, 0.25, 0.25, 0.6]
    """
    v = np.asarray(values, dtype=np.float64)
    w = np.asarray(weights, dtype=np.float64)
    below, above = _triangles(v.shape[-1])
    zero = np.zeros((*v.shape[:-1], 1))
    cw = np.concatenate([zero, np.cumsum(w, axis=-1)], axis=-1)
    cv = np.concatenate([zero, np.cumsum(w * v, axis=-1)], axis=-1)
    num = cv[..., None, 1:] - cv[..., :-1, None]  # [j, k]: weighted sum and weight of j..k
    den = cw[..., None, 1:] - cw[..., :-1, None]
    mean = np.divide(num, den, out=np.zeros_like(num), where=den > 0) + below  # +inf below the diagonal
    upper = np.minimum.accumulate(mean[..., ::-1], axis=-1)[..., ::-1]  # [j, i]: min over k >= i
    return np.asarray((upper + above).max(axis=-2))  # max over j <= i


@cache
def _triangles(n: int) -> tuple[FloatArray, FloatArray]:
    """(n, n) masks to add: +inf where k < j (no mean of j..k), -inf where j > i (no start after i)."""
    j, k = np.indices((n, n))
    return np.where(k >= j, 0.0, np.inf), np.where(j <= k, 0.0, -np.inf)


def calibrate(positives: NDArray, negatives: NDArray, prior_strength: float = PRIOR_STRENGTH) -> FloatArray:
    """Per group and score bin, the probability of a positive label from labelled counts ``(..., groups, bins)``:
    the pooled curve (isotonic, a Jeffreys half-count per bin), then each group's bin rates shrunk toward it by
    ``prior_strength`` pseudo-counts and made isotonic."""
    pos = np.asarray(positives, dtype=np.float64)
    n = pos + np.asarray(negatives, dtype=np.float64)
    pooled_n = n.sum(axis=-2)
    pooled = isotonic((pos.sum(axis=-2) + 0.5) / (pooled_n + 1.0), pooled_n + 1.0)
    shrunk = (pos + prior_strength * pooled[..., None, :]) / (n + prior_strength)
    return isotonic(shrunk, n + prior_strength)


def outcome_counts(counts: NDArray) -> IntArray:
    """(n_groups, N_COUNTS) counts array of a score-counts array: its predictions and its labelled outcomes."""
    c = np.asarray(counts, dtype=np.int64).sum(axis=1)  # (G, 2, 3)
    out = np.zeros((*c.shape[:-2], N_COUNTS), dtype=np.int64)
    out[..., PRED_POS], out[..., PRED_NEG] = c[..., 1, PREDICTED], c[..., 0, PREDICTED]
    out[..., TP], out[..., FP] = c[..., 1, LABELLED_POS], c[..., 1, LABELLED_NEG]
    out[..., FN], out[..., TN] = c[..., 0, LABELLED_POS], c[..., 0, LABELLED_NEG]
    return out


@dataclass(frozen=True)
class Calibration:
    """A per-group calibration and the labelled reference it was fitted on."""

    rate: FloatArray
    """(n_groups, n_bins) probability of a positive label per group and score bin."""
    reference: IntArray
    """(n_groups, n_bins, 2, N_SCORE_COUNTS) the reference's score counts."""
    prior_strength: float = PRIOR_STRENGTH

    @classmethod
    def fit(cls, reference: NDArray, prior_strength: float = PRIOR_STRENGTH) -> Calibration:
        """From a reference's score-counts array (its labelled rows; the predicted class pooled per bin, so the bins
        need the decision threshold as a bound, which :attr:`exporter.config.ModelSpec.score_buckets` has)."""
        ref = np.asarray(reference, dtype=np.int64)
        pooled = ref.sum(axis=2)
        return cls(calibrate(pooled[..., LABELLED_POS], pooled[..., LABELLED_NEG], prior_strength), ref,
                   prior_strength)  # fmt: skip

    @property
    def covariance(self) -> FloatArray:
        """(n_groups, n_bins, n_bins) sampling covariance of ``rate`` (isotonic fit, shrinkage and all) over the
        interval's bootstrap refits: the error every labelled row of a window shares when tested against it."""
        refits = _refits(self.reference.tobytes(), self.reference.shape, self.prior_strength, REPLICATES, SEED)
        d = refits - refits.mean(axis=0)
        return np.asarray(np.einsum("rgi,rgj->gij", d, d) / max(len(refits) - 1, 1))

    @property
    def spread(self) -> FloatArray:
        """(n_groups, n_bins) standard deviation of ``rate`` from the reference's sampling (the calibration
        detectors' bound)."""
        return np.sqrt(np.diagonal(self.covariance, axis1=-2, axis2=-1))

    def refits(self, rng: np.random.Generator, n: int) -> FloatArray:
        """(n, n_groups, n_bins) calibrations refitted on reference labels redrawn from this one."""
        pooled = self.reference.sum(axis=2)
        trials = pooled[..., LABELLED_POS] + pooled[..., LABELLED_NEG]
        pos = rng.binomial(np.broadcast_to(trials, (n, *trials.shape)), self.rate)
        return calibrate(pos, trials - pos, self.prior_strength)


def _window_outcomes(n: NDArray, positives_1: NDArray, positives_0: NDArray) -> FloatArray:
    """(..., n_groups, N_COUNTS) from per-bin predictions ``n`` (G, B, 2) and the positives among the predicted
    positives and negatives of each bin (``(..., G, B)``, expected or drawn)."""
    pos_pred = np.asarray(n[..., 1].sum(axis=-1), dtype=np.float64)
    neg_pred = np.asarray(n[..., 0].sum(axis=-1), dtype=np.float64)
    tp, fn = np.asarray(positives_1).sum(axis=-1), np.asarray(positives_0).sum(axis=-1)
    out = np.zeros((*tp.shape, N_COUNTS))
    out[..., PRED_POS], out[..., PRED_NEG] = pos_pred, neg_pred
    out[..., TP], out[..., FN], out[..., FP], out[..., TN] = tp, fn, pos_pred - tp, neg_pred - fn
    return out


def _rate(counts: NDArray, name: str) -> FloatArray:
    """A named rate of :data:`RATES` from float counts (expected or drawn), NaN where undefined."""
    num, den = RATES[name]
    c = np.asarray(counts, dtype=np.float64)
    return ratio(sum(c[..., i] for i in num), sum(c[..., i] for i in den))  # type: ignore[arg-type]


@dataclass(frozen=True)
class Estimate:
    """A window's estimated outcome counts, and bootstrap draws of the counts its labels will show."""

    expected: FloatArray
    """(n_groups, N_COUNTS): predictions as counted; TP, FP, TN, FN their expectations under the calibration."""
    draws: FloatArray
    """(replicates, n_groups, N_COUNTS) the counts under each bootstrap replicate."""
    reference: IntArray
    """(n_groups, N_COUNTS) the reference's labelled outcomes: what sufficiency counts."""
    calibration: Calibration
    """The calibration the estimate rests on: the calibration check tests its rate, with its covariance."""

    def trials(self, rate: str) -> IntArray:
        """Per group: the reference's labelled rows a rate rests on (labelled positives for TPR ...)."""
        return np.asarray(sum(self.reference[..., i] for i in RATES[rate][1]), dtype=np.int64)

    def rate(self, name: str, min_samples: int = 0) -> tuple[FloatArray, FloatArray, FloatArray]:
        """Estimated rate per group and its 95% interval (percentiles of the rate under the bootstrap); NaN for a
        group with fewer than ``min_samples`` :meth:`trials`, whose calibration is the other groups' (no guess)."""
        lo, hi = _percentiles(_rate(self.draws, name), CONFIDENCE)
        few = self.trials(name) < min_samples
        return np.where(few, np.nan, _rate(self.expected, name)), np.where(few, np.nan, lo), np.where(few, np.nan, hi)


def estimate(
    calibration: Calibration, counts: NDArray, replicates: int = REPLICATES, seed: int = SEED
) -> Estimate:
    """Estimate a window's outcome counts from its score counts ``(n_groups, n_bins, 2, ...)`` (labels ignored)."""
    n = np.asarray(counts, dtype=np.int64)[..., PREDICTED]
    p = calibration.rate
    expected = _window_outcomes(n, n[..., 1] * p, n[..., 0] * p)
    refits = _refits(calibration.reference.tobytes(), calibration.reference.shape, calibration.prior_strength,
                     replicates, seed)  # fmt: skip
    rng = np.random.default_rng((seed, 1))  # the window's own draws: independent of whether refits were cached
    shape = refits.shape
    drawn_1 = rng.binomial(np.broadcast_to(n[..., 1], shape), refits)
    drawn_0 = rng.binomial(np.broadcast_to(n[..., 0], shape), refits)
    return Estimate(expected, _window_outcomes(n, drawn_1, drawn_0), outcome_counts(calibration.reference),
                    calibration)  # fmt: skip


@lru_cache(maxsize=32)
def _refits(reference: bytes, shape: tuple[int, ...], prior_strength: float, replicates: int, seed: int) -> FloatArray:
    """The bootstrap's calibrations of a reference (by its counts' bytes): one reference serves every window and
    every computation of the daemon, so they are drawn once (a function of the counts and the seed alone)."""
    counts = np.frombuffer(reference, dtype=np.int64).reshape(shape)
    out = Calibration.fit(counts, prior_strength).refits(np.random.default_rng(seed), replicates)
    out.setflags(write=False)
    return out


def _percentiles(draws: FloatArray, confidence: float) -> tuple[FloatArray, FloatArray]:
    """Equal-tailed percentile bounds over the first axis, NaN where any draw is undefined."""
    tail = 50.0 * (1.0 - confidence)
    if not len(draws):
        return np.full(draws.shape[1:], np.nan), np.full(draws.shape[1:], np.nan)
    with warnings.catch_warnings():  # a draw without positives (or negatives) has no rate: left out
        warnings.simplefilter("ignore", RuntimeWarning)  # a group with no draw at all: NaN bounds
        lo, hi = np.nanpercentile(draws, [tail, 100.0 - tail], axis=0)
    return lo, hi


def signed_gap(est: Estimate, rate: str, group_a: NDArray, group_b: NDArray) -> tuple[FloatArray, FloatArray,
                                                                                      FloatArray, FloatArray]:
    """Per pair: the estimated ``rate_a - rate_b``, its 95% interval, and its draws under the bootstrap
    ``(replicates, pairs)``."""
    point, drawn = _rate(est.expected, rate), _rate(est.draws, rate)
    draws = drawn[:, group_a] - drawn[:, group_b]
    lo, hi = _percentiles(draws, CONFIDENCE)
    return point[group_a] - point[group_b], lo, hi, draws


def compare_estimated(est: Estimate, group_a: NDArray, group_b: NDArray,
                      metrics: tuple[str, ...] = ESTIMATED_METRICS) -> dict[str, MetricValues]:  # fmt: skip
    """Estimated label-based metrics for pairs ``(a[i], b[i])`` of groups: the gap of the expected rates, and an
    interval from the gaps under the bootstrap (one rate: its signed gap's percentiles folded as an observed
    difference's are; several, as equalised odds: the percentiles of the largest gap, drawn jointly). ``support``
    is the smaller of the window's predictions and the reference's trials of each rate (labelled positives for
    TPR ...), over both groups: what ``min_samples`` counts."""
    a, b = np.asarray(group_a, dtype=np.int64), np.asarray(group_b, dtype=np.int64)
    window = est.expected[..., PRED_POS] + est.expected[..., PRED_NEG]
    out = {}
    for name in metrics:
        rates = METRICS[name].rates
        gaps = [signed_gap(est, rate, a, b) for rate in rates]
        value = np.maximum.reduce([np.abs(g[0]) for g in gaps])
        if len(gaps) == 1:
            lo, hi = gaps[0][1], gaps[0][2]
            lower, upper = abs_interval(lo, hi)
        else:
            lower, upper = lo, hi = _percentiles(np.maximum.reduce([np.abs(g[3]) for g in gaps]), CONFIDENCE)
        trials = [est.trials(rate) for rate in rates]
        support = np.minimum.reduce([window[a], window[b], *(t[a] for t in trials), *(t[b] for t in trials)])
        undefined = np.isnan(value)
        out[name] = MetricValues(value, np.where(undefined, np.nan, lower), np.where(undefined, np.nan, upper),
                                 (hi - lo) / 2.0, np.asarray(support, dtype=np.int64))  # fmt: skip
    return out


@dataclass(frozen=True)
class CalibrationCheck:
    """Per group and predicted class ``(n_groups, 2)``: labelled positives observed and expected, and the variance
    of their difference (the labels' and the fitted calibration's)."""

    observed: FloatArray
    expected: FloatArray
    variance: FloatArray

    @property
    def statistic(self) -> FloatArray:
        """(sum y - sum p) / sqrt(sum p (1 - p) + Var(sum p)): about standard normal while the calibration holds;
        NaN with no labelled rows."""
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.where(self.variance > 0, (self.observed - self.expected) / np.sqrt(self.variance), np.nan)


def calibration_check(rate: NDArray, counts: NDArray, covariance: NDArray | None = None) -> CalibrationCheck:
    """The calibration statistic's parts from a calibration ``(..., groups, bins)`` and the labelled rows of a
    score-counts array. ``covariance`` ``(groups, bins, bins)``: the calibration's sampling covariance
    (:attr:`Calibration.covariance`), None for a calibration known exactly. ``sum p`` is the window's labelled rows
    times the fitted rates, so its error ``m' Cov m`` adds to the labels' ``sum p (1 - p)``: without it the
    statistic of a calibrated window is wider than standard normal (sd sqrt 2 with reference and window alike)."""
    c = np.asarray(counts, dtype=np.float64)
    labelled = c[..., LABELLED_POS] + c[..., LABELLED_NEG]  # (G, B, 2)
    p = np.asarray(rate, dtype=np.float64)[..., None]
    variance = (labelled * p * (1.0 - p)).sum(axis=-2)
    if covariance is not None:
        variance = variance + np.einsum("...gbc,gbd,...gdc->...gc", labelled, np.asarray(covariance), labelled)
    return CalibrationCheck(c[..., LABELLED_POS].sum(axis=-2), (labelled * p).sum(axis=-2), variance)


def calibration_log_lr(rate: NDArray, counts: NDArray, shift: NDArray, spread: NDArray | None = None) -> FloatArray:
    """log likelihood ratio of "the log odds of a positive moved by ``shift``" against the calibration, for the
    labelled rows of a score-counts array: ``(..., groups, 2)`` plus the trailing axes of ``shift``. ``spread``:
    the calibration's sampling standard deviation per bin (:attr:`Calibration.spread`); the null is then the
    calibration moved :data:`CALIBRATION_BOUND_Z` of them toward the alternative, and the alternative that bound's
    log odds moved by ``shift``. The ratio's expectation is at most 1 wherever the truth lies on the null's side
    of that bound (exactly 1 at it), so it feeds the sequential detectors (exporter/core/detect.py): a fitted
    calibration's error, the same at every step, would otherwise be evidence that piles up step after step."""
    c = np.asarray(counts, dtype=np.float64)
    shift = np.asarray(shift, dtype=np.float64)
    extra = (None,) * shift.ndim
    k = c[..., LABELLED_POS][(..., *extra)]
    n = (c[..., LABELLED_POS] + c[..., LABELLED_NEG])[(..., *extra)]
    p0 = np.asarray(rate, dtype=np.float64)[..., None][(..., *extra)]
    if spread is not None:
        p0 = p0 + np.sign(shift) * CALIBRATION_BOUND_Z * np.asarray(spread, dtype=np.float64)[..., None][(..., *extra)]
    p0 = np.clip(p0, RATE_MARGIN, 1.0 - RATE_MARGIN)
    p1 = 1.0 / (1.0 + np.exp(-(logit(p0) + shift)))
    return np.asarray(one_sample_log_lr(k, n, p0, p1).sum(axis=-1 - shift.ndim - 1))


@dataclass(frozen=True)
class Estimated:
    """One attribute's estimated comparisons in one window, and the window's calibration check."""

    attribute: Attribute
    values: dict[str, MetricValues]
    check: CalibrationCheck
    estimate: Estimate

    def sufficient(self, metric: str, min_samples: int) -> NDArray[np.bool_]:
        """Per pair: the estimate has a value (support at least ``min_samples``, defined), as an observed one."""
        v = self.values[metric]
        return np.asarray((v.support >= min_samples) & ~np.isnan(v.value))


def estimate_attribute(attribute: Attribute, reference: NDArray, counts: NDArray,
                       metrics: tuple[str, ...] = ESTIMATED_METRICS) -> Estimated:  # fmt: skip
    """The estimated comparisons of an attribute's pairs from the reference's and the window's score counts (rows
    past the attribute's groups, its unknown category, are left out), and the window's calibration check: the one
    path of the gate, the daemon and ``backtest``."""
    n = len(attribute.groups)
    block, ref = np.asarray(counts)[:n], np.asarray(reference)[:n]
    est, pairs = estimate(Calibration.fit(ref), block), np.array(attribute.pairs, dtype=np.int64).reshape(-1, 2)
    values = compare_estimated(est, pairs[:, 0], pairs[:, 1], metrics)
    return Estimated(attribute, values, calibration_check(est.calibration.rate, block, est.calibration.covariance), est)
