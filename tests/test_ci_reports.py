"""--junit and --summary-md: what Jenkins, GitLab, GitHub, Azure DevOps and Buildkite show of a gate run.

The JUnit XML is read back with junitparser, the parser of EnricoMi/publish-unit-test-result-action (a GitHub
report action): what it sees is what that CI shows. No JUnit XSD is shipped here: the one that fits our dialect
(the Jenkins xUnit plugin's junit-10.xsd, which pytest's output follows) has no ``<properties>`` on test cases,
which we write as pytest's record_property does; the reader's view is the check that matters.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
import yaml
from junitparser import Error, Failure, Skipped
from junitparser.xunit2 import JUnitXml, TestCase

from exporter.cli import main
from exporter.gate.reports import ci as ci_reports

ROOT = Path(__file__).resolve().parent.parent
DP = {"name": "demographic_parity_difference", "threshold": 0.05, "severity_on_fail": "blocking"}
DI = {"name": "disparate_impact_ratio", "threshold": 0.8, "severity_on_fail": "warning"}


def write_audit(tmp_path: Path, female_positives: int, *, metrics: list | None = None, **config: object) -> tuple[
        Path, Path]:  # fmt: skip
    """1,000 men (500 selected) and 1,000 women (``female_positives`` selected): enough rows for intervals of
    about ±0.04; a config over gender."""
    rows = ["gender,prediction,label"]
    rows += [f"male,{int(i < 500)},{int(i % 2 == 0)}" for i in range(1000)]
    rows += [f"female,{int(i < female_positives)},{int(i % 2 == 0)}" for i in range(1000)]
    data = tmp_path / "preds.csv"
    data.write_text("\n".join(rows) + "\n")
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump({"model_id": "m1", "min_samples": 30,
                                    "protected_attributes": [{"name": "gender", "groups": ["male", "female"]}],
                                    "metrics": metrics or [DP, DI], **config}))  # fmt: skip
    return path, data


def run(tmp_path: Path, capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, dict, JUnitXml, str]:
    """Run a gate command with --report, --junit and --summary-md; its exit code and the three files."""
    files = tmp_path / "out"
    log = [] if args[0] == "bias-report" else ["--audit-log", str(tmp_path / "log.jsonl")]
    code = main([*args, *log, "--junit", str(files / "junit.xml"), "--summary-md", str(files / "summary.md")])
    out, _ = capsys.readouterr()
    report = json.loads(out) if out.strip() else {}
    return code, report, JUnitXml.fromfile(str(files / "junit.xml")), (files / "summary.md").read_text()


def cases(xml: JUnitXml) -> dict[str, TestCase]:
    return {f"{case.classname} :: {case.name}": case for suite in xml for case in suite}


def props(case: TestCase) -> dict[str, str]:
    return {p.name: p.value for p in case.properties()}


def test_a_blocking_failure_is_a_failed_case_carrying_its_value_and_interval(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config, data = write_audit(tmp_path, female_positives=100)
    code, report, xml, _ = run(tmp_path, capsys, "audit", str(config), str(data))
    assert code == 1
    dp = next(r for r in report["results"] if r["metric"] == "demographic_parity_difference")
    assert dp["value"] == 0.4  # 500/1000 - 100/1000
    case = cases(xml)["m1.gender :: demographic_parity_difference male vs female"]
    (failure,) = case.result
    assert isinstance(failure, Failure)
    lo, hi = dp["ci_95"]
    shown = f"0.4000 [{lo:.4f}, {hi:.4f}]"
    assert failure.message.startswith(f"blocking: {shown}, threshold ≤ 0.05, evidence fail")
    assert shown in failure.text  # GitLab shows the element's text, Jenkins the message
    p = props(case)
    assert (float(p["value"]), float(p["ci_95.lower"]), float(p["ci_95.upper"])) == (0.4, lo, hi)
    assert (p["threshold"], p["evidence"], p["counts_as"]) == ("0.05", "fail", "blocking")


def test_the_counts_a_reader_recounts_are_the_reports(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config, data = write_audit(tmp_path, female_positives=100)
    _, report, xml, _ = run(tmp_path, capsys, "audit", str(config), str(data))
    stated = (xml.tests, xml.failures, xml.errors, [(s.tests, s.failures, s.skipped) for s in xml])
    xml.update_statistics()  # junitparser counts the <failure>, <skipped> and <error> elements itself
    assert stated == (xml.tests, xml.failures, xml.errors, [(s.tests, s.failures, s.skipped) for s in xml])
    assert (xml.tests, xml.failures) == (report["total_tests"], report["blocking_failures"])
    assert sum(s.skipped for s in xml) == report["warning_failures"] == 1
    suite = next(iter(xml))
    assert {p.name: p.value for p in suite.properties()}["audit_log.hash"] == report["audit_log"]["hash"]


def test_a_warning_is_a_skipped_case_that_says_it_does_not_block(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config, data = write_audit(tmp_path, female_positives=300)
    _, report, xml, summary = run(tmp_path, capsys, "audit", str(config), str(data))
    di = next(r for r in report["results"] if r["metric"] == "disparate_impact_ratio")
    assert di["value"] == 0.6 and di["counts_as"] == "warning"
    case = cases(xml)["m1.gender :: disparate_impact_ratio male vs female"]
    (skipped,) = case.result
    assert isinstance(skipped, Skipped) and skipped.type == "warning"
    assert skipped.message.startswith("warning (does not block): 0.6000 [")
    assert re.search(r"\| disparate_impact_ratio \| male vs female \| 0\.6000 \[[0-9.]+, [0-9.]+\] \| ≥ 0\.8 \|"
                     r" fail \| ⚠️ warning \|", summary)  # fmt: skip


def test_an_insufficient_comparison_says_so(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config, data = write_audit(tmp_path, female_positives=100, min_samples=1500)
    _, report, xml, summary = run(tmp_path, capsys, "audit", str(config), str(data))
    assert {r["status"] for r in report["results"]} == {"insufficient_samples"}
    message = cases(xml)["m1.gender :: demographic_parity_difference male vs female"].result[0].message
    assert message.endswith("; insufficient samples: the smallest count of predictions in a group is 1000, below "
                            "min_samples 1500")  # fmt: skip
    assert "| ❌ blocking: insufficient samples: the smallest count of predictions in a group is 1000" in summary


def test_an_inconclusive_comparison_says_how_many_samples_would_decide_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # 0.50 against 0.47: a gap of 0.03 whose interval reaches past 0.05; the verdict follows the evidence and an
    # inconclusive result warns
    config, data = write_audit(tmp_path, female_positives=470, metrics=[DP], decision="evidence",
                               failure_policy={"inconclusive": "warn"})  # fmt: skip
    code, report, xml, _ = run(tmp_path, capsys, "audit", str(config), str(data))
    (dp,) = report["results"]
    assert (code, dp["value"], dp["evidence"], dp["counts_as"]) == (0, 0.03, "inconclusive", "warning")
    (skipped,) = cases(xml)["m1.gender :: demographic_parity_difference male vs female"].result
    decide = dp["samples_to_decide"]
    assert isinstance(skipped, Skipped)
    assert skipped.message.endswith(f"evidence inconclusive (decided at about male {decide['male']}, female "
                                    f"{decide['female']} per group)")  # fmt: skip


def test_an_override_keeps_the_failed_cases_and_the_summary_names_who_decided(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config, data = write_audit(tmp_path, female_positives=100)
    code, report, xml, summary = run(tmp_path, capsys, "audit", str(config), str(data), "--override-justification",
                                     "Legal approved a 100-user pilot, ticket FAIR-12", "--override-author", "ana")
    assert code == 0 and report["verdict"] == "OVERRIDDEN"
    assert xml.failures == report["blocking_failures"] == 1
    assert summary.splitlines()[0] == "### ⚠️ Fairness audit: OVERRIDDEN — m1"
    assert "Overridden by ana: Legal approved a 100-user pilot, ticket FAIR-12" in summary
    assert "| ❌ blocking (overridden) |" in summary


def test_the_summary_puts_the_verdict_first_then_every_comparison(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    shutil.copy(ROOT / "examples" / "hiring-screener.yaml", tmp_path / "hiring.yaml")
    _, report, xml, summary = run(tmp_path, capsys, "audit", str(tmp_path / "hiring.yaml"),
                                  str(ROOT / "examples" / "hiring-predictions.csv"))  # fmt: skip
    lines = summary.splitlines()
    assert lines[0] == "### ❌ Fairness audit: FAIL — hiring-screener-v2"
    rows = [line for line in lines if line.startswith("| ") and not line.startswith("| attribute")]
    assert len(rows) == report["total_tests"] == xml.tests
    for r, row in zip(report["results"], rows, strict=True):
        cells = row.split(" | ")
        assert (cells[0], cells[1], cells[2]) == (f"| {r['attribute']}", r["metric"], r["groups"])
        value = r["value"] if r["value"] is not None else r["exact_value"]
        assert cells[3] == f"{value:.4f} [{r['ci_95'][0]:.4f}, {r['ci_95'][1]:.4f}]"


def test_a_run_that_cannot_evaluate_writes_an_errored_case(tmp_path: Path,
                                                           capsys: pytest.CaptureFixture[str]) -> None:  # fmt: skip
    config, _ = write_audit(tmp_path, female_positives=100)
    code, report, xml, summary = run(tmp_path, capsys, "audit", str(config), str(tmp_path / "missing.csv"))
    assert code == 2 and report == {}
    (case,) = cases(xml).values()
    assert isinstance(case.result[0], Error)
    assert case.result[0].message == f"{tmp_path / 'missing.csv'}: no such predictions file, folder or prefix"
    assert summary.splitlines()[0].startswith("### 🛑 Fairness audit: ERROR")


def test_red_team_critical_failures_fail_and_lower_severities_are_skipped(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(ROOT / "examples")
    monkeypatch.syspath_prepend(str(ROOT / "examples"))
    code, report, xml, summary = run(tmp_path, capsys, "redteam", "--config", "red-team.yaml",
                                     "--target", "example_models:keyword_moderator")  # fmt: skip
    assert code == 1
    failed = [r for r in report["results"] if not r["passed"]]
    assert xml.failures == report["critical_failures"] > 0
    assert sum(s.skipped for s in xml) == len(failed) - report["critical_failures"] > 0
    result = next(r for r in failed if r["severity"] == "critical")
    case = cases(xml)[f"content-moderator-v3.redteam.{result['category']} :: {result['test_name']}"]
    p = props(case)
    assert (p["severity"], p["technique"], int(p["failed_attempts"])) == (
        "critical", result["details"]["technique"], result["details"]["failed_attempts"])
    assert json.loads(case.result[0].text.split("\n", 1)[1]) == json.loads(json.dumps(result["details"]))
    assert summary.splitlines()[0] == "### ❌ Red-team suite: FAIL — content-moderator-v3"


def test_the_safety_suite_passes_as_passed_cases(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                 monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    monkeypatch.chdir(ROOT / "examples")
    monkeypatch.syspath_prepend(str(ROOT / "examples"))
    code, report, xml, _ = run(tmp_path, capsys, "safety", "--config", "safety.yaml",
                                     "--model", "example_models:credit_model")  # fmt: skip
    assert code == 0 and report["verdict"] == "PASS"
    assert sorted(c.name for c in cases(xml).values()) == sorted(r["test_name"] for r in report["results"])
    assert all(c.is_passed for c in cases(xml).values())
    bounds = cases(xml)["credit-scorer-v4.safety.robustness :: output_boundary_check"]
    assert float(props(bounds)["max_output"]) == report["results"][0]["details"]["max_output"]


def test_a_biased_feature_is_a_failed_case_with_the_gap_and_its_groups_intervals(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data = str(ROOT / "tests" / "data" / "bias_example.csv")
    code, report, xml, summary = run(tmp_path, capsys, "bias-report", data, "--protected", "gender,race",
                                     "--outcome", "prediction_accuracy")  # fmt: skip
    assert code == 1 and (report["race"]["is_biased"], report["gender"]["is_biased"]) == (True, False)
    race = cases(xml)[f"bias-report.{data} :: race"]
    lo, hi = report["race"]["group_intervals"]["asian"]
    assert isinstance(race.result[0], Failure)
    assert race.result[0].message == (
        f"biased: gap 0.1600 > threshold 0.1; highest asian 0.9100 [{lo:.4f}, {hi:.4f}] (n=2), lowest black "
        f"0.7500 [{report['race']['group_intervals']['black'][0]:.4f}, "
        f"{report['race']['group_intervals']['black'][1]:.4f}] (n=2)")
    assert cases(xml)[f"bias-report.{data} :: gender"].is_passed
    assert summary.splitlines()[0] == f"### ❌ Bias report: FAIL — {data}"


def test_characters_xml_cannot_hold_are_escaped_and_markdown_cells_stay_cells() -> None:
    report = {"suite": "redteam", "model_id": "m|1", "verdict": "PASS", "timestamp": "t", "results": [
        {"test_name": "nul\x00and<esc\x1b>", "category": "c", "passed": True, "severity": "low",
         "details": {"output": "a|b\nc"}}]}  # fmt: skip
    ci = ci_reports.from_suite(report)
    xml = JUnitXml.fromstring(ci_reports.junit_xml(ci).encode())
    (case,) = cases(xml).values()
    assert case.name == "nul\\x00and<esc\\x1b>"
    row = ci_reports.markdown(ci).splitlines()[-1]
    assert row == "| nul\\x00and&lt;esc\\x1b&gt; | c | low | output=a&#124;b c | ✅ pass |"
