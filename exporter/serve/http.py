"""The HTTP endpoints: /metrics (prometheus-client's WSGI app), a landing page, /healthz and /readyz."""

from __future__ import annotations

import html
import ssl
import threading
from collections.abc import Callable, Iterable
from socketserver import ThreadingMixIn
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from prometheus_client import CollectorRegistry
from prometheus_client.exposition import CONTENT_TYPE_PLAIN_0_0_4

from exporter import __version__
from exporter.serve.collector import CachedExposition


class _Server(ThreadingMixIn, WSGIServer):
    daemon_threads = True
    allow_reuse_address = True
    # socketserver's default backlog of 5 drops concurrent scrapers' connections, which retry a second later
    request_queue_size = 128


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        pass


def make_app(
    registry: CollectorRegistry, exposition: CachedExposition, model_id: str,
    healthy: Callable[[], tuple[bool, str]], ready: Callable[[], tuple[bool, str]],
) -> Callable[..., Iterable[bytes]]:  # fmt: skip
    """The WSGI application of the daemon: /metrics is the live registry plus the cached snapshot."""
    landing = (f"<html><head><title>fairness-exporter</title></head><body><h1>fairness-exporter {__version__}</h1>"
               f"<p>Monitoring model <b>{html.escape(model_id)}</b>.</p><ul><li><a href='/metrics'>/metrics</a></li>"
               "<li><a href='/healthz'>/healthz</a></li><li><a href='/readyz'>/readyz</a></li></ul></body></html>"
               ).encode()  # fmt: skip

    def app(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        path = environ.get("PATH_INFO", "/")
        if path == "/metrics":
            body, gzipped = exposition.page(registry, environ.get("HTTP_ACCEPT_ENCODING", ""))
            headers = [("Content-Type", CONTENT_TYPE_PLAIN_0_0_4), ("Content-Length", str(len(body)))]
            start_response("200 OK", [*headers, ("Content-Encoding", "gzip")] if gzipped else headers)
            return [body]
        if path in ("/healthz", "/readyz"):
            ok, why = (healthy if path == "/healthz" else ready)()
            start_response("200 OK" if ok else "503 Service Unavailable", [("Content-Type", "text/plain")])
            return [f"{'ok' if ok else 'not ok'}: {why}\n".encode()]
        if path == "/":
            start_response("200 OK", [("Content-Type", "text/html; charset=utf-8")])
            return [landing]
        start_response("404 Not Found", [("Content-Type", "text/plain")])
        return [b"not found: try /metrics\n"]

    return app


class HttpServer:
    """Serves the app on a background thread; optional TLS."""

    def __init__(self, app: Callable[..., Iterable[bytes]], address: str, port: int,
                 certfile: str | None = None, keyfile: str | None = None) -> None:  # fmt: skip
        self.server = make_server(address, port, app, server_class=_Server, handler_class=_QuietHandler)
        if certfile and keyfile:
            context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            context.load_cert_chain(certfile, keyfile)
            self.server.socket = context.wrap_socket(self.server.socket, server_side=True)
        self.port = self.server.server_port
        self.thread = threading.Thread(target=self.server.serve_forever, name="http", daemon=True)

    def start(self) -> None:
        self.thread.start()

    def stop(self) -> None:
        if self.thread.is_alive():  # shutdown() waits for serve_forever, forever if it never ran
            self.server.shutdown()
        self.server.server_close()
