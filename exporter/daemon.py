"""The monitoring daemon: Kafka source -> decoder -> window store -> scheduled computation -> /metrics."""

from __future__ import annotations

import logging
import signal
import threading
import time
from collections.abc import Callable
from typing import Any

from apscheduler.schedulers.background import BackgroundScheduler
from kafka import KafkaProducer
from prometheus_client import CollectorRegistry

from exporter.collector import SnapshotCollector
from exporter.compute import Computer
from exporter.config import Config
from exporter.events import EventDecoder
from exporter.health import Health, RateLimitedLog
from exporter.http import HttpServer, make_app
from exporter.source import KafkaSource
from exporter.window import WindowStore

log = logging.getLogger(__name__)


class Daemon:
    """Wires the parts together; ``start``/``stop`` for tests, ``run_forever`` for the command line."""

    def __init__(
        self, config: Config, registry: CollectorRegistry | None = None, clock: Callable[[], float] = time.time,
        manual_assignment: bool = False,
    ) -> None:  # fmt: skip
        self.config = config
        self.clock = clock
        self.registry = registry or CollectorRegistry()
        self.health = Health(self.registry)
        self.store = WindowStore(config)
        self.decoder = EventDecoder(config, keep_rejected=bool(config.kafka.dead_letter_topic))
        self.computer = Computer(config, self.store, self.health, clock)
        every = f"{config.evaluation_interval_seconds:g}s"
        self.registry.register(SnapshotCollector(lambda: self.computer.latest, every))
        self.rejections = RateLimitedLog(log)
        self.dead_letters: KafkaProducer | None = None
        self.source = KafkaSource(config.kafka, self.handle, self.health, manual_assignment=manual_assignment,
                                  safe_offsets=self.safe_offsets)  # fmt: skip
        self.scheduler = BackgroundScheduler(timezone="UTC")
        self.scheduler.add_job(self.computer.run_scheduled, "interval", seconds=config.evaluation_interval_seconds,
                               id="compute", max_instances=1, coalesce=True)  # fmt: skip
        self.http = HttpServer(make_app(self.registry, config.model_id, self.healthy, self.ready),
                               config.listen_address, config.listen_port,
                               config.tls_cert_file, config.tls_key_file)  # fmt: skip
        self._stopped = threading.Event()

    @property
    def port(self) -> int:
        return self.http.port

    def safe_offsets(self) -> dict[tuple[str, int], int]:
        """Offsets whose events are all counted in the store (what may be committed without a checkpoint)."""
        with self.store.lock:
            return dict(self.store.offsets)

    def handle(self, topic: str, partition: int, records: list[Any]) -> None:
        """Decode, validate and count one partition's batch (called on the consumer thread)."""
        now = self.clock()
        batch = self.decoder.decode([r.value for r in records], now)
        late = self.store.add(batch.timestamps, batch.codes, batch.predictions, batch.labels, now,
                              offsets={(topic, partition): records[-1].offset + 1})  # fmt: skip
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

    def _dead_letter(self, payloads: list[tuple[bytes, str]]) -> None:
        topic = self.config.kafka.dead_letter_topic
        if self.dead_letters is None:
            self.dead_letters = KafkaProducer(bootstrap_servers=self.config.kafka.bootstrap_servers.split(","),
                                              **self.config.kafka.client)  # fmt: skip
        for value, reason in payloads:
            self.dead_letters.send(topic, value=value or b"", headers=[("reason", reason.encode())])
        self.health.dead_lettered.inc(len(payloads))

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
        self.http.start()
        self.computer.compute()
        self.scheduler.start()
        self.source.start()
        log.info("fairness-exporter serving model %s on port %d, reading %s from %s", self.config.model_id,
                 self.port, self.config.kafka.topic, self.config.kafka.bootstrap_servers)  # fmt: skip

    def stop(self) -> None:
        if self._stopped.is_set():
            return
        self._stopped.set()
        self.source.stop()
        self.scheduler.shutdown(wait=True)
        if self.dead_letters is not None:
            self.dead_letters.close(timeout=5)
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
