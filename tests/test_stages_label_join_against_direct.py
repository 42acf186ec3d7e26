"""Review 32: the label join's recognition of predictions sent again (``OutcomeJoin.again``, ``JoinTask._sent_again``)
and the joined ids under one bound per replica (``Stages._held_by_others``), against the direct path."""

from __future__ import annotations

import uuid
from typing import Any

import numpy as np
import orjson
from test_attribute_join import Clock, Rec
from test_attribute_join import daemon as direct_daemon
from test_attribute_join_staged import side_records
from test_attribute_join_staged_takeover import staged_replica
from test_payload_staged import drain
from test_stages import INPUT, LABELS, T0, records, staged_config
from test_stages import daemon as stages_daemon
from test_stages import live as stages_live

from exporter.daemon import Daemon
from exporter.devtools.embedded_broker import EmbeddedBroker


def _sourced_both(kafka_broker: EmbeddedBroker, predictions: list[dict[str, Any]]) -> tuple[Daemon, Daemon]:
    """A model with ``attribute_sources`` and delayed labels: each prediction event in a poll of its own, then a label
    for p1 (1), on one staged replica and on a direct daemon."""
    bootstrap, group = kafka_broker.bootstrap_servers, f"r32-{uuid.uuid4().hex[:8]}"
    before = side_records([("A1", {"gender": "male", "race": "white"}, T0_SIDE - 30)], 0)
    labels = [Rec(orjson.dumps({"prediction_id": "p1", "label": 1}), 0)]
    staged, stages = staged_replica(bootstrap, group, before)
    stages.starts([(t.name, p) for t in (stages.topics.join, stages.topics.counts) for p in range(t.partitions)], {})
    positions = {t.name: dict.fromkeys(range(t.partitions), 0) for t in (stages.topics.join, stages.topics.counts)}
    direct = direct_daemon(kafka={"topic": "predictions", "labels_topic": "labels"})
    direct.ingest.handle_poll({("applicant-demographics", 0): before})
    for i, p in enumerate(predictions):
        poll = [Rec(orjson.dumps(p), i)]
        stages.handle_poll({("predictions", 0): poll})
        drain(stages, bootstrap, positions)
        direct.ingest.handle_poll({("predictions", 0): poll})
    stages.handle_poll({("labels", 0): labels})
    drain(stages, bootstrap, positions)
    direct.ingest.handle("labels", 0, labels)
    assert direct.registry.get_sample_value("fairness_exporter_labels_joined_total") == 1
    assert staged.registry.get_sample_value("fairness_exporter_labels_joined_total") == 1
    return staged, direct


T0_SIDE = Clock().now - 20


def _prediction(value: int) -> dict[str, Any]:
    return {"model_id": "m1", "prediction_id": "p1", "timestamp": T0_SIDE, "prediction": value,
            "attributes": {"applicant_id": "A1"}}  # fmt: skip


def test_a_sourced_prediction_sent_again_with_the_same_time_replaces_the_waiting_one_as_on_the_direct_path(
        kafka_broker: EmbeddedBroker) -> None:  # fmt: skip
    """p1 predicted 0, then sent again (same id, same event time) predicting 1; its label is 1. The direct path's
    join replaces the waiting prediction with the later one (``duplicate_prediction``, "the later prediction
    replaces the one held") and counts a true positive. On the staged path the counts task sends the second as a
    PENDING row of its own, ``OutcomeJoin.again`` takes it for a new owner's replay (waiting, same model, same
    event time) and the join task skips it as a replayed row: the label joins the first prediction, a false
    negative."""
    staged, direct = _sourced_both(kafka_broker, [_prediction(0), _prediction(1)])
    now = T0_SIDE + 20
    np.testing.assert_array_equal(staged.fleet.models["m1"].store.window_counts(now)["1h"],
                                  direct.fleet.models["m1"].store.window_counts(now)["1h"])  # fmt: skip


def test_a_sourced_prediction_delivered_twice_is_a_duplicate_prediction_on_both_paths(
        kafka_broker: EmbeddedBroker) -> None:  # fmt: skip
    """The same event delivered twice (an at-least-once producer): the direct path counts it under
    ``labels_dropped_total{reason="duplicate_prediction"}`` (faults.md); the staged path counts it as a replayed
    row of its own (``replayed_rows_total{stage="join"}``, which faults.md reserves for a takeover's replay) and
    never as a duplicate prediction."""
    staged, direct = _sourced_both(kafka_broker, [_prediction(1), _prediction(1)])
    dup = {("direct" if d is direct else "staged"): d.registry.get_sample_value(
        "fairness_exporter_labels_dropped_total", {"reason": "duplicate_prediction"}) for d in (direct, staged)}
    assert dup["direct"] == 1
    assert dup["staged"] == dup["direct"], dup


def test_joined_ids_under_one_bound_are_forgotten_oldest_first_as_on_the_direct_path(
        kafka_broker: EmbeddedBroker) -> None:  # fmt: skip
    """``max_pending_labels`` 4: four ids join on join partition 0, then one (b) on partition 1, whose label is then
    delivered again. The direct path's one join forgets the oldest joined id (a0) and drops b's second label as
    ``duplicate_label``. On the staged path, ``OutcomeJoin._remember_joined`` of partition 1 evicts from its own
    ids only while the other tasks hold 4: it forgets b, the id it just joined, at once; b's second label waits as
    an orphan and is given up as ``unknown_prediction`` after the horizon (the series LabelJoinBroken reads)."""
    bootstrap, group = kafka_broker.bootstrap_servers, f"r32-{uuid.uuid4().hex[:8]}"
    staged = stages_daemon(staged_config(bootstrap, group, max_pending_labels=4, label_horizon="1h"))
    stages = stages_live(staged)
    direct = stages_daemon(staged_config(bootstrap, "unused", stages="direct", max_pending_labels=4,
                                         label_horizon="1h"))  # fmt: skip
    candidates = [f"id-{i}" for i in range(200)]
    where = stages.topics.join_of(candidates).tolist()
    on0 = [c for c, q in zip(candidates, where, strict=True) if q == 0][:4]
    b = next(c for c, q in zip(candidates, where, strict=True) if q == 1)

    def prediction(pid: str, i: int) -> dict[str, Any]:
        return {"model_id": "hiring", "prediction_id": pid, "timestamp": T0 - 60, "prediction": i % 2,
                "attributes": {"gender": ["male", "female"][i % 2], "age": "young"}}  # fmt: skip

    steps = [(INPUT, [prediction(p, i) for i, p in enumerate(on0)]),
             (LABELS, [{"prediction_id": p, "label": 1} for p in on0]),
             (INPUT, [prediction(b, 0)]), (LABELS, [{"prediction_id": b, "label": 1}]),
             (LABELS, [{"prediction_id": b, "label": 1}])]  # b's label delivered again
    positions = {t.name: dict.fromkeys(range(t.partitions), 0) for t in (stages.topics.join, stages.topics.counts)}
    at = {INPUT: 0, LABELS: 0}
    for topic, values in steps:
        batch = records(values, start=at[topic])
        at[topic] += len(values)
        stages.handle_poll({(topic, 0): batch})
        drain(stages, bootstrap, positions)
        direct.ingest.handle(topic, 0, batch)
    for d in (staged, direct):
        d.clock.now += 7200  # type: ignore[attr-defined]  # past the horizon
    stages.expire()
    direct.ingest.expire()
    got = {}
    for name, d in (("direct", direct), ("staged", staged)):
        value = d.registry.get_sample_value
        got[name] = (value("fairness_exporter_labels_joined_total"),
                     value("fairness_exporter_labels_dropped_total", {"reason": "duplicate_label"}),
                     value("fairness_exporter_labels_expired_total", {"reason": "unknown_prediction"}))
    assert got["direct"] == (5, 1, 0)
    assert got["staged"] == got["direct"], got
