"""A fleet on the real broker: a reload that adds one model, changes another and removes a third, read through real
scrapes of /metrics; the untouched model's counts and detector statistics stay exact, and an invalid reload
changes nothing."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest
import yaml
from broker_fixture import produce
from daemon_fixture import scrape, wait_for

from exporter.config import load_config
from exporter.daemon import Daemon
from exporter.devtools.embedded_broker import EmbeddedBroker

T0 = 1_800_000_000.0  # the daemon's clock stands still here: no detector step falls between two scrapes
GENDER = {"name": "gender", "groups": ["male", "female"]}
REGION = {"name": "region", "groups": ["north", "south"]}


def fleet(bootstrap: str, topic: str, models: list[dict[str, Any]]) -> dict[str, Any]:
    return {"kafka": {"bootstrap_servers": bootstrap, "topic": topic, "assignment": "manual",
                      "client": {"reconnect_backoff_max_ms": 500}},
            "windows": ["1h", "24h"], "bucket": "1m", "evaluation_interval": "1s", "min_samples": 5,
            "listen": {"address": "127.0.0.1", "port": 0}, "models": models}  # fmt: skip


def events(model_id: str, n: int, minute: int) -> list[bytes]:
    return [orjson.dumps({"model_id": model_id, "prediction_id": f"{model_id}-{minute}-{i}",
                          "timestamp": T0 - 3600 + 60 * minute + i % 50, "prediction": int(i % 3 == 0 or
                          (i % 2 == 0 and i % 4 == 0)), "attributes": {"gender": ("male", "female")[i % 2],
                                                                    "region": ("north", "south")[i % 3 % 2]}})
            for i in range(n)]  # fmt: skip


def of_model(samples: dict[tuple[str, frozenset], float], model_id: str) -> dict[tuple[str, frozenset], float]:
    return {k: v for k, v in samples.items() if ("model_id", model_id) in k[1]}


@pytest.fixture
def running(tmp_path: Path) -> Iterator[list[Daemon]]:
    daemons: list[Daemon] = []
    yield daemons
    for daemon in daemons:
        daemon.stop()


def _replace(path: Path, text: str) -> None:
    """Write ``text`` to a neighbour and rename it over ``path``: the file changes in one step."""
    part = path.with_suffix(".part")
    part.write_text(text)
    os.replace(part, path)


def test_a_reload_keeps_the_untouched_model_exact_and_an_invalid_one_changes_nothing(
    kafka_broker: EmbeddedBroker, topic: str, tmp_path: Path, running: list[Daemon],
) -> None:  # fmt: skip
    path = tmp_path / "fleet.yaml"
    kept = {"model_id": "kept", "protected_attributes": [GENDER]}
    changed = {"model_id": "changed", "protected_attributes": [GENDER, REGION]}
    removed = {"model_id": "removed", "protected_attributes": [REGION]}
    path.write_text(yaml.safe_dump(fleet(kafka_broker.bootstrap_servers, topic, [kept, changed, removed])))
    daemon = Daemon(load_config(path), clock=lambda: T0, loader=lambda: load_config(path))
    daemon.watch_seconds = 0.5  # the config file is checked this often (5 s by default)
    running.append(daemon)
    daemon.start()
    produce(kafka_broker.bootstrap_servers, topic,
            [v for minute in range(3) for m in ("kept", "changed", "removed") for v in events(m, 60, minute)])
    wait_for(lambda: scrape(daemon.port).get(("fairness_exporter_events_consumed_total", frozenset())) == 540,
             what="540 events consumed")  # fmt: skip
    daemon.computer.compute()
    before = scrape(daemon.port)
    assert of_model(before, "removed") and of_model(before, "kept")
    kept_before = of_model(before, "kept")
    assert kept_before[("fairness_detector_steps_total", frozenset({("model_id", "kept")}))] >= 1

    changed_again = {**changed, "metrics": [{"name": "demographic_parity_difference", "threshold": 0.2}]}
    added = {"model_id": "added", "protected_attributes": [REGION]}
    # replaced whole, as Kubernetes swaps a ConfigMap's file (a file written in place and caught half written is
    # reloaded once whole, without a refusal: tests/test_config_watch.py)
    _replace(path, yaml.safe_dump(fleet(kafka_broker.bootstrap_servers, topic, [kept, changed_again, added])))
    wait_for(lambda: of_model(scrape(daemon.port), "added") != {}, what="the reload to add a model")
    after = scrape(daemon.port)
    assert of_model(after, "kept") == kept_before  # counts, values, intervals, evidence, detector statistics
    assert not of_model(after, "removed")  # gone at the next publication
    threshold = ("fairness_threshold", frozenset({("model_id", "changed"), ("metric", "demographic_parity_difference"),
                                                  ("severity", "blocking")}))  # fmt: skip
    assert after[threshold] == 0.2
    samples = ("model_subgroup_samples", frozenset({("model_id", "changed"), ("attribute", "gender"),
                                                    ("window", "24h"), ("subgroup", "overall")}))  # fmt: skip
    assert after[samples] == before[samples] == 180  # a new threshold keeps the counts
    assert after[("fairness_exporter_models", frozenset())] == 3

    _replace(path, "models: [{model_id: broken}]\nkafka: {topic: 7}\n")  # invalid twice over
    wait_for(lambda: scrape(daemon.port).get(("fairness_exporter_config_reload_failures_total", frozenset())) == 1,
             what="the invalid reload to be refused")  # fmt: skip
    refused = scrape(daemon.port)
    assert refused[("fairness_exporter_config_last_reload_successful", frozenset())] == 0
    for model_id in ("kept", "changed", "added"):
        assert of_model(refused, model_id) == of_model(after, model_id)
    time.sleep(1.5)  # a refused file is not retried until it changes again
    assert scrape(daemon.port)[("fairness_exporter_config_reload_failures_total", frozenset())] == 1
