"""The Helm chart renders valid Kubernetes objects that run the daemon as docs/contract.md describes.

Every scenario in deploy/helm/fairness-exporter/ci/ is linted with `helm lint --strict`, rendered with
`helm template`, and its core objects validated with kubernetes-validate in strict mode. kubernetes-validate
has no schemas for the prometheus-operator CRDs (it only warns about them, it has no option to fail or skip), so
ServiceMonitor, PrometheusRule and AlertmanagerConfig are left out of that step and their shape is checked here
(Argo Rollouts' AnalysisTemplate and Flagger's MetricTemplate likewise, in test_helm_canary.py).
"""

from __future__ import annotations

import functools
import importlib
import json
import re
import subprocess
import tarfile
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import yaml
from tooling import missing, require_binary

pytestmark = pytest.mark.helm

ROOT = Path(__file__).resolve().parent.parent
CHART = ROOT / "deploy" / "helm" / "fairness-exporter"
RULES_FILE = ROOT / "rules" / "fairness-exporter.rules.yaml"
DASHBOARD_FILE = ROOT / "deploy" / "grafana" / "fairness.json"
ALERTMANAGER_FILE = ROOT / "deploy" / "alertmanager" / "alertmanager.yml"
CI_VALUES = sorted((CHART / "ci").glob("*-values.yaml"))
CI = {path.name.removesuffix("-values.yaml"): path for path in CI_VALUES}
RELEASE, NAMESPACE = "fx", "monitoring"
CRD_KINDS = {"ServiceMonitor", "PrometheusRule", "AlertmanagerConfig", "AnalysisTemplate", "MetricTemplate"}
WORKLOAD_KINDS = {"Deployment", "StatefulSet"}
RULE_KEYS = {"record", "alert", "expr", "for", "keep_firing_for", "labels", "annotations"}
# The oldest Kubernetes minor validated against, besides the newest one kubernetes-validate knows.
OLDEST_KUBERNETES = "1.28"
JOB_NAME = "fairness-exporter"  # docs/contract.md: scrape job name in the chart
ENV_REFERENCE = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")

Manifest = dict[str, Any]


@pytest.fixture(scope="session")
def helm() -> str:
    return require_binary("helm")


@pytest.fixture(scope="session")
def kubernetes_validate() -> ModuleType:
    try:
        return importlib.import_module("kubernetes_validate")
    except ImportError:
        missing("the `kubernetes-validate` package is not installed")
        raise


def run_helm(helm: str, *args: str) -> subprocess.CompletedProcess[str]:
    if not RULES_FILE.is_file():
        pytest.fail(
            f"{RULES_FILE.relative_to(ROOT)} is missing: the chart's files/fairness-exporter.rules.yaml "
            "symlink to it dangles and helm refuses to load the chart",
            pytrace=False,
        )
    return subprocess.run([helm, *args], capture_output=True, text=True, check=False)


@functools.cache
def _render(helm: str, args: tuple[str, ...]) -> tuple[Manifest, ...]:
    result = run_helm(helm, "template", RELEASE, str(CHART), "--namespace", NAMESPACE, *args)
    if result.returncode != 0:
        pytest.fail(f"helm template {' '.join(args)} failed:\n{result.stderr}", pytrace=False)
    return tuple(doc for doc in yaml.safe_load_all(result.stdout) if doc)


def render(helm: str, scenario: str, *extra: str) -> list[Manifest]:
    """The objects `helm template` renders for ci/<scenario>-values.yaml plus extra helm flags."""
    return list(_render(helm, ("--values", str(CI[scenario]), *extra)))


def chart_values(scenario: str) -> dict[str, Any]:
    """values.yaml overlaid with the scenario's file as Helm merges them (maps merge, the rest replaces)."""

    def merge(base: Any, overlay: Any) -> Any:
        if not (isinstance(base, dict) and isinstance(overlay, dict)):
            return overlay
        return base | {key: merge(base.get(key), value) for key, value in overlay.items()}

    defaults = yaml.safe_load((CHART / "values.yaml").read_text())
    return merge(defaults, yaml.safe_load(CI[scenario].read_text()))


def of_kind(objects: list[Manifest], kind: str) -> list[Manifest]:
    return [obj for obj in objects if obj["kind"] == kind]


def only(objects: list[Manifest], kind: str) -> Manifest:
    found = of_kind(objects, kind)
    assert len(found) == 1, f"expected one {kind}, got {[obj['metadata']['name'] for obj in found]}"
    return found[0]


def workload(objects: list[Manifest]) -> Manifest:
    found = [obj for obj in objects if obj["kind"] in WORKLOAD_KINDS]
    assert len(found) == 1, f"expected one Deployment or StatefulSet, got {[obj['kind'] for obj in found]}"
    return found[0]


def container(objects: list[Manifest], name: str = "fairness-exporter") -> Manifest:
    (found,) = [c for c in workload(objects)["spec"]["template"]["spec"]["containers"] if c["name"] == name]
    return found


def daemon_config(objects: list[Manifest]) -> dict[str, Any]:
    """The daemon's config file from the ConfigMap that the pod mounts."""
    volumes = workload(objects)["spec"]["template"]["spec"]["volumes"]
    (config_map_name,) = [v["configMap"]["name"] for v in volumes if v["name"] == "config"]
    (config_map,) = [cm for cm in of_kind(objects, "ConfigMap") if cm["metadata"]["name"] == config_map_name]
    config = yaml.safe_load(config_map["data"]["config.yaml"])
    assert isinstance(config, dict)
    return config


def dashboard_config_maps(objects: list[Manifest]) -> list[Manifest]:
    return [cm for cm in of_kind(objects, "ConfigMap") if "fairness-exporter.json" in cm.get("data", {})]


scenarios = pytest.mark.parametrize("scenario", sorted(CI))


def test_every_required_scenario_has_a_ci_values_file() -> None:
    assert {"default", "checkpoint-statefulset", "kafka-sasl", "monitoring-disabled"} <= set(CI)


@scenarios
def test_lint_strict_passes(helm: str, scenario: str) -> None:
    result = run_helm(helm, "lint", "--strict", str(CHART), "--values", str(CI[scenario]))
    assert result.returncode == 0, result.stdout + result.stderr


@scenarios
def test_core_objects_validate_strictly(helm: str, kubernetes_validate: ModuleType, scenario: str) -> None:
    core = [obj for obj in render(helm, scenario) if obj["kind"] not in CRD_KINDS]
    assert core
    for version in sorted({OLDEST_KUBERNETES, kubernetes_validate.latest_version()}):
        for obj in core:
            try:
                kubernetes_validate.validate(obj, version, strict=True)
            except kubernetes_validate.ValidationError as exc:
                path = ".".join(str(part) for part in exc.path)
                pytest.fail(f"{obj['kind']}/{obj['metadata']['name']} on {version}: {path}: {exc.message}")


@scenarios
def test_servicemonitor_selects_the_service_port(helm: str, scenario: str) -> None:
    objects = render(helm, scenario)
    for monitor in of_kind(objects, "ServiceMonitor"):
        service = only(objects, "Service")
        assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
        spec = monitor["spec"]
        assert spec["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
        assert service["metadata"]["namespace"] in spec["namespaceSelector"]["matchNames"]
        service_ports = {port["name"] for port in service["spec"]["ports"]}
        assert spec["endpoints"], "a ServiceMonitor without endpoints scrapes nothing"
        for endpoint in spec["endpoints"]:
            assert endpoint["port"] in service_ports
            assert endpoint["path"] == "/metrics"
            assert re.fullmatch(r"\d+[smh]", endpoint["interval"])


@scenarios
def test_servicemonitor_sets_the_contract_job_name(helm: str, scenario: str) -> None:
    for monitor in of_kind(render(helm, scenario), "ServiceMonitor"):
        (endpoint,) = monitor["spec"]["endpoints"]
        job_rules = [r for r in endpoint["relabelings"] if r["targetLabel"] == "job"]
        assert job_rules == [{"action": "replace", "targetLabel": "job", "replacement": JOB_NAME}]


@scenarios
def test_prometheusrule_has_operator_shape(helm: str, scenario: str) -> None:
    for rule in of_kind(render(helm, scenario), "PrometheusRule"):
        assert rule["apiVersion"] == "monitoring.coreos.com/v1"
        assert set(rule["spec"]) == {"groups"}
        assert rule["spec"]["groups"]
        for group in rule["spec"]["groups"]:
            assert isinstance(group["name"], str) and group["rules"]
            for entry in group["rules"]:
                assert len({"record", "alert"} & entry.keys()) == 1, entry
                assert isinstance(entry["expr"], str | int | float), entry
                assert entry.keys() <= RULE_KEYS, entry


def test_prometheusrule_spec_is_the_rules_file_spec_scoped_to_the_release(helm: str) -> None:
    """The rules file's spec, but each selector of the exporter's job selects the release's targets alone (its
    namespace: tests/test_helm_alert_scope.py), and nothing else differs."""
    rules = yaml.safe_load(RULES_FILE.read_text())
    shipped, scoped = f'job="{JOB_NAME}"', f'job="{JOB_NAME}", namespace="{NAMESPACE}"'
    rendered = only(render(helm, "default"), "PrometheusRule")["spec"]
    assert sum(t.count(scoped) for t in _strings(rendered)) == sum(t.count(shipped) for t in _strings(rules)) > 0
    assert _replaced(rendered, scoped, shipped) == rules["spec"]


def _strings(node: Any) -> list[str]:
    """Every string in a YAML document's values."""
    if isinstance(node, dict):
        return [s for value in node.values() for s in _strings(value)]
    if isinstance(node, list):
        return [s for value in node for s in _strings(value)]
    return [node] if isinstance(node, str) else []


def _replaced(node: Any, old: str, new: str) -> Any:
    """A YAML document with ``old`` replaced by ``new`` in every string value."""
    if isinstance(node, dict):
        return {key: _replaced(value, old, new) for key, value in node.items()}
    if isinstance(node, list):
        return [_replaced(value, old, new) for value in node]
    return node.replace(old, new) if isinstance(node, str) else node


def test_dashboard_configmap_holds_the_dashboard_file(helm: str) -> None:
    (config_map,) = dashboard_config_maps(render(helm, "default"))
    assert json.loads(config_map["data"]["fairness-exporter.json"]) == json.loads(DASHBOARD_FILE.read_text())
    assert config_map["metadata"]["labels"]["grafana_dashboard"] == "1"


def test_dashboard_labels_annotations_and_namespace_are_configurable(helm: str) -> None:
    (config_map,) = dashboard_config_maps(render(helm, "scale-out"))
    dashboard = chart_values("scale-out")["dashboard"]
    assert dashboard["labels"].items() <= config_map["metadata"]["labels"].items()
    assert config_map["metadata"]["annotations"] == dashboard["annotations"]
    assert config_map["metadata"]["namespace"] == dashboard["namespace"]


def test_additional_labels_reach_the_monitoring_objects(helm: str) -> None:
    objects = render(helm, "scale-out")
    values = chart_values("scale-out")
    for kind, key in [("ServiceMonitor", "serviceMonitor"), ("PrometheusRule", "prometheusRule")]:
        assert values[key]["additionalLabels"].items() <= only(objects, kind)["metadata"]["labels"].items()


def test_packaged_chart_contains_the_linked_files(helm: str, tmp_path: Path) -> None:
    result = run_helm(helm, "package", str(CHART), "--destination", str(tmp_path))
    assert result.returncode == 0, result.stderr
    (package,) = tmp_path.glob("fairness-exporter-*.tgz")
    with tarfile.open(package) as tar:
        for member, source in [
            ("fairness-exporter/files/fairness-exporter.rules.yaml", RULES_FILE),
            ("fairness-exporter/files/fairness.json", DASHBOARD_FILE),
        ]:
            packed = tar.extractfile(member)
            assert packed is not None, f"{member} is not a regular file in the package"
            assert packed.read() == source.read_bytes()


def test_monitoring_disabled_renders_no_monitoring_objects(helm: str) -> None:
    objects = render(helm, "monitoring-disabled")
    assert not of_kind(objects, "ServiceMonitor")
    assert not of_kind(objects, "PrometheusRule")
    assert not dashboard_config_maps(objects)


@pytest.mark.parametrize(
    ("switch", "kind"),
    [("serviceMonitor", "ServiceMonitor"), ("prometheusRule", "PrometheusRule"), ("dashboard", "dashboard")],
)
def test_each_monitoring_switch_removes_only_its_object(helm: str, switch: str, kind: str) -> None:
    objects = render(helm, "default", "--set", f"{switch}.enabled=false")

    def present(what: str) -> bool:
        return bool(dashboard_config_maps(objects) if what == "dashboard" else of_kind(objects, what))

    assert {what: present(what) for what in ["ServiceMonitor", "PrometheusRule", "dashboard"]} == {
        what: what != kind for what in ["ServiceMonitor", "PrometheusRule", "dashboard"]
    }


@scenarios
def test_statefulset_only_with_checkpoint(helm: str, scenario: str) -> None:
    objects = render(helm, scenario)
    enabled = chart_values(scenario)["checkpoint"]["enabled"]
    assert workload(objects)["kind"] == ("StatefulSet" if enabled else "Deployment")
    assert ("path" in daemon_config(objects).get("checkpoint", {})) == enabled


@pytest.mark.parametrize("path", ["/var/lib/fairness-exporter", "/data/fairness/checkpoints"])
def test_checkpoint_volume_is_mounted_where_the_config_writes(helm: str, path: str) -> None:
    objects = render(helm, "checkpoint-statefulset", "--set", f"checkpoint.path={path}")
    statefulset = only(objects, "StatefulSet")
    (claim,) = statefulset["spec"]["volumeClaimTemplates"]
    mounts = {m["name"]: m["mountPath"] for m in container(objects)["volumeMounts"]}
    assert mounts[claim["metadata"]["name"]] == path
    assert daemon_config(objects)["checkpoint"] == {"path": path, "interval": "30s"}
    assert claim["spec"]["resources"]["requests"]["storage"] == "2Gi"


@scenarios
def test_config_is_the_values_config(helm: str, scenario: str) -> None:
    values = chart_values(scenario)
    expected = dict(values["config"])
    fleet = bool(expected["models"]) or values["modelConfigMaps"]["enabled"]
    for key in ("model_id", "protected_attributes", *(() if expected["models"] else ("models",))) if fleet \
            else ("models",):  # fmt: skip
        del expected[key]
    if values["modelConfigMaps"]["enabled"]:
        expected["models_dir"] = values["modelConfigMaps"]["folder"]
    staged = values["replicaCount"] > 1
    expected["kafka"] = {**expected["kafka"], "stages": "staged" if staged else "direct"}
    if staged:
        expected["checkpoint"] = {"interval": values["checkpoint"]["interval"]}
        expected["kafka"]["internal_topics"] = {
            key: {"partitions": topic["partitions"], **{k: topic[k] for k in ("name", "retention") if topic[k]}}
            for key, topic in values["internalTopics"].items()}  # fmt: skip
    elif values["checkpoint"]["enabled"]:
        expected["checkpoint"] = {key: values["checkpoint"][key] for key in ("path", "interval")}
    if not staged and expected["kafka"].get("assignment", "subscribe") == "subscribe" and values["staticMembership"]:
        key = INSTANCE_KEY[expected["kafka"].get("client_library", "kafka-python")]
        expected["kafka"]["client"] = {key: "${FAIRNESS_EXPORTER_POD_NAME}", **expected["kafka"]["client"]}
    assert daemon_config(render(helm, scenario)) == expected


INSTANCE_KEY = {"kafka-python": "group_instance_id", "confluent-kafka": "group.instance.id"}


@pytest.mark.parametrize("library", ["kafka-python", "confluent-kafka"])
def test_a_direct_replica_is_a_static_member_named_by_its_pod(helm: str, library: str) -> None:
    """A container restarted in its pod takes its dead predecessor's member id and partitions at once (issue 38
    item 1; tests/test_restarts.py); not on the staged path, nor when the config names an instance itself."""
    objects = render(helm, "default", "--set", f"config.kafka.client_library={library}")
    assert daemon_config(objects)["kafka"]["client"][INSTANCE_KEY[library]] == "${FAIRNESS_EXPORTER_POD_NAME}"
    (pod_name,) = [e for e in container(objects)["env"] if e["name"] == "FAIRNESS_EXPORTER_POD_NAME"]
    assert pod_name["valueFrom"] == {"fieldRef": {"fieldPath": "metadata.name"}}
    own = INSTANCE_KEY[library].replace(".", "\\.")  # helm --set escapes a dot in a key
    for extra in (("--set", "replicaCount=3"), ("--set", "staticMembership=false"),
                  ("--set", "config.kafka.assignment=manual"), ("--set", f"config.kafka.client.{own}=mine")):
        objects = render(helm, "default", *extra)
        assert "FAIRNESS_EXPORTER_POD_NAME" not in yaml.safe_dump(objects), extra


@scenarios
def test_listen_port_is_the_container_port_and_service_target(helm: str, scenario: str) -> None:
    objects = render(helm, scenario)
    (port,) = container(objects)["ports"]
    assert daemon_config(objects)["listen"]["port"] == port["containerPort"]
    (service_port,) = only(objects, "Service")["spec"]["ports"]
    assert service_port["targetPort"] in (port["name"], port["containerPort"])


def test_listen_port_change_moves_container_port(helm: str) -> None:
    objects = render(helm, "default", "--set", "config.listen.port=9300")
    assert container(objects)["ports"][0]["containerPort"] == 9300
    assert daemon_config(objects)["listen"]["port"] == 9300


def test_pods_roll_when_the_config_changes(helm: str) -> None:
    def checksum(*extra: str) -> str:
        pod = workload(render(helm, "default", *extra))["spec"]["template"]
        return pod["metadata"]["annotations"]["checksum/config"]

    assert checksum() == checksum("--set", "replicaCount=1")
    assert checksum() != checksum("--set", "config.min_samples=50")


@scenarios
def test_replica_count_sets_workload_replicas(helm: str, scenario: str) -> None:
    assert workload(render(helm, scenario))["spec"]["replicas"] == chart_values(scenario)["replicaCount"]


@scenarios
def test_pod_runs_non_root_with_read_only_root_filesystem(helm: str, scenario: str) -> None:
    objects = render(helm, scenario)
    pod = workload(objects)["spec"]["template"]["spec"]
    main = container(objects)
    context = pod["securityContext"] | main["securityContext"]
    assert context["runAsNonRoot"] is True
    assert context["runAsUser"] > 0
    assert context["readOnlyRootFilesystem"] is True
    assert context["allowPrivilegeEscalation"] is False
    assert context["capabilities"]["drop"] == ["ALL"]
    assert context["seccompProfile"] == {"type": "RuntimeDefault"}
    assert pod["automountServiceAccountToken"] is False
    empty_dirs = {v["name"] for v in pod["volumes"] if "emptyDir" in v}
    assert any(m["mountPath"] == "/tmp" and m["name"] in empty_dirs for m in main["volumeMounts"])


@scenarios
def test_probes_hit_health_endpoints_on_the_metrics_port(helm: str, scenario: str) -> None:
    main = container(render(helm, scenario))
    scheme = "HTTPS" if chart_values(scenario)["webConfig"]["tls"] else "HTTP"  # the web config serves TLS
    for probe, path in [("startupProbe", "/healthz"), ("livenessProbe", "/healthz"), ("readinessProbe", "/readyz")]:
        assert main[probe]["httpGet"] == {"path": path, "port": "metrics", "scheme": scheme}


@scenarios
def test_the_startup_probe_outlasts_a_long_start_and_passes_a_quick_one_at_once(helm: str, scenario: str) -> None:
    """The port is bound after the checkpoint's restore and the estimation references' read: the liveness probe
    (40 s of failures) must not kill such a start, which the startup probe allows 5 minutes; and the startup probe
    asks often enough that a quick start (a crashed replica restarted) is first probed ready no later than before."""
    main = container(render(helm, scenario))
    startup, liveness, readiness = main["startupProbe"], main["livenessProbe"], main["readinessProbe"]

    def budget(probe: Manifest) -> int:
        return int(probe.get("initialDelaySeconds", 0) + probe["periodSeconds"] * probe["failureThreshold"])

    assert budget(startup) >= 300 > budget(liveness)
    assert startup["periodSeconds"] <= readiness["initialDelaySeconds"]


@scenarios
def test_every_env_reference_in_the_config_is_provided(helm: str, scenario: str) -> None:
    objects = render(helm, scenario)
    referenced = set(ENV_REFERENCE.findall(yaml.safe_dump(daemon_config(objects))))
    main = container(objects)
    named = {entry["name"] for entry in main.get("env", [])}
    # envFrom brings in names not visible here; it must at least be there for what env does not name.
    assert referenced <= named or main.get("envFrom"), f"{sorted(referenced - named)} have no source"


def test_kafka_password_comes_from_the_existing_secret(helm: str) -> None:
    objects = render(helm, "kafka-sasl")
    client = daemon_config(objects)["kafka"]["client"]
    assert client["sasl_plain_password"] == "${KAFKA_PASSWORD}"
    main = container(objects)
    (password,) = [entry for entry in main["env"] if entry["name"] == "KAFKA_PASSWORD"]
    assert password["valueFrom"]["secretKeyRef"] == {"name": "kafka-credentials", "key": "password"}
    assert {"secretRef": {"name": "kafka-username"}} in main["envFrom"]
    assert not of_kind(objects, "Secret"), "the chart reads an existing Secret, it never holds credentials"


def test_missing_model_id_is_rejected_naming_the_key(helm: str) -> None:
    result = run_helm(helm, "template", RELEASE, str(CHART))
    assert result.returncode != 0
    assert "config.model_id is required" in result.stderr


def test_config_checkpoint_is_rejected_in_favour_of_the_checkpoint_block(helm: str) -> None:
    result = run_helm(
        helm,
        "template",
        RELEASE,
        str(CHART),
        "--values",
        str(CI["default"]),
        "--set",
        "config.checkpoint.path=/x",
    )
    assert result.returncode != 0
    assert "use checkpoint.enabled" in result.stderr


@scenarios
def test_rendered_config_is_accepted_by_the_daemon(helm: str, scenario: str, monkeypatch: pytest.MonkeyPatch,
                                                   tmp_path: Path) -> None:  # fmt: skip
    """The ConfigMap is not just YAML: the daemon's own validator accepts it (secrets come from the env)."""
    from exporter.config import parse_config

    raw = daemon_config(render(helm, scenario))
    for name in re.findall(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}", json.dumps(raw)):
        monkeypatch.setenv(name, "from-a-secret")
    if "models_dir" in raw:  # what the sidecar writes there: one model file per labelled ConfigMap
        folder = tmp_path / "models"
        folder.mkdir()
        (folder / "hiring.yaml").write_text(yaml.safe_dump({"model_id": "hiring-screener-v2", "protected_attributes": [
            {"name": "gender", "groups": ["male", "female"]}]}))  # fmt: skip
        raw["models_dir"] = str(folder)
    config = parse_config(raw, f"{scenario} ConfigMap")
    assert config.models
    assert config.listen_port == container(render(helm, scenario))["ports"][0]["containerPort"]


MATCHER = re.compile(r'^(\w+)(=~|!~|!=|=)"(.*)"$')
ROUTE_KEYS = {"receiver": "receiver", "group_by": "groupBy", "group_wait": "groupWait",
              "group_interval": "groupInterval", "repeat_interval": "repeatInterval"}  # fmt: skip


def crd_matchers(matchers: list[str]) -> list[dict[str, str]]:
    """Alertmanager's `name=~"value"` matcher strings in the AlertmanagerConfig CRD's shape."""
    parsed = [MATCHER.match(m) for m in matchers]
    assert all(parsed), matchers
    return [{"name": m[1], "matchType": m[2], "value": m[3]} for m in parsed if m]


def crd_route(route: dict[str, Any]) -> dict[str, Any]:
    converted = {crd: route[key] for key, crd in ROUTE_KEYS.items() if key in route}
    if "matchers" in route:
        converted["matchers"] = crd_matchers(route["matchers"])
    if "routes" in route:
        converted["routes"] = [crd_route(child) for child in route["routes"]]
    return converted


def test_alertmanagerconfig_is_off_by_default(helm: str) -> None:
    assert not of_kind(render(helm, "default"), "AlertmanagerConfig")


def test_alertmanagerconfig_routes_as_the_shipped_alertmanager_yml(helm: str) -> None:
    """Same routes, matchers, grouping, timers, inhibitions and receiver names as deploy/alertmanager/."""
    plain = yaml.safe_load(ALERTMANAGER_FILE.read_text())
    crd = only(render(helm, "alertmanager-config"), "AlertmanagerConfig")
    assert crd["apiVersion"] == "monitoring.coreos.com/v1alpha1"
    assert crd["metadata"]["labels"]["alertmanagerConfig"] == "fairness"
    assert crd["spec"]["route"] == crd_route(plain["route"])
    assert crd["spec"]["inhibitRules"] == [
        {"sourceMatch": crd_matchers(rule["source_matchers"]), "targetMatch": crd_matchers(rule["target_matchers"]),
         "equal": rule["equal"]} for rule in plain["inhibit_rules"]
    ]  # fmt: skip
    assert [r["name"] for r in crd["spec"]["receivers"]] == [r["name"] for r in plain["receivers"]]


def test_alertmanagerconfig_receivers_come_from_values(helm: str) -> None:
    crd = only(render(helm, "alertmanager-config"), "AlertmanagerConfig")
    page = next(r for r in crd["spec"]["receivers"] if r["name"] == "fairness-page")
    assert page == {"name": "fairness-page",
                    "pagerdutyConfigs": [{"routingKey": {"name": "pagerduty-fairness", "key": "routing-key"}}]}


@scenarios
def test_more_than_one_replica_runs_the_staged_path_with_the_internal_topics_of_the_values(helm: str,
                                                                                          scenario: str) -> None:
    """Above one replica each model must live whole on one of them (kafka.stages: staged); one runs direct."""
    values = chart_values(scenario)
    kafka = daemon_config(render(helm, scenario))["kafka"]
    assert kafka["stages"] == ("staged" if values["replicaCount"] > 1 else "direct")
    assert ("internal_topics" in kafka) == (values["replicaCount"] > 1)


@scenarios
def test_a_direct_deployment_is_recreated_not_surged(helm: str, scenario: str) -> None:
    """A surge pod of the direct path would join the old pod's consumer group and refuse to start (two direct
    replicas never share a group), stalling the rollout: the old pod goes first. The staged path rolls as usual;
    a StatefulSet replaces its pods one at a time anyway."""
    objects = render(helm, scenario)
    found = workload(objects)
    staged = daemon_config(objects)["kafka"]["stages"] == "staged"
    if found["kind"] == "Deployment":
        assert found["spec"].get("strategy") == (None if staged else {"type": "Recreate"})


def test_the_staged_path_refuses_a_checkpoint_volume(helm: str) -> None:
    result = run_helm(helm, "template", RELEASE, str(CHART), "--values", str(CI["checkpoint-statefulset"]),
                      "--set", "replicaCount=2")  # fmt: skip
    assert result.returncode != 0
    assert "the state lives in the internal topics" in result.stderr


def test_a_fleet_renders_from_values_with_the_top_level_keys_as_defaults(helm: str,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    from exporter.config import parse_config

    monkeypatch.setenv("FAIRNESS_EXPORTER_POD_NAME", "fairness-exporter-0")  # the downward API's, in the pod
    config = parse_config(daemon_config(render(helm, "fleet")), "fleet ConfigMap")
    assert config.model_ids == ("hiring-screener-v2", "credit-scorer-v4", "content-moderation-v5")
    hiring, credit, _ = config.models
    assert hiring.min_samples == credit.min_samples == 50
    assert [m.name for m in hiring.metrics] == ["demographic_parity_difference", "equalised_odds_difference",
                                                "disparate_impact_ratio"]  # the chart's metrics: the default
    assert [(m.name, m.severity) for m in credit.metrics] == [("disparate_impact_ratio", "blocking")]


def test_model_configmaps_run_the_sidecar_with_a_token_of_its_own(helm: str) -> None:
    objects = render(helm, "model-configmaps")
    pod = workload(objects)["spec"]["template"]["spec"]
    (init,) = pod["initContainers"]
    sidecar, daemon = container(objects, "models"), container(objects)
    values = chart_values("model-configmaps")["modelConfigMaps"]
    for copier, method in ((init, "LIST"), (sidecar, "WATCH")):
        env = {e["name"]: e["value"] for e in copier["env"]}
        assert env == {"LABEL": values["label"], "LABEL_VALUE": "true", "FOLDER": values["folder"],
                       "RESOURCE": "configmap", "METHOD": method}  # fmt: skip
        mounts = {m["name"]: m for m in copier["volumeMounts"]}
        assert mounts["models"]["mountPath"] == values["folder"] and not mounts["models"].get("readOnly")
        assert mounts["sidecar-token"]["mountPath"] == "/var/run/secrets/kubernetes.io/serviceaccount"
    daemon_mounts = {m["name"]: m for m in daemon["volumeMounts"]}
    assert daemon_mounts["models"] == {"name": "models", "mountPath": values["folder"], "readOnly": True}
    assert "sidecar-token" not in daemon_mounts and pod["automountServiceAccountToken"] is False
    assert daemon_config(objects)["models_dir"] == values["folder"]
    role, binding = only(objects, "Role"), only(objects, "RoleBinding")
    assert role["rules"] == [{"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get", "list", "watch"]}]
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": pod["serviceAccountName"],
                                    "namespace": NAMESPACE}]  # fmt: skip
    assert binding["roleRef"]["name"] == role["metadata"]["name"]
    cluster = render(helm, "model-configmaps", "--set", "modelConfigMaps.namespace=ALL")
    assert only(cluster, "ClusterRole")["rules"] == role["rules"] and not of_kind(cluster, "Role")
    assert {"name": "NAMESPACE", "value": "ALL"} in container(cluster, "models")["env"]


def test_one_model_beside_a_fleet_is_refused(helm: str) -> None:
    result = run_helm(helm, "template", RELEASE, str(CHART), "--values", str(CI["fleet"]),
                      "--set", "config.model_id=x")  # fmt: skip
    assert result.returncode != 0 and "with config.models or modelConfigMaps, each model names its own" in \
        result.stderr  # fmt: skip


def test_a_web_config_secret_is_mounted_passed_to_the_daemon_and_scraped_with_its_credentials(helm: str) -> None:
    objects = render(helm, "web-config")
    main = container(objects)
    assert main["args"][-2:] == ["--web.config.file", "/etc/fairness-exporter/web/web-config.yml"]
    (mount,) = [m for m in main["volumeMounts"] if m["name"] == "web-config"]
    assert mount == {"name": "web-config", "mountPath": "/etc/fairness-exporter/web", "readOnly": True}
    volumes = workload(objects)["spec"]["template"]["spec"]["volumes"]
    assert {"name": "web-config", "secret": {"secretName": "fairness-exporter-web"}} in volumes
    assert main["livenessProbe"]["httpGet"]["scheme"] == main["readinessProbe"]["httpGet"]["scheme"] == "HTTPS"
    (endpoint,) = only(objects, "ServiceMonitor")["spec"]["endpoints"]
    values = chart_values("web-config")["serviceMonitor"]
    assert endpoint["scheme"] == "https"
    assert endpoint["tlsConfig"] == values["tlsConfig"] and endpoint["basicAuth"] == values["basicAuth"]
    plain = render(helm, "default")
    assert "--web.config.file" not in container(plain)["args"]
    assert not [v for v in workload(plain)["spec"]["template"]["spec"]["volumes"] if v["name"] == "web-config"]
    assert "basicAuth" not in only(plain, "ServiceMonitor")["spec"]["endpoints"][0]
