"""Review 33: pages are evidence of a gap beyond the threshold, and a model whose true gap is below its threshold
keeps the false-alarm budget.

docs/sre/alerts.md: "the configured threshold is the reference value: a true gap below it makes the log likelihood
ratios drift down" and "The guarantee is exact for equal rates; a true gap below the threshold makes pages rarer
still." The alert's own description says a page means "the selection rates have moved apart by the
demographic_parity_difference threshold or more".

The oracle: a model that passes its thresholds with room to spare (a gap of half the 0.05 threshold, an impact ratio
above 0.9) on steady traffic, simulated through the daemon's own DetectorBank at the shipped defaults (1-minute
steps, 0.01 false pages a day). The share of days on which a page starts must not be significantly above the
budget (one-sided binomial test), and must not exceed what the same bank does at exactly equal rates."""

from __future__ import annotations

import numpy as np
import pytest
from scipy.stats import binom

from exporter.config import parse_config
from exporter.stream.state.detectors import ALERT_OF_METRIC, DetectorBank
from exporter.stream.state.window import RowLayout

STEPS_PER_DAY = 1440
BUDGET = 0.01  # alerting.false_pages_per_day, the default
PAGING = ("FairnessDemographicParityDrift", "FairnessDisparateImpactViolation")


def _bank() -> DetectorBank:
    config = parse_config({"model_id": "m", "protected_attributes": [{"name": "g", "groups": ["a", "b"]}],
                           "windows": ["1h", "24h"], "bucket": "1m"})  # fmt: skip
    model = config.model()
    layout = RowLayout.of(model)
    return DetectorBank(model, config.windowing, layout.offsets, layout.n_rows)


def days_alerted(alerts: tuple[str, ...], rates: list[tuple[float, float]], per_hour: int, runs: int,
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


def _days_with_a_page(rate_a: float, rate_b: float, per_hour: int, runs: int, days: int, seed: int) -> np.ndarray:
    """(days, runs): whether a paging alert (parity or impact ratio, either direction) started that day."""
    return days_alerted(PAGING, [(rate_a, rate_b)] * days, per_hour, runs, seed)


@pytest.mark.parametrize(("rate_a", "rate_b", "per_hour"), [(0.30, 0.275, 2000), (0.50, 0.47, 500)])
def test_a_gap_below_the_threshold_keeps_the_daily_false_page_budget(rate_a: float, rate_b: float,
                                                                     per_hour: int) -> None:  # fmt: skip
    """Gap 0.025 (ratio 0.92) at 2,000 and gap 0.03 (ratio 0.94) at 500 events per group per hour: both pass the
    seed's thresholds (0.05, 0.80) on every window; they must page on at most ~1% of days, as fair traffic does."""
    runs, days = 200, 2
    paged = _days_with_a_page(rate_a, rate_b, per_hour, runs, days, seed=per_hour)
    n, k = paged.size, int(paged.sum())
    p_value = float(binom.sf(k - 1, n, BUDGET))  # P(>= k page days of n | a true share of 1%)
    assert p_value >= 0.05, (f"{k} of {n} days ({k / n:.1%}) paged at a true gap of {rate_a - rate_b:.3f} "
                             f"(threshold 0.05), budget {BUDGET:.0%} (p = {p_value:.1e})")  # fmt: skip


def test_a_gap_below_the_threshold_pages_no_more_than_equal_rates() -> None:
    """"a true gap below the threshold makes pages rarer still": the same bank and seed, equal rates against a
    gap of half the threshold."""
    runs, days = 200, 2
    equal = _days_with_a_page(0.30, 0.30, 2000, runs, days, seed=3).mean()
    below = _days_with_a_page(0.30, 0.275, 2000, runs, days, seed=3).mean()
    assert below <= max(equal, BUDGET) * 2, f"days with a page: {below:.1%} at gap 0.025, {equal:.1%} at gap 0"
