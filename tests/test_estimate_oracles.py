"""Review 15: confirmations (these pass) that the oracles of test_bisg_names.py and test_estimate_review.py are
set up right: on clean input the module agrees with surgeo and with a direct computation, and the simulation
harness gives nominal numbers when the method has what it assumes (the truth as the calibration, a large
reference)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from sklearn.isotonic import IsotonicRegression
from surgeo import SurgeoModel
from test_bisg_names import bisg_by_hand, census_surname
from test_estimate_review import BOUNDS, PAIR, TRUTH, draw

from exporter.core import bisg, detect
from exporter.core import estimate as est
from exporter.core.metric_table import compare


def test_clean_names_and_zips_match_surgeo_and_the_hand_computation() -> None:
    names = ["garcia", " Garcia ", "GARCIA-LOPEZ", "o'brien jr.", "Nguyen", "Smith", "Washington", "MUNOZ"]
    zips = ["02134", "02134", "60601", "60601", 2134, " 02134 ", "60601", "60601"]
    ours = bisg.tables().posteriors(names, zips)
    theirs = SurgeoModel().get_probabilities(pd.Series(names), pd.Series(zips, dtype=object))[list(bisg.CATEGORIES)]
    np.testing.assert_allclose(ours, theirs.to_numpy(), atol=1e-9)
    np.testing.assert_allclose(ours[7], bisg_by_hand(census_surname("MUNOZ"), "60601"), atol=1e-9)


def test_the_point_estimate_is_the_documented_estimator_with_scikit_learns_isotonic() -> None:
    """estimated TPR = sum p yhat / sum p, FPR = sum (1 - p) yhat / sum (1 - p), p the per-group isotonic fit of the
    bin rates shrunk toward the pooled isotonic curve (Jeffreys half count) by 4 pseudo-rows."""
    rng = np.random.default_rng(3)
    reference, window = draw(rng, [3000, 500]), draw(rng, [1000, 700], labelled=False)
    pooled_ref = reference.sum(axis=2)
    pos, neg = pooled_ref[..., est.LABELLED_POS].astype(float), pooled_ref[..., est.LABELLED_NEG].astype(float)
    n = pos + neg
    x = np.arange(n.shape[1])
    pooled = IsotonicRegression().fit_transform(x, (pos.sum(0) + 0.5) / (n.sum(0) + 1), sample_weight=n.sum(0) + 1)
    p = np.vstack([IsotonicRegression().fit_transform(x, (pos[g] + 4 * pooled) / (n[g] + 4), sample_weight=n[g] + 4)
                   for g in range(2)])  # fmt: skip
    e = est.estimate(est.Calibration.fit(reference), window, replicates=50)
    m = window[..., est.PREDICTED]  # (group, bin, yhat)
    tpr = (m[..., 1] * p).sum(1) / (m.sum(2) * p).sum(1)
    fpr = (m[..., 1] * (1 - p)).sum(1) / (m.sum(2) * (1 - p)).sum(1)
    assert e.rate("true_positive_rate")[0] == pytest.approx(tpr, abs=1e-12)
    assert e.rate("false_positive_rate")[0] == pytest.approx(fpr, abs=1e-12)


def test_with_the_truth_as_the_calibration_the_statistic_is_standard_normal() -> None:
    rng = np.random.default_rng(15)
    z = np.array([est.calibration_check(TRUTH, draw(rng, [2000, 2000])).statistic for _ in range(300)])
    assert 0.03 <= float((np.abs(z) > 1.959964).mean()) <= 0.07


def test_with_the_truth_as_the_calibration_the_detectors_keep_the_budget() -> None:
    level = detect.alarm_level(8, 96, 0.1)
    rng = np.random.default_rng(1515)
    shifts = np.array([est.CALIBRATION_SHIFT, -est.CALIBRATION_SHIFT])
    pages, steps, runs = 0, 960, 10
    for _ in range(runs):
        log_r = np.full((2, 2, 2), -np.inf)
        for _ in range(steps):
            log_r, alarm = detect.shiryaev_roberts(log_r, est.calibration_log_lr(TRUTH, draw(rng, [50, 50]), shifts),
                                                   level)  # fmt: skip
            pages += int(alarm.sum())
    assert pages / (runs * steps / 96) <= 0.15


def test_with_a_large_reference_the_npv_interval_has_nominal_coverage() -> None:
    rng = np.random.default_rng(1516)
    metric, runs, covered = "negative_predictive_value_difference", 1000, 0
    for i in range(runs):
        reference, window = draw(rng, [20000, 20000]), draw(rng, [5000, 5000])
        e = est.estimate(est.Calibration.fit(reference), window, replicates=400, seed=i)
        value = est.compare_estimated(e, *PAIR, (metric,))[metric]
        realised = compare(est.outcome_counts(window), *PAIR, (metric,)).metrics[metric].value[0]
        covered += bool(value.lower[0] <= realised <= value.upper[0])
    assert covered / runs >= 0.93
    assert len(BOUNDS) == 9
