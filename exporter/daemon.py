"""The monitoring daemon: Kafka source -> decoder -> window store (+ label join) -> scheduled computation ->
/metrics, with checkpoints that let it restart without losing or double counting an event."""

from __future__ import annotations

import logging
import signal
import threading
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

import numpy as np
import orjson
from apscheduler.schedulers.background import BackgroundScheduler
from prometheus_client import CollectorRegistry

from exporter.config import Config
from exporter.serve.collector import CachedExposition
from exporter.serve.http import HttpServer, make_app
from exporter.serve.self_metrics import Health, RateLimitedLog
from exporter.serve.snapshot import Computer
from exporter.stream import checkpoint
from exporter.stream.dead_letters import DeadLetters
from exporter.stream.decode import EventDecoder
from exporter.stream.label_join import Joined, LabelJoin
from exporter.stream.source import KafkaSource, Offsets
from exporter.stream.window import WindowStore

log = logging.getLogger(__name__)
EXPIRY_EVERY_SECONDS = 10.0


class Daemon:
    """Wires the parts together; ``start``/``stop`` for tests, ``run_forever`` for the command line."""

    def __init__(
        self, config: Config, registry: CollectorRegistry | None = None, clock: Callable[[], float] = time.time
    ) -> None:
        self.config = config
        self.clock = clock
        self.registry = registry or CollectorRegistry()
        self.health = Health(self.registry)
        self.store = WindowStore(config)
        self.decoder = EventDecoder(config, keep_rejected=bool(config.kafka.dead_letter_topic))
        self.labels = LabelJoin(len(config.attributes), config.label_horizon_seconds, config.max_pending_labels)
        self.state_lock = threading.RLock()  # everything a checkpoint covers changes under this lock
        self._last_expiry = 0.0
        self.exposition = CachedExposition(f"{config.evaluation_interval_seconds:g}s")
        self.computer = Computer(config, self.store, self.health, clock, on_snapshot=self.exposition.update)
        self.rejections = RateLimitedLog(log)
        self.dead_letters: DeadLetters | None = None
        self.checkpoint_file = (checkpoint.checkpoint_path(config.checkpoint_path, config.model_id)
                                if config.checkpoint_path else None)  # fmt: skip
        resume = self._restore() if self.checkpoint_file else {}
        if config.kafka.client_library == "confluent-kafka":
            from exporter.stream.source_confluent import ConfluentSource as source_class
        else:
            source_class = KafkaSource
        self.source = source_class(
            config.kafka, self.handle, self.health, resume_offsets=resume,
            manual_assignment=config.kafka.assignment == "manual",
            commit_interval=None if self.checkpoint_file else 5.0, safe_offsets=self.safe_offsets,
            flush=self.write_checkpoint if self.checkpoint_file else None, forget=self.forget_partitions,
        )  # fmt: skip
        self.scheduler = BackgroundScheduler(timezone="UTC")
        self.scheduler.add_job(self.computer.run_scheduled, "interval", seconds=config.evaluation_interval_seconds,
                               id="compute", max_instances=1, coalesce=True)  # fmt: skip
        if self.checkpoint_file:
            self.scheduler.add_job(self._scheduled_checkpoint, "interval", seconds=config.checkpoint_interval_seconds,
                                   id="checkpoint", max_instances=1, coalesce=True)  # fmt: skip
        self.http = HttpServer(make_app(self.registry, self.exposition, config.model_id, self.healthy, self.ready),
                               config.listen_address, config.listen_port,
                               config.tls_cert_file, config.tls_key_file)  # fmt: skip
        self._stopped = threading.Event()

    @property
    def port(self) -> int:
        return self.http.port

    def metrics_page(self) -> str:
        """What /metrics serves, as text."""
        return self.exposition.page(self.registry, "")[0].decode()

    # --- ingest (consumer thread) ---------------------------------------------------------------------------

    def safe_offsets(self) -> Offsets:
        """Offsets whose events are all counted in the store (what may be committed without a checkpoint)."""
        with self.state_lock:
            return dict(self.store.offsets)

    def forget_partitions(self, partitions: list[tuple[str, int]]) -> None:
        """Partitions handed to another replica: their offsets leave what this replica commits and checkpoints."""
        with self.state_lock:
            for key in partitions:
                self.store.offsets.pop(key, None)

    def handle(self, topic: str, partition: int, records: list[Any]) -> None:
        """Decode, validate and count one partition's batch."""
        now = self.clock()
        expired: Counter[str] = Counter()
        with self.state_lock:
            if topic == self.config.kafka.topic:
                self._handle_predictions(topic, partition, records, now, expired)
            else:
                self._handle_labels(topic, partition, records, now, expired)
            if now - self._last_expiry >= EXPIRY_EVERY_SECONDS:
                self.labels.expire(now, expired)
                self._last_expiry = now
            self.health.pending_labels.set(len(self.labels.pending))
        for reason, n in expired.items():
            self.health.labels_expired.labels(reason).inc(n)

    def _handle_predictions(self, topic: str, partition: int, records: list[Any], now: float,
                            expired: Counter[str]) -> None:  # fmt: skip
        batch = self.decoder.decode([r.value for r in records], now)
        late = self.store.add(batch.timestamps, batch.codes, batch.predictions, batch.labels, now,
                              offsets={(topic, partition): records[-1].offset + 1})  # fmt: skip
        if self.config.kafka.labels_topic:
            waiting = batch.labels < 0
            codes = np.column_stack([batch.codes[a.name] for a in self.config.attributes])
            ids = [pid for pid, w in zip(batch.prediction_ids, waiting, strict=True) if w]
            self._count_joined(self.labels.add_predictions(
                ids, batch.timestamps[waiting], batch.predictions[waiting], codes[waiting], expired), expired)
        for reason, n in batch.rejected.items():
            self.health.rejected.labels(reason).inc(n)
        self.rejections.reasons(batch.rejected.items(), f"{topic}[{partition}]")
        if late:
            self.health.late.inc(late)
            self.rejections.warning("late", "dropped %d late event(s) from %s[%d]", late, topic, partition)
        if batch.ignored:
            self.health.ignored.inc(batch.ignored)
        if batch.rejected_payloads:
            self._dead_letter(batch.rejected_payloads)

    def _handle_labels(self, topic: str, partition: int, records: list[Any], now: float,
                       expired: Counter[str]) -> None:  # fmt: skip
        fields = self.config.events
        ids, labels = [], []
        for record in records:
            try:
                message = orjson.loads(record.value)
            except (orjson.JSONDecodeError, TypeError):
                message = None
            pid = message.get(fields.prediction_id) if isinstance(message, dict) else None
            label = message.get(fields.label) if isinstance(message, dict) else None
            if pid is None or isinstance(label, str) or label not in (0, 1):
                expired["invalid_label_event"] += 1
                continue
            ids.append(pid)
            labels.append(int(label))
        self._count_joined(self.labels.add_labels(ids, labels, now, expired), expired)
        self.store.offsets[(topic, partition)] = records[-1].offset + 1

    def _count_joined(self, joined: Joined, expired: Counter[str]) -> None:
        if not len(joined):
            return
        codes = {a.name: joined.codes[:, i] for i, a in enumerate(self.config.attributes)}
        outside = self.store.add_labels(joined.timestamps, codes, joined.outcomes)
        self.health.labels_joined.inc(len(joined) - outside)
        expired["prediction_outside_window"] += outside

    def _dead_letter(self, payloads: list[tuple[bytes, str]]) -> None:
        if self.dead_letters is None:
            self.dead_letters = DeadLetters(self.config.kafka)
        for value, reason in payloads:
            self.dead_letters.send(value, reason)
        self.health.dead_lettered.inc(len(payloads))

    # --- checkpoints ----------------------------------------------------------------------------------------

    def _restore(self) -> Offsets:
        assert self.checkpoint_file is not None
        loaded = checkpoint.read(self.checkpoint_file, self.config.layout())
        if loaded is None:
            log.info("no checkpoint at %s: starting with an empty window", self.checkpoint_file)
            return {}
        meta, arrays = loaded
        offsets = {(t, int(p)): int(o) for t, p, o in meta["offsets"]}
        self.store.restore(arrays, offsets)
        self.labels.restore(arrays)
        log.info("restored checkpoint %s written at %s: %d partitions, %d pending predictions",
                 self.checkpoint_file, meta["written_at"], len(offsets), len(self.labels.pending))  # fmt: skip
        return offsets

    def write_checkpoint(self) -> Offsets:
        """Write a durable checkpoint of the counts, pending labels and offsets; then ask Kafka to commit them."""
        assert self.checkpoint_file is not None
        with self.state_lock:
            arrays = {**self.store.state(), **self.labels.state()}
            offsets = dict(self.store.offsets)
        written_at = self.clock()
        checkpoint.write(self.checkpoint_file, {"layout": self.config.layout(), "written_at": written_at,
                                                "offsets": [[t, p, o] for (t, p), o in offsets.items()]},
                         arrays)  # fmt: skip
        self.health.last_checkpoint.set(written_at)
        self.source.request_commit(offsets)
        return offsets

    def _scheduled_checkpoint(self) -> None:
        try:
            self.write_checkpoint()
        except Exception:
            log.exception("checkpoint failed; offsets stay uncommitted until one succeeds")

    # --- lifecycle ------------------------------------------------------------------------------------------

    def healthy(self) -> tuple[bool, str]:
        """Live while the consumer thread and the scheduler run."""
        if not self.source.alive:
            return False, "the Kafka consumer thread has stopped"
        if not self.scheduler.running:
            return False, "the computation scheduler is not running"
        return True, "consumer and scheduler running"

    def ready(self) -> tuple[bool, str]:
        """Ready once partitions are assigned and a computation has published a snapshot."""
        if not self.source.assigned.is_set():
            return False, "waiting for Kafka partitions"
        if self.computer.latest is None:
            return False, "waiting for the first computation"
        return True, "serving computed metrics"

    def start(self) -> None:
        if not self.checkpoint_file:
            log.info("no checkpoint configured: the window starts empty after every restart")
        self.http.start()
        self.computer.compute()
        self.scheduler.start()
        self.source.start()
        log.info("fairness-exporter serving model %s on port %d, reading %s from %s", self.config.model_id,
                 self.port, self.config.kafka.topic, self.config.kafka.bootstrap_servers)  # fmt: skip

    def stop(self) -> None:
        """Stop consuming, write a final checkpoint (from the consumer thread), commit, stop serving."""
        if self._stopped.is_set():
            return
        self._stopped.set()
        if self.scheduler.running:
            self.scheduler.shutdown(wait=True)
        if self.source.alive:
            self.source.stop()
        if self.dead_letters is not None:
            self.dead_letters.close()
        self.http.stop()

    def run_forever(self) -> None:
        """Run until SIGTERM or SIGINT, then stop cleanly."""
        done = threading.Event()
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: done.set())
        self.start()
        done.wait()
        log.info("stopping")
        self.stop()

