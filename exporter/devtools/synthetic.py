"""Synthetic prediction traffic for the demo and the benchmarks: a hiring screener that drifts into bias."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from datetime import UTC, datetime

import numpy as np
import orjson

GENDERS = ("male", "female", "non_binary")
GENDER_P = (0.48, 0.47, 0.05)
AGES = ("18_29", "30_44", "45_plus")
AGE_P = (0.3, 0.45, 0.25)
BASE_RATE = 0.30


def selection_probability(gender: np.ndarray, drifted: bool) -> np.ndarray:
    """Fair before the drift (every group 0.30); after it, women are selected at 0.18 (impact ratio 0.6)."""
    return np.where((gender == "female") & drifted, 0.18, BASE_RATE)


def events(
    n: int, *, model_id: str = "hiring-screener-v2", drifted: bool = False, seed: int | None = None,
    clock: Callable[[], float] = time.time, label_fraction: float = 0.3,
) -> Iterator[dict]:  # fmt: skip
    """n events in the default format, timestamped now; a label on ``label_fraction`` of them."""
    rng = np.random.default_rng(seed)
    gender = rng.choice(GENDERS, size=n, p=GENDER_P)
    age = rng.choice(AGES, size=n, p=AGE_P)
    score = rng.random(n)
    prediction = score < selection_probability(gender, drifted)
    # labels agree with the prediction 80% of the time
    label = np.where(rng.random(n) < 0.8, prediction, ~prediction).astype(int)
    has_label = rng.random(n) < label_fraction
    stamp = datetime.fromtimestamp(clock(), UTC).isoformat().replace("+00:00", "Z")
    for i in range(n):
        yield {
            "model_id": model_id, "prediction_id": uuid.uuid4().hex, "timestamp": stamp,
            "prediction": int(prediction[i]), "score": round(float(1 - score[i]), 4),
            "label": int(label[i]) if has_label[i] else None,
            "attributes": {"gender": str(gender[i]), "age_group": str(age[i])},
        }  # fmt: skip


class TrafficGenerator:
    """Produces synthetic events to a topic at a steady rate; drifts into bias after ``drift_after`` seconds."""

    def __init__(self, bootstrap_servers: str, topic: str, rate: float = 200.0, drift_after: float = 180.0) -> None:
        from kafka import KafkaProducer

        self.producer = KafkaProducer(bootstrap_servers=bootstrap_servers, linger_ms=20)
        self.topic = topic
        self.rate = rate
        self.drift_after = drift_after
        self.produced = 0
        self._started: float | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="synthetic-traffic", daemon=True)

    @property
    def drifted(self) -> bool:
        return self._started is not None and time.monotonic() - self._started >= self.drift_after

    def start(self) -> None:
        self._started = time.monotonic()
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5)
        self.producer.close(timeout=5)

    def _run(self) -> None:
        tick = 0.1
        while not self._stop.wait(tick):
            for event in events(int(self.rate * tick), drifted=self.drifted):
                self.producer.send(self.topic, orjson.dumps(event))
                self.produced += 1


def cell_counts(
    rng: np.random.Generator, steps: int, batch: int, sizes: tuple[int, ...], events_per_step: float,
    rates: np.ndarray,
) -> np.ndarray:  # fmt: skip
    """Synthetic traffic as counts: shape (steps, batch, cells, 2) of (positives, negatives) per joint cell.

    A cell is one combination of a group of every attribute (``sizes`` groups each, equally likely), so the
    per-attribute counts of :func:`attribute_counts` come from the same events, exactly as events do.
    ``rates`` (steps, cells) or (cells,) is the selection probability of each cell at each step; the number of
    events of a cell in a step is Poisson.
    """
    cells = int(np.prod(sizes))
    n = rng.poisson(events_per_step / cells, (steps, batch, cells))
    p = np.asarray(rates, dtype=np.float64)
    k = rng.binomial(n, np.broadcast_to(p[:, None, :] if p.ndim == 2 else p, n.shape))
    return np.stack([k, n - k], axis=-1)


def attribute_counts(cells: np.ndarray, sizes: tuple[int, ...]) -> np.ndarray:
    """(…, cells, 2) joint-cell counts -> (…, rows, 6) window-store rows: every attribute's groups, then its
    (empty) unknown row, end to end (PRED_POS, PRED_NEG filled; no labels)."""
    joint = cells.reshape((*cells.shape[:-2], *sizes, 2))
    blocks = []
    for axis in range(len(sizes)):
        others = tuple(a + cells.ndim - 2 for a in range(len(sizes)) if a != axis)
        blocks.append(joint.sum(axis=others))
        blocks.append(np.zeros_like(blocks[-1][..., :1, :]))
    rows = np.concatenate(blocks, axis=-2)
    out = np.zeros((*rows.shape[:-1], 6), dtype=np.int64)
    out[..., :2] = rows
    return out


def cell_events(cells: np.ndarray, attributes: Mapping[str, Sequence[str]], start: float, step_seconds: float,
                seed: int = 0) -> dict[str, np.ndarray]:  # fmt: skip
    """The events behind (steps, cells, 2) counts of one stream, as columns in time order: `timestamp` (uniform
    inside its step), `prediction`, and one column per attribute holding its group names."""
    sizes = tuple(len(g) for g in attributes.values())
    steps, n_cells = cells.shape[0], cells.shape[1]
    per = cells.reshape(-1)  # (steps, cells, [pos, neg]) flattened
    step_of = np.repeat(np.repeat(np.arange(steps), n_cells * 2), per)
    cell_of = np.repeat(np.tile(np.repeat(np.arange(n_cells), 2), steps), per)
    prediction = np.repeat(np.tile([1, 0], steps * n_cells), per)
    rng = np.random.default_rng(seed)
    timestamp = start + (step_of + rng.random(len(step_of))) * step_seconds
    order = np.argsort(timestamp, kind="stable")
    codes = np.unravel_index(cell_of[order], sizes)
    columns = {"timestamp": timestamp[order], "prediction": prediction[order]}
    for (name, groups), code in zip(attributes.items(), codes, strict=True):
        columns[name] = np.asarray(groups, dtype=object)[code]
    return columns
