"""The daemon against a real Kafka-protocol broker, scraped over real HTTP.

Events with known group rates give the right gauges (equal to the audit gate's numbers on the same rows); bad
and late events are counted and excluded; the daemon survives a broker restart, and a SIGKILL followed by a
restart from the checkpoint loses no event and counts none twice. Every test runs on both client libraries.
"""

from __future__ import annotations

import gc
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import orjson
import pytest
import yaml
from broker_fixture import produce
from daemon_config import make_config
from daemon_fixture import GROUPS, consumed, kafka_config, payloads, sample, scrape, synthetic_rows, wait_for

from exporter import daemon as daemon_module
from exporter.daemon import GC_THRESHOLDS, Daemon, settle_heap
from exporter.devtools.embedded_broker import EmbeddedBroker, free_port
from exporter.gate.fairness.audit import run_audit


def test_scraped_gauges_equal_the_audit_gate_on_the_same_rows(kafka_broker: EmbeddedBroker, topic: str,
                                                               running: Callable[..., Daemon]) -> None:  # fmt: skip
    rows = synthetic_rows(3000, seed=11)
    produce(kafka_broker.bootstrap_servers, topic, payloads(rows, time.time()))
    metrics = [{"name": m, "threshold": 0.1} for m in (
        "demographic_parity_difference", "equalised_odds_difference", "disparate_impact_ratio")]  # fmt: skip
    daemon = running(kafka_broker.bootstrap_servers, topic, metrics=metrics)
    wait_for(lambda: consumed(daemon.port) == 3000, what="3000 events consumed")
    daemon.computer.compute()  # or wait a second for the schedule; the scrape must not trigger it
    samples = scrape(daemon.port)

    report = run_audit(make_config(metrics=metrics), rows.assign(label=rows.label.where(rows.label >= 0)))
    checked = 0
    for r in report["results"]:
        a, b = r["groups"].split(" vs ")
        for window in ("1h", "24h"):
            got = sample(samples, f"model_{r['metric']}", model_id="m1", attribute=r["attribute"], window=window,
                         dimension=f"{a}_vs_{b}", group_a=a, group_b=b)  # fmt: skip
            assert got == pytest.approx(r["exact_value"], abs=1e-12), r
            checked += 1
    assert checked == 12
    male = rows[rows.gender == "male"]
    got_rate = sample(samples, "model_positive_prediction_rate", model_id="m1", attribute="gender", window="1h",
                      subgroup="male")  # fmt: skip
    assert got_rate == pytest.approx(male.prediction.mean(), abs=1e-12)
    assert sample(samples, "model_subgroup_samples", model_id="m1", attribute="gender", window="1h",
                  subgroup="overall") == 3000  # fmt: skip
    lag = [v for (name, _), v in samples.items() if name == "fairness_exporter_consumer_lag_messages"]
    assert lag == [0.0, 0.0, 0.0]


def test_bad_late_and_foreign_events_are_counted_and_excluded(kafka_broker: EmbeddedBroker, topic: str,
                                                              running: Callable[..., Daemon],
                                                              client_library: str) -> None:  # fmt: skip
    now = time.time()
    good = payloads(synthetic_rows(100, seed=3), now)
    bad = [b"{broken", orjson.dumps({"model_id": "m1", "timestamp": now, "prediction": 7,
                                     "attributes": {"gender": "male", "age": "old"}})]  # fmt: skip
    unknown = [orjson.dumps({"model_id": "m1", "timestamp": now, "prediction": 1,
                             "attributes": {"gender": "robot", "age": "old"}})]  # fmt: skip
    late = payloads(synthetic_rows(5, seed=4), now - 3 * 86400)
    foreign = [orjson.dumps({"model_id": "other-model", "timestamp": now})] * 4
    produce(kafka_broker.bootstrap_servers, topic, good + bad + unknown + late + foreign + [b""])
    kafka_broker.create_topic(f"{topic}-dlq")  # the daemon never creates it
    daemon = running(kafka_broker.bootstrap_servers, topic, kafka={
        **kafka_config(kafka_broker.bootstrap_servers, topic, client_library)["kafka"],
        "dead_letter_topic": f"{topic}-dlq"})
    wait_for(lambda: consumed(daemon.port) == 113, what="113 events consumed")
    daemon.computer.compute()
    s = scrape(daemon.port)
    assert sample(s, "fairness_exporter_events_rejected_total", reason="malformed_json") == 2  # "{broken" and b""
    assert sample(s, "fairness_exporter_events_rejected_total", reason="invalid_prediction") == 1
    assert sample(s, "fairness_exporter_events_late_total") == 5
    assert sample(s, "fairness_exporter_events_ignored_total", reason="unconfigured_model") == 4
    # the "robot" event is no defect: it counts overall and for age, and as gender's unknown category
    assert sample(s, "model_subgroup_samples", model_id="m1", attribute="gender", window="24h",
                  subgroup="overall") == 101  # fmt: skip
    assert sample(s, "model_subgroup_unknown_samples", model_id="m1", attribute="gender", window="24h") == 1
    assert sample(s, "model_subgroup_unknown_samples", model_id="m1", attribute="age", window="24h") == 0
    # no series was created for the unknown value
    assert not [k for k in s if ("subgroup", "robot") in k[1]]
    from broker_fixture import consume_all

    dead = consume_all(kafka_broker.bootstrap_servers, f"{topic}-dlq", 3)
    assert sorted(dict(r.headers)["reason"].decode() for r in dead) == [
        "invalid_prediction", "malformed_json", "malformed_json"]


def _serve(config_path: Path, log: Path) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-m", "exporter.cli", "serve", "--config", str(config_path)],
                            stdout=log.open("ab"), stderr=subprocess.STDOUT)  # fmt: skip


def _totals(port: int) -> dict[tuple[str, str], float]:
    try:
        s = scrape(port)
    except OSError:
        return {}
    return {(dict(labels)["subgroup"], dict(labels)["predicted"]): v for (name, labels), v in s.items()
            if name == "fairness_predictions_total" and dict(labels)["attribute"] == "gender"}  # fmt: skip


def test_sigkill_and_restart_from_the_checkpoint_neither_loses_nor_double_counts(
    kafka_broker: EmbeddedBroker, topic: str, tmp_path: Path, client_library: str
) -> None:
    port = free_port()
    raw = {"model_id": "m1", "protected_attributes": [{"name": k, "groups": v} for k, v in GROUPS.items()],
           "listen": {"address": "127.0.0.1", "port": port}, "windows": ["1h"],
           "checkpoint": {"path": str(tmp_path / "state"), "interval": "1s"},
           **kafka_config(kafka_broker.bootstrap_servers, topic, client_library)}  # fmt: skip
    config_path = tmp_path / "config.yaml"
    config_path.write_text(yaml.safe_dump(raw))
    rows = synthetic_rows(6000, seed=21)
    expected = rows.groupby(["gender", "prediction"]).size()
    data = payloads(rows, time.time())
    log = tmp_path / "daemon.log"

    produce(kafka_broker.bootstrap_servers, topic, data[:2000])
    first = _serve(config_path, log)
    try:
        wait_for(lambda: sum(_totals(port).values()) >= 2000, what="the first 2000 events", log=log)
        wait_for(lambda: (tmp_path / "state" / "fleet.checkpoint.npz").exists(), what="a checkpoint")
        produce(kafka_broker.bootstrap_servers, topic, data[2000:4000])
        time.sleep(0.3)  # let it get part of the way through the second batch
    finally:
        first.send_signal(signal.SIGKILL)
        first.wait(10)
    produce(kafka_broker.bootstrap_servers, topic, data[4000:])
    second = _serve(config_path, log)
    try:
        wait_for(lambda: sum(_totals(port).values()) >= 6000, what="all 6000 events after the restart", log=log)
        time.sleep(2)  # anything counted twice would show up now
        totals = _totals(port)
    finally:
        second.send_signal(signal.SIGTERM)
        assert second.wait(20) == 0, log.read_text()[-3000:]
    assert totals == {(g, str(p)): float(n) for (g, p), n in expected.items()}
    assert "restored checkpoint" in log.read_text()


def test_sigterm_writes_a_final_checkpoint_and_commits_its_offsets(
    kafka_broker: EmbeddedBroker, topic: str, tmp_path: Path, client_library: str
) -> None:
    port = free_port()
    raw = {"model_id": "m1", "protected_attributes": [{"name": k, "groups": v} for k, v in GROUPS.items()],
           "listen": {"address": "127.0.0.1", "port": port},
           "checkpoint": {"path": str(tmp_path), "interval": "1h"},  # only the shutdown writes one
           **kafka_config(kafka_broker.bootstrap_servers, topic, client_library)}  # fmt: skip
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(raw))
    produce(kafka_broker.bootstrap_servers, topic, payloads(synthetic_rows(300, seed=8), time.time()), partition=1)
    proc = _serve(tmp_path / "c.yaml", tmp_path / "log")
    wait_for(lambda: sum(_totals(port).values()) == 300, 120.0, "300 events", log=tmp_path / "log")
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(20) == 0
    from kafka import KafkaConsumer, TopicPartition

    consumer = KafkaConsumer(bootstrap_servers=kafka_broker.bootstrap_servers, group_id=f"g-{topic}",
                             enable_auto_commit=False)  # fmt: skip
    try:
        assert consumer.committed(TopicPartition(topic, 1)) == 300
    finally:
        consumer.close()
    with np.load(tmp_path / "fleet.checkpoint.npz") as cp:
        # columns 0 and 1 are predicted positives and negatives: every event once per attribute
        assert int(cp["m0.totals"][:, :2].sum()) == 2 * 300
    assert os.path.getsize(tmp_path / "fleet.checkpoint.npz") > 0


def test_labels_from_their_own_topic_join_their_predictions(kafka_broker: EmbeddedBroker, topic: str,
                                                            running: Callable[..., Daemon],
                                                            client_library: str) -> None:  # fmt: skip
    labels_topic = f"{topic}-labels"
    kafka_broker.create_topic(labels_topic, partitions=2)
    rows = synthetic_rows(600, seed=9).assign(label=lambda f: np.random.default_rng(1).integers(0, 2, len(f)))
    unlabelled = rows.assign(label=-1)
    produce(kafka_broker.bootstrap_servers, topic, payloads(unlabelled, time.time()))
    # the labels arrive later, on their own topic, keyed by prediction_id (the first 10 twice: duplicates)
    labels = [orjson.dumps({"prediction_id": f"p{i}", "label": int(y)}) for i, y in enumerate(rows.label)]
    produced_after = time.time()
    produce(kafka_broker.bootstrap_servers, labels_topic, labels + labels[:10])
    daemon = running(kafka_broker.bootstrap_servers, topic, kafka={
        **kafka_config(kafka_broker.bootstrap_servers, topic, client_library)["kafka"], "labels_topic": labels_topic})
    wait_for(lambda: sample(scrape(daemon.port), "fairness_exporter_labels_joined_total") == 600, what="600 joins")
    # the labels' clock is fed by the records' Kafka timestamps: no later than their production
    delays = dict(daemon.fleet.joins.label_delays)
    assert delays and {t for t, _ in delays} == {labels_topic}
    assert all(0 <= delay <= read_at - produced_after + 0.01 for delay, read_at in delays.values())
    daemon.computer.compute()
    s = scrape(daemon.port)
    assert sample(s, "fairness_exporter_labels_dropped_total", reason="duplicate_label") == 10
    for gender, group in rows.groupby("gender"):
        positives = group[group.label == 1]
        got = sample(s, "model_true_positive_rate", model_id="m1", attribute="gender", window="1h", subgroup=gender)
        assert got == pytest.approx(positives.prediction.mean(), abs=1e-12)
        assert sample(s, "model_labelled_fraction", model_id="m1", attribute="gender", window="1h",
                      subgroup=gender) == 1.0  # fmt: skip


def test_a_started_daemon_freezes_its_start_up_heap_and_collects_young_objects_less_often(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``run_forever`` settles the heap once started (after ``start``): every object start-up left alive is out of
    the collector's sight, and young collections run every 10,000 allocations."""
    daemon = Daemon(make_config())
    calls: list[str] = []
    monkeypatch.setattr(daemon, "start", lambda: calls.append("start"))
    monkeypatch.setattr(daemon_module, "settle_heap", lambda: calls.append("settle_heap"))
    handlers = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)}
    daemon._done.set()  # stop at once
    try:
        daemon.run_forever()
    finally:
        for sig, handler in handlers.items():
            signal.signal(sig, handler)
    assert calls == ["start", "settle_heap"]
    thresholds = gc.get_threshold()
    try:
        settle_heap()
        assert gc.get_threshold() == GC_THRESHOLDS == (10_000, 10, 10)
        assert gc.get_freeze_count() > 10_000  # the interpreter's, the libraries' and the daemon's objects
        assert not any(o is daemon.fleet for generation in range(3) for o in gc.get_objects(generation))
    finally:
        gc.unfreeze()
        gc.set_threshold(*thresholds)
    assert any(o is daemon.fleet for o in gc.get_objects(2))  # collected again, as an old object
