"""Attributes joined by id on the real broker, with both client libraries: predictions (our JSON events, or KServe's
payload log) carry only ``applicant_id``; demographics are on a compacted topic, 80% before the prediction, 15% after
it within the horizon, 5% never, a few corrected. The per-subgroup counts on /metrics equal the truth exactly, the
never-joined count as unknown, and a SIGKILL and restart in the middle changes nothing."""

from __future__ import annotations

import contextlib
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import orjson
import yaml
from daemon_fixture import FAST_RECONNECT, sample, scrape, wait_for
from kafka import KafkaProducer
from kafka.admin import KafkaAdminClient, NewTopic
from kafka.errors import TopicAlreadyExistsError
from payload_logs import cloudevent, numpy_response, pandas_request, send
from side_traffic import ATTRIBUTES, GENDERS, RACES, Scenario, scenario

from exporter.config import load_config
from exporter.daemon import Daemon
from exporter.devtools.embedded_broker import EmbeddedBroker, free_port

HORIZON = 30  # seconds; the predictions are stamped 20 s ago, so the never-joined give up within half a minute


def topics(broker: EmbeddedBroker) -> tuple[str, str]:
    """A predictions topic and a compacted demographics topic (2 partitions: records go by key)."""
    name = uuid.uuid4().hex[:8]
    broker.create_topic(f"predictions-{name}", partitions=2)
    admin = KafkaAdminClient(bootstrap_servers=broker.bootstrap_servers)
    with contextlib.suppress(TopicAlreadyExistsError):
        admin.create_topics([NewTopic(f"demographics-{name}", 2, 1, topic_configs={"cleanup.policy": "compact"})])
    admin.close()
    return f"predictions-{name}", f"demographics-{name}"


def config(broker: EmbeddedBroker, topic: str, side: str, library: str, port: int = 0, **extra: object) -> dict:
    return {"model_id": "m1", "protected_attributes": ATTRIBUTES,
            "attribute_sources": {"applicants": {"topic": side, "id": "applicant_id", "horizon": f"{HORIZON}s"}},
            "kafka": {"bootstrap_servers": broker.bootstrap_servers, "topic": topic, "assignment": "manual",
                      "client_library": library, "client": FAST_RECONNECT[library], "group_id": f"g-{topic}"},
            "windows": ["1h"], "bucket": "1m", "evaluation_interval": "1s", "min_samples": 5,
            "listen": {"address": "127.0.0.1", "port": port}, **extra}  # fmt: skip


def send_side(broker: EmbeddedBroker, topic: str, records: list[tuple[str, dict | None, float]]) -> None:
    """Keyed records (a tombstone's value None), each stamped with its time (the Kafka timestamp it is in force
    from)."""
    producer = KafkaProducer(bootstrap_servers=broker.bootstrap_servers, linger_ms=5, enable_idempotence=False)
    try:
        for key, value, time_ in records:
            producer.send(topic, key=key.encode(), value=None if value is None else orjson.dumps(value),
                          timestamp_ms=int(time_ * 1000))  # fmt: skip
        producer.flush(timeout=30)
    finally:
        producer.close(timeout=5)


def outcomes(port: int) -> float:
    page = scrape(port)
    return sum(sample(page, "fairness_exporter_attribute_joins_total", source="applicants", outcome=o) or 0
               for o in ("joined", "joined_after_wait", "never_joined"))  # fmt: skip


def assert_truth(port: int, s: Scenario, restarted: bool = False) -> None:
    page = scrape(port)
    for (attribute, group), (n, _) in s.truth.items():
        for predicted in (0, 1):
            want = s.truth[(attribute, group)][1] if predicted else n - s.truth[(attribute, group)][1]
            got = sample(page, "fairness_predictions_total", model_id="m1", attribute=attribute, subgroup=group,
                         predicted=str(predicted))  # fmt: skip
            assert (got or 0) == want, (attribute, group, predicted)
        assert sample(page, "model_subgroup_samples", model_id="m1", attribute=attribute, subgroup=group,
                      window="1h") == n  # fmt: skip
    for attribute in ("gender", "race"):
        assert sample(page, "model_subgroup_unknown_samples", model_id="m1", attribute=attribute, window="1h") == \
            s.never  # fmt: skip
    if not restarted:  # a process's counters start at 0; the window counts above are the checkpoint's
        assert sample(page, "fairness_exporter_attribute_joins_total", source="applicants",
                      outcome="never_joined") == s.never  # fmt: skip


def started(path: Path, raw: dict, daemons: list[Daemon]) -> Daemon:
    path.write_text(yaml.safe_dump(raw))
    daemon = Daemon(load_config(path))
    daemons.append(daemon)
    daemon.start()
    return daemon


def the_rest_then_the_truth(broker: EmbeddedBroker, side: str, daemon: Daemon, s: Scenario) -> None:
    """The records that come after the predictions; once every prediction is joined or given up, /metrics holds
    the truth."""
    send_side(broker, side, s.after)
    wait_for(lambda: outcomes(daemon.port) == len(s.predictions), timeout=90, what="every prediction joined or "
             "given up")  # fmt: skip
    daemon.computer.compute()
    assert_truth(daemon.port, s)


def test_json_events_with_ids_only_count_the_truth(kafka_broker: EmbeddedBroker, tmp_path: Path,
                                                   daemons: list[Daemon], client_library: str) -> None:  # fmt: skip
    events, side = topics(kafka_broker)
    s = scenario(500, time.time() - 20)
    send_side(kafka_broker, side, s.before)
    daemon = started(tmp_path / "daemon.yaml", config(kafka_broker, events, side, client_library), daemons)
    send(kafka_broker.bootstrap_servers, events, [(orjson.dumps(p), [], None) for p in s.predictions])
    wait_for(lambda: sample(scrape(daemon.port), "fairness_exporter_events_consumed_total") == len(s.predictions),
             what="every prediction read")  # fmt: skip
    the_rest_then_the_truth(kafka_broker, side, daemon, s)


def test_kserve_payloads_with_ids_only_count_the_truth(kafka_broker: EmbeddedBroker, tmp_path: Path,
                                                       daemons: list[Daemon], client_library: str) -> None:  # fmt: skip
    events, side = topics(kafka_broker)
    ts = time.time() - 20
    s = scenario(300, ts, seed=11)
    send_side(kafka_broker, side, s.before)
    raw = config(kafka_broker, events, side, client_library, events={"format": "kserve", "prediction": "predict"})
    daemon = started(tmp_path / "daemon.yaml", raw, daemons)
    calls = []
    for p in s.predictions:
        request = pandas_request({"applicant_id": [p["attributes"]["applicant_id"]], "income": [52000]})
        calls.append(cloudevent("m1", p["prediction_id"], False, orjson.dumps(request), ts))
        response = numpy_response("m1", p["prediction_id"], "predict", [p["prediction"]])
        calls.append(cloudevent("m1", p["prediction_id"], True, orjson.dumps(response), ts))
    send(kafka_broker.bootstrap_servers, events, calls)
    wait_for(lambda: sample(scrape(daemon.port), "fairness_exporter_payload_pairs_joined_total") == len(s.predictions),
             what="every call joined")  # fmt: skip
    the_rest_then_the_truth(kafka_broker, side, daemon, s)


def _serve(path: Path, log: Path) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-m", "exporter.cli", "serve", "--config", str(path)],
                            stdout=log.open("ab"), stderr=subprocess.STDOUT)  # fmt: skip


def test_a_sigkill_and_restart_in_the_middle_changes_nothing(kafka_broker: EmbeddedBroker, tmp_path: Path,
                                                             client_library: str) -> None:  # fmt: skip
    events, side = topics(kafka_broker)
    s = scenario(600, time.time() - 20, seed=5)
    port = free_port()
    path = tmp_path / "daemon.yaml"
    path.write_text(yaml.safe_dump(config(kafka_broker, events, side, client_library, port,
                                          checkpoint={"path": str(tmp_path / "state"), "interval": "1s"})))
    log = tmp_path / "daemon.log"
    send_side(kafka_broker, side, s.before)
    half = len(s.predictions) // 2
    send(kafka_broker.bootstrap_servers, events, [(orjson.dumps(p), [], None) for p in s.predictions[:half]])
    first = _serve(path, log)
    try:
        wait_for(lambda: _safe(lambda: sample(scrape(port), "fairness_exporter_events_consumed_total") or 0) >= half,
                 what="the first half read")  # fmt: skip
        wait_for(lambda: (tmp_path / "state" / "fleet.checkpoint.npz").exists(), what="a checkpoint")
        send(kafka_broker.bootstrap_servers, events, [(orjson.dumps(p), [], None) for p in s.predictions[half:]])
        time.sleep(0.3)  # part of the way through the second half
    finally:
        first.send_signal(signal.SIGKILL)
        first.wait(10)
    send_side(kafka_broker, side, s.after)
    second = _serve(path, log)
    try:
        wait_for(lambda: _safe(lambda: counted(port)) == len(s.predictions), timeout=90,
                 what="every prediction joined or given up after the restart")  # fmt: skip
        time.sleep(2)  # anything counted twice would show up now
        assert_truth(port, s, restarted=True)
    finally:
        second.send_signal(signal.SIGTERM)
        assert second.wait(20) == 0, log.read_text()[-3000:]
    assert "restored checkpoint" in log.read_text()
    assert not any(value in log.read_text() for value in (*GENDERS, *RACES))  # the firewall: no value in a log line


def counted(port: int) -> float:
    """Predictions in the window once none waits for its record."""
    page = scrape(port)
    if sample(page, "fairness_exporter_predictions_waiting_for_attributes") != 0:
        return -1.0
    return sample(page, "model_subgroup_samples", model_id="m1", attribute="gender", subgroup="overall",
                  window="1h") or 0.0  # fmt: skip


def _safe(read: object) -> float:
    try:
        return read()  # type: ignore[operator,no-any-return]
    except OSError:
        return -1.0
