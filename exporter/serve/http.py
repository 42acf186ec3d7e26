"""The HTTP endpoints: /metrics, a landing page, /healthz, /readyz and /explain; served in the HTTP worker process.

The daemon binds the socket (:func:`bind`, so that a bad address or a port in use stops it with one line) and checks
the web configuration (exporter.serve.web_config); the worker process (exporter.serve.worker) serves the app on
that socket, under the configuration's :class:`~exporter.serve.access.Guard`. Each connection is served on its own
thread; with TLS the handshake runs there too, bounded by a timeout, so a client that connects and sends nothing
holds one thread for a while and never the accept loop (which /healthz and every scrape go through).
"""

from __future__ import annotations

import errno
import html
import ipaddress
import json
import logging
import socket
import ssl
import threading
import urllib.parse
from collections.abc import Callable, Iterable
from socketserver import ThreadingMixIn
from typing import Any, Final
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer

from exporter import __version__
from exporter.serve.access import Guard, handshake_failure
from exporter.serve.exposition import Page
from exporter.serve.web_config import ListenError

log = logging.getLogger(__name__)
HANDSHAKE_TIMEOUT_SECONDS: Final = 10.0
REQUEST_TIMEOUT_SECONDS: Final = 30.0
ALLOWED_METHODS: Final = ("GET", "HEAD")
PEER_CERTIFICATE: Final = "exporter.peer_certificate"
"""The WSGI environ key of the client's verified certificate (as ``getpeercert()`` gives it; None without TLS)."""


class _Server(ThreadingMixIn, WSGIServer):
    daemon_threads = True
    allow_reuse_address = True
    # socketserver's default backlog of 5 drops concurrent scrapers' connections, which retry a second later
    request_queue_size = 128
    guard: Guard | None = None

    def finish_request(self, request: Any, client_address: Any) -> None:
        """On the connection's own thread: the TLS handshake, bounded by a timeout, then the request."""
        tls = self.guard.current()[0] if self.guard is not None else None
        if tls is None:
            super().finish_request(request, client_address)
            return
        request.settimeout(HANDSHAKE_TIMEOUT_SECONDS)
        try:
            connection = tls.wrap_socket(request, server_side=True)
        except OSError as exc:  # a bad or slow handshake (SSLError, timeout, reset) is this client's problem only
            assert self.guard is not None
            self.guard.failures.count(handshake_failure(exc))
            log.debug("TLS handshake with %s failed: %s", client_address, exc)
            return
        try:
            super().finish_request(connection, client_address)
        finally:
            self.shutdown_request(connection)

    def handle_error(self, request: Any, client_address: Any) -> None:
        log.debug("connection from %s failed", client_address, exc_info=True)


class _QuietHandler(WSGIRequestHandler):
    timeout = REQUEST_TIMEOUT_SECONDS  # a client that connects and never sends a request frees its thread
    wbufsize = -1  # the status line and headers leave in one segment with the body's start, not three writes
    disable_nagle_algorithm = True  # and none waits for the client's delayed ACK

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def get_environ(self) -> dict[str, Any]:
        environ = super().get_environ()
        connection = self.connection
        environ[PEER_CERTIFICATE] = connection.getpeercert() if isinstance(connection, ssl.SSLSocket) else None
        return environ


RELOAD_PATH: Final = "/-/reload"
RELOAD_METHODS: Final = ("POST", "PUT")


def make_app(
    pages: Callable[[str, str], Page | str], model_id: str,
    healthy: Callable[[], tuple[bool, str]], ready: Callable[[], tuple[bool, str]], guard: Guard | None = None,
    reload: Callable[[], tuple[bool, str]] | None = None,
    explained: Callable[[], bytes | None] | None = None,
) -> Callable[..., Iterable[bytes]]:  # fmt: skip
    """The WSGI application of the daemon. ``pages(accept_encoding, accept)`` is the /metrics page (the cached
    snapshot then the live registry), or why there is none yet (503). ``guard``: who may read (every path, the
    probes too, unless the web configuration excludes them). ``reload``: POST or PUT ``/-/reload`` reloads the
    config, as Prometheus does with ``--web.enable-lifecycle`` (200, or 500 with why it was refused); without it
    the path is not served. ``explained``: the latest snapshot's explanations (JSON), for ``GET /explain``."""
    landing = (f"<html><head><title>fairness-exporter</title></head><body><h1>fairness-exporter {__version__}</h1>"
               f"<p>Monitoring model <b>{html.escape(model_id)}</b>.</p><ul><li><a href='/metrics'>/metrics</a></li>"
               "<li><a href='/healthz'>/healthz</a></li><li><a href='/readyz'>/readyz</a></li></ul></body></html>"
               ).encode()  # fmt: skip

    def respond(path: str, environ: dict[str, Any]) -> tuple[str, list[tuple[str, str]], bytes]:
        if path == "/metrics":
            page = pages(environ.get("HTTP_ACCEPT_ENCODING", ""), environ.get("HTTP_ACCEPT", ""))
            if isinstance(page, str):
                return "503 Service Unavailable", [("Content-Type", "text/plain")], f"{page}\n".encode()
            headers = [("Content-Type", page.content_type), ("Vary", "Accept, Accept-Encoding")]
            return "200 OK", [*headers, ("Content-Encoding", "gzip")] if page.gzipped else headers, page.body
        if path in ("/healthz", "/readyz"):
            ok, why = (healthy if path == "/healthz" else ready)()
            text = f"{'ok' if ok else 'not ok'}: {why}\n".encode()
            return "200 OK" if ok else "503 Service Unavailable", [("Content-Type", "text/plain")], text
        if path == "/":
            return "200 OK", [("Content-Type", "text/html; charset=utf-8")], landing
        if path == EXPLAIN_PATH and explained is not None:
            status, body = explain_answer(explained(), environ.get("QUERY_STRING", ""))
            return status, [("Content-Type", "application/json")], body
        if path == RELOAD_PATH and reload is not None:
            if environ.get("REQUEST_METHOD") not in RELOAD_METHODS:
                return "405 Method Not Allowed", [("Content-Type", "text/plain"), ("Allow", "POST, PUT")], \
                    b"use POST or PUT to reload the config\n"  # fmt: skip
            applied, what = reload()
            return ("200 OK" if applied else "500 Internal Server Error"), [("Content-Type", "text/plain")], \
                f"{'ok' if applied else 'refused'}: {what}\n".encode()  # fmt: skip
        return "404 Not Found", [("Content-Type", "text/plain")], b"not found: try /metrics\n"

    def refused(path: str, environ: dict[str, Any]) -> tuple[str, list[tuple[str, str]], bytes] | None:
        """A 429 or 401 when the web configuration refuses the request; None to serve it."""
        if guard is None:
            return None
        access = guard.current()[1]
        if access.limited():
            return "429 Too Many Requests", [("Content-Type", "text/plain")], b"too many requests: retry later\n"
        reason = access.refusal(path, environ.get("HTTP_AUTHORIZATION", ""), environ.get(PEER_CERTIFICATE))
        if reason is None:
            return None
        guard.failures.count(reason)
        challenge = [("WWW-Authenticate", 'Basic realm="fairness-exporter"')] if access.config.users else []
        return "401 Unauthorized", [("Content-Type", "text/plain"), *challenge], b"unauthorized\n"

    def app(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        method, path = environ.get("REQUEST_METHOD", "GET"), environ.get("PATH_INFO", "/")
        extra = list(guard.current()[1].config.headers.items()) if guard is not None else []
        response = refused(path, environ)
        reloading = path == RELOAD_PATH and reload is not None  # its own methods, answered by respond()
        if response is None and method not in ALLOWED_METHODS and not reloading:
            response = ("405 Method Not Allowed", [("Content-Type", "text/plain"), ("Allow", "GET, HEAD")],
                        f"method {method} not allowed: use GET\n".encode())  # fmt: skip
        status, headers, body = response or respond(path, environ)
        start_response(status, [*headers, *extra, ("Content-Length", str(len(body)))])
        return [] if method == "HEAD" else [body]

    return app


def bind(address: str, port: int) -> socket.socket:
    """A listening TCP socket on the address and port; ListenError naming the field at fault."""
    try:
        family = socket.AF_INET6 if ipaddress.ip_address(address).version == 6 else socket.AF_INET
    except ValueError as exc:
        raise ListenError(f"listen.address: {address!r} is not an IP address (e.g. 0.0.0.0, 127.0.0.1, ::)") \
            from exc
    listening = socket.socket(family, socket.SOCK_STREAM)
    try:
        listening.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listening.bind((address, port))
        listening.listen(_Server.request_queue_size)
    except OSError as exc:
        listening.close()
        why = "is already in use" if exc.errno == errno.EADDRINUSE else f"cannot be bound: {exc.strerror}"
        raise ListenError(f"listen.address, listen.port: {address}:{port} {why}") from exc
    return listening


class HttpServer:
    """Serves the app on a listening socket (see :func:`bind`) on a background thread; TLS when the guard's web
    configuration says so."""

    def __init__(self, app: Callable[..., Iterable[bytes]], listening: socket.socket,
                 guard: Guard | None = None) -> None:  # fmt: skip
        self.server = _Server(listening.getsockname()[:2], _QuietHandler, bind_and_activate=False)
        self.server.socket.close()  # the one socketserver made; the bound one serves instead
        self.server.socket = listening
        self.server.server_address = listening.getsockname()
        host, port = listening.getsockname()[:2]
        self.server.server_name, self.server.server_port = host, port
        self.server.setup_environ()
        self.server.set_app(app)
        self.server.guard = guard
        self.port: int = self.server.server_port
        self.thread = threading.Thread(target=self.server.serve_forever, name="http", daemon=True)

    def start(self) -> None:
        self.thread.start()

    def stop(self) -> None:
        if self.thread.is_alive():  # shutdown() waits for serve_forever, forever if it never ran
            self.server.shutdown()
        self.server.server_close()


EXPLAIN_PATH = "/explain"


def explain_answer(document: bytes | None, query: str) -> tuple[str, bytes]:
    """``GET /explain?model=M&attribute=A&metric=X[&window=W]``: the explanations of one model's attribute and
    metric in a window (default: the longest), each as the gate's report writes it, with when the window and its
    baseline are and each segment column's rows under ``other`` in both (``segment_rows``); 404 naming what exists
    when the query names nothing explained."""
    asked = {k: v[-1] for k, v in urllib.parse.parse_qs(query).items()}
    models = json.loads(document) if document else {}
    missing = [k for k in ("model", "attribute", "metric") if k not in asked]
    if missing:
        return "400 Bad Request", json.dumps({"error": f"name {', '.join(missing)}: /explain?model=M&attribute=A"
                                                       f"&metric=X[&window=W]", "models": sorted(models)}).encode()
    windows = models.get(asked["model"])
    if windows is None:
        return "404 Not Found", json.dumps({"error": f"no explanations of model {asked['model']!r} (its config "
                                                    "has no segments, or no computation ran yet)",
                                            "models": sorted(models)}).encode()  # fmt: skip
    window = asked.get("window") or max(windows, key=lambda w: windows[w]["current"][1] - windows[w]["current"][0])
    if window not in windows:
        return "404 Not Found", json.dumps({"error": f"no window {window!r}", "windows": list(windows)}).encode()
    found = [e for e in windows[window]["explanations"]
             if e["attribute"] == asked["attribute"] and e["metric"] == asked["metric"]]  # fmt: skip
    if not found:
        return "404 Not Found", json.dumps({"error": f"no explanation of {asked['metric']!r} for attribute "
                                                    f"{asked['attribute']!r} (only difference metrics configured "
                                                    "for the model are explained)"}).encode()  # fmt: skip
    return "200 OK", json.dumps({"model_id": asked["model"], "window": window,
                                 "baseline": windows[window]["baseline"], "current": windows[window]["current"],
                                 "segment_rows": windows[window]["segment_rows"],
                                 "explanations": found}).encode()  # fmt: skip
