"""The CI bias-audit gate end to end: verdicts, exit codes, bad input, overrides and the tamper-evident log."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml
from compas import compas_frame
from fairlearn.metrics import demographic_parity_difference as fl_dpd
from fairlearn.metrics import demographic_parity_ratio as fl_dpr
from fairlearn.metrics import equalized_odds_difference as fl_eod

import exporter
from exporter.cli import main
from exporter.core.metric_table import COUNT_METRICS

ROOT = Path(__file__).resolve().parent.parent
METRICS = [
    {"name": "demographic_parity_difference", "threshold": 0.05, "severity_on_fail": "blocking"},
    {"name": "equalised_odds_difference", "threshold": 0.05, "severity_on_fail": "blocking"},
    {"name": "disparate_impact_ratio", "threshold": 0.80, "severity_on_fail": "warning"},
]


def write_config(tmp_path: Path, **overrides: object) -> Path:
    config = {
        "model_id": "m1",
        "protected_attributes": [{"name": "gender", "groups": ["male", "female"], "pairwise_comparisons": "all"}],
        "metrics": METRICS,
        "min_samples": 1,
        **overrides,
    }
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def write_rows(tmp_path: Path, rows: dict[str, list], name: str = "preds.csv") -> Path:
    path = tmp_path / name
    frame = pd.DataFrame(rows)
    frame.to_parquet(path) if name.endswith(".parquet") else frame.to_csv(path, index=False)
    return path


def run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, dict | None, str]:
    code = main(list(args))
    out, err = capsys.readouterr()
    return code, (json.loads(out) if out.strip() else None), err


def balanced(n: int = 10) -> dict[str, list]:
    """Two groups with identical outcomes: every metric passes."""
    return {"gender": ["male"] * n + ["female"] * n,
            "prediction": [1, 0] * n, "label": [1, 1, 0, 0] * (n // 2)}  # fmt: skip


def test_fair_model_passes_with_exit_0(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    log = tmp_path / "log.jsonl"
    code, report, _ = run(capsys, "audit", str(write_config(tmp_path)), str(write_rows(tmp_path, balanced())),
                          "--audit-log", str(log))  # fmt: skip
    assert code == 0 and report["verdict"] == "PASS"
    assert (report["total_tests"], report["passed"], report["failed"]) == (3, 3, 0)
    assert {r["metric"]: r["value"] for r in report["results"]} == {
        "demographic_parity_difference": 0.0, "equalised_odds_difference": 0.0, "disparate_impact_ratio": 1.0}
    assert report["attributes"]["gender"]["groups"]["male"]["samples"] == 10


def test_hand_made_unfair_model_fails_with_exit_1_and_exact_values(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # male: 6/10 selected, TPR 4/5, FPR 2/5; female: 3/10 selected, TPR 2/5, FPR 1/5
    rows = {
        "gender": ["male"] * 10 + ["female"] * 10,
        "label": [1] * 5 + [0] * 5 + [1] * 5 + [0] * 5,
        "prediction": [1, 1, 1, 1, 0, 1, 1, 0, 0, 0, 1, 1, 0, 0, 0, 1, 0, 0, 0, 0],
    }
    code, report, err = run(capsys, "audit", str(write_config(tmp_path)), str(write_rows(tmp_path, rows)),
                            "--audit-log", str(tmp_path / "log.jsonl"))  # fmt: skip
    values = {r["metric"]: r for r in report["results"]}
    assert values["demographic_parity_difference"]["value"] == 0.3
    assert values["equalised_odds_difference"]["value"] == 0.4  # max(|0.8 - 0.4|, |0.4 - 0.2|)
    assert values["disparate_impact_ratio"]["value"] == 0.5
    assert values["disparate_impact_ratio"]["severity"] == "warning"
    assert (code, report["verdict"], report["blocking_failures"], report["warning_failures"]) == (1, "FAIL", 2, 1)
    assert "demographic_parity_difference male vs female: 0.3" in err


def test_warnings_alone_do_not_block(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # DPD 0.04 passes 0.05 but DI 0.2/0.24 = 0.833 ... make DI fail only: rates 0.20 vs 0.26 -> DPD 0.06
    config = write_config(tmp_path, metrics=[
        {"name": "demographic_parity_difference", "threshold": 0.10, "severity_on_fail": "blocking"},
        {"name": "disparate_impact_ratio", "threshold": 0.80, "severity_on_fail": "warning"}])
    rows = {"gender": ["male"] * 50 + ["female"] * 50,
            "prediction": [1] * 13 + [0] * 37 + [1] * 10 + [0] * 40}  # fmt: skip
    code, report, _ = run(capsys, "audit", str(config), str(write_rows(tmp_path, rows)),
                          "--audit-log", str(tmp_path / "l.jsonl"))  # fmt: skip
    assert [r["value"] for r in report["results"]] == [0.06, round(0.20 / 0.26, 4)]
    assert (code, report["verdict"], report["warning_failures"]) == (0, "PASS", 1)


def test_parquet_input_and_report_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = write_rows(tmp_path, balanced(), "preds.parquet")
    report_path = tmp_path / "out" / "report.json"
    code, report, _ = run(capsys, "audit", str(write_config(tmp_path)), str(path), "--report", str(report_path),
                          "--audit-log", str(tmp_path / "l.jsonl"))  # fmt: skip
    assert code == 0 and json.loads(report_path.read_text()) == report


def test_small_and_empty_groups_are_insufficient_never_silent_passes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = write_config(tmp_path, min_samples=5, protected_attributes=[
        {"name": "gender", "groups": ["male", "female", "non_binary"], "pairwise_comparisons": "all"}])  # fmt: skip
    rows = {"gender": ["male"] * 10 + ["female"] * 3, "prediction": [1, 0] * 5 + [1, 0, 1], "label": [1] * 13}
    code, report, _ = run(capsys, "audit", str(config), str(write_rows(tmp_path, rows)),
                          "--audit-log", str(tmp_path / "l.jsonl"))  # fmt: skip
    statuses = {(r["groups"], r["metric"]): r["status"] for r in report["results"]}
    assert all(s == "insufficient_samples" for s in statuses.values())
    assert report["insufficient_samples"] == 9 and report["passed"] == 0
    assert report["attributes"]["gender"]["groups"]["non_binary"]["samples"] == 0
    assert code == 1


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        ({"metrics": [{"name": "accuracy_gap", "threshold": 0.1}]}, "metrics[0].name: unknown metric 'accuracy_gap'"),
        ({"protected_attributes": [{"name": "gender", "groups": ["male", "female"],
                                    "pairwise_comparisons": [["male", "robot"]]}]},
         "protected_attributes[0].pairwise_comparisons[0]: group 'robot' is not in groups"),
        ({"metrics": [{"name": "disparate_impact_ratio", "threshold": 4}]}, "metrics[0].threshold: 4 is not"),
        ({"metrics": [{"name": "disparate_impact_ratio", "threshold": 0.8, "severity_on_fail": "fatal"}]},
         "metrics[0].severity_on_fail: 'fatal' is not one of blocking, warning"),
        ({"model_id": ""}, "model_id: '' is not a non-empty string"),
        ({"protected_attributes": []}, "protected_attributes: required"),
        ({"thresholds": 1}, "thresholds: unknown key"),
        ({"windows": ["1h", "forever"]}, "windows[1]: 'forever' is not a duration"),
    ],
)  # fmt: skip
def test_bad_config_exits_2_naming_file_field_and_value(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], overrides: dict, expected: str
) -> None:
    config = write_config(tmp_path, **overrides)
    code, report, err = run(capsys, "audit", str(config), str(write_rows(tmp_path, balanced())),
                            "--audit-log", str(tmp_path / "l.jsonl"))  # fmt: skip
    assert code == 2 and report is None
    assert str(config) in err and expected in err


def test_every_config_error_is_reported_at_once(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = write_config(tmp_path, model_id=7, min_samples=0, metrics=[{"name": "nope", "threshold": -1}])
    code, _, err = run(capsys, "audit", str(config), str(write_rows(tmp_path, balanced())),
                       "--audit-log", str(tmp_path / "l.jsonl"))  # fmt: skip
    assert code == 2
    for field in ("model_id:", "min_samples:", "metrics[0].name:", "metrics[0].threshold:"):
        assert field in err


@pytest.mark.parametrize(
    ("rows", "expected"),
    [
        ({"gender": ["male", "female"], "label": [0, 1]}, "missing column(s) ['prediction']"),
        ({"gender": ["male", "female"], "prediction": [0, 1]}, "equalised_odds_difference needs the label column"),
        ({"gender": ["male", "female"], "prediction": [0, 2], "label": [0, 1]},
         "column 'prediction' must hold only 0 or 1 (numbers) or true/false (booleans); found [2]"),
        ({"gender": ["male", "female"], "prediction": ["yes", "no"], "label": [0, 1]},
         "column 'prediction' must hold only 0 or 1 (numbers) or true/false (booleans); found ['yes', 'no'] (text"),
        ({"gender": ["male", "female"], "prediction": [1, None], "label": [0, 1]},
         "column 'prediction' has 1 missing values (first rows: [1])"),
        ({"gender": ["male", "female"], "prediction": [1, 0], "label": [0, 5]}, "column 'label' must hold only 0 or 1"),
    ],
)  # fmt: skip
def test_bad_data_exits_2_with_a_clear_message(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], rows: dict, expected: str
) -> None:
    data = write_rows(tmp_path, rows)
    code, _, err = run(capsys, "audit", str(write_config(tmp_path)), str(data), "--audit-log", str(tmp_path / "l"))
    assert code == 2 and str(data) in err and expected in err


def test_empty_and_missing_files_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    empty = tmp_path / "empty.csv"
    empty.write_text("gender,prediction,label\n")
    code, _, err = run(capsys, "audit", str(write_config(tmp_path)), str(empty), "--audit-log", str(tmp_path / "l"))
    assert code == 2 and "has no rows" in err
    code, _, err = run(capsys, "audit", str(tmp_path / "nope.yaml"), str(empty), "--audit-log", str(tmp_path / "l"))
    assert code == 2 and "nope.yaml: cannot read the config" in err


def test_unlabelled_rows_count_for_selection_but_not_for_odds(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rows = balanced()
    rows["label"] = [None if i % 2 else v for i, v in enumerate(rows["label"])]
    code, report, _ = run(capsys, "audit", str(write_config(tmp_path)), str(write_rows(tmp_path, rows)),
                          "--audit-log", str(tmp_path / "l"))  # fmt: skip
    assert code == 0
    male = report["attributes"]["gender"]["groups"]["male"]
    assert (male["samples"], male["labelled"]) == (10, 5)


def test_override_needs_justification_and_author_and_is_logged(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    log = tmp_path / "log.jsonl"
    rows = {"gender": ["male"] * 10 + ["female"] * 10, "prediction": [1] * 8 + [0] * 2 + [1] * 2 + [0] * 8,
            "label": [1, 0] * 10}  # fmt: skip
    args = ["audit", str(write_config(tmp_path)), str(write_rows(tmp_path, rows)), "--audit-log", str(log)]
    code, _, err = run(capsys, *args, "--override-justification", "ok", "--override-author", "ana")
    assert code == 2 and "at least 20 characters" in err
    code, _, err = run(capsys, *args, "--override-justification", "Legal approved: pilot limited to 100 users")
    assert code == 2 and "--override-author must name the person" in err
    why = "Legal approved: pilot limited to 100 users, ticket FAIR-12"
    code, report, _ = run(capsys, *args, "--override-justification", why, "--override-author", "ana@example.org")
    assert code == 0 and report["verdict"] == "OVERRIDDEN"
    assert report["override"] == {"justification": why, "author": "ana@example.org", "overridden_failures": 2}
    records = [json.loads(line) for line in log.read_text().splitlines()]
    assert [r["type"] for r in records] == ["audit_error", "audit_error", "audit"]
    assert records[-1]["override"]["justification"] == why and records[-1]["verdict"] == "OVERRIDDEN"
    assert report["audit_log"] == {"path": str(log), "seq": 2, "hash": records[-1]["hash"]}


def _three_runs(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> tuple[Path, str]:
    log = tmp_path / "log.jsonl"
    args = ["audit", str(write_config(tmp_path)), str(write_rows(tmp_path, balanced())), "--audit-log", str(log)]
    for _ in range(3):
        _, report, _ = run(capsys, *args)
    return log, report["audit_log"]["hash"]


def test_audit_log_verifies_when_intact(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    log, head = _three_runs(tmp_path, capsys)
    assert main(["audit-log", "verify", str(log), "--expect-head", head]) == 0
    assert "intact, 3 records" in capsys.readouterr().out


@pytest.mark.parametrize("tamper", ["edit", "reorder", "delete_middle", "truncate_end"])
def test_audit_log_detects_tampering(tmp_path: Path, capsys: pytest.CaptureFixture[str], tamper: str) -> None:
    log, head = _three_runs(tmp_path, capsys)
    lines = log.read_text().splitlines()
    if tamper == "edit":
        record = json.loads(lines[1])
        record["verdict"] = "PASS" if record["verdict"] == "FAIL" else "FAIL"
        lines[1] = json.dumps(record, sort_keys=True)
    elif tamper == "reorder":
        lines[0], lines[1] = lines[1], lines[0]
    elif tamper == "delete_middle":
        del lines[1]
    else:
        del lines[2]
    log.write_text("\n".join(lines) + "\n")
    assert main(["audit-log", "verify", str(log), "--expect-head", head]) == 1
    assert "TAMPERED" in capsys.readouterr().err


def test_seed_api_is_importable_from_the_package() -> None:
    y_pred = [1, 1, 1, 0, 1, 0, 0, 0]
    attr = ["a", "a", "a", "a", "b", "b", "b", "b"]
    result = exporter.demographic_parity_difference(y_pred, attr, "a", "b")
    assert result == exporter.FairnessResult("demographic_parity_difference", "a_vs_b", "a", "b", 0.5, 0.05, False)
    di = exporter.disparate_impact_ratio(y_pred, attr, "a", "b")
    assert (di.value, di.threshold, di.passed) == (0.3333, 0.80, False)
    eod = exporter.equalised_odds_difference([1, 0, 1, 0, 1, 0, 1, 0], y_pred, attr, "a", "b", threshold=0.6)
    assert (eod.value, eod.passed) == (0.5, True)  # TPR 1 vs 0.5, FPR 0.5 vs 0
    with pytest.raises(ValueError, match="group 'c' has no rows"):
        exporter.demographic_parity_difference(y_pred, attr, "a", "c")


def test_every_metric_of_the_table_has_a_seed_style_function() -> None:
    y_true = [1, 0, 1, 0, 1, 0, 1, 0]
    y_pred = [1, 1, 1, 0, 1, 0, 0, 0]
    attr = ["a", "a", "a", "a", "b", "b", "b", "b"]
    # a: TPR 2/2, FPR 1/2, PPV 2/3, accuracy 3/4; b: TPR 1/2, FPR 0/2, PPV 1/1, accuracy 3/4
    expected = {"equal_opportunity_difference": 0.5, "false_positive_rate_difference": 0.5,
                "predictive_parity_difference": 0.3333, "accuracy_difference": 0.0}  # fmt: skip
    for name, value in expected.items():
        result = getattr(exporter, name)(y_true, y_pred, attr, "a", "b")
        assert (result.metric_name, result.value, result.threshold, result.passed) == (name, value, 0.05,
                                                                                        value <= 0.05)  # fmt: skip
    assert set(exporter.__all__) >= set(COUNT_METRICS)


def test_compas_gate_matches_fairlearn_and_fails(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    frame = compas_frame()
    data = tmp_path / "compas.parquet"
    frame.to_parquet(data)
    config = write_config(tmp_path, model_id="compas", min_samples=30, protected_attributes=[
        {"name": "race", "groups": ["African-American", "Caucasian", "Hispanic"], "pairwise_comparisons": "all"},
        {"name": "sex", "groups": ["Male", "Female"]}])  # fmt: skip
    code, report, _ = run(capsys, "audit", str(config), str(data), "--audit-log", str(tmp_path / "l"))
    assert code == 1 and report["verdict"] == "FAIL" and report["rows"] == 7214
    oracles = {"demographic_parity_difference": fl_dpd, "equalised_odds_difference": fl_eod,
               "disparate_impact_ratio": fl_dpr}  # fmt: skip
    for r in report["results"]:
        a, b = r["groups"].split(" vs ")
        rows = frame[frame[r["attribute"]].isin([a, b])]
        expected = oracles[r["metric"]](rows.label, rows.prediction, sensitive_features=rows[r["attribute"]])
        assert abs(r["exact_value"] - expected) < 1e-9, r
        assert r["value"] == round(expected, 4)
    by_key = {(r["metric"], r["groups"]): r for r in report["results"]}
    # ProPublica's finding: false positive rates 0.448 (African-American) vs 0.235 (Caucasian)
    aa = report["attributes"]["race"]["groups"]["African-American"]
    assert round(aa["false_positive_rate"], 3) == 0.448
    assert round(report["attributes"]["race"]["groups"]["Caucasian"]["false_positive_rate"], 3) == 0.235
    assert by_key[("equalised_odds_difference", "African-American vs Caucasian")]["passed"] is False


def test_console_script_runs_the_shipped_example(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "exporter.cli", "audit", str(ROOT / "examples/hiring-screener.yaml"),
         str(ROOT / "examples/hiring-predictions.csv"), "--audit-log", str(tmp_path / "log.jsonl")],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    report = json.loads(proc.stdout)
    assert proc.returncode == 1 and report["verdict"] == "FAIL"
    gender = {r["groups"]: r for r in report["results"]
              if r["attribute"] == "gender" and r["metric"] == "demographic_parity_difference"}  # fmt: skip
    frame = pd.read_csv(ROOT / "examples/hiring-predictions.csv")
    rate = frame.groupby("gender").prediction.mean()
    assert gender["male vs female"]["value"] == round(abs(rate["male"] - rate["female"]), 4)
    assert np.isclose(gender["male vs female"]["exact_value"], abs(rate["male"] - rate["female"]), atol=1e-12)


def _rates(n: int, male: float, female: float) -> dict[str, list]:
    m, f = round(n * male), round(n * female)
    return {"gender": ["male"] * n + ["female"] * n, "prediction": [1] * m + [0] * (n - m) + [1] * f + [0] * (n - f)}


DPD = [{"name": "demographic_parity_difference", "threshold": 0.05, "severity_on_fail": "blocking"}]


@pytest.mark.parametrize(("n", "male", "female", "evidence"), [
    (200, 0.30, 0.27, "inconclusive"),  # 0.03 within 0.05, but the interval (about +-0.09) reaches past it
    (5000, 0.30, 0.29, "pass"),
    (2000, 0.50, 0.30, "fail"),
])  # fmt: skip
def test_every_result_says_what_the_evidence_says(tmp_path: Path, capsys: pytest.CaptureFixture[str], n: int,
                                                  male: float, female: float, evidence: str) -> None:  # fmt: skip
    _, report, _ = run(capsys, "audit", str(write_config(tmp_path, metrics=DPD)),
                       str(write_rows(tmp_path, _rates(n, male, female))), "--audit-log", str(tmp_path / "l"))
    (result,) = report["results"]
    lo, hi = result["ci_95"]
    assert result["evidence"] == evidence and result["exact_value"] == pytest.approx(abs(male - female))
    assert (lo <= 0.05 < hi) if evidence == "inconclusive" else (hi <= 0.05 if evidence == "pass" else lo > 0.05)
    if evidence == "inconclusive":
        # half-width ~ 1/sqrt(n): (half-width / distance to the threshold)^2 times today's samples
        factor = (result["half_width"] / 0.02) ** 2
        assert result["samples_to_decide"] == {"male": math.ceil(n * factor), "female": math.ceil(n * factor)}
        # issue 20: an imprecise value is still the number, and the point estimate still passes the threshold
        assert result["value"] == 0.03 and result["passed"] is True and result["status"] == "pass"
    else:
        assert result["samples_to_decide"] is None


@pytest.mark.parametrize(("policy", "code", "verdict"), [("warn", 0, "PASS"), ("fail", 1, "FAIL")])
def test_decision_evidence_and_failure_policy_decide_what_inconclusive_does(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], policy: str, code: int, verdict: str
) -> None:
    config = write_config(tmp_path, metrics=DPD, decision="evidence", failure_policy={
        "blocking_failures": "halt_deployment", "warning_failures": "log_and_continue", "inconclusive": policy})
    got, report, _ = run(capsys, "audit", str(config), str(write_rows(tmp_path, _rates(200, 0.30, 0.27))),
                         "--audit-log", str(tmp_path / "l"))  # fmt: skip
    assert (got, report["verdict"], report["decision"], report["inconclusive"]) == (code, verdict, "evidence", 1)
    assert report["warning_failures" if policy == "warn" else "blocking_failures"] == 1


def test_decision_evidence_passes_a_precise_fair_model_and_blocks_a_precise_unfair_one(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = str(write_config(tmp_path, metrics=DPD, decision="evidence"))
    fair, unfair = write_rows(tmp_path, _rates(5000, 0.30, 0.29), "f.csv"), write_rows(tmp_path, _rates(2000, .5, .3))
    assert run(capsys, "audit", config, str(fair), "--audit-log", str(tmp_path / "l"))[0] == 0
    assert run(capsys, "audit", config, str(unfair), "--audit-log", str(tmp_path / "l"))[0] == 1


@pytest.mark.parametrize(("overrides", "expected"), [
    ({"failure_policy": {"blocking_failures": "log_and_continue"}},
     "failure_policy.blocking_failures: 'log_and_continue' is invalid: expected one of halt_deployment"),
    ({"failure_policy": {"inconclusive": "ignore"}}, "failure_policy.inconclusive: 'ignore' is invalid"),
    ({"decision": "vibes"}, "decision: 'vibes' is invalid: expected one of point_estimate, evidence"),
])  # fmt: skip
def test_decision_and_failure_policy_are_validated(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                   overrides: dict, expected: str) -> None:  # fmt: skip
    code, _, err = run(capsys, "audit", str(write_config(tmp_path, **overrides)),
                       str(write_rows(tmp_path, balanced())), "--audit-log", str(tmp_path / "l"))
    assert code == 2 and expected in err, err


def test_a_config_that_sets_max_interval_width_still_loads_and_says_the_key_is_ignored(tmp_path: Path) -> None:
    """Issue 20 removed the rule that hid imprecise values; configs written for it keep working, with a warning."""
    config = write_config(tmp_path, metrics=[{**DPD[0], "max_interval_width": 0.05}])
    proc = subprocess.run([sys.executable, "-m", "exporter.cli", "audit", str(config),
                           str(write_rows(tmp_path, _rates(200, 0.30, 0.27))), "--audit-log", str(tmp_path / "l")],
                          capture_output=True, text=True, check=False)  # fmt: skip
    (result,) = json.loads(proc.stdout)["results"]
    assert proc.returncode == 0 and result["value"] == 0.03 and result["evidence"] == "inconclusive"
    assert f"{config}: metrics[0].max_interval_width: ignored: no value is hidden" in proc.stderr


def test_the_human_summary_shows_every_row_in_full(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Every result, passes too: its value with its interval and evidence (4 places, as every report shows them); an
    inconclusive one says how many samples per group would decide it, an insufficient one which count fell short;
    with decision: evidence, what it did."""
    rows = _rates(200, 0.30, 0.27)
    rows["gender"] = rows["gender"][:-10] + ["non_binary"] * 10  # 10 rows: below min_samples
    config = write_config(tmp_path, metrics=DPD, min_samples=30, decision="evidence", protected_attributes=[
        {"name": "gender", "groups": ["male", "female", "non_binary"]}])  # fmt: skip
    code, report, err = run(capsys, "audit", str(config), str(write_rows(tmp_path, rows)),
                            "--audit-log", str(tmp_path / "l"))  # fmt: skip
    lines = err.strip().splitlines()
    assert len(lines) == 1 + len(report["results"]) == 4
    by_groups = {r["groups"]: r for r in report["results"]}
    r = by_groups["male vs female"]
    lo, hi = r["ci_95"]
    a, b = r["samples_to_decide"]["male"], r["samples_to_decide"]["female"]
    assert (f"  PASS blocking gender demographic_parity_difference male vs female: {r['exact_value']:.4f} "
            f"[{lo:.4f}, {hi:.4f}], evidence inconclusive; about {a:,} (male) and {b:,} (female) samples would "
            "decide it; counts as blocking") in lines  # fmt: skip
    r = by_groups["male vs non_binary"]  # its value as every report shows it, marked insufficient as they mark it
    lo, hi = r["ci_95"]
    a, b = r["samples_to_decide"]["male"], r["samples_to_decide"]["non_binary"]
    assert (f"  INSUFFICIENT_SAMPLES blocking gender demographic_parity_difference male vs non_binary: "
            f"{r['exact_value']:.4f} [{lo:.4f}, {hi:.4f}], evidence inconclusive; insufficient samples: the smallest "
            f"count of predictions in a group is 10, below min_samples 30; about {a:,} (male) and {b:,} (non_binary) "
            "samples would decide it; counts as blocking") in lines  # fmt: skip
    assert code == 1 and "(decision: evidence)" in lines[0]
