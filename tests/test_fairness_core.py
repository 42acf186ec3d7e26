"""The counts-based core: hand-checked numbers, published interval examples, and Fairlearn as an oracle."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from fairlearn.metrics import (
    MetricFrame,
    demographic_parity_difference,
    demographic_parity_ratio,
    equalized_odds_difference,
    false_positive_rate,
    selection_rate,
    true_positive_rate,
)

from exporter.core import fairness as core
from exporter.core.attributes import Attribute
from exporter.core.evaluate import evaluate_many
from exporter.core.fairness import FN, FP, PRED_NEG, PRED_POS, TN, TP, counts_from_arrays, group_stats
from exporter.core.metric_table import compare


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


def test_newcombe_interval_matches_published_example() -> None:
    # Newcombe (1998), method 10, example (a): 56/70 - 48/80 -> +0.0524 to +0.3339
    lo, hi = core.newcombe_interval(np.array([56]), np.array([70]), np.array([48]), np.array([80]))
    assert (round(lo[0], 4), round(hi[0], 4)) == (0.0524, 0.3339)


def test_abs_interval_folds_an_interval_that_straddles_zero() -> None:
    lo, hi = core.abs_interval(np.array([-0.1, 0.05, -0.3]), np.array([0.2, 0.1, -0.2]))
    assert lo.tolist() == [0.0, 0.05, 0.2]
    assert hi.tolist() == [0.2, 0.1, 0.3]


def test_katz_log_ratio_interval() -> None:
    # 10/100 over 20/100: RR 0.5, se sqrt(1/10 - 1/100 + 1/20 - 1/100) = 0.36056 -> 0.5 * exp(+-0.706675)
    lo, hi = core.ratio_interval(np.array([10]), np.array([100]), np.array([20]), np.array([100]))
    assert (round(lo[0], 4), round(hi[0], 4)) == (0.2466, 1.0136)


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
