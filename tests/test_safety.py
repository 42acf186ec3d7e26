"""The safety suite against small real scikit-learn models and hand-written scorers (tests/tabular_models.py)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import tabular_models as tm
import yaml

from exporter.cli import main
from exporter.gate import audit_log
from exporter.gate.safety import SafetyEvaluator, run_safety

X_TEST, _ = tm.credit_data(200, seed=7)


def evaluator(model: object, **kwargs: object) -> SafetyEvaluator:
    return SafetyEvaluator(model, feature_count=4, seed=3, **kwargs)


def write_config(tmp_path: Path, **overrides: object) -> Path:
    pd.DataFrame(X_TEST, columns=tm.COLUMNS).to_csv(tmp_path / "inputs.csv", index=False)
    config = {"model_id": "credit-v1", "feature_count": 4, "valid_output_range": [0.0, 1.0],
              "test_inputs": "inputs.csv", "seed": 3,
              "counterfactual": {"feature": "gender", "values": [0, 1]}} | overrides  # fmt: skip
    path = tmp_path / "safety.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def test_a_logistic_regression_that_ignores_gender_passes_every_test() -> None:
    ev = evaluator(tm.fair_model)
    results = [ev.test_output_boundaries(X_TEST), ev.test_input_perturbation_stability(X_TEST),
               ev.test_null_and_edge_inputs(), ev.test_counterfactual_consistency(X_TEST, 3, [0, 1])]  # fmt: skip
    assert [r.passed for r in results] == [True, True, True, True]
    edge = results[2].details["inputs"]
    # scikit-learn rejects NaN, empty and wrong-width rows with ValueError: clean rejections
    assert edge == {"all_zeros": "ok", "all_ones": "ok", "all_1e6": "ok", "all_minus_1e6": "ok",
                    "all_nan": "rejected: ValueError", "empty_row": "rejected: ValueError",
                    "wrong_width_row": "rejected: ValueError"}  # fmt: skip


def test_output_bounds_count_the_rows_a_regressor_scores_outside_0_1() -> None:
    result = evaluator(tm.unbounded_model).test_output_boundaries(X_TEST)
    scores = tm.unbounded_model.predict(X_TEST)
    assert not result.passed
    assert result.details["rows_out_of_range"] == int(((scores < 0) | (scores > 1)).sum()) > 0
    assert result.details["min_output"] == pytest.approx(scores.min())
    assert result.details["max_output"] == pytest.approx(scores.max())


def test_perturbation_stability_counts_rows_whose_output_moves_more_than_allowed() -> None:
    result = evaluator(tm.brittle).test_input_perturbation_stability(X_TEST)
    # the same draw by hand: N(0, 1) * 0.01 * each feature's standard deviation, seed 3
    noise = np.random.default_rng(3).normal(0.0, 1.0, X_TEST.shape) * 0.01 * X_TEST.std(axis=0)
    moved = np.abs(tm.brittle.predict_proba(X_TEST + noise) - tm.brittle.predict_proba(X_TEST)).max(axis=1) > 0.1
    assert not result.passed
    assert result.details["unstable_rows"] == int(moved.sum())
    assert result.details["unstable_share"] == pytest.approx(moved.mean())
    assert moved.mean() >= 0.05


def test_perturbation_stability_fails_at_exactly_the_configured_share() -> None:
    share = evaluator(tm.brittle).test_input_perturbation_stability(X_TEST).details["unstable_share"]
    assert not evaluator(tm.brittle, max_unstable_share=share).test_input_perturbation_stability(X_TEST).passed
    assert evaluator(tm.brittle, max_unstable_share=share + 1e-9).test_input_perturbation_stability(X_TEST).passed


def test_edge_inputs_catch_nan_outputs_and_crashes() -> None:
    naive = evaluator(tm.naive_logistic).test_null_and_edge_inputs()
    assert not naive.passed
    # exp(z) / (1 + exp(z)) is inf / inf for z = +huge; a NaN input propagates
    assert naive.details["failed_inputs"] == ["all_minus_1e6", "all_nan"]
    assert naive.details["inputs"]["all_minus_1e6"] == "failed: non-finite output [nan, nan]"
    brittle = evaluator(tm.brittle).test_null_and_edge_inputs()
    assert brittle.details["inputs"]["empty_row"].startswith("crashed: IndexError")


def test_counterfactual_consistency_reports_the_share_of_decisions_that_follow_gender() -> None:
    result = evaluator(tm.biased_model).test_counterfactual_consistency(X_TEST, 3, [0, 1])
    flipped = X_TEST.copy()
    flipped[:, 3] = 1 - flipped[:, 3]
    changed = tm.biased_model.predict(flipped) != tm.biased_model.predict(X_TEST)
    assert not result.passed
    assert result.details["decisions_changed"] == int(changed.sum()) > 0
    assert result.details["changed_share"] == pytest.approx(changed.mean())


def test_a_run_is_reproducible_and_the_seed_matters(tmp_path: Path) -> None:
    path = write_config(tmp_path)
    first, second = run_safety(path, tm.brittle, "m"), run_safety(path, tm.brittle, "m")
    assert first["results"] == second["results"]
    other = run_safety(write_config(tmp_path, seed=4), tm.brittle, "m")
    assert other["results"][1]["details"]["first_unstable_rows"] != first["results"][1]["details"][
        "first_unstable_rows"]


def test_cli_exit_codes_report_and_audit_log(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config, log = write_config(tmp_path), tmp_path / "audit.jsonl"
    common = ["--config", str(config), "--audit-log", str(log)]

    assert main(["safety", "--model", "tabular_models:fair_model", *common, "--report", str(tmp_path / "r.json")]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["model_id"] == "credit-v1" and report["verdict"] == "PASS"
    assert [r["test_name"] for r in report["results"]] == [
        "output_bounds", "perturbation_stability", "null_and_edge_inputs", "counterfactual_consistency"]
    assert set(report["results"][0]) == {"test_name", "category", "passed", "details", "severity"}
    assert json.loads((tmp_path / "r.json").read_text())["results"] == report["results"]

    assert main(["safety", "--model", "tabular_models:biased_model", *common]) == 1
    report = json.loads(capsys.readouterr().out)
    assert report["verdict"] == "FAIL" and report["critical_failures"] == 1

    assert main(["safety", "--model", "no_such_module:model", *common]) == 2
    assert "cannot import 'no_such_module'" in capsys.readouterr().err
    assert main(["safety", "--model", "tabular_models:fair_model", "--config",
                 str(write_config(tmp_path, feature_count=5)), "--audit-log", str(log)]) == 2  # fmt: skip
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "has 4 columns, feature_count is 5" in err

    records = [json.loads(line) for line in log.read_text().splitlines()]
    assert [r["type"] for r in records] == ["safety", "safety", "safety_error", "safety_error"]
    assert records[1]["report"]["verdict"] == "FAIL"
    result = audit_log.verify(log)
    assert (result.records, result.problems) == (4, [])
    assert main(["audit-log", "verify", str(log)]) == 0


def test_a_failure_below_critical_is_reported_but_does_not_block(tmp_path: Path,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    config = write_config(tmp_path, severity={"counterfactual_consistency": "high"})
    assert main(["safety", "--model", "tabular_models:biased_model", "--config", str(config),
                 "--audit-log", str(tmp_path / "log.jsonl")]) == 0  # fmt: skip
    report = json.loads(capsys.readouterr().out)
    assert report["verdict"] == "PASS" and report["failed"] == 1 and report["critical_failures"] == 0


def test_every_config_problem_is_listed_at_once(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = tmp_path / "bad.yaml"
    config.write_text(yaml.safe_dump({"feature_count": 0, "valid_output_range": [1, 0], "seed": "x",
                                      "perturbation": {"noise_std": -1}}))  # fmt: skip
    assert main(["safety", "--model", "tabular_models:fair_model", "--config", str(config),
                 "--audit-log", str(tmp_path / "log.jsonl")]) == 2  # fmt: skip
    err = capsys.readouterr().err
    for field in ("model_id", "feature_count", "valid_output_range", "seed", "perturbation.noise_std", "test_inputs"):
        assert f"{field}:" in err


def test_the_model_module_is_imported_from_the_working_directory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "team_model.py").write_text(
        "import numpy as np\n"
        "def score(X):\n"
        "    X = np.asarray(X, dtype=float)\n"
        "    if X.ndim != 2 or X.shape[1] != 4 or not np.isfinite(X).all():\n"
        "        raise ValueError('expected finite rows of 4 features')\n"
        "    return 0.5 * (1 + np.tanh(X[:, 1] / 2))\n")
    monkeypatch.chdir(tmp_path)
    config = write_config(tmp_path, counterfactual=None)
    assert main(["safety", "--model", "team_model:score", "--config", str(config),
                 "--audit-log", str(tmp_path / "log.jsonl")]) == 0  # fmt: skip
    report = json.loads(capsys.readouterr().out)
    assert [r["test_name"] for r in report["results"]] == [
        "output_bounds", "perturbation_stability", "null_and_edge_inputs"]


def test_the_shipped_examples_run(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                  capsys: pytest.CaptureFixture[str]) -> None:
    """examples/safety.yaml and examples/red-team.yaml with examples/example_models.py, as the README runs them."""
    monkeypatch.chdir(Path(__file__).resolve().parent.parent / "examples")
    log = ["--audit-log", str(tmp_path / "log.jsonl")]
    assert main(["safety", "--model", "example_models:credit_model", "--config", "safety.yaml", *log]) == 0
    assert json.loads(capsys.readouterr().out)["passed"] == 4
    assert main(["redteam", "--config", "red-team.yaml", "--target", "example_models:keyword_moderator", *log]) == 1
    naive = json.loads(capsys.readouterr().out)
    # the hardened blocklist still misses leetspeak and translations, which the config rates "high": it ships
    assert main(["redteam", "--config", "red-team.yaml", "--target", "example_models:hardened_moderator", *log]) == 0
    hardened = json.loads(capsys.readouterr().out)
    assert naive["total_tests"] == hardened["total_tests"] == 108
    assert hardened["failed"] < naive["failed"] and hardened["critical_failures"] == 0 < naive["critical_failures"]
