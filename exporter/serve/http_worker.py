"""The daemon's side of the HTTP worker process: start it on the bound socket, publish to it, restart it.

Scrapes are served by a separate process (exporter.serve.worker): the daemon's threads share one GIL, and while
ingest keeps a core busy its batch calls (msgspec, numpy) hold it for milliseconds at a time, so HTTP threads in
the daemon waited their turn at every step of a request (a p99 scrape of 92-136 ms under 10 concurrent scrapers;
bench/scrape.py). The worker has its own interpreter on the other core and serves bytes the daemon pushed:

- the snapshot's rendering per format, right after each computation (:meth:`HttpWorker.publish`, which waits a
  bounded time for the worker's acknowledgement, so that a scrape after ``compute()`` returns sees it);
- the live registry's rendering (health and self-metrics, consumer lag) and the /healthz and /readyz verdicts,
  every :data:`PUBLISH_SECONDS` and right after each computation.

One thread sends (the publisher), one receives (the supervisor: acknowledgements, formats the worker asks for, and
its end). A worker that dies is logged, counted (``fairness_exporter_http_worker_restarts_total``) and started again
on the same socket. A worker dies with its daemon: the kernel kills it (a parent-death signal, exporter.serve.orphans,
which is tied to the *thread* that started it: the supervisor, which lives as long as the worker may), and it exits
at the end of its connection.
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import socket
import subprocess
import sys
import threading
from collections.abc import Callable
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Final, NamedTuple

from prometheus_client import CollectorRegistry, Counter

from exporter.serve.collector import CachedExposition
from exporter.serve.orphans import WORKER_MODULE
from exporter.serve.web_config import WebConfig

log = logging.getLogger(__name__)
PUBLISH_SECONDS: Final = 0.5
"""How often the live registry and the verdicts are published: counters on /metrics are at most this old. Each
publication renders the small live registry once per format (about a millisecond); Prometheus scrapes every 10 s
or more, so half a second of age is invisible on a graph, and the probes see a stopped consumer within a second."""
STALE_SECONDS: Final = 30.0
"""The worker's /healthz (and /readyz) fail when the daemon has published nothing for this long: a wedged main
process fails liveness. Sixty missed publications: no GC pause or long computation comes near it."""
PUBLISH_WAIT_SECONDS: Final = 5.0
"""How long :meth:`HttpWorker.publish` waits for the worker to serve a new snapshot."""
RESTART_SECONDS: Final = 1.0
"""Pause before a dead worker is started again: a worker that cannot start does not spin a core."""
STOP_SECONDS: Final = 2.0


class _Link(NamedTuple):
    process: subprocess.Popen[bytes]
    connection: Connection


class HttpWorker:
    """The HTTP worker process on ``listening`` (already bound), fed from ``exposition`` and ``registry``."""

    def __init__(
        self, listening: socket.socket, exposition: CachedExposition, registry: CollectorRegistry,
        verdicts: tuple[Callable[[], tuple[bool, str]], Callable[[], tuple[bool, str]]],
        hello: tuple[str, WebConfig], restarts: Counter, auth_failures: Counter,
        stale_seconds: float = STALE_SECONDS, reload: Callable[[], tuple[bool, str]] | None = None, owner: str = "",
    ) -> None:  # fmt: skip
        """``verdicts``: (healthy, ready); ``hello``: (model id, who may read); ``auth_failures``: the counter (by
        ``reason``) of what the worker refused; ``reload``: what POST /-/reload calls (None: not served); ``owner``:
        the config file, on the worker's command line (a restarted daemon of it recognises an orphan by it)."""
        self.listening = listening
        self.port: int = listening.getsockname()[1]
        self.exposition = exposition
        self.registry = registry
        self.verdicts = verdicts
        self.hello = ("hello", *hello, reload is not None, stale_seconds)
        self.reload = reload
        self.owner = owner
        self.restarts = restarts
        self.auth_failures = auth_failures
        self._refused: dict[str, int] = {}  # what the running worker reported refused, so far
        self.link: _Link | None = None
        self._changed = threading.Condition()
        self._requested = 0  # publications asked for (publish()); the worker acknowledges each one it served
        self._acknowledged = 0
        self._wants: list[str] = []
        self._wake = threading.Event()
        self._stopping = threading.Event()
        self._sending = threading.Lock()
        self._sent: tuple[_Link, int] | None = None  # the worker holding which snapshot generation
        self._spawned = threading.Event()
        self._threads = [threading.Thread(target=self._supervise, name="http-worker", daemon=True),
                         threading.Thread(target=self._publish_loop, name="http-publish", daemon=True)]

    def start(self) -> None:
        """Start the supervisor, which starts the worker (so that the worker's parent-death signal follows a thread
        that lives as long as it does), then the publisher."""
        self._threads[0].start()
        self._spawned.wait()
        if self.link is None:
            raise RuntimeError("the HTTP worker process could not be started (see the log)")
        self._threads[1].start()

    def _spawn(self) -> _Link:
        ours, theirs = multiprocessing.Pipe()
        source_root = str(Path(__file__).resolve().parents[2])  # `-m exporter...` works from a source tree too
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [source_root, os.environ.get("PYTHONPATH")]))}
        fds = (theirs.fileno(), self.listening.fileno())
        process = subprocess.Popen([sys.executable, "-m", WORKER_MODULE, *map(str, fds), str(os.getpid()), self.owner],
                                   pass_fds=fds, env=env)  # fmt: skip
        theirs.close()  # the worker's end lives in the worker only: its exit is our end of file
        with self._sending:
            ours.send(self.hello)
        return _Link(process, ours)

    def publish(self, timeout: float = PUBLISH_WAIT_SECONDS) -> bool:
        """Publish now and wait until the worker serves it; False if it did not within ``timeout``."""
        with self._changed:
            self._requested += 1
            mine = self._requested
        self._wake.set()
        with self._changed:
            return self._changed.wait_for(lambda: self._acknowledged >= mine, timeout)

    def _publish_loop(self) -> None:
        while not self._stopping.is_set():
            self._wake.wait(PUBLISH_SECONDS)
            self._wake.clear()
            link = self.link
            if self._stopping.is_set() or link is None:
                return
            with self._changed:
                seq, wants, self._wants = self._requested, self._wants, []
            try:
                for accept in wants:
                    self.exposition.ask(accept)
                generation, texts = self.exposition.texts()
                snapshot = None if self._sent == (link, generation) else texts
                healthy, ready = self.verdicts
                message = ("publish", seq, snapshot, self.exposition.live(self.registry), healthy(), ready())
            except Exception:  # the worker's /healthz fails once publications stop for STALE_SECONDS
                log.exception("rendering the live metrics for the HTTP worker failed")
                continue
            try:
                with self._sending:
                    link.connection.send(message)
                self._sent = (link, generation)
            except (OSError, ValueError):  # the worker is gone: the supervisor starts another, sent everything
                pass

    def _supervise(self) -> None:
        """Start the worker; receive from it; when it ends (not stopped by us), log it, count it and start
        another."""
        try:
            self.link = self._spawn()
        except Exception:
            log.exception("starting the HTTP worker process failed")
            return
        finally:
            self._spawned.set()
        while True:
            link = self.link
            assert link is not None
            while True:
                try:
                    kind, value = link.connection.recv()
                except (EOFError, OSError):
                    break
                with self._changed:
                    if kind == "ack":
                        seq, refused = value
                        self._count_refused(refused)
                        self._acknowledged = max(self._acknowledged, seq)
                        self._changed.notify_all()
                    elif kind == "reload":  # on a thread of its own: a reload computes and publishes
                        threading.Thread(target=self._reload, args=(link, value), name="reload", daemon=True).start()
                    else:  # "want": a format to render
                        self._wants.append(value)
                        self._wake.set()
            if self._stopping.is_set():
                return
            code = link.process.wait()
            link.connection.close()
            self.restarts.inc()
            log.error("the HTTP worker process exited (%s); starting another on port %d in %g s",
                      f"signal {-code}" if code < 0 else f"exit code {code}", self.port, RESTART_SECONDS)
            if self._stopping.wait(RESTART_SECONDS):
                return
            self._refused = {}
            self.link = self._spawn()
            self._wake.set()

    def _reload(self, link: _Link, number: int) -> None:
        """Reload as the worker asked, and tell it what happened."""
        assert self.reload is not None
        answer = self.reload()
        try:
            with self._sending:
                link.connection.send(("reloaded", number, answer))
        except (OSError, ValueError):
            pass  # the worker is gone: a new one was never asked

    def _count_refused(self, refused: dict[str, int]) -> None:
        """The worker's totals since it started, added to the counter as increments."""
        for reason, total in refused.items():
            self.auth_failures.labels(reason).inc(total - self._refused.get(reason, 0))
        self._refused = refused

    def stop(self) -> None:
        """Tell the worker to stop, wait briefly, kill it if needed, and close the socket."""
        self._stopping.set()
        self._wake.set()
        link = self.link
        if link is not None:
            if self._sending.acquire(timeout=STOP_SECONDS):  # the publisher may be blocked on a stuck worker
                try:
                    link.connection.send(("stop",))
                except (OSError, ValueError):
                    pass
                finally:
                    self._sending.release()
            try:
                link.process.wait(STOP_SECONDS)
            except subprocess.TimeoutExpired:
                link.process.kill()
                link.process.wait()
        for thread in self._threads:
            if thread.is_alive():
                thread.join(STOP_SECONDS)
        final = self.link  # another than ``link`` if the supervisor was restarting the worker meanwhile
        if final is not None:
            if final.process.poll() is None:
                final.process.kill()
                final.process.wait()
            final.connection.close()
        if link is not None:
            link.connection.close()
        self.listening.close()

    @property
    def pid(self) -> int | None:
        """The worker's process id (None before start)."""
        return self.link.process.pid if self.link else None
