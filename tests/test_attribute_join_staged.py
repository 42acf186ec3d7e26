"""Attributes joined by id on the staged path (``kafka.stages: staged``), on the real broker: two replicas of one
group (one on each client library) and a direct daemon read the same predictions, which carry only
``applicant_id``, and the same compacted demographics topic (80% of the records before the prediction, 15% after
it within the horizon, 5% never, a few corrected). The replica that owns the model is SIGKILLed in the middle, with
predictions waiting for their records; the other takes the model over from its snapshot. Its per-subgroup counts
equal the truth and the direct daemon's exactly. The same, driven poll by poll (as tests/test_stages.py drives the
stages): the waiting predictions restored on another replica whose table read their records before it took over."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import orjson
import pytest
import yaml
from daemon_config import make_config
from daemon_fixture import GROUP_CLIENT, Replica, probe, sample, scrape, wait_for
from payload_logs import cloudevent, numpy_response, pandas_request, send
from prometheus_client import CollectorRegistry
from side_traffic import ATTRIBUTES, GENDERS, RACES, SOURCE, Scenario, scenario
from test_attribute_join import Clock, Rec
from test_attribute_join import assert_truth as assert_truth_in_memory
from test_attribute_join import daemon as direct_daemon
from test_attribute_join_kafka import assert_truth, counted, send_side, started, topics
from test_attribute_join_kafka import config as direct_config
from test_payload_staged import PayloadRecord, drain
from test_stages import pump
from test_stages_scale_out import _snapshots_cover_everything

from exporter.config import Config
from exporter.daemon import Daemon
from exporter.devtools.embedded_broker import EmbeddedBroker, free_port
from exporter.stream.stages.replica import Stages

HORIZON = 90  # seconds: the predictions wait through a replica's kill and the rebalance that follows
SERIES = ("fairness_predictions_total", "model_subgroup_samples", "model_subgroup_unknown_samples")


def staged(broker: EmbeddedBroker, topic: str, side: str, library: str, port: int) -> dict:
    return {"model_id": "m1", "protected_attributes": ATTRIBUTES,
            "attribute_sources": {"applicants": {"topic": side, "id": "applicant_id", "horizon": f"{HORIZON}s"}},
            "kafka": {"bootstrap_servers": broker.bootstrap_servers, "topic": topic, "group_id": f"staged-{topic}",
                      "stages": "staged", "client_library": library, "client": GROUP_CLIENT[library]},
            "windows": ["1h"], "bucket": "1m", "evaluation_interval": "1s", "min_samples": 5,
            "checkpoint": {"interval": "1s"}, "listen": {"address": "127.0.0.1", "port": port}}  # fmt: skip


def subgroup_counts(page: dict) -> dict:
    """The model's per-subgroup counts: predictions by subgroup and decision, window samples, unknown samples."""
    return {k: v for k, v in page.items() if k[0] in SERIES and ("model_id", "m1") in k[1]}


def test_the_staged_path_equals_the_direct_one_through_a_sigkill(kafka_broker: EmbeddedBroker, tmp_path: Path,
                                                                 daemons: list[Daemon]) -> None:  # fmt: skip
    events, side = topics(kafka_broker)
    replicas = []
    for i, library in enumerate(("kafka-python", "confluent-kafka")):
        port = free_port()
        path = tmp_path / f"replica-{i}.yaml"
        path.write_text(yaml.safe_dump(staged(kafka_broker, events, side, library, port)))
        replicas.append(serve(port, path, tmp_path / f"replica-{i}.log"))
    raw = direct_config(kafka_broker, events, side, "kafka-python")
    raw["attribute_sources"]["applicants"]["horizon"] = f"{HORIZON}s"
    direct = started(tmp_path / "direct.yaml", raw, daemons)
    try:
        wait_for(lambda: len(owned(replicas)) == 1, timeout=120, what="one replica owning m1")
        s = scenario(600, time.time() - 5, seed=9)  # the horizon runs from here: the group has formed
        send_side(kafka_broker, side, s.before)
        for port in (direct.port, *(r.port for r in replicas)):
            wait_for(lambda port=port: (sample(scrape(port), "fairness_exporter_side_records_total",
                                               source="applicants") or 0) == len(s.before),
                     what="the records before the predictions read")  # fmt: skip
        half = len(s.predictions) // 2
        send(kafka_broker.bootstrap_servers, events, [(orjson.dumps(p), [], None) for p in s.predictions[:half]])
        wait_for(lambda: samples(owned(replicas)) + waiting(owned(replicas)) >= half, timeout=90,
                 what="the first half counted or waiting on the owner")  # fmt: skip
        victim = owned(replicas)[0]
        group = SimpleNamespace(group=f"staged-{events}", bootstrap=kafka_broker.bootstrap_servers)
        wait_for(lambda: _snapshots_cover_everything(group, victim),  # type: ignore[arg-type]
                 what="a snapshot of the owner's counts task covering the first half")  # fmt: skip
        wait_for(lambda: waiting([victim]) > 0, what="predictions waiting for records not sent yet (in the snapshot)")
        send(kafka_broker.bootstrap_servers, events, [(orjson.dumps(p), [], None) for p in s.predictions[half:]])
        time.sleep(0.3)  # part of the way through the second half
        victim.process.send_signal(signal.SIGKILL)
        victim.process.wait(10)
        send_side(kafka_broker, side, s.after)
        survivor = next(r for r in replicas if r is not victim)
        wait_for(lambda: owned([survivor]) == [survivor], timeout=120, what="the survivor owning m1")
        wait_for(lambda: safe(lambda: counted(survivor.port)) == len(s.predictions), timeout=120,
                 what="every prediction joined or given up on the survivor")  # fmt: skip
        wait_for(lambda: safe(lambda: counted(direct.port)) == len(s.predictions), timeout=3 * HORIZON,
                 what="every prediction joined or given up on the direct daemon")  # fmt: skip
        time.sleep(2)  # anything counted twice would show up now
        direct.computer.compute()
        assert_truth(survivor.port, s, restarted=True)
        assert_truth(direct.port, s)
        ours, theirs = subgroup_counts(scrape(survivor.port)), subgroup_counts(scrape(direct.port))
        assert len(ours) == 19 and ours == theirs  # 2 + 3 subgroups by decision, samples, unknown samples
        restored = sample(survivor.page(), "fairness_exporter_state_restores_total", stage="counts",
                          result="restored")  # fmt: skip
        assert restored and restored >= 1  # the model came from the victim's snapshot, not afresh
        assert probe(survivor.port, "/readyz")[0] == 200  # its side table read (the topic was empty at its start)

        # the victim restarts: it reads the (now full) side topic again before it is ready; the model stays whole
        back = serve(victim.port, tmp_path / f"replica-{replicas.index(victim)}.yaml", victim.log)
        replicas[replicas.index(victim)] = back
        wait_for(lambda: probe(back.port, "/readyz")[0] == 200, timeout=120, what="the restarted replica ready")
        assert (sample(back.page(), "fairness_exporter_side_records_total", source="applicants") or 0) == \
            len(s.before) + len(s.after)  # fmt: skip
        page = back.page()  # its side consumer's lag is on its page with the group's (read to the end: 0)
        lag = "fairness_exporter_consumer_lag_messages"
        assert [sample(page, lag, topic=side, partition=p) for p in "01"] == [0, 0]
        wait_for(lambda: len(owned(replicas)) == 1 and subgroup_counts(owned(replicas)[0].page()) == theirs,
                 timeout=60, what="m1 on one replica again, its counts the direct daemon's")  # fmt: skip
    finally:
        for r in replicas:
            if r.process.poll() is None:
                r.process.send_signal(signal.SIGTERM)
                r.process.wait(20)
    logs = "".join(r.log.read_text() for r in replicas)
    assert not any(value in logs for value in (*GENDERS, *RACES))  # the firewall: no value in a log line


def serve(port: int, path: Path, log: Path) -> Replica:
    return Replica(port, subprocess.Popen([sys.executable, "-m", "exporter.cli", "serve", "--config", str(path)],
                                          stdout=log.open("ab"), stderr=subprocess.STDOUT), log)  # fmt: skip


def owned(replicas: list[Replica]) -> list[Replica]:
    """The live replicas that say they own m1."""
    return [r for r in replicas if r.process.poll() is None and any(
        name == "fairness_exporter_model_owned" and dict(labels).get("model_id") == "m1" and value == 1
        for (name, labels), value in r.page().items())]  # fmt: skip


def samples(replicas: list[Replica]) -> float:
    return sum(sample(r.page(), "model_subgroup_samples", model_id="m1", attribute="gender", subgroup="overall",
                      window="1h") or 0 for r in replicas)  # fmt: skip


def waiting(replicas: list[Replica]) -> float:
    return sum(sample(r.page(), "fairness_exporter_predictions_waiting_for_attributes") or 0 for r in replicas)


def safe(read: object) -> float:
    try:
        return read()  # type: ignore[operator,no-any-return]
    except OSError:
        return -1.0


KSERVE = {"format": "kserve", "prediction": "predict"}


def in_memory_config(bootstrap: str, group: str, form: str, **kafka: object) -> Config:
    return make_config(protected_attributes=ATTRIBUTES, attribute_sources=SOURCE,
                       kafka={"bootstrap_servers": bootstrap, "topic": "predictions", "group_id": group,
                              "stages": "staged", "internal_topics": {"counts": {"partitions": 2}}, **kafka},
                       events=KSERVE if form == "kserve" else None)  # fmt: skip


def inputs(form: str, predictions: list[dict], ts: float) -> list:
    """The predictions as our JSON events, or as a KServe payload log (a request with the id column, a response)."""
    if form == "json":
        return [Rec(orjson.dumps(p), i) for i, p in enumerate(predictions)]
    calls = []
    for p in predictions:
        request = pandas_request({"applicant_id": [p["attributes"]["applicant_id"]], "income": [52000]})
        calls.append(cloudevent("m1", p["prediction_id"], False, orjson.dumps(request), ts))
        response = numpy_response("m1", p["prediction_id"], "predict", [p["prediction"]])
        calls.append(cloudevent("m1", p["prediction_id"], True, orjson.dumps(response), ts))
    return [PayloadRecord(value, i, int(ts * 1000), headers, key) for i, (value, headers, key) in enumerate(calls)]


def side_records(records: list[tuple[str, dict | None, float]], start: int) -> list[Rec]:
    return [Rec(None if v is None else orjson.dumps(v), start + i, k.encode(), int(t * 1000))
            for i, (k, v, t) in enumerate(records)]  # fmt: skip


def replica_with_waiting(bootstrap: str, group: str, form: str, s: Scenario, before: list[Rec], **kafka: object
                         ) -> tuple[Daemon, Stages, int]:  # fmt: skip
    """A staged replica that read the records before the predictions, then the predictions; how many wait."""
    d = Daemon(in_memory_config(bootstrap, group, form, **kafka), registry=CollectorRegistry(), clock=Clock())
    stages = d.stages
    assert stages is not None and stages.sides is not None
    stages.prepare()
    stages.starts([(t.name, p) for t in (stages.topics.join, stages.topics.counts) for p in range(t.partitions)], {})
    stages.sides.handle_poll({("applicant-demographics", 0): before})
    stages.handle_poll({("predictions", 0): inputs(form, s.predictions, s.predictions[0]["timestamp"])})
    for topic in (stages.topics.join, stages.topics.counts):  # a payload's halves meet in the join tasks first
        pump(stages, bootstrap, topic.name, dict.fromkeys(range(topic.partitions), 0))
    return d, stages, sum(len(t.attributes.held) for t in stages.sides.live())  # type: ignore[misc,union-attr]


@pytest.mark.parametrize(("form", "labels"), [("json", False), ("kserve", False), ("json", True)])
def test_waiting_predictions_restore_on_a_replica_whose_table_read_their_records(
        kafka_broker: EmbeddedBroker, form: str, labels: bool) -> None:  # fmt: skip
    bootstrap, group = kafka_broker.bootstrap_servers, f"sides-{uuid.uuid4().hex[:8]}"
    t0 = Clock().now
    s = scenario(300, t0 - 20, seed=3)
    before = side_records(s.before, 0)
    kafka = {"labels_topic": "labels"} if labels else {}  # then the delayed labels join after the takeover
    first, stages, held = replica_with_waiting(bootstrap, group, form, s, before, **kafka)
    assert held > 0  # the 15% whose records come later and the 5% never: in the snapshot below
    internal = [(t.name, p) for t in (stages.topics.join, stages.topics.counts) for p in range(t.partitions)]
    stages.snapshot(force=True)
    committed = {p: o for p, o in stages.committable().items() if p in internal}
    first.stop()

    # another replica: it reads the whole side topic (the records after the predictions too), then takes over
    second = Daemon(in_memory_config(bootstrap, group, form, **kafka), registry=CollectorRegistry(), clock=Clock())
    stages = second.stages
    assert stages is not None and stages.sides is not None
    stages.prepare()
    stages.sides.handle_poll({("applicant-demographics", 0): before + side_records(s.after, len(before))})
    stages.starts(internal, committed)
    positions = {t.name: {p: committed.get((t.name, p), 0) for p in range(t.partitions)}
                 for t in (stages.topics.join, stages.topics.counts)}  # fmt: skip
    drain(stages, bootstrap, positions)
    assert second.registry.get_sample_value("fairness_exporter_state_restores_total",
                                            {"stage": "counts", "result": "restored"}) >= 1  # fmt: skip
    # those whose records it read count as it goes live; only those with no record ever still wait
    assert sum(len(t.attributes.held) for t in stages.sides.live()) == s.never  # type: ignore[union-attr]
    second.clock.now += 300  # type: ignore[attr-defined]  # past the horizon: the never-joined count as unknown
    stages.sides.caught_up = True  # no side consumer runs here (the broker test above covers catching up)
    stages.expire()
    assert sum(len(t.attributes.held) for t in stages.sides.live()) == 0  # type: ignore[union-attr]
    replies = [Rec(orjson.dumps({"prediction_id": p["prediction_id"], "label": int(i % 3 == 0)}), i)
               for i, p in enumerate(s.predictions)]  # fmt: skip
    if labels:
        drain(stages, bootstrap, positions)
        stages.handle_poll({("labels", 0): replies})
        drain(stages, bootstrap, positions)

    direct = direct_daemon(events=KSERVE if form == "kserve" else None, kafka={"topic": "predictions", **kafka})
    direct.ingest.handle_poll({("applicant-demographics", 0): before})
    direct.ingest.handle_poll({("predictions", 0): inputs(form, s.predictions, s.predictions[0]["timestamp"])})
    direct.ingest.handle_poll({("applicant-demographics", 0): side_records(s.after, len(before))})
    direct.clock.now += 300  # type: ignore[attr-defined]
    direct.ingest.expire()
    if labels:
        direct.ingest.handle("labels", 0, replies)
        assert second.registry.get_sample_value("fairness_exporter_labels_joined_total") == \
            direct.registry.get_sample_value("fairness_exporter_labels_joined_total") == len(s.predictions)
        np.testing.assert_array_equal(second.fleet.models["m1"].store.window_counts(second.clock.now)["1h"],
                                      direct.fleet.models["m1"].store.window_counts(second.clock.now)["1h"])
    assert_truth_in_memory(direct, s)
    assert_truth_in_memory(second, s)
    store, theirs = second.fleet.models["m1"].store, direct.fleet.models["m1"].store
    assert (store.totals == theirs.totals).all() and store.totals.sum() > 0


def test_a_reload_that_resets_the_model_gives_up_its_waiting_predictions(kafka_broker: EmbeddedBroker) -> None:
    s = scenario(200, Clock().now - 20, seed=4)
    bootstrap = kafka_broker.bootstrap_servers
    _, stages, held = replica_with_waiting(bootstrap, f"sides-{uuid.uuid4().hex[:8]}", "json", s,
                                           side_records(s.before, 0))  # fmt: skip
    assert held > 0
    changed = [ATTRIBUTES[0], {**ATTRIBUTES[1], "groups": [*RACES, "other"]}]  # another layout: the model resets
    config = make_config(protected_attributes=changed, attribute_sources=SOURCE,
                         kafka={"bootstrap_servers": bootstrap, "topic": "predictions", "group_id": "g",
                                "stages": "staged", "internal_topics": {"counts": {"partitions": 2}}})  # fmt: skip
    _, given_up = stages.apply(config)
    assert given_up["model_reconfigured"] == held
    assert sum(len(t.attributes.held) for t in stages.sides.live()) == 0  # type: ignore[union-attr]


def test_delayed_labels_join_predictions_whose_attributes_were_joined(kafka_broker: EmbeddedBroker) -> None:
    """With kafka.labels_topic: a counts task sends its predictions to wait for their labels once their attributes
    are joined (at once, when their record arrives, or as unknown after the horizon); the labels count in the
    joined subgroups, as on the direct path."""
    bootstrap, t0 = kafka_broker.bootstrap_servers, Clock().now
    s = scenario(300, t0 - 20, seed=6)
    before, after = side_records(s.before, 0), side_records(s.after, len(s.before))
    labels = [Rec(orjson.dumps({"prediction_id": p["prediction_id"], "label": int(i % 3 == 0)}), i)
              for i, p in enumerate(s.predictions)]  # fmt: skip
    d = Daemon(in_memory_config(bootstrap, f"sides-{uuid.uuid4().hex[:8]}", "json", labels_topic="labels"),
               registry=CollectorRegistry(), clock=Clock())  # fmt: skip
    stages = d.stages
    assert stages is not None and stages.sides is not None
    stages.prepare()
    stages.starts([(t.name, p) for t in (stages.topics.join, stages.topics.counts) for p in range(t.partitions)], {})
    positions = {t.name: dict.fromkeys(range(t.partitions), 0) for t in (stages.topics.join, stages.topics.counts)}
    stages.sides.handle_poll({("applicant-demographics", 0): before})
    stages.handle_poll({("predictions", 0): inputs("json", s.predictions, t0 - 20)})
    drain(stages, bootstrap, positions)
    stages.sides.handle_poll({("applicant-demographics", 0): after})
    d.clock.now += 300  # type: ignore[attr-defined]  # past the side horizon, not the labels'
    stages.sides.caught_up = True  # no side consumer runs here
    stages.expire()
    drain(stages, bootstrap, positions)
    stages.handle_poll({("labels", 0): labels})
    drain(stages, bootstrap, positions)

    direct = direct_daemon(kafka={"topic": "predictions", "labels_topic": "labels"})
    direct.ingest.handle_poll({("applicant-demographics", 0): before})
    direct.ingest.handle_poll({("predictions", 0): inputs("json", s.predictions, t0 - 20)})
    direct.ingest.handle_poll({("applicant-demographics", 0): after})
    direct.clock.now += 300  # type: ignore[attr-defined]
    direct.ingest.expire()
    direct.ingest.handle("labels", 0, labels)
    assert d.registry.get_sample_value("fairness_exporter_labels_joined_total") == \
        direct.registry.get_sample_value("fairness_exporter_labels_joined_total") == len(s.predictions)  # fmt: skip
    assert_truth_in_memory(d, s)
    ours, theirs = d.fleet.models["m1"].store, direct.fleet.models["m1"].store
    np.testing.assert_array_equal(ours.totals, theirs.totals)
    np.testing.assert_array_equal(ours.window_counts(d.clock.now)["1h"], theirs.window_counts(d.clock.now)["1h"])
