"""The detectors' null is "the comparison meets its threshold", so its worst case is a comparison exactly at it: a
pair at both shipped thresholds at once (0.25 against 0.20: a gap of 0.05, an impact ratio of 0.80), and a
subgroup that moved by less than ``rate_shift``, through the daemon's own DetectorBank at the shipped defaults
(1-minute steps, 0.01 false pages a day). The share of days on which an alert starts must not be significantly above
the budget (one-sided binomial test)."""

from __future__ import annotations

import numpy as np
import pytest
from scipy.stats import binom
from test_detector_gap_below_threshold import BUDGET
from test_detector_gap_below_threshold import days_alerted as _days_with_an_alert


def _assert_within_budget(alerted: np.ndarray, what: str) -> None:
    n, k = alerted.size, int(alerted.sum())
    p_value = float(binom.sf(k - 1, n, BUDGET))  # P(>= k alert days of n | a true share of 1%)
    assert p_value >= 0.05, f"{k} of {n} days ({k / n:.1%}) alerted {what}, budget {BUDGET:.0%} (p = {p_value:.1e})"


@pytest.mark.parametrize("per_hour", [500, 2000])
def test_a_pair_exactly_at_both_thresholds_keeps_the_daily_page_budget(per_hour: int) -> None:
    alerted = _days_with_an_alert(("FairnessDemographicParityDrift", "FairnessDisparateImpactViolation"),
                                  [(0.25, 0.20)] * 2, per_hour, runs=200, seed=per_hour + 1)  # fmt: skip
    _assert_within_budget(alerted, "at a gap of exactly 0.05 and an impact ratio of exactly 0.80")


def test_a_subgroup_shift_below_rate_shift_keeps_the_warning_budget() -> None:
    """Both groups' selection rate moves from 0.30 to 0.36 after a day (rate_shift 0.1): no warning is due."""
    alerted = _days_with_an_alert(("SubgroupPredictionRateShift",), [(0.30, 0.30), (0.36, 0.36)], 2000, runs=200,
                                  seed=11)[1]  # fmt: skip
    _assert_within_budget(alerted, "after a shift of 0.06 (rate_shift 0.1)")
