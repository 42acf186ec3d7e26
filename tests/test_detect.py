"""The change detectors: likelihood ratios against the threshold (expectation at most 1 wherever a pair meets it),
the false-alarm guarantee by simulation at the threshold, power, and state that survives a restart without being
reset or counted twice."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
from daemon_config import event, make_config
from prometheus_client import CollectorRegistry
from scipy.stats import binom
from test_labels_and_checkpoint import Clock, records

from exporter.config import parse_config
from exporter.core import detect
from exporter.daemon import Daemon
from exporter.stream.state.detectors import DetectorBank
from exporter.stream.state.window import RowLayout

T0 = 1_800_000_000.0
BASE_RATES = (0.02, 0.1, 0.3, 0.5)
STEP_SIZES = (3, 30, 300)  # events per group per step
EDGES = {"gap": (detect.gap_edge, 0.05), "wide gap": (detect.gap_edge, 0.3), "ratio": (detect.ratio_edge, 0.8),
         "low ratio": (detect.ratio_edge, 0.5)}  # fmt: skip


def _null_boundary(kind: str, high: float) -> float:
    """The lower rate that puts a pair exactly at its threshold, given the higher one."""
    make, threshold = EDGES[kind]
    return high - threshold if make is detect.gap_edge else threshold * high


def _expected_lr(edge: detect.Edge, n_h: int, n_l: int, p_h: float, p_l: float) -> float:
    """E[LR] of one step with true rates (p_h, p_l), summed exactly over both binomials."""
    k_h, k_l = np.arange(n_h + 1)[:, None], np.arange(n_l + 1)[None, :]
    lr = np.exp(detect.two_sample_log_lr(k_h, n_h, k_l, n_l, edge))
    return float((binom.pmf(k_h, n_h, p_h) * binom.pmf(k_l, n_l, p_l) * lr).sum())


@pytest.mark.parametrize("kind", EDGES)
@pytest.mark.parametrize("pooled", [0.0, 0.02, 0.3, 0.5, 0.97, math.nan])
@pytest.mark.parametrize(("n_h", "n_l"), [(1, 1), (3, 40), (40, 3), (300, 300), (9, 0)])
def test_likelihood_ratio_has_expectation_at_most_one_wherever_the_pair_meets_its_threshold(
        kind: str, pooled: float, n_h: int, n_l: int) -> None:  # fmt: skip
    """Every rate pair on the null's boundary (a gap of exactly the threshold, an impact ratio of exactly it),
    inside it (equal rates, a gap below), at any base rate: E[LR] <= 1, exactly (no approximation); 1 at the edge
    point the alternative is projected on."""
    make, threshold = EDGES[kind]
    edge = make(pooled, threshold)
    worst = 0.0
    for p_h in np.linspace(0.0, 1.0, 41):
        boundary = _null_boundary(kind, float(p_h))
        for p_l in (boundary, boundary + 0.02, boundary + 0.2, float(p_h)):
            if 0.0 <= p_l <= 1.0:
                worst = max(worst, _expected_lr(edge, n_h, n_l, float(p_h), p_l))
    assert worst <= 1.0 + 1e-12
    at_edge = _expected_lr(edge, n_h, n_l, float(edge.high), float(edge.low))
    assert at_edge == pytest.approx(1.0, abs=1e-12)


@pytest.mark.parametrize("kind", EDGES)
@pytest.mark.parametrize("pooled", [0.05, 0.3, 0.6])
def test_evidence_drifts_down_at_the_threshold_and_up_beyond_it(kind: str, pooled: float) -> None:
    """The expected log LR of a step (30 and 50 events): negative at equal rates and at the threshold itself,
    positive at the alternative (as far beyond the threshold again: gap 2 x threshold, ratio threshold²)."""
    make, threshold = EDGES[kind]
    edge = make(pooled, threshold)
    high = float(edge.high)
    k_h, k_l = np.arange(31)[:, None], np.arange(51)[None, :]
    log_lr = detect.two_sample_log_lr(k_h, 30, k_l, 50, edge)

    def drift(p_l: float) -> float:
        return float((binom.pmf(k_h, 30, high) * binom.pmf(k_l, 50, p_l) * log_lr).sum())

    beyond = high - 2 * threshold if make is detect.gap_edge else threshold**2 * high
    assert drift(high) < 0.0
    assert drift(_null_boundary(kind, high)) < 0.0
    assert drift(max(beyond, 0.0)) > 0.0


def test_the_ratio_is_two_binomials_of_an_alternative_beyond_the_edge() -> None:
    """A step's log LR is log Bin(k; n, q) - log Bin(k; n, e) for each group, the alternative q beyond the edge e
    by the edge's excess (a gap 0.05 beyond 0.05 here): scipy's binomials at the q the ratio implies."""
    edge = detect.gap_edge(0.3, 0.05)
    k_h, n_h, k_l, n_l = 17, 40, 9, 60
    # the ratio's derivative in k recovers q: d/dk log LR_h = logit(q_h) - logit(e_h)
    step_h = float(detect.two_sample_log_lr(k_h + 1, n_h, k_l, n_l, edge) - detect.two_sample_log_lr(k_h, n_h, k_l,
                                                                                                       n_l, edge))
    step_l = float(detect.two_sample_log_lr(k_h, n_h, k_l + 1, n_l, edge) - detect.two_sample_log_lr(k_h, n_h, k_l,
                                                                                                       n_l, edge))
    q_h = 1 / (1 + math.exp(-(step_h + float(detect.logit(edge.high)))))
    q_l = 1 / (1 + math.exp(-(step_l + float(detect.logit(edge.low)))))
    assert (q_h - q_l) - (float(edge.high) - float(edge.low)) == pytest.approx(float(edge.excess), rel=1e-9)
    # the alternative moves each group by its variance over its events: the edge is its projection on the null
    assert (q_h - float(edge.high)) * n_h / (edge.high * (1 - edge.high)) == pytest.approx(
        (float(edge.low) - q_l) * n_l / (edge.low * (1 - edge.low)), rel=1e-9)
    expected = (binom.logpmf(k_h, n_h, q_h) - binom.logpmf(k_h, n_h, float(edge.high))
                + binom.logpmf(k_l, n_l, q_l) - binom.logpmf(k_l, n_l, float(edge.low)))  # fmt: skip
    assert float(detect.two_sample_log_lr(k_h, n_h, k_l, n_l, edge)) == pytest.approx(expected, rel=1e-9)


def test_a_vectorised_call_gives_each_element_its_own_ratio() -> None:
    """Counts and edges of any shape broadcast: each element's value is the one it gets alone."""
    rng = np.random.default_rng(7)
    n_h, n_l = rng.integers(0, 3_000, (4, 50)), rng.integers(0, 3_000, (4, 50))
    k_h, k_l = rng.binomial(n_h, 0.3), rng.binomial(n_l, 0.25)
    pooled = rng.random((4, 50))
    edge = detect.ratio_edge(pooled, 0.8)
    together = detect.two_sample_log_lr(k_h, n_h, k_l, n_l, edge)
    for i, j in zip(rng.integers(0, 4, 30), rng.integers(0, 50, 30), strict=True):
        alone = detect.two_sample_log_lr(k_h[i, j], n_h[i, j], k_l[i, j], n_l[i, j], detect.ratio_edge(pooled[i, j],
                                                                                                          0.8))
        assert together[i, j] == pytest.approx(float(alone), rel=1e-12, abs=1e-12)


def test_steps_without_information_leave_the_statistic_alone() -> None:
    # an empty group, both empty, and an edge that leaves no room for an alternative (a gap threshold near 1)
    log_lr = detect.two_sample_log_lr([0, 3, 0], [0, 10, 0], [3, 0, 0], [10, 0, 0], detect.gap_edge(0.3, 0.05))
    assert log_lr.tolist() == [0.0, 0.0, 0.0]
    assert float(detect.two_sample_log_lr(9, 10, 0, 10, detect.gap_edge(0.5, 0.99))) == 0.0


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


def _steps_at_the_threshold(rng: np.random.Generator, kind: str, shape: tuple[int, ...], size: int,
                            rate: float) -> tuple[np.ndarray, np.ndarray]:  # fmt: skip
    """(positives, events), shape (..., 2): the higher group at ``rate + 0.05``, the lower one exactly at the
    threshold below it (the null's worst case)."""
    high = rate + 0.05
    n = rng.poisson(size, (*shape, 2))
    k = rng.binomial(n, np.array([high, _null_boundary(kind, high)]))
    return k, n


def _log_lrs(kind: str, history: np.ndarray, k: np.ndarray, n: np.ndarray) -> np.ndarray:
    """(runs, 2) log LRs of one step: a detector per direction, its edge centred on the pooled rate so far."""
    make, threshold = EDGES[kind]
    with np.errstate(invalid="ignore", divide="ignore"):
        edge = make(history[:, 0] / history[:, 1], threshold)
    return np.stack([detect.two_sample_log_lr(k[:, 0], n[:, 0], k[:, 1], n[:, 1], edge),
                     detect.two_sample_log_lr(k[:, 1], n[:, 1], k[:, 0], n[:, 0], edge)], axis=-1)  # fmt: skip


@pytest.mark.parametrize("kind", ["gap", "ratio"])
@pytest.mark.parametrize("rate", BASE_RATES)
@pytest.mark.parametrize("size", STEP_SIZES)
def test_crossings_of_a_low_level_are_as_rare_as_ville_allows(kind: str, rate: float, size: int) -> None:
    """A pair exactly at its threshold (gap 0.05, or impact ratio 0.8) through the shipped edges (centred on the
    pooled rate of earlier steps), a low level h = 4: the share of 10-step blocks in which CUSUM reaches h stays
    below the proven bound 10 e^-h = 0.18 per detector."""
    rng = np.random.default_rng(int(rate * 1000) + size)
    runs, blocks, block, h = 400, 10, 10, 4.0
    k, n = _steps_at_the_threshold(rng, kind, (blocks * block, runs), size, rate)
    statistic = np.zeros((runs, 2))
    history = np.zeros((runs, 2))  # pooled positives, trials of earlier steps
    crossed = np.zeros((blocks, runs), dtype=bool)
    for t in range(blocks * block):
        statistic = detect.cusum(statistic, _log_lrs(kind, history, k[t], n[t]))
        history += np.stack([k[t].sum(axis=-1), n[t].sum(axis=-1)], axis=-1)
        crossed[t // block] |= (statistic >= h).any(axis=-1)
    assert crossed.mean() <= 2 * block * math.exp(-h)  # two detectors (directions) per run


def onsets(active: np.ndarray) -> np.ndarray:
    """Steps at which an alarm is raised (a page starts), from the (T, ...) alarm states."""
    before = np.concatenate([np.zeros_like(active[:1]), active[:-1]])
    return active & ~before


@pytest.mark.parametrize("kind", ["gap", "ratio"])
@pytest.mark.parametrize("rate", BASE_RATES)
@pytest.mark.parametrize("size", STEP_SIZES)
def test_shiryaev_roberts_alarms_are_as_rare_as_the_martingale_allows(kind: str, rate: float, size: int) -> None:
    """A pair exactly at its threshold, the shipped edges, a low level h = 5: alarms (R restarted after each) per
    detector and step stay below e^-h, the bound the alarm level is derived from."""
    rng = np.random.default_rng(int(rate * 1000) + size + 1)
    runs, steps, h = 200, 300, 5.0
    k, n = _steps_at_the_threshold(rng, kind, (steps, runs), size, rate)
    log_r = np.full((runs, 2), -np.inf)
    history = np.zeros((runs, 2))
    alarms = 0
    for t in range(steps):
        log_r, alarm = detect.shiryaev_roberts(log_r, _log_lrs(kind, history, k[t], n[t]), h)
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


@pytest.mark.parametrize(("changed", "steps", "median_minutes"), [(0.15, 90, 60), (0.20, 240, 180)])
def test_a_gap_beyond_the_threshold_pages_at_2000_events_per_group_per_hour(changed: float, steps: int,
                                                                             median_minutes: int) -> None:  # fmt: skip
    """Power at the shipped level (3 attributes of 3, 4, 5 groups, minute steps): one group falls from 0.30 after
    a fair day. Three times the 0.05 threshold (to 0.15): most runs page within the hour; twice it (to 0.20, the
    alternative): every run pages, most within 3 hours (the evidence per event is that of a gap 0.05 beyond the
    threshold, a quarter of what "beyond equal rates" gave, whose median was 24 minutes)."""
    config = parse_config({"model_id": "m", "protected_attributes": [
        {"name": "a", "groups": list("xyz")}, {"name": "b", "groups": list("pqrs")},
        {"name": "c", "groups": list("ghijk")}]})  # fmt: skip
    model = config.model()
    bank = DetectorBank(model, config.windowing, RowLayout.of(model).offsets, RowLayout.of(model).n_rows)
    runs = 40
    rng = np.random.default_rng(5)
    state, _ = bank.advance(bank.initial_state((runs,)), _fair_steps(rng, (240, runs), bank.n_rows, 33, 0.3))
    after = _fair_steps(rng, (steps, runs), bank.n_rows, 33, 0.3)
    n = after[..., 0, 0] + after[..., 0, 1]
    after[..., 0, 0] = rng.binomial(n, changed)
    after[..., 0, 1] = n - after[..., 0, 0]
    _, trace = bank.advance(state, after)
    first = np.argmax(trace.active.any(axis=-1), axis=0)
    paged = trace.active.any(axis=(0, 2))
    assert paged.all()
    assert np.median(first + 1) <= median_minutes


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
    # 30/40 against 5/40 in one step; no history yet, so the null's edge is centred on 0.5 (0.525 against 0.475,
    # the 0.05 threshold) and the alternative, with equal events, is 0.55 against 0.45
    edge = detect.gap_edge(math.nan, 0.05)
    assert up == pytest.approx(float(detect.two_sample_log_lr(30, 40, 5, 40, edge)))
    assert up == pytest.approx(2.213, abs=1e-3) and down == 0.0
    assert value(d, "fairness_subgroup_detector_statistic", attribute="gender", subgroup="female",
                 direction="down") == 0.0  # no baseline yet: no evidence  # fmt: skip
    level = value(d, "fairness_detector_alarm_level")
    assert level == pytest.approx(d.fleet.models["m1"].store.detectors.level)
    # 2 attributes x 1 pair x 2 metrics x 2 directions + 4 subgroups x 2 directions, one step a minute
    assert level == pytest.approx(math.log((8 + 8) * 1440 / 0.01))
    assert value(d, "fairness_detector_steps_total") == 1.0
    assert value(d, "fairness_detector_alarm", **pair, metric="demographic_parity_difference",
                 direction="a_higher") == 0.0  # 2.2 nats of evidence: no alarm  # fmt: skip
