"""The chart's health alerts on the exporter's own targets are scoped to the release they monitor.

prometheus-operator applies an AlertmanagerConfig "only to alerts for which the namespace label is equal to the
namespace of the AlertmanagerConfig resource" (AlertmanagerConfigSpec, monitoring.coreos.com/v1alpha1 and v1beta1).
An absent() alert carries only its selector's equality labels, so the chart's PrometheusRule selects
`up{job=<serviceMonitor.jobName>, namespace=<release namespace>}`: FairnessExporterAbsent, the one critical alert
that says no fairness alert can fire, then carries the namespace the release's AlertmanagerConfig routes on, and
another namespace's release (every one relabels its job alike) being up cannot hide this release being gone.
rules/ keeps the unscoped `up{job="fairness-exporter"}` for a plain Prometheus.

Evaluated with `promtool test rules` on the rules the chart renders in the `monitoring` namespace.
"""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from test_helm import NAMESPACE, helm, only, render  # noqa: F401  (helm: the fixture)
from tooling import require_binary

pytestmark = pytest.mark.helm

ABSENT, DOWN = "FairnessExporterAbsent", "FairnessExporterDown"
THIS_RELEASE = {"severity": "critical", "job": "fairness-exporter", "namespace": NAMESPACE}
OTHER_RELEASE = 'up{job="fairness-exporter", namespace="team-b", instance="10.0.0.2:9108"}'


def promtool_test(rules: dict[str, Any], series: list[dict[str, str]], alert: str, expected: list[dict[str, str]],
                  tmp_path: Path) -> subprocess.CompletedProcess[str]:  # fmt: skip
    """`promtool test rules`: with `series` as input, `alert` at 15m is the alerts carrying `expected`'s labels."""
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump(rules, sort_keys=False))
    test = {
        "rule_files": ["rules.yaml"],
        "evaluation_interval": "1m",
        "tests": [{
            "interval": "1m",
            "input_series": series,
            "alert_rule_test": [{"eval_time": "15m", "alertname": alert,
                                 "exp_alerts": [{"exp_labels": labels} for labels in expected]}],
        }],
    }  # fmt: skip
    (tmp_path / "test.yaml").write_text(yaml.safe_dump(test, sort_keys=False))
    return subprocess.run([require_binary("promtool"), "test", "rules", "test.yaml"], cwd=tmp_path,
                          capture_output=True, text=True, check=False)  # fmt: skip


def rendered_rule(helm: str, alert: str) -> dict[str, Any]:  # noqa: F811
    """The rendered PrometheusRule's `alert` alone, as a plain rule file, without its annotations."""
    spec = only(render(helm, "alertmanager-config"), "PrometheusRule")["spec"]
    (rule,) = [r for g in spec["groups"] for r in g["rules"] if r.get("alert") == alert]
    rule = {key: value for key, value in rule.items() if key != "annotations"}  # promtool compares labels alone then
    return {"groups": [{"name": alert, "rules": [rule]}]}


def test_the_absent_alert_carries_the_namespace_the_alertmanagerconfig_routes_on(helm: str, tmp_path: Path) -> None:  # noqa: F811
    """No target of this release at all: the critical alert must reach the release's AlertmanagerConfig."""
    objects = render(helm, "alertmanager-config")
    assert only(objects, "AlertmanagerConfig")["metadata"]["namespace"] == NAMESPACE
    result = promtool_test(rendered_rule(helm, ABSENT), [], ABSENT, [THIS_RELEASE], tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr


def test_another_releases_target_does_not_hide_this_release_being_absent(helm: str, tmp_path: Path) -> None:  # noqa: F811
    """Another team's release, in another namespace, is up; this release's is gone: its alert still fires."""
    other = {"series": OTHER_RELEASE, "values": "1x30"}
    result = promtool_test(rendered_rule(helm, ABSENT), [other], ABSENT, [THIS_RELEASE], tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr


def test_another_releases_target_being_down_is_not_this_releases_alert(helm: str, tmp_path: Path) -> None:  # noqa: F811
    """Another namespace's target down fires that release's FairnessExporterDown, never a copy from this one's rule."""
    this = {"series": f'up{{job="fairness-exporter", namespace="{NAMESPACE}", instance="10.0.0.1:9108"}}',
            "values": "1x30"}
    result = promtool_test(rendered_rule(helm, DOWN), [this, {"series": OTHER_RELEASE, "values": "0x30"}], DOWN, [],
                           tmp_path)  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
