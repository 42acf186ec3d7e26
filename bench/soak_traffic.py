"""The soak's traffic: a steady producer of two models' predictions (with invalid events, unknown attribute values
and events of a model the daemon does not monitor), their delayed labels on their own topic (with duplicates,
labels of no prediction and invalid ones), bursts of malformed events, and the counts the daemon must end with.

What each event does to the daemon's window is decided when it is made and kept per sequence number (numpy
columns): its model, its subgroup code per attribute (-1: the attribute's unknown category), its prediction, and
whether it is valid and labelled inline. The expected counts are computed from the logs read back at the end (the
records the broker holds, with their multiplicity), so a record the producer retried twice is expected twice.
"""

from __future__ import annotations

import heapq
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime

import numpy as np
import orjson
from kafka import KafkaConsumer, KafkaProducer, TopicPartition

MODELS: dict[str, dict[str, list[str]]] = {
    "hiring-screener": {"gender": ["male", "female", "non_binary"], "age_group": ["under_30", "30_to_49", "50_plus"]},
    "credit-scorer": {"region": ["north", "south", "east", "west"]},
}
INTERSECTIONS = {"hiring-screener": [["gender", "age_group"]]}
UNLISTED = "unlisted-model"
"""Events of a model the daemon does not monitor: counted as ignored, nowhere else."""
MODEL_SHARES = (0.70, 0.27, 0.03)  # hiring, credit, unlisted
UNKNOWN_SHARE = 0.03  # an attribute value outside the groups, or the attribute missing
INVALID = {"invalid_prediction": 0.006, "missing_field": 0.006, "invalid_label": 0.006}
INLINE_LABEL_SHARE = 0.25
DELAYED_LABEL_SHARE = 0.9  # of the predictions without an inline label; the rest are never labelled
DUPLICATE_LABEL_SHARE = 0.02
LABEL_DELAY_SECONDS = (1.0, 20.0)
STRAY_LABEL_SHARE = 0.005  # per prediction: a label of no prediction, and as many invalid label events
MALFORMED = (b"{broken", b"\xff\xfe not utf-8", b"[1, 2, 3]", b"", b'"a string"', b"null")
TICK_SECONDS = 0.1
PRODUCER = {"enable_idempotence": False, "linger_ms": 5000, "batch_size": 1 << 20, "max_request_size": 4 << 20,
            "reconnect_backoff_max_ms": 1000}  # fmt: skip
"""Non-idempotent: kafka-python 3's idempotent producer does not survive a Tansu restart (test_embedded_broker.py).
Batches of 5 s: Tansu on S3 lists a partition's whole log on every fetch, and moto lists ~0.4 ms per object."""


@dataclass
class Columns:
    """What each prediction event (by sequence number) does to the window."""

    model: list[np.ndarray] = field(default_factory=list)  # 0, 1: MODELS' order; -1: UNLISTED
    codes: list[np.ndarray] = field(default_factory=list)  # (n, 2): a code per attribute slot, -1 unknown
    prediction: list[np.ndarray] = field(default_factory=list)
    valid: list[np.ndarray] = field(default_factory=list)
    inline: list[np.ndarray] = field(default_factory=list)

    def add(self, model: np.ndarray, codes: np.ndarray, prediction: np.ndarray, valid: np.ndarray,
            inline: np.ndarray) -> None:  # fmt: skip
        for name, value in zip(("model", "codes", "prediction", "valid", "inline"),
                               (model, codes, prediction, valid, inline), strict=True):  # fmt: skip
            getattr(self, name).append(value)

    def joined(self) -> dict[str, np.ndarray]:
        return {name: np.concatenate(getattr(self, name)) if getattr(self, name) else np.zeros(0)
                for name in ("model", "codes", "prediction", "valid", "inline")}  # fmt: skip


class Traffic:
    """Produces at ``rate`` events per second on its own thread until :meth:`stop`; ``burst(n)`` queues n
    malformed events. Sends survive a broker restart (the producer buffers and retries)."""

    def __init__(self, bootstrap: str, topic: str, labels_topic: str, rate: float, seed: int = 24) -> None:
        self.topic, self.labels_topic, self.rate = topic, labels_topic, rate
        self.rng = np.random.default_rng(seed)
        self.producer = KafkaProducer(bootstrap_servers=bootstrap, **PRODUCER)
        self.columns = Columns()
        self.sent = 0
        self.labels_sent = 0
        self.malformed_sent = 0
        self.failed: list[str] = []
        self._labels: list[tuple[float, int, bytes]] = []  # (due, tie-breaker, payload): a heap
        self._bursts: list[int] = []
        self._lock = threading.Lock()
        self._producing = threading.Event()
        self._thread = threading.Thread(target=self._run, name="soak-producer", daemon=True)

    def start(self) -> None:
        self._producing.set()
        self._thread.start()

    def burst(self, n: int) -> None:
        with self._lock:
            self._bursts.append(n)

    def stop(self) -> None:
        """Stop making predictions; send the labels still due, flush, close."""
        self._producing.clear()
        self._thread.join()
        self.producer.flush(timeout=120)
        self.producer.close(timeout=10)

    def _send(self, topic: str, payload: bytes) -> None:
        self.producer.send(topic, payload).add_errback(lambda exc: self.failed.append(f"{topic}: {exc!r}"))

    def _run(self) -> None:
        started = time.monotonic()
        while self._producing.is_set() or self._labels:
            now = time.monotonic()
            if self._producing.is_set():
                due = int((now - started) * self.rate) - self.sent
                if due > 0:
                    self._predictions(due, time.time())
                with self._lock:
                    bursts, self._bursts = self._bursts, []
                for n in bursts:
                    for i in range(n):
                        self._send(self.topic, MALFORMED[i % len(MALFORMED)])
                    self.malformed_sent += n
            while self._labels and (self._labels[0][0] <= now or not self._producing.is_set()):
                self._send(self.labels_topic, heapq.heappop(self._labels)[2])
                self.labels_sent += 1
            time.sleep(TICK_SECONDS)

    def _predictions(self, n: int, now: float) -> None:
        rng, first = self.rng, self.sent
        model = rng.choice([0, 1, -1], n, p=MODEL_SHARES)
        codes = np.stack([rng.integers(0, 3, n), rng.integers(0, 3, n)], axis=1)
        codes[model == 1, 0] = rng.integers(0, 4, int((model == 1).sum()))
        codes[model == 1, 1] = -1
        codes[(rng.random((n, 2)) < UNKNOWN_SHARE) & (codes >= 0)] = -1
        rate = np.where(codes[:, 0] == 1, 0.3, 0.45)  # the second group of each model is selected less often
        prediction = (rng.random(n) < rate).astype(np.int8)
        kind = rng.choice([*INVALID, "valid"], n, p=[*INVALID.values(), 1 - sum(INVALID.values())])
        inline = rng.random(n) < INLINE_LABEL_SHARE
        label = rng.integers(0, 2, n)
        delayed = ~inline & (rng.random(n) < DELAYED_LABEL_SHARE)
        delays = rng.uniform(*LABEL_DELAY_SECONDS, n)
        duplicate = rng.random(n) < DUPLICATE_LABEL_SHARE
        stray = rng.random(n) < STRAY_LABEL_SHARE
        stamp = datetime.fromtimestamp(now, UTC).isoformat(timespec="microseconds").replace("+00:00", "Z")
        due = time.monotonic()
        for i in range(n):
            seq = first + i
            self._send(self.topic, orjson.dumps(_event(seq, int(model[i]), codes[i], int(prediction[i]), str(kind[i]),
                                                       int(label[i]) if inline[i] else None, stamp)))  # fmt: skip
            if delayed[i]:
                label_event = orjson.dumps({"prediction_id": f"p{seq}", "label": int(label[i]), "timestamp": stamp})
                for copy in range(2 if duplicate[i] else 1):
                    heapq.heappush(self._labels, (due + delays[i] + copy, seq * 2 + copy, label_event))
            if stray[i]:
                self._send(self.labels_topic, orjson.dumps({"prediction_id": f"stray{seq}", "label": 1}))
                self._send(self.labels_topic, orjson.dumps({"prediction_id": f"p{seq}", "label": "maybe"}))
                self.labels_sent += 2
        self.columns.add(model.astype(np.int8), codes.astype(np.int8), prediction,
                         (kind == "valid") & (model >= 0), inline)  # fmt: skip
        self.sent += n


def _event(seq: int, model: int, codes: np.ndarray, prediction: int, kind: str, label: int | None,
           stamp: str) -> dict[str, object]:  # fmt: skip
    model_id = UNLISTED if model < 0 else list(MODELS)[model]
    groups = MODELS[list(MODELS)[max(model, 0)]]
    attributes = {name: (values[codes[j]] if codes[j] >= 0 else "unlisted_value")
                  for j, (name, values) in enumerate(groups.items())}  # fmt: skip
    for j, name in enumerate(groups):
        if codes[j] < 0 and seq % 2:
            del attributes[name]  # missing, rather than outside the groups: the same unknown category
    event: dict[str, object] = {"model_id": model_id, "prediction_id": f"p{seq}", "timestamp": stamp,
                                "prediction": prediction, "label": label, "attributes": attributes}  # fmt: skip
    if kind == "invalid_prediction":
        event["prediction"] = 2
    elif kind == "missing_field":
        del event["timestamp"]
    elif kind == "invalid_label":
        event["label"] = "yes"
    return event


def read_log(bootstrap: str, topic: str, idle_seconds: float = 30.0) -> Iterator[bytes | None]:
    """Every record's value in every partition of ``topic``, from offset 0 to the end: until each partition's
    position reaches the high watermark of its last fetch and nothing came for 3 s (Tansu's ListOffsets answers
    can be behind the log, so end_offsets() is not trusted), or nothing came for ``idle_seconds``."""
    consumer = KafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False, max_poll_records=20_000,
                             reconnect_backoff_max_ms=1000)  # fmt: skip
    try:
        tps = [TopicPartition(topic, p) for p in sorted(consumer.partitions_for_topic(topic) or ())]
        consumer.assign(tps)
        for tp in tps:
            consumer.seek(tp, 0)
        last = time.monotonic()
        while (idle := time.monotonic() - last) < idle_seconds:
            batches = consumer.poll(timeout_ms=500)
            for records in batches.values():
                last = time.monotonic()
                for record in records:
                    yield record.value
            ends = [consumer.highwater(tp) for tp in tps]
            if not batches and idle > 3 and all(end is not None and consumer.position(tp) >= end
                                                for tp, end in zip(tps, ends, strict=True)):  # fmt: skip
                return
    finally:
        consumer.close()


@dataclass
class Expected:
    """The counts the daemon must end with: per (model, attribute, subgroup) in the 24h window."""

    samples: dict[tuple[str, str, str], int]
    labelled: dict[tuple[str, str, str], int]
    positives: dict[tuple[str, str, str], int]
    unknown: dict[tuple[str, str], int]
    records: int  # prediction-topic records read back
    malformed: int
    duplicated: int  # sequence numbers the log holds more than once (a producer retry)
    missing: int  # sequence numbers produced but not in the log
    label_records: int


def expected(traffic: Traffic, bootstrap: str) -> Expected:
    """Read both logs back and count what the daemon must have counted."""
    cols = traffic.columns.joined()
    copies = np.zeros(len(cols["model"]), dtype=np.int64)
    records = malformed = 0
    for value in read_log(bootstrap, traffic.topic):
        records += 1
        pid = _prediction_id(value)
        if pid is None or not pid.startswith("p"):
            malformed += 1
        else:
            copies[int(pid[1:])] += 1
    labelled = cols["inline"].copy()
    label_records = 0
    for value in read_log(bootstrap, traffic.labels_topic):
        label_records += 1
        pid = _prediction_id(value)
        if pid is not None and pid.startswith("p") and orjson.loads(value or b"{}").get("label") in (0, 1):
            labelled[int(pid[1:])] = True
    counts: dict[str, dict] = {"samples": {}, "labelled": {}, "positives": {}, "unknown": {}}
    for m, (model_id, groups) in enumerate(MODELS.items()):
        mine = (cols["model"] == m) & cols["valid"] & (copies > 0)
        weight = copies[mine]
        codes = cols["codes"][mine]
        attributes = [(name, values, codes[:, j]) for j, (name, values) in enumerate(groups.items())]
        for a, b in INTERSECTIONS.get(model_id, []):
            (_, va, ca), (_, vb, cb) = (next(x for x in attributes if x[0] == n) for n in (a, b))
            names = [f"{x}:{y}" for x in va for y in vb]
            attributes.append((f"{a}_x_{b}", names, np.where((ca < 0) | (cb < 0), -1, ca * len(vb) + cb)))
        for name, values, code in attributes:
            for what, mask in (("samples", np.ones(len(code), bool)), ("labelled", labelled[mine]),
                               ("positives", cols["prediction"][mine] == 1)):  # fmt: skip
                per = np.bincount(code[mask & (code >= 0)], weights=weight[mask & (code >= 0)], minlength=len(values))
                for group, n in zip(values, per, strict=True):
                    counts[what][(model_id, name, group)] = int(n)
                counts[what][(model_id, name, "overall")] = int(weight[mask].sum())
            counts["unknown"][(model_id, name)] = int(weight[code < 0].sum())
    return Expected(counts["samples"], counts["labelled"], counts["positives"], counts["unknown"], records, malformed,
                    int((copies > 1).sum()), int((copies == 0).sum()), label_records)  # fmt: skip


def _prediction_id(value: bytes | None) -> str | None:
    try:
        event = orjson.loads(value or b"")
    except orjson.JSONDecodeError:
        return None
    pid = event.get("prediction_id") if isinstance(event, dict) else None
    return pid if isinstance(pid, str) else None
