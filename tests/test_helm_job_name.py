"""`serviceMonitor.jobName` renames the scraped job, and everything the chart renders selects the job it names.

values.yaml offers `serviceMonitor.jobName` ("The `job` label of the scraped series") and the ServiceMonitor
relabels `job` to it. The rule file and the dashboard select `job="fairness-exporter"`; the chart's PrometheusRule
(FairnessExporterDown, FairnessExporterAbsent) and its dashboard's "Replicas up" panel select the configured name
instead. Were they to keep the shipped one, any other jobName would leave FairnessExporterAbsent firing for ever
(critical), FairnessExporterDown unable to fire, and the dashboard showing no replica up.
"""

from __future__ import annotations

import json
import re

import pytest
from test_helm import helm, of_kind, only, render  # noqa: F401  (helm: the fixture)

pytestmark = pytest.mark.helm

JOB = "fx-screener"
JOB_MATCHER = re.compile(r'\bjob\s*=~?\s*"([^"]*)"')
RENAMED = ("--set", f"serviceMonitor.jobName={JOB}")


def test_the_servicemonitor_scrapes_under_the_configured_job_name(helm: str) -> None:  # noqa: F811
    """The premise: the knob does rename the job of every scraped series."""
    (endpoint,) = only(render(helm, "default", *RENAMED), "ServiceMonitor")["spec"]["endpoints"]
    assert {"action": "replace", "targetLabel": "job", "replacement": JOB} in endpoint["relabelings"]


def test_the_rendered_alerts_select_the_configured_job_name(helm: str) -> None:  # noqa: F811
    spec = only(render(helm, "default", *RENAMED), "PrometheusRule")["spec"]
    selected = {
        (rule.get("alert") or rule.get("record"), job)
        for group in spec["groups"]
        for rule in group["rules"]
        for job in JOB_MATCHER.findall(str(rule["expr"]))
    }
    assert selected, "no rule selects a job: FairnessExporterDown and FairnessExporterAbsent select up{job=...}"
    wrong = sorted(entry for entry in selected if entry[1] != JOB)
    assert not wrong, f"with serviceMonitor.jobName={JOB} these rules select another job: {wrong}"


def test_the_rendered_dashboard_selects_the_configured_job_name(helm: str) -> None:  # noqa: F811
    objects = render(helm, "default", *RENAMED)
    (config_map,) = [cm for cm in of_kind(objects, "ConfigMap") if "dashboard" in cm["metadata"]["name"]]
    (dashboard,) = [json.loads(text) for text in config_map["data"].values()]
    exprs = [target.get("expr", "") for panel in dashboard["panels"] for target in panel.get("targets", [])]
    jobs = {job for expr in exprs for job in JOB_MATCHER.findall(expr)}
    assert jobs, "the dashboard selects no job (its 'Replicas up' panel counts up{job=...})"
    assert jobs == {JOB}, f"with serviceMonitor.jobName={JOB} the dashboard selects job {sorted(jobs)}"
