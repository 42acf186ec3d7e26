"""The gate and the daemon agree: the same rows through both paths give the same numbers, and those numbers are
Fairlearn's.

On ProPublica's COMPAS rows, with the seed's metrics and thresholds and every other metric of the menu at its
default: every comparison has a numeric value equal to Fairlearn to 1e-4 (wide intervals included: the ones
`max_interval_width` used to hide, issue 20), `passed` is the point estimate against the threshold,
`blocking_failures` counts those failures, and /metrics shows every value, bound and evidence of the report. The
config compares only the three large race groups, so 427 rows have a race outside them: both paths leave those
rows out of the race comparisons only, count them as race's unknown category, and keep them for sex, age and the
overall rate (issue 10). Half the events carry their prediction and label as JSON booleans, the gate reads a
boolean prediction column: both count them as 1/0.

A second test feeds both paths the awkward values one path could read differently from the other: blanks and
absent keys, booleans, whole floats as group names, values outside the groups, groups below min_samples.
"""

from __future__ import annotations

import re
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pandas as pd
import pytest
from broker_fixture import produce
from compas import RACE_GROUPS, compas_frame
from fairlearn.metrics import (
    MetricFrame,
    demographic_parity_difference,
    demographic_parity_ratio,
    equal_opportunity_difference,
    equalized_odds_difference,
    false_positive_rate,
)
from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families
from sklearn.metrics import accuracy_score, precision_score, roc_auc_score
from test_metric_menu import ORACLE_RATES

from exporter.backtest.replay import backtest
from exporter.config import Config, parse_config
from exporter.core.metric_table import EVIDENCE, METRICS
from exporter.daemon import Daemon
from exporter.devtools.embedded_broker import EmbeddedBroker
from exporter.gate.fairness.audit import run_audit
from exporter.stream.kafka.client import SimpleRecord

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]

# The seed's thresholds (bias-testing-config.yaml; disparate impact as a warning, as the four-fifths rule is
# advisory), then every other metric of the menu at its default threshold (but the score metrics: a test of their own).
SEED_METRICS = [
    {"name": "demographic_parity_difference", "threshold": 0.05, "severity_on_fail": "blocking"},
    {"name": "equalised_odds_difference", "threshold": 0.05, "severity_on_fail": "blocking"},
    {"name": "disparate_impact_ratio", "threshold": 0.80, "severity_on_fail": "warning"},
]
MENU = SEED_METRICS + [{"name": name, "threshold": m.default_threshold, "severity_on_fail": "blocking"}
                       for name, m in METRICS.items() if not m.seed and not m.scores]  # fmt: skip
COMPAS_ATTRIBUTES = [
    {"name": "race", "groups": RACE_GROUPS},
    {"name": "sex", "groups": ["Male", "Female"]},
    {"name": "age_cat", "groups": ["Less than 25", "25 - 45", "Greater than 45"]},
]


def _compas_config(bootstrap: str, topic: str) -> Config:
    return parse_config({
        "model_id": "compas", "protected_attributes": COMPAS_ATTRIBUTES, "metrics": MENU, "min_samples": 30,
        "windows": ["1h", "24h"], "evaluation_interval": "1s", "listen": {"address": "127.0.0.1", "port": 0},
        "kafka": {"bootstrap_servers": bootstrap, "topic": topic, "assignment": "manual", "group_id": f"g-{topic}"},
    }, "compas-config")  # fmt: skip


def _payloads(frame: pd.DataFrame, ts: float) -> list[bytes]:
    """One event per row; every other row says its prediction and label as JSON booleans."""
    def binary(value: int, i: int) -> int | bool:
        return bool(value) if i % 2 else int(value)

    return [orjson.dumps({"model_id": "compas", "prediction_id": f"p{i}", "timestamp": ts,
                          "prediction": binary(r.prediction, i), "label": binary(r.label, i),
                          "attributes": {"race": r.race, "sex": r.sex, "age_cat": r.age_cat}})
            for i, r in enumerate(frame.itertuples())]  # fmt: skip


def _parse(text: str) -> Samples:
    return {(s.name, frozenset(s.labels.items())): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}  # fmt: skip


def _scrape(port: int) -> Samples:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        return _parse(response.read().decode())


def _get(samples: Samples, model: str, name: str, **labels: str) -> float | None:
    return samples.get((name, frozenset({"model_id": model, **labels}.items())))


def _consumed(samples: Samples) -> float:
    return samples.get(("fairness_exporter_events_consumed_total", frozenset()), 0.0)


def _close(got: float | None, expected: Any, what: object) -> None:
    assert got is not None and expected is not None, what
    assert abs(got - expected) <= 1e-9, (what, got, expected)


def fairlearn_value(metric: str, rows: pd.DataFrame, attribute: str, a: str, b: str) -> float:
    """Fairlearn's (and scikit-learn's) number for one comparison, on the rows of its two groups."""
    rows = rows[rows[attribute].isin([a, b])]
    labelled = rows[rows.label.notna()]
    y, p, s = labelled.label.astype(int), labelled.prediction.astype(int), labelled[attribute]
    if metric in ("demographic_parity_difference", "disparate_impact_ratio"):  # selection rates: every row
        of_rates = demographic_parity_difference if metric == "demographic_parity_difference" else \
            demographic_parity_ratio  # fmt: skip
        return float(of_rates(rows.prediction, rows.prediction, sensitive_features=rows[attribute]))
    if metric == "equalised_odds_difference":
        return float(equalized_odds_difference(y, p, sensitive_features=s))
    if metric == "equal_opportunity_difference":
        return float(equal_opportunity_difference(y, p, sensitive_features=s))
    rate = {"false_positive_rate_difference": false_positive_rate, "accuracy_difference": accuracy_score,
            "predictive_parity_difference": lambda t, q: precision_score(t, q, zero_division=np.nan)}.get(metric)
    if rate is None:  # the menu of issue 41: MetricFrame's difference or ratio (min/max) of the metric's rate
        (of,) = METRICS[metric].rates
        frame = MetricFrame(metrics=ORACLE_RATES[of], y_true=y, y_pred=p, sensitive_features=s)
        return float(frame.difference() if METRICS[metric].kind == "difference" else frame.ratio())
    by_group = MetricFrame(metrics=rate, y_true=y, y_pred=p, sensitive_features=s).by_group
    return float(abs(by_group[a] - by_group[b]))


def assert_the_page_shows_the_report(samples: Samples, report: dict[str, Any], windows: tuple[str, ...]) -> int:
    """Every group statistic and every comparison of the report, in every window, on the page: values, bounds,
    insufficiency and evidence. Returns the number of comparisons checked."""
    model = report["model_id"]
    checked = 0
    for window in windows:
        for attribute, block in report["attributes"].items():
            base = {"attribute": attribute, "window": window}
            _close(_get(samples, model, "model_subgroup_samples", subgroup="overall", **base), block["overall_samples"],
                   base)  # fmt: skip
            _close(_get(samples, model, "model_positive_prediction_rate", subgroup="overall", **base),
                   block["overall_selection_rate"], base)  # fmt: skip
            _close(_get(samples, model, "model_subgroup_unknown_samples", **base), block["excluded_rows"], base)
            for group, g in block["groups"].items():
                labels = {**base, "subgroup": group}
                _close(_get(samples, model, "model_subgroup_samples", **labels), g["samples"], labels)
                _close(_get(samples, model, "model_subgroup_labelled_samples", **labels), g["labelled"], labels)
                for name, key in (("model_positive_prediction_rate", "selection_rate"),
                                  ("model_true_positive_rate", "true_positive_rate"),
                                  ("model_false_positive_rate", "false_positive_rate")):  # fmt: skip
                    shown = _get(samples, model, name, **labels)
                    assert (shown is None) == (g[key] is None), (labels, name)
                    if shown is not None:
                        _close(shown, g[key], (labels, name))
        for r in report["results"]:
            a, b = r["groups"].split(" vs ")
            labels = {"attribute": r["attribute"], "window": window, "dimension": r["dimension"], "group_a": a,
                      "group_b": b}  # fmt: skip
            name = METRICS[r["metric"]].prometheus_name
            insufficient = _get(samples, model, "model_comparison_insufficient_samples", metric=r["metric"], **labels)
            evidence = {s: _get(samples, model, "model_comparison_evidence", metric=r["metric"], evidence=s, **labels)
                        for s in EVIDENCE}  # fmt: skip
            assert evidence == {s: float(s == r["evidence"]) for s in EVIDENCE}, (r, evidence)
            if r["value"] is None:
                assert insufficient == 1 and _get(samples, model, name, **labels) is None, r
            else:
                assert insufficient == 0, r
                _close(_get(samples, model, name, **labels), r["exact_value"], r)
                _close(_get(samples, model, f"{name}_lower", **labels), r["ci_95"][0], r)
                _close(_get(samples, model, f"{name}_upper", **labels), r["ci_95"][1], r)
            checked += 1
        for w in report["worst"]:  # each metric's worst comparison of each attribute, and how many were judged
            labels = {"attribute": w["attribute"], "window": window, "metric": w["metric"]}
            _close(_get(samples, model, "model_comparisons_judged", **labels), w["comparisons_judged"], w)
            if w["dimension"] is not None:
                a, b = w["dimension"].split("_vs_")
                labels |= {"dimension": w["dimension"], "group_a": a, "group_b": b}
                for suffix, expected in (("", w["value"]), ("_lower", w["ci_simultaneous"][0]),
                                         ("_upper", w["ci_simultaneous"][1])):  # fmt: skip
                    _close(_get(samples, model, f"model_worst_comparison{suffix}", **labels), expected, w)
    return checked


@pytest.fixture
def daemon(kafka_broker: EmbeddedBroker, topic: str) -> Iterator[Daemon]:
    produce(kafka_broker.bootstrap_servers, topic, _payloads(compas_frame(), time.time()))
    d = Daemon(_compas_config(kafka_broker.bootstrap_servers, topic))
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


def test_compas_every_comparison_of_the_menu_is_fairlearns_number_in_the_gate_and_on_metrics(daemon: Daemon) -> None:
    frame = compas_frame()
    gate_rows = frame.assign(prediction=frame.prediction.astype(bool))  # a boolean column counts as 1/0
    report = run_audit(daemon.config, gate_rows)
    samples = _scrape(daemon.port)
    assert _consumed(samples) == 7214
    assert not [v for (name, _), v in samples.items() if name == "fairness_exporter_events_rejected_total" and v]
    results = report["results"]
    assert len(results) == len(MENU) * (3 + 1 + 3)
    for r in results:
        a, b = r["groups"].split(" vs ")
        expected = fairlearn_value(r["metric"], frame, r["attribute"], a, b)
        assert r["value"] is not None and abs(r["value"] - expected) <= 1e-4, (r, expected)
        assert abs(r["exact_value"] - expected) <= 1e-9, (r, expected)
        assert r["passed"] is METRICS[r["metric"]].passes(expected, r["threshold"]), r  # the seed's verdict
        assert r["status"] == ("pass" if r["passed"] else "fail")
    assert report["insufficient_samples"] == 0
    point_failures = [r for r in results if not r["passed"]]
    assert report["blocking_failures"] == sum(r["severity"] == "blocking" for r in point_failures)
    assert report["warning_failures"] == sum(r["severity"] == "warning" for r in point_failures)
    # the ones the old rule hid: an interval wider than the threshold, or than 1 - threshold for the ratio
    wide = [r for r in results if r["half_width"] > (r["threshold"] if METRICS[r["metric"]].kind == "difference"
                                                     else 1 - r["threshold"])]  # fmt: skip
    assert {(r["metric"], r["groups"]) for r in wide} >= {
        ("equalised_odds_difference", "African-American vs Hispanic"),
        ("equalised_odds_difference", "Less than 25 vs Greater than 45"),
        ("equalised_odds_difference", "Male vs Female")}  # fmt: skip
    by_key = {(r["metric"], r["groups"]): r for r in results}
    decided = by_key[("equalised_odds_difference", "African-American vs Hispanic")]
    assert (decided["value"], [round(x, 3) for x in decided["ci_95"]], decided["evidence"]) == \
        (0.2762, [0.197, 0.353], "fail")  # fmt: skip
    imprecise = by_key[("equalised_odds_difference", "Male vs Female")]
    assert (imprecise["value"], imprecise["passed"], imprecise["evidence"]) == (0.0207, True, "inconclusive")
    assert imprecise["samples_to_decide"] is not None
    assert assert_the_page_shows_the_report(samples, report, ("1h", "24h")) == 2 * len(results)
    # each metric's worst comparison per attribute is Fairlearn's worst pair, its interval wider than the pair's own
    assert report["multiplicity"] == "holm" and report["comparisons_judged"] == len(results)
    assert len(report["worst"]) == len(MENU) * 3
    for w in report["worst"]:
        pairs = [r for r in results if (r["attribute"], r["metric"]) == (w["attribute"], w["metric"])]
        pick = min if METRICS[w["metric"]].kind == "ratio" else max
        expected = pick(fairlearn_value(w["metric"], frame, w["attribute"], *r["groups"].split(" vs ")) for r in pairs)
        assert w["comparisons_judged"] == len(pairs) and abs(w["value"] - expected) <= 1e-9, (w, expected)
        (own,) = [r for r in pairs if r["dimension"] == w["dimension"]]
        assert w["ci_simultaneous"][0] <= own["ci_95"][0] + 1e-12 or len(pairs) == 1, (w, own)

    # the 427 rows of other races: race's unknown category, in the report, the LL144 table and on /metrics
    assert report["attributes"]["race"]["excluded_rows"] == 427 == int((~frame.race.isin(RACE_GROUPS)).sum())
    assert report["attributes"]["sex"]["excluded_rows"] == 0
    assert report["impact_ratios"]["attributes"]["race"]["unknown_rows"] == 427
    assert sum(g["samples"] for g in report["attributes"]["sex"]["groups"].values()) == 7214
    for spec in MENU:  # the thresholds the alerts and the evidence compare against come from the config
        assert _get(samples, "compas", "fairness_threshold", metric=spec["name"],
                    severity=spec["severity_on_fail"]) == spec["threshold"]
    assert _get(samples, "compas", "fairness_min_samples") == 30


T0 = 1_800_000_000.0


def _awkward_rows(n: int, seed: int) -> list[dict[str, Any]]:
    """Rows whose values each path could read its own way: missing and unknown groups, numeric group names,
    unlabelled rows, and a third group too small for min_samples."""
    rng = np.random.default_rng(seed)
    rows = []
    for _ in range(n):
        gender = rng.choice(["male", "female", "robot", "none"], p=[0.5, 0.4, 0.05, 0.05])
        site = rng.choice([1, 2, 3, 0], p=[0.55, 0.41, 0.01, 0.03])  # 0: missing; 3: a small group
        rows.append({"gender": None if gender == "none" else str(gender), "site": None if site == 0 else int(site),
                     "prediction": int(rng.random() < (0.45 if gender == "male" else 0.3)),
                     "label": None if rng.random() < 0.3 else int(rng.random() < 0.4)})  # fmt: skip
    return rows


def _event(i: int, row: dict[str, Any]) -> bytes:
    """The row as the daemon's event, in one of the forms a producer may use: booleans or numbers for 0/1, a
    null or an absent key for a missing value, 1.0 or 1 for a numeric group."""
    attributes: dict[str, Any] = {}
    for key in ("gender", "site"):
        value = row[key]
        if value is not None:
            attributes[key] = float(value) if key == "site" and i % 2 else value
        elif i % 3:
            attributes[key] = None  # else: absent
    event: dict[str, Any] = {"model_id": "m1", "prediction_id": f"p{i}", "timestamp": T0 - 60,
                             "prediction": bool(row["prediction"]) if i % 2 else row["prediction"],
                             "attributes": attributes}  # fmt: skip
    if row["label"] is not None:
        event["label"] = bool(row["label"]) if i % 4 < 2 else row["label"]
    elif i % 5:
        event["label"] = None  # else: absent
    return orjson.dumps(event)


@pytest.mark.parametrize("suffix", [".csv", ".parquet"])
def test_awkward_values_are_read_alike_by_the_gate_and_the_daemon(tmp_path: Path, suffix: str) -> None:
    config = parse_config({
        "model_id": "m1", "min_samples": 30, "metrics": MENU, "windows": ["1h"],
        "protected_attributes": [{"name": "gender", "groups": ["male", "female"]},
                                 {"name": "site", "groups": ["1", "2", "3"]}],
        "intersections": [["gender", "site"]], "listen": {"address": "127.0.0.1", "port": 0},
    }, "awkward-config")  # fmt: skip
    rows = _awkward_rows(1500, seed=20)
    daemon = Daemon(config, registry=CollectorRegistry(), clock=lambda: T0)
    daemon.ingest.handle("predictions", 0, [SimpleRecord(_event(i, r), i) for i, r in enumerate(rows)])
    daemon.computer.compute()
    samples = _parse(daemon.metrics_page())
    assert not [v for (name, _), v in samples.items() if name == "fairness_exporter_events_rejected_total" and v]

    # the gate's file: booleans for 0/1 (a CSV of True/False and blanks), blank cells, sites as numbers (a float
    # column once a cell is blank: 1.0 must still be group "1")
    frame = pd.DataFrame(rows).assign(prediction=lambda f: f.prediction.astype(bool),
                                      label=lambda f: f.label.map({0: False, 1: True}).astype("boolean"))
    path = tmp_path / f"rows{suffix}"
    frame.to_csv(path, index=False) if suffix == ".csv" else frame.to_parquet(path)
    report = run_audit(config, path)

    assert report["rows"] == 1500 and report["attributes"]["gender"]["overall_samples"] == 1500
    assert report["attributes"]["gender"]["excluded_rows"] == sum(r["gender"] not in ("male", "female") for r in rows)
    assert report["attributes"]["site"]["excluded_rows"] == sum(r["site"] is None for r in rows)
    assert report["attributes"]["site"]["groups"]["1"]["samples"] == sum(r["site"] == 1 for r in rows)
    small = [r for r in report["results"] if "3" in r["groups"].split(" vs ")]
    assert small and all(r["status"] == "insufficient_samples" and r["value"] is None for r in small)
    assert any(r["value"] is not None and r["evidence"] == "inconclusive" for r in report["results"])
    assert assert_the_page_shows_the_report(samples, report, ("1h",)) == len(report["results"])


def test_a_shared_file_of_a_model_that_emits_scores_is_read_alike_by_the_gate_and_the_daemon(tmp_path: Path) -> None:
    """Rows of two models in one file (recorded from a topic they share), the audited one emitting scores: the gate
    counts that model's rows alone and thresholds their scores, as the daemon does; the prediction column, which
    the daemon never reads for such a model, is the opposite verdict here and must not count."""
    config = parse_config({
        "model_id": "m1", "min_samples": 30, "metrics": MENU, "windows": ["1h"],
        "events": {"score_threshold": 0.6},
        "protected_attributes": [{"name": "gender", "groups": ["male", "female"]}],
        "listen": {"address": "127.0.0.1", "port": 0},
    }, "scores-config")  # fmt: skip
    rng = np.random.default_rng(24)
    rows = []
    for i in range(2000):
        gender = str(rng.choice(["male", "female"]))
        score = round(float(rng.beta(2, 2.5 if gender == "male" else 3.5)), 4)
        rows.append({"model_id": "m1" if i % 4 else "m2", "prediction_id": f"p{i}", "timestamp": T0 - 60,
                     "gender": gender, "score": score, "prediction": int(score < 0.6),
                     "label": int(rng.random() < 0.4)})  # fmt: skip
    rows[7]["score"] = 0.6  # the threshold itself counts as positive in both
    events = [orjson.dumps({**{k: r[k] for k in ("model_id", "prediction_id", "timestamp", "score", "prediction",
                                                  "label")}, "attributes": {"gender": r["gender"]}}) for r in rows]
    daemon = Daemon(config, registry=CollectorRegistry(), clock=lambda: T0)
    daemon.ingest.handle("predictions", 0, [SimpleRecord(e, i) for i, e in enumerate(events)])
    daemon.computer.compute()
    samples = _parse(daemon.metrics_page())

    path = tmp_path / "shared.parquet"
    pd.DataFrame(rows).to_parquet(path)
    report = run_audit(config, path)
    own = [r for r in rows if r["model_id"] == "m1"]
    assert report["rows"] == len(own) == 1500 and report["rows_of_other_models"] == 500
    male = [r for r in own if r["gender"] == "male"]
    assert report["attributes"]["gender"]["groups"]["male"]["selection_rate"] == pytest.approx(
        sum(r["score"] >= 0.6 for r in male) / len(male))
    assert assert_the_page_shows_the_report(samples, report, ("1h",)) == len(report["results"])

    with pytest.raises(ValueError, match=re.escape("no row has model_id 'm1'; the file's models are ['m2']")):
        run_audit(config, pd.DataFrame([r for r in rows if r["model_id"] == "m2"]))
    out_of_range = pd.DataFrame(own).assign(score=lambda f: f.score.where(f.index != 3, 1.5))
    with pytest.raises(ValueError, match=re.escape("'score' must hold scores, numbers between 0 and 1 "
                                                   "(events.score_threshold is 0.6); not so in 1 of 1500 rows "
                                                   "(first rows: [3])")):  # fmt: skip
        run_audit(config, out_of_range)


def test_the_worst_comparison_and_holm_evidence_agree_in_the_gate_the_daemon_and_backtest(tmp_path: Path) -> None:
    """Three groups, two of their three gaps clearly beyond the threshold: the gate's worst[] and evidence (Holm, the
    default), the daemon's /metrics and backtest's end-of-replay worst[] are one number, to 1e-9."""
    config = parse_config({
        "model_id": "m1", "min_samples": 30, "metrics": MENU, "windows": ["1h"],
        "protected_attributes": [{"name": "group", "groups": ["a", "b", "c"]},
                                 {"name": "site", "groups": ["x", "y"], "reference_group": "y"}],
        "listen": {"address": "127.0.0.1", "port": 0},
    }, "worst-config")  # fmt: skip
    rng = np.random.default_rng(41)
    n = 4500
    group = rng.choice(["a", "b", "c"], size=n)
    label = (rng.random(n) < 0.4).astype(int)
    selected = np.select([group == "a", group == "b"], [0.5, 0.3], 0.27) + 0.2 * label
    frame = pd.DataFrame({"model_id": "m1", "prediction_id": [f"p{i}" for i in range(n)],
                          "timestamp": T0 - 1800 + np.arange(n) * 1700 / n, "group": group,
                          "site": rng.choice(["x", "y"], size=n), "prediction": (rng.random(n) < selected).astype(int),
                          "label": label})  # fmt: skip
    events = [orjson.dumps({"model_id": "m1", "prediction_id": r.prediction_id, "timestamp": r.timestamp,
                            "prediction": r.prediction, "label": r.label,
                            "attributes": {"group": r.group, "site": r.site}}) for r in frame.itertuples()]
    (tmp_path / "events.jsonl").write_bytes(b"\n".join(events) + b"\n")

    report = run_audit(config, frame)
    daemon = Daemon(config, registry=CollectorRegistry(), clock=lambda: T0)
    daemon.ingest.handle("predictions", 0, [SimpleRecord(e, i) for i, e in enumerate(events)])
    daemon.computer.compute()
    assert assert_the_page_shows_the_report(_parse(daemon.metrics_page()), report, ("1h",)) == len(report["results"])
    replayed = {(w["attribute"], w["metric"]): w for w in backtest(config, [tmp_path / "events.jsonl"])["worst"]}

    dpd = {r["dimension"]: r for r in report["results"]
           if (r["attribute"], r["metric"]) == ("group", "demographic_parity_difference")}
    assert [dpd[d]["evidence"] for d in ("a_vs_b", "a_vs_c", "b_vs_c")] == ["fail", "fail", "inconclusive"]
    assert {r["comparisons_judged"] for r in dpd.values()} == {3}
    assert len(report["worst"]) == len(replayed) == 2 * len(MENU)
    for w in report["worst"]:
        other = replayed[(w["attribute"], w["metric"])]
        assert (other["window"], other["dimension"], other["comparisons_judged"]) == \
            ("1h", w["dimension"], w["comparisons_judged"]), (w, other)  # fmt: skip
        for mine, theirs in zip([w["value"], *w["ci_simultaneous"]], [other["value"], *other["ci_simultaneous"]],
                                strict=True):  # fmt: skip
            assert (mine is None and theirs is None) or abs(mine - theirs) <= 1e-9, (w, other)
    assert {w["comparisons_judged"] for w in report["worst"] if w["attribute"] == "site"} == {1}  # against y alone


DECILE_BUCKETS = [0.15, 0.25, 0.35, 0.45, 0.55, 0.65, 0.75, 0.85, 0.95]  # one bin per COMPAS decile (score / 10)


def test_compas_auc_per_group_and_auc_difference_are_scikit_learns_in_the_gate_the_daemon_and_backtest(
    tmp_path: Path,
) -> None:
    """COMPAS' decile scores (score = decile / 10, predicted positive from 0.5 as ProPublica did): each race's and
    sex's AUC is scikit-learn's roc_auc_score of the deciles, and auc_difference its gap, to 1e-9, in the gate's
    report, on the daemon's /metrics and in backtest's worst comparisons."""
    frame = compas_frame()
    config = parse_config({
        "model_id": "compas", "protected_attributes": COMPAS_ATTRIBUTES[:2], "min_samples": 30, "windows": ["1h"],
        "metrics": [*SEED_METRICS, {"name": "auc_difference", "threshold": 0.05}],
        "events": {"score_threshold": 0.45, "score_buckets": DECILE_BUCKETS},
        "listen": {"address": "127.0.0.1", "port": 0},
    }, "compas-scores")  # fmt: skip
    events = [orjson.dumps({"model_id": "compas", "prediction_id": f"p{i}", "timestamp": T0 - 60, "score": r.score,
                            "label": int(r.label), "attributes": {"race": r.race, "sex": r.sex}})
              for i, r in enumerate(frame.itertuples())]  # fmt: skip
    (tmp_path / "compas.jsonl").write_bytes(b"\n".join(events) + b"\n")

    report = run_audit(config, frame.drop(columns="prediction"))
    daemon = Daemon(config, registry=CollectorRegistry(), clock=lambda: T0)
    daemon.ingest.handle("predictions", 0, [SimpleRecord(e, i) for i, e in enumerate(events)])
    daemon.computer.compute()
    samples = _parse(daemon.metrics_page())
    assert assert_the_page_shows_the_report(samples, report, ("1h",)) == len(report["results"]) == 4 * 4
    replayed = {(w["attribute"], w["metric"]): w for w in backtest(config, [tmp_path / "compas.jsonl"])["worst"]}

    for attribute, groups in (("race", RACE_GROUPS), ("sex", ["Male", "Female"])):
        oracle = {}
        for group in groups:
            rows = frame[frame[attribute] == group]
            oracle[group] = roc_auc_score(rows.label, rows.score)
            shown = report["attributes"][attribute]["groups"][group]
            _close(shown["auc"], oracle[group], (attribute, group))
            _close(_get(samples, "compas", "model_score_auc", attribute=attribute, window="1h", subgroup=group),
                   oracle[group], (attribute, group))  # fmt: skip
            for bound, side in zip(shown["auc_ci"], ("lower", "upper"), strict=True):
                _close(_get(samples, "compas", f"model_score_auc_{side}", attribute=attribute, window="1h",
                            subgroup=group), bound, (attribute, group, side))  # fmt: skip
            assert shown["auc_ci"][0] < shown["auc"] < shown["auc_ci"][1]
        gaps = [r for r in report["results"] if (r["attribute"], r["metric"]) == (attribute, "auc_difference")]
        for r in gaps:
            a, b = r["groups"].split(" vs ")
            _close(r["exact_value"], abs(oracle[a] - oracle[b]), r)
        (worst,) = [w for w in report["worst"] if (w["attribute"], w["metric"]) == (attribute, "auc_difference")]
        other = replayed[(attribute, "auc_difference")]
        assert (other["dimension"], other["comparisons_judged"]) == (worst["dimension"], len(gaps))
        for mine, theirs in zip([worst["value"], *worst["ci_simultaneous"]],
                                [other["value"], *other["ci_simultaneous"]], strict=True):  # fmt: skip
            _close(theirs, mine, worst)
