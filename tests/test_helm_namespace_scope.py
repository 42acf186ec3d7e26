"""Two releases of the chart in two namespaces: each release's PrometheusRule reads, records and pages on its own
namespace's series only.

A platform runs one release per team. Were a release's rules to read every namespace, both releases' rule groups
would record the same series (Prometheus logs duplicate samples and drops one group's) and each release would page,
through its own AlertmanagerConfig, for the other team's models. The rule file puts job="fairness-exporter" on every
selector (tests/test_rules.py) and the chart rewrites it to the release's job and namespace.

Evaluated with `promtool test rules`: every unit test of rules/tests/ runs again on the rules release A renders, with
its input series in namespace A and a copy of them in namespace B (other targets there, as in a cluster). The
expectations are the test's own, in namespace A: B's copy may add nothing. Then B's copy alone: A's rules record
nothing and raise nothing but A's own FairnessExporterAbsent.
"""

from __future__ import annotations

import copy
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from promql_selectors import selectors
from test_helm import CHART, CI, RULES_FILE, helm, of_kind, only, run_helm  # noqa: F401  (helm: the fixture)
from tooling import require_binary

pytestmark = pytest.mark.helm

TEAM_A, TEAM_B = "team-a", "team-b"
ROOT = Path(__file__).resolve().parent.parent
PROMTOOL_TESTS = sorted((ROOT / "rules" / "tests").glob("*.test.yaml"))
SHIPPED = 'job="fairness-exporter"'
LABEL = re.compile(r'([a-zA-Z_]\w*)="((?:[^"\\]|\\.)*)"')


class _Yaml12(yaml.SafeLoader):
    """YAML as promtool reads it: `18_25` (a label value in rules/tests/) is a string, not PyYAML's 1825."""


_Yaml12.yaml_implicit_resolvers = {
    first: [(tag, regex) for tag, regex in resolvers if tag != "tag:yaml.org,2002:int"]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}
_Yaml12.add_implicit_resolver("tag:yaml.org,2002:int", re.compile(r"^[-+]?[0-9]+$"), list("-+0123456789"))


def rendered(helm: str, namespace: str, chart: Path = CHART) -> list[dict[str, Any]]:  # noqa: F811
    result = run_helm(helm, "template", "fx", str(chart), "--namespace", namespace, "--values", str(CI["default"]))
    assert result.returncode == 0, result.stderr
    return [doc for doc in yaml.safe_load_all(result.stdout) if doc]


def rules_of(helm: str, namespace: str) -> dict[str, Any]:  # noqa: F811
    """The plain rule file of the PrometheusRule a release in ``namespace`` renders."""
    spec = only(rendered(helm, namespace), "PrometheusRule")["spec"]
    return {"groups": spec["groups"]}


def relabelled(series: str, namespace: str, instance_prefix: str = "") -> str:
    """A promtool series `name{a="1",...}` in ``namespace``, its instance (a target's address) prefixed."""
    name, _, rest = series.partition("{")
    labels = dict(LABEL.findall(rest))
    labels["namespace"] = namespace
    if "instance" in labels:
        labels["instance"] = instance_prefix + labels["instance"]
    return name + "{" + ",".join(f'{key}="{value}"' for key, value in labels.items()) + "}"


def in_namespace_a(case: dict[str, Any]) -> dict[str, Any]:
    """One unit test of rules/tests/ with its series in namespace A and another target's copy in B; its
    expectations, in A. FairnessExporterAbsent's description names the selector, which the chart rewrites."""
    case = copy.deepcopy(case)
    inputs = case["input_series"]
    case["input_series"] = [{**s, "series": relabelled(s["series"], TEAM_A)} for s in inputs] + [
        {**s, "series": relabelled(s["series"], TEAM_B, "other-")} for s in inputs
    ]
    for test in case.get("alert_rule_test", []):
        for alert in test.get("exp_alerts") or []:
            alert["exp_labels"] = {**alert.get("exp_labels", {}), "namespace": TEAM_A}
            scoped = f'{SHIPPED}, namespace="{TEAM_A}"'
            alert["exp_annotations"] = {key: text.replace(SHIPPED, scoped)
                                        for key, text in alert.get("exp_annotations", {}).items()}  # fmt: skip
    for test in case.get("promql_expr_test", []):
        for sample in test.get("exp_samples") or []:
            sample["labels"] = relabelled(sample["labels"], TEAM_A)
    return case


def in_namespace_b_alone(case: dict[str, Any]) -> dict[str, Any]:
    """One unit test of rules/tests/ with its series in namespace B only: at each of its times, release A has
    recorded no series and raised no alert but its own FairnessExporterAbsent (none of its targets is up)."""
    times = sorted({test["eval_time"] for key in ("alert_rule_test", "promql_expr_test")
                    for test in case.get(key, [])}, key=_seconds)  # fmt: skip
    expr = 'count by (__name__, alertname, namespace) ({__name__=~"ALERTS|.+:.+"})'
    absent = f'{{__name__="ALERTS", alertname="FairnessExporterAbsent", namespace="{TEAM_A}"}}'
    return {
        "name": case["name"],
        "interval": case["interval"],
        "input_series": [{**s, "series": relabelled(s["series"], TEAM_B, "other-")} for s in case["input_series"]],
        "promql_expr_test": [{"expr": expr, "eval_time": time, "exp_samples": [{"labels": absent, "value": 1}]}
                             for time in times],
    }  # fmt: skip


def _seconds(duration: str) -> int:
    units = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}
    return sum(int(n) * units[u] for n, u in re.findall(r"(\d+)([smhdw])", duration))


def promtool_test(rules: dict[str, Any], document: dict[str, Any], tmp_path: Path) -> subprocess.CompletedProcess[str]:
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump(rules, sort_keys=False))
    (tmp_path / "test.yaml").write_text(yaml.safe_dump({**document, "rule_files": ["rules.yaml"]}, sort_keys=False))
    return subprocess.run([require_binary("promtool"), "test", "rules", "test.yaml"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=600, check=False)  # fmt: skip


def test_every_selector_of_a_release_selects_its_own_namespace_and_job(helm: str) -> None:  # noqa: F811
    """Raw series and recorded ones alike: each selector of release A's rules has namespace="team-a"."""
    rules = [rule for group in rules_of(helm, TEAM_A)["groups"] for rule in group["rules"]]
    found = [(rule.get("alert") or rule["record"], name, matchers)
             for rule in rules for name, matchers in selectors(rule["expr"])]  # fmt: skip
    assert {name for name, _, _ in found} == {rule.get("alert") or rule["record"] for rule in rules}, \
        "a rule without any selector found: the check below would pass it unread"
    wrong = sorted({(rule, name) for rule, name, matchers in found
                    if matchers.get("namespace") != TEAM_A or matchers.get("job") != "fairness-exporter"})  # fmt: skip
    assert not wrong, f"selectors of release {TEAM_A}'s rules that read other namespaces: {wrong}"


@pytest.mark.prometheus
@pytest.mark.parametrize("placed", [in_namespace_a, in_namespace_b_alone],
                         ids=["another namespace's series change nothing", "another namespace's alone raise nothing"])
@pytest.mark.parametrize("test_file", PROMTOOL_TESTS, ids=lambda path: path.name)
def test_a_release_records_and_raises_on_its_own_namespace_only(
    helm: str, test_file: Path, placed: Any, tmp_path: Path  # noqa: F811
) -> None:
    """Every promtool test of rules/tests/ on release team-a's rendered rules: with a copy of its input series in
    team-b beside them, its expectations hold exactly (``in_namespace_a``); with team-b's copy alone, team-a records
    and raises nothing but its own FairnessExporterAbsent (``in_namespace_b_alone``)."""
    document = yaml.load(test_file.read_text(), Loader=_Yaml12)
    document["tests"] = [placed(case) for case in document["tests"]]
    result = promtool_test(rules_of(helm, TEAM_A), document, tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr


def test_a_rule_the_chart_cannot_scope_is_refused(helm: str, tmp_path: Path) -> None:  # noqa: F811
    """A rule file with a selector built without own() (exporter/devtools/rule_text.py): no render, the rule named."""
    chart = tmp_path / "chart"
    shutil.copytree(CHART, chart, symlinks=False)
    rules = yaml.safe_load(RULES_FILE.read_text())
    (rule,) = [r for g in rules["spec"]["groups"] for r in g["rules"] if r.get("alert") == "FairnessExporterNoModel"]
    rule["expr"] = "fairness_exporter_models == 0"
    target = chart / "files" / "fairness-exporter.rules.yaml"
    target.write_text(yaml.safe_dump(rules, sort_keys=False))
    result = run_helm(helm, "template", "fx", str(chart), "--namespace", TEAM_A, "--values", str(CI["default"]))
    assert result.returncode != 0
    assert "FairnessExporterNoModel" in result.stderr and SHIPPED in result.stderr, result.stderr
    assert of_kind(rendered(helm, TEAM_A), "PrometheusRule"), "the shipped rules render"
