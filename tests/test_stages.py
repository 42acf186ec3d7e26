"""The staged path's stages in one process on the real broker, driven poll by poll (no consumer group, so no
group join): a replayed input is counted once, and a task's state, snapshotted in several chunks into its own
partition, restores exactly in another replica's stages. The same events counted by the direct path give the
same window counts and pending labels. A snapshot round the broker does not acknowledge is counted.

Each test builds the stages of a daemon that is never started (its constructor does no I/O) and hands them what a
consumer would have read: input records it makes, and the records the stages produced, read back from the broker.
"""

from __future__ import annotations

import logging
import os
import signal
import time
import uuid
from types import SimpleNamespace
from typing import Any

import numpy as np
import orjson
import pytest
from broker_fixture import read_partition
from prometheus_client import CollectorRegistry

from exporter.config import Config, parse_config
from exporter.daemon import Daemon
from exporter.devtools.embedded_broker import EmbeddedBroker
from exporter.stream.kafka import internal_producer
from exporter.stream.kafka.client import SimpleRecord
from exporter.stream.stages.records import Kind, decode
from exporter.stream.stages.replica import Stages
from exporter.stream.stages.tasks import JoinTask

T0 = 1_800_000_000.0
MODELS = {"hiring": {"gender": ["male", "female"], "age": ["young", "old"]},
          "credit": {"region": ["north", "south", "east"]}}  # fmt: skip
INPUT, LABELS = "predictions", "labels"


def staged_config(bootstrap: str, group: str, stages: str = "staged", **top: Any) -> Config:
    return parse_config({**top,
        "models": [{"model_id": m, "protected_attributes": [{"name": n, "groups": g} for n, g in attrs.items()]}
                   for m, attrs in MODELS.items()],
        "kafka": {"bootstrap_servers": bootstrap, "topic": INPUT, "labels_topic": LABELS, "group_id": group,
                  "stages": stages, "internal_topics": {"join": {"partitions": 3}, "counts": {"partitions": 4}}},
        "windows": ["1h"], "bucket": "1m", "min_samples": 5, "listen": {"address": "127.0.0.1", "port": 0},
    }, "test-stages")  # fmt: skip


class Clock:
    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> float:
        return self.now


def daemon(config: Config) -> Daemon:
    return Daemon(config, registry=CollectorRegistry(), clock=Clock())


def live(d: Daemon, committed: dict[tuple[str, int], int] | None = None) -> Stages:
    """The daemon's stages, with every internal partition assigned (at these committed offsets; none: fresh)."""
    stages = d.stages
    assert stages is not None
    stages.prepare()
    partitions = [(t.name, p) for t in (stages.topics.join, stages.topics.counts) for p in range(t.partitions)]
    stages.starts(partitions, committed or {})
    return stages


def events(n: int, seed: int) -> list[dict[str, Any]]:
    """Both models' events, a third labelled inline, a third to be labelled later; ids unique per seed."""
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        model = "hiring" if i % 3 else "credit"
        attrs = {name: str(rng.choice(groups)) for name, groups in MODELS[model].items()}
        out.append({"model_id": model, "prediction_id": f"{seed}-{i}", "timestamp": T0 - float(rng.uniform(0, 600)),
                    "prediction": int(rng.random() < 0.4), "label": int(rng.random() < 0.5) if i % 3 == 0 else None,
                    "attributes": attrs})  # fmt: skip
    return out


def records(values: list[dict[str, Any]], start: int = 0) -> list[SimpleRecord]:
    return [SimpleRecord(orjson.dumps(v), start + i) for i, v in enumerate(values)]


def later_labels(values: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{"prediction_id": e["prediction_id"], "label": 1 - e["prediction"]} for i, e in enumerate(values)
            if e["label"] is None and i % 2]  # fmt: skip


def pump(stages: Stages, bootstrap: str, topic: str, starts: dict[int, int]) -> dict[int, int]:
    """Hand each partition of an internal topic, from its start, to the stages; the next offsets."""
    ends = {}
    for partition, start in starts.items():
        found = read_partition(bootstrap, topic, partition, start)
        if found:
            stages.handle_poll({(topic, partition): found})
        ends[partition] = found[-1].offset + 1 if found else start
    return ends


def starts(stages: Stages) -> dict[str, dict[int, int]]:
    """Offset 0 of every internal partition."""
    return {t.name: dict.fromkeys(range(t.partitions), 0) for t in (stages.topics.join, stages.topics.counts)}


def run(stages: Stages, bootstrap: str, batches: list[tuple[str, list[SimpleRecord]]],
        positions: dict[str, dict[int, int]]) -> None:  # fmt: skip
    """Input batches through the ingest and labels stages, then the join and counts partitions to their ends."""
    for topic, batch in batches:
        stages.handle_poll({(topic, 0): batch})
    for topic in (stages.topics.join.name, stages.topics.counts.name):
        positions[topic] = pump(stages, bootstrap, topic, positions[topic])


def direct_state(bootstrap: str, batches: list[tuple[str, list[SimpleRecord]]]) -> Daemon:
    """The same batches counted by the direct path."""
    d = daemon(staged_config(bootstrap, "unused", stages="direct"))
    for topic, batch in batches:
        d.ingest.handle(topic, 0, batch)
    return d


@pytest.fixture
def group(kafka_broker: EmbeddedBroker) -> str:
    return f"stages-{uuid.uuid4().hex[:8]}"


def test_an_input_read_twice_is_counted_once_and_as_the_direct_path_counts_it(kafka_broker: EmbeddedBroker,
                                                                              group: str) -> None:  # fmt: skip
    bootstrap = kafka_broker.bootstrap_servers
    d = daemon(staged_config(bootstrap, group))
    stages = live(d)
    first = events(300, seed=1)
    batches = [(INPUT, records(first)), (LABELS, records(later_labels(first)))]
    positions = starts(stages)
    run(stages, bootstrap, batches, positions)
    # A crash before the commit: the same input offsets are read again, and their rows produced a second time
    run(stages, bootstrap, batches, positions)
    replayed = {stage: d.registry.get_sample_value("fairness_exporter_replayed_rows_total", {"stage": stage})
                for stage in ("counts", "join")}  # fmt: skip
    unlabelled = sum(e["label"] is None for e in first)
    assert replayed == {"counts": 300, "join": unlabelled + len(later_labels(first))}  # the second reading, skipped

    direct = direct_state(bootstrap, batches)
    for model_id in MODELS:
        ours, theirs = stages.fleet.models[model_id].store, direct.fleet.models[model_id].store
        assert ours.totals.sum() > 0
        np.testing.assert_array_equal(ours.totals, theirs.totals)
        np.testing.assert_array_equal(ours.window_counts(T0)["1h"], theirs.window_counts(T0)["1h"])
    pending = {pid for task in stages.tasks.values() if isinstance(task, JoinTask) for pid in task.join.pending}
    assert pending == set(direct.fleet.joins.pending)


def test_a_state_of_several_chunks_restores_exactly_on_another_replica(kafka_broker: EmbeddedBroker,
                                                                        group: str) -> None:  # fmt: skip
    bootstrap = kafka_broker.bootstrap_servers
    first = live(daemon(staged_config(bootstrap, group)))
    positions = starts(first)
    before = events(400, seed=2)
    run(first, bootstrap, [(INPUT, records(before)), (LABELS, records(later_labels(before)))], positions)
    first.chunk_bytes = 1500
    first.snapshot(force=True)
    committed = first.committable()
    after = events(200, seed=3)  # data after the snapshot: the new owner applies it once the snapshot is whole
    run(first, bootstrap, [(INPUT, records(after, start=400)), (LABELS, records(later_labels(after), start=200))],
        positions)

    other = daemon(staged_config(bootstrap, group))
    second = live(other, committed)
    assert not second.fleet.models  # restoring: nobody's model is owned until its snapshot is whole
    for topic in second.topics.names:
        pump(second, bootstrap, topic, {p: o for (t, p), o in committed.items() if t == topic})
    restored = sum(other.registry.get_sample_value("fairness_exporter_state_restores_total",
                                                   {"stage": stage, "result": "restored"}) or 0
                   for stage in ("counts", "join"))  # fmt: skip
    assert restored == len([p for p in committed if p[0] in second.topics.names])
    for model_id in MODELS:
        ours, theirs = second.fleet.models[model_id].store.state(), first.fleet.models[model_id].store.state()
        assert ours.keys() == theirs.keys()
        for key in ours:
            np.testing.assert_array_equal(ours[key], theirs[key], err_msg=f"{model_id}: {key}")
    for partition, task in first.tasks.items():
        if isinstance(task, JoinTask):
            theirs = second.tasks[partition]
            assert isinstance(theirs, JoinTask)
            assert (theirs.join.pending, theirs.join.orphans) == (task.join.pending, task.join.orphans)
    topic = first.topics.counts.name
    chunked = [decode(r.value).meta["chunks"] for p in range(first.topics.counts.partitions)
               for r in read_partition(bootstrap, topic, p) if decode(r.value).kind is Kind.SNAPSHOT]  # fmt: skip
    assert chunked and min(chunked) > 1  # every snapshot took several records


def test_a_re_created_input_topic_is_counted_afresh_not_taken_for_a_replay(kafka_broker: EmbeddedBroker,
                                                                          group: str) -> None:  # fmt: skip
    """Its new log starts again at offset 0: rows name the log (the topic's id), so receivers count them."""
    bootstrap = kafka_broker.bootstrap_servers
    d = daemon(staged_config(bootstrap, group))
    stages = live(d)
    stages.topic_ids[INPUT] = "first-log"  # what the source learns from the cluster before a batch is handled
    positions = starts(stages)
    batch = records(events(90, seed=4))
    run(stages, bootstrap, [(INPUT, batch)], positions)
    once = {m: stages.fleet.models[m].store.totals.copy() for m in MODELS}
    stages.restart(INPUT, "second-log", [(INPUT, 0)])
    assert stages.counted()[(INPUT, 0)] == 0 == stages.committable()[(INPUT, 0)]
    run(stages, bootstrap, [(INPUT, records(events(90, seed=4)))], positions)  # the new log, at the same offsets
    for model_id in MODELS:
        np.testing.assert_array_equal(stages.fleet.models[model_id].store.totals, 2 * once[model_id])
    assert d.registry.get_sample_value("fairness_exporter_replayed_rows_total", {"stage": "counts"}) == 0


def test_labels_read_late_hold_expiry_back_alike_on_both_paths(kafka_broker: EmbeddedBroker, group: str) -> None:
    """Labels produced 5 minutes after their predictions but read 2 hours late (a lagging daemon, or one back from
    an outage) still join, with a 1-hour horizon: the labels' clock is held back by how late labels are read (their
    Kafka timestamps against the read time). The old rule (event time against the wall clock) expired every waiting
    prediction at the first expiry, and the second half of the labels became labels of no prediction. Once labels
    are read on time, the unlabelled predictions expire. The direct and staged paths count the same."""
    bootstrap = kafka_broker.bootstrap_servers
    first = events(120, seed=7)
    labels = later_labels(first)
    half = len(labels) // 2
    waiting = sum(e["label"] is None for e in first)

    def timed(values: list[dict[str, Any]], start: int, stamped: float) -> list[SimpleRecord]:
        return [SimpleRecord(orjson.dumps(v), start + i, int(stamped * 1000)) for i, v in enumerate(values)]

    steps: list[tuple[float, str, list[SimpleRecord]]] = [
        (T0, INPUT, records(first)),
        (T0 + 7200, LABELS, timed(labels[:half], 0, T0 + 300)),
        (T0 + 7201, LABELS, timed(labels[half:], half, T0 + 310)),
        (T0 + 7300, LABELS, timed([{"prediction_id": "ghost", "label": 1}], len(labels), T0 + 7299)),  # on time
    ]
    counted = {}
    for path in ("direct", "staged"):
        d = daemon(staged_config(bootstrap, f"{group}-{path}", stages=path, label_horizon="1h"))
        stages = live(d) if path == "staged" else None
        positions = starts(stages) if stages is not None else {}
        seen = []
        for now, topic, batch in steps:
            d.clock.now = now  # type: ignore[attr-defined]
            if stages is not None:
                run(stages, bootstrap, [(topic, batch)], positions)
                stages.expire()
            else:
                d.ingest.handle(topic, 0, batch)
                d.ingest.expire()
            seen.append({**{reason: d.registry.get_sample_value("fairness_exporter_labels_expired_total",
                                                                {"reason": reason}) or 0
                            for reason in ("never_labelled", "unknown_prediction")},
                         "behind": d.registry.get_sample_value("fairness_exporter_labels_clock_behind_seconds")})
        counted[path] = (d.registry.get_sample_value("fairness_exporter_labels_joined_total"), seen)
    assert counted["direct"] == counted["staged"]
    joined, seen = counted["direct"]
    assert joined == len(labels) and half > 0
    nothing = {"never_labelled": 0, "unknown_prediction": 0}
    assert seen[0] == {**nothing, "behind": 0}  # no label read yet: the wall clock
    # read 2 hours late, within the horizon of the labels' clock, which is shown behind by as much
    assert seen[1:3] == [{**nothing, "behind": 7200 - 300}, {**nothing, "behind": 7201 - 310}]
    # on time again: the never labelled expire; the ghost label waits its hour
    assert seen[3] == {"never_labelled": waiting - len(labels), "unknown_prediction": 0, "behind": 1}


def test_a_snapshot_round_the_broker_does_not_acknowledge_is_counted_and_the_next_one_writes_it(
        fresh_broker: EmbeddedBroker, monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    """The broker stops answering (SIGSTOP: a hung broker) under a replica whose tasks hold new state: the scheduled
    round fails and is counted (before, it was only logged), the last whole round's time stays that of the round
    before (FairnessExporterStateSnapshotFailing ages it), and no task's offset moves. Once the broker answers, the
    next round writes the same tasks and commits them."""
    monkeypatch.setattr(internal_producer, "FLUSH_SECONDS", 1.0)  # know the broker is gone in 1 s, not 30
    bootstrap, broker = fresh_broker.bootstrap_servers, fresh_broker.pid
    assert broker is not None
    d = daemon(staged_config(bootstrap, "snapshots", checkpoint={"interval": "1s"}))
    stages = live(d)
    positions = starts(stages)

    def sample(name: str) -> float | None:
        return d.registry.get_sample_value(f"fairness_exporter_{name}")

    def scheduled_round(now: float) -> None:
        d.clock.now = now  # type: ignore[attr-defined]
        time.sleep(1.1)  # checkpoint.interval has passed: the round is due
        stages.tick()

    run(stages, bootstrap, [(INPUT, records(events(60, seed=8)))], positions)
    stages.flush()  # a whole round: every task's state acknowledged
    assert (sample("state_snapshot_failures_total"), sample("last_state_snapshot_timestamp_seconds")) == (0, T0)
    assert sample("state_snapshot_interval_seconds") == 1
    run(stages, bootstrap, [(INPUT, records(events(60, seed=9), start=60))], positions)
    due = {task.partition: task.consumed for task in stages.tasks.values() if task.dirty}
    committed = stages.committable()
    assert due and all(committed[partition] < consumed for partition, consumed in due.items())

    os.kill(broker, signal.SIGSTOP)
    try:
        scheduled_round(T0 + 60)
    finally:
        os.kill(broker, signal.SIGCONT)
    assert sample("state_snapshot_failures_total") == 1
    assert sample("last_state_snapshot_timestamp_seconds") == T0
    assert stages.committable() == committed

    scheduled_round(T0 + 120)
    assert sample("state_snapshot_failures_total") == 1
    assert sample("last_state_snapshot_timestamp_seconds") == T0 + 120
    assert stages.committable() == {**committed, **due}
    stages.close()


def test_a_failed_give_up_of_restoring_tasks_is_no_failed_snapshot_round(caplog: pytest.LogCaptureFixture) -> None:
    """The once-a-second step that starts restoring tasks that caught up empty writes no snapshot: when it fails
    (here the source's lag raises), the round still writes the live tasks' snapshots (none due: a whole round, its
    time exported), fairness_exporter_state_snapshot_failures_total stays 0 and the log names the give-up step.
    Before, the failure was counted as a failed snapshot round and no round ran, so a replica whose snapshots
    all succeed aged towards FairnessExporterStateSnapshotFailing. No broker: nothing is due, nothing is sent."""
    d = daemon(staged_config("127.0.0.1:9", "give-up"))
    stages = d.stages
    assert stages is not None
    counts, join = (stages.topics.counts.name, 0), (stages.topics.join.name, 0)
    stages.starts([counts, join], {counts: 5})  # the counts task looks for the snapshot covering offset 5

    def sample(name: str, **labels: str) -> float | None:
        return d.registry.get_sample_value(f"fairness_exporter_{name}", labels)

    def lag_unknown() -> dict:
        raise RuntimeError("lag not measured")

    stages.lag = lag_unknown
    with caplog.at_level(logging.ERROR, logger="exporter.stream.stages.replica"):
        stages.flush()
    assert sample("state_snapshot_failures_total") == 0  # before: 1
    assert sample("last_state_snapshot_timestamp_seconds") == T0  # before: 0, no whole round
    said = [r.getMessage() for r in caplog.records]
    assert said == ["starting the restoring tasks that caught up failed (RuntimeError: lag not measured); tried "
                    "again at the next poll or round, not a snapshot failure"], said  # fmt: skip
    assert stages.tasks[counts].restoring is not None
    stages.lag = lambda: {counts: 0}  # it works again: the task that read its whole partition starts empty
    stages.flush()
    assert stages.tasks[counts].restoring is None
    assert sample("state_restores_total", stage="counts", result="missing") == 1
    assert sample("state_snapshot_failures_total") == 0
    stages.close()


def test_a_replica_stopped_while_the_broker_hangs_still_stops_every_part(
        fresh_broker: EmbeddedBroker, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:  # fmt: skip
    """SIGTERM while the broker hangs (SIGSTOP) and internal records wait unacknowledged: closing the staged path's
    producer gives up after its 5 s (kafka-python raises KafkaTimeoutError), and the daemon's stop goes on to the
    dead-letter producer and the HTTP worker, saying in one line what was not delivered. Before, the error left
    ``Daemon.stop`` there: the dead-letter producer and the HTTP worker were never stopped."""
    monkeypatch.setattr(internal_producer, "FLUSH_SECONDS", 1.0)
    bootstrap, broker = fresh_broker.bootstrap_servers, fresh_broker.pid
    assert broker is not None
    d = daemon(staged_config(bootstrap, "hung-stop", checkpoint={"interval": "1s"}))
    stages = live(d)
    positions = starts(stages)
    run(stages, bootstrap, [(INPUT, records(events(60, seed=10)))], positions)
    stopped: list[str] = []
    monkeypatch.setattr(d, "http", SimpleNamespace(stop=lambda: stopped.append("http")))
    os.kill(broker, signal.SIGSTOP)
    try:
        stages.tick()  # records sent, never acknowledged: they wait in the producer
        d.clock.now = T0 + 60  # type: ignore[attr-defined]
        time.sleep(1.1)
        stages.tick()
        with caplog.at_level(logging.ERROR, logger="exporter.daemon"):
            d.stop()
    finally:
        os.kill(broker, signal.SIGCONT)
    assert stopped == ["http"]
    said = [r.getMessage() for r in caplog.records if r.getMessage().startswith("stopping the staged path's")]
    assert len(said) == 1 and "not delivered" in said[0], said


def test_a_restoring_task_that_fails_going_live_between_polls_is_never_snapshotted_half_applied() -> None:
    """The once-a-second round starts a restoring task that read its whole partition without a snapshot, then
    applies what it buffered. If that fails partway (here: the second of three buffered records), the task would
    be live with one record applied and its offset past all three, and the round's snapshot would cover the two it
    never applied: they would be lost. Now every task is dropped (restored again from its snapshot at the next
    assignment), nothing is snapshotted or committable beyond what was, and the next poll fails so that the source
    reads again from what was acknowledged, as after a failure mid-poll. No broker: nothing is due or sent."""
    d = daemon(staged_config("127.0.0.1:9", "go-live"))
    stages = d.stages
    assert stages is not None
    counts = (stages.topics.counts.name, 0)
    stages.starts([counts], {counts: 5})
    task = stages.tasks[counts]
    assert task.restoring is not None
    task.restoring.buffered.extend([(5 + i, SimpleNamespace(kind=None, n=i)) for i in range(3)])
    task.consumed, task.fetched = 8, True
    committable = stages.committable()
    applied: list[int] = []

    def apply(record: Any, offset: int) -> list[Any]:
        if record.n == 1:
            raise RuntimeError("cannot apply")
        applied.append(offset)
        return []

    task.apply = apply  # type: ignore[method-assign]
    stages.failures.failed = lambda *args: False  # not a record to skip: the failure stands
    stages.lag = lambda: {counts: 0}
    stages.flush()
    assert applied == [5]
    assert counts not in stages.tasks and stages.committable() == committable == {}
    assert d.registry.get_sample_value("fairness_exporter_state_snapshots_total", {"stage": "counts"}) in (None, 0)
    said = r"a restoring task failed going live between polls \(RuntimeError: cannot apply\)"
    with pytest.raises(RuntimeError, match=said):
        stages.handle_poll({})
    assert stages.broken is None  # that poll failed: the next consumer reads again from what was acknowledged
    stages.close()
