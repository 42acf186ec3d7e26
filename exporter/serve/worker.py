"""The HTTP worker process: serves /metrics, /healthz, /readyz and the landing page from what the daemon publishes.

Started by the daemon (exporter.serve.http_worker) as ``python -m exporter.serve.worker CONNECTION_FD SOCKET_FD
DAEMON_PID CONFIG``, on the listening socket the daemon bound, with one end of a ``multiprocessing.Pipe`` as its only
link to the daemon. It dies with the daemon (a parent-death signal; exporter.serve.orphans), and the daemon's
process id and config file on its command line let a restarted daemon recognise an orphan that did not. Scrapes
never share a GIL with ingest: the daemon's threads can hold theirs for milliseconds at a time.

Messages from the daemon (pickled by ``Connection``): ``("hello", model_id, web_config, lifecycle, stale_seconds)``
once; ``("reloaded", number, (applied, what))`` answering a ``("reload", number)`` the worker sent for a POST
/-/reload (served only when ``lifecycle``)
(``web_config``: a :class:`~exporter.serve.web_config.WebConfig`, checked by the daemon); ``("publish", seq,
snapshot, live, healthy, ready)`` on every publication (``snapshot``: the snapshot's rendering per content type,
None when unchanged; ``live``: the live registry's; the verdicts as ``(ok, why)``); ``("stop",)``. To the daemon:
``("ack", (seq, refused))`` once a publication is served (``refused``: the requests and handshakes refused so far,
by reason), ``("want", accept)`` for a format not published yet. End of file on the connection (the daemon exited)
ends the worker too.

Imports neither numpy nor pandas (tests/test_architecture.py checks it).
"""

from __future__ import annotations

import logging
import signal
import socket
import sys
import threading
import time
from multiprocessing.connection import Connection
from typing import Any, Final

from prometheus_client.exposition import choose_encoder

from exporter.serve.access import Failures, Guard
from exporter.serve.exposition import DEFAULT_CONTENT_TYPE, EXPLANATIONS, MAX_FORMATS, Page, Pages
from exporter.serve.http import HttpServer, make_app
from exporter.serve.orphans import alive, die_with_parent
from exporter.serve.web_config import WebConfigError

log = logging.getLogger("exporter.serve.worker")
WAIT_SECONDS: Final = 10.0
RELOAD_WAIT_SECONDS: Final = 30.0
"""How long a POST /-/reload waits for the daemon's answer (a reload reads and validates every model file)."""
"""How long a request waits for a publication it needs (the first one, or a format first asked for)."""


class Published:
    """The latest publication: the pages and the verdicts, and how long ago it came."""

    def __init__(self, connection: Connection, stale_seconds: float, failures: Failures) -> None:
        self.connection = connection
        self.stale_seconds = stale_seconds
        self.failures = failures
        self.pages = Pages()
        self.verdicts = {"healthy": (False, ""), "ready": (False, "")}
        self.at: float | None = None  # time.monotonic() of the latest publication
        self.changed = threading.Condition()
        self._sending = threading.Lock()
        self.reloads: dict[int, tuple[bool, str]] = {}
        """The daemon's answers to the reloads asked for, by number, until the request that asked reads its own."""
        self._asked = 0

    def send(self, message: tuple[Any, ...]) -> None:
        with self._sending:
            self.connection.send(message)

    def receive(self) -> None:
        """Apply each publication and acknowledge it, until the daemon says stop or is gone."""
        while True:
            try:
                message = self.connection.recv()
            except (EOFError, OSError):
                return
            if message[0] == "reloaded":
                _, number, answer = message
                with self.changed:
                    self.reloads[number] = answer
                    self.changed.notify_all()
                continue
            if message[0] != "publish":
                return  # "stop"
            _, seq, snapshot, live, healthy, ready = message
            self.pages.apply(snapshot, live)
            with self.changed:
                self.verdicts = {"healthy": healthy, "ready": ready}
                self.at = time.monotonic()
                self.changed.notify_all()
            try:
                self.send(("ack", (seq, self.failures.totals())))
            except OSError:
                return

    def _verdict(self, which: str) -> tuple[bool, str]:
        with self.changed:
            self.changed.wait_for(lambda: self.at is not None, WAIT_SECONDS)
            at, verdict = self.at, self.verdicts[which]
        if at is None:
            return False, "waiting for the daemon's first publication"
        age = time.monotonic() - at
        if age > self.stale_seconds:
            return False, (f"the daemon has published nothing for {age:.0f} s (limit {self.stale_seconds:g} s): "
                           "its main process is stuck")  # fmt: skip
        return verdict

    def reload(self) -> tuple[bool, str]:
        """Ask the daemon to reload its config, and wait for what it did."""
        with self.changed:
            self._asked += 1
            number = self._asked
        try:
            self.send(("reload", number))
        except OSError:
            return False, "the daemon is gone"
        with self.changed:
            self.changed.wait_for(lambda: number in self.reloads, RELOAD_WAIT_SECONDS)
            return self.reloads.pop(number, (False, f"no answer from the daemon in {RELOAD_WAIT_SECONDS:g} s"))

    def healthy(self) -> tuple[bool, str]:
        return self._verdict("healthy")

    def ready(self) -> tuple[bool, str]:
        return self._verdict("ready")

    def page(self, accept_encoding: str, accept: str) -> Page | str:
        """The published page for the request; a format not published yet is asked for, and waited for."""
        kind = choose_encoder(accept)[1]
        page = self.pages.get(kind, accept_encoding)
        if page is not None:
            return page
        if len(self.pages.formats()) >= MAX_FORMATS:  # the daemon renders no more formats: the default one
            kind, accept = DEFAULT_CONTENT_TYPE, ""
        try:
            self.send(("want", accept))
        except OSError:
            return "the daemon is gone"
        with self.changed:
            self.changed.wait_for(lambda: self.pages.get(kind, accept_encoding) is not None, WAIT_SECONDS)
        return self.pages.get(kind, accept_encoding) or f"metrics in {kind} are not published yet: retry"


def main(argv: list[str]) -> int:
    # Ctrl-C, and a SIGTERM to the whole process group (systemd's default, kill -- -PGID), reach us with the daemon,
    # which stops us in its own shutdown (and the kernel kills us if it dies): not our exit, nor a worker to restart
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, signal.SIG_IGN)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    connection = Connection(int(argv[1]))
    listening = socket.socket(fileno=int(argv[2]))
    die_with_parent()
    if len(argv) > 3 and not alive(int(argv[3])):  # it died before the signal was asked for: nobody would send it
        return 0
    try:
        _, model_id, web_config, lifecycle, stale_seconds = connection.recv()
    except (EOFError, OSError):
        return 0
    try:
        guard = Guard(web_config)
    except WebConfigError as exc:  # the daemon checked the files at start: they changed since
        log.error("%s", exc)
        return 2
    published = Published(connection, stale_seconds, guard.failures)
    app = make_app(published.page, model_id, published.healthy, published.ready, guard,
                   published.reload if lifecycle else None,
                   lambda: published.pages.document(EXPLANATIONS))  # fmt: skip
    server = HttpServer(app, listening, guard)
    server.start()
    published.receive()  # until the daemon stops us or is gone
    server.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
