"""The shipped PrometheusRule: generated and up to date, valid for promtool, unit-tested, documented."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from promql_selectors import selectors
from tooling import require_binary

from exporter.devtools import rules as generate

ROOT = Path(__file__).resolve().parent.parent
RULES = ROOT / "rules"
RULE_FILE = RULES / "fairness-exporter.rules.yaml"
RUNBOOK = RULES / "RUNBOOK.md"
PROMTOOL_TESTS = sorted((RULES / "tests").glob("*.test.yaml"))
PLAIN_RULES = "plain-rules.yaml"  # the name the promtool test files list under rule_files


COMMITTED: dict[str, Any] = yaml.safe_load(RULE_FILE.read_text(encoding="utf-8"))
RULES_BY_KIND: dict[str, list[dict[str, Any]]] = {"alert": [], "record": []}
for _group in COMMITTED["spec"]["groups"]:
    for _rule in _group["rules"]:
        RULES_BY_KIND["alert" if "alert" in _rule else "record"].append(_rule)
ALERTS = {rule["alert"]: rule for rule in RULES_BY_KIND["alert"]}
CONSTANT_VALUE = {"FairnessExporterDown", "FairnessExporterAbsent",  # up == 0 and absent() are always 0 / 1
                  "FairnessExporterKafkaUnreachable",  # fairness_exporter_kafka_connected == 0
                  "FairnessExporterModelUnowned",  # max(fairness_exporter_model_owned) == 0
                  "FairnessExporterPartitionsShared",  # fairness_exporter_partitions_shared == 1
                  "FairnessExporterNoModel"}  # fairness_exporter_models == 0


def _seconds(duration: str) -> int:
    """A Prometheus duration such as 7d1h20m, in seconds."""
    units = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}
    parts = re.findall(r"(\d+)([smhdw])", duration)
    assert "".join(n + u for n, u in parts) == duration, f"unsupported duration {duration!r}"
    return sum(int(n) * units[u] for n, u in parts)


def _github_anchors(markdown: str) -> set[str]:
    """The anchors GitHub gives the headings of a Markdown document (outside code fences)."""
    anchors, in_fence = set(), False
    for line in markdown.splitlines():
        if line.lstrip().startswith("```"):
            in_fence = not in_fence
        elif not in_fence and (match := re.match(r"#{1,6}\s+(.*)", line)):
            anchors.add(re.sub(r"[^\w\- ]", "", match.group(1).strip().lower()).replace(" ", "-"))
    return anchors


def _promtool(promtool: str, *args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([promtool, *args], cwd=cwd, capture_output=True, text=True, timeout=600, check=False)


@pytest.fixture(scope="module")
def promtool() -> str:
    return require_binary("promtool")


@pytest.fixture(scope="module")
def promtool_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A directory holding the committed PrometheusRule's spec as a plain rule file, and the promtool tests."""
    directory = tmp_path_factory.mktemp("rules")
    (directory / PLAIN_RULES).write_text(yaml.safe_dump(COMMITTED["spec"], sort_keys=False), encoding="utf-8")
    for test_file in PROMTOOL_TESTS:
        shutil.copy(test_file, directory)
    return directory


def test_committed_rule_file_is_up_to_date_with_the_generator() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "exporter.devtools.rules", "--check"], capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stderr


def test_rule_file_is_a_prometheus_rule_for_fairness_exporter() -> None:
    assert COMMITTED["apiVersion"] == "monitoring.coreos.com/v1"
    assert COMMITTED["kind"] == "PrometheusRule"
    assert COMMITTED["metadata"]["name"] == "fairness-exporter"
    assert COMMITTED["metadata"]["labels"]["app.kubernetes.io/name"] == "fairness-exporter"
    assert COMMITTED["spec"] == generate.rule_file()


@pytest.mark.prometheus
def test_promtool_accepts_the_plain_rule_file(promtool: str, promtool_dir: Path) -> None:
    result = _promtool(promtool, "check", "rules", PLAIN_RULES, cwd=promtool_dir)
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.prometheus
@pytest.mark.parametrize("test_file", PROMTOOL_TESTS, ids=lambda path: path.name)
def test_promtool_unit_tests_pass(promtool: str, promtool_dir: Path, test_file: Path) -> None:
    result = _promtool(promtool, "test", "rules", test_file.name, cwd=promtool_dir)
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.prometheus
def test_promtool_accepts_rules_with_short_for_durations(promtool: str, tmp_path: Path) -> None:
    rules = generate.rule_file(for_durations="5s")
    (tmp_path / "short.yaml").write_text(generate.render(rules), encoding="utf-8")
    result = _promtool(promtool, "check", "rules", "short.yaml", cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    alerts = [rule for group in rules["groups"] for rule in group["rules"] if "alert" in rule]
    assert {rule["for"] for rule in alerts} == {"5s"}
    held = [rule for rule in alerts if generate.TUNING[rule["alert"]].for_ != generate.DETECTOR_FOR]
    assert all("for 5s" in rule["annotations"]["description"] for rule in held)


@pytest.mark.parametrize("rule", [*RULES_BY_KIND["record"], *RULES_BY_KIND["alert"]],
                         ids=lambda rule: rule.get("alert") or rule["record"])  # fmt: skip
def test_every_selector_selects_the_scrape_job(rule: dict[str, Any]) -> None:
    """job="fairness-exporter" on every selector, raw series or recorded: the one matcher the chart rewrites to its
    release's job and namespace (templates/prometheusrule.yaml). A selector without it would read, and in a
    recording rule write, every namespace's series under every release of the chart."""
    found = selectors(rule["expr"])
    assert found, f"no selector found in {rule['expr']!r}"
    unscoped = [name for name, matchers in found if matchers.get("job") != generate.JOB]
    assert not unscoped, f"selectors without job=\"{generate.JOB}\": {unscoped}"


def test_for_durations_mapping_replaces_only_the_named_alerts() -> None:
    rules = generate.rule_file(for_durations={"FairnessExporterDown": "5s"})
    fors = {rule["alert"]: rule["for"] for group in rules["groups"] for rule in group["rules"] if "alert" in rule}
    assert fors == {name: tuning.for_ for name, tuning in generate.TUNING.items()} | {"FairnessExporterDown": "5s"}


def test_for_durations_naming_an_unknown_alert_is_an_error() -> None:
    with pytest.raises(ValueError, match="FairnessExporterDwon"):
        generate.rule_file(for_durations={"FairnessExporterDwon": "5s"})


def test_every_alert_of_the_tuning_table_is_shipped() -> None:
    assert set(ALERTS) == set(generate.TUNING)


@pytest.mark.parametrize("name", sorted(ALERTS))
def test_alert_has_severity_summary_description_and_runbook_url(name: str) -> None:
    rule = ALERTS[name]
    assert rule["labels"]["severity"] in {"critical", "warning"}
    assert rule["for"]
    for key in ("summary", "description", "runbook_url"):
        assert rule["annotations"].get(key), f"{name} has no {key}"
    if name not in CONSTANT_VALUE:
        assert "$value" in rule["annotations"]["description"], f"{name}'s description does not show the value"


@pytest.mark.parametrize("name", ["FairnessDemographicParityAboveThreshold", "FairnessDisparateImpactBelowThreshold"])
def test_fairness_comparison_alert_names_model_dimension_and_window(name: str) -> None:
    description = ALERTS[name]["annotations"]["description"]
    for label in ("model_id", "attribute", "dimension", "group_a", "group_b", "window"):
        assert "{{ $labels." + label + " }}" in description


@pytest.mark.parametrize("name", ["FairnessDemographicParityDrift", "FairnessDisparateImpactViolation",
                                  "FairnessEqualisedOddsDrift"])  # fmt: skip
def test_detector_alert_names_the_comparison_and_shows_the_gap_in_every_window(name: str) -> None:
    description = ALERTS[name]["annotations"]["description"]
    for label in ("model_id", "attribute", "dimension", "group_a", "group_b", "direction", "instance"):
        assert "{{ $labels." + label + " }}" in description
    assert "| query" in description and "_lower" in description and "_upper" in description


def test_detector_alerts_are_the_detectors_table_and_fire_while_a_detector_is_in_alarm() -> None:
    from exporter.stream.state.detectors import ALERTS as DETECTOR_ALERTS

    for alert in DETECTOR_ALERTS:
        rule = ALERTS[alert.name]
        assert rule["labels"]["severity"] == alert.severity
        assert rule["expr"].endswith("_alarm" + rule["expr"].split("\n")[0].split("_statistic", 1)[1] + " == 1")
    paging = {name for name, rule in ALERTS.items() if rule["labels"]["severity"] == "critical"}
    # no fairness alert (of the model) can fire
    blind = {"FairnessExporterAbsent", "FairnessExporterModelUnowned", "FairnessExporterPartitionsShared",
             "FairnessExporterNoModel"}
    assert paging - blind == {a.name for a in DETECTOR_ALERTS if a.severity == "critical"}


def test_rate_shift_alert_names_model_subgroup_and_window() -> None:
    description = ALERTS["SubgroupPredictionRateAverageShift"]["annotations"]["description"]
    for label in ("model_id", "attribute", "subgroup", "window"):
        assert "{{ $labels." + label + " }}" in description


@pytest.mark.parametrize("name", sorted(ALERTS))
def test_runbook_url_points_to_a_section_of_the_runbook(name: str) -> None:
    page, _, anchor = ALERTS[name]["annotations"]["runbook_url"].partition("#")
    assert page == "https://github.com/fairness-exporter/fairness-exporter/blob/main/rules/RUNBOOK.md"
    assert anchor in _github_anchors(RUNBOOK.read_text(encoding="utf-8"))


def test_every_runbook_section_is_a_shipped_alert() -> None:
    sections = re.findall(r"^## (\S+)$", RUNBOOK.read_text(encoding="utf-8"), flags=re.MULTILINE)
    assert sorted(sections) == sorted(ALERTS)


@pytest.mark.parametrize("name", sorted(ALERTS))
def test_alert_is_unit_tested_on_both_edges_of_its_for(name: str) -> None:
    """Some test sees the alert quiet at one evaluation and firing, annotations checked, at the next one."""
    edges: dict[str, set[int]] = {}
    for path in PROMTOOL_TESTS:
        document = yaml.safe_load(path.read_text(encoding="utf-8"))
        step = _seconds(document.get("evaluation_interval", "1m"))
        for group in document["tests"]:
            cases = [case for case in group.get("alert_rule_test", []) if case["alertname"] == name]
            quiet = {_seconds(case["eval_time"]) for case in cases if not case.get("exp_alerts")}
            firing = {
                _seconds(case["eval_time"])
                for case in cases
                if case.get("exp_alerts") and all("exp_annotations" in alert for alert in case["exp_alerts"])
            }
            edges[f"{path.name}: {group.get('name')}"] = {t for t in firing if t - step in quiet}
    assert any(edges.values()), f"no promtool test of {name} is quiet one evaluation before it fires"


RECORDING_NAME = re.compile(r"[a-z_]+:[a-z_]+:[a-z0-9_]+")


@pytest.mark.parametrize("record", sorted(rule["record"] for rule in RULES_BY_KIND["record"]))
def test_recording_rule_is_named_level_metric_operations(record: str) -> None:
    assert RECORDING_NAME.fullmatch(record)
