"""The chart's canary gates and the dashboard's fleet row on a real Prometheus scraping one daemon that reads the
real broker.

The daemon runs the config the chart renders for its canary scenario (ci/canary-values.yaml: a stable
hiring-screener-v2 and its canary hiring-screener-v3 in one fleet), plus two models of the test's own. The stable
model's traffic is fair; the canary's drifts (men selected at 0.5, women at 0.2). The queries are the exact strings
of the rendered AnalysisTemplate and MetricTemplate, with their placeholders filled in as Argo Rollouts and Flagger
fill them, and Argo's success and failure conditions are evaluated as written, by Argo's own rule for combining them.
The fleet row's queries are the dashboard's, with its variables set as Grafana sets them.
"""

from __future__ import annotations

import re
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import orjson
import pytest
from broker_fixture import produce
from dashboard_queries import DEFAULT_VARIABLES, fleet_panels, load_dashboard, substitute
from prometheus_fixture import PrometheusServer, wait_until
from test_helm import daemon_config, helm, only, render

from exporter.config import parse_config
from exporter.daemon import Daemon
from exporter.devtools.embedded_broker import EmbeddedBroker

pytestmark = [pytest.mark.prometheus, pytest.mark.helm]
__all__ = ["helm"]  # the fixture, imported for this module's tests

STABLE, CANARY = "hiring-screener-v2", "hiring-screener-v3"
DRIFTING_BESIDE_A_GAP = "credit-scorer-v1"  # drifts on gender; its region pair never has a value
STARVED = "fraud-detector-v1"  # 10 events: too few for any comparison
ARGO_PLACEHOLDER = re.compile(r"\{\{\s*args\.([\w-]+)\s*\}\}")
FLAGGER_PLACEHOLDER = re.compile(r"\{\{\s*variables\.(\w+)\s*\}\}")
BUCKET_SECONDS = 5
# What an Argo condition may contain for the translation below to mean what expr-lang means.
CONDITION = re.compile(r"(?:len\(result\)|result\[\d+\]|[<>=!]=?|&&|\|\||\d+(?:\.\d+)?|\s)+")


def rows(model_id: str, rates: dict[str, float], n: int, extra: dict[str, list[str]] | None = None) -> list[bytes]:
    """n events per gender at the given selection rates (exactly), young and old alike; `extra` attributes cycle."""
    events = []
    for gender, rate in rates.items():
        for i in range(n):
            attributes = {"gender": gender, "age": "young" if i % 2 else "old"}
            attributes.update({name: values[i % len(values)] for name, values in (extra or {}).items()})
            events.append({"model_id": model_id, "prediction_id": f"{model_id}-{gender}-{i}", "timestamp": time.time(),
                           "prediction": int(i < rate * n), "attributes": attributes})  # fmt: skip
    order = np.random.default_rng(3).permutation(len(events))
    return [orjson.dumps(events[i]) for i in order]


@dataclass
class Stack:
    prometheus: PrometheusServer
    objects: list[dict[str, Any]]

    def vector(self, query: str) -> list[float]:
        return [float(s["value"][1]) for s in self.prometheus.query(query)]


@pytest.fixture(scope="module")
def stack(helm: str, kafka_broker: EmbeddedBroker, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    objects = render(helm, "canary")
    raw = daemon_config(objects)
    topic = f"canary-{uuid.uuid4().hex[:8]}"
    kafka_broker.create_topic(topic, partitions=3)
    raw["kafka"] = {"bootstrap_servers": kafka_broker.bootstrap_servers, "topic": topic, "assignment": "manual",
                    "group_id": f"g-{topic}"}  # fmt: skip
    raw.update(listen={"address": "127.0.0.1", "port": 0}, evaluation_interval="1s", bucket=f"{BUCKET_SECONDS}s")
    raw["models"] += [
        {"model_id": DRIFTING_BESIDE_A_GAP, "protected_attributes": [
            {"name": "gender", "groups": ["male", "female"]}, {"name": "region", "groups": ["north", "south"]}]},
        {"model_id": STARVED, "protected_attributes": [{"name": "gender", "groups": ["male", "female"]}]},
    ]  # fmt: skip
    daemon = Daemon(parse_config(raw, "the chart's canary ConfigMap"))
    daemon.start()
    try:
        with PrometheusServer(tmp_path_factory.mktemp("prometheus"), [f"127.0.0.1:{daemon.port}"]) as prometheus:
            events = (rows(STABLE, {"male": 0.4, "female": 0.4}, 1000)
                      + rows(CANARY, {"male": 0.5, "female": 0.2}, 1000)
                      + rows(DRIFTING_BESIDE_A_GAP, {"male": 0.8, "female": 0.1}, 100, {"region": ["north"]})
                      + rows(STARVED, {"male": 0.5, "female": 0.5}, 5))  # fmt: skip
            events = [events[i] for i in np.random.default_rng(5).permutation(len(events))]
            # nine events in ten in one bucket, the rest in the next: a step is a bucket the events have left, so
            # the detectors step over the first part when the rest comes (the windows count both)
            first = len(events) * 9 // 10
            produce(kafka_broker.bootstrap_servers, topic, events[:first])
            time.sleep(BUCKET_SECONDS + 0.5)
            now = time.time()
            produce(kafka_broker.bootstrap_servers, topic,
                    [orjson.dumps({**orjson.loads(e), "timestamp": now}) for e in events[first:]])
            counted = 'model_subgroup_samples{model_id="%s", attribute="gender", subgroup="overall", window="1h"} == %d'
            for model_id, n in ((STABLE, 2000), (CANARY, 2000), (DRIFTING_BESIDE_A_GAP, 200), (STARVED, 10)):
                expr = counted % (model_id, n)
                wait_until(lambda expr=expr: prometheus.query(expr), 60, f"{model_id}'s events scraped")
            yield Stack(prometheus, objects)
    finally:
        daemon.stop()


def fill(query: str, placeholder: re.Pattern[str], values: dict[str, str]) -> str:
    """The query as the rollout tool sends it: every placeholder replaced by its value (all of them given)."""
    assert set(placeholder.findall(query)) == set(values), placeholder.findall(query)
    filled = placeholder.sub(lambda m: values[m[1]], query)
    assert "{{" not in filled
    return filled


def condition(expression: str, result: list[float]) -> bool:
    """An Argo Rollouts condition (expr-lang) on a Prometheus vector, for the operators it is written with."""
    assert CONDITION.fullmatch(expression), expression
    python = expression.replace("&&", " and ").replace("||", " or ")
    return bool(eval(python, {"__builtins__": {}}, {"len": len, "result": result}))  # the grammar is checked above


def argo_phase(stack: Stack, model_id: str, model_version: str | None = None) -> tuple[str, list[float]]:
    """The phase Argo Rollouts gives one measurement of the AnalysisTemplate's metric, and the vector it read."""
    template = only(stack.objects, "AnalysisTemplate")["spec"]
    (metric,) = template["metrics"]
    args = {a["name"]: a.get("value") for a in template["args"]}
    args.update({"model-id": model_id, **({"model-version": model_version} if model_version else {})})
    result = stack.vector(fill(metric["provider"]["prometheus"]["query"], ARGO_PLACEHOLDER, args))
    failed, succeeded = condition(metric["failureCondition"], result), condition(metric["successCondition"], result)
    return ("Failed" if failed else "Successful" if succeeded else "Inconclusive"), result


def flagger_check(stack: Stack, model_id: str, model_version: str = ".*") -> tuple[str, float | None]:
    """A Flagger check with thresholdRange {max: 0}: the last series' value, "halt" when there is none."""
    query = only(stack.objects, "MetricTemplate")["spec"]["query"]
    result = stack.vector(fill(query, FLAGGER_PLACEHOLDER, {"model_id": model_id, "model_version": model_version}))
    if not result:
        return "halt: no values found", None
    return ("pass" if result[-1] <= 0 else "fail"), result[-1]


def test_the_argo_analysis_fails_the_drifting_canary_and_passes_the_stable_model(stack: Stack) -> None:
    # two blocking comparisons of the canary (male vs female, demographic parity, in the 1h and 24h windows) fail
    # at once; the two detectors of that pair (parity and impact ratio, men higher) go into alarm as they step
    assert argo_phase(stack, CANARY)[0] == "Failed"
    wait_until(lambda: argo_phase(stack, CANARY, "3.0.0")[1] == [4.0], 60, "the canary's detectors in alarm")
    assert argo_phase(stack, STABLE) == ("Successful", [0.0])
    assert argo_phase(stack, STABLE, "2.4.1") == ("Successful", [0.0])


def test_the_flagger_metric_fails_the_drifting_canary_and_passes_the_stable_model(stack: Stack) -> None:
    wait_until(lambda: flagger_check(stack, CANARY) == ("fail", 4.0), 60, "the canary's detectors in alarm")
    assert flagger_check(stack, CANARY, "3.0.0") == ("fail", 4.0)
    assert flagger_check(stack, STABLE) == ("pass", 0.0)


def test_a_failure_is_reported_while_another_blocking_comparison_has_no_value(stack: Stack) -> None:
    phase, result = argo_phase(stack, DRIFTING_BESIDE_A_GAP)
    assert phase == "Failed" and result[0] >= 2  # its gender pair fails in both windows; north vs south is empty
    assert flagger_check(stack, DRIFTING_BESIDE_A_GAP)[0] == "fail"


@pytest.mark.parametrize(("model_id", "version"), [(STARVED, ".*"), (CANARY, "2.4.1"), ("not-monitored", ".*")])
def test_no_verdict_without_evidence_of_the_version_the_canary_serves(stack: Stack, model_id: str,
                                                                       version: str) -> None:  # fmt: skip
    """Too few events for any comparison, a version the daemon does not count, a model id it does not monitor: no
    value, which Argo takes as inconclusive (the rollout pauses) and Flagger as a failed check, never a pass."""
    assert argo_phase(stack, model_id, version) == ("Inconclusive", [])
    assert flagger_check(stack, model_id, version) == ("halt: no values found", None)


def test_the_two_tools_send_the_same_query(stack: Stack) -> None:
    argo = only(stack.objects, "AnalysisTemplate")["spec"]["metrics"][0]["provider"]["prometheus"]["query"]
    flagger = only(stack.objects, "MetricTemplate")["spec"]["query"]
    values = {"model_id": CANARY, "model_version": "3.0.0"}
    assert fill(argo, ARGO_PLACEHOLDER, {"model-id": CANARY, "model-version": "3.0.0"}) == \
        fill(flagger, FLAGGER_PLACEHOLDER, values)  # fmt: skip


def fleet(stack: Stack, title: str, models: str = ".*") -> dict[str, dict[frozenset[tuple[str, str]], float]]:
    """Each query of a fleet panel (by refId) as Grafana runs it in the 1h window: {labels: value}."""
    (panel,) = [p for p in fleet_panels(load_dashboard()) if p["title"] == title]
    variables = {**DEFAULT_VARIABLES, "window": "1h", "models": models}
    return {t["refId"]: stack.prometheus.values(substitute(t["expr"], variables)) for t in panel["targets"]}


def by_model(series: dict[frozenset[tuple[str, str]], float], *keys: str) -> dict[tuple[str, ...], float]:
    """{(model_id, *keys): value}; a label Prometheus does not store (an empty one) reads as the empty string."""
    return {tuple(dict(labels).get(k, "") for k in ("model_id", *keys)): value for labels, value in series.items()}


def test_the_fleet_shows_each_models_worst_comparison_with_its_interval_threshold_and_evidence(stack: Stack) -> None:
    wait_until(lambda: argo_phase(stack, CANARY)[1] == [4.0], 60, "the canary's detectors in alarm")
    table = fleet(stack, "Fleet: each model's worst comparison per metric", f"{STABLE}|{CANARY}")
    worst = by_model(table["A"], "metric")
    # no labels in the traffic: equalised odds has no value anywhere, so it has no worst comparison
    assert worst == {(STABLE, "demographic_parity_difference"): 0.0, (STABLE, "disparate_impact_ratio"): 1.0,
                     (CANARY, "demographic_parity_difference"): pytest.approx(0.3),
                     (CANARY, "disparate_impact_ratio"): pytest.approx(0.4)}  # fmt: skip
    canary_dp = next(labels for labels in table["A"] if ("model_id", CANARY) in labels
                     and ("metric", "demographic_parity_difference") in labels)  # fmt: skip
    assert {("attribute", "gender"), ("dimension", "male_vs_female"), ("window", "1h")} <= canary_dp
    # every query answers for the same comparisons, so the table joins them row by row
    for ref in "BCD":
        assert set(table[ref]) == set(table["A"]), ref
    assert {labels - {("severity", dict(labels)["severity"])} for labels in table["E"]} == set(table["A"])
    for labels, value in table["A"].items():
        assert table["B"][labels] <= value <= table["C"][labels]
    assert by_model(table["D"], "metric") == {(STABLE, "demographic_parity_difference"): 0.0,
                                              (STABLE, "disparate_impact_ratio"): 0.0,
                                              (CANARY, "demographic_parity_difference"): 2.0,
                                              (CANARY, "disparate_impact_ratio"): 2.0}  # pass 0, fail 2  # fmt: skip
    assert by_model(table["E"], "metric", "severity") == {
        (model, "demographic_parity_difference", "blocking"): 0.05 for model in (STABLE, CANARY)} | {
        (model, "disparate_impact_ratio", "warning"): 0.8 for model in (STABLE, CANARY)}  # fmt: skip


def test_the_fleet_shows_versions_traffic_labels_alarms_and_failures_per_model(stack: Stack) -> None:
    wait_until(lambda: argo_phase(stack, CANARY)[1] == [4.0], 60, "the canary's detectors in alarm")
    table = fleet(stack, "Fleet: version, traffic, labels and alarms per model")
    assert by_model(table["A"], "model_version") == {(STABLE, "2.4.1"): 1, (CANARY, "3.0.0"): 1,
                                                     (DRIFTING_BESIDE_A_GAP, ""): 1, (STARVED, ""): 1}  # fmt: skip
    assert by_model(table["B"]) == {(STABLE,): 2000, (CANARY,): 2000, (DRIFTING_BESIDE_A_GAP,): 200, (STARVED,): 10}
    assert set(by_model(table["C"]).values()) == {0.0}  # no event carries a label
    assert by_model(table["D"])[(STABLE,)] == 0 and by_model(table["D"])[(CANARY,)] == 2
    assert by_model(table["E"])[(STABLE,)] == 0 and by_model(table["E"])[(CANARY,)] == 1  # 1h: parity
    assert by_model(table["F"])[(CANARY,)] == 2  # 1h: parity (blocking) and the impact ratio (a warning)
    alarms = fleet(stack, "Fleet: detectors in alarm")["A"]
    assert {(dict(s)["model_id"], dict(s).get("dimension"), dict(s).get("metric")) for s in alarms
            if dict(s)["model_id"] in (STABLE, CANARY)} == {
        (CANARY, "male_vs_female", "demographic_parity_difference"),
        (CANARY, "male_vs_female", "disparate_impact_ratio")}  # fmt: skip
    timeline = by_model(fleet(stack, "Fleet: worst evidence per model")["A"])
    assert timeline[(CANARY,)] == 2 and timeline[(STABLE,)] < 2


def test_the_fleet_selector_lists_every_monitored_model(stack: Stack) -> None:
    (models,) = [v for v in load_dashboard()["templating"]["list"] if v["name"] == "models"]
    found = re.fullmatch(r"label_values\((\w+)(\{[^}]*\})?, (\w+)\)", models["query"]["query"])
    assert found is not None, models["query"]["query"]
    metric, selector, label = found.groups()
    selector = (selector or "").replace("$namespace", ".*")  # the Namespace variable at All
    values = stack.prometheus.data(f"/api/v1/label/{label}/values", **{"match[]": metric + selector})
    assert sorted(values) == sorted([STABLE, CANARY, DRIFTING_BESIDE_A_GAP, STARVED])
    assert set(by_model(fleet(stack, "Fleet: predictions in the window per model", STARVED)["A"])) == {(STARVED,)}
