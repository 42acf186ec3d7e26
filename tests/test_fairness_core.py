"""The counts-based core: hand-checked numbers, published interval examples, and Fairlearn as an oracle."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from compas import RACE_GROUPS, compas_frame
from fairlearn.metrics import (
    MetricFrame,
    demographic_parity_difference,
    demographic_parity_ratio,
    equalized_odds_difference,
    false_positive_rate,
    selection_rate,
    true_positive_rate,
)
from sklearn.metrics import accuracy_score, precision_score

from exporter.core import fairness as core
from exporter.core.attributes import Attribute
from exporter.core.evaluate import evaluate_many
from exporter.core.fairness import FN, FP, PRED_NEG, PRED_POS, TN, TP, counts_from_arrays, group_stats
from exporter.core.metric_table import METRICS, compare, samples_to_decide


def test_counts_from_arrays_counts_every_outcome_per_group() -> None:
    codes = np.array([0, 0, 0, 0, 1, 1, 1, -1])
    y_pred = np.array([1, 1, 0, 0, 1, 0, 0, 1])
    y_true = np.array([1, 0, 0, 1, -1, 0, 1, 1])
    counts = counts_from_arrays(codes, 2, y_pred, y_true)
    assert counts[0].tolist() == [2, 2, 1, 1, 1, 1]  # pos, neg, tp, fp, tn, fn
    assert counts[1].tolist() == [1, 2, 0, 0, 1, 1]  # the unlabelled positive counts as a prediction only


def test_hand_computed_rates_and_gaps() -> None:
    # group a: 40 of 100 selected; 30 of 50 positives found, 10 of 50 negatives flagged
    # group b: 25 of 100 selected; 20 of 50 positives found,  5 of 50 negatives flagged
    counts = np.zeros((2, 6), dtype=np.int64)
    counts[0, [PRED_POS, PRED_NEG, TP, FN, FP, TN]] = [40, 60, 30, 20, 10, 40]
    counts[1, [PRED_POS, PRED_NEG, TP, FN, FP, TN]] = [25, 75, 20, 30, 5, 45]
    stats = group_stats(counts)
    assert stats.selection_rate.tolist() == [0.40, 0.25]
    assert stats.true_positive_rate.tolist() == [0.6, 0.4]
    assert stats.false_positive_rate.tolist() == [0.2, 0.1]
    assert stats.accuracy.tolist() == [0.7, 0.65]
    c = compare(counts, np.array([0]), np.array([1]))
    assert c.metrics["demographic_parity_difference"].value[0] == pytest.approx(0.15)
    assert c.metrics["equalised_odds_difference"].value[0] == pytest.approx(0.2)  # max(|0.6-0.4|, |0.2-0.1|)
    assert c.metrics["disparate_impact_ratio"].value[0] == pytest.approx(0.625)  # 0.25 / 0.40, whichever side is a
    swapped = compare(counts, np.array([1]), np.array([0]))
    assert swapped.metrics["disparate_impact_ratio"].value[0] == pytest.approx(0.625)


def test_disparate_impact_is_undefined_not_zero_when_a_group_has_no_positive() -> None:
    # issue 9: a ratio of 0 paged on, with its own interval excluding it; no positives means no evidence
    counts = np.array([[0, 50, 0, 0, 0, 0], [0, 40, 0, 0, 0, 0], [10, 30, 0, 0, 0, 0]])
    di = compare(counts, np.array([0, 0]), np.array([1, 2])).metrics["disparate_impact_ratio"]
    assert np.isnan(di.value).all() and np.isnan(di.lower).all() and np.isnan(di.upper).all()
    ev = evaluate_many([(Attribute("g", ("g",), ("a", "b", "c"), ((0, 1), (0, 2))), counts)], min_samples=1)[0]
    assert not ev.sufficient("disparate_impact_ratio").any()


def test_empty_group_has_no_rate() -> None:
    counts = np.array([[0, 0, 0, 0, 0, 0], [3, 7, 0, 0, 0, 0]])
    stats = group_stats(counts)
    assert np.isnan(stats.selection_rate[0]) and stats.selection_rate[1] == 0.3
    assert np.isnan(compare(counts, np.array([0]), np.array([1])).metrics["demographic_parity_difference"].value[0])


def test_wilson_interval_matches_published_values() -> None:
    # Newcombe (1998), table I: 81/263 -> 0.2553 to 0.3662; 15/148 -> 0.0624 to 0.1605
    lo, hi = core.wilson_interval(np.array([81, 15]), np.array([263, 148]))
    assert lo.round(4).tolist() == [0.2553, 0.0624]
    assert hi.round(4).tolist() == [0.3662, 0.1605]


def test_continuity_corrected_wilson_interval() -> None:
    # Newcombe (1998), table I, method 4: 81/263 -> 0.2535 to 0.3682. By hand, 5/10 at z = 1.96:
    # upper = (10 + z^2 + 1 + z * sqrt(z^2 + 2 - 1/10 + 4 * 0.5 * (5 - 1))) / (2 * (10 + z^2)) = 0.79858
    lo, hi = core.wilson_interval(np.array([81, 5, 0]), np.array([263, 10, 10]), continuity=True)
    assert lo.round(4).tolist() == [0.2535, 0.2014, 0.0]
    assert hi.round(4).tolist() == [0.3682, 0.7986, 0.3445]


def test_newcombe_interval_matches_published_example() -> None:
    # Newcombe (1998), method 10, example (a): 56/70 - 48/80 -> +0.0524 to +0.3339
    lo, hi = core.newcombe_interval(np.array([56]), np.array([70]), np.array([48]), np.array([80]))
    assert (round(lo[0], 4), round(hi[0], 4)) == (0.0524, 0.3339)


def test_abs_interval_folds_an_interval_that_straddles_zero() -> None:
    lo, hi = core.abs_interval(np.array([-0.1, 0.05, -0.3]), np.array([0.2, 0.1, -0.2]))
    assert lo.tolist() == [0.0, 0.05, 0.2]
    assert hi.tolist() == [0.2, 0.1, 0.3]


def test_the_ratio_interval_is_statsmodels_score_interval() -> None:
    """Miettinen and Nurminen's score interval (statsmodels' confint_proportions_2indep, method="score") for 200
    random pairs away from the boundaries, where statsmodels' root finder is reliable; at them (a rate of 0 or 1)
    the bounds are where the score statistic is exactly +-1.96, around the point estimate."""
    from statsmodels.stats.proportion import confint_proportions_2indep

    rng = np.random.default_rng(17)
    for _ in range(200):
        n1, n0 = rng.integers(5, 3000, 2)
        k1, k0 = rng.integers(1, n1), rng.integers(1, n0)
        lo, hi = core.ratio_interval(np.array([k1]), np.array([n1]), np.array([k0]), np.array([n0]))
        want = confint_proportions_2indep(k1, n1, k0, n0, method="score", compare="ratio")
        assert (lo[0], hi[0]) == pytest.approx(want, rel=1e-7), (k1, n1, k0, n0)
    for k1, n1, k0, n0 in ((750, 1000, 30, 30), (30, 30, 750, 1000), (30, 30, 1000, 1000), (50, 50, 1, 50)):
        lo, hi = core.ratio_interval(np.array([k1]), np.array([n1]), np.array([k0]), np.array([n0]))
        counts = (np.array([float(x)]) for x in (k1, n1, k0, n0))
        args = list(counts)
        assert lo[0] < (k1 / n1) / (k0 / n0) < hi[0]
        assert core._ratio_score(lo, *args)[0] == pytest.approx(1.959964, abs=1e-5)
        assert core._ratio_score(hi, *args)[0] == pytest.approx(-1.959964, abs=1e-5)
    lo, hi = core.ratio_interval(np.array([0, 3]), np.array([30, 30]), np.array([5, 0]), np.array([1000, 30]))
    assert lo[0] == 0.0 and 0 < hi[0] < np.inf and np.isnan(lo[1]) and np.isnan(hi[1])  # no success below / above


def test_intervals_contain_the_estimate_and_narrow_with_samples() -> None:
    small = np.array([[12, 18, 0, 0, 0, 0], [6, 24, 0, 0, 0, 0]])
    c_small = compare(small, np.array([0]), np.array([1]))
    c_big = compare(small * 100, np.array([0]), np.array([1]))
    for c in (c_small, c_big):
        lo, hi = c.metrics["demographic_parity_difference"].interval
        assert lo[0] <= c.metrics["demographic_parity_difference"].value[0] <= hi[0]
        lo, hi = c.metrics["disparate_impact_ratio"].interval
        assert lo[0] <= c.metrics["disparate_impact_ratio"].value[0] <= hi[0] <= 1.0
    width = lambda c: np.subtract(*c.metrics["demographic_parity_difference"].interval[::-1])[0]  # noqa: E731
    assert width(c_big) < width(c_small) / 5


def _random_frame(seed: int, n: int = 5000) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    group = rng.choice(["a", "b", "c"], size=n, p=[0.5, 0.3, 0.2])
    base = np.select([group == "a", group == "b"], [0.5, 0.35], 0.2)
    return pd.DataFrame({
        "group": group,
        "prediction": (rng.random(n) < base).astype(int),
        "label": (rng.random(n) < 0.4).astype(int),
    })  # fmt: skip


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_core_matches_fairlearn_on_random_data(seed: int) -> None:
    df = _random_frame(seed)
    codes = pd.Categorical(df.group, categories=["a", "b", "c"]).codes
    counts = counts_from_arrays(codes, 3, df.prediction.to_numpy(), df.label.to_numpy())
    stats = group_stats(counts)
    mf = MetricFrame(
        metrics={"sr": selection_rate, "tpr": true_positive_rate, "fpr": false_positive_rate},
        y_true=df.label, y_pred=df.prediction, sensitive_features=df.group,
    )  # fmt: skip
    np.testing.assert_allclose(stats.selection_rate, mf.by_group["sr"].to_numpy(), rtol=0, atol=1e-12)
    np.testing.assert_allclose(stats.true_positive_rate, mf.by_group["tpr"].to_numpy(), rtol=0, atol=1e-12)
    np.testing.assert_allclose(stats.false_positive_rate, mf.by_group["fpr"].to_numpy(), rtol=0, atol=1e-12)
    for a, b in [(0, 1), (0, 2), (1, 2)]:
        pair = df[df.group.isin([["a", "b", "c"][a], ["a", "b", "c"][b]])]
        kw = {"y_true": pair.label, "y_pred": pair.prediction, "sensitive_features": pair.group}
        c = compare(counts, np.array([a]), np.array([b]))
        assert abs(c.metrics["demographic_parity_difference"].value[0] - demographic_parity_difference(**kw)) < 1e-9
        assert abs(c.metrics["equalised_odds_difference"].value[0] - equalized_odds_difference(**kw)) < 1e-9
        assert abs(c.metrics["disparate_impact_ratio"].value[0] - demographic_parity_ratio(**kw)) < 1e-9


PAIRS = [(0, 1), (0, 2), (1, 2)]
FAIRLEARN_RATES = {"true_positive_rate": true_positive_rate, "false_positive_rate": false_positive_rate,
                   "precision": lambda t, p: precision_score(t, p, zero_division=np.nan),
                   "accuracy": accuracy_score}  # fmt: skip
NEW_METRICS = {"equal_opportunity_difference": "true_positive_rate",
               "false_positive_rate_difference": "false_positive_rate",
               "predictive_parity_difference": "precision", "accuracy_difference": "accuracy"}  # fmt: skip


def _check_new_metrics_against_fairlearn(frame: pd.DataFrame, column: str, groups: list[str]) -> int:
    """Each new metric of every pair equals |by_group[a] - by_group[b]| of Fairlearn's MetricFrame."""
    rows = frame[frame[column].isin(groups)]
    codes = pd.Categorical(rows[column], categories=groups).codes
    counts = counts_from_arrays(codes, len(groups), rows.prediction.to_numpy(), rows.label.to_numpy())
    mf = MetricFrame(metrics=FAIRLEARN_RATES, y_true=rows.label, y_pred=rows.prediction,
                     sensitive_features=rows[column])  # fmt: skip
    stats = group_stats(counts)
    a, b = np.array([p[0] for p in PAIRS if p[1] < len(groups)]), np.array([p[1] for p in PAIRS if p[1] < len(groups)])
    c = compare(counts, a, b)
    checked = 0
    for metric, rate in NEW_METRICS.items():
        by_group = mf.by_group[rate].loc[groups].to_numpy(dtype=float)
        np.testing.assert_allclose(getattr(stats, rate), by_group, rtol=0, atol=1e-12)
        np.testing.assert_allclose(c.metrics[metric].value, np.abs(by_group[a] - by_group[b]), rtol=0, atol=1e-12)
        checked += len(a)
    return checked


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_new_metrics_match_fairlearn_metric_frame_on_random_data(seed: int) -> None:
    assert _check_new_metrics_against_fairlearn(_random_frame(seed), "group", ["a", "b", "c"]) == 12


def test_new_metrics_match_fairlearn_metric_frame_on_compas() -> None:
    frame = compas_frame()
    assert _check_new_metrics_against_fairlearn(frame, "race", RACE_GROUPS) == 12
    assert _check_new_metrics_against_fairlearn(frame, "sex", ["Male", "Female"]) == 4


def test_each_metric_counts_what_its_rates_rest_on() -> None:
    # a: 100 predictions, 10 labelled positives, 40 labelled negatives, 20 labelled predicted positives
    counts = np.array([[30, 70, 8, 12, 28, 2], [50, 50, 20, 20, 30, 10]])
    c = compare(counts, np.array([0]), np.array([1]))
    support = {name: int(v.support[0]) for name, v in c.metrics.items()}
    assert support == {"demographic_parity_difference": 100, "disparate_impact_ratio": 100,
                       "equalised_odds_difference": 10, "equal_opportunity_difference": 10,
                       "false_positive_rate_difference": 40, "predictive_parity_difference": 20,
                       "accuracy_difference": 50, "negative_predictive_value_difference": 30,
                       "false_positive_rate_ratio": 40, "false_negative_rate_ratio": 10, "true_negative_rate_ratio": 40,
                       "negative_predictive_value_ratio": 30, "false_discovery_rate_ratio": 20,
                       "false_omission_rate_ratio": 30, "auc_difference": 0,
                       "calibration_difference": 0}  # fmt: skip (no scores: no AUC, no ECE)
    assert METRICS["equalised_odds_difference"].counted == "labelled positives and labelled negatives"


def test_a_value_is_reported_whenever_the_floor_is_met_however_wide_its_interval() -> None:
    # issue 20: a half-width of about 0.23 at 30 per group is a number with a wide interval, not a hidden one
    attribute = Attribute("g", ("g",), ("a", "b"), ((0, 1),))
    for n, reported, evidence in ((29, False, "inconclusive"), (30, True, "inconclusive"), (3000, True, "pass")):
        counts = np.array([[n * 3 // 10, n - n * 3 // 10, 0, 0, 0, 0], [n * 3 // 10, n - n * 3 // 10, 0, 0, 0, 0]])
        ev = evaluate_many([(attribute, counts)], min_samples=30)[0]
        half = ev.values("demographic_parity_difference").half_width[0]
        assert bool(ev.sufficient("demographic_parity_difference")[0]) is reported, (n, half)
        assert ev.evidence("demographic_parity_difference", 0.05).tolist() == [evidence], (n, half)
        assert ev.values("demographic_parity_difference").value[0] == 0.0
    assert ev.sufficient("equalised_odds_difference").tolist() == [False]  # no labelled row: nothing to count
    # a ratio with no positive prediction in a group has no value, whatever the samples
    (ev,) = evaluate_many([(attribute, np.array([[0, 500, 0, 0, 0, 0], [50, 450, 0, 0, 0, 0]]))], min_samples=30)
    assert ev.sufficient("disparate_impact_ratio").tolist() == [False]
    assert ev.evidence("disparate_impact_ratio", 0.8).tolist() == ["inconclusive"]
    assert ev.sufficient("demographic_parity_difference").tolist() == [True]


def test_evidence_and_samples_to_decide() -> None:
    dpd, di = METRICS["demographic_parity_difference"], METRICS["disparate_impact_ratio"]
    assert dpd.evidence([0.0, 0.06, 0.01, np.nan], [0.04, 0.2, 0.09, np.nan], 0.05).tolist() == \
        ["pass", "fail", "inconclusive", "inconclusive"]  # fmt: skip
    assert di.evidence([0.85, 0.5, 0.7], [1.0, 0.79, 0.9], 0.8).tolist() == ["pass", "fail", "inconclusive"]
    # the boundaries: a difference passes at its threshold, a ratio passes at its threshold
    assert dpd.evidence(0.0, 0.05, 0.05).tolist() == "pass" and di.evidence(0.8, 1.0, 0.8).tolist() == "pass"
    # half-width 0.06 at a value 0.02 from the threshold: (0.06 / 0.02)^2 = 9 times the samples
    assert samples_to_decide(0.06, 0.03, 0.05, {"a": 100, "b": 50}) == {"a": 900, "b": 450}
    assert samples_to_decide(0.06, 0.05, 0.05, {"a": 100}) is None


def _simulated_counts(rng: np.random.Generator, reps: int, n: int, rate_a: float, rate_b: float) -> np.ndarray:
    """reps pairs of groups (rows 2i, 2i+1): n predictions, n labelled positives and n labelled negatives each.
    Selection and TPR differ by rate_a vs rate_b; FPR is rate_a in both."""
    rates = np.tile([rate_a, rate_b], reps)
    selected, tp, fp = rng.binomial(n, rates), rng.binomial(n, rates), rng.binomial(n, np.full(2 * reps, rate_a))
    return np.column_stack([selected, n - selected, tp, fp, n - fp, n - tp])


def test_interval_coverage_by_simulation() -> None:
    """Coverage of every metric's 95% interval over sizes 30..10,000 and rates 0.02..0.5, with and without a gap.

    Newcombe's score interval is approximate: its exact coverage for a difference of 0 at a rate of 0.5 and 100
    per group is 0.944, so each grid point must cover at least 0.93 (Monte Carlo error of 4,000 draws: 0.004) and
    the grid on average at least 0.95. Equalised odds, the max of two gaps, used to take two 95% bounds and cover
    about 0.90; its Bonferroni interval must now do as well as a single difference.
    """
    rng = np.random.default_rng(20261201)
    reps = 4000
    a = np.arange(0, 2 * reps, 2)
    coverage: dict[str, list[float]] = {m: [] for m in METRICS}
    for n in (30, 100, 300, 1000, 3000, 10_000):
        for rate in (0.02, 0.05, 0.1, 0.2, 0.5):
            for other in (rate, rate + 0.1):
                counts = _simulated_counts(rng, reps, n, rate, other)
                truth = {"selection_rate": abs(rate - other), "true_positive_rate": abs(rate - other),
                         "false_positive_rate": 0.0}  # fmt: skip
                for name, metric in METRICS.items():
                    if metric.scores:
                        continue  # compared from scores, not counts: tests/test_metric_menu.py
                    if metric.kind == "ratio":
                        expected = min(rate, other) / max(rate, other)
                    elif set(metric.rates) <= set(truth):
                        expected = max(truth[r] for r in metric.rates)
                    else:
                        continue  # precision and accuracy have no closed-form truth in this design
                    v = metric.compute(counts, a, a + 1)
                    defined = ~np.isnan(v.value)
                    covered = (v.lower[defined] <= expected + 1e-12) & (expected - 1e-12 <= v.upper[defined])
                    coverage[name].append(float(covered.mean()))
    for name in ("demographic_parity_difference", "equalised_odds_difference", "disparate_impact_ratio",
                 "equal_opportunity_difference", "false_positive_rate_difference"):  # fmt: skip
        assert len(coverage[name]) == 60
        assert min(coverage[name]) >= 0.93, (name, min(coverage[name]))
        assert np.mean(coverage[name]) >= 0.95, (name, np.mean(coverage[name]))


def _binomial_pmf(n: int, p: float) -> np.ndarray:
    """P(K = k) for k = 0..n, from log binomial coefficients (no scipy)."""
    k = np.arange(n + 1)
    log_comb = np.concatenate([[0.0], np.cumsum(np.log(np.arange(n, 0, -1)) - np.log(np.arange(1, n + 1)))])
    return np.exp(log_comb + k * np.log(p) + (n - k) * np.log1p(-p))


@pytest.mark.parametrize("n", [30, 100, 300])
def test_equalised_odds_interval_covers_at_least_95_percent_exactly_when_there_is_no_gap(n: int) -> None:
    """Exact coverage, by enumerating every outcome, where it is lowest: no gap in TPR or FPR.

    The two components rest on disjoint rows (positives, negatives), so the coverage is the product of theirs. A
    component's coverage: every (TP_a, TP_b) with equal FPRs beside them (that component always covers 0), weighted by
    its binomial probability. Method 10 at 97.5% gave 0.9445 at n = 100, rate 0.5; the continuity-corrected interval
    must reach 0.95 at every rate.
    """
    k = np.arange(n + 1)
    tp_a, tp_b = (x.ravel() for x in np.meshgrid(k, k, indexing="ij"))
    counts = np.zeros((2 * len(tp_a), 6), dtype=np.int64)
    counts[0::2, TP], counts[0::2, FN] = tp_a, n - tp_a
    counts[1::2, TP], counts[1::2, FN] = tp_b, n - tp_b
    counts[:, FP] = counts[:, TN] = n
    pairs = np.arange(0, len(counts), 2)
    v = METRICS["equalised_odds_difference"].compute(counts, pairs, pairs + 1)
    covers_zero = v.lower <= 0.0
    for rate in (0.02, 0.05, 0.1, 0.2, 0.3, 0.5):
        pmf = _binomial_pmf(n, rate)
        component = float((np.outer(pmf, pmf).ravel() * covers_zero).sum())
        assert component**2 >= 0.95, (n, rate, component**2)
