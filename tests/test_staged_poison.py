"""The staged path's poison batch (issue 31 item 1, ``kafka.stages: staged``) on the real broker, driven poll by
poll as in tests/test_stages.py: the entry stages bound a unit that raises as the direct path does (3 tries, then
record by record, a record that fails alone skipped and counted), every other event is counted exactly once
(a retry re-sends rows at the same positions, which the counts and join tasks skip), and /readyz names the batch.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import numpy as np
import orjson
import pytest
from broker_fixture import produce
from daemon_fixture import kafka_config, payloads, sample, scrape, synthetic_rows, wait_for
from test_stages import (
    INPUT,
    LABELS,
    MODELS,
    T0,
    daemon,
    direct_state,
    events,
    group,
    later_labels,
    live,
    pump,
    records,
    run,
    staged_config,
    starts,
)

from exporter.daemon import Daemon
from exporter.devtools.embedded_broker import EmbeddedBroker
from exporter.stream import bounded
from exporter.stream.kafka.internal_producer import InternalProducer, ProduceFailed
from exporter.stream.stages.counts import CountsTask
from exporter.stream.stages.entry import EntryStages
from exporter.stream.state.fleet import Fleet

__all__ = ["group"]  # the fixture


def value(d: Daemon, name: str) -> float:
    return d.registry.get_sample_value(name) or 0.0


def ready(d: Daemon) -> Daemon:
    d.source.assigned_once.set()
    d.source.broker_up = True
    d.computer.compute()
    return d


def same_counts(d: Daemon, bootstrap: str, good: list[dict[str, Any]]) -> None:
    """The staged windows hold exactly what the direct path counts of the good events (and labels), once."""
    direct = direct_state(bootstrap, [(INPUT, records(good)), (LABELS, records(later_labels(good)))])
    assert d.stages is not None
    for model_id in MODELS:
        ours, theirs = d.stages.fleet.models[model_id].store, direct.fleet.models[model_id].store
        assert ours.totals.sum() > 0
        np.testing.assert_array_equal(ours.totals, theirs.totals)
        np.testing.assert_array_equal(ours.window_counts(T0)["1h"], theirs.window_counts(T0)["1h"])


@pytest.fixture
def no_wait(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(bounded, "RETRY_SECONDS", 0.0)


def test_a_staged_batch_that_raises_is_tried_three_times_then_record_by_record(
    kafka_broker: EmbeddedBroker, group: str, no_wait: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    bootstrap = kafka_broker.bootstrap_servers
    d = ready(daemon(staged_config(bootstrap, group)))
    stages = live(d)
    real, seen = Fleet.decode, []

    def decode(fleet: Fleet, values: list[bytes], now: float) -> Any:
        if any(b'"poison"' in v for v in values):
            seen.append(d.ready())
            raise MemoryError("injected")
        return real(fleet, values, now)

    monkeypatch.setattr(Fleet, "decode", decode)
    good = events(60, seed=31)
    poison = {**good[0], "prediction_id": "poison", "poison": True}
    batch = records([*good[:20], poison, *good[20:]])
    labels = records(later_labels(good))
    positions = starts(stages)
    run(stages, bootstrap, [(INPUT, batch), (LABELS, labels)], positions)
    assert len(seen) == 3 + 1  # three tries of the batch, then the poison record alone
    assert seen[0] == (True, "serving computed metrics")
    assert seen[1] == (False, "predictions[0] offsets 0..60 cannot be counted (MemoryError: injected); try 1 of 3, "
                              "then record by record")  # fmt: skip
    assert seen[3][1].startswith("predictions[0] offsets 0..60 cannot be counted (MemoryError: injected); try 3 of 3")
    assert d.ready() == (True, "serving computed metrics")
    assert value(d, "fairness_exporter_batch_failures_total") == 3
    assert value(d, "fairness_exporter_records_skipped_total") == 1
    assert stages.acked[(INPUT, 0)] == 61  # the partition reads on past the skipped record
    same_counts(d, bootstrap, good)


def test_a_staged_retry_after_rows_were_sent_is_skipped_by_the_receivers(
    kafka_broker: EmbeddedBroker, group: str, no_wait: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A unit that fails after it sent some models' rows: its retry sends them again at the same positions, and the
    counts and join tasks skip them (replayed), so every event is counted once and nothing is skipped."""
    bootstrap = kafka_broker.bootstrap_servers
    d = ready(daemon(staged_config(bootstrap, group)))
    stages = live(d)
    real: Callable[..., list[int]] = EntryStages._to_join
    calls = []

    def fails_once(self: EntryStages, *args: Any) -> list[int]:
        calls.append(1)
        if len(calls) == 2:  # the second model's pending rows, after both models' predictions rows went out
            raise MemoryError("injected")
        return real(self, *args)

    monkeypatch.setattr(EntryStages, "_to_join", fails_once)
    good = events(60, seed=32)
    positions = starts(stages)
    run(stages, bootstrap, [(INPUT, records(good)), (LABELS, records(later_labels(good)))], positions)
    assert value(d, "fairness_exporter_batch_failures_total") == 1
    assert value(d, "fairness_exporter_records_skipped_total") == 0
    replayed = d.registry.get_sample_value("fairness_exporter_replayed_rows_total", {"stage": "counts"})
    assert replayed and replayed > 0  # sent twice, counted once
    same_counts(d, bootstrap, good)


def test_a_task_that_cannot_apply_a_record_is_tried_from_its_snapshot_then_stopped_and_named(
    kafka_broker: EmbeddedBroker, group: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An internal record a counts task cannot apply (injected for one model's rows) is never dropped: the poll is
    abandoned and the task restored from its snapshot twice (as the source does after any failure), then the task
    stops: its model leaves the replica, /readyz names it, the other models are counted."""
    bootstrap = kafka_broker.bootstrap_servers
    d = ready(daemon(staged_config(bootstrap, group)))
    stages = live(d)
    real = CountsTask.apply

    def fails_on_hiring(task: CountsTask, record: Any, offset: int) -> Any:
        if record.meta.get("model") == "hiring":
            raise MemoryError("injected")
        return real(task, record, offset)

    monkeypatch.setattr(CountsTask, "apply", fails_on_hiring)
    good = events(60, seed=33)
    stages.handle_poll({(INPUT, 0): records(good)})
    topic, target = stages.counts_partition("hiring")
    assert stages.counts_partition("credit")[1] != target
    said = []
    for _ in range(2):
        with pytest.raises(MemoryError):
            pump(stages, bootstrap, topic, {target: 0})
        said.append(d.ready())
        assert not stages.tasks  # every task dropped: restored from its snapshot at the next assignment
        live(d)  # what the source's new consumer does
    pump(stages, bootstrap, topic, {target: 0})  # the third try: the task stops, the poll goes on
    assert said[0] == (False, f"{topic}[{target}] offset 0 cannot be applied by its counts task (MemoryError: "
                              "injected); try 1 of 3, each from the task's last snapshot, then the task stops")
    assert d.ready() == (False, f"{topic}[{target}] offset 0 cannot be applied by its counts task (MemoryError: "
                                "injected) in 3 tries: the task is stopped, the models hiring are not counted until "
                                "a restart or another replica takes the partition")  # fmt: skip
    assert (topic, target) not in stages.tasks and "hiring" not in stages.fleet.models
    assert value(d, "fairness_exporter_batch_failures_total") == 3
    assert d.registry.get_sample_value("fairness_exporter_stage_tasks_stopped", {"stage": "counts"}) == 1
    assert (topic, target) not in stages.committable()  # nothing of it committed past its last snapshot
    pump(stages, bootstrap, topic, {p: 0 for p in range(stages.topics.counts.partitions) if p != target})
    direct = direct_state(bootstrap, [(INPUT, records(good))])  # the other model counted exactly
    ours, theirs = stages.fleet.models["credit"].store, direct.fleet.models["credit"].store
    assert ours.totals.sum() > 0
    np.testing.assert_array_equal(ours.totals, theirs.totals)
    stages.forget([(topic, target)])  # another replica takes it
    assert d.ready() == (True, "serving computed metrics")
    assert d.registry.get_sample_value("fairness_exporter_stage_tasks_stopped", {"stage": "counts"}) == 0


def test_a_staged_daemon_skips_a_poison_event_and_counts_every_other_once(
    kafka_broker: EmbeddedBroker, topic: str, running: Callable[..., Daemon], client_library: str, no_wait: None,
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    """The whole staged daemon (a consumer group, the internal topics): a batch whose decoding raises for one event
    is tried 3 times and then record by record, the poison event is skipped and counted, the 50 events after it are
    counted once, the input is read once (the consumer is never rebuilt) and /readyz never blames the broker."""
    real, said = Fleet.decode, []
    daemons: list[Daemon] = []

    def decode(fleet: Fleet, values: list[bytes], now: float) -> Any:
        if any(b'"poison"' in v for v in values):
            said.append(daemons[0].ready())
            raise MemoryError("injected")
        return real(fleet, values, now)

    monkeypatch.setattr(Fleet, "decode", decode)
    bootstrap = kafka_broker.bootstrap_servers
    poison = orjson.dumps({**orjson.loads(payloads(synthetic_rows(1, seed=1), time.time())[0]), "poison": True})
    produce(bootstrap, topic, [poison, *payloads(synthetic_rows(50, seed=31), time.time())], partition=0)
    daemons.append(staged_daemon(running, bootstrap, topic, client_library))
    daemon = daemons[0]
    wait_counted(daemon, 50, "the 50 events after the poison event, counted through the internal topics")
    s = scrape(daemon.port)
    assert len(said) == 3 + 1  # the batch, never "no Kafka broker answers"
    assert all(why.startswith(f"{topic}[0] offsets 0..50 cannot be counted (MemoryError: injected); try ")
               for _, why in said[1:])  # fmt: skip
    assert sample(s, "fairness_exporter_records_skipped_total") == 1
    assert sample(s, "fairness_exporter_batch_failures_total") == 3
    assert sample(s, "fairness_exporter_events_consumed_total") == 51  # read once
    assert sample(s, "fairness_exporter_consumer_errors_total") == 0
    assert daemon.ready() == (True, "serving computed metrics")


def test_internal_records_the_broker_refuses_are_sent_again_never_skipped_and_readyz_says_so(
    kafka_broker: EmbeddedBroker, topic: str, running: Callable[..., Daemon], client_library: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    """The internal producer's failure is not the input's: no record is skipped, the consumer is rebuilt and the
    stages send again from what was acknowledged (counted once), and /readyz names the failure, not the broker."""
    real, said = InternalProducer.flush, []
    daemons: list[Daemon] = []

    def refused_twice(producer: InternalProducer) -> None:
        said.append(daemons[0].ready() if daemons else None)
        if len(said) <= 2:
            producer._pending = []  # what was queued stays unacknowledged: as a broker that refused it
            raise ProduceFailed("injected")
        real(producer)

    monkeypatch.setattr(InternalProducer, "flush", refused_twice)
    bootstrap = kafka_broker.bootstrap_servers
    produce(bootstrap, topic, payloads(synthetic_rows(50, seed=32), time.time()), partition=0)
    daemons.append(staged_daemon(running, bootstrap, topic, client_library))
    daemon = daemons[0]
    wait_counted(daemon, 50, "the 50 events, sent again after two refusals")
    s = scrape(daemon.port)
    assert (False, "handling a poll failed (ProduceFailed: injected); the consumer is rebuilt and reads again from "
                   "what was acknowledged") in said  # fmt: skip
    assert not any(r is not None and "no Kafka broker answers" in r[1] for r in said)
    assert sample(s, "fairness_exporter_records_skipped_total") == 0
    assert sample(s, "fairness_exporter_batch_failures_total") == 0
    assert sample(s, "fairness_exporter_consumer_errors_total") >= 1
    wait_for(lambda: daemon.ready() == (True, "serving computed metrics"), what="ready again")


def staged_daemon(running: Callable[..., Daemon], bootstrap: str, topic: str, client_library: str) -> Daemon:
    """A whole staged daemon on the topic: a consumer group and internal topics of one partition each."""
    return running(bootstrap, topic, kafka={
        **kafka_config(bootstrap, topic, client_library)["kafka"], "assignment": "subscribe", "stages": "staged",
        "internal_topics": {"join": {"partitions": 1}, "counts": {"partitions": 1}}})  # fmt: skip


def wait_counted(daemon: Daemon, n: int, what: str) -> None:
    """Until the daemon's 1h window shows ``n`` samples overall (computed on demand)."""

    def counted() -> bool:
        daemon.computer.compute()
        return sample(scrape(daemon.port), "model_subgroup_samples", model_id="m1", attribute="gender", window="1h",
                      subgroup="overall") == n  # fmt: skip

    wait_for(counted, what=what)
