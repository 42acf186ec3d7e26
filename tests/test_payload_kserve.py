"""KServe's payload logger on the real broker: two InferenceServices (v2 with MLServer's pandas codec and batches, v1
with records) log through a KafkaSink to one 4-partition topic with random keys, some events in structured mode,
some gzipped, some responses before their requests, a failed call, a duplicated delivery and bad payloads; each
model's per-subgroup counts on /metrics equal the truth exactly, and delayed labels join the rows by request id."""

from __future__ import annotations

import random
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import orjson
import pytest
import yaml
from broker_fixture import consume_all, produce
from daemon_fixture import FAST_RECONNECT, sample, scrape, wait_for
from payload_logs import (
    Record,
    cloudevent,
    gzipped,
    numpy_response,
    pandas_request,
    platform_records,
    send,
    send_placed,
)

from exporter.config import load_config
from exporter.daemon import Daemon
from exporter.devtools.embedded_broker import EmbeddedBroker

T0 = 1_800_000_000.0
GENDERS, REGIONS = ("male", "female"), ("north", "south")


def config(bootstrap: str, topic: str, labels: str, library: str = "kafka-python",
           dead_letters: str | None = None) -> dict[str, Any]:  # fmt: skip
    return {"kafka": {"bootstrap_servers": bootstrap, "topic": topic, "labels_topic": labels,
                      **({"dead_letter_topic": dead_letters} if dead_letters else {}),
                      "assignment": "manual", "client_library": library, "client": FAST_RECONNECT[library]},
            "events": {"format": "kserve"},
            "windows": ["1h", "24h"], "bucket": "1m", "evaluation_interval": "1s", "min_samples": 5,
            "listen": {"address": "127.0.0.1", "port": 0},
            "models": [
                {"model_id": "credit-v2", "events": {"prediction": "predict"},
                 "protected_attributes": [{"name": "gender", "groups": list(GENDERS)},
                                          {"name": "region", "groups": list(REGIONS), "column": "x-region"}]},
                {"model_id": "loans-v1", "events": {"prediction": "predictions"},
                 "protected_attributes": [{"name": "gender", "column": "sex", "groups": list(GENDERS)}]},
            ]}  # fmt: skip


class Truth:
    """What the daemon must count: per model, attribute, subgroup and predicted class."""

    def __init__(self) -> None:
        self.counts: Counter[tuple[str, str, str, int]] = Counter()
        self.ids: dict[str, list[tuple[str, int, str]]] = {}

    def add(self, model: str, pid: str, rows: list[dict[str, Any]]) -> None:
        for i, row in enumerate(rows):
            for attribute in ("gender", "region"):
                if attribute in row:
                    self.counts[(model, attribute, row[attribute], row["y"])] += 1
            row_id = pid if len(rows) == 1 else f"{pid}:{i}"
            self.ids.setdefault(model, []).append((row_id, row["y"], row["gender"]))


def traffic(rng: random.Random, truth: Truth) -> list[Record]:
    """Calls of both models in a shuffled order (responses before requests too), with the field's defects."""
    records: list[Record] = []
    for call in range(60):  # v2 with the pandas codec, batches of 1 to 4 rows, region in a logged header
        pid, n = str(uuid.uuid4()), rng.randint(1, 4)
        region = rng.choice(REGIONS)
        rows = [{"gender": rng.choice(GENDERS), "region": region, "income": rng.random() * 1e5} for _ in range(n)]
        for row in rows:
            row["y"] = int(row["gender"] == "male" or rng.random() < 0.3)
        body = orjson.dumps(pandas_request({"gender": [r["gender"] for r in rows],
                                            "income": [r["income"] for r in rows]}))  # fmt: skip
        answer = orjson.dumps(numpy_response("credit-v2", pid, "predict", [r["y"] for r in rows]))
        ts = T0 - 1800 + call
        structured, zipped = call % 5 == 0, call % 7 == 0
        key = uuid.uuid4().bytes
        records.append(cloudevent("credit-v2", pid, False, gzipped(body) if zipped else body, ts,
                                  structured=structured, metadata={"X-Region": [region]}, key=key))  # fmt: skip
        records.append(cloudevent("credit-v2", pid, True, answer, ts + 0.01, structured=call % 3 == 0,
                                  key=uuid.uuid4().bytes))  # fmt: skip
        truth.add("credit-v2", pid, rows)
    for call in range(80):  # v1 records, one instance per call
        pid = str(uuid.uuid4())
        sex = rng.choice(GENDERS)
        y = int(rng.random() < (0.6 if sex == "male" else 0.4))
        body = orjson.dumps({"instances": [{"sex": sex, "amount": rng.randint(1, 100)}]})
        records.append(cloudevent("loans-v1", pid, False, gzipped(body) if call % 4 == 0 else body, T0 - 900 + call,
                                  key=uuid.uuid4().bytes))  # fmt: skip
        records.append(cloudevent("loans-v1", pid, True, orjson.dumps({"predictions": [y]}), T0 - 900 + call,
                                  key=uuid.uuid4().bytes))  # fmt: skip
        truth.add("loans-v1", pid, [{"gender": sex, "y": y}])
    records.append(records[10])  # a duplicated delivery of a request, and of a response
    records.append(records[131])
    failed = str(uuid.uuid4())  # a failed call (500): the logger has only its request
    records.append(cloudevent("loans-v1", failed, False, orjson.dumps({"instances": [{"sex": "male"}]}), T0 - 60))
    records += bad_payloads()
    records.append(cloudevent("another-isvc", "x", False, orjson.dumps({"instances": [[1]]}), T0 - 60))
    rng.shuffle(records)  # any partition, any order: responses before their requests
    return records


def bad_payloads() -> list[Record]:
    """One call per defect, request and response both logged: each refused whole, never half counted."""
    out = []
    defects = {
        "not_gzip": (orjson.dumps({"instances": [{"sex": "male"}]}), [("content-encoding", b"gzip")]),
        "unequal_rows": (orjson.dumps({"inputs": [
            {"name": "gender", "shape": [2, 1], "datatype": "BYTES", "data": ["male", "female"]},
            {"name": "income", "shape": [1, 1], "datatype": "FP64", "data": [1.0]}]}), []),
        "base64_bytes": (orjson.dumps({"inputs": [{"name": "gender", "shape": [1], "datatype": "BYTES",
                                                   "parameters": {"content_type": "base64"},
                                                   "data": ["bWFsZQ=="]}]}), []),
        "unknown_datatype": (orjson.dumps({"inputs": [{"name": "gender", "shape": [1], "datatype": "STRING",
                                                       "data": ["male"]}]}), []),
    }
    for reason, (body, headers) in defects.items():
        out.append(cloudevent("credit-v2", f"bad-{reason}", False, body, T0 - 60, extra_headers=headers))
        out.append(cloudevent("credit-v2", f"bad-{reason}", True,
                              orjson.dumps(numpy_response("credit-v2", reason, "predict", [1])), T0 - 60))  # fmt: skip
    return out


def test_two_inference_services_on_one_topic_count_exactly_and_labels_join_by_request_id(
    kafka_broker: EmbeddedBroker, tmp_path: Path, daemons: list[Daemon], client_library: str,
) -> None:  # fmt: skip
    topic, labels = f"kserve-{uuid.uuid4().hex[:8]}", f"labels-{uuid.uuid4().hex[:8]}"
    dead = f"dead-{uuid.uuid4().hex[:8]}"
    kafka_broker.create_topic(topic, partitions=4)
    kafka_broker.create_topic(labels, partitions=1)
    kafka_broker.create_topic(dead, partitions=1)
    truth = Truth()
    records = traffic(random.Random(7), truth)
    path = tmp_path / "daemon.yaml"
    path.write_text(yaml.safe_dump(config(kafka_broker.bootstrap_servers, topic, labels, client_library, dead)))
    daemon = Daemon(load_config(path), clock=lambda: T0)
    daemons.append(daemon)
    daemon.start()
    send(kafka_broker.bootstrap_servers, topic, records)

    calls = 60 + 80
    wait_for(lambda: sample(scrape(daemon.port), "fairness_exporter_payload_pairs_joined_total") == calls
             and sample(scrape(daemon.port), "fairness_exporter_events_consumed_total") == len(records),
             what=f"{calls} calls joined")  # fmt: skip
    daemon.computer.compute()
    page = scrape(daemon.port)
    for (model, attribute, subgroup, y), n in truth.counts.items():
        found = sample(page, "fairness_predictions_total", attribute=attribute, model_id=model, predicted=str(y),
                       subgroup=subgroup)  # fmt: skip
        assert found == n, (model, attribute, subgroup, y)
    for model in ("credit-v2", "loans-v1"):
        rows = sum(n for (m, a, _, _), n in truth.counts.items() if m == model and a == "gender")
        assert sample(page, "model_subgroup_samples", model_id=model, attribute="gender", window="1h",
                      subgroup="overall") == rows  # fmt: skip
    for reason in ("not_gzip", "unequal_rows", "base64_bytes", "unknown_datatype"):
        assert sample(page, "fairness_exporter_events_rejected_total", reason=reason) == 1, reason
    unmatched = {r: sample(page, "fairness_exporter_payload_halves_unmatched_total", reason=r)
                 for r in ("duplicate_delivery", "partner_refused")}  # fmt: skip
    # two duplicates; each refused request's response is dropped with it (before or after it arrives)
    assert unmatched["duplicate_delivery"] == 2
    assert unmatched["partner_refused"] == 4
    assert sample(page, "fairness_exporter_events_ignored_total", reason="unconfigured_model") == 1
    letters = consume_all(kafka_broker.bootstrap_servers, dead, 4)  # the refused requests, each with its reason
    assert sorted(dict(r.headers)["reason"].decode() for r in letters) == [
        "base64_bytes", "not_gzip", "unequal_rows", "unknown_datatype"]

    # delayed labels join the rows by request id (row index for a batch)
    labelled = [(model, row_id, y, gender) for model, ids in truth.ids.items() for row_id, y, gender in ids[:25]]
    produce(kafka_broker.bootstrap_servers, labels,
            [orjson.dumps({"prediction_id": row_id, "label": 1 - y}) for _, row_id, y, _ in labelled])
    wait_for(lambda: sample(scrape(daemon.port), "fairness_exporter_labels_joined_total") == len(labelled),
             what="labels joined")  # fmt: skip
    daemon.computer.compute()
    page = scrape(daemon.port)
    for model in ("credit-v2", "loans-v1"):
        mine = [row for row in labelled if row[0] == model]
        for gender in GENDERS:
            expected = sum(1 for row in mine if row[3] == gender)
            found = sum(v for (name, labels_), v in page.items() if name == "fairness_labelled_predictions_total"
                        and ("model_id", model) in labels_ and ("subgroup", gender) in labels_
                        and ("attribute", "gender") in labels_)  # fmt: skip
            assert found == expected, (model, gender)


def test_a_restart_between_a_request_and_its_response_still_counts_the_call_once(
    kafka_broker: EmbeddedBroker, tmp_path: Path, daemons: list[Daemon],
) -> None:  # fmt: skip
    topic = f"kserve-{uuid.uuid4().hex[:8]}"
    kafka_broker.create_topic(topic, partitions=4)
    labels = f"labels-{uuid.uuid4().hex[:8]}"
    kafka_broker.create_topic(labels, partitions=1)
    raw = config(kafka_broker.bootstrap_servers, topic, labels)
    raw["checkpoint"] = {"path": str(tmp_path / "checkpoint"), "interval": "1h"}
    path = tmp_path / "daemon.yaml"
    path.write_text(yaml.safe_dump(raw))
    calls = [(str(uuid.uuid4()), ("male", "female")[i % 2], i % 3 % 2) for i in range(30)]
    requests = [cloudevent("loans-v1", pid, False, orjson.dumps({"instances": [{"sex": sex}]}), T0 - 600,
                           key=uuid.uuid4().bytes) for pid, sex, _ in calls]  # fmt: skip
    responses = [cloudevent("loans-v1", pid, True, orjson.dumps({"predictions": [y]}), T0 - 600,
                            key=uuid.uuid4().bytes) for pid, _, y in calls]  # fmt: skip
    first = Daemon(load_config(path), clock=lambda: T0)
    first.start()
    try:
        send(kafka_broker.bootstrap_servers, topic, requests[:20] + responses[20:])  # half of each call before
        wait_for(lambda: sample(scrape(first.port), "fairness_exporter_events_consumed_total") == 30, what="30 read")
    finally:
        first.stop()  # its final checkpoint holds the 30 halves waiting, and the offsets past them
    second = Daemon(load_config(path), clock=lambda: T0)
    daemons.append(second)
    second.start()
    send(kafka_broker.bootstrap_servers, topic, requests[20:] + responses[:20])
    wait_for(lambda: sample(scrape(second.port), "fairness_exporter_payload_pairs_joined_total") == 30,
             what="30 calls joined after the restart")  # fmt: skip
    second.computer.compute()
    page = scrape(second.port)
    for sex in GENDERS:
        for y in (0, 1):
            expected = sum(1 for _, s, p in calls if s == sex and p == y)
            assert sample(page, "fairness_predictions_total", attribute="gender", model_id="loans-v1",
                          predicted=str(y), subgroup=sex) == expected  # fmt: skip
    assert sample(page, "fairness_exporter_events_consumed_total") == 30  # the second read only the new records


@pytest.mark.parametrize("ids", ["shared", "own"])
def test_a_call_logged_by_a_transformer_and_its_predictor_counts_once(
    kafka_broker: EmbeddedBroker, tmp_path: Path, daemons: list[Daemon], ids: str,
) -> None:  # fmt: skip
    """Both components of an InferenceService log each call (the KServe SDK's bodies, the CloudEvents SDK's Kafka
    binding), on random partitions. Under one ce-id their halves never meet across components and each call counts
    once; under an id each (KServe's own transformer does not forward ``Ce-Id``), ``events.component`` names the
    log counted, and the other's is ignored."""
    topic = f"kserve-{uuid.uuid4().hex[:8]}"
    kafka_broker.create_topic(topic, partitions=4)
    rng = random.Random(11)
    truth: Counter[tuple[str, str, int]] = Counter()
    calls = []
    for _ in range(30):
        n = rng.randint(1, 3)
        genders, region = [rng.choice(GENDERS) for _ in range(n)], rng.choice(REGIONS)
        predictions = [rng.randint(0, 1) for _ in range(n)]
        calls.append({"model": "credit-v2", "topic": topic, "id": str(uuid.uuid4()),
                      "components": ["transformer", "predictor"], "time": T0 - 60,
                      "component_ids": {"predictor": str(uuid.uuid4())} if ids == "own" else {},
                      "columns": {"gender": genders, "age": [rng.randint(18, 90) for _ in range(n)]},
                      "predictions": predictions, "metadata": {"X-Region": [region]}})  # fmt: skip
        for g, y in zip(genders, predictions, strict=True):
            truth[("gender", g, y)] += 1
            truth[("region", region, y)] += 1
    records = platform_records("kserve", calls, tmp_path)
    assert len(records) == 4 * len(calls)
    path = tmp_path / "daemon.yaml"
    raw = config(kafka_broker.bootstrap_servers, topic, f"labels-{topic}")
    if ids == "own":
        raw["models"][0]["events"]["component"] = "transformer"
    path.write_text(yaml.safe_dump(raw))
    kafka_broker.create_topic(f"labels-{topic}", partitions=1)
    daemon = Daemon(load_config(path), clock=lambda: T0)
    daemons.append(daemon)
    daemon.start()
    send_placed(kafka_broker.bootstrap_servers, records)
    wait_for(lambda: (sample(scrape(daemon.port), "fairness_exporter_events_consumed_total") or 0) == len(records),
             what="every record read")  # fmt: skip
    daemon.computer.compute()
    page = scrape(daemon.port)
    assert sample(page, "fairness_exporter_payload_pairs_joined_total") == len(calls)
    for (attribute, subgroup, y), n in truth.items():
        assert sample(page, "fairness_predictions_total", attribute=attribute, model_id="credit-v2", predicted=str(y),
                      subgroup=subgroup) == n, (attribute, subgroup, y)  # fmt: skip
    unmatched = {r: sample(page, "fairness_exporter_payload_halves_unmatched_total", reason=r)
                 for r in ("duplicate_delivery", "other_component")}  # fmt: skip
    ignored = sample(page, "fairness_exporter_events_ignored_total", reason="other_component")
    if ids == "shared":
        assert (unmatched, ignored) == ({"duplicate_delivery": 0, "other_component": 2 * len(calls)}, None)
    else:
        assert (unmatched, ignored) == ({"duplicate_delivery": 0, "other_component": 0}, 2 * len(calls))
