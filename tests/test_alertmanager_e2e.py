"""End to end, up to the page: drifting traffic on the real broker, the daemon, a real Prometheus with the shipped
rules (every `for:` 5s), a real Alertmanager with deploy/alertmanager/alertmanager.yml (timers 1s), and a webhook
receiver standing in for the pager.

Model m1's traffic starts fair (selection rate 0.35 for men and women) and drifts (0.5 vs 0.2 on as many rows
again, three times, a bucket apart): its gender comparison must page, with the labels and runbook link a responder
needs. Model `fair-model` runs through the same Prometheus and Alertmanager with equal rates throughout and must
page nothing. The test
looks at alert names and labels only, not at the rules' expressions, so it holds whatever detector fires them.
"""

from __future__ import annotations

import subprocess
import time
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pandas as pd
import pytest
import yaml
from broker_fixture import produce
from daemon_config import make_config
from prometheus_fixture import AlertmanagerServer, PrometheusServer, load_rule_generator, wait_until
from test_daemon_kafka import kafka_config, payloads
from test_prometheus_e2e import AlertRecorder
from tooling import require_binary

from exporter.daemon import Daemon
from exporter.devtools.embedded_broker import EmbeddedBroker
from exporter.devtools.monitoring import ALERTMANAGER_CONFIG, WebhookSink, routing_config

pytestmark = pytest.mark.prometheus

PAGING_ALERTS = {"FairnessDemographicParityDrift", "FairnessDisparateImpactViolation"}
PAGE = "fairness-page"
TIMERS = {"group_wait": "1s", "group_interval": "1s", "repeat_interval": "1h"}
RUNBOOK = load_rule_generator().RUNBOOK_URL
DRIFTING, FAIR = "m1", "fair-model"
BUCKET_SECONDS = 5


def rows(rates: dict[str, float], per_group: int = 1000) -> pd.DataFrame:
    """per_group rows per gender with exactly rates[gender] selected; young and old alike within every cell."""
    cells = []
    for gender, rate in rates.items():
        for prediction, n in ((1, round(rate * per_group)), (0, per_group - round(rate * per_group))):
            i = np.arange(n)
            cells.append(pd.DataFrame({"gender": gender, "age": np.where(i % 2 == 0, "young", "old"),
                                       "prediction": prediction, "label": -1}))  # fmt: skip
    return pd.concat(cells).sample(frac=1.0, random_state=11).reset_index(drop=True)


def events_of(model_id: str, frame: pd.DataFrame, prefix: str) -> list[bytes]:
    """The rows as events of `model_id` with prediction ids prefix0, prefix1, ... timestamped now."""
    return [orjson.dumps({**orjson.loads(p), "model_id": model_id, "prediction_id": f"{prefix}{i}"})
            for i, p in enumerate(payloads(frame, time.time()))]  # fmt: skip


@dataclass
class Chain:
    prometheus: PrometheusServer
    alertmanager: AlertmanagerServer
    sink: WebhookSink
    alerts: AlertRecorder


def start_daemon(broker: EmbeddedBroker, model_id: str, daemons: list[Daemon]) -> tuple[Daemon, str]:
    topic = f"alertmanager-e2e-{model_id}-{uuid.uuid4().hex[:6]}"
    broker.create_topic(topic, partitions=2)
    # 5-second buckets: the change detectors behind the pages take a step every 5 s instead of every minute
    daemon = Daemon(make_config(model_id=model_id, **kafka_config(broker.bootstrap_servers, topic, "kafka-python"),
                                bucket=f"{BUCKET_SECONDS}s"))  # fmt: skip
    daemons.append(daemon)
    daemon.start()
    return daemon, topic


@pytest.fixture(scope="module")
def chain(kafka_broker: EmbeddedBroker, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Chain]:
    daemons: list[Daemon] = []
    directory: Path = tmp_path_factory.mktemp("chain")
    try:
        drifting, drifting_topic = start_daemon(kafka_broker, DRIFTING, daemons)
        fair, fair_topic = start_daemon(kafka_broker, FAIR, daemons)
        with WebhookSink() as sink, \
                AlertmanagerServer(directory / "am", routing_config(sink.url, TIMERS)) as alertmanager, \
                PrometheusServer(directory / "prom", [f"127.0.0.1:{d.port}" for d in (drifting, fair)],
                                 rules=load_rule_generator().rule_file(for_durations="5s"),
                                 alertmanager=alertmanager.address) as prometheus:  # fmt: skip
            up = 'up{job="fairness-exporter"} == 1'
            wait_until(lambda: len(prometheus.values(up)) == 2, 30, "Prometheus scraping both daemons")
            recorder = AlertRecorder(prometheus)
            recorder.start()
            try:
                even = {"male": 0.35, "female": 0.35}
                produce(kafka_broker.bootstrap_servers, fair_topic, events_of(FAIR, rows(even), "f"))
                produce(kafka_broker.bootstrap_servers, drifting_topic, events_of(DRIFTING, rows(even), "a"))
                fair_gap = 'model_demographic_parity_difference{model_id="%s",window="1h",attribute="gender"} == 0'
                wait_until(lambda: prometheus.values(fair_gap % DRIFTING) and prometheus.values(fair_gap % FAIR),
                           30, "both models' fair traffic scraped")  # fmt: skip
                drift = rows({"male": 0.5, "female": 0.2})
                for k in range(3):  # live traffic over three buckets: a step is a bucket the events left, so each
                    # batch is stepped when the next one comes (two drift steps, the fair model's as many)
                    produce(kafka_broker.bootstrap_servers, fair_topic, events_of(FAIR, rows(even), f"f{k}-"))
                    produce(kafka_broker.bootstrap_servers, drifting_topic, events_of(DRIFTING, drift, f"b{k}-"))
                    time.sleep(BUCKET_SECONDS + 0.5)
                yield Chain(prometheus, alertmanager, sink, recorder)
            finally:
                recorder.done.set()
                recorder.join(5)
    finally:
        for daemon in daemons:
            daemon.stop()


def test_drift_pages_with_the_labels_a_responder_needs(chain: Chain) -> None:
    def drift_pages() -> list[dict[str, Any]]:
        return [body for receiver, body in chain.sink.received()
                if receiver == PAGE and body["groupLabels"].get("model_id") == DRIFTING]  # fmt: skip

    page = wait_until(drift_pages, 90, "the drift page at the webhook receiver")[0]
    assert page["status"] == "firing"
    assert page["groupLabels"] == {"model_id": DRIFTING, "attribute": "gender"}  # one page per model and attribute
    paged = page["alerts"]
    assert {a["labels"]["alertname"] for a in paged} & PAGING_ALERTS
    for alert in paged:
        labels = alert["labels"]
        assert (labels["model_id"], labels["attribute"], labels["dimension"]) == (DRIFTING, "gender", "male_vs_female")
        assert labels["severity"] == "critical"
        assert alert["annotations"]["runbook_url"].startswith(RUNBOOK + "#"), alert["annotations"]


def test_a_fair_model_pages_nothing(chain: Chain) -> None:
    wait_until(lambda: [a for a in chain.sink.alerts(PAGE) if a["labels"]["model_id"] == DRIFTING], 90,
               "the drifting model's page (so the fair one had its chance)")  # fmt: skip
    notified = [a["labels"] for a in chain.sink.alerts() if a["labels"].get("model_id") == FAIR]
    raised = [dict(key) for key in chain.alerts.snapshot() if ("model_id", FAIR) in key]
    assert (notified, raised) == ([], [])


def test_an_attribute_with_equal_rates_pages_nothing(chain: Chain) -> None:
    wait_until(lambda: [a for a in chain.sink.alerts(PAGE) if a["labels"]["model_id"] == DRIFTING], 90,
               "the drifting model's page")  # fmt: skip
    assert [a["labels"] for a in chain.sink.alerts() if a["labels"].get("attribute") == "age"] == []


def post_alerts(alertmanager: AlertmanagerServer, *labels: dict[str, str]) -> None:
    """Hand alerts to Alertmanager as Prometheus does (v2 API), active from now on."""
    body = orjson.dumps([{"labels": alert, "annotations": {}} for alert in labels])
    request = urllib.request.Request(f"{alertmanager.url}/api/v2/alerts", data=body, method="POST",
                                     headers={"Content-Type": "application/json"})  # fmt: skip
    with urllib.request.urlopen(request, timeout=10) as response:
        assert response.status == 200


@pytest.mark.parametrize("health_alert", ["FairnessExporterDown", "FairnessExporterComputationStale"])
def test_exporter_trouble_mutes_that_exporters_fairness_alerts(chain: Chain, health_alert: str) -> None:
    """While an exporter is down or stale its fairness alerts are inhibited; another exporter's are not."""
    stuck, healthy = f"{health_alert.lower()}:9108", "healthy:9108"
    fairness = {"alertname": "FairnessDemographicParityDrift", "model_id": "m-inhibit", "attribute": "gender",
                "dimension": "a_vs_b", "severity": "critical", "window": "1h"}  # fmt: skip
    post_alerts(chain.alertmanager, {"alertname": health_alert, "severity": "warning", "instance": stuck},
                {**fairness, "instance": stuck}, {**fairness, "instance": healthy})  # fmt: skip

    def states() -> dict[str, list[str]]:
        return {a["labels"]["instance"]: a["status"]["inhibitedBy"] for a in chain.alertmanager.alerts()
                if a["labels"].get("model_id") == "m-inhibit" and a["labels"]["instance"] in (stuck, healthy)}

    found = wait_until(lambda: (s := states()) and len(s) == 2 and s[stuck] and s, 30, "the inhibition")
    assert found[healthy] == []


def amtool(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([require_binary("amtool"), *args], capture_output=True, text=True, check=False)


def test_amtool_accepts_the_shipped_routing() -> None:
    result = amtool("check-config", str(ALERTMANAGER_CONFIG))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout


@pytest.mark.parametrize(("labels", "receiver"), [
    ({"alertname": "FairnessDisparateImpactViolation", "severity": "critical", "model_id": "m"}, PAGE),
    ({"alertname": "SubgroupPredictionRateShift", "severity": "warning", "model_id": "m"}, "model-owners"),
    ({"alertname": "FairnessExporterAbsent", "severity": "critical"}, "fairness-exporter-operators"),
    ({"alertname": "FairnessExporterDown", "severity": "warning", "instance": "x"}, "fairness-exporter-operators"),
])  # fmt: skip
def test_amtool_routes_each_kind_of_alert_to_its_receiver(labels: dict[str, str], receiver: str) -> None:
    result = amtool("config", "routes", "test", f"--config.file={ALERTMANAGER_CONFIG}",
                    *(f"{k}={v}" for k, v in labels.items()))  # fmt: skip
    assert result.stdout.strip() == receiver, result.stdout + result.stderr


def test_every_alert_the_rules_ship_reaches_a_receiver() -> None:
    """Every alert in the rule file has a severity the routing knows (critical or warning)."""
    spec: dict[str, Any] = load_rule_generator().rule_file()
    shipped = [rule for group in spec["groups"] for rule in group["rules"] if "alert" in rule]
    assert shipped and {rule["labels"]["severity"] for rule in shipped} <= {"critical", "warning"}
    routes = yaml.safe_load(ALERTMANAGER_CONFIG.read_text())["route"]["routes"]
    assert {m for route in routes for m in route["matchers"]} >= {'severity="critical"', 'severity="warning"'}
