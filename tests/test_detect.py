"""The change detectors: exact likelihood ratios, the false-alarm guarantee by simulation, power, and state that
survives a restart without being reset or counted twice."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
from daemon_config import event, make_config
from prometheus_client import CollectorRegistry
from scipy.special import logsumexp
from scipy.stats import hypergeom, nchypergeom_fisher
from test_labels_and_checkpoint import Clock, records

from exporter.config import parse_config
from exporter.core import detect
from exporter.daemon import Daemon
from exporter.stream.state.detectors import DetectorBank
from exporter.stream.state.window import RowLayout

T0 = 1_800_000_000.0
BASE_RATES = (0.02, 0.1, 0.3, 0.5)
STEP_SIZES = (3, 30, 300)  # events per group per step


@pytest.mark.parametrize(("n_a", "n_b", "k"), [(3, 3, 3), (40, 7, 12), (500, 800, 300), (1, 1, 1), (9, 0, 4)])
@pytest.mark.parametrize("psi", [0.2, 1.0, 4.0])
def test_likelihood_ratio_has_expectation_one_under_equal_rates(n_a: int, n_b: int, k: int, psi: float) -> None:
    x = np.arange(max(0, k - n_b), min(k, n_a) + 1)
    pmf = hypergeom.pmf(x, n_a + n_b, n_a, k)
    lr = np.exp(detect.two_sample_log_lr(x, n_a, k - x, n_b, math.log(psi)))
    assert float((pmf * lr).sum()) == pytest.approx(1.0, abs=1e-9)


@pytest.mark.parametrize(("n_a", "n_b", "k", "psi"), [(40, 70, 30, 3.0), (20_000, 90_000, 5_000, 1.7),
                                                      (3_000, 2_000, 4_000, 0.6)])  # fmt: skip
def test_likelihood_ratio_is_fishers_noncentral_over_the_hypergeometric(n_a: int, n_b: int, k: int, psi: float) -> None:
    """Against scipy's own distributions, at an observed value near the alternative's mean (large supports are
    summed over a window around the mode: the truncation must not show)."""
    x = int(nchypergeom_fisher.mean(n_a + n_b, n_a, k, psi))
    expected = nchypergeom_fisher.logpmf(x, n_a + n_b, n_a, k, psi) - hypergeom.logpmf(x, n_a + n_b, n_a, k)
    assert float(detect.two_sample_log_lr(x, n_a, k - x, n_b, math.log(psi))) == pytest.approx(expected, rel=1e-9)


def test_elements_of_every_support_width_in_one_call_get_their_own_ratio_to_the_bit() -> None:
    """One call over elements of supports from 1 to ~1,300 terms and three alternatives each (computed by blocks
    of similar width): each element's value is the one it gets beside the widest element alone (the same padded
    width, so the same float sum), and scipy's to 1e-9."""
    rng = np.random.default_rng(7)
    n_a, n_b = rng.integers(0, 3_000, 400), rng.integers(0, 3_000, 400)
    k = (rng.random(400) * (n_a + n_b + 1)).astype(np.int64)
    n_a[0], n_b[0], k[0] = 3_000, 3_000, 3_000  # the widest support
    log_psi = rng.normal(0.0, 0.3, (400, 3))
    together = detect.log_hypergeometric_mgf(log_psi, n_a, n_b, k)
    for i in [0, *rng.choice(np.arange(1, 400), 40, replace=False)]:
        pair = [0, i]
        alone = detect.log_hypergeometric_mgf(log_psi[pair], n_a[pair], n_b[pair], k[pair])[1]
        assert together[i].tobytes() == alone.tobytes()
        x = np.arange(max(0, k[i] - n_b[i]), min(k[i], n_a[i]) + 1)
        log_pmf = hypergeom.logpmf(x, n_a[i] + n_b[i], n_a[i], k[i])
        expected = [float(logsumexp(log_pmf + lp * x)) for lp in log_psi[i]]
        assert together[i].tolist() == pytest.approx(expected, rel=1e-9, abs=1e-9)


def test_steps_without_information_leave_the_statistic_alone() -> None:
    # an empty group, nobody selected, everybody selected
    log_lr = detect.two_sample_log_lr([0, 0, 5], [0, 10, 5], [3, 0, 7], [10, 10, 7], math.log(5.0))
    assert log_lr.tolist() == pytest.approx([0.0, 0.0, 0.0], abs=1e-12)


def test_alarm_level_follows_from_the_budget() -> None:
    # 100 detectors, one step a minute, 0.01 false pages a day
    assert detect.alarm_level(100, 1440, 0.01) == pytest.approx(math.log(100 * 1440 / 0.01))
    with pytest.raises(ValueError, match="budget"):
        detect.alarm_level(100, 1440, 0.0)


def _fair_steps(rng: np.random.Generator, shape: tuple[int, ...], n_rows: int, size: int, rate: float) -> np.ndarray:
    """Per-step counts (shape..., n_rows, 6) of predictions only: every group has the same selection rate."""
    n = rng.poisson(size, (*shape, n_rows))
    k = rng.binomial(n, rate)
    steps = np.zeros((*shape, n_rows, 6), dtype=np.int64)
    steps[..., 0], steps[..., 1] = k, n - k
    return steps


@pytest.mark.parametrize("rate", BASE_RATES)
@pytest.mark.parametrize("size", STEP_SIZES)
def test_crossings_of_a_low_level_are_as_rare_as_ville_allows(rate: float, size: int) -> None:
    """Fair traffic, the shipped alternative (gap 0.1 around the pooled rate of earlier steps), a low level h = 4:
    the share of 10-step blocks in which CUSUM reaches h stays below the proven bound 10 e^-h = 0.18."""
    rng = np.random.default_rng(int(rate * 1000) + size)
    runs, blocks, block, h = 400, 10, 10, 4.0
    steps = _fair_steps(rng, (blocks * block, runs), 2, size, rate)
    k, n = steps[..., 0], steps[..., 0] + steps[..., 1]
    statistic = np.zeros((runs, 2))
    history = np.zeros((runs, 2))  # pooled positives, trials of earlier steps
    crossed = np.zeros((blocks, runs), dtype=bool)
    for t in range(blocks * block):
        with np.errstate(invalid="ignore", divide="ignore"):
            log_psi = detect.gap_log_odds_ratio(history[:, 0] / history[:, 1], 0.05)
        log_lr = detect.two_sample_log_lr(k[t, :, 0], n[t, :, 0], k[t, :, 1], n[t, :, 1],
                                          np.stack([log_psi, -log_psi], axis=-1))  # fmt: skip
        statistic = detect.cusum(statistic, log_lr)
        history += np.stack([k[t].sum(axis=-1), n[t].sum(axis=-1)], axis=-1)
        crossed[t // block] |= (statistic >= h).any(axis=-1)
    assert crossed.mean() <= 2 * block * math.exp(-h)  # two detectors (directions) per run


def onsets(active: np.ndarray) -> np.ndarray:
    """Steps at which an alarm is raised (a page starts), from the (T, ...) alarm states."""
    before = np.concatenate([np.zeros_like(active[:1]), active[:-1]])
    return active & ~before


@pytest.mark.parametrize("rate", BASE_RATES)
@pytest.mark.parametrize("size", STEP_SIZES)
def test_shiryaev_roberts_alarms_are_as_rare_as_the_martingale_allows(rate: float, size: int) -> None:
    """Fair traffic, the shipped alternative, a low level h = 5: alarms (R restarted after each) per detector and
    step stay below e^-h, the bound the alarm level is derived from."""
    rng = np.random.default_rng(int(rate * 1000) + size + 1)
    runs, steps, h = 200, 300, 5.0
    counts = _fair_steps(rng, (steps, runs), 2, size, rate)
    k, n = counts[..., 0], counts[..., 0] + counts[..., 1]
    log_r = np.full((runs, 2), -np.inf)
    history = np.zeros((runs, 2))
    alarms = 0
    for t in range(steps):
        with np.errstate(invalid="ignore", divide="ignore"):
            log_psi = detect.gap_log_odds_ratio(history[:, 0] / history[:, 1], 0.05)
        log_lr = detect.two_sample_log_lr(k[t, :, 0], n[t, :, 0], k[t, :, 1], n[t, :, 1],
                                          np.stack([log_psi, -log_psi], axis=-1))  # fmt: skip
        log_r, alarm = detect.shiryaev_roberts(log_r, log_lr, h)
        alarms += int(alarm.sum())
        history += np.stack([k[t].sum(axis=-1), n[t].sum(axis=-1)], axis=-1)
    assert alarms / (runs * 2 * steps) <= math.exp(-h)


def _bank(**overrides: object) -> DetectorBank:
    raw = {"model_id": "m", "protected_attributes": [{"name": "a", "groups": ["x", "y", "z"]},
                                                     {"name": "b", "groups": ["p", "q"]}],
           "bucket": "1h", "windows": ["24h"], **overrides}  # fmt: skip
    config = parse_config(raw)
    model = config.model()
    return DetectorBank(model, config.windowing, RowLayout.of(model).offsets, RowLayout.of(model).n_rows)


@pytest.mark.parametrize("rate", BASE_RATES)
@pytest.mark.parametrize("size", STEP_SIZES)
def test_every_detector_of_a_model_keeps_the_daily_budget_on_fair_traffic(rate: float, size: int) -> None:
    """The whole bank (parity, impact ratio and subgroup shift detectors, alarm level from a generous budget of
    0.3 false pages a day so that the simulation can see it) on two fair days of hourly steps: the share of days
    with any alarm is within the budget."""
    bank = _bank(alerting={"false_pages_per_day": 0.3})
    days = 300
    steps = _fair_steps(np.random.default_rng(int(rate * 100) + size), (48, days), bank.n_rows, size, rate)
    _, trace = bank.advance(bank.initial_state((days,)), steps)
    alarm_days = onsets(trace.active).reshape(2, 24, days, -1).any(axis=(1, 3))
    assert alarm_days.mean() <= 0.3


def test_a_gap_of_twice_the_threshold_pages_within_the_hour_at_2000_events_per_group_per_hour() -> None:
    """Power at the shipped level (3 attributes of 3, 4, 5 groups, minute steps): one group falls from 0.30 to
    0.20 after a fair day; most runs page within 60 minutes."""
    config = parse_config({"model_id": "m", "protected_attributes": [
        {"name": "a", "groups": list("xyz")}, {"name": "b", "groups": list("pqrs")},
        {"name": "c", "groups": list("ghijk")}]})  # fmt: skip
    model = config.model()
    bank = DetectorBank(model, config.windowing, RowLayout.of(model).offsets, RowLayout.of(model).n_rows)
    runs = 40
    rng = np.random.default_rng(5)
    state, _ = bank.advance(bank.initial_state((runs,)), _fair_steps(rng, (240, runs), bank.n_rows, 33, 0.3))
    after = _fair_steps(rng, (90, runs), bank.n_rows, 33, 0.3)
    n = after[..., 0, 0] + after[..., 0, 1]
    after[..., 0, 0] = rng.binomial(n, 0.2)
    after[..., 0, 1] = n - after[..., 0, 0]
    _, trace = bank.advance(state, after)
    first = np.argmax(trace.active.any(axis=-1), axis=0)
    paged = trace.active.any(axis=(0, 2))
    assert paged.all()
    assert np.median(first + 1) <= 60


def test_detector_state_survives_a_restart_without_reset_or_double_count(tmp_path: Path) -> None:
    """A daemon stopped after a checkpoint and restarted continues exactly as one that never stopped."""
    cp = {"path": str(tmp_path / "state")}

    def daemon() -> Daemon:
        d = Daemon(make_config(checkpoint=cp), registry=CollectorRegistry(), clock=Clock())
        d.checkpointer.restore()  # what start() does first
        return d

    def batch(minute: int, female_positives: int) -> list:
        ts = T0 + 60 * minute
        return records([event("male", prediction=int(i < 20), ts=ts, prediction_id=f"m{minute}-{i}")
                        for i in range(40)] + [event("female", prediction=int(i < female_positives), ts=ts,
                                                     prediction_id=f"f{minute}-{i}") for i in range(40)],
                       start=minute * 100)  # fmt: skip

    steady, restarted = daemon(), daemon()
    for minute in range(5):
        for d in (steady, restarted):
            d.clock.now = T0 + 60 * minute
            d.ingest.handle("predictions", 0, batch(minute, 8))
            d.computer.compute()
    restarted.ingest.handle("predictions", 0, batch(5, 8))  # counted, not yet stepped, then checkpointed
    restarted.checkpointer.write()
    resumed = daemon()
    assert resumed.fleet.models["m1"].store.detection.steps == 5
    steady.ingest.handle("predictions", 0, batch(5, 8))
    for d in (steady, resumed):
        d.clock.now = T0 + 60 * 6
        d.ingest.handle("predictions", 0, batch(6, 8))  # minute 6's events take minute 5's step
        d.computer.compute()
    a, b = steady.fleet.models["m1"].store.detection, resumed.fleet.models["m1"].store.detection
    assert a.steps == b.steps == 6
    np.testing.assert_allclose(b.state.statistic, a.state.statistic)
    np.testing.assert_allclose(b.state.evidence, a.state.evidence)
    np.testing.assert_array_equal(b.state.active, a.state.active)
    np.testing.assert_array_equal(b.seen, a.seen)
    assert a.state.statistic.max() > 0  # a gap of 0.3 in every step: the evidence did grow


def test_detector_statistics_and_the_alarm_level_are_on_metrics() -> None:
    """The collector renders every detector with its labels, the model's alarm level and the steps taken."""
    from test_labels_and_checkpoint import value

    d = Daemon(make_config(), registry=CollectorRegistry(), clock=Clock())
    payloads = [event("male", prediction=int(i < 30), ts=T0, prediction_id=f"m{i}") for i in range(40)]
    payloads += [event("female", prediction=int(i < 5), ts=T0, prediction_id=f"f{i}") for i in range(40)]
    d.computer.compute()  # before any event: no step
    d.ingest.handle("predictions", 0, records(payloads))
    d.clock.now = T0 + 60
    # the next minute's first event takes the first minute's step (and waits in the next one)
    d.ingest.handle("predictions", 0, records([event("male", prediction=0, ts=T0 + 60, prediction_id="m40")], 80))
    pair = {"attribute": "gender", "dimension": "male_vs_female", "group_a": "male", "group_b": "female"}
    up = value(d, "fairness_detector_statistic", **pair, metric="demographic_parity_difference",
               direction="a_higher")  # fmt: skip
    down = value(d, "fairness_detector_statistic", **pair, metric="demographic_parity_difference",
                 direction="b_higher")  # fmt: skip
    # 30/40 against 5/40 in one step; no history yet, so the alternative is centred on 0.5: 0.45 against 0.55
    log_psi = math.log(0.55 / 0.45) - math.log(0.45 / 0.55)
    assert up == pytest.approx(float(detect.two_sample_log_lr(30, 40, 5, 40, log_psi)))
    assert up == pytest.approx(4.616, abs=1e-3) and down == 0.0
    assert value(d, "fairness_subgroup_detector_statistic", attribute="gender", subgroup="female",
                 direction="down") == 0.0  # no baseline yet: no evidence  # fmt: skip
    level = value(d, "fairness_detector_alarm_level")
    assert level == pytest.approx(d.fleet.models["m1"].store.detectors.level)
    # 2 attributes x 1 pair x 2 metrics x 2 directions + 4 subgroups x 2 directions, one step a minute
    assert level == pytest.approx(math.log((8 + 8) * 1440 / 0.01))
    assert value(d, "fairness_detector_steps_total") == 1.0
    assert value(d, "fairness_detector_alarm", **pair, metric="demographic_parity_difference",
                 direction="a_higher") == 0.0  # 4.6 nats of evidence: no alarm  # fmt: skip
