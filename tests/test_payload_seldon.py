"""Seldon Core v2 on the real broker, with records made by MLServer's own codecs and protobuf converters and written
as Seldon's gateways write them (tests/platform_payloads.py): the outputs record carries the request record's
headers, its ``seldon-infer-type`` included. A fleet of three Seldon models is one daemon reading
``kafka.topic_pattern`` (a model whose topics appear after the start included), and each model's per-subgroup
counts on /metrics equal the truth exactly: protobuf with typed and raw contents, REST JSON with and without the
type header, calls straight to a model and through pipelines (one id through two pipelines is two calls), a
redelivered request, a request that failed, and a model nobody configured."""

from __future__ import annotations

import random
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml
from daemon_fixture import FAST_RECONNECT, GROUP_CLIENT, sample, scrape, wait_for
from payload_logs import platform_records, send_placed

from exporter.config import ConfigError, load_config, parse_config
from exporter.daemon import Daemon
from exporter.devtools.embedded_broker import EmbeddedBroker

MODELS = ("income", "credit", "churn")


def _calls(namespace: str, rng: random.Random) -> tuple[list[dict[str, Any]], Counter[tuple[str, str, str, int]]]:
    """Each model's calls, in every form the gateways write, and what each model must count (call 3 fails: its
    response is never written; the last is of a model nobody configured)."""
    truth: Counter[tuple[str, str, str, int]] = Counter()
    calls = []
    for k in range(90):
        model = MODELS[k % 3]
        n = rng.randint(1, 3)
        genders = [rng.choice(["male", "female"]) for _ in range(n)]
        region = rng.choice(["north", "south"])
        calls.append({"model": model, "namespace": namespace, "id": str(uuid.uuid4()), "partition": k % 2,
                      "pipeline": (None, f"{model}-pipeline", "scoring")[k % 3], "json": k % 4 in (1, 2),
                      "typed_header": k % 4 != 2, "raw": k % 4 == 3,
                      "columns": {"gender": genders, "age": [rng.randint(18, 90) for _ in range(n)]},
                      "headers": {"x-region": region},
                      "scores": [round(rng.random(), 3) for _ in range(n)]})  # fmt: skip
    calls.append(dict(calls[1], pipeline="audit-mirror"))  # the same request id through a second pipeline: a call
    for k, call in enumerate(calls):
        if k == FAILED:
            continue
        for g, s in zip(call["columns"]["gender"], call["scores"], strict=True):
            y = int(float(np.float32(s)) >= 0.5)  # FP32 on the wire, thresholded as the daemon reads it
            truth[(call["model"], "gender", g, y)] += 1
            truth[(call["model"], "region", call["headers"]["x-region"], y)] += 1
    calls.append({**calls[2], "model": "unmonitored", "id": str(uuid.uuid4())})
    return calls, truth


FAILED = 3
"""The call that failed: Seldon writes its error to seldon.<ns>.errors.errors, and no response."""


@pytest.mark.parametrize("assignment", ["manual", "subscribe"])
def test_a_fleet_of_seldon_models_made_by_mlserver_counts_exactly_in_one_daemon(
    kafka_broker: EmbeddedBroker, tmp_path: Path, daemons: list[Daemon], client_library: str, assignment: str,
) -> None:  # fmt: skip
    """Subscribed, a model's topics that appear later make the consumer subscribe again, and the group hands them
    over; manual assignment takes them at its next look."""
    namespace = f"ns{uuid.uuid4().hex[:6]}"
    calls, truth = _calls(namespace, random.Random(5))
    records = platform_records("seldon", calls, tmp_path)
    requests, responses = records[0::2], records[1::2]  # each call's inputs record, then its outputs record
    assert all(r[0].endswith(".inputs") for r in requests) and all(r[0].endswith(".outputs") for r in responses)
    del responses[FAILED]
    stem = f"seldon.{namespace}.model"
    for model in ("income", "credit", "unmonitored"):
        for side in ("inputs", "outputs"):
            kafka_broker.create_topic(f"{stem}.{model}.{side}", partitions=2)
    late = [r for r in records if r[0].startswith(f"{stem}.churn.") and r in requests + responses]
    path = tmp_path / "daemon.yaml"
    path.write_text(yaml.safe_dump({
        "kafka": {"bootstrap_servers": kafka_broker.bootstrap_servers, "topic_pattern": f"{stem}.*.inputs",
                  "assignment": assignment, "client_library": client_library, "group_id": f"g-{namespace}",
                  "client": (FAST_RECONNECT if assignment == "manual" else GROUP_CLIENT)[client_library]},
        "events": {"format": "seldon", "prediction": "proba", "score_threshold": 0.5},
        "windows": ["1h"], "bucket": "1m", "evaluation_interval": "1s", "min_samples": 5,
        "listen": {"address": "127.0.0.1", "port": 0},
        "models": [{"model_id": m, "protected_attributes": [
            {"name": "gender", "groups": ["male", "female"]},
            {"name": "region", "column": "x-region", "groups": ["north", "south"]}]} for m in MODELS],
    }))  # fmt: skip
    config = load_config(path)
    assert config.kafka.topic_pattern == (f"{stem}.*.inputs", f"{stem}.*.outputs")
    daemon = Daemon(config)  # the wall clock: Seldon's records are timed by their Kafka timestamps
    daemons.append(daemon)
    daemon.start()
    early = [r for r in responses if r not in late]
    send_placed(kafka_broker.bootstrap_servers, early[:20])  # some responses read before their requests
    send_placed(kafka_broker.bootstrap_servers, [r for r in requests if r not in late] + [requests[0]])  # one twice
    send_placed(kafka_broker.bootstrap_servers, early[20:])
    for side in ("inputs", "outputs"):  # a model deployed after the daemon started: its topics appear now
        kafka_broker.create_topic(f"{stem}.churn.{side}", partitions=2)
    send_placed(kafka_broker.bootstrap_servers, late)
    answered = len(calls) - 2  # the failed call, and the unconfigured model's
    wait_for(lambda: sample(scrape(daemon.port), "fairness_exporter_payload_pairs_joined_total") == answered,
             what=f"{answered} calls joined", timeout=120)  # fmt: skip
    daemon.computer.compute()
    page = scrape(daemon.port)
    for (model, attribute, subgroup, y), n in truth.items():
        assert sample(page, "fairness_predictions_total", attribute=attribute, model_id=model, predicted=str(y),
                      subgroup=subgroup) == n, (model, attribute, subgroup, y)  # fmt: skip
    unmatched = {r: sample(page, "fairness_exporter_payload_halves_unmatched_total", reason=r)
                 for r in ("duplicate_delivery", "other_component", "partner_refused")}  # fmt: skip
    assert unmatched == {"duplicate_delivery": 1, "other_component": 0, "partner_refused": 0}
    assert sample(page, "fairness_exporter_events_ignored_total", reason="unconfigured_model") == 2
    assert not any(sample(page, "fairness_exporter_events_rejected_total", reason=r)
                   for r in ("malformed_payload", "unequal_rows"))  # fmt: skip



def test_one_seldon_model_named_by_kafka_topic_reads_its_outputs_beside_it_as_before(
    kafka_broker: EmbeddedBroker, tmp_path: Path, daemons: list[Daemon],
) -> None:  # fmt: skip
    """A config of one model (``kafka.topic``, as users have them) keeps its meaning, with MLServer's records."""
    namespace = f"ns{uuid.uuid4().hex[:6]}"
    calls, truth = _calls(namespace, random.Random(9))
    calls = [c for c in calls[:FAILED] + calls[FAILED + 1:] if c["model"] == "income"]
    records = platform_records("seldon", calls, tmp_path)
    inputs = f"seldon.{namespace}.model.income.inputs"
    for side in ("inputs", "outputs"):
        kafka_broker.create_topic(f"seldon.{namespace}.model.income.{side}", partitions=2)
    path = tmp_path / "daemon.yaml"
    path.write_text(yaml.safe_dump({
        "kafka": {"bootstrap_servers": kafka_broker.bootstrap_servers, "topic": inputs, "assignment": "manual",
                  "client": FAST_RECONNECT["kafka-python"]},
        "events": {"format": "seldon", "prediction": "proba", "score_threshold": 0.5},
        "windows": ["1h"], "bucket": "1m", "evaluation_interval": "1s", "min_samples": 5,
        "listen": {"address": "127.0.0.1", "port": 0}, "model_id": "income",
        "protected_attributes": [{"name": "gender", "groups": ["male", "female"]},
                                 {"name": "region", "column": "x-region", "groups": ["north", "south"]}],
    }))  # fmt: skip
    daemon = Daemon(load_config(path))
    daemons.append(daemon)
    daemon.start()
    send_placed(kafka_broker.bootstrap_servers, records)
    wait_for(lambda: sample(scrape(daemon.port), "fairness_exporter_payload_pairs_joined_total") == len(calls),
             what=f"{len(calls)} calls joined")  # fmt: skip
    daemon.computer.compute()
    page = scrape(daemon.port)
    for (model, attribute, subgroup, y), n in truth.items():
        if model == "income":
            assert sample(page, "fairness_predictions_total", attribute=attribute, model_id=model, predicted=str(y),
                          subgroup=subgroup) == n, (attribute, subgroup, y)  # fmt: skip
    assert not sample(page, "fairness_exporter_payload_halves_unmatched_total", reason="duplicate_delivery")

def _seldon(kafka: dict[str, Any]) -> dict[str, Any]:
    return {"kafka": kafka, "events": {"format": "seldon", "prediction": "proba", "score_threshold": 0.5},
            "models": [{"model_id": m, "protected_attributes": [{"name": "gender", "groups": ["male", "female"]}]}
                       for m in MODELS]}  # fmt: skip


def test_a_list_of_seldon_inputs_topics_reads_each_ones_outputs_beside_it_and_kafka_topic_keeps_its_meaning() -> None:
    listed = parse_config(_seldon({"topics": ["seldon.prod.model.income.inputs", "seldon.prod.model.credit.inputs"]}))
    assert listed.kafka.events_topics() == ["seldon.prod.model.income.inputs", "seldon.prod.model.income.outputs",
                                           "seldon.prod.model.credit.inputs", "seldon.prod.model.credit.outputs"]
    assert not listed.kafka.reads_events("predictions")  # kafka.topic's default is not read beside them
    one = parse_config(_seldon({"topic": "seldon.prod.model.income.inputs"}))
    assert (one.kafka.topic, one.kafka.response_topic, one.kafka.topics) == (
        "seldon.prod.model.income.inputs", "seldon.prod.model.income.outputs", ())
    matched = parse_config(_seldon({"topic_pattern": "seldon.prod.model.*.inputs"}))
    assert [t for t in ("seldon.prod.model.churn.inputs", "seldon.prod.model.churn.outputs",
                        "seldon.prod.model.a.b.inputs", "seldon.dev.model.churn.inputs", "seldon.prod.errors.errors")
            if matched.kafka.reads_events(t)] == ["seldon.prod.model.churn.inputs", "seldon.prod.model.churn.outputs"]


@pytest.mark.parametrize(("kafka", "line"), [
    ({"topic": "seldon.p.model.a.inputs", "topics": ["b"]},
     "kafka.topics: give one of kafka.topic, kafka.topics and kafka.topic_pattern, not kafka.topic and kafka.topics"),
    ({"topics": "seldon.prod.model.a.inputs"}, "kafka.topics: 'seldon.prod.model.a.inputs' is not a non-empty list of "
                                               "topic names (each 1 to 249 of A-Z a-z 0-9 . _ -)"),
    ({"topics": ["seldon.p.model.a.inputs"] * 2}, "kafka.topics: ['seldon.p.model.a.inputs', "
                                                  "'seldon.p.model.a.inputs'] names a topic twice"),
    ({"topic_pattern": "seldon.prod.model.income.inputs"}, "kafka.topic_pattern: 'seldon.prod.model.income.inputs' is "
                                                           "not a topic name with * for any run of characters but a "
                                                           "dot, such as seldon.prod.model.*.inputs"),
    ({"topic_pattern": "seldon.prod.*"}, "kafka.topic_pattern: 'seldon.prod.*': events.format seldon reads models' "
                                         "seldon.<namespace>.model.<name>.inputs topics (each one's .outputs beside "
                                         "it)"),
    ({"topic_pattern": "seldon.prod.model.*.inputs", "dead_letter_topic": "seldon.prod.model.dlq.inputs"},
     "kafka.topic_pattern: 'seldon.prod.model.*.inputs' matches 'seldon.prod.model.dlq.inputs', which would be read "
     "as events"),
    ({"topics": ["seldon.prod.model.a.inputs"], "response_topic": "x"},
     "kafka.response_topic: is one topic beside kafka.topic; with kafka.topics, Seldon's outputs topics are read "
     "beside its inputs topics"),
])  # fmt: skip
def test_a_fleet_of_topics_is_refused_in_one_line_naming_the_key(kafka: dict[str, Any], line: str) -> None:
    with pytest.raises(ConfigError) as caught:
        parse_config(_seldon(kafka), "fleet.yaml")
    assert [problem.strip() for problem in str(caught.value).splitlines()[1:]] == [line]


def test_events_component_is_refused_where_no_component_logs() -> None:
    raw = _seldon({"topic": "seldon.prod.model.income.inputs"})
    raw["models"][0]["events"] = {"component": "transformer"}
    with pytest.raises(ConfigError) as caught:
        parse_config(raw, "fleet.yaml")
    assert [p.strip() for p in str(caught.value).splitlines()[1:]] == [
        "models[0] (income).events.component: only KServe's payload logger names the component that logged a call "
        "(events.format kserve)"]
