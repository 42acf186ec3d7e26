"""Every explainable metric is explained, whatever its rate: ``negative_predictive_value_difference`` (a
difference of the metric table) was explained by no sentence words, so the gate's ``audit --baseline`` died with a
KeyError traceback (exit 1, the gate's "fail" code) and the daemon's computation of the model's snapshot died with
it (/metrics and /explain of the model were no longer refreshed).

The docs promise "every difference metric's change is explained" (docs/ml/explanations.md); NPV is a difference of
the table (``exporter.core.metric_table.METRICS``) and so is explainable (``explain.explainable``)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import orjson
import pandas as pd
import pytest
import yaml
from daemon_config import make_config
from prometheus_client import CollectorRegistry

from exporter.cli import main
from exporter.core.attributes import Attribute
from exporter.core.explain import explainable, explanations
from exporter.core.fairness import N_COUNTS
from exporter.core.metric_table import METRICS
from exporter.daemon import Daemon
from exporter.gate.fairness.audit import run_audit

T0 = 1_800_000_000.0
NPV = [{"name": "negative_predictive_value_difference", "threshold": 0.05}]


def _rows(rng: np.random.Generator, n: int, female_npv_b: float) -> pd.DataFrame:
    """Rows with a channel; labels drawn so every group has negative predictions in both channels; women's NPV in
    channel b is ``female_npv_b`` (0.5 elsewhere)."""
    gender = rng.choice(["male", "female"], n)
    channel = rng.choice(["a", "b"], n)
    prediction = rng.integers(0, 2, n)
    p_label0 = np.where((gender == "female") & (channel == "b"), female_npv_b, 0.5)  # NPV: P(label 0 | pred 0)
    label = np.where(prediction == 0, (rng.random(n) >= p_label0).astype(int), rng.integers(0, 2, n))
    return pd.DataFrame({"gender": gender, "age": "young", "channel": channel, "prediction": prediction,
                         "label": label})


def _npv(frame: pd.DataFrame, group: str) -> float:
    neg = frame[(frame.gender == group) & (frame.prediction == 0)]
    return float((neg.label == 0).mean())


@pytest.mark.parametrize("metric", explainable(METRICS))
def test_every_explainable_metric_is_explained_by_terms_that_add_up_to_its_change(metric: str) -> None:
    rng = np.random.default_rng(sorted(METRICS).index(metric))
    base, cur = (rng.integers(5, 200, (2, 3, N_COUNTS)) for _ in range(2))  # every count of every cell positive
    gender = Attribute("gender", ("gender",), ("female", "male"), ((0, 1),))
    found = explanations(gender, [metric], {"channel": (("broker", "web", "other"), base, cur)})
    assert [e["rate"] for e in found] == list(METRICS[metric].rates)
    for e in found:
        assert e["segments"] and e["summary"].startswith("the "), e["summary"]
        assert sum(s["mix"] + s["rate"] for s in e["segments"]) == pytest.approx(e["change"], abs=1e-12)


def test_the_gate_explains_a_negative_predictive_value_difference(tmp_path: Path) -> None:
    rng = np.random.default_rng(19)
    before, after = _rows(rng, 4000, 0.5), _rows(rng, 4000, 0.1)
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump({"model_id": "m", "protected_attributes": [
        {"name": "gender", "groups": ["female", "male"]}], "metrics": NPV, "segments": ["channel"]}))
    report = run_audit(config, after, baseline=before)  # observed: KeyError: 'negative_predictive_value'
    (e,) = [e for e in report["explanations"] if e["metric"] == "negative_predictive_value_difference"]
    want = (_npv(after, "female") - _npv(after, "male")) - (_npv(before, "female") - _npv(before, "male"))
    assert e["change"] == pytest.approx(want, abs=1e-12)
    assert sum(s["mix"] + s["rate"] for s in e["segments"]) == pytest.approx(want, abs=1e-12)


def test_the_audit_command_does_not_crash_on_a_negative_predictive_value_difference(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:  # fmt: skip
    rng = np.random.default_rng(20)
    _rows(rng, 2000, 0.5).to_csv(tmp_path / "before.csv", index=False)
    _rows(rng, 2000, 0.5).to_csv(tmp_path / "after.csv", index=False)  # no change: the gate should pass (exit 0)
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump({"model_id": "m", "protected_attributes": [
        {"name": "gender", "groups": ["female", "male"]}], "metrics": [{**NPV[0], "threshold": 0.5}],
        "segments": ["channel"]}))
    try:
        code = main(["audit", str(config), str(tmp_path / "after.csv"), "--baseline", str(tmp_path / "before.csv"),
                     "--report", str(tmp_path / "report.json")])
    except KeyError as error:  # observed: an uncaught KeyError (exit 1 from the console script, the "fail" code)
        pytest.fail(f"audit --baseline crashed: KeyError {error}")
    assert code == 0


@dataclass
class _Record:
    value: bytes
    offset: int


def test_the_daemon_computes_a_model_with_a_negative_predictive_value_difference_and_segments() -> None:
    rng = np.random.default_rng(21)
    before, after = _rows(rng, 600, 0.5), _rows(rng, 600, 0.1)
    settings = {"segments": ["channel"], "windows": ["10m"], "bucket": "10s", "allowed_lateness": "15m",
                "metrics": NPV}
    daemon = Daemon(make_config(**settings), registry=CollectorRegistry(), clock=lambda: T0)
    events = [orjson.dumps({"model_id": "m1", "prediction_id": f"p{i}", "timestamp": ts,
                            "prediction": int(r.prediction), "label": int(r.label),
                            "attributes": {"gender": r.gender, "age": r.age, "channel": r.channel}})
              for i, (ts, r) in enumerate([(T0 - 840, r) for r in before.itertuples()]
                                          + [(T0 - 240, r) for r in after.itertuples()])]  # fmt: skip
    daemon.ingest.handle("predictions", 0, [_Record(e, i) for i, e in enumerate(events)])
    explained = daemon.computer.compute().models[0].explained  # observed: KeyError: 'negative_predictive_value'
    assert explained is not None
    (e,) = [e for e in explained["10m"]["explanations"]
            if e["attribute"] == "gender" and e["metric"] == "negative_predictive_value_difference"]
    want = (_npv(after, "male") - _npv(after, "female")) - (_npv(before, "male") - _npv(before, "female"))
    assert e["change"] == pytest.approx(want, abs=1e-9)
