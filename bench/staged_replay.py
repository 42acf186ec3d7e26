"""The alerts benchmark's traffic replayed through N replicas of the staged path, step by step, against one
replica's detectors on the same events.

One stream at 2,000 events per group per hour: a fair day (one step: its events in one bucket), then the gap of
0.10, one bucket a minute, until the model's owner pages. The events go to random partitions of a 4-partition
topic read by N `fairness-exporter serve` replicas of one consumer group (bench/replicas.py). Time is the
events' (as in tests/test_stages_scale_out.py): they lie days ahead of the wall clock, so a detector step happens
only when this process sends a *tick* (one event in the next bucket) after the owner counted the bucket's events;
each step therefore consumes the same counts as the reference, the daemon's DetectorBank advanced in this
process over the same steps (one replica that read everything). After every step the owner's /metrics must show
every detector's statistic and alarm equal to the reference's.
"""

from __future__ import annotations

import contextlib
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import orjson
from kafka import KafkaProducer

from bench.replicas import STARTUP_TIMEOUT, Page, Replicas, owned, wait_until
from exporter.config import parse_config
from exporter.devtools.embedded_broker import EmbeddedBroker
from exporter.devtools.synthetic import attribute_counts, cell_events
from exporter.stream.state.detectors import ALERT_OF_METRIC, Detector, DetectorBank
from exporter.stream.state.window import RowLayout

MODEL = "bench"
PARTITIONS = 4
STEP_TIMEOUT = 60.0
NAMES = ("fairness_detector_", "fairness_subgroup_detector_", "fairness_predictions_total",
         "fairness_exporter_model_owned")  # fmt: skip


@dataclass(frozen=True)
class Replayed:
    replicas: int
    steps: int
    """Detector steps the owner took (the reference took as many)."""
    equal: int
    """Of them, those after which every detector's statistic and alarm on the owner's /metrics equalled the
    reference's."""
    minutes: float
    """Minutes from the change to the owner's first page of the alert (inf: none within the steps replayed)."""
    reference_minutes: float


def _labels(detector: Detector) -> tuple[str, frozenset[tuple[str, str]]]:
    """The family and labels of a detector's statistic on /metrics (its alarm: the same, `_alarm` for
    `_statistic`)."""
    if detector.subgroup:
        return "fairness_subgroup_detector_statistic", frozenset({
            ("model_id", MODEL), ("attribute", detector.attribute), ("subgroup", detector.subgroup),
            ("direction", detector.direction)})  # fmt: skip
    return "fairness_detector_statistic", frozenset({
        ("model_id", MODEL), ("attribute", detector.attribute), ("dimension", detector.dimension),
        ("group_a", detector.group_a), ("group_b", detector.group_b), ("metric", detector.metric),
        ("direction", detector.direction)})  # fmt: skip


class _Owner:
    """The replicas, read for the one that owns the model."""

    def __init__(self, replicas: Replicas, bank: DetectorBank, attribute: str) -> None:
        self.replicas, self.bank, self.attribute = replicas, bank, attribute
        self.page: Page = {}

    def read(self) -> bool:
        """Whether exactly one replica owns the model (its page then in ``page``)."""
        pages = [p for p in self.replicas.pages(NAMES) if MODEL in owned(p)]
        if len(pages) == 1:
            self.page = pages[0]
        return len(pages) == 1

    def steps(self) -> float:
        return self.page.get(("fairness_detector_steps_total", frozenset({("model_id", MODEL)})), -1.0)

    def counted(self) -> int:
        return int(sum(v for (name, labels), v in self.page.items() if name == "fairness_predictions_total"
                       and ("attribute", self.attribute) in labels))  # fmt: skip

    def state(self) -> tuple[np.ndarray, np.ndarray]:
        """Every detector's statistic and alarm, in the bank's order."""
        keys = [_labels(d) for d in self.bank.detectors]
        return (np.array([self.page[key] for key in keys]),
                np.array([self.page[(name.replace("_statistic", "_alarm"), labels)] == 1 for name, labels in keys]))


def _wait(owner: _Owner, check: Callable[[], bool], what: str, timeout: float = STEP_TIMEOUT) -> None:
    wait_until(lambda: owner.read() and check(), timeout, what)


def replay(broker: EmbeddedBroker, n_replicas: int, raw: dict[str, Any], history: np.ndarray, changed: np.ndarray,
           alert: str, seed: int) -> Replayed:  # fmt: skip
    """``raw``: the bench's config (one model, MODEL); ``history`` (cells, 2): the fair day's counts, one step;
    ``changed`` (steps, cells, 2): the counts of each minute after the change, replayed until the owner pages
    ``alert`` (or they run out)."""
    cfg = parse_config(raw)
    model = cfg.model()
    layout = RowLayout.of(model)
    bank = DetectorBank(model, cfg.windowing, layout.offsets, layout.n_rows)
    attributes = {a.name: a.groups for a in model.attributes}
    sizes = tuple(len(g) for g in attributes.values())
    paging = np.array([ALERT_OF_METRIC[d.metric].name == alert for d in bank.detectors])
    rng = np.random.default_rng(seed)
    topic = f"replay-{uuid.uuid4().hex[:8]}"
    broker.create_topic(topic, partitions=PARTITIONS)
    t0 = (time.time() // 86400 + 2) * 86400  # two days ahead: the wall clock never moves the head
    tick = np.zeros_like(history)
    tick[0, 1] = 1  # one negative prediction of the first cell
    served = {**raw, "max_future_skew": "30d", "evaluation_interval": "1s"}
    producer = KafkaProducer(bootstrap_servers=[broker.bootstrap_servers], linger_ms=5)
    sent = 0

    def send(cells: np.ndarray, bucket: int) -> None:
        nonlocal sent
        columns = cell_events(cells[None], attributes, t0 + 60.0 * bucket, 60.0, seed=bucket)
        for i in range(len(columns["timestamp"])):
            event = {"model_id": MODEL, "prediction_id": f"p{sent + i}", "timestamp": float(columns["timestamp"][i]),
                     "prediction": int(columns["prediction"][i]), "label": None,
                     "attributes": {name: str(columns[name][i]) for name in attributes}}  # fmt: skip
            producer.send(topic, orjson.dumps(event), partition=int(rng.integers(PARTITIONS)))
        producer.flush(STEP_TIMEOUT)
        sent += len(columns["timestamp"])

    state = bank.initial_state()
    equal = steps = 0
    minutes = reference = float("inf")
    # A step is a bucket the events have left (exporter/stream/state/detection.py). i = 0: the owner computes, no
    # step; i = 1: the first tick opens bucket 0, no step; then round i's events (the fair day, then each minute
    # after the change) go into bucket i - 2 and the tick into bucket i - 1 after them, which takes step i - 1:
    # the tick before and the round.
    with contextlib.closing(producer), Replicas(n_replicas, served, broker.bootstrap_servers, topic,
                                                f"bench-{topic}", "staged") as replicas:  # fmt: skip
        owner = _Owner(replicas, bank, model.attributes[0].name)
        for i, cells in enumerate([None, None, history, *changed]):
            if i == 1:
                send(tick, 0)
                continue
            if cells is not None:
                send(cells, i - 2)
                _wait(owner, lambda: owner.counted() == sent, f"round {i - 2} counted")
                send(tick, i - 1)
            _wait(owner, lambda: owner.steps() == max(i - 1, 0), f"step {i - 1}",  # noqa: B023
                  STARTUP_TIMEOUT if i == 0 else STEP_TIMEOUT)
            if cells is None:
                continue
            step = tick + cells
            state, _ = bank.advance(state, attribute_counts(step, sizes)[None])
            statistic, active = owner.state()
            steps += 1
            equal += bool(np.array_equal(statistic, state.statistic) and np.array_equal(active, state.active))
            minute = i - 2  # round 0 is the fair day, round 1 the change's first minute
            if minute >= 1 and minutes == float("inf") and active[paging].any():
                minutes = float(minute)
            if minute >= 1 and reference == float("inf") and state.active[paging].any():
                reference = float(minute)
            if minutes < float("inf") and reference < float("inf"):
                break
    return Replayed(n_replicas, steps, equal, minutes, reference)
