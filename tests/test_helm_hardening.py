"""The chart's hardening (ci/hardened-values.yaml): images pinned by digest with a valid version label, an opt-in
NetworkPolicy and PodDisruptionBudget that select the daemon's pods and not the audit CronJob's, the daemon as the
pod's first and default container, the full image for the audit CronJob; and checkov's image-pinning and
network-policy checks on every ci/ scenario rendered with those switches on.

The rendered objects are validated strictly by kubernetes-validate with the other scenarios in test_helm.py.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from test_helm import CHART, CI, NAMESPACE, RELEASE, chart_values, container, helm, of_kind, only, render, run_helm
from test_helm import workload as workload_of
from tooling import missing

pytestmark = pytest.mark.helm
__all__ = ["helm"]  # the fixture, imported for this module's tests

ROOT = Path(__file__).resolve().parent.parent
CHECKOV_VENV = ROOT / ".venv-checkov" / "bin" / "checkov"  # where `make test-deps` installs it
DAEMON = "fairness-exporter"
DEFAULT_CONTAINER = "kubectl.kubernetes.io/default-container"
LABEL_VALUE = re.compile(r"(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?")  # Kubernetes' label value syntax
HARDENED_VALUES = yaml.safe_load((CHART / "ci" / "hardened-values.yaml").read_text())
DIGESTS = {
    "image": HARDENED_VALUES["image"]["digest"],
    "modelConfigMaps.image": HARDENED_VALUES["modelConfigMaps"]["image"]["digest"],
    "auditCronJob.image": HARDENED_VALUES["auditCronJob"]["image"]["digest"],
}
HARDENING_FLAGS = (*(f for key, digest in DIGESTS.items() for f in ("--set", f"{key}.digest={digest}")),
                   "--set", "networkPolicy.enabled=true", "--set", "podDisruptionBudget.enabled=true")  # fmt: skip
CHECKS = ("CKV_K8S_43", "CKV2_K8S_6")  # image pinned by digest; every pod has a NetworkPolicy

Manifest = dict[str, Any]


def pod_specs(objects: list[Manifest]) -> list[tuple[Manifest, Manifest]]:
    """(pod template metadata, pod spec) of every workload and CronJob."""
    out = [(w["spec"]["template"]["metadata"], w["spec"]["template"]["spec"])
           for w in objects if w["kind"] in {"Deployment", "StatefulSet"}]  # fmt: skip
    out += [(j["spec"]["jobTemplate"]["spec"]["template"]["metadata"], j["spec"]["jobTemplate"]["spec"]["template"]
             ["spec"]) for j in of_kind(objects, "CronJob")]  # fmt: skip
    return out


def images(objects: list[Manifest]) -> list[str]:
    return [c["image"] for _, spec in pod_specs(objects) for c in [*spec.get("initContainers", []),
                                                                      *spec["containers"]]]  # fmt: skip


def selects(selector: Manifest, labels: dict[str, str]) -> bool:
    """Whether a LabelSelector selects these labels (matchLabels and matchExpressions, as the API evaluates them)."""
    if not selector.get("matchLabels", {}).items() <= labels.items():
        return False
    for expression in selector.get("matchExpressions", []):
        key, values = expression["key"], expression.get("values", [])
        outcome = {"In": key in labels and labels[key] in values, "NotIn": labels.get(key) not in values,
                   "Exists": key in labels, "DoesNotExist": key not in labels}[expression["operator"]]  # fmt: skip
        if not outcome:
            return False
    return True


def hardened(helm: str, *extra: str) -> list[Manifest]:
    return render(helm, "hardened", *extra)


def test_a_digest_pins_every_image_and_the_version_label_stays_the_tag(helm: str) -> None:
    objects = hardened(helm)
    values = chart_values("hardened")
    repository = values["image"]["repository"]
    assert container(objects)["image"] == f"{repository}@{DIGESTS['image']}"
    sidecar = f"{values['modelConfigMaps']['image']['repository']}@{DIGESTS['modelConfigMaps.image']}"
    assert container(objects, "models")["image"] == sidecar
    (audit,) = only(objects, "CronJob")["spec"]["jobTemplate"]["spec"]["template"]["spec"]["containers"]
    assert audit["image"] == f"{repository}@{DIGESTS['auditCronJob.image']}"  # the full image's own digest
    assert images(objects) and all("@sha256:" in image and ":0.1.0" not in image for image in images(objects))
    for obj in objects:
        assert obj["metadata"]["labels"]["app.kubernetes.io/version"] == values["image"]["tag"], obj["kind"]


def test_without_a_digest_the_images_are_pulled_by_tag_daemon_and_full(helm: str) -> None:
    objects = render(helm, "canary")
    app_version = yaml.safe_load((CHART / "Chart.yaml").read_text())["appVersion"]
    assert container(objects)["image"] == f"fairness-exporter:{app_version}"
    for audit in only(objects, "CronJob")["spec"]["jobTemplate"]["spec"]["template"]["spec"]["containers"]:
        assert audit["image"] == f"fairness-exporter:{app_version}-full"
        assert audit["imagePullPolicy"] == "IfNotPresent"  # image.pullPolicy's
    tagged = render(helm, "canary", "--set", "image.tag=0.2.0-rc.1", "--set", "auditCronJob.image.repository=r/full")
    assert container(tagged)["image"] == "fairness-exporter:0.2.0-rc.1"
    assert {c["image"] for c in only(tagged, "CronJob")["spec"]["jobTemplate"]["spec"]["template"]["spec"]
            ["containers"]} == {"r/full:0.2.0-rc.1-full"}  # fmt: skip


def test_the_version_label_is_a_valid_label_value_whatever_the_tag(helm: str) -> None:
    tag = "_v1.2.3+build.7-" + "x" * 60
    objects = render(helm, "default", "--set-string", f"image.tag={tag}")
    label = workload_of(objects)["metadata"]["labels"]["app.kubernetes.io/version"]
    assert LABEL_VALUE.fullmatch(label) and len(label) <= 63, label
    assert label.startswith("v1.2.3_build.7-x")
    assert container(objects)["image"] == f"fairness-exporter:{tag}"  # the image keeps the tag as given


@pytest.mark.parametrize(("scenario", "flags", "message"), [
    ("default", ("--set", "image.tag=0.1.0@sha256:" + "a" * 64),
     'image.tag "0.1.0@sha256:' + "a" * 64 + '" holds a digest: put it in image.digest (sha256:<64 hex digits>)'),
    ("default", ("--set", "image.digest=0.1.0"),
     'image.digest "0.1.0" is not a digest: expected sha256:<64 lowercase hex digits>'),
    ("canary", ("--set", "auditCronJob.image.digest=sha256:ABC"),
     'auditCronJob.image.digest "sha256:ABC" is not a digest'),
    ("model-configmaps", ("--set", "modelConfigMaps.image.tag=1.30.3@sha256:" + "b" * 64),
     "modelConfigMaps.image.tag \"1.30.3@sha256:" + "b" * 64
     + '" holds a digest: put it in modelConfigMaps.image.digest'),
])  # fmt: skip
def test_a_misplaced_or_malformed_digest_is_refused_in_one_line(helm: str, scenario: str, flags: tuple[str, ...],
                                                                message: str) -> None:  # fmt: skip
    result = run_helm(helm, "template", RELEASE, str(CHART), "--values", str(CI[scenario]), *flags)
    assert result.returncode != 0 and message in result.stderr, result.stderr


@pytest.mark.parametrize("scenario", sorted(CI))
def test_the_daemon_is_the_first_and_default_container(helm: str, scenario: str) -> None:
    """`kubectl logs` and `kubectl exec` land in the daemon, with the model ConfigMaps' sidecar beside it too."""
    metadata, spec = pod_specs([workload_of(render(helm, scenario))])[0]
    assert spec["containers"][0]["name"] == DAEMON
    assert metadata["annotations"][DEFAULT_CONTAINER] == DAEMON


def test_network_policy_and_disruption_budget_are_opt_in(helm: str) -> None:
    for scenario in sorted(set(CI) - {"hardened"}):
        kinds = {obj["kind"] for obj in render(helm, scenario)}
        assert not kinds & {"NetworkPolicy", "PodDisruptionBudget"}, scenario


def test_the_network_policy_lets_prometheus_in_and_the_daemon_out_to_brokers_dns_and_the_api(helm: str) -> None:
    objects = hardened(helm)
    policy = only(objects, "NetworkPolicy")["spec"]
    values = chart_values("hardened")["networkPolicy"]
    assert policy["policyTypes"] == ["Ingress", "Egress"]
    (ingress,) = policy["ingress"]
    assert ingress == {"ports": [{"port": "metrics", "protocol": "TCP"}], "from": values["metricsFrom"]}
    assert {"name": "metrics"}.items() <= container(objects)["ports"][0].items()  # the named port exists
    kafka, dns, api = policy["egress"]
    assert kafka == {"ports": [{"port": 9093, "protocol": "TCP"}, {"port": 9094, "protocol": "TCP"}],
                     "to": values["kafka"]["to"]}  # the ports of config.kafka.bootstrap_servers, once each
    assert dns == {"ports": [{"port": 53, "protocol": "UDP"}, {"port": 53, "protocol": "TCP"}],
                   "to": values["dns"]["to"]}  # fmt: skip
    assert api == {"ports": [{"port": 443, "protocol": "TCP"}, {"port": 6443, "protocol": "TCP"}]}  # the sidecar
    plain = render(helm, "kafka-sasl", "--set", "networkPolicy.enabled=true")
    kafka, dns = only(plain, "NetworkPolicy")["spec"]["egress"]  # no sidecar: no API server
    assert kafka == {"ports": [{"port": 9093, "protocol": "TCP"}]} and "to" not in dns
    listed = render(helm, "kafka-sasl", "--set", "networkPolicy.enabled=true",
                    "--set", "networkPolicy.kafka.ports={9092,19092}")  # fmt: skip
    assert only(listed, "NetworkPolicy")["spec"]["egress"][0]["ports"] == [{"port": 9092, "protocol": "TCP"},
                                                                           {"port": 19092, "protocol": "TCP"}]


def test_a_broker_without_a_port_is_refused_naming_the_values_key(helm: str) -> None:
    result = run_helm(helm, "template", RELEASE, str(CHART), "--values", str(CI["default"]),
                      "--set", "networkPolicy.enabled=true", "--set", "config.kafka.bootstrap_servers=kafka")
    assert result.returncode != 0
    assert 'config.kafka.bootstrap_servers entry "kafka" has no :port to allow; list the brokers\' ports in ' \
        "networkPolicy.kafka.ports" in result.stderr  # fmt: skip


@pytest.mark.parametrize("kind", ["NetworkPolicy", "PodDisruptionBudget"])
def test_the_policy_selects_the_daemons_pods_and_not_the_audit_jobs(helm: str, kind: str) -> None:
    objects = hardened(helm)
    spec = only(objects, kind)["spec"]
    selector = spec["podSelector"] if kind == "NetworkPolicy" else spec["selector"]
    (daemon, _), (audit, _) = pod_specs(objects)
    assert selects(selector, daemon["labels"])
    assert not selects(selector, audit["labels"])  # the audit reads object storage; a Job is no service to drain


def test_the_disruption_budget_takes_one_of_its_two_limits(helm: str) -> None:
    budget = only(hardened(helm), "PodDisruptionBudget")["spec"]
    assert budget["maxUnavailable"] == 1 and "minAvailable" not in budget
    assert budget["unhealthyPodEvictionPolicy"] == "AlwaysAllow"
    flipped = only(hardened(helm, "--set", "podDisruptionBudget.maxUnavailable=null",
                            "--set", "podDisruptionBudget.minAvailable=50%"), "PodDisruptionBudget")["spec"]
    assert flipped["minAvailable"] == "50%" and "maxUnavailable" not in flipped
    result = run_helm(helm, "template", RELEASE, str(CHART), "--values", str(CI["hardened"]),
                      "--set", "podDisruptionBudget.minAvailable=2")  # fmt: skip
    assert result.returncode != 0 and "set exactly one of minAvailable and maxUnavailable" in result.stderr


def checkov_binary() -> str:
    found = shutil.which("checkov") or (str(CHECKOV_VENV) if CHECKOV_VENV.is_file() else None)
    if found is None:
        missing("`checkov` is not installed (`make test-deps` puts it in .venv-checkov)")
    assert found is not None
    return found


def test_checkov_finds_every_image_pinned_and_every_pod_under_a_network_policy(helm: str, tmp_path: Path) -> None:
    """Every ci/ scenario rendered with the digests, the NetworkPolicy and the PodDisruptionBudget on, each as a
    release of its own (so one scenario's policy cannot cover another's pods in checkov's graph). Each check must
    have evaluated every file: a check that ran on nothing proves nothing."""
    checkov = checkov_binary()
    workloads = {}
    for scenario, values in CI.items():
        result = run_helm(helm, "template", scenario, str(CHART), "--namespace", NAMESPACE, "--values", str(values),
                          *HARDENING_FLAGS)  # fmt: skip
        assert result.returncode == 0, result.stderr
        (tmp_path / f"{scenario}.yaml").write_text(result.stdout)
        objects = [doc for doc in yaml.safe_load_all(result.stdout) if doc]
        workloads[scenario] = len([o for o in objects if o["kind"] in {"Deployment", "StatefulSet", "CronJob"}])
    run = subprocess.run([checkov, "--directory", str(tmp_path), "--framework", "kubernetes", "--output", "json",
                          "--skip-download", "--check", ",".join(CHECKS)],
                         capture_output=True, text=True, check=False, cwd=tmp_path)  # fmt: skip
    (report,) = [r for r in (lambda d: d if isinstance(d, list) else [d])(json.loads(run.stdout))
                 if r["check_type"] == "kubernetes"]  # fmt: skip
    failed = [(r["check_id"], r["file_path"], r["resource"]) for r in report["results"]["failed_checks"]]
    assert not failed and run.returncode == 0, failed
    passed: dict[str, dict[str, int]] = {}
    for result in report["results"]["passed_checks"]:
        scenario = Path(result["file_path"]).stem
        passed.setdefault(scenario, {}).setdefault(result["check_id"], 0)
        passed[scenario][result["check_id"]] += 1
    for scenario, count in workloads.items():
        assert passed.get(scenario, {}).get("CKV_K8S_43") == count, (scenario, passed.get(scenario))
        assert passed[scenario].get("CKV2_K8S_6", 0) >= 1, (scenario, passed[scenario])
