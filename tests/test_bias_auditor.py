"""The bias auditor: the issue's six-row example, intervals from the core, intersections and bad outcomes."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from scipy import stats

from exporter import BiasAuditor
from exporter.core.fairness import t_interval, wilson_interval
from exporter.gate.fairness.audit import DataError

EXAMPLE = pd.DataFrame({
    "gender": ["male", "female", "male", "female", "male", "female"],
    "race": ["white", "black", "black", "white", "asian", "asian"],
    "prediction_accuracy": [0.9, 0.7, 0.8, 0.85, 0.92, 0.9],
})  # fmt: skip


def test_six_row_example_gives_the_documented_numbers() -> None:
    report = BiasAuditor(["gender", "race"], "prediction_accuracy", bias_threshold=0.1).evaluate_bias(EXAMPLE)
    gender, race = report["gender"], report["race"]
    assert gender["group_stats"] == pytest.approx({"male": 0.873333, "female": 0.816667}, abs=1e-6)
    assert gender["fairness_gap"] == pytest.approx(0.056667, abs=1e-6)
    assert gender["is_biased"] is False
    assert race["group_stats"] == pytest.approx({"white": 0.875, "black": 0.75, "asian": 0.91}, abs=1e-12)
    assert race["fairness_gap"] == pytest.approx(0.16, abs=1e-12)
    assert race["is_biased"] is True
    assert race["group_sizes"] == {"white": 2, "black": 2, "asian": 2}
    assert (race["highest_group"], race["lowest_group"], race["excluded_rows"]) == ("asian", "black", 0)


def test_a_subclass_that_overrides_the_threshold_keeps_working() -> None:
    class StrictAuditor(BiasAuditor):
        def __init__(self, protected_features: list[str], outcome_feature: str) -> None:
            super().__init__(protected_features, outcome_feature)
            self.bias_threshold = 0.05

    class LenientAuditor(BiasAuditor):
        bias_threshold = 0.2

        def __init__(self, protected_features: list[str], outcome_feature: str) -> None:
            self.protected_features, self.outcome_feature = protected_features, outcome_feature

    strict = StrictAuditor(["gender", "race"], "prediction_accuracy").evaluate_bias(EXAMPLE)
    assert (strict["gender"]["is_biased"], strict["gender"]["threshold"]) == (True, 0.05)
    lenient = LenientAuditor(["race"], "prediction_accuracy").evaluate_bias(EXAMPLE)
    assert (lenient["race"]["is_biased"], lenient["race"]["threshold"]) == (False, 0.2)


def test_continuous_outcome_gets_a_student_t_interval() -> None:
    report = BiasAuditor(["gender"], "prediction_accuracy").evaluate_bias(EXAMPLE)["gender"]
    male = np.array([0.9, 0.8, 0.92])
    half = stats.t.ppf(0.975, 2) * male.std(ddof=1) / np.sqrt(3)  # 4.302653 * 0.064291 / 1.732051
    assert report["interval_method"] == "t"
    assert report["group_intervals"]["male"] == pytest.approx([male.mean() - half, male.mean() + half], abs=1e-12)
    assert report["group_intervals"]["male"] == pytest.approx([0.713625, 1.033042], abs=1e-6)


def test_binary_outcome_gets_the_cores_wilson_interval() -> None:
    frame = pd.DataFrame({"gender": ["m"] * 10 + ["f"] * 4, "hired": [1] * 7 + [0] * 3 + [1, 0, 0, 0]})
    report = BiasAuditor(["gender"], "hired").evaluate_bias(frame)["gender"]
    lo, hi = wilson_interval(np.array([7, 1]), np.array([10, 4]))
    assert report["interval_method"] == "wilson"
    assert report["group_stats"] == {"m": 0.7, "f": 0.25}
    assert report["group_intervals"] == {"m": pytest.approx([lo[0], hi[0]]), "f": pytest.approx([lo[1], hi[1]])}
    assert report["group_intervals"]["m"] == pytest.approx([0.396778, 0.892209], abs=1e-6)
    assert report["fairness_gap"] == pytest.approx(0.45) and report["is_biased"]


def test_a_list_of_features_is_one_intersectional_feature() -> None:
    report = BiasAuditor([["gender", "race"]], "prediction_accuracy").evaluate_bias(EXAMPLE)
    cross = report["gender_x_race"]
    assert cross["columns"] == ["gender", "race"]
    assert cross["group_stats"] == pytest.approx({"male:white": 0.9, "female:black": 0.7, "male:black": 0.8,
                                                  "female:white": 0.85, "male:asian": 0.92, "female:asian": 0.9})
    assert cross["fairness_gap"] == pytest.approx(0.22)
    assert cross["group_intervals"]["male:white"] == [None, None]  # one row: no interval, never a made-up one


def test_rows_with_a_missing_group_or_outcome_are_excluded_and_counted() -> None:
    frame = EXAMPLE.assign(prediction_accuracy=[0.9, np.nan, 0.8, 0.85, 0.92, 0.9], race=[None, *EXAMPLE.race[1:]])
    report = BiasAuditor(["gender", "race"], "prediction_accuracy").evaluate_bias(frame)
    assert report["gender"]["excluded_rows"] == 1 and report["gender"]["group_sizes"] == {"male": 3, "female": 2}
    assert report["race"]["excluded_rows"] == 2 and report["race"]["group_sizes"] == {"black": 1, "white": 1,
                                                                                         "asian": 2}


@pytest.mark.parametrize(("outcome", "message"), [
    ("accuracy", "no outcome column 'accuracy'"),
    ("race", "outcome column 'race' must be numeric; found ['white', 'black', 'asian']"),
])  # fmt: skip
def test_missing_or_non_numeric_outcome_is_a_clear_error(outcome: str, message: str) -> None:
    with pytest.raises(DataError, match=r"^data.csv: " + message.replace("[", r"\[").replace("]", r"\]")):
        BiasAuditor(["gender"], outcome).evaluate_bias(EXAMPLE, source="data.csv")


def test_missing_feature_column_is_a_clear_error() -> None:
    with pytest.raises(DataError, match=r"no protected feature column\(s\) \['age'\]"):
        BiasAuditor(["gender", ["race", "age"]], "prediction_accuracy").evaluate_bias(EXAMPLE)


def test_t_interval_covers_the_true_mean_95_percent_of_the_time() -> None:
    # 20 000 seeded samples of 6 rows from N(0.8, 0.1): coverage within 3 binomial standard errors of 95%
    rng = np.random.default_rng(12)
    samples = rng.normal(0.8, 0.1, size=(20_000, 6))
    lower, upper = t_interval(samples.mean(axis=1), samples.std(axis=1, ddof=1), np.full(20_000, 6))
    coverage = ((lower <= 0.8) & (upper >= 0.8)).mean()
    assert abs(coverage - 0.95) < 3 * np.sqrt(0.95 * 0.05 / 20_000)


@pytest.mark.parametrize("threshold", [float("nan"), None, "0.1"])
def test_a_threshold_that_is_no_number_is_refused_not_read_as_never_biased(threshold: object) -> None:
    """``gap > nan`` is False for every gap: a NaN threshold (or None, or text) read every feature as not biased, on
    data whose gap is 0.16 (the seed's six rows)."""
    auditor = BiasAuditor(["race"], "prediction_accuracy", bias_threshold=threshold)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"^bias_threshold .* is not a number: no gap is above it"):
        auditor.evaluate_bias(EXAMPLE)
    assert BiasAuditor(["race"], "prediction_accuracy", bias_threshold=float("inf")).evaluate_bias(
        EXAMPLE)["race"]["is_biased"] is False  # a number: inf is the caller's explicit "never"
