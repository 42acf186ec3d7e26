"""The monitoring daemon: Kafka source -> decoder -> window store (+ label join) -> scheduled computation ->
/metrics, with checkpoints that let it restart without losing or double counting an event."""

from __future__ import annotations

import dataclasses
import logging
import signal
import threading
import time
from collections.abc import Callable

from apscheduler.schedulers.background import BackgroundScheduler
from prometheus_client import CollectorRegistry

from exporter.config import Config
from exporter.serve import web_config
from exporter.serve.collector import CachedExposition
from exporter.serve.http import ListenError, bind
from exporter.serve.http_worker import STALE_SECONDS, HttpWorker
from exporter.serve.self_metrics import ConsumerCollector, Health
from exporter.serve.snapshot import Computer, Snapshot
from exporter.stream.checkpoint import Checkpointer
from exporter.stream.dead_letters import DeadLetters
from exporter.stream.ingest import Ingest
from exporter.stream.label_join import OutcomeJoin
from exporter.stream.source import KafkaSource
from exporter.stream.window import WindowStore

log = logging.getLogger(__name__)
EXPIRY_EVERY_SECONDS = 10.0


class Daemon:
    """Wires the parts together and runs their lifecycle; ``start``/``stop`` for tests, ``run_forever`` for the
    command line. The constructor does no I/O: ``start`` restores the checkpoint and binds the port."""

    def __init__(
        self, config: Config, registry: CollectorRegistry | None = None, clock: Callable[[], float] = time.time,
        web_config_file: str | None = None,
    ) -> None:
        """``web_config_file``: who may read /metrics and the probes (``--web.config.file``,
        exporter.serve.web_config)."""
        self.config = config
        self.web_config_file = web_config_file
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
        self.computer = Computer(config, self.store, self.health, clock, on_snapshot=self._publish)
        self.scheduler = BackgroundScheduler(timezone="UTC")
        self.http: HttpWorker | None = None  # bound by start()
        self.stale_seconds = STALE_SECONDS
        """/healthz fails when the daemon has published nothing to the HTTP worker for this long."""
        self._stopped = threading.Event()

    @property
    def port(self) -> int:
        """The port /metrics is served on (once started)."""
        assert self.http is not None, "the daemon has not started"
        return self.http.port

    def metrics_page(self) -> str:
        """What /metrics serves, as text (assembled as the HTTP worker assembles it, but from the parts now)."""
        return self.exposition.page(self.registry, "").body.decode()

    def _publish(self, snapshot: Snapshot) -> None:
        """After each computation, on its thread: render the snapshot, and have the HTTP worker serve it."""
        self.exposition.update(snapshot)
        if self.http is not None:
            self.http.publish()

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
        """Bind the port, then serve /metrics and the probes from the HTTP worker process (serve/http_worker.py).

        The daemon binds and checks the web configuration itself, so that a port in use or a bad file stops it with
        one line; scrapes are served by another process, which never waits for the GIL ingest holds.
        """
        config = self.config
        web = self._web_config()
        listening = bind(config.listen_address, config.listen_port)
        self.http = HttpWorker(listening, self.exposition, self.registry, (self.healthy, self.ready),
                               (config.model_id, web), self.health.http_worker_restarts,
                               self.health.http_auth_failures, self.stale_seconds)  # fmt: skip
        self.http.start()

    def _web_config(self) -> web_config.WebConfig:
        """The web configuration file's, with the config's ``listen.tls_*`` as its TLS if the file has none; its
        TLS files loaded once to check them (WebConfigError, or ListenError for ``listen.*``)."""
        listen = web_config.from_listen(self.config.tls_cert_file, self.config.tls_key_file)
        web = web_config.load(self.web_config_file) if self.web_config_file else listen
        if listen.tls and web is not listen:
            if web.tls:
                raise web_config.WebConfigError(f"--web.config.file {self.web_config_file}: tls_server_config and "
                                                "the config's listen.tls_cert_file both set the server's TLS: keep "
                                                "one")  # fmt: skip
            web = dataclasses.replace(web, tls=listen.tls)
        if web.tls:
            try:
                web_config.server_context(web)  # the worker loads them again
            except web_config.WebConfigError as exc:
                raise (ListenError(str(exc)) if web.tls is listen.tls else exc) from exc
        return web

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
