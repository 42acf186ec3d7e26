"""Review 32: payload halves in pieces (stages/halves.py) and the pair join's bound on the staged path, against the
direct path on the same records."""

from __future__ import annotations

import copy
import uuid
from collections import Counter
from typing import Any

import numpy as np
import orjson
from payload_logs import cloudevent
from prometheus_client import CollectorRegistry
from test_payload_kserve import T0
from test_payload_staged import INPUT, PayloadRecord, counts_of, drain, live, payload_config

from exporter.config import Config, parse_config
from exporter.daemon import Daemon
from exporter.devtools.embedded_broker import EmbeddedBroker
from exporter.stream.payloads.platforms import Half
from exporter.stream.stages.halves import piece_rows, rekeyed
from exporter.stream.stages.records import Kind, decode, encode_rows
from exporter.stream.stages.tasks import JoinTask, expire_joins


def _component(event: tuple[bytes, list[tuple[str, bytes]], Any], component: str) -> tuple:
    value, headers, key = event
    return value, [(k, component.encode() if k == "ce_component" else v) for k, v in headers], key


def test_a_call_two_components_log_meets_in_the_first_component_on_the_staged_path_too(
        kafka_broker: EmbeddedBroker) -> None:  # fmt: skip
    """docs/sre/payload-logs.md: a call a transformer and its predictor log under one ce-id "meets within the
    component whose half came first". The entry stage sends a poll's whole halves (HALVES) before the halves in pieces
    (PIECES) to a join partition, so when the first half is large (a transformer's request: an image, a batch) the
    join task sees the predictor's halves first and counts the predictor's call; the direct path counts the
    transformer's. Here the transformer's response says 1 for a male applicant, the predictor's 0 for a female one."""
    bootstrap = kafka_broker.bootstrap_servers
    staged = Daemon(payload_config(bootstrap, f"r32-{uuid.uuid4().hex[:8]}", "staged"), registry=CollectorRegistry(),
                    clock=lambda: T0)  # fmt: skip
    stages = live(staged)
    huge = orjson.dumps({"instances": [{"sex": "male", "note": "x" * 1_000_000}]})
    events = [_component(cloudevent("loans-v1", "c1", False, huge, T0 - 60), "transformer"),
              _component(cloudevent("loans-v1", "c1", False, b'{"instances": [{"sex": "female"}]}', T0 - 60),
                         "predictor"),
              _component(cloudevent("loans-v1", "c1", True, b'{"predictions": [0]}', T0 - 60), "predictor"),
              _component(cloudevent("loans-v1", "c1", True, b'{"predictions": [1]}', T0 - 60), "transformer")]
    records = [PayloadRecord(v, i, int(T0 * 1000), h, k) for i, (v, h, k) in enumerate(events)]
    stages.handle_poll({(INPUT, 0): records})
    positions = {t.name: dict.fromkeys(range(t.partitions), 0) for t in (stages.topics.join, stages.topics.counts)}
    drain(stages, bootstrap, positions)

    direct = Daemon(payload_config(bootstrap, "unused", "direct"), registry=CollectorRegistry(), clock=lambda: T0)
    direct.ingest.handle_poll({(INPUT, 0): records})
    assert counts_of(direct, "loans-v1")[1].sum() > 0
    for d in (direct, staged):
        assert d.registry.get_sample_value("fairness_exporter_payload_pairs_joined_total") == 1
    np.testing.assert_array_equal(counts_of(stages, "loans-v1")[1], counts_of(direct, "loans-v1")[1])


def _config(bootstrap: str, group: str, stages: str, max_pending: int) -> Config:
    raw: dict[str, Any] = {
        "events": {"format": "kserve"},
        "models": [{"model_id": "loans-v1", "events": {"prediction": "predictions"},
                    "protected_attributes": [{"name": "gender", "column": "sex", "groups": ["male", "female"]}]}],
        "kafka": {"bootstrap_servers": bootstrap, "topic": INPUT, "group_id": group, "stages": stages,
                  "assignment": "subscribe" if stages == "staged" else "manual",
                  "internal_topics": {"join": {"partitions": 3}, "counts": {"partitions": 4}}},
        "windows": ["1h"], "bucket": "1m", "min_samples": 5, "listen": {"address": "127.0.0.1", "port": 0},
        "max_pending_labels": max_pending,
    }  # fmt: skip
    return parse_config(copy.deepcopy(raw), "test-review32")


def test_a_reload_of_max_pending_labels_reaches_the_pair_joins_of_the_staged_join_tasks(
        kafka_broker: EmbeddedBroker) -> None:  # fmt: skip
    """A reload raising ``max_pending_labels`` from 3 to 300: the direct path's pair join holds 300 halves
    (Fleet.apply sets ``pairs.max_pending``), a staged join task's pair join its share (payload-logs.md:
    ``max_pending_labels`` / its partitions, rounded up: 100). Stages.apply sets the label join's bound and the
    pairs' horizon but leaves each running task's PairJoin at the share of the config it started with (1): the
    second request waiting on a join partition is dropped as pending_state_full, its call never counted."""
    bootstrap = kafka_broker.bootstrap_servers
    group = f"r32-{uuid.uuid4().hex[:8]}"
    staged = Daemon(_config(bootstrap, group, "staged", 3), registry=CollectorRegistry(), clock=lambda: T0)
    stages = live(staged)
    direct = Daemon(_config(bootstrap, "unused", "direct", 3), registry=CollectorRegistry(), clock=lambda: T0)
    for d, mode in ((staged, "staged"), (direct, "direct")):
        d.loader = lambda mode=mode: _config(bootstrap, group if mode == "staged" else "unused", mode, 300)
        assert d.reload()[0]
    candidates = [f"call-{i}" for i in range(100)]
    where = stages.topics.join_of(candidates).tolist()
    ids = [c for c, q in zip(candidates, where, strict=True) if q == 0][:2]  # both on join partition 0
    requests = [cloudevent("loans-v1", pid, False, b'{"instances": [{"sex": "male"}]}', T0 - 60) for pid in ids]
    responses = [cloudevent("loans-v1", pid, True, b'{"predictions": [1]}', T0 - 60) for pid in ids]
    first = [PayloadRecord(v, i, int(T0 * 1000), h, k) for i, (v, h, k) in enumerate(requests)]
    second = [PayloadRecord(v, 2 + i, int(T0 * 1000), h, k) for i, (v, h, k) in enumerate(responses)]
    positions = {t.name: dict.fromkeys(range(t.partitions), 0) for t in (stages.topics.join, stages.topics.counts)}
    for poll in (first, second):
        stages.handle_poll({(INPUT, 0): poll})
        drain(stages, bootstrap, positions)
        direct.ingest.handle_poll({(INPUT, 0): poll})
    for d in (direct, staged):
        full = d.registry.get_sample_value("fairness_exporter_payload_halves_unmatched_total",
                                           {"reason": "pending_state_full"})  # fmt: skip
        joined = d.registry.get_sample_value("fairness_exporter_payload_pairs_joined_total")
        assert (full or 0, joined) == (0, 2), ("direct" if d is direct else "staged", full, joined)
    np.testing.assert_array_equal(counts_of(stages, "loans-v1")[1], counts_of(direct, "loans-v1")[1])


def test_pieces_of_a_half_never_completed_are_given_up_and_counted_after_the_pair_horizon() -> None:
    """A half whose remaining pieces never come (an entry stage that read its record again under a config that
    ignores it, a piece record unreadable or gone with the topic's retention) waits in ``JoinTask.pieces`` for
    ever: the pair horizon gives up halves waiting in ``pairs`` but not these, no counter says so, and every snapshot
    carries them (memory and snapshots grow by up to ~64 MiB per such half)."""
    from exporter.health.counters import Health, StageHealth
    from exporter.stream.payloads.pairs import PairJoin
    from exporter.stream.state.label_join import OutcomeJoin

    registry = CollectorRegistry()
    health, stage_health = Health(registry), StageHealth(registry)
    now = [T0]
    task = JoinTask(("fx.join", 0), 0, stage_health, health, OutcomeJoin(3600), lambda m: None,
                    lambda m: ("fx.counts", 0), lambda: now[0], {}, PairJoin(60.0))  # fmt: skip
    half = Half("big", False, "loans-v1", T0, 1, {"sex": ["male"], "note": ["x" * 2_000_000]})
    table, texts = piece_rows([(0, 7, rekeyed(half))])
    records = [decode(v) for v in encode_rows(Kind.PIECES, {"sources": [[INPUT, 0, ""]]}, table, texts)]
    assert len(records) == 3
    task.apply(records[0], 0)  # the rest never arrive
    assert task.pieces.parts
    now[0] += 3600  # a pair horizon (60 s) and a label horizon later
    expire_joins([task], health)
    held = sum(len(p) for p in task.pieces.parts.values())
    given_up = {s.labels.get("reason"): s.value for m in registry.collect() for s in m.samples
                if m.name == "fairness_exporter_payload_halves_unmatched" and s.name.endswith("_total")}
    assert not held and sum(given_up.values()) >= 1, (f"{held} piece(s) of a half still held an hour later, "
                                                      f"unmatched counted: {Counter(given_up)}")  # fmt: skip
