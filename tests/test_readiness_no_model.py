"""Readiness of a daemon that monitors no model (found by review 16).

An empty `models_dir` is accepted ("an empty models_dir waits for its files", exporter/config/load.py): the Helm
chart's model ConfigMaps (`modelConfigMaps`) are copied there by a sidecar, so a wrong label, namespace or missing
RBAC leaves it empty. The daemon then reads every event and ignores it, while `/readyz` says it serves computed
metrics and no shipped alert looks at `fairness_exporter_models` or `fairness_exporter_events_ignored_total`.
"""

from __future__ import annotations

import time
from pathlib import Path

import yaml
from broker_fixture import produce
from daemon_config import make_config
from daemon_fixture import kafka_config, payloads, probe, sample, scrape, synthetic_rows, wait_for
from prometheus_client import CollectorRegistry

from exporter.daemon import Daemon

RULE_FILE = Path(__file__).resolve().parent.parent / "rules" / "fairness-exporter.rules.yaml"


def test_a_daemon_that_monitors_no_model_is_not_ready(
    kafka_broker, topic: str, tmp_path: Path, daemons: list[Daemon]
) -> None:
    """The rules: "a monitor that says ready while reading nothing is worse than none"; "nothing degrades in
    silence"; "a check that evaluated nothing never passes". `Daemon.ready` (docstring: "Ready once partitions are
    assigned and a computation has published a snapshot ...") never asks whether any model is monitored.

    With `models_dir` empty (the chart's model sidecar found no ConfigMap), 30 of 30 events of model m1 are
    consumed and counted only as `fairness_exporter_events_ignored_total{reason="unconfigured_model"}`,
    `fairness_exporter_models` is 0, and `/readyz` answered 200 "ok: serving computed metrics": no fairness number
    is computed for anybody, yet the pod was Ready and no alert of rules/fairness-exporter.rules.yaml could fire (none
    read either series; FairnessExporterHighRejectRate counts rejects, not ignored events). A team that answers
    to a regulator with this output sees a green deployment that monitors nothing.
    """
    models = tmp_path / "models.d"
    models.mkdir()  # the sidecar copied no model file
    config = make_config(**kafka_config(kafka_broker.bootstrap_servers, topic, "kafka-python"), model_id=None,
                         models_dir=str(models))  # fmt: skip
    assert not config.models  # accepted: it waits for its files
    daemon = Daemon(config, registry=CollectorRegistry())
    daemon.start()
    daemons.append(daemon)
    produce(kafka_broker.bootstrap_servers, topic, payloads(synthetic_rows(30, seed=1), time.time()), 0)
    wait_for(lambda: (sample(scrape(daemon.port), "fairness_exporter_events_consumed_total") or 0) >= 30, 60,
             what="the 30 events consumed")  # fmt: skip
    time.sleep(2)  # a computation after them
    samples = scrape(daemon.port)
    ignored = sample(samples, "fairness_exporter_events_ignored_total", reason="unconfigured_model")
    monitored = sample(samples, "fairness_exporter_models")
    status, body = probe(daemon.port, "/readyz")
    exprs = [r["expr"] for g in yaml.safe_load(RULE_FILE.read_text())["spec"]["groups"] for r in g["rules"]
             if "alert" in r]  # fmt: skip
    watched = any("fairness_exporter_models" in e or "events_ignored" in e for e in exprs)
    assert status == 503, (f"/readyz {status} {body.strip()!r} with {monitored:.0f} models monitored and "
                           f"{ignored:.0f} of 30 events ignored; an alert watches them: {watched}")
    assert f"no model configured: waiting for model files in {models}" in body and ignored == 30
    assert monitored == 0 and watched
