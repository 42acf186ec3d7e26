"""Review 28: a join partition that moves to another replica (every rebalance: a deploy, a scale-up) forgets which
ids were joined within the horizon (``OutcomeJoin.recently_joined`` is not in the join task's snapshot), so a label
delivered again after the move is not counted as ``duplicate_label``: it waits as an orphan and is given up as
``unknown_prediction`` after the horizon, the series FairnessExporterLabelJoinBroken reads ("labels carrying
another prediction_id than the predictions"). The direct daemon, not restarted, drops each as a duplicate."""

from __future__ import annotations

import uuid

from test_payload_staged import drain
from test_stages import INPUT, LABELS, T0, daemon, live, records, staged_config

from exporter.devtools.embedded_broker import EmbeddedBroker


def test_a_label_delivered_again_after_a_rebalance_is_a_duplicate(kafka_broker: EmbeddedBroker) -> None:
    bootstrap, group = kafka_broker.bootstrap_servers, f"r28-{uuid.uuid4().hex[:8]}"
    values = [{"model_id": "hiring", "prediction_id": f"p{i}", "timestamp": T0 - 60, "prediction": i % 2,
               "attributes": {"gender": ["male", "female"][i % 2], "age": "old"}} for i in range(40)]  # fmt: skip
    labels = [{"prediction_id": f"p{i}", "label": i % 3 == 0} for i in range(40)]
    first = daemon(staged_config(bootstrap, group, label_horizon="1h"))
    stages = live(first)
    positions = {t.name: dict.fromkeys(range(t.partitions), 0) for t in (stages.topics.join, stages.topics.counts)}
    stages.handle_poll({(INPUT, 0): records(values)})
    stages.handle_poll({(LABELS, 0): records(labels)})
    drain(stages, bootstrap, positions)
    assert first.registry.get_sample_value("fairness_exporter_labels_joined_total") == 40
    stages.flush()  # the revocation's snapshot of every task: the partitions move on whole
    committed = {p: o for p, o in stages.committable().items() if p[0] in stages.topics.names}

    second = daemon(staged_config(bootstrap, group, label_horizon="1h"))
    stages = live(second, committed)
    positions = {t.name: {p: committed.get((t.name, p), 0) for p in range(t.partitions)}
                 for t in (stages.topics.join, stages.topics.counts)}  # fmt: skip
    drain(stages, bootstrap, positions)
    again = records(labels, start=len(labels))  # the labels topic delivers the labels again (at least once)
    stages.handle_poll({(LABELS, 0): again})
    drain(stages, bootstrap, positions)
    second.clock.now += 7200  # type: ignore[attr-defined]  # past the horizon
    stages.expire()

    direct = daemon(staged_config(bootstrap, "unused", stages="direct", label_horizon="1h"))
    direct.ingest.handle(INPUT, 0, records(values))
    direct.ingest.handle(LABELS, 0, records(labels))
    direct.ingest.handle(LABELS, 0, again)
    direct.clock.now += 7200  # type: ignore[attr-defined]
    direct.ingest.expire()
    for d in (direct, second):
        value = d.registry.get_sample_value
        assert (value("fairness_exporter_labels_dropped_total", {"reason": "duplicate_label"}),
                value("fairness_exporter_labels_expired_total", {"reason": "unknown_prediction"})) == (40, 0), \
            "direct" if d is direct else "staged"  # fmt: skip
