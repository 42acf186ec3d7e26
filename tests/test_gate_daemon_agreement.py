"""The gate and the daemon agree on real data: ProPublica's COMPAS rows through both paths give the same numbers.

The config compares only the three large race groups, so 427 rows have a race outside them: both paths leave
those rows out of the race comparisons only, count them as race's unknown category, and keep them for sex, age
and the overall rate (issue 10). Every number on /metrics must equal the report's to 1e-9.
"""

from __future__ import annotations

import time
import urllib.request
from collections.abc import Iterator
from typing import Any

import numpy as np
import orjson
import pandas as pd
import pytest
from broker_fixture import produce
from compas import RACE_GROUPS, compas_frame
from prometheus_client.parser import text_string_to_metric_families

from exporter.config import Config, parse_config
from exporter.core.metric_table import METRICS
from exporter.daemon import Daemon
from exporter.devtools.embedded_broker import EmbeddedBroker
from exporter.gate.audit import run_audit

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def _config(bootstrap: str, topic: str) -> Config:
    return parse_config({
        "model_id": "compas",
        "protected_attributes": [
            {"name": "race", "groups": RACE_GROUPS},
            {"name": "sex", "groups": ["Male", "Female"]},
            {"name": "age_cat", "groups": ["Less than 25", "25 - 45", "Greater than 45"]},
        ],
        # every metric of the table, at its default threshold: some are reported, some too imprecise to be
        "metrics": [{"name": name, "threshold": m.default_threshold} for name, m in METRICS.items()],
        "min_samples": 30,
        "windows": ["1h", "24h"],
        "evaluation_interval": "1s",
        "listen": {"address": "127.0.0.1", "port": 0},
        "kafka": {"bootstrap_servers": bootstrap, "topic": topic, "assignment": "manual", "group_id": f"g-{topic}"},
    }, "compas-config")  # fmt: skip


def _payloads(frame: pd.DataFrame, ts: float) -> list[bytes]:
    return [orjson.dumps({"model_id": "compas", "prediction_id": f"p{i}", "timestamp": ts,
                          "prediction": int(r.prediction), "label": int(r.label),
                          "attributes": {"race": r.race, "sex": r.sex, "age_cat": r.age_cat}})
            for i, r in enumerate(frame.itertuples())]  # fmt: skip


def _scrape(port: int) -> Samples:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        text = response.read().decode()
    return {(s.name, frozenset(s.labels.items())): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}  # fmt: skip


def _get(samples: Samples, name: str, **labels: str) -> float | None:
    return samples.get((name, frozenset({"model_id": "compas", **labels}.items())))


def _consumed(samples: Samples) -> float:
    return samples.get(("fairness_exporter_events_consumed_total", frozenset()), 0.0)


@pytest.fixture
def daemon(kafka_broker: EmbeddedBroker, topic: str) -> Iterator[Daemon]:
    produce(kafka_broker.bootstrap_servers, topic, _payloads(compas_frame(), time.time()))
    d = Daemon(_config(kafka_broker.bootstrap_servers, topic))
    d.start()
    try:
        deadline = time.monotonic() + 90
        while _consumed(_scrape(d.port)) < 7214:
            assert time.monotonic() < deadline, "timed out waiting for the 7214 COMPAS events"
            time.sleep(0.2)
        d.computer.compute()
        yield d
    finally:
        d.stop()


def _close(got: float | None, expected: Any, what: object) -> None:
    assert got is not None and expected is not None, what
    assert abs(got - expected) <= 1e-9, (what, got, expected)


def test_compas_through_the_gate_and_the_daemon_gives_identical_numbers(daemon: Daemon) -> None:
    frame = compas_frame()
    report = run_audit(daemon.config, frame)
    samples = _scrape(daemon.port)
    assert _consumed(samples) == 7214
    assert not [v for (name, _), v in samples.items() if name == "fairness_exporter_events_rejected_total" and v]
    checked = 0
    for window in ("1h", "24h"):
        for attribute, block in report["attributes"].items():
            base = {"attribute": attribute, "window": window}
            # the overall population of every attribute is every row, unknown category included
            assert block["overall_samples"] == 7214
            _close(_get(samples, "model_subgroup_samples", subgroup="overall", **base), 7214, base)
            _close(_get(samples, "model_positive_prediction_rate", subgroup="overall", **base),
                   block["overall_selection_rate"], base)  # fmt: skip
            _close(_get(samples, "model_subgroup_unknown_samples", **base), block["excluded_rows"], base)
            for group, g in block["groups"].items():
                labels = {**base, "subgroup": group}
                _close(_get(samples, "model_subgroup_samples", **labels), g["samples"], labels)
                _close(_get(samples, "model_subgroup_labelled_samples", **labels), g["labelled"], labels)
                _close(_get(samples, "model_positive_prediction_rate", **labels), g["selection_rate"], labels)
                _close(_get(samples, "model_positive_prediction_rate_lower", **labels), g["selection_rate_ci"][0],
                       labels)  # fmt: skip
                _close(_get(samples, "model_positive_prediction_rate_upper", **labels), g["selection_rate_ci"][1],
                       labels)  # fmt: skip
                _close(_get(samples, "model_true_positive_rate", **labels), g["true_positive_rate"], labels)
                _close(_get(samples, "model_false_positive_rate", **labels), g["false_positive_rate"], labels)
                checked += 1
        for r in report["results"]:
            a, b = r["groups"].split(" vs ")
            labels = {"attribute": r["attribute"], "window": window, "dimension": r["dimension"], "group_a": a,
                      "group_b": b}  # fmt: skip
            name = METRICS[r["metric"]].prometheus_name
            insufficient = _get(samples, "model_comparison_insufficient_samples", metric=r["metric"], **labels)
            if r["value"] is None:
                assert insufficient == 1 and _get(samples, name, **labels) is None, r
            else:
                assert insufficient == 0, r
                _close(_get(samples, name, **labels), r["exact_value"], r)
                _close(_get(samples, f"{name}_lower", **labels), r["ci_95"][0], r)
                _close(_get(samples, f"{name}_upper", **labels), r["ci_95"][1], r)
            checked += 1
    assert checked == 2 * (8 + len(report["results"])) and len(report["results"]) == 7 * (3 + 1 + 3)
    # the 427 rows of other races: race's unknown category, in the report, the LL144 table and on /metrics
    assert report["attributes"]["race"]["excluded_rows"] == 427 == int((~frame.race.isin(RACE_GROUPS)).sum())
    assert report["attributes"]["sex"]["excluded_rows"] == 0
    assert report["impact_ratios"]["attributes"]["race"]["unknown_rows"] == 427
    # sex counts every row, whatever its race: the daemon no longer rejects the 427 events
    assert sum(g["samples"] for g in report["attributes"]["sex"]["groups"].values()) == 7214
    reported = {r["metric"] for r in report["results"] if r["value"] is not None}
    assert {"demographic_parity_difference", "equalised_odds_difference", "false_positive_rate_difference"} <= reported
    # the thresholds the alerts compare against come from the config
    for name, m in METRICS.items():
        assert _get(samples, "fairness_threshold", metric=name) == m.default_threshold
    assert _get(samples, "fairness_min_samples") == 30
    assert np.isfinite(_get(samples, "fairness_max_interval_width", metric="disparate_impact_ratio") or np.nan)
