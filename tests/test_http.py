"""The HTTP edge: landing page, /healthz, /readyz, 404s, and TLS on the metrics port."""

from __future__ import annotations

import gzip
import ssl
import subprocess
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, Counter
from tooling import require_binary

from exporter.serve.collector import CachedExposition
from exporter.serve.http import HttpServer, make_app


def serve(ready: bool, **tls: str) -> HttpServer:
    registry = CollectorRegistry()
    Counter("demo_events", "Events.", registry=registry).inc(3)
    app = make_app(registry, CachedExposition("1s"), "model<&>",
                   healthy=lambda: (True, "consumer and scheduler running"),
                   ready=lambda: (ready, "waiting for the first computation" if not ready else "serving"))  # fmt: skip
    server = HttpServer(app, "127.0.0.1", 0, tls.get("cert"), tls.get("key"))
    server.start()
    return server


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
    openssl = require_binary("openssl")
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run([openssl, "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=127.0.0.1",
                    "-addext", "subjectAltName=IP:127.0.0.1", "-keyout", str(key), "-out", str(cert)],
                   check=True, capture_output=True)  # fmt: skip
    server = serve(ready=True, cert=str(cert), key=str(key))
    try:
        context = ssl.create_default_context(cafile=str(cert))
        status, body = get(f"https://127.0.0.1:{server.port}/metrics", context)
        assert status == 200 and "demo_events_total 3.0" in body
        with pytest.raises(urllib.error.URLError):
            get(f"https://127.0.0.1:{server.port}/metrics")  # an untrusted certificate is refused
    finally:
        server.stop()


def test_gzipped_page_is_the_plain_page_in_two_gzip_members() -> None:
    from daemon_config import make_config

    from exporter.serve.self_metrics import Health
    from exporter.serve.snapshot import Computer
    from exporter.stream.window import WindowStore

    config = make_config()
    registry = CollectorRegistry()
    exposition = CachedExposition("1s")
    Computer(config, WindowStore(config), Health(registry), on_snapshot=exposition.update).compute()
    plain, zipped = exposition.page(registry, ""), exposition.page(registry, "gzip, deflate")
    assert plain[1] is False and zipped[1] is True
    assert gzip.decompress(zipped[0]) == plain[0]  # one stream, as Prometheus' Go reader sees it
    text = plain[0].decode()
    assert "fairness_exporter_events_consumed_total 0.0" in text  # live health first
    assert 'model_subgroup_samples{attribute="gender",model_id="m1",subgroup="male",window="1h"} 0.0' in text
