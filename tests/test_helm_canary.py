"""The chart's opt-in canary gates and audit CronJob (ci/canary-values.yaml).

kubernetes-validate has no schemas for Argo Rollouts' AnalysisTemplate or Flagger's MetricTemplate, so their shape
is checked here (their PromQL runs against a real Prometheus in test_canary_gate.py). The CronJob is a core object,
validated strictly with the other scenarios in test_helm.py; here its containers' commands run as the pod would
run them, against the rendered config.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
import yaml
from test_helm import CHART, CI, RELEASE, chart_values, daemon_config, helm, of_kind, only, render, run_helm

pytestmark = pytest.mark.helm
__all__ = ["helm"]  # the fixture, imported for this module's tests

CLI = Path(sys.executable).with_name("fairness-exporter")
CONFIG_PATH, AUDIT_LOG_DIR = "/etc/fairness-exporter/config.yaml", "/var/lib/fairness-audit"
CANARY_KINDS = {"AnalysisTemplate", "MetricTemplate", "CronJob"}


def cron_job(objects: list[dict[str, Any]]) -> dict[str, Any]:
    return only(objects, "CronJob")


def test_the_canary_objects_are_opt_in(helm: str) -> None:
    for scenario in sorted(set(CI) - {"canary"}):
        opted = {"CronJob"} if chart_values(scenario)["auditCronJob"]["enabled"] else set()  # ci/hardened's audit
        assert {obj["kind"] for obj in render(helm, scenario) if obj["kind"] in CANARY_KINDS} == opted, scenario
    assert {obj["kind"] for obj in render(helm, "canary")} >= CANARY_KINDS | {"PersistentVolumeClaim"}


def test_the_analysis_template_has_the_argo_rollouts_shape(helm: str) -> None:
    template = only(render(helm, "canary"), "AnalysisTemplate")
    values = chart_values("canary")["canary"]
    assert template["apiVersion"] == "argoproj.io/v1alpha1"
    assert template["metadata"]["namespace"] == values["argoRollouts"]["namespace"]
    assert set(template["spec"]) == {"args", "metrics"}
    # model-id has no default, so a Rollout must name it; model-version matches any version unless given
    assert template["spec"]["args"] == [{"name": "model-id"}, {"name": "model-version", "value": ".*"}]
    (metric,) = template["spec"]["metrics"]
    assert metric["name"] == "fairness"
    assert metric["interval"] == values["argoRollouts"]["measurement"]["interval"]
    assert set(metric) == {"name", "interval", "successCondition", "failureCondition", "provider"}
    (provider,) = metric["provider"].values()
    assert list(metric["provider"]) == ["prometheus"] and set(provider) == {"address", "query"}
    assert provider["address"] == values["prometheusAddress"]
    assert "{{args.model-id}}" in provider["query"] and "{{args.model-version}}" in provider["query"]


def test_the_measurement_takes_argo_rollouts_own_fields(helm: str) -> None:
    objects = render(helm, "canary", "--set-json", 'canary.argoRollouts.measurement={"count": 3, "interval": "2m", '
                     '"initialDelay": "10m", "inconclusiveLimit": 2}')  # fmt: skip
    (metric,) = only(objects, "AnalysisTemplate")["spec"]["metrics"]
    assert {k: metric[k] for k in ("count", "interval", "initialDelay", "inconclusiveLimit")} == {
        "count": 3, "interval": "2m", "initialDelay": "10m", "inconclusiveLimit": 2}


def test_the_metric_template_has_the_flagger_shape(helm: str) -> None:
    template = only(render(helm, "canary"), "MetricTemplate")
    assert template["apiVersion"] == "flagger.app/v1beta1"
    assert template["metadata"]["namespace"] == "monitoring"  # the release's, as the values leave it
    assert set(template["spec"]) == {"provider", "query"}
    assert template["spec"]["provider"] == {"type": "prometheus",
                                            "address": chart_values("canary")["canary"]["prometheusAddress"]}
    query = template["spec"]["query"]
    assert "{{ variables.model_id }}" in query and "{{ variables.model_version }}" in query and "args." not in query


def test_the_cron_job_audits_each_model_in_a_container_of_its_own(helm: str) -> None:
    objects = render(helm, "canary")
    job = cron_job(objects)
    values = chart_values("canary")["auditCronJob"]
    assert job["spec"]["schedule"] == values["schedule"] and job["spec"]["timeZone"] == values["timeZone"]
    assert job["spec"]["concurrencyPolicy"] == "Forbid"
    assert job["spec"]["jobTemplate"]["spec"]["backoffLimit"] == 0
    pod = job["spec"]["jobTemplate"]["spec"]["template"]["spec"]
    assert pod["restartPolicy"] == "Never" and pod["automountServiceAccountToken"] is False
    assert [c["name"] for c in pod["containers"]] == ["audit-hiring-screener-v2", "audit-hiring-screener-v3"]
    for entry, container in zip(values["models"], pod["containers"], strict=True):
        data = [entry["data"]] if "data" in entry else []  # none: the config's evaluation_dataset
        assert container["args"] == ["audit", CONFIG_PATH, *data, "--model", entry["model_id"],
                                     "--audit-log", f"{AUDIT_LOG_DIR}/audit-log.jsonl"]  # fmt: skip
        assert container["securityContext"]["readOnlyRootFilesystem"] is True
        mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
        assert mounts == {"/etc/fairness-exporter": "config", "/tmp": "tmp", AUDIT_LOG_DIR: "audit-log",
                          "/data": "eval-data"}  # fmt: skip
    volumes = {v["name"]: v for v in pod["volumes"]}
    config_maps = {cm["metadata"]["name"] for cm in of_kind(objects, "ConfigMap")}
    assert volumes["config"]["configMap"]["name"] in config_maps  # the daemon's own config file
    claim = only(objects, "PersistentVolumeClaim")
    assert volumes["audit-log"]["persistentVolumeClaim"]["claimName"] == claim["metadata"]["name"]
    assert claim["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"


def test_the_cron_job_gets_the_environment_the_config_references(helm: str) -> None:
    objects = render(helm, "kafka-sasl", "--set", "auditCronJob.enabled=true", "--set-json",
                     'auditCronJob.env=[{"name": "FAIRNESS_AUDIT_LOG_KEY", "valueFrom": {"secretKeyRef": '
                     '{"name": "audit-log-key", "key": "key"}}}]')  # fmt: skip
    (container,) = cron_job(objects)["spec"]["jobTemplate"]["spec"]["template"]["spec"]["containers"]
    daemon = next(c for c in objects if c["kind"] == "Deployment")["spec"]["template"]["spec"]["containers"][0]
    assert container["env"][: len(daemon.get("env", []))] == daemon.get("env", [])
    assert container["env"][-1]["name"] == "FAIRNESS_AUDIT_LOG_KEY"
    assert container.get("envFrom") == daemon.get("envFrom")
    # no data named: the config's evaluation_dataset
    assert container["args"][2:4] == ["--model", chart_values("kafka-sasl")["config"]["model_id"]]


def test_the_cron_job_reads_the_models_from_the_sidecar_of_model_configmaps(helm: str) -> None:
    objects = render(helm, "model-configmaps", "--set", "auditCronJob.enabled=true",
                     "--set", "auditCronJob.models[0].model_id=hiring-screener-v2")  # fmt: skip
    pod = cron_job(objects)["spec"]["jobTemplate"]["spec"]["template"]["spec"]
    (init,) = pod["initContainers"]
    assert {"name": "METHOD", "value": "LIST"} in init["env"]
    folder = chart_values("model-configmaps")["modelConfigMaps"]["folder"]
    assert {"name": "models", "mountPath": folder, "readOnly": True} in pod["containers"][0]["volumeMounts"]


def test_a_fleet_must_name_the_models_to_audit(helm: str) -> None:
    result = run_helm(helm, "template", RELEASE, str(CHART), "--values", str(CI["fleet"]),
                      "--set", "auditCronJob.enabled=true")  # fmt: skip
    assert result.returncode != 0 and "auditCronJob.models is required with a fleet" in result.stderr


def evaluation_rows(female_rate: float) -> pd.DataFrame:
    """400 men selected at 0.4 and 400 women at `female_rate`, young and old alike, shuffled."""
    frames = [pd.DataFrame({"gender": gender, "age": np.where(np.arange(400) % 2, "young", "old"),
                            "prediction": (np.arange(400) < rate * 400).astype(int)})
              for gender, rate in (("male", 0.4), ("female", female_rate))]  # fmt: skip
    return pd.concat(frames).sample(frac=1.0, random_state=5)


@pytest.mark.parametrize(("female_rate", "exit_code"), [(0.4, 0), (0.2, 1)])
def test_each_container_runs_the_audit_gate_as_rendered(helm: str, tmp_path: Path, female_rate: float,
                                                       exit_code: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """The containers' commands, with the pod's mounts mapped to local folders: a blocking failure is exit 1 for
    the Job, and every run lands in the one hash-chained audit log, which verifies. The first container names its
    data; the second reads its model's evaluation_dataset from the config."""
    monkeypatch.setenv("FAIRNESS_EXPORTER_POD_NAME", "audit-0")  # the downward API's, as the job's env says
    objects = render(helm, "canary")
    config = daemon_config(objects)
    for model in config["models"]:
        if "evaluation_dataset" in model:
            model["evaluation_dataset"] = model["evaluation_dataset"].replace("/data/", f"{tmp_path / 'data'}/", 1)
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(config))
    (tmp_path / "data").mkdir()
    evaluation_rows(female_rate).to_csv(tmp_path / "data" / "hiring-eval.csv", index=False)
    mapped = {CONFIG_PATH: str(tmp_path / "config.yaml"), "/data/": f"{tmp_path / 'data'}/",
              f"{AUDIT_LOG_DIR}/": f"{tmp_path}/"}  # fmt: skip
    containers = cron_job(objects)["spec"]["jobTemplate"]["spec"]["template"]["spec"]["containers"]
    for container in containers:
        args = [next((arg.replace(k, v, 1) for k, v in mapped.items() if arg.startswith(k)), arg)
                for arg in container["args"]]  # fmt: skip
        run = subprocess.run([str(CLI), *args], capture_output=True, text=True, cwd=tmp_path, check=False)
        assert run.returncode == exit_code, run.stderr
        report = json.loads(run.stdout)
        assert report["model_id"] == args[args.index("--model") + 1]
        assert report["verdict"] == ("PASS" if exit_code == 0 else "FAIL")
        assert report["data_file"] == str(tmp_path / "data" / "hiring-eval.csv")
    log = tmp_path / "audit-log.jsonl"
    records = [json.loads(line) for line in log.read_text().splitlines()]
    assert [(r["model_id"], r["model_version"]) for r in records] == [("hiring-screener-v2", "2.4.1"),
                                                                      ("hiring-screener-v3", "3.0.0")]  # fmt: skip
    verify = subprocess.run([str(CLI), "audit-log", "verify", str(log)], capture_output=True, text=True, check=False)
    assert verify.returncode == 0, verify.stdout + verify.stderr
