"""Review 28: ``max_pending_labels`` on the staged path. The docs (docs/sre/scale-out.md) say a prediction waits for
its label with "at most ``max_pending_labels`` of them" waiting; the direct path holds that many. The staged path
gives each join partition a fixed share of it (ceil(max / partitions), stages/replica.py ``Stages._task``), so
predictions whose ids hash unevenly are dropped as ``pending_state_full`` while the whole join holds far fewer than
``max_pending_labels``: the same records give fewer joined labels on the staged path than on the direct path."""

from __future__ import annotations

import uuid

import numpy as np
from test_payload_staged import drain
from test_stages import INPUT, LABELS, T0, daemon, live, records, staged_config

from exporter.devtools.embedded_broker import EmbeddedBroker


def test_predictions_below_max_pending_labels_all_wait_on_the_staged_path(kafka_broker: EmbeddedBroker) -> None:
    bootstrap = kafka_broker.bootstrap_servers
    staged = daemon(staged_config(bootstrap, f"r28-{uuid.uuid4().hex[:8]}", max_pending_labels=30))
    stages = live(staged)
    # 20 unlabelled predictions (two thirds of max_pending_labels): 12 of their ids on join partition 0
    candidates = [f"id-{i}" for i in range(400)]
    where = stages.topics.join_of(candidates).tolist()
    ids = [c for c, q in zip(candidates, where, strict=True) if q == 0][:12] + \
        [c for c, q in zip(candidates, where, strict=True) if q != 0][:8]  # fmt: skip
    values = [{"model_id": "hiring", "prediction_id": pid, "timestamp": T0 - 60 - i, "prediction": i % 2,
               "attributes": {"gender": ["male", "female"][i % 2], "age": "young"}} for i, pid in enumerate(ids)]
    labels = [{"prediction_id": pid, "label": 1} for pid in ids]
    positions = {t.name: dict.fromkeys(range(t.partitions), 0) for t in (stages.topics.join, stages.topics.counts)}
    stages.handle_poll({(INPUT, 0): records(values)})
    drain(stages, bootstrap, positions)
    stages.handle_poll({(LABELS, 0): records(labels)})
    drain(stages, bootstrap, positions)

    direct = daemon(staged_config(bootstrap, "unused", stages="direct", max_pending_labels=30))
    direct.ingest.handle(INPUT, 0, records(values))
    direct.ingest.handle(LABELS, 0, records(labels))
    assert direct.registry.get_sample_value("fairness_exporter_labels_joined_total") == 20
    full = staged.registry.get_sample_value("fairness_exporter_labels_dropped_total", {"reason": "pending_state_full"})
    assert not full, f"{full} predictions dropped as pending_state_full with 20 waiting of max_pending_labels 30"
    assert staged.registry.get_sample_value("fairness_exporter_labels_joined_total") == 20
    np.testing.assert_array_equal(staged.fleet.models["hiring"].store.window_counts(T0)["1h"],
                                  direct.fleet.models["hiring"].store.window_counts(T0)["1h"])  # fmt: skip
