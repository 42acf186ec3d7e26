"""The monitoring daemon: Kafka source -> router and decoders -> every model's window store (+ label join) ->
scheduled computation -> /metrics, with checkpoints that let it restart without losing or double counting an
event, and reloads that change the models without a restart. With ``kafka.stages: staged`` the same parts run as
the stages of exporter/stream/stages/replica.py, and this replica computes and serves the models it owns."""

from __future__ import annotations

import errno
import gc
import logging
import signal
import threading
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
from apscheduler.schedulers.background import BackgroundScheduler
from prometheus_client import CollectorRegistry, Gauge

from exporter.config import Config, ConfigError
from exporter.config.watch import ConfigWatch
from exporter.health.counters import Health, StageHealth
from exporter.serve import orphans, web_config
from exporter.serve.collector import CachedExposition
from exporter.serve.http import bind
from exporter.serve.http_worker import STALE_SECONDS, HttpWorker
from exporter.serve.self_metrics import ConsumerCollector, OwnershipCollector
from exporter.serve.snapshot import Computer, FleetSnapshot
from exporter.serve.web_config import ListenError
from exporter.stream.ingest import Ingest
from exporter.stream.kafka.dead_letters import DeadLetters
from exporter.stream.kafka.source import KafkaSource
from exporter.stream.stages.replica import Stages
from exporter.stream.state.checkpoint import Checkpointer
from exporter.stream.state.clock import SteadyClock
from exporter.stream.state.fleet import Fleet

log = logging.getLogger(__name__)
EXPIRY_EVERY_SECONDS = 10.0
GC_THRESHOLDS = (10_000, 10, 10)
"""The collector's thresholds once started (Python's: 700, 10, 10): a poll makes tens of thousands of short-lived
objects (a client's records, the decoded events), which set off a young collection every 700 allocations."""
WATCH_SECONDS = 5.0
"""How often the config file (and models_dir) are checked for a change, which reloads them once unchanged for one
more check (exporter/config/watch.py)."""
RESTART_ONLY = (("kafka", "kafka"), ("listen_address", "listen.address"), ("listen_port", "listen.port"),
                ("tls_cert_file", "listen.tls_cert_file"), ("tls_key_file", "listen.tls_key_file"),
                ("checkpoint_path", "checkpoint.path"), ("attribute_sources", "attribute_sources"),
                ("attribute_fields", "the fields read from attribute_sources"))  # fmt: skip
"""Settings a running daemon cannot change (its consumer, its socket, its checkpoint file): (field, YAML key)."""


def references(config: Config) -> dict[str, dict[str, np.ndarray]]:
    """Per model that estimates (``estimation:``), its reference's score counts per attribute; a reference that
    cannot be read is a ConfigError naming it. The gate's reader (and with it pandas) is loaded only then: the one
    reader of the reference, so the daemon's estimate is the gate's; an install without it (the daemon image)
    refuses such a model, at start or on a reload, naming it."""
    estimating = [m for m in config.models if m.estimation is not None]
    if not estimating:
        return {}
    try:
        from exporter.gate.fairness.audit import read_reference
    except ModuleNotFoundError as exc:
        models = ", ".join(m.model_id for m in estimating)
        raise ConfigError(f"{estimating[0].source}: estimation.reference (model {models}): the reference is read "
                          f"with the gate's reader, which needs {exc.name}: this install leaves it out (the daemon "
                          "image does). Run the full image (the chart does when its config has estimation:, or with "
                          "image.target: full), or pip install 'fairness-exporter[gate]'") from exc  # fmt: skip

    out = {}
    for model in config.models:
        if model.estimation is not None:
            try:
                out[model.model_id] = read_reference(model)[0]
            except ValueError as exc:
                raise ConfigError(f"{model.source}: estimation.reference: {exc}") from exc
    return out


def settle_heap() -> None:
    """The garbage collector once the daemon has started (:meth:`Daemon.run_forever`): what start-up built (the
    config, the models, their windows and metric families, the restored checkpoint) is collected once and then
    frozen out of the collector's sight (``gc.freeze``), and young collections run every 10,000 allocations instead
    of 700. Each full collection scanned the whole start-up heap again (73,000 tracked objects at 100 models), every
    few polls. Measured on the daemon's own Kafka source (bench/fleet.py's data, 60,000 events, interleaved rounds):
    docs/sre/performance.md. A reference cycle among frozen objects that later becomes garbage (the models a reload
    replaced) is never collected: at most what start-up built, once."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(*GC_THRESHOLDS)


class Daemon:
    """Wires the parts together and runs their lifecycle; ``start``/``stop`` for tests, ``run_forever`` for the
    command line. The constructor does no I/O: ``start`` restores the checkpoint and binds the port.

    ``loader`` reads the config again for a reload (SIGHUP, a change to its files, :meth:`reload`); without one
    the daemon cannot reload.
    """

    def __init__(
        self, config: Config, registry: CollectorRegistry | None = None, clock: Callable[[], float] | None = None,
        loader: Callable[[], Config] | None = None, web_config_file: str | None = None, lifecycle: bool = False,
        watch_seconds: float = WATCH_SECONDS,
    ) -> None:  # fmt: skip
        self.config = config
        no_topic = sorted(s.name for s in config.attribute_sources.values() if s.topic is None)
        if no_topic:
            raise ConfigError(f"{config.source}: attribute_sources.{no_topic[0]}.topic: required by the daemon (a "
                              "compacted topic keyed by the id); a path is read by the gate only")  # fmt: skip
        self.web_config_file = web_config_file
        """Who may read /metrics and the probes (``--web.config.file``, exporter.serve.web_config)."""
        self.loader = loader
        self.registry = registry or CollectorRegistry()
        self.health = Health(self.registry)
        # the wall clock without its jumps (exporter.stream.state.clock)
        self.clock = clock = clock or SteadyClock(on_jump=lambda _: self.health.clock_jumps.inc())
        dead_letters = DeadLetters(config.kafka, self.health) if config.kafka.dead_letter_topic else None
        self.stages: Stages | None = None
        """The staged path's stages (kafka.stages: staged), which then keep the offsets instead of checkpoints."""
        if config.kafka.stages == "staged":
            self.stages = Stages(config, self.health, StageHealth(self.registry), clock, dead_letters)
            self.fleet, self.ingest = self.stages.fleet, self.stages.ingest
        else:
            self.fleet = Fleet(config, keep_rejected=dead_letters is not None, on_rewind=self.health.window_rewinds.inc)
            self.ingest = Ingest(config, self.fleet, self.health, clock, dead_letters)
        self.checkpointer = Checkpointer(config, self.fleet, self.health, clock)
        if self.stages is not None:
            self.source = KafkaSource(config.kafka, self.stages.handle_poll, self.stages, self.health,
                                      self.stages.source_topics, self.stages.prepare)  # fmt: skip
            self.stages.lag = self.source.lag
            self.stages.released = self._compute_now
            self.registry.register(OwnershipCollector(self.stages.owned, config.windowing.bucket_seconds))
        else:
            sides = [s.topic for s in config.attribute_sources.values() if s.topic is not None]
            self.source = KafkaSource(config.kafka, self.ingest.handle_poll, self.checkpointer, self.health,
                                      [*config.kafka.events_topics(), *filter(None, [config.kafka.labels_topic]),
                                       *sides],
                                      on_refusal=self._refused, from_start=frozenset(sides))  # fmt: skip
        # the lag of every consumer: the staged path's side consumer reads its topics apart from the group's source
        lags = [self.source.lag, *([self.stages.sides.source.lag] if self.stages and self.stages.sides else [])]
        self.registry.register(ConsumerCollector(lambda: {p: n for lag in lags for p, n in lag().items()},
                                                 lambda: self.source.broker_up))  # fmt: skip
        self.unjoined_level = Gauge("fairness_exporter_labels_max_unjoined_share", "alerting.max_unjoined_share: "
                                    "above this share of delayed labels that found no prediction, the label join is "
                                    "broken.", registry=self.registry) if config.kafka.labels_topic else None
        self.exposition = CachedExposition(f"{config.evaluation_interval_seconds:g}s")
        self.computer = Computer(self.fleet, self.health, clock, on_snapshot=self._publish)
        self.scheduler = BackgroundScheduler(timezone="UTC")
        self.http: HttpWorker | None = None  # bound by start()
        self.stale_seconds = STALE_SECONDS
        """/healthz fails when the daemon has published nothing to the HTTP worker for this long."""
        self.watch_seconds = watch_seconds
        """How often the config's files are checked for a change, which reloads them (0: never)."""
        self.lifecycle = lifecycle
        """POST /-/reload reloads the config (``--web.enable-lifecycle``; off by default, as in Prometheus)."""
        self._stopped = threading.Event()
        self._done = threading.Event()
        """Set by SIGTERM, SIGINT, or a refusal: :meth:`run_forever` stops."""
        self._reloading = threading.Lock()
        self.watch = ConfigWatch(lambda: self.config, self.reload)
        """The scheduled check of the config's files (every ``watch_seconds``), which reloads them when they change."""
        self._loaded(config)

    def _loaded(self, config: Config) -> None:
        """The health of the config now running (loaded at start, or reloaded)."""
        self.health.models.set(len(config.models))
        self.health.evaluation_interval.set(config.evaluation_interval_seconds)  # the periods the health alerts read
        self.health.checkpoint_interval.set(config.checkpoint_interval_seconds if self.checkpointer.path else 0)
        if self.stages is not None:  # its snapshot rounds' period, which FairnessExporterStateSnapshotFailing reads
            self.stages.stage_health.snapshot_interval.set(config.checkpoint_interval_seconds)
        if self.unjoined_level is not None and config.models:
            self.unjoined_level.set(config.models[0].alerting.max_unjoined_share)
        self.health.reload_successful.set(1)
        self.health.reload_timestamp.set(self.clock())

    @property
    def port(self) -> int:
        """The port /metrics is served on (once started)."""
        assert self.http is not None, "the daemon has not started"
        return self.http.port

    def metrics_page(self) -> str:
        """What /metrics serves, as text (assembled as the HTTP worker assembles it, but from the parts now)."""
        return self.exposition.page(self.registry, "").body.decode()

    def _publish(self, snapshot: FleetSnapshot) -> None:
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
        """Ready once partitions are assigned and a computation has published a snapshot, while a broker answers,
        every topic read exists and (a direct replica) it holds partitions, no other member of the group holds
        partitions of its topics, and the config monitors a model (an empty ``models_dir`` is accepted: it waits for
        its files, not ready, as a daemon that computes nothing for anybody)."""
        if self.source.refusal is not None:
            return False, self.source.refusal
        if not self.config.models:
            return False, (f"no model configured: waiting for model files in {self.config.models_dir} (every event "
                           "is ignored until one arrives)")  # fmt: skip
        if (shared := self.source.shared) is not None:
            return False, (f"{shared}: counting is paused until this replica holds them all again "
                           "(kafka.stages: direct is one replica; use kafka.stages: staged for several)")
        if self.source.idle is not None:
            return False, self.source.idle
        if not self.source.assigned_once.is_set():
            return False, "waiting for Kafka partitions"
        failing = self.stages.failing if self.stages is not None else self.ingest.failing
        if failing or (failing := self.source.failing):  # before the broker's view, which a failure clouds
            return False, failing
        if not self.source.broker_up:
            return False, "no Kafka broker answers"
        if self.computer.latest is None:
            return False, "waiting for the first computation"
        return True, "serving computed metrics"

    def start(self) -> None:
        """Restore the checkpoint, bind the port, compute once, then start the schedule and the consumer."""
        self.computer.references = references(self.config)
        self.checkpointer.restore()
        if self.ingest.dead_letters is not None:  # settings its producer refuses stop the start here
            self.ingest.dead_letters.start(self.config.source)
        self._schedule(self.config)
        # whatever the config: it also gives up a payload log's halves and forgets its calls done (no labels needed)
        expire = self.stages.expire if self.stages is not None else self.ingest.expire
        self.scheduler.add_job(expire, "interval", seconds=EXPIRY_EVERY_SECONDS, id="expire", max_instances=1,
                               coalesce=True)  # fmt: skip
        if self.stages is not None:
            self.scheduler.add_job(self.stages.tick, "interval", seconds=1.0, id="stages", max_instances=1,
                                   coalesce=True)  # fmt: skip
        if self.loader is not None and self.watch_seconds > 0:
            self.watch.mark()
            self.scheduler.add_job(self.watch.check, "interval", seconds=self.watch_seconds, id="watch",
                                   max_instances=1, coalesce=True)  # fmt: skip
        self.serve()
        if self.stages is not None:
            log.info("staged: this replica evaluates the models of the counts partitions it holds; state is "
                     "snapshotted into the internal topics %s", ", ".join(self.stages.topics.names))  # fmt: skip
        elif self.checkpointer.path is None:
            log.info("no checkpoint configured: the window starts empty after every restart")
        self.computer.compute()
        self.scheduler.start()
        self.source.start()
        if self.stages is not None and self.stages.sides is not None:  # every replica reads the side topics whole
            self.stages.sides.source.start()
        log.info("fairness-exporter serving %s on port %d, reading %s from %s", self._models(), self.port,
                 ", ".join(self.config.kafka.events_topics() + list(self.config.kafka.topic_pattern)),
                 self.config.kafka.bootstrap_servers)  # fmt: skip

    def _compute_now(self) -> None:
        """Have the scheduled computation run now (models left this replica: their series leave /metrics)."""
        if self.scheduler.running:
            self.scheduler.modify_job("compute", next_run_time=datetime.now(UTC))

    def _models(self) -> str:
        ids = self.config.model_ids
        return f"model {ids[0]}" if len(ids) == 1 else f"{len(ids)} models ({', '.join(ids)})"

    def _schedule(self, config: Config) -> None:
        """(Re)schedule the jobs whose period the config sets."""
        jobs: list[tuple[str, Callable[[], None], float]] = [
            ("compute", self.computer.run_scheduled, config.evaluation_interval_seconds)]
        if self.checkpointer.path is not None:
            jobs.append(("checkpoint", self.checkpointer.flush, config.checkpoint_interval_seconds))
        if self.ingest.dead_letters is not None:
            jobs.append(("dead-letters", self.ingest.dead_letters.serve, 1.0))
        for name, job, seconds in jobs:
            self.scheduler.add_job(job, "interval", seconds=seconds, id=name, max_instances=1, coalesce=True,
                                   replace_existing=True)  # fmt: skip

    def serve(self) -> None:
        """Bind the port, then serve /metrics and the probes from the HTTP worker process (serve/http_worker.py).

        The daemon binds and checks the web configuration itself, so that a port in use or a bad file stops it with
        one line (unless an orphaned worker of a dead daemon of this config holds the port: it is taken back);
        scrapes are served by another process, which never waits for the GIL ingest holds.
        """
        config = self.config
        web = web_config.resolve(self.web_config_file, config.tls_cert_file, config.tls_key_file)
        owner = str(Path(config.source).resolve())
        try:
            listening = bind(config.listen_address, config.listen_port)
        except ListenError as exc:  # held by the HTTP worker of a dead daemon of this config? take it back
            in_use = isinstance(exc.__cause__, OSError) and exc.__cause__.errno == errno.EADDRINUSE
            if not (in_use and config.listen_port and orphans.take_back(config.listen_port, owner)):
                raise
            listening = bind(config.listen_address, config.listen_port)
        self.http = HttpWorker(listening, self.exposition, self.registry, (self.healthy, self.ready),
                               (", ".join(config.model_ids), web), self.health.http_worker_restarts,
                               self.health.http_auth_failures, self.stale_seconds,
                               self.reload if self.lifecycle else None, owner)  # fmt: skip
        self.http.start()

    # --- reload -----------------------------------------------------------------------------------------------

    def reload(self) -> tuple[bool, str]:
        """Read the config again and apply it, as Prometheus does: an invalid config, or one that changes what only
        a restart can change, is refused whole and the running one stays; (applied, what happened)."""
        if self.loader is None:
            return False, "this daemon was started without a config file to reload"
        with self._reloading:
            try:
                config = self.loader()
                changed = [key for name, key in RESTART_ONLY if getattr(config, name) != getattr(self.config, name)]
                if changed:
                    raise ConfigError(f"{config.source}: {', '.join(changed)} changed, which takes effect only on "
                                      "a restart; the running config is kept")  # fmt: skip
                refs = references(config)
            except ConfigError as exc:
                return self._refuse(str(exc))
            resets = self.fleet.resets(config)
            try:
                if resets:  # before they go: their state kept on disk, counted, said in one line
                    self.checkpointer.keep(resets)
            except OSError as exc:  # a full or read-only volume: nothing reset, nothing applied, and said so
                return self._refuse(f"{config.source}: models {', '.join(resets)} would start afresh, and their "
                                    f"state cannot be kept ({exc}); the running config is kept")  # fmt: skip
            changes, given_up = self.stages.apply(config) if self.stages is not None else self.fleet.apply(config)
            self.health.count_outcomes(given_up)
            if config.evaluation_interval_seconds != self.config.evaluation_interval_seconds:
                self.exposition.every = f"{config.evaluation_interval_seconds:g}s"
            self.config = config
            self.computer.references = refs
            if self.scheduler.running:
                self._schedule(config)
            self._loaded(config)
            self.watch.mark()
            log.info("config reloaded from %s: %s", config.source, changes)
        self.computer.run_scheduled()  # a removed model leaves /metrics now, an added one appears
        return True, str(changes)

    def _refuse(self, line: str) -> tuple[bool, str]:
        """A reload refused whole: counted (FairnessExporterConfigReloadFailed), said in one line."""
        self.health.reload_failures.inc()
        self.health.reload_successful.set(0)
        log.error("config reload refused: %s", line)
        return False, line

    def stop(self) -> None:
        """Stop consuming, write a final checkpoint (from the consumer thread), commit, stop serving."""
        if self._stopped.is_set():
            return
        self._stopped.set()
        if self.scheduler.running:
            self.scheduler.shutdown(wait=True)
        if self.source.alive:
            self.source.stop()
        closing = [("the staged path's producer", self.stages.close)] if self.stages is not None else []
        if self.ingest.dead_letters is not None:
            closing.append(("the dead-letter producer", self.ingest.dead_letters.close))
        for what, close in closing:  # each step whatever the one before raised: the HTTP worker always stops
            try:
                close()
            except Exception as exc:  # a broker that does not answer: records still queued are not delivered
                log.error("stopping %s failed (%s: %s): what it had not delivered is not; internal records are sent "
                          "again from the uncommitted offsets after a restart", what, type(exc).__name__, exc)
        if self.http is not None:
            self.http.stop()

    def _refused(self, line: str) -> None:
        """The source refused to count (another member of a direct replica's group at start): stop, exit 2."""
        self._done.set()

    def run_forever(self) -> None:
        """Run until SIGTERM or SIGINT, then stop cleanly; SIGHUP reloads the config. ConfigError when the source
        refused to count (the line names the group and says what to use instead)."""
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: self._done.set())
        signal.signal(signal.SIGHUP, lambda *_: threading.Thread(target=self.reload, name="reload").start())
        self.start()
        settle_heap()
        self._done.wait()
        log.info("stopping")
        self.stop()
        if self.source.refusal is not None:
            raise ConfigError(f"{self.config.source}: {self.source.refusal}")
