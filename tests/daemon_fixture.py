"""pytest plugin: a daemon on the real broker for each client library, and helpers to read what it serves.

Fixtures: `client_library` (each test runs once per consumer library), `running` (start daemons, stopped at the
end of the test).
"""

from __future__ import annotations

import importlib.util
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import orjson
import pandas as pd
import pytest
from daemon_config import make_config
from prometheus_client.parser import text_string_to_metric_families
from tooling import missing

from exporter.daemon import Daemon

GROUPS = {"gender": ["male", "female"], "age": ["young", "old"]}
# Reconnect quickly after a broker restart, in each library's own names (kafka.client goes to the library as it is).
FAST_RECONNECT = {"kafka-python": {"reconnect_backoff_max_ms": 500},
                  "confluent-kafka": {"reconnect.backoff.ms": 200, "reconnect.backoff.max.ms": 500}}  # fmt: skip
# Subscribed daemons: Tansu holds a new member's JoinGroup for about half the session timeout: 6 s keeps a rebalance
# near 3 s.
GROUP_CLIENT = {"kafka-python": {"reconnect_backoff_max_ms": 500, "session_timeout_ms": 6000,
                                 "heartbeat_interval_ms": 1000},
                "confluent-kafka": {"reconnect.backoff.ms": 200, "reconnect.backoff.max.ms": 500,
                                    "session.timeout.ms": 6000, "heartbeat.interval.ms": 1000}}  # fmt: skip


def scrape(port: int) -> dict[tuple[str, frozenset], float]:
    """Every sample on /metrics, keyed by (name, labels)."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        text = response.read().decode()
    return {(s.name, frozenset(s.labels.items())): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}  # fmt: skip


def sample(samples: dict, name: str, **labels: str) -> float | None:
    return samples.get((name, frozenset(labels.items())))


def wait_for(
    predicate: Callable[[], bool], timeout: float = 60.0, what: str = "condition", log: Path | None = None
) -> None:
    """Poll `predicate` until it holds; on a timeout the failure carries the tail of `log` (a daemon's output)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.2)
    tail = "\n" + log.read_text(errors="replace")[-4000:] if log is not None and log.exists() else ""
    raise AssertionError(f"timed out after {timeout}s waiting for {what}{tail}")


def synthetic_rows(n: int, seed: int) -> pd.DataFrame:
    """Rows with different selection rates per group: male 0.5, female 0.3."""
    rng = np.random.default_rng(seed)
    gender = rng.choice(GROUPS["gender"], n)
    age = rng.choice(GROUPS["age"], n)
    prediction = (rng.random(n) < np.where(gender == "male", 0.5, 0.3)).astype(int)
    label = np.where(rng.random(n) < 0.5, -1, rng.integers(0, 2, n))
    return pd.DataFrame({"gender": gender, "age": age, "prediction": prediction, "label": label})


def payloads(rows: pd.DataFrame, ts: float) -> list[bytes]:
    return [orjson.dumps({"model_id": "m1", "prediction_id": f"p{i}", "timestamp": ts, "prediction": int(r.prediction),
                          "label": None if r.label < 0 else int(r.label),
                          "attributes": {"gender": r.gender, "age": r.age}})
            for i, r in enumerate(rows.itertuples())]  # fmt: skip


@pytest.fixture(params=["kafka-python", "confluent-kafka"])
def client_library(request: pytest.FixtureRequest) -> str:
    """kafka.client_library: each test runs once per consumer implementation."""
    if request.param == "confluent-kafka" and importlib.util.find_spec("confluent_kafka") is None:
        missing("confluent-kafka is not installed (pip install 'fairness-exporter[confluent]')")
    return str(request.param)


def kafka_config(bootstrap: str, topic: str, client_library: str, **overrides: object) -> dict:
    return {"kafka": {"bootstrap_servers": bootstrap, "topic": topic, "assignment": "manual",
                      "group_id": f"g-{topic}", "client_library": client_library,
                      "client": FAST_RECONNECT[client_library]},
            "evaluation_interval": "1s", "min_samples": 30, **overrides}  # fmt: skip


@pytest.fixture
def running(client_library: str) -> Iterator[Callable[..., Daemon]]:
    daemons: list[Daemon] = []

    def start(bootstrap: str, topic: str, **overrides: object) -> Daemon:
        daemon = Daemon(make_config(**kafka_config(bootstrap, topic, client_library, **overrides)))
        daemon.start()
        daemons.append(daemon)
        return daemon

    yield start
    for daemon in daemons:
        daemon.stop()


def consumed(port: int) -> float:
    return sample(scrape(port), "fairness_exporter_events_consumed_total") or 0.0


@pytest.fixture
def daemons() -> Iterator[list[Daemon]]:
    """Daemons a test builds itself and appends here: stopped after the test, whatever its outcome."""
    started: list[Daemon] = []
    yield started
    for daemon in started:
        daemon.stop()


@dataclass
class Replica:
    """A ``serve`` process started by a test: its port, process and log file."""

    port: int
    process: subprocess.Popen[bytes]
    log: Path

    def page(self) -> dict[tuple[str, frozenset], float]:
        """Its /metrics samples, or nothing while it does not answer."""
        try:
            return scrape(self.port)
        except OSError:
            return {}


def probe(port: int, path: str) -> tuple[int, str]:
    """A daemon's answer on one path: status and body; 0 and the error while nothing answers."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()
    except OSError as exc:
        return 0, str(exc)
