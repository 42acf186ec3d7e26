"""The HTTP edge, served by the real HTTP worker process: landing page, /healthz, /readyz, 404s, methods, gzip,
OpenMetrics and TLS on the metrics port; the worker's restart, its end with the daemon's, and /healthz failing when
the daemon stops publishing."""

from __future__ import annotations

import gzip
import http.client
import os
import signal
import socket
import ssl
import subprocess
import sys
import urllib.error
import urllib.request
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from daemon_fixture import sample, scrape, wait_for
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry, Counter
from prometheus_client.openmetrics.parser import text_string_to_metric_families
from prometheus_client.registry import Collector
from tooling import require_binary

from exporter.serve.collector import CachedExposition
from exporter.serve.exposition import Rendered, gzip_one_member
from exporter.serve.http import bind
from exporter.serve.http_worker import HttpWorker
from exporter.serve.web_config import WebConfig, from_listen


def worker(registry: CollectorRegistry, exposition: CachedExposition, model_id: str = "m1",
           healthy: Callable[[], tuple[bool, str]] = lambda: (True, "running"),
           ready: Callable[[], tuple[bool, str]] = lambda: (True, "serving"), stale_seconds: float = 30.0,
           tls: dict[str, str] | None = None) -> HttpWorker:  # fmt: skip
    """The HTTP worker process on a fresh port, fed as the daemon feeds it."""
    restarts = Counter("restarts", "Worker restarts.", registry=CollectorRegistry())
    refused = Counter("refused", "Refused.", ["reason"], registry=CollectorRegistry())
    web = from_listen(tls["cert"], tls["key"]) if tls else WebConfig()
    server = HttpWorker(bind("127.0.0.1", 0), exposition, registry, (healthy, ready), (model_id, web), restarts,
                        refused, stale_seconds)  # fmt: skip
    server.start()
    return server


def serve(ready: bool, **tls: str) -> HttpWorker:
    registry = CollectorRegistry()
    Counter("demo_events", "Events.", registry=registry).inc(3)
    return worker(registry, CachedExposition("1s"), "model<&>",
                  healthy=lambda: (True, "consumer and scheduler running"),
                  ready=lambda: (ready, "waiting for the first computation" if not ready else "serving"),
                  tls=tls or None)  # fmt: skip


def get(url: str, context: ssl.SSLContext | None = None) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=5, context=context) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode()


def test_endpoints() -> None:
    server = serve(ready=False)
    base = f"http://127.0.0.1:{server.port}"
    try:
        status, page = get(f"{base}/")
        assert status == 200 and "href='/metrics'" in page and "model&lt;&amp;&gt;" in page  # escaped model id
        assert get(f"{base}/metrics")[1].count("demo_events_total 3.0") == 1
        assert get(f"{base}/healthz") == (200, "ok: consumer and scheduler running\n")
        assert get(f"{base}/readyz") == (503, "not ok: waiting for the first computation\n")
        assert get(f"{base}/nope")[0] == 404
    finally:
        server.stop()


def test_tls_on_the_metrics_port(tmp_path: Path) -> None:
    tls = _self_signed(tmp_path)
    server = serve(ready=True, **tls)
    try:
        context = ssl.create_default_context(cafile=tls["cert"])
        status, body = get(f"https://127.0.0.1:{server.port}/metrics", context)
        assert status == 200 and "demo_events_total 3.0" in body
        with pytest.raises(urllib.error.URLError):
            get(f"https://127.0.0.1:{server.port}/metrics")  # an untrusted certificate is refused
    finally:
        server.stop()


def _computed_server() -> HttpWorker:
    """The real HTTP worker over a real snapshot of the test config (every fairness family present, zeros)."""
    from daemon_config import make_config

    from exporter.health.counters import Health
    from exporter.serve.snapshot import Computer
    from exporter.stream.state.fleet import Fleet

    registry = CollectorRegistry()
    exposition = CachedExposition("1s")
    server = worker(registry, exposition)
    Computer(Fleet(make_config()), Health(registry), on_snapshot=exposition.update).compute()
    assert server.publish()  # as the daemon does after each computation
    return server


def request(server: HttpWorker, method: str = "GET", path: str = "/metrics",
            **headers: str) -> tuple[http.client.HTTPResponse, bytes]:  # fmt: skip
    connection = http.client.HTTPConnection("127.0.0.1", server.port, timeout=10)
    try:
        connection.request(method, path, headers={k.replace("_", "-"): v for k, v in headers.items()})
        response = connection.getresponse()
        return response, response.read()
    finally:
        connection.close()


SAMPLES = 'model_subgroup_samples{attribute="gender",model_id="m1",subgroup="male",window="1h"} 0.0'


def test_gzipped_page_is_one_gzip_member_holding_the_whole_page() -> None:
    server = _computed_server()
    try:
        response, zipped = request(server, Accept_Encoding="gzip")
        plain = request(server)[1]
        assembled_here = server.exposition.page(server.registry, "").body  # as Daemon.metrics_page assembles it
    finally:
        server.stop()
    assert plain == assembled_here  # one path: the worker's page is the daemon's
    assert response.getheader("Content-Encoding") == "gzip"
    # a single-member decoder (curl --compressed, urllib3) reads the first member and stops there
    first_member = zlib.decompressobj(16 + zlib.MAX_WBITS)
    text = first_member.decompress(zipped)
    assert first_member.eof and first_member.unused_data == b""
    assert text == plain
    assert SAMPLES in text.decode()  # the cached fairness series, first
    assert "fairness_exporter_events_consumed_total 0.0" in text.decode()  # the live health, in the same member


@settings(max_examples=200, deadline=None)
@given(live=st.binary(max_size=5000), cached=st.binary(max_size=70_000) | st.just(b"x" * 200_000))
def test_a_cached_deflate_stream_and_a_live_part_join_into_one_gzip_member(live: bytes, cached: bytes) -> None:
    joined = gzip_one_member(Rendered.of(cached), live)
    first_member = zlib.decompressobj(16 + zlib.MAX_WBITS)
    assert first_member.decompress(joined) == cached + live  # the CRC-32 and length in the trailer are checked too
    assert first_member.eof and first_member.unused_data == b""


def test_openmetrics_is_served_when_asked_for() -> None:
    server = _computed_server()
    try:
        response, body = request(server, Accept="application/openmetrics-text; version=1.0.0; charset=utf-8")
        zipped_response, zipped = request(server, Accept="application/openmetrics-text", Accept_Encoding="gzip")
        text_response = request(server, Accept="text/plain;version=0.0.4")[0]
    finally:
        server.stop()
    assert response.getheader("Content-Type").startswith("application/openmetrics-text; version=1.0.0")
    assert text_response.getheader("Content-Type") == "text/plain; version=0.0.4; charset=utf-8"
    text = body.decode()
    assert text.endswith("\n# EOF\n") and text.count("# EOF") == 1  # one page, not two concatenated
    families = {f.name: f for f in text_string_to_metric_families(text)}  # the OpenMetrics parser accepts it
    assert families["fairness_exporter_events_consumed"].type == "counter"
    samples = [s for s in families["model_subgroup_samples"].samples
               if s.labels == {"attribute": "gender", "model_id": "m1", "subgroup": "male", "window": "1h"}]
    assert [s.value for s in samples] == [0.0]
    assert gzip.decompress(zipped) == body and zipped_response.getheader("Content-Encoding") == "gzip"


def test_head_has_no_body_and_other_methods_are_refused() -> None:
    server = _computed_server()
    try:
        with socket.create_connection(("127.0.0.1", server.port), timeout=10) as raw:  # http.client reads no body
            raw.sendall(b"HEAD /metrics HTTP/1.0\r\n\r\n")                          # after HEAD, whatever is sent
            head = b"".join(iter(lambda: raw.recv(65536), b""))
        get_length = len(request(server)[1])
        post, post_body = request(server, "POST")
        delete = request(server, "DELETE", "/healthz")[0]
    finally:
        server.stop()
    headers, _, body = head.partition(b"\r\n\r\n")
    assert headers.startswith(b"HTTP/1.0 200 OK") and body == b""
    assert f"Content-Length: {get_length}".encode() in headers
    assert post.status == 405 and post.getheader("Allow") == "GET, HEAD" and b"POST" in post_body
    assert delete.status == 405


def _self_signed(tmp_path: Path) -> dict[str, str]:
    openssl = require_binary("openssl")
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run([openssl, "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=127.0.0.1",
                    "-addext", "subjectAltName=IP:127.0.0.1", "-keyout", str(key), "-out", str(cert)],
                   check=True, capture_output=True)  # fmt: skip
    return {"cert": str(cert), "key": str(key)}


def test_an_idle_connection_does_not_hold_up_tls_probes(tmp_path: Path) -> None:
    tls = _self_signed(tmp_path)
    server = serve(ready=True, **tls)
    idle = socket.create_connection(("127.0.0.1", server.port))  # connects, never sends a ClientHello
    try:
        context = ssl.create_default_context(cafile=tls["cert"])
        for path in ("/healthz", "/metrics"):  # before the fix both timed out while the idle client stayed
            status, body = get(f"https://127.0.0.1:{server.port}{path}", context)
            assert status == 200 and body.startswith("ok:" if path == "/healthz" else "# HELP")
    finally:
        idle.close()
        server.stop()


def _alive(pid: int) -> bool:
    """The process exists and is not a zombie (an exited child nobody reaped yet)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError):
        return False


def test_a_killed_worker_is_restarted_on_the_same_port_and_counted() -> None:
    from daemon_config import make_config

    from exporter.daemon import Daemon

    daemon = Daemon(make_config(), registry=CollectorRegistry())
    daemon.serve()
    try:
        daemon.computer.compute()
        first = daemon.http.pid if daemon.http else None
        assert first is not None and sample(scrape(daemon.port), "fairness_exporter_http_worker_restarts_total") == 0
        os.kill(first, signal.SIGKILL)
        wait_for(lambda: daemon.http is not None and daemon.http.pid != first, 30, "a new worker")
        wait_for(lambda: _scrapes(daemon.port), 30, "the new worker serving")
        samples = scrape(daemon.port)
        assert sample(samples, "fairness_exporter_http_worker_restarts_total") == 1
        assert sample(samples, "model_subgroup_samples", model_id="m1", attribute="gender", window="1h",
                      subgroup="overall") == 0  # the snapshot is published to the new worker too
    finally:
        daemon.stop()
    assert not _alive(first)
    assert daemon.http is not None and daemon.http.pid is not None and not _alive(daemon.http.pid)


def _scrapes(port: int) -> bool:
    try:
        return get(f"http://127.0.0.1:{port}/metrics")[0] == 200
    except OSError:
        return False


DAEMON = """
import sys, time
sys.path.insert(0, sys.argv[1])
from daemon_config import make_config
from prometheus_client import CollectorRegistry
from exporter.daemon import Daemon
daemon = Daemon(make_config(), registry=CollectorRegistry())
daemon.serve()
print(daemon.port, daemon.http.pid, flush=True)
time.sleep(600)
"""


def test_the_worker_exits_when_the_daemon_is_killed() -> None:
    parent = subprocess.Popen([sys.executable, "-c", DAEMON, str(Path(__file__).parent)], stdout=subprocess.PIPE,
                              text=True)  # fmt: skip
    try:
        assert parent.stdout is not None
        port, pid = map(int, parent.stdout.readline().split())
        assert get(f"http://127.0.0.1:{port}/healthz")[0] == 503  # served (no consumer runs in this daemon)
        parent.kill()  # SIGKILL: no stop(), no goodbye; the worker sees the end of its connection
        parent.wait()
        wait_for(lambda: not _alive(pid), 30, "the worker to exit")
    finally:
        if parent.poll() is None:
            parent.kill()
            parent.wait()


class _Wedged(Collector):
    """A collector that blocks while ``wedged`` is set: the daemon's publisher stuck, as in a wedged process."""

    def __init__(self) -> None:
        import threading

        self.wedged = threading.Event()
        self.free = threading.Event()

    def collect(self) -> Iterator[object]:  # type: ignore[override]
        if self.wedged.is_set():
            self.free.wait(60)
        return iter(())


def test_healthz_fails_when_the_daemon_stops_publishing() -> None:
    registry = CollectorRegistry()
    wedge = _Wedged()
    registry.register(wedge)
    server = worker(registry, CachedExposition("1s"), stale_seconds=1.0)
    base = f"http://127.0.0.1:{server.port}"
    try:
        assert get(f"{base}/healthz") == (200, "ok: running\n")
        assert get(f"{base}/metrics")[0] == 200  # from now on, each publication renders the registry
        wedge.wedged.set()  # the next publication never finishes
        wait_for(lambda: get(f"{base}/healthz")[0] == 503, 30, "/healthz to fail")
        status, why = get(f"{base}/healthz")
        assert status == 503
        assert why.startswith("not ok: the daemon has published nothing for ") and "its main process is stuck" in why
        assert get(f"{base}/readyz")[0] == 503
        wedge.wedged.clear()
        wedge.free.set()
        wait_for(lambda: get(f"{base}/healthz") == (200, "ok: running\n"), 30, "/healthz to recover")
    finally:
        wedge.free.set()
        server.stop()
