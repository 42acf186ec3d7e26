"""The monitoring daemon: Kafka source -> decoder -> window store (+ label join) -> scheduled computation ->
/metrics, with checkpoints that let it restart without losing or double counting an event."""

from __future__ import annotations

import logging
import signal
import sys
import threading
import time
from collections.abc import Callable

from apscheduler.schedulers.background import BackgroundScheduler
from prometheus_client import CollectorRegistry

from exporter.config import Config
from exporter.serve.collector import CachedExposition
from exporter.serve.http import HttpServer, make_app
from exporter.serve.self_metrics import ConsumerCollector, Health
from exporter.serve.snapshot import Computer
from exporter.stream.checkpoint import Checkpointer
from exporter.stream.dead_letters import DeadLetters
from exporter.stream.ingest import Ingest
from exporter.stream.label_join import OutcomeJoin
from exporter.stream.source import KafkaSource
from exporter.stream.window import WindowStore

log = logging.getLogger(__name__)
GIL_SWITCH_SECONDS = 0.001
"""How long a thread may hold the GIL while another waits for it (Python's default: 0.005)."""
EXPIRY_EVERY_SECONDS = 10.0


class Daemon:
    """Wires the parts together and runs their lifecycle; ``start``/``stop`` for tests, ``run_forever`` for the
    command line. The constructor does no I/O: ``start`` restores the checkpoint and binds the port."""

    def __init__(
        self, config: Config, registry: CollectorRegistry | None = None, clock: Callable[[], float] = time.time
    ) -> None:
        self.config = config
        self.clock = clock
        self.registry = registry or CollectorRegistry()
        self.health = Health(self.registry)
        self.store = WindowStore(config)
        self.joins = OutcomeJoin(len(config.attributes), config.label_horizon_seconds, config.max_pending_labels)
        dead_letters = DeadLetters(config.kafka, self.health) if config.kafka.dead_letter_topic else None
        self.ingest = Ingest(config, self.store, self.joins, self.health, clock, dead_letters)
        self.checkpointer = Checkpointer(config, self.store, self.joins, self.health, clock)
        self.source = KafkaSource(config.kafka, self.ingest.handle, self.checkpointer, self.health)
        self.registry.register(ConsumerCollector(self.source.lag, lambda: self.source.broker_up))
        self.exposition = CachedExposition(f"{config.evaluation_interval_seconds:g}s")
        self.computer = Computer(config, self.store, self.health, clock, on_snapshot=self.exposition.update)
        self.scheduler = BackgroundScheduler(timezone="UTC")
        self.http: HttpServer | None = None  # bound by start()
        self._stopped = threading.Event()

    @property
    def port(self) -> int:
        """The port /metrics is served on (once started)."""
        assert self.http is not None, "the daemon has not started"
        return self.http.port

    def metrics_page(self) -> str:
        """What /metrics serves, as text."""
        return self.exposition.page(self.registry, "")[0].decode()

    def healthy(self) -> tuple[bool, str]:
        """Live while the consumer thread and the scheduler run."""
        if not self.source.alive:
            return False, "the Kafka consumer thread has stopped"
        if not self.scheduler.running:
            return False, "the computation scheduler is not running"
        return True, "consumer and scheduler running"

    def ready(self) -> tuple[bool, str]:
        """Ready once partitions are assigned and a computation has published a snapshot, while a broker answers."""
        if not self.source.assigned_once.is_set():
            return False, "waiting for Kafka partitions"
        if not self.source.broker_up:
            return False, "no Kafka broker answers"
        if self.computer.latest is None:
            return False, "waiting for the first computation"
        return True, "serving computed metrics"

    def start(self) -> None:
        """Restore the checkpoint, bind the port, compute once, then start the schedule and the consumer."""
        self.checkpointer.restore()
        self.scheduler.add_job(self.computer.run_scheduled, "interval", seconds=self.config.evaluation_interval_seconds,
                               id="compute", max_instances=1, coalesce=True)  # fmt: skip
        if self.config.kafka.labels_topic:
            self.scheduler.add_job(self.ingest.expire, "interval", seconds=EXPIRY_EVERY_SECONDS, id="expire",
                                   max_instances=1, coalesce=True)  # fmt: skip
        if self.checkpointer.path is not None:
            self.scheduler.add_job(self.checkpointer.flush, "interval",
                                   seconds=self.config.checkpoint_interval_seconds, id="checkpoint",
                                   max_instances=1, coalesce=True)  # fmt: skip
        self.serve()
        if self.checkpointer.path is None:
            log.info("no checkpoint configured: the window starts empty after every restart")
        self.computer.compute()
        self.scheduler.start()
        self.source.start()
        log.info("fairness-exporter serving model %s on port %d, reading %s from %s", self.config.model_id,
                 self.port, self.config.kafka.topic, self.config.kafka.bootstrap_servers)  # fmt: skip

    def serve(self) -> None:
        """Bind the port and serve /metrics and the probes on a background thread.

        Shortens the interpreter's GIL slice (:data:`GIL_SWITCH_SECONDS`): while ingest keeps a core busy, each
        step of a scrape (accept, read, respond) waits for a slice to end, and Python's 5 ms slices made a p99
        scrape of 99 ms under 10 concurrent scrapers (bench/scrape.py, README "Performance").
        """
        sys.setswitchinterval(GIL_SWITCH_SECONDS)
        config = self.config
        self.http = HttpServer(make_app(self.registry, self.exposition, config.model_id, self.healthy, self.ready),
                               config.listen_address, config.listen_port,
                               config.tls_cert_file, config.tls_key_file)  # fmt: skip
        self.http.start()

    def stop(self) -> None:
        """Stop consuming, write a final checkpoint (from the consumer thread), commit, stop serving."""
        if self._stopped.is_set():
            return
        self._stopped.set()
        if self.scheduler.running:
            self.scheduler.shutdown(wait=True)
        if self.source.alive:
            self.source.stop()
        if self.ingest.dead_letters is not None:
            self.ingest.dead_letters.close()
        if self.http is not None:
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
