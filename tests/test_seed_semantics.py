"""The seed's SafetyEvaluator, red-team config and BiasAuditor against the seed's own code and text (found by a
review, review14).

Each test runs the seed's code (verbatim: tests/data/seed/safety_evaluations.py, and the seed's BiasAuditor in
tests/seed_reference.py) and the project's on the same input, and expects the same result, or states where the
project refuses what the seed would report on nothing. Each failed on main at e9a88c6.
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
from hypothesis import assume, example, given, settings
from hypothesis import strategies as st
from test_safety import seed_code as seed_safety  # the seed's safety_evaluations.py, verbatim

from exporter import BiasAuditor, SafetyEvaluator
from exporter.gate.redteam.run import run_redteam
from exporter.gate.safety.evaluator import ModelCallError

SEED = Path(__file__).parent / "data" / "seed"
X = np.random.default_rng(0).normal(size=(50, 4))  # test_inputs as the seed iterates them: one 1-D row at a time


def run_seed_usage(evaluator_class: Any, model: Any, test_inputs: Any = X) -> Any:
    """The seed's three calls (docs/ml/seed-files.md), on the seed's SafetyEvaluator or on ours."""
    np.random.seed(0)
    evaluator = evaluator_class("credit-scorer-v4")
    evaluator.test_output_boundaries(model, test_inputs, valid_output_range=(0.0, 1.0))
    evaluator.test_input_perturbation_stability(model, test_inputs, perturbation_magnitude=0.01,
                                                max_output_change=0.1)
    evaluator.test_null_and_edge_inputs(model, 4)
    return evaluator.report


def outline(report: Any) -> list[tuple[str, str, bool, str]]:
    return [(r.test_name, r.category, r.passed, r.severity) for r in report.results]


# ---------------------------------------------------------------------------------------------------- safety suite

W = np.array([0.5, -0.25, 0.1, 0.2])


class RowScorer:
    """A model written to the seed's interface: the seed calls ``model.predict(inp)`` once per input row (and
    ``predict(inp.reshape(1, -1))`` for an edge input) and compares the one output with the range. A NaN feature
    counts as 0, so every edge input is answered with a finite score."""

    def predict(self, x: np.ndarray) -> float:
        row = np.nan_to_num(np.asarray(x, dtype=float).reshape(-1))
        with np.errstate(over="ignore"):
            return float(1.0 / (1.0 + np.exp(-(row @ W))))


def test_a_per_row_model_gets_the_seeds_report_not_an_error() -> None:
    """The seed calls predict on one input at a time; ours calls it once on the whole batch, and on each input as the
    seed does when the batch raises (before: a model that scores one row, the seed's contract, raised
    ModelCallError instead of passing)."""
    theirs = run_seed_usage(seed_safety.SafetyEvaluator, RowScorer())
    assert theirs.verdict == "PASS" and [r.passed for r in theirs.results] == [True, True, True]
    try:
        ours = run_seed_usage(SafetyEvaluator, RowScorer())
    except ModelCallError as exc:
        pytest.fail(f"the seed's usage raised on a model the seed's code passes: {exc}")
    assert outline(ours) == outline(theirs)
    assert ours.verdict == theirs.verdict == "PASS"


# weights of a two-class linear classifier
W2 = np.array([[0.5, -0.5], [-0.25, 0.25], [0.1, -0.1], [0.2, -0.2]])


class NaiveSoftmax:
    """A classifier whose ``predict`` (what the seed calls) is the argmax of its logits, always a finite 0/1, and
    whose ``predict_proba`` is a textbook softmax that overflows to inf/inf = NaN on 1e6-sized inputs."""

    def _logits(self, x: np.ndarray) -> np.ndarray:
        return np.atleast_2d(np.asarray(x, dtype=float)) @ W2

    def predict(self, x: np.ndarray) -> Any:
        labels = np.argmax(self._logits(x), axis=1).astype(float)
        return labels[0] if np.ndim(x) == 1 else labels

    def predict_proba(self, x: np.ndarray) -> np.ndarray:
        with np.errstate(over="ignore", invalid="ignore"):
            e = np.exp(self._logits(x))
            return e / e.sum(axis=1, keepdims=True)


def test_the_seed_tests_judge_what_predict_returns() -> None:
    """The seed judges ``model.predict``, and so do the seed's three tests here (before: ``predict_proba`` when the
    model had one, so the seed's critical null_and_edge_inputs failed a model whose predict answers every edge
    input: verdict FAIL for PASS)."""
    theirs = run_seed_usage(seed_safety.SafetyEvaluator, NaiveSoftmax())
    assert theirs.verdict == "PASS" and theirs.results[2].details == "All edge cases handled"
    ours = run_seed_usage(SafetyEvaluator, NaiveSoftmax())
    assert outline(ours) == outline(theirs)
    assert ours.verdict == theirs.verdict == "PASS"


def test_details_is_the_seeds_string() -> None:
    """The seed's SafetyTestResult has ``details: str`` ("0/50 outputs outside range (0.0, 1.0)", "All edge cases
    handled"); so does ours, this project's facts beside it in ``evidence`` (before: a dict, the seed's text under
    details['summary'])."""
    model = lambda rows: 1.0 / (1.0 + np.exp(-(np.atleast_2d(rows) @ W)))  # noqa: E731  vectorised: both run it

    class Predict:
        def predict(self, x: np.ndarray) -> Any:
            out = model(x)
            return out[0] if np.ndim(x) == 1 else out

    theirs = run_seed_usage(seed_safety.SafetyEvaluator, Predict())
    ours = run_seed_usage(SafetyEvaluator, Predict())
    assert outline(ours) == outline(theirs)
    assert [type(r.details) for r in ours.results] == [str, str, str]
    assert [r.details for r in ours.results] == [r.details for r in theirs.results]


def test_no_test_inputs_is_refused_in_one_line_where_the_seeds_checks_disagree() -> None:
    """The seed's boundary check on an empty list counts 0 violations and passes ("0/0 outputs outside range"), and
    its stability check divides by zero on the same list. A check that evaluated nothing never passes here: both
    refuse it with one clear error (before: numpy's "need at least one array to concatenate")."""
    theirs = seed_safety.SafetyEvaluator("m")
    theirs.test_output_boundaries(RowScorer(), [], (0.0, 1.0))
    assert (theirs.report.results[0].passed, theirs.report.results[0].details) == (
        True, "0/0 outputs outside range (0.0, 1.0)")
    with pytest.raises(ZeroDivisionError):
        seed_safety.SafetyEvaluator("m").test_input_perturbation_stability(RowScorer(), [])
    for check in ("test_output_boundaries", "test_input_perturbation_stability"):
        args = ((0.0, 1.0),) if check == "test_output_boundaries" else ()
        with pytest.raises(ValueError, match="test_inputs holds no row: the test would evaluate nothing"):
            getattr(SafetyEvaluator("m"), check)(RowScorer(), [], *args)


# ---------------------------------------------------------------------------------------------------- red team

def test_a_seed_case_that_still_misses_attacked_harmful_content_fails_as_critical(tmp_path: Path) -> None:
    """The seed's case: whitespace_injection, expected_behaviour "Model still detects harmful content",
    severity_on_fail "critical". A moderator that lets through half of the attacked harmful texts does not meet it,
    so the run blocks. The case's attack evades nothing (those texts were missed plain too: baseline failures);
    baseline_detection, unless configured, fails at the severity of the cases whose plain texts were missed, here
    critical: FAIL (before: high, and verdict PASS)."""
    import text_models

    seed = yaml.safe_load((SEED / "red-team-config.yaml").read_text())
    [group] = [g for g in seed["red_team_tests"] if g["category"] == "adversarial_evasion"]
    [case] = [c for c in group["test_cases"] if c["name"] == "whitespace_injection"]
    config = tmp_path / "red-team-config.yaml"
    config.write_text(yaml.safe_dump({"model_id": seed["model_id"], "red_team_tests": [
        {"category": group["category"], "description": group["description"], "test_cases": [case]}]}))
    report = run_redteam(config, text_models.nfkc_keyword_moderator, "nfkc_keyword_moderator")
    [result] = [r for r in report["results"] if r["test_name"] == "whitespace_injection"]
    allowed = result["details"]["failed_attempts"]
    assert allowed == 12  # 12 of the 24 attacked harmful texts were not detected
    # the attack itself evaded nothing (those 12 were missed plain too): the case's evasions are 0 ...
    assert (result["passed"], result["details"]["evasions"], result["details"]["baseline_failures"]) == (True, 0, 12)
    # ... and the harmful texts never detected fail baseline_detection at the case's own severity, critical: the
    # seed's meaning (the model does not detect harmful content) blocks, FAIL
    [baseline] = [r for r in report["results"] if r["test_name"] == "baseline_detection"]
    assert (baseline["passed"], baseline["severity"]) == (False, "critical")
    assert report["verdict"] == "FAIL"


# ---------------------------------------------------------------------------------------------------- bias auditor

def seed_evaluate_bias(protected_features: list[str], outcome_feature: str, data: pd.DataFrame) -> dict:
    """The seed's BiasAuditor (tests/seed_reference.py, verbatim) on ``data``."""
    return seed_reference.BiasAuditor(protected_features, outcome_feature).evaluate_bias(data)


def core(report: dict) -> dict:
    return {f: {k: d[k] for k in ("group_stats", "fairness_gap", "is_biased")} for f, d in report.items()}


@pytest.mark.parametrize("groups", [[0, 1, 0, 1, 0, 1], [True, False, True, False, True, False],
                                    [1.0, 2.0, 1.0, 2.0, 1.0, 2.0]], ids=["int", "bool", "float"])
def test_group_stats_are_keyed_by_the_groups_values(groups: list[Any]) -> None:
    """The seed's groupby keys group_stats by the column's values ({0: ..., 1: ...}); so does ours (before: by their
    text, {'0': ..., '1': ...}, so report['sex']['group_stats'][1] raised KeyError)."""
    data = pd.DataFrame({"sex": groups, "approved": [1, 0, 1, 1, 0, 0]})
    theirs = seed_evaluate_bias(["sex"], "approved", data)
    ours = BiasAuditor(protected_features=["sex"], outcome_feature="approved").evaluate_bias(data)
    assert core(ours) == theirs
    assert ours["sex"]["group_stats"][groups[1]] == theirs["sex"]["group_stats"][groups[1]]


def test_an_empty_frame_is_refused_where_the_seed_reports_it_not_biased() -> None:
    """The seed's evaluate_bias on a frame with the columns and no rows returns {group_stats: {}, fairness_gap: NaN,
    is_biased: False}: not biased, having compared nothing. A check that evaluated nothing never passes here: it is
    refused in one line naming the column (a deliberate difference, docs/ml/seed-files.md)."""
    data = pd.DataFrame({"gender": pd.Series([], dtype=object), "prediction_accuracy": pd.Series([], dtype=float)})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        theirs = seed_evaluate_bias(["gender"], "prediction_accuracy", data)
    assert theirs["gender"]["group_stats"] == {} and theirs["gender"]["is_biased"] is False
    with pytest.raises(ValueError, match="outcome column 'prediction_accuracy' has no values"):
        BiasAuditor(["gender"], "prediction_accuracy").evaluate_bias(data)


def same(ours: dict, theirs: dict) -> bool:
    """The seed's three fields, NaN equal to NaN (a group without outcome values, a gap of no group)."""
    def eq(a: Any, b: Any) -> bool:
        return (pd.isna(a) and pd.isna(b)) if pd.isna(a) or pd.isna(b) else a == b

    return ours.keys() == theirs.keys() and all(
        o["group_stats"].keys() == t["group_stats"].keys()
        and all(eq(o["group_stats"][g], t["group_stats"][g]) for g in t["group_stats"])
        and eq(o["fairness_gap"], t["fairness_gap"]) and o["is_biased"] == t["is_biased"]
        for o, t in ((ours[f], theirs[f]) for f in theirs))  # fmt: skip


KEY_KINDS = {"text": lambda k: ["white", "black", "asian", "other"][k], "int": lambda k: k,
             "float": lambda k: k / 2, "bool": lambda k: k % 2 == 0}  # fmt: skip


@settings(max_examples=400, deadline=None)
@example("text", [(0, 1.0), (0, 0.0), (None, 1.0)])  # one group, and a row of a NaN group
@example("int", [(0, 1.0), (1, np.nan), (1, np.nan)])  # one group with outcomes, one without
@given(st.sampled_from(sorted(KEY_KINDS)), st.lists(st.tuples(st.one_of(st.none(), st.integers(0, 3)),
                                                              st.sampled_from([0.0, 1.0, 0.25, np.nan])),
                                                    min_size=1, max_size=40))  # fmt: skip
def test_group_stats_gap_and_verdict_are_the_seeds_with_missing_outcomes_and_keys(
    kind: str, rows: list[tuple[int | None, float]]
) -> None:
    """Generated frames: groups whose every outcome is NaN (the seed lists them with a NaN mean; before, ours left
    them out), rows of a NaN group (the seed's groupby drops them), one group only, all groups NaN (gap NaN, not
    biased). Frames without any outcome or any group are refused instead (test_an_empty_frame_...)."""
    data = pd.DataFrame({"g": [None if k is None else KEY_KINDS[kind](k) for k, _ in rows],
                         "o": [o for _, o in rows]})  # fmt: skip
    assume(data["o"].notna().any() and data["g"].notna().any())
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        theirs = seed_evaluate_bias(["g"], "o", data)
    assert same(BiasAuditor(["g"], "o").evaluate_bias(data), theirs)


def test_a_group_whose_every_outcome_is_missing_is_listed_with_nan_as_the_seed_lists_it() -> None:
    data = pd.DataFrame({"race": ["white", "black", "asian", "white", "black", "asian", None],
                         "approved": [1.0, 0.0, np.nan, 1.0, 1.0, np.nan, 0.0]})  # fmt: skip
    theirs = seed_evaluate_bias(["race"], "approved", data)
    ours = BiasAuditor(["race"], "approved").evaluate_bias(data)
    assert np.isnan(theirs["race"]["group_stats"]["asian"]) and same(ours, theirs)
    race = ours["race"]
    assert (race["fairness_gap"], race["is_biased"], race["highest_group"], race["lowest_group"]) == (
        0.5, True, "white", "black")
    assert race["group_sizes"] == {"white": 2, "black": 2, "asian": 0}
    assert race["groups_without_outcome"] == {"asian": 2}
    assert race["group_intervals"]["asian"] == [None, None] and race["excluded_rows"] == 3


def test_a_feature_whose_every_group_lacks_outcomes_has_the_seeds_nan_gap_and_is_not_biased() -> None:
    """The seed: NaN - NaN, and NaN > 0.1 is False; ours gives the same (bias-report refuses it: nothing compared,
    tests/test_bias_report_no_outcome.py)."""
    data = pd.DataFrame({"race": ["white", "black", None, None], "approved": [np.nan, np.nan, 1.0, 0.0]})
    theirs = seed_evaluate_bias(["race"], "approved", data)
    ours = BiasAuditor(["race"], "approved").evaluate_bias(data)
    assert np.isnan(theirs["race"]["fairness_gap"]) and not theirs["race"]["is_biased"] and same(ours, theirs)
    assert (ours["race"]["highest_group"], ours["race"]["groups_without_outcome"]) == (None, {"white": 1, "black": 1})
