"""The seed's semantics at the edges, the seed's own code (tests/seed_reference.py, tests/data/seed/) as the oracle.

Each test failed (at 6e460bd) because of the defect its docstring names: a PASS, or an answer, the seed's own code
never gives on the same input.
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
import seed_reference
import yaml
from fairlearn.metrics import MetricFrame, selection_rate

from exporter import (
    BiasAuditor,
    SafetyEvaluator,
    demographic_parity_difference,
    disparate_impact_ratio,
    run_audit,  # fmt: skip
)
from exporter.config import ConfigError
from exporter.gate.safety.config import run_safety
from exporter.gate.safety.evaluator import ModelCallError

# ------------------------------------------------------------------------------------------ the seed's metric API

GROUPS = np.array(["a"] * 4 + ["b"] * 4)


@pytest.mark.parametrize(("name", "y_pred"), [
    ("scores", [0.9, 0.9, 0.9, 0.9, 0.0, 0.0, 0.0, 0.0]),     # a model's scores handed to the seed's function
    ("minus_one", [-1, 1, 0, 0, 1, 0, 0, 0]),                # a -1/1 label encoding
    ("nan", [np.nan, 1, 0, 0, 1, 0, 0, 0]),                  # a missing prediction
])  # fmt: skip
def test_seed_api_never_passes_predictions_it_truncated(name: str, y_pred: list[float]) -> None:
    """The seed's demographic_parity_difference averages y_pred; ours casts it to int64 first
    (exporter/core/fairness.py:counts_from_arrays, ``np.asarray(y_pred, dtype=np.int64)``), so 0.9 becomes 0, -1
    stays a non-1 (a negative), NaN becomes INT64_MIN (a negative). Observed: scores 0.9 vs 0 -> seed 0.9 FAIL, ours
    0.0 PASS; -1/1 labels -> seed 0.25 FAIL, ours 0.0 PASS; a NaN prediction -> seed NaN FAIL, ours 0.0 PASS.
    Either refuse values that are no 0/1 (the gate does: a DataError naming the rows) or compute the seed's mean;
    never a PASS the seed's own code fails."""
    y = np.array(y_pred, dtype=float)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        theirs = seed_reference.demographic_parity_difference(y, GROUPS, "a", "b")
    assert not theirs.passed
    try:
        ours = demographic_parity_difference(y, GROUPS, "a", "b")
    except ValueError:
        return  # refused: fine
    assert not ours.passed, f"seed: {theirs.value} FAIL; ours: {ours.value} PASS on y_pred {y_pred}"


def test_seed_api_disparate_impact_of_minus_one_labels_is_not_a_pass() -> None:
    """Same cause, the ratio: -1/1 predictions with rates 1/4 (a) and 1/4 (b) -> ours 1.0 PASS (the -1 read as a
    negative); the seed gives 0.0 (mean -1+1 = 0 in a) and FAIL."""
    y = np.array([-1, 1, 0, 0, 1, 0, 0, 0])
    theirs = seed_reference.disparate_impact_ratio(y, GROUPS, "a", "b")
    assert (theirs.value, theirs.passed) == (0.0, False)
    try:
        ours = disparate_impact_ratio(y, GROUPS, "a", "b")
    except ValueError:
        return
    assert not ours.passed, f"seed 0.0 FAIL, ours {ours.value} PASS"


def test_seed_api_comparing_a_group_with_itself_says_so() -> None:
    """A pair naming one group twice is refused (fine: it compares nothing; the seed passes it at 0.0), but the
    message says the group has no rows when it has 4 (exporter/gate/fairness/seed_api.py:_pair: ``encode`` gives
    each value the first matching group, so the second copy counts none). The message should name the problem."""
    y = np.array([1, 0, 0, 0, 1, 1, 0, 0])
    with pytest.raises(ValueError) as info:
        demographic_parity_difference(y, GROUPS, "a", "a")
    assert "no rows" not in str(info.value), str(info.value)


# --------------------------------------------------------------------------------------------- the bias auditor


def test_bias_auditor_does_not_merge_a_number_and_its_text_into_one_group() -> None:
    """An object column holding 1 and "1": the seed's groupby keeps two groups {1: 1.0, '1': 0.0}, gap 1.0, biased;
    ours joins the cells as text (exporter/gate/fairness/bias.py:_Groups.add, ``astype(str)``) and reports ONE group
    {'1': 0.5}, gap 0.0, not biased: a biased feature reported as unbiased. Refuse the collision as intersections'
    are refused (a ValueError naming both values), or keep the groups apart as the seed does."""
    df = pd.DataFrame({"g": pd.Series([1, 1, "1", "1"], dtype=object), "y": [1.0, 1.0, 0.0, 0.0]})
    theirs = seed_reference.BiasAuditor(["g"], "y").evaluate_bias(df)["g"]
    assert (float(theirs["fairness_gap"]), bool(theirs["is_biased"])) == (1.0, True)
    try:
        ours = BiasAuditor(["g"], "y").evaluate_bias(df)["g"]
    except ValueError:
        return
    assert (ours["fairness_gap"], ours["is_biased"]) == (1.0, True), ours["group_stats"]


def test_bias_auditor_keys_datetime_groups_by_their_values() -> None:
    """docs/ml/bias-auditor.md: "A one-column feature's groups are keyed by the column's own values, as the seed's
    groupby keys them". For a datetime column the seed's keys are Timestamps; ours are the text '2020-01-01'
    (bias.py:evaluate_bias maps ``str(v)`` = '2020-01-01 00:00:00', but the groups were named by ``astype(str)``
    = '2020-01-01', so no key is mapped back), and ``report['g'][Timestamp(...)]`` raises KeyError."""
    df = pd.DataFrame({"g": pd.to_datetime(["2020-01-01", "2020-01-01", "2021-01-01", "2021-01-01"]),
                       "y": [1.0, 0.0, 1.0, 1.0]})  # fmt: skip
    theirs = seed_reference.BiasAuditor(["g"], "y").evaluate_bias(df)["g"]["group_stats"]
    ours = BiasAuditor(["g"], "y").evaluate_bias(df)["g"]["group_stats"]
    assert ours == theirs, (ours, theirs)


@pytest.mark.parametrize("values", [[True, True, 1, 1], [1, 1, 1.0, 1.0], [0.0, 0.0, -0.0, -0.0]],
                         ids=["true_and_1", "1_and_1.0", "0.0_and_-0.0"])  # fmt: skip
def test_bias_auditor_keeps_one_group_of_equal_values_as_the_seeds_groupby_does(values: list[Any]) -> None:
    """Equal values of other types (True and 1, 1 and 1.0, 0.0 and -0.0) are one group to the seed's groupby; keyed
    by their text they were two ('True' and '1'), each half the group's rows."""
    df = pd.DataFrame({"g": pd.Series([*values, 2, 2], dtype=object), "y": [1.0, 0.0, 1.0, 1.0, 0.0, 0.0]})
    theirs = seed_reference.BiasAuditor(["g"], "y").evaluate_bias(df)["g"]
    ours = BiasAuditor(["g"], "y").evaluate_bias(df)["g"]
    assert (ours["group_stats"], ours["fairness_gap"]) == (theirs["group_stats"], theirs["fairness_gap"]) == (
        {values[0]: 0.75, 2: 0.0}, 0.75)
    assert ours["group_sizes"] == {values[0]: 4, 2: 2}


def test_a_report_written_as_text_refuses_two_values_written_alike() -> None:
    """Where groups are named by their text (the command line's JSON, evaluate_batches and evaluate_dataset; an
    intersection's groups always), 1 and "1" would be one group: refused, naming both, never merged."""
    df = pd.DataFrame({"g": pd.Series([1, 1, "1", "1"], dtype=object), "h": ["u"] * 4, "y": [1.0, 1.0, 0.0, 0.0]})
    with pytest.raises(ValueError, match=r"^x.csv: protected feature \['g'\]: the values 1 and '1' are both named '1'"):
        BiasAuditor(["g"], "y").evaluate_batches([df], list(df.columns), "x.csv")
    with pytest.raises(ValueError, match=r"the values \[1, 'u'\] and \['1', 'u'\] are both named '1:u'"):
        BiasAuditor([["g", "h"]], "y").evaluate_bias(df)


def test_a_datetime_group_is_one_group_in_every_batch(tmp_path: Path) -> None:
    """Across a folder's files the same Timestamp was written '2020-01-01' in a batch of midnights and
    '2020-01-01 00:00:00' in another, and counted as two groups (5 groups for 3 timestamps); keyed by value it is
    one group, named as pandas writes it where it was first seen."""
    (tmp_path / "parts").mkdir()
    pd.DataFrame({"d": pd.to_datetime(["2020-01-01", "2020-01-01", "2021-01-01"]), "y": [1.0, 0.0, 1.0]}).to_parquet(
        tmp_path / "parts" / "a.parquet")
    pd.DataFrame({"d": pd.to_datetime(["2020-01-01 00:00", "2021-01-01 10:00", "2021-01-01 00:00"]),
                  "y": [1.0, 0.0, 0.0]}).to_parquet(tmp_path / "parts" / "b.parquet")  # fmt: skip
    report = BiasAuditor(["d"], "y").evaluate_dataset(str(tmp_path / "parts"))["d"]
    assert report["group_sizes"] == {"2020-01-01": 3, "2021-01-01": 2, "2021-01-01 10:00:00": 1}


# ------------------------------------------------------------------------------------------------ safety suite

X = np.random.default_rng(0).normal(size=(50, 4))


class NoOutputs:
    """A model that answers every row with no output at all (shape (rows, 0)), e.g. an ONNX graph whose output
    was cut: it evaluates to nothing."""

    def predict(self, x: Any) -> np.ndarray:
        x = np.asarray(x)
        return np.zeros((x.shape[0], 0)) if x.ndim == 2 else np.zeros(0)


def test_a_model_with_no_outputs_does_not_pass_the_bound_check() -> None:
    """Ours: output_boundary_check PASS "0/50 outputs outside range (0.0, 1.0)" with outputs_per_row 0 and verdict
    PASS; the seed's own code raises on it (ValueError: truth value of an empty array), never passing. A check that
    evaluated nothing never passes (docs/ml/safety-redteam.md). Cause: evaluator.py:predicted accepts an output
    array of 0 columns; test_output_boundaries counts no row out of range. Also the stability test reports "the
    model raised on perturbed inputs" when the model raised nothing (numpy's max over 0 columns raised).
    Fix: a ModelCallError (exit 2) when the model gives no output per row."""
    from test_safety import seed_code  # the seed's safety_evaluations.py, verbatim

    with pytest.raises(ValueError, match="empty array"):
        seed_code.SafetyEvaluator("m").test_output_boundaries(NoOutputs(), list(X), (0.0, 1.0))
    try:
        ev = SafetyEvaluator("m")
        ev.test_output_boundaries(NoOutputs(), X, (0.0, 1.0))
    except (ModelCallError, ValueError):
        return
    result = ev.report.results[0]
    assert not result.passed, (result.details, result.evidence)


def test_the_safety_command_does_not_pass_a_model_with_no_outputs(tmp_path: Path) -> None:
    """The same through run_safety (the command): verdict PASS, so exit 0, for a model that outputs nothing."""
    pd.DataFrame(X, columns=["a", "b", "c", "d"]).to_csv(tmp_path / "x.csv", index=False)
    (tmp_path / "s.yaml").write_text("model_id: m\nfeature_count: 4\nvalid_output_range: [0.0, 1.0]\n"
                                     "test_inputs: x.csv\n")  # fmt: skip
    try:
        report = run_safety(tmp_path / "s.yaml", NoOutputs())
    except (ModelCallError, ValueError):
        return
    assert report["verdict"] == "FAIL", [(r["test_name"], r["passed"], r["details"]["summary"])
                                         for r in report["results"]]  # fmt: skip


def test_the_safety_command_exits_2_in_one_line_for_a_model_with_no_outputs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The command: a model that answers the test inputs with nothing cannot be evaluated, exit 2 (as a model that
    raises on them), one line saying what it answered, and no report."""
    from test_safety import run_cli

    pd.DataFrame(X, columns=["a", "b", "c", "d"]).to_csv(tmp_path / "x.csv", index=False)
    (tmp_path / "s.yaml").write_text("model_id: m\nfeature_count: 4\nvalid_output_range: [0.0, 1.0]\n"
                                     "test_inputs: x.csv\n")  # fmt: skip
    code, report, err = run_cli(tmp_path, capsys, "--model", "test_seed_semantics_edges:NoOutputs", "--config",
                                str(tmp_path / "s.yaml"))  # fmt: skip
    assert (code, report, err.count("\n")) == (2, {}, 1), err
    assert "the model gave no output on the test inputs (50 rows of 4 features answered with outputs of shape " \
        "(50, 0))" in err  # fmt: skip


class NoOutputsWhenMoved:
    """Answers the test inputs with one output per row, and moved inputs with none."""

    def __init__(self) -> None:
        self.calls = 0

    def predict(self, x: Any) -> np.ndarray:
        self.calls += 1
        return np.full((len(x), 1 if self.calls == 1 else 0), 0.5)


def test_the_stability_test_names_an_answer_that_changed_shape_and_blames_no_raise() -> None:
    """numpy's max over 0 columns raised, and the test said "the model raised on perturbed inputs: ValueError: zero-size
    array ..." of a model that raised nothing: the finding is the answer's shape."""
    result = SafetyEvaluator("m").test_input_perturbation_stability(NoOutputsWhenMoved(), X)
    assert not result.passed
    assert result.details == "the model gave outputs of shape (50, 0) on the perturbed inputs, (50, 1) on the inputs"


def test_an_empty_answer_to_a_malformed_or_an_edge_row_is_judged_by_that_rows_test() -> None:
    """Only the test inputs must be answered: an empty answer to a malformed row is an answer (the check fails, as
    before), and to the seed's edge rows the seed's own verdict (its NaN/Inf check finds nothing in no output)."""
    from test_safety import seed_code

    malformed = SafetyEvaluator("m").test_malformed_inputs(NoOutputs(), 4)
    assert not malformed.passed and malformed.evidence["failed_inputs"] == ["empty_row", "wrong_width_row"]
    theirs = seed_code.SafetyEvaluator("m")
    theirs.test_null_and_edge_inputs(NoOutputs(), 4)
    ours = SafetyEvaluator("m").test_null_and_edge_inputs(NoOutputs(), 4)
    assert ours.passed == theirs.report.results[0].passed


class UsesFeatureZero:
    def predict(self, x: Any) -> np.ndarray:
        return (np.asarray(x)[:, 0] > 0.5).astype(int)


def test_counterfactual_swapping_a_value_with_itself_never_passes() -> None:
    """values [1, 1] swaps nothing: every decision equals itself, so the check passes (0/25 changed) for a model
    whose decision IS the protected attribute (values [0, 1]: 50/50 changed). A check that evaluated nothing never
    passes. Cause: evaluator.py:test_counterfactual_consistency (and config.py:_counterfactual) accept a == b.
    Fix: refuse two equal values (ValueError; a ConfigError naming counterfactual.values, exit 2)."""
    x = X.copy()
    x[:, 0] = np.where(x[:, 0] > 0, 1.0, 0.0)
    ev = SafetyEvaluator("m")
    assert not ev.test_counterfactual_consistency(UsesFeatureZero(), x, 0, [0.0, 1.0]).passed
    try:
        result = ev.test_counterfactual_consistency(UsesFeatureZero(), x, 0, [1.0, 1.0])
    except ValueError:
        return
    assert not result.passed, result.details


def test_the_safety_config_refuses_a_counterfactual_of_one_value(tmp_path: Path) -> None:
    x = X.copy()
    x[:, 0] = np.where(x[:, 0] > 0, 1.0, 0.0)
    pd.DataFrame(x, columns=["gender", "b", "c", "d"]).to_csv(tmp_path / "x.csv", index=False)
    (tmp_path / "s.yaml").write_text("model_id: m\nfeature_count: 4\nvalid_output_range: [0.0, 1.0]\n"
                                     "test_inputs: x.csv\ncounterfactual: {feature: gender, values: [1, 1]}\n")
    with pytest.raises(ConfigError, match=r"counterfactual\.values"):
        run_safety(tmp_path / "s.yaml", UsesFeatureZero())


def test_the_safety_command_refuses_a_counterfactual_of_one_value_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from test_safety import run_cli

    x = X.copy()
    x[:, 0] = np.where(x[:, 0] > 0, 1.0, 0.0)
    pd.DataFrame(x, columns=["gender", "b", "c", "d"]).to_csv(tmp_path / "x.csv", index=False)
    (tmp_path / "s.yaml").write_text("model_id: m\nfeature_count: 4\nvalid_output_range: [0.0, 1.0]\n"
                                     "test_inputs: x.csv\ncounterfactual: {feature: gender, values: [1, 1]}\n")
    code, report, err = run_cli(tmp_path, capsys, "--model", "test_seed_semantics_edges:UsesFeatureZero",
                                "--config", str(tmp_path / "s.yaml"))  # fmt: skip
    assert (code, report, err.count("\n")) == (2, {}, 1), err
    assert "counterfactual.values: [1, 1] names one value twice" in err


# ------------------------------------------------------------------------------------------------ LL144 tables


def test_ll144_impact_ratio_of_a_small_category_is_never_above_one(tmp_path: Path) -> None:
    """NYC LL144 (DCWP rules, 6 RCNY 5-300/5-301): impact ratio = a category's selection rate / the selection rate
    of the most selected category, so at most 1; a category under 2% of the data MAY be excluded from the impact
    ratio calculations (its count and rate still published). Ours (exporter/gate/fairness/ll144.py:attribute_table)
    excludes a small category from being the reference but still divides its rate by the reference's: race N
    (15 of 1000 rows, 1.5%) selected at 0.6 against W's 0.4 gets impact_ratio 1.5, which is no impact ratio under
    the law (and fairlearn's selection_rate / max over the categories kept gives no value for N). Fix: a small
    category's impact_ratio null (excluded, as the rules allow) or, if it is kept, it is a candidate reference."""
    rows = []
    for race, n, selected in (("W", 500, 200), ("B", 485, 145), ("N", 15, 9)):
        rows += [{"race": race, "prediction": int(i < selected), "label": 0} for i in range(n)]
    df = pd.DataFrame(rows)
    config = {"model_id": "m", "protected_attributes": [{"name": "race", "groups": ["W", "B", "N"]}],
              "metrics": [{"name": "disparate_impact_ratio", "threshold": 0.8, "severity_on_fail": "blocking"}]}
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(config))
    table = run_audit(tmp_path / "c.yaml", df)["impact_ratios"]["attributes"]["race"]
    rates = MetricFrame(metrics=selection_rate, y_true=df.prediction, y_pred=df.prediction,
                        sensitive_features=df.race).by_group  # fmt: skip
    by = {c["category"]: c for c in table["categories"]}
    assert by["N"]["small_category"] and by["N"]["rate"] == pytest.approx(rates["N"]) == 0.6
    assert table["reference_category"] == "W" and by["B"]["impact_ratio"] == pytest.approx(rates["B"] / rates["W"])
    assert all(c["impact_ratio"] is None or c["impact_ratio"] <= 1 for c in table["categories"]), \
        {c["category"]: c["impact_ratio"] for c in table["categories"]}  # fmt: skip
