"""Review 28: attributes joined by id (``attribute_sources``) with delayed labels on the staged path, across a
takeover of the counts partition after a crash (no snapshot covering what the first owner counted).

A sourced model's counts task sends its joined predictions on to wait for their labels (stages/sides.py
``SideStage.forward``) as PENDING rows in a log of the *replica's own* (a random id per process). The new owner
applies the counts records again and sends the same predictions again, in its new log, so the join's high-water
marks do not recognise them: each becomes a prediction waiting in the join once more, although its label already
joined. Then a label delivered twice (the case the join counts as ``duplicate_label`` and drops) joins it a second
time and the outcome is counted twice; and with no second label, each one is given up as ``never_labelled`` after
the horizon. The direct path, on the same records, counts each label once and expires nothing."""

from __future__ import annotations

import uuid

import numpy as np
import orjson
from prometheus_client import CollectorRegistry
from side_traffic import scenario
from test_attribute_join import Clock, Rec
from test_attribute_join import daemon as direct_daemon
from test_attribute_join_staged import in_memory_config, inputs, side_records
from test_payload_staged import drain

from exporter.daemon import Daemon
from exporter.devtools.embedded_broker import EmbeddedBroker
from exporter.stream.stages.replica import Stages


def staged_replica(bootstrap: str, group: str, before: list[Rec]) -> tuple[Daemon, Stages]:
    d = Daemon(in_memory_config(bootstrap, group, "json", labels_topic="labels"), registry=CollectorRegistry(),
               clock=Clock())  # fmt: skip
    stages = d.stages
    assert stages is not None and stages.sides is not None
    stages.prepare()
    stages.sides.handle_poll({("applicant-demographics", 0): before})
    return d, stages


def _setup(kafka_broker: EmbeddedBroker) -> tuple[Daemon, Stages, dict, Daemon, list[Rec], int]:
    bootstrap, group = kafka_broker.bootstrap_servers, f"r28-{uuid.uuid4().hex[:8]}"
    t0 = Clock().now
    s = scenario(200, t0 - 20, seed=28)
    before = side_records(s.before, 0)
    labels = [Rec(orjson.dumps({"prediction_id": p["prediction_id"], "label": int(i % 3 == 0)}), i)
              for i, p in enumerate(s.predictions)]  # fmt: skip
    internal_of = lambda st: [(t.name, p) for t in (st.topics.join, st.topics.counts)  # noqa: E731
                              for p in range(t.partitions)]  # fmt: skip

    # the first owner: counts the predictions, sends the joined ones on to wait, joins their labels; it dies
    # before a snapshot of its tasks is committed (their committed offsets stay 0)
    first, stages = staged_replica(bootstrap, group, before)
    stages.starts(internal_of(stages), {})
    positions = {t.name: dict.fromkeys(range(t.partitions), 0) for t in (stages.topics.join, stages.topics.counts)}
    stages.handle_poll({("predictions", 0): inputs("json", s.predictions, t0 - 20)})
    drain(stages, bootstrap, positions)
    stages.handle_poll({("labels", 0): labels})
    drain(stages, bootstrap, positions)
    joined_first = first.registry.get_sample_value("fairness_exporter_labels_joined_total")
    assert joined_first and joined_first > 100  # the predictions whose records were there joined their labels

    # the new owner of every internal partition (the input offsets were committed: it does not read them again)
    second, stages = staged_replica(bootstrap, group, before)
    stages.starts(internal_of(stages), {})
    positions = {t.name: dict.fromkeys(range(t.partitions), 0) for t in (stages.topics.join, stages.topics.counts)}
    drain(stages, bootstrap, positions)

    direct = direct_daemon(kafka={"topic": "predictions", "labels_topic": "labels"})
    direct.ingest.handle_poll({("applicant-demographics", 0): before})
    direct.ingest.handle_poll({("predictions", 0): inputs("json", s.predictions, t0 - 20)})
    direct.ingest.handle("labels", 0, labels)
    return second, stages, positions, direct, labels, int(joined_first)


def test_a_label_delivered_twice_after_a_takeover_is_counted_once(kafka_broker: EmbeddedBroker) -> None:
    second, stages, positions, direct, labels, _ = _setup(kafka_broker)
    now = second.clock.now  # type: ignore[attr-defined]
    ours = second.fleet.models["m1"].store.window_counts(now)["1h"].copy()
    theirs = direct.fleet.models["m1"].store.window_counts(now)["1h"].copy()
    np.testing.assert_array_equal(ours, theirs)  # equal so far: the takeover itself counted nothing twice

    again = [Rec(r.value, len(labels) + i) for i, r in enumerate(labels)]  # the labels topic delivers them again
    stages.handle_poll({("labels", 0): again})
    drain(stages, bootstrap=stages.kafka.bootstrap_servers, positions=positions)
    direct.ingest.handle("labels", 0, again)
    dup = direct.registry.get_sample_value("fairness_exporter_labels_dropped_total", {"reason": "duplicate_label"})
    assert dup and dup > 100  # the direct path drops each as a duplicate
    np.testing.assert_array_equal(second.fleet.models["m1"].store.window_counts(now)["1h"],
                                  direct.fleet.models["m1"].store.window_counts(now)["1h"])  # fmt: skip


def test_no_prediction_whose_label_joined_is_given_up_as_never_labelled_after_a_takeover(
        kafka_broker: EmbeddedBroker) -> None:  # fmt: skip
    second, _, _, direct, _, _ = _setup(kafka_broker)
    waiting = second.registry.get_sample_value("fairness_exporter_pending_predictions")
    direct_waiting = direct.registry.get_sample_value("fairness_exporter_pending_predictions")
    assert waiting == direct_waiting, f"{waiting} predictions wait for a label on the staged path, " \
                                      f"{direct_waiting} on the direct path"  # fmt: skip
