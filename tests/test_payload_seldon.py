"""Seldon Core v2 on the real broker: a model's ``.inputs`` / ``.outputs`` topics of protobuf ModelInferRequest /
ModelInferResponse, keyed by the request id with the ``x-request-id`` header, give exact counts on /metrics (scores
thresholded, an attribute from a carried header, raw and typed contents, a duplicate, a request never answered)."""

from __future__ import annotations

import random
import uuid
from collections import Counter
from pathlib import Path

import numpy as np
import yaml
from daemon_fixture import FAST_RECONNECT, sample, scrape, wait_for
from payload_logs import Record, seldon_request, seldon_response, send

from exporter.config import load_config
from exporter.daemon import Daemon
from exporter.devtools.embedded_broker import EmbeddedBroker


def test_a_seldon_models_inputs_and_outputs_topics_count_exactly(
    kafka_broker: EmbeddedBroker, tmp_path: Path, daemons: list[Daemon], client_library: str,
) -> None:  # fmt: skip
    namespace = f"ns{uuid.uuid4().hex[:6]}"
    inputs, outputs = f"seldon.{namespace}.model.income.inputs", f"seldon.{namespace}.model.income.outputs"
    kafka_broker.create_topic(inputs, partitions=2)
    kafka_broker.create_topic(outputs, partitions=2)
    rng = random.Random(3)
    truth: Counter[tuple[str, str, int]] = Counter()
    requests: list[Record] = []
    responses: list[Record] = []
    for call in range(50):
        pid = str(uuid.uuid4())
        n = rng.randint(1, 3)
        genders = [rng.choice(["male", "female"]) for _ in range(n)]
        region = rng.choice(["north", "south"])
        scores = [round(rng.random(), 3) for _ in range(n)]
        headers = [("x-request-id", pid.encode()), ("x-region", region.encode())]
        body = seldon_request(pid, {"gender": genders, "age": [rng.randint(18, 90) for _ in range(n)]},
                              raw=call % 2 == 0)  # fmt: skip
        requests.append((body, headers, pid.encode()))
        responses.append((seldon_response("income", pid, "proba", scores), headers, pid.encode()))
        for g, s in zip(genders, scores, strict=True):
            y = int(float(np.float32(s)) >= 0.5)  # FP32 on the wire, thresholded as the daemon reads it
            truth[("gender", g, y)] += 1
            truth[("region", region, y)] += 1
    requests.append(requests[4])  # delivered twice
    unanswered = str(uuid.uuid4())
    requests.append((seldon_request(unanswered, {"gender": ["male"], "age": [40]}),
                     [("x-request-id", unanswered.encode())], unanswered.encode()))  # fmt: skip
    path = tmp_path / "daemon.yaml"
    path.write_text(yaml.safe_dump({
        "kafka": {"bootstrap_servers": kafka_broker.bootstrap_servers, "topic": inputs, "assignment": "manual",
                  "client_library": client_library, "client": FAST_RECONNECT[client_library]},
        "events": {"format": "seldon", "prediction": "proba", "score_threshold": 0.5},
        "windows": ["1h"], "bucket": "1m", "evaluation_interval": "1s", "min_samples": 5,
        "listen": {"address": "127.0.0.1", "port": 0},
        "models": [{"model_id": "income", "protected_attributes": [
            {"name": "gender", "groups": ["male", "female"]},
            {"name": "region", "column": "x-region", "groups": ["north", "south"]}]}],
    }))  # fmt: skip
    config = load_config(path)
    assert config.kafka.response_topic == outputs
    daemon = Daemon(config)  # the wall clock: Seldon's events are timed by their Kafka timestamps
    daemons.append(daemon)
    daemon.start()
    send(kafka_broker.bootstrap_servers, outputs, responses[:20])  # some responses read before their requests
    send(kafka_broker.bootstrap_servers, inputs, requests)
    send(kafka_broker.bootstrap_servers, outputs, responses[20:])
    wait_for(lambda: sample(scrape(daemon.port), "fairness_exporter_payload_pairs_joined_total") == 50
             and sample(scrape(daemon.port), "fairness_exporter_events_consumed_total") == 102,
             what="50 calls joined")  # fmt: skip
    daemon.computer.compute()
    page = scrape(daemon.port)
    for (attribute, subgroup, y), n in truth.items():
        assert sample(page, "fairness_predictions_total", attribute=attribute, model_id="income", predicted=str(y),
                      subgroup=subgroup) == n, (attribute, subgroup, y)  # fmt: skip
    assert sample(page, "fairness_exporter_payload_halves_unmatched_total", reason="duplicate_delivery") == 1
