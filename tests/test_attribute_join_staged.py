"""Attributes joined by id on the staged path (``kafka.stages: staged``), on the real broker: two replicas of one
group (one on each client library) and a direct daemon read the same predictions, which carry only
``applicant_id``, and the same compacted demographics topic (80% of the records before the prediction, 15% after
it within the horizon, 5% never, a few corrected). The replica that owns the model is SIGKILLed in the middle, with
predictions waiting for their records; the other takes the model over from its snapshot. Its per-subgroup counts
equal the truth and the direct daemon's exactly."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import orjson
import yaml
from daemon_fixture import GROUP_CLIENT, Replica, probe, sample, scrape, wait_for
from payload_logs import send
from side_traffic import ATTRIBUTES, GENDERS, RACES, scenario
from test_attribute_join_kafka import assert_truth, counted, send_side, started, topics
from test_attribute_join_kafka import config as direct_config
from test_stages_scale_out import _snapshots_cover_everything

from exporter.daemon import Daemon
from exporter.devtools.embedded_broker import EmbeddedBroker, free_port

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
        log = tmp_path / f"replica-{i}.log"
        replicas.append(Replica(port, subprocess.Popen([sys.executable, "-m", "exporter.cli", "serve", "--config",
                                                         str(path)], stdout=log.open("ab"),
                                                        stderr=subprocess.STDOUT), log))  # fmt: skip
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
    finally:
        for r in replicas:
            if r.process.poll() is None:
                r.process.send_signal(signal.SIGTERM)
                r.process.wait(20)
    logs = "".join(r.log.read_text() for r in replicas)
    assert not any(value in logs for value in (*GENDERS, *RACES))  # the firewall: no value in a log line


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
