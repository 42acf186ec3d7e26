"""The daemon's explanations: counts per (subgroup x segment value) in its windows, and ``GET /explain`` answering
what the gate's report says of the same rows (a window against the one before it, the gate's --baseline)."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pandas as pd
import pytest
from broker_fixture import produce
from daemon_config import make_config
from daemon_fixture import consumed, wait_for
from payload_logs import cloudevent
from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families

from exporter.backtest.replay import backtest
from exporter.config import ConfigError
from exporter.daemon import Daemon
from exporter.devtools.embedded_broker import EmbeddedBroker
from exporter.gate.fairness.audit import run_audit

CHANNELS = ("broker", "web", "branch")
SETTINGS: dict[str, Any] = {
    "segments": ["channel"], "windows": ["10m"], "bucket": "10s", "allowed_lateness": "15m",
    "metrics": [{"name": "demographic_parity_difference", "threshold": 0.05},
                {"name": "equal_opportunity_difference", "threshold": 0.05}],
}  # fmt: skip


def _rows(rng: np.random.Generator, n: int, female_broker: float) -> pd.DataFrame:
    """Rows with a channel; women's selection rate at the broker is ``female_broker``, every other rate 0.5 (0.3 in
    branches); half the rows labelled."""
    gender = rng.choice(["male", "female"], n)
    channel = rng.choice(CHANNELS, n, p=[0.3, 0.5, 0.2])
    rate = np.where(channel == "branch", 0.3, 0.5)
    rate = np.where((gender == "female") & (channel == "broker"), female_broker, rate)
    prediction = (rng.random(n) < rate).astype(int)
    label = np.where(rng.random(n) < 0.5, -1, np.where(rng.random(n) < 0.8, prediction, 1 - prediction))
    return pd.DataFrame({"gender": gender, "age": rng.choice(["young", "old"], n), "channel": channel,
                         "prediction": prediction, "label": label})  # fmt: skip


def _events(rows: pd.DataFrame, ts: float, first: int) -> list[bytes]:
    return [orjson.dumps({"model_id": "m1", "prediction_id": f"p{first + i}", "timestamp": ts,
                          "prediction": int(r.prediction), "label": None if r.label < 0 else int(r.label),
                          "attributes": {"gender": r.gender, "age": r.age, "channel": r.channel}})
            for i, r in enumerate(rows.itertuples())]  # fmt: skip


def _explain(port: int, query: str) -> tuple[int, dict[str, Any]]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/explain?{query}", timeout=5) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


def _by_segment(explanation: dict[str, Any]) -> dict[tuple[str, str], dict[str, Any]]:
    return {(s["column"], s["value"]): s for s in explanation["segments"]}


def test_explain_answers_the_gates_explanation_of_the_same_rows(kafka_broker: EmbeddedBroker, topic: str,
                                                                running: Callable[..., Daemon]) -> None:  # fmt: skip
    rng = np.random.default_rng(3)
    before, after = _rows(rng, 2000, 0.5), _rows(rng, 2000, 0.2)
    now = time.time()
    # the window is the last 10 minutes, its baseline the 10 before: events 14 and 4 minutes old, well inside each
    produce(kafka_broker.bootstrap_servers, topic, _events(before, now - 840, 0) + _events(after, now - 240, 2000))
    daemon = running(kafka_broker.bootstrap_servers, topic, **SETTINGS)
    wait_for(lambda: consumed(daemon.port) == 4000, what="4000 events consumed")
    daemon.computer.compute()

    status, answer = _explain(daemon.port, "model=m1&attribute=gender&metric=demographic_parity_difference")
    assert status == 200 and answer["window"] == "10m"
    assert answer["baseline"][1] == answer["current"][0] and answer["current"][1] - answer["current"][0] == 600
    unlabelled = {"label": lambda f: f.label.where(f.label >= 0)}
    report = run_audit(make_config(**SETTINGS).model(), after.assign(**unlabelled),
                       baseline=before.assign(**unlabelled))
    gate = [e for e in report["explanations"]
            if e["attribute"] == "gender" and e["metric"] == "demographic_parity_difference"]  # fmt: skip
    assert len(answer["explanations"]) == len(gate) == 1
    got, want = answer["explanations"][0], gate[0]
    assert (got["comparison"], got["summary"]) == (want["comparison"], want["summary"])
    for key in ("baseline_value", "current_value", "change"):
        assert got[key] == pytest.approx(want[key], abs=1e-9)
    assert _by_segment(got).keys() == _by_segment(want).keys() == {("channel", c) for c in CHANNELS}
    for key, segment in _by_segment(want).items():
        for term in ("mix", "rate"):
            assert _by_segment(got)[key][term] == pytest.approx(segment[term], abs=1e-9)
            assert _by_segment(got)[key][f"{term}_ci_95"] == pytest.approx(segment[f"{term}_ci_95"], abs=1e-9)
    assert "female's selection rate within channel=broker" in got["summary"]

    # the labelled metric too (the TPR within channels), and a 404 that says what exists
    status, tpr = _explain(daemon.port, "model=m1&attribute=gender&metric=equal_opportunity_difference")
    want_tpr = next(e for e in report["explanations"]
                    if e["attribute"] == "gender" and e["metric"] == "equal_opportunity_difference")  # fmt: skip
    assert status == 200 and tpr["explanations"][0]["change"] == pytest.approx(want_tpr["change"], abs=1e-9)
    status, refused = _explain(daemon.port, "model=m2&attribute=gender&metric=demographic_parity_difference")
    assert status == 404 and refused["models"] == ["m1"]


T0 = 1_800_000_000.0


@dataclass
class _Record:
    value: bytes
    offset: int


@dataclass
class _Logged:
    """A payload-log record as the client hands it over: value, headers, key, offset."""

    value: bytes | None
    headers: list[tuple[str, bytes]]
    key: bytes | None
    offset: int


def _make(tmp_path: Path) -> Daemon:
    config = make_config(kafka={"labels_topic": "labels"}, checkpoint={"path": str(tmp_path / "state")},
                         **SETTINGS)  # fmt: skip
    daemon = Daemon(config, registry=CollectorRegistry(), clock=lambda: T0)
    daemon.checkpointer.restore()  # what start() does first
    return daemon


def test_delayed_labels_walked_events_and_a_restart_keep_the_explanation(tmp_path: Path) -> None:
    """Labels that arrive later count in their prediction's segment; a segment value sent as a number (an event the
    schema hands to the walk) is its text, as in the gate; a checkpoint keeps the counts and each column's values."""
    rng = np.random.default_rng(5)
    before, after = _rows(rng, 600, 0.5), _rows(rng, 600, 0.2)
    for frame in (before, after):
        frame["channel"] = frame["channel"].astype(object)
        frame.loc[frame.index[:40], "channel"] = 7  # a number: the gate reads it as "7", the daemon's walk too
    events = [orjson.loads(e) | {"label": None} for e in _events(before, T0 - 840, 0) + _events(after, T0 - 240, 600)]
    labels = [{"prediction_id": e["prediction_id"], "label": int(r.label)}
              for e, r in zip(events, pd.concat([before, after]).itertuples(), strict=True) if r.label >= 0]
    first = _make(tmp_path)
    first.ingest.handle("predictions", 0, [_Record(orjson.dumps(e), i) for i, e in enumerate(events)])
    first.checkpointer.write()
    second = _make(tmp_path)  # restored: counts, value tables and the predictions waiting for their labels
    second.ingest.handle("labels", 0, [_Record(orjson.dumps(y), i) for i, y in enumerate(labels)])
    explained = second.computer.compute().models[0].explained
    assert explained is not None
    unlabelled = {"label": lambda f: f.label.where(f.label >= 0)}
    gate = run_audit(make_config(**SETTINGS).model(), after.assign(**unlabelled), baseline=before.assign(**unlabelled))
    got = {(e["attribute"], e["metric"], e["comparison"]): e for e in explained["10m"]["explanations"]}
    assert len(got) == len(gate["explanations"]) == 4
    for want in gate["explanations"]:
        e = got[want["attribute"], want["metric"], want["comparison"]]
        assert e["change"] == pytest.approx(want["change"], abs=1e-9)
        assert _by_segment(e).keys() == _by_segment(want).keys() and ("channel", "7") in _by_segment(e)
        for key, segment in _by_segment(want).items():
            assert (_by_segment(e)[key]["mix"], _by_segment(e)[key]["rate"]) == pytest.approx(
                (segment["mix"], segment["rate"]), abs=1e-9)
    # /metrics: the three largest terms of each explained rate's change, rank 1 the largest (what alerts name)
    dpd = next(e for e in gate["explanations"]
               if e["metric"] == "demographic_parity_difference" and e["attribute"] == "gender")  # fmt: skip
    terms = sorted(((s[t], f"{s['column']}={s['value']}", t) for s in dpd["segments"] for t in ("rate", "mix")),
                   key=lambda x: -abs(x[0]))  # fmt: skip
    page = {(s.labels["rank"], s.labels["segment"], s.labels["term"]): s.value
            for family in text_string_to_metric_families(second.metrics_page()) for s in family.samples
            if s.name == "model_explanation_top_contribution" and s.labels["rate"] == "selection_rate"
            and s.labels["attribute"] == "gender"}  # fmt: skip
    assert page.keys() == {(str(rank), segment, term) for rank, (_, segment, term) in enumerate(terms[:3], start=1)}
    assert [page[str(rank), s, t] for rank, (_, s, t) in enumerate(terms[:3], start=1)] == pytest.approx(
        [v for v, _, _ in terms[:3]], abs=1e-9)


def test_backtest_explains_each_page_as_the_gate_explains_its_two_windows(tmp_path: Path) -> None:
    """Women's approval at the broker falls after two fair hours: the page's explanation names that segment, and
    equals the gate's explanation of the rows of the page's window against those of the window before it."""
    rng = np.random.default_rng(9)
    frames = []
    for minute in range(240):
        rows = _rows(rng, 60, 0.5 if minute < 120 else 0.05)  # a gap of 0.135 against a threshold of 0.05
        frames.append(rows.assign(timestamp=T0 + 60 * minute + rng.uniform(0, 60, len(rows))))
    rows = pd.concat(frames, ignore_index=True)
    with (tmp_path / "events.jsonl").open("wb") as f:
        for i, r in enumerate(rows.itertuples()):
            f.write(orjson.dumps({"model_id": "m1", "prediction_id": f"p{i}", "timestamp": r.timestamp,
                                  "prediction": int(r.prediction), "label": None if r.label < 0 else int(r.label),
                                  "attributes": {"gender": r.gender, "age": r.age, "channel": r.channel}}) + b"\n")
    settings = {**SETTINGS, "windows": ["1h"], "bucket": "1m", "allowed_lateness": "5m"}
    report = backtest(make_config(**settings), [tmp_path / "events.jsonl"])
    pages = [a for a in report["alerts"]
             if a["alert"] == "FairnessDemographicParityDrift" and a["attribute"] == "gender"]  # fmt: skip
    assert pages and all("explanation" in a for a in pages)
    e = pages[0]["explanation"]
    assert "female's selection rate within channel=broker" in e["summary"]
    start, middle = (datetime.fromisoformat(t).timestamp() for t in e["baseline"])
    assert e["current"][0] == e["baseline"][1]
    # the page's window: its segment buckets up to the step that paged, which had counted the events until then
    now = datetime.fromisoformat(pages[0]["fired_at"]).timestamp()
    in_period = lambda keep: rows[keep].assign(label=lambda f: f.label.where(f.label >= 0))  # noqa: E731
    current = (rows.timestamp >= middle) & (rows.timestamp <= now + 1e-6)
    gate = run_audit(make_config(**settings).model(), in_period(current),
                     baseline=in_period((rows.timestamp >= start) & (rows.timestamp < middle)))
    want = next(g for g in gate["explanations"] if g["attribute"] == "gender" and g["rate"] == "selection_rate"
                and g["comparison"] == e["comparison"])  # fmt: skip
    assert e["change"] == pytest.approx(want["change"], abs=1e-9) and e["summary"] == want["summary"]
    for key, segment in _by_segment(want).items():
        assert _by_segment(e)[key]["rate"] == pytest.approx(segment["rate"], abs=1e-9)
        assert _by_segment(e)[key]["mix_ci_95"] == pytest.approx(segment["mix_ci_95"], abs=1e-9)


def test_the_daemon_exports_the_conditional_metrics_as_the_gate_computes_them(tmp_path: Path) -> None:
    """Simpson's paradox, as in the gate's test: on /metrics the raw gap, and beside it the conditional ones with
    their intervals, evidence and thresholds, equal to the gate's on the same rows."""
    parts = []
    for group, high in (("female", 0.25), ("male", 0.5)):
        for band, share, rate in (("high", high, 0.6), ("low", 1 - high, 0.2)):
            n = int(2000 * share)
            k = round(n * rate)
            parts.append(pd.DataFrame({"gender": group, "age": "young", "income_band": band,
                                       "prediction": [1] * k + [0] * (n - k)}))  # fmt: skip
    rows = pd.concat(parts, ignore_index=True).assign(label=-1)
    names = ("conditional_demographic_parity_difference", "conditional_demographic_disparity")
    settings = {"strata": ["income_band"], "windows": ["10m"], "bucket": "10s", "allowed_lateness": "15m",
                "metrics": [{"name": "demographic_parity_difference", "threshold": 0.05},
                            *({"name": n, "threshold": 0.05} for n in names)]}  # fmt: skip
    config = make_config(checkpoint={"path": str(tmp_path / "state")}, **settings)
    daemon = Daemon(config, registry=CollectorRegistry(), clock=lambda: T0)
    events = [orjson.dumps({"model_id": "m1", "prediction_id": f"p{i}", "timestamp": T0 - 120,
                            "prediction": int(r.prediction), "label": None,
                            "attributes": {"gender": r.gender, "age": r.age, "income_band": r.income_band}})
              for i, r in enumerate(rows.itertuples())]  # fmt: skip
    daemon.ingest.handle("predictions", 0, [_Record(e, i) for i, e in enumerate(events)])
    daemon.computer.compute()
    page = {(s.name, s.labels.get("metric", "")): s.value
            for family in text_string_to_metric_families(daemon.metrics_page()) for s in family.samples
            if (s.labels.get("attribute") == "gender" and s.labels.get("evidence", "pass") == "pass")
            or s.name == "fairness_threshold"}  # fmt: skip
    gate = {r["metric"]: r for r in run_audit(make_config(**settings).model(), rows.assign(label=None))["results"]
            if r["attribute"] == "gender"}  # fmt: skip
    assert page["model_demographic_parity_difference", ""] == pytest.approx(0.10) == gate[
        "demographic_parity_difference"]["exact_value"]
    for name in names:
        assert page[f"model_{name}", ""] == pytest.approx(gate[name]["exact_value"], abs=1e-9)
        assert page[f"model_{name}_upper", ""] == pytest.approx(gate[name]["ci_95"][1], abs=1e-9)
        assert page["model_comparison_evidence", name] == 1.0 and gate[name]["evidence"] == "pass"
    assert page["model_conditional_demographic_parity_difference", ""] == pytest.approx(0.0, abs=1e-12)
    assert {m for (n, m) in page if n == "fairness_threshold"} >= set(names)


def test_a_kserve_payload_log_is_explained_as_the_gate_explains_its_rows(tmp_path: Path) -> None:
    """A payload's row columns are the segment columns, as they are the attributes: v1 instances with a channel."""
    rng = np.random.default_rng(11)
    before, after = _rows(rng, 400, 0.5), _rows(rng, 400, 0.2)
    records = []
    for frame, ts in ((before, T0 - 840), (after, T0 - 240)):
        for r in frame.itertuples():
            pid = f"c{len(records)}"
            body = orjson.dumps({"instances": [{"gender": r.gender, "age": r.age, "channel": r.channel}]})
            records += [cloudevent("m1", pid, False, body, ts), cloudevent("m1", pid, True,
                                                                         orjson.dumps({"predictions": [r.prediction]}),
                                                                         ts)]  # fmt: skip
    config = make_config(events={"format": "kserve", "prediction": "predictions"}, **SETTINGS)
    daemon = Daemon(config, registry=CollectorRegistry(), clock=lambda: T0)
    daemon.ingest.handle("predictions", 0, [_Logged(*r, offset=i) for i, r in enumerate(records)])
    explained = daemon.computer.compute().models[0].explained
    assert explained is not None
    settings = {**SETTINGS, "metrics": SETTINGS["metrics"][:1]}  # the payloads carry no labels
    gate = run_audit(make_config(**settings).model(), after.drop(columns="label"),
                     baseline=before.drop(columns="label"))
    got = {(e["attribute"], e["comparison"]): e for e in explained["10m"]["explanations"]
           if e["metric"] == "demographic_parity_difference"}  # fmt: skip
    for want in gate["explanations"]:
        e = got[want["attribute"], want["comparison"]]
        assert e["change"] == pytest.approx(want["change"], abs=1e-9) and e["summary"] == want["summary"]


def test_baseline_offset_compares_the_window_with_one_further_back(tmp_path: Path) -> None:
    """baseline_offset: 20m compares the last 10 minutes with 20 to 30 minutes ago (events 14 minutes old, in the
    window just before, count in neither); an offset shorter than the longest window is refused."""
    rng = np.random.default_rng(13)
    before, skipped, after = _rows(rng, 600, 0.5), _rows(rng, 600, 0.9), _rows(rng, 600, 0.2)
    settings = {**SETTINGS, "allowed_lateness": "30m", "baseline_offset": "20m"}
    daemon = Daemon(make_config(**settings), registry=CollectorRegistry(), clock=lambda: T0)
    events = _events(before, T0 - 1500, 0) + _events(skipped, T0 - 840, 600) + _events(after, T0 - 240, 1200)
    daemon.ingest.handle("predictions", 0, [_Record(e, i) for i, e in enumerate(events)])
    explained = daemon.computer.compute().models[0].explained
    assert explained is not None and explained["10m"]["current"][0] - explained["10m"]["baseline"][1] == 600
    unlabelled = {"label": lambda f: f.label.where(f.label >= 0)}
    gate = run_audit(make_config(**SETTINGS).model(), after.assign(**unlabelled), baseline=before.assign(**unlabelled))
    got = {(e["attribute"], e["metric"], e["comparison"]): e for e in explained["10m"]["explanations"]}
    for want in gate["explanations"]:
        assert got[want["attribute"], want["metric"], want["comparison"]]["change"] == pytest.approx(
            want["change"], abs=1e-9)
    with pytest.raises(ConfigError, match="baseline_offset: m1: 300 s is shorter than the longest window"):
        make_config(**{**settings, "baseline_offset": "5m"})
