"""The detectors' null is "the comparison meets its threshold", so its worst case is a comparison exactly at it: a
pair at both shipped thresholds at once (0.25 against 0.20: a gap of 0.05, an impact ratio of 0.80), and a
subgroup that moved by less than ``rate_shift``, through the daemon's own DetectorBank at the shipped defaults
(1-minute steps, 0.01 false pages a day). The share of days on which an alert starts must not be significantly above
the budget (one-sided binomial test)."""

from __future__ import annotations

import numpy as np
import pytest
from scipy.stats import binom

from exporter.config import parse_config
from exporter.stream.state.detectors import ALERT_OF_METRIC, DetectorBank
from exporter.stream.state.window import RowLayout

STEPS_PER_DAY = 1440
BUDGET = 0.01  # alerting.false_pages_per_day, the default


def _bank() -> DetectorBank:
    config = parse_config({"model_id": "m", "protected_attributes": [{"name": "g", "groups": ["a", "b"]}],
                           "windows": ["1h", "24h"], "bucket": "1m"})  # fmt: skip
    model = config.model()
    layout = RowLayout.of(model)
    return DetectorBank(model, config.windowing, layout.offsets, layout.n_rows)


def _days_with_an_alert(alerts: tuple[str, ...], rates: list[tuple[float, float]], per_hour: int, runs: int,
                        seed: int) -> np.ndarray:  # fmt: skip
    """(days, runs): whether one of ``alerts`` started that day, with groups a and b at ``rates[day]``."""
    bank = _bank()
    watched = np.array([ALERT_OF_METRIC[d.metric].name in alerts for d in bank.detectors])
    rng = np.random.default_rng(seed)
    state = bank.initial_state((runs,))
    before = np.zeros((runs, len(bank)), dtype=bool)
    out = np.zeros((len(rates), runs), dtype=bool)
    for day, pair in enumerate(rates):
        steps = np.zeros((STEPS_PER_DAY, runs, bank.n_rows, 6), dtype=np.int64)
        for row, rate in enumerate(pair):
            n = rng.poisson(per_hour / 60, (STEPS_PER_DAY, runs))
            k = rng.binomial(n, rate)
            steps[..., row, 0], steps[..., row, 1] = k, n - k
        state, trace = bank.advance(state, steps)
        active = trace.active[..., watched]
        starts = active & ~np.concatenate([before[None][..., watched], active[:-1]])
        out[day] = starts.any(axis=(0, 2))
        before = trace.active[-1]
    return out


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
