"""Estimated label-based fairness (exporter/core/estimate.py): hand-checked numbers, the isotonic fit against
scikit-learn, coverage of the realised gap by simulation, and the calibration check's detector."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.stats import binom
from sklearn.isotonic import IsotonicRegression

from exporter.core import detect
from exporter.core import estimate as est
from exporter.core.metric_table import compare

BOUNDS = np.linspace(0.1, 0.9, 9)  # ten bins; the decision threshold 0.5 is an edge
PAIR = (np.array([0]), np.array([1]))


def _cells(per_group: list[list[tuple[int, int, int, int]]]) -> np.ndarray:
    """A score-counts array from per group, per bin: (predictions with yhat 0, with yhat 1, positives, negatives),
    the labelled rows put in the bin's majority class."""
    out = np.zeros((len(per_group), len(per_group[0]), 2, est.N_SCORE_COUNTS), dtype=np.int64)
    for g, bins in enumerate(per_group):
        for b, (n0, n1, pos, neg) in enumerate(bins):
            out[g, b, :, est.PREDICTED] = n0, n1
            cls = 1 if n1 >= n0 else 0
            out[g, b, cls, est.LABELLED_POS], out[g, b, cls, est.LABELLED_NEG] = pos, neg
    return out


def test_hand_checked_rates_and_gaps() -> None:
    # reference: group 0 has 2 of 10 positive in the low bin, 6 of 10 in the high one; group 1 has 4 and 8
    reference = _cells([[(10, 0, 2, 8), (0, 10, 6, 4)], [(10, 0, 4, 6), (0, 10, 8, 2)]])
    calibration = est.Calibration.fit(reference, prior_strength=0.0)
    assert calibration.rate == pytest.approx(np.array([[0.2, 0.6], [0.4, 0.8]]))
    # the window: 10 predicted negatives in the low bin, 10 predicted positives in the high bin, per group
    window = _cells([[(10, 0, 0, 0), (0, 10, 0, 0)], [(10, 0, 0, 0), (0, 10, 0, 0)]])
    e = est.estimate(calibration, window, replicates=400)
    # group 0: E[TP] = 10 x 0.6 = 6, E[FN] = 10 x 0.2 = 2, E[FP] = 4, E[TN] = 8: TPR 6/8, FPR 4/12
    # group 1: E[TP] = 8, E[FN] = 4, E[FP] = 2, E[TN] = 6: TPR 8/12, FPR 2/8
    tpr, lo, hi = e.rate("true_positive_rate")
    assert tpr.tolist() == pytest.approx([0.75, 8 / 12])
    assert (lo < tpr).all() and (tpr < hi).all()
    assert e.rate("false_positive_rate")[0].tolist() == pytest.approx([1 / 3, 0.25])
    assert e.rate("precision")[0].tolist() == pytest.approx([0.6, 0.8])
    assert e.rate("accuracy")[0].tolist() == pytest.approx([0.7, 0.7])
    values = est.compare_estimated(e, *PAIR)
    assert values["equal_opportunity_difference"].value[0] == pytest.approx(0.75 - 8 / 12)
    assert values["false_positive_rate_difference"].value[0] == pytest.approx(1 / 3 - 0.25)
    assert values["equalised_odds_difference"].value[0] == pytest.approx(1 / 12)
    assert values["accuracy_difference"].value[0] == pytest.approx(0.0)
    # what min_samples counts: the reference's labelled positives (8 and 12) for TPR, and negatives for FPR
    assert values["equal_opportunity_difference"].support[0] == 8
    assert values["false_positive_rate_difference"].support[0] == 8
    for v in values.values():
        assert v.lower[0] <= v.value[0] <= v.upper[0]


def test_a_group_without_reference_borrows_the_pooled_curve() -> None:
    reference = _cells([[(10, 0, 2, 8), (0, 10, 6, 4)], [(0, 0, 0, 0), (0, 0, 0, 0)]])
    rate = est.Calibration.fit(reference).rate
    # the pooled curve is (2 + 0.5) / 11 and (6 + 0.5) / 11; group 0 is shrunk toward it by 4 of 14 pseudo-rows
    pooled = np.array([2.5 / 11, 6.5 / 11])
    assert rate[1].tolist() == pytest.approx(pooled.tolist())
    assert rate[0].tolist() == pytest.approx(((np.array([2, 6]) + est.PRIOR_STRENGTH * pooled)
                                              / (10 + est.PRIOR_STRENGTH)).tolist())  # fmt: skip
    window = _cells([[(10, 0, 0, 0), (0, 10, 0, 0)], [(10, 0, 0, 0), (0, 10, 0, 0)]])
    values = est.compare_estimated(est.estimate(est.Calibration.fit(reference), window, replicates=200), *PAIR)
    assert values["equal_opportunity_difference"].support[0] == 0  # never enough for min_samples: insufficient


def test_an_empty_window_group_has_no_estimate() -> None:
    reference = _cells([[(10, 0, 2, 8), (0, 10, 6, 4)], [(10, 0, 4, 6), (0, 10, 8, 2)]])
    window = _cells([[(10, 0, 0, 0), (0, 10, 0, 0)], [(0, 0, 0, 0), (0, 0, 0, 0)]])
    values = est.compare_estimated(est.estimate(est.Calibration.fit(reference), window, replicates=200), *PAIR)
    assert math.isnan(values["equal_opportunity_difference"].value[0])
    assert values["equal_opportunity_difference"].support[0] == 0


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.floats(0, 1), st.floats(0.1, 50)), min_size=1, max_size=12))
def test_isotonic_matches_scikit_learn(points: list[tuple[float, float]]) -> None:
    values, weights = (np.array(x) for x in zip(*points, strict=True))
    expected = IsotonicRegression().fit_transform(np.arange(len(values)), values, sample_weight=weights)
    assert est.isotonic(values, weights).tolist() == pytest.approx(expected.tolist(), abs=1e-9)


def test_isotonic_is_vectorised_over_leading_axes() -> None:
    rng = np.random.default_rng(5)
    values, weights = rng.random((3, 4, 7)), rng.random((3, 4, 7)) + 0.1
    fitted = est.isotonic(values, weights)
    assert fitted[2, 1].tolist() == pytest.approx(est.isotonic(values[2, 1], weights[2, 1]).tolist())
    assert (np.diff(fitted, axis=-1) >= -1e-12).all()


def _draw(rng: np.random.Generator, sizes: list[int], truth: np.ndarray, labelled: bool = True) -> np.ndarray:
    """Score counts of ``sizes[g]`` rows per group, decile scores, labels drawn from ``truth[g, bin]``."""
    codes = np.repeat(np.arange(len(sizes)), sizes)
    scores = rng.integers(1, 11, len(codes)) / 10
    bins = est.score_bins(scores, BOUNDS)
    labels = (rng.random(len(codes)) < truth[codes, bins]).astype(np.int64)
    return est.score_counts(codes, len(sizes), bins, len(BOUNDS) + 1, (scores >= 0.5).astype(np.int64),
                            labels if labelled else None)  # fmt: skip


TRUTH = np.array([np.linspace(0.1, 0.8, 10), np.linspace(0.2, 0.9, 10)])
"""Two groups calibrated differently: the same score means a higher chance of a positive label in group 1."""


def test_intervals_cover_the_realised_gap_by_simulation() -> None:
    """A large group (2,000 reference rows, 1,000 per window) against a small one (300 and 200): over 200 seeded
    windows the 95% intervals cover the gap the window's labels show at least 90% of the time (binomial sd of the
    rate at 0.95: 0.015), and the estimate is unbiased for the signed gap within 0.02."""
    rng = np.random.default_rng(2026)
    metrics = est.ESTIMATED_METRICS
    covered = dict.fromkeys(metrics, 0)
    signed_error = []
    runs = 200
    for i in range(runs):
        reference, window = _draw(rng, [2000, 300], TRUTH), _draw(rng, [1000, 200], TRUTH)
        e = est.estimate(est.Calibration.fit(reference), window, replicates=500, seed=i)
        values = est.compare_estimated(e, *PAIR)
        realised = compare(est.outcome_counts(window), *PAIR, metrics).metrics
        for m in metrics:
            covered[m] += bool(values[m].lower[0] <= realised[m].value[0] <= values[m].upper[0])
        gap = est.signed_gap(e, "true_positive_rate", *PAIR)[0][0]
        observed = est._rate(est.outcome_counts(window), "true_positive_rate")
        signed_error.append(gap - (observed[0] - observed[1]))
    coverage = {m: covered[m] / runs for m in metrics}
    assert min(coverage.values()) >= 0.90, coverage
    assert abs(float(np.mean(signed_error))) < 0.02


def test_one_global_calibrator_makes_a_gap_that_per_group_calibration_does_not() -> None:
    """Same scores, groups calibrated differently: pooling the calibration (an enormous prior) biases the TPR gap,
    per-group calibration does not."""
    rng = np.random.default_rng(7)
    errors: dict[float, list[float]] = {0.0: [], 1e9: []}
    for i in range(40):
        reference, window = _draw(rng, [3000, 3000], TRUTH), _draw(rng, [3000, 3000], TRUTH)
        observed = est._rate(est.outcome_counts(window), "true_positive_rate")
        for strength in errors:
            e = est.estimate(est.Calibration.fit(reference, strength), window, replicates=50, seed=i)
            errors[strength].append(est.signed_gap(e, "true_positive_rate", *PAIR)[0][0] - (observed[0] - observed[1]))
    assert abs(np.mean(errors[0.0])) < 0.01
    assert abs(np.mean(errors[1e9])) > 0.03


def test_hand_checked_calibration_statistic() -> None:
    rate = np.array([[0.2, 0.6]])
    # low bin, predicted negative: 10 labelled, 5 positive; high bin, predicted positive: 10 labelled, 6 positive
    window = _cells([[(10, 0, 5, 5), (0, 10, 6, 4)]])
    check = est.calibration_check(rate, window)
    assert check.observed.tolist() == [[5.0, 6.0]]
    assert check.expected == pytest.approx(np.array([[2.0, 6.0]]))
    assert check.variance == pytest.approx(np.array([[1.6, 2.4]]))
    assert check.statistic == pytest.approx(np.array([[3 / math.sqrt(1.6), 0.0]]))


@pytest.mark.parametrize("shift", [-0.5, 0.5, 1.5])
@pytest.mark.parametrize(("n", "p"), [(1, 0.3), (12, 0.05), (40, 0.7)])
def test_calibration_likelihood_ratio_has_expectation_one_while_calibrated(shift: float, n: int, p: float) -> None:
    k = np.arange(n + 1)
    counts = np.zeros((n + 1, 1, 1, 2, est.N_SCORE_COUNTS))
    counts[:, 0, 0, 1, est.LABELLED_POS], counts[:, 0, 0, 1, est.LABELLED_NEG] = k, n - k
    lr = np.exp(est.calibration_log_lr(np.array([[p]]), counts, np.array(shift)))[:, 0, 1]
    assert float((binom.pmf(k, n, p) * lr).sum()) == pytest.approx(1.0, abs=1e-9)


def _detect(rng: np.random.Generator, steps: int, shift_at: int | None, level: float) -> list[int]:
    """Steps at which the calibration detectors (group x predicted class x up/down) alarm, labels of 50 rows per
    group per step arriving; from ``shift_at`` on, group 1's labels come from a shifted truth."""
    calibration = est.Calibration.fit(_draw(rng, [5000, 5000], TRUTH))
    shifted = TRUTH.copy()
    shifted[1] = np.clip(TRUTH[1] - 0.15, 0.01, 0.99)  # concept shift: group 1's outcomes no longer follow scores
    log_r = np.full((2, 2, 2), -np.inf)
    shifts = np.array([est.CALIBRATION_SHIFT, -est.CALIBRATION_SHIFT])
    alarms = []
    for t in range(steps):
        truth = shifted if shift_at is not None and t >= shift_at else TRUTH
        log_lr = est.calibration_log_lr(calibration.rate, _draw(rng, [50, 50], truth), shifts, calibration.spread)
        log_r, alarm = detect.shiryaev_roberts(log_r, log_lr, level)
        if alarm.any():
            alarms.append(t)
    return alarms


def test_the_calibration_detector_pages_a_concept_shift_within_the_budget() -> None:
    # the budget: 8 detectors, 96 steps a day (15 minutes), 0.1 false pages a day
    level = detect.alarm_level(8, 96, 0.1)
    rng = np.random.default_rng(11)
    assert _detect(rng, 960, None, level) == []  # ten days calibrated: expected false pages <= 1, none seen
    alarms = _detect(rng, 200, 100, level)
    assert alarms and alarms[0] >= 100 and alarms[0] - 100 <= 12  # paged within three hours of the shift
