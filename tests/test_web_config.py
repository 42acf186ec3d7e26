"""Who may read /metrics (issue 24 item 5): the exporter-toolkit web configuration file (``--web.config.file``) on
the real HTTP worker process, scraped by a real Prometheus through basic auth and through mutual TLS. A wrong
password or certificate gets a 401 or a failed handshake, is counted on /metrics, and holds up no other request.
"""

from __future__ import annotations

import base64
import subprocess
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

import bcrypt
import pytest
import yaml
from daemon_config import make_config
from daemon_fixture import wait_for
from prometheus_client import CollectorRegistry, Counter
from prometheus_client.parser import text_string_to_metric_families
from prometheus_fixture import PrometheusServer, wait_until
from tooling import require_binary

from exporter.cli import main
from exporter.daemon import Daemon
from exporter.health.counters import Health
from exporter.serve.collector import CachedExposition
from exporter.serve.http import bind
from exporter.serve.http_worker import HttpWorker
from exporter.serve.web_config import WebConfig, WebConfigError, load

PASSWORD = "s3cret scraper"
# Cost 4, bcrypt's least: the tests check hundreds of passwords; the flood test makes its own slow hash.
HASH = bcrypt.hashpw(PASSWORD.encode(), bcrypt.gensalt(4)).decode()


def openssl(*args: str) -> None:
    subprocess.run([require_binary("openssl"), *args], check=True, capture_output=True)


def signed(directory: Path, name: str, ca: str, subject: str, extensions: str) -> dict[str, str]:
    """A key and a certificate for ``subject`` signed by the CA ``ca`` (its .crt and .key in ``directory``)."""
    key, csr, crt, ext = (directory / f"{name}.{s}" for s in ("key", "csr", "crt", "ext"))
    openssl("req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes", "-subj", subject,
            "-keyout", str(key), "-out", str(csr))  # fmt: skip
    ext.write_text(extensions)
    openssl("x509", "-req", "-in", str(csr), "-CA", str(directory / f"{ca}.crt"), "-CAkey",
            str(directory / f"{ca}.key"), "-CAcreateserial", "-days", "1", "-extfile", str(ext), "-out", str(crt))
    return {"cert": str(crt), "key": str(key)}


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, str]]:
    """A CA, the server's certificate (127.0.0.1), a client certificate of that CA and one of another CA."""
    directory = tmp_path_factory.mktemp("pki")
    for ca in ("ca", "rogue-ca"):
        openssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes", "-days", "1",
                "-subj", f"/CN={ca}", "-addext", "basicConstraints=critical,CA:TRUE",
                "-addext", "keyUsage=critical,keyCertSign", "-keyout", str(directory / f"{ca}.key"),
                "-out", str(directory / f"{ca}.crt"))  # fmt: skip
    client = "extendedKeyUsage=clientAuth\nsubjectAltName=DNS:prometheus.monitoring\n"
    return {"ca": {"cert": str(directory / "ca.crt")},
            "server": signed(directory, "server", "ca", "/CN=127.0.0.1",
                             "extendedKeyUsage=serverAuth\nsubjectAltName=IP:127.0.0.1\n"),
            "client": signed(directory, "client", "ca", "/CN=prometheus", client),
            "rogue": signed(directory, "rogue", "rogue-ca", "/CN=prometheus", client)}  # fmt: skip


def web_file(directory: Path, **sections: object) -> str:
    path = directory / "web.yml"
    path.write_text(yaml.safe_dump(sections))
    return str(path)


@pytest.fixture
def served() -> Iterator[Callable[[WebConfig], HttpWorker]]:
    """The HTTP worker process under a web configuration, fed a registry with the daemon's own counters."""
    workers: list[HttpWorker] = []

    def start(web: WebConfig) -> HttpWorker:
        registry = CollectorRegistry()
        health = Health(registry)
        Counter("demo_events", "Events.", registry=registry).inc(3)
        worker = HttpWorker(bind("127.0.0.1", 0), CachedExposition("1s"), registry,
                            (lambda: (True, "running"), lambda: (True, "serving")), ("m1", web),
                            health.http_worker_restarts, health.http_auth_failures)  # fmt: skip
        worker.start()
        assert worker.publish()
        workers.append(worker)
        return worker

    yield start
    for worker in workers:
        worker.stop()


def get(url: str, user: str | None = None, password: str = "", context: object = None, timeout: float = 10) -> int:
    request = urllib.request.Request(url)
    if user is not None:
        request.add_header("Authorization", "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode())
    try:
        with urllib.request.urlopen(request, timeout=timeout, context=context) as response:  # type: ignore[arg-type]
            return int(response.status)
    except urllib.error.HTTPError as err:
        return err.code


def refused(port: int, scheme: str = "http", **auth: object) -> dict[str, float]:
    """fairness_exporter_http_auth_failures_total by reason, as /metrics serves it (read with credentials)."""
    request = urllib.request.Request(f"{scheme}://127.0.0.1:{port}/metrics")
    if "user" in auth:
        request.add_header("Authorization", "Basic " + base64.b64encode(f"{auth['user']}:{PASSWORD}".encode()).decode())
    with urllib.request.urlopen(request, timeout=10, context=auth.get("context")) as response:  # type: ignore[arg-type]
        text = response.read().decode()
    return {s.labels["reason"]: s.value for f in text_string_to_metric_families(text) for s in f.samples
            if s.name == "fairness_exporter_http_auth_failures_total"}  # fmt: skip


def target_health(prometheus: PrometheusServer, job: str) -> tuple[str, str] | None:
    for target in prometheus.active_targets():
        if target["labels"]["job"] == job and target["health"] != "unknown":
            return target["health"], target["lastError"]
    return None


def test_prometheus_scrapes_through_basic_auth_and_a_wrong_password_is_refused_and_counted(
    tmp_path: Path, served: Callable[[WebConfig], HttpWorker]
) -> None:
    web = load(web_file(tmp_path, basic_auth_users={"prometheus": HASH}, auth_excluded_paths=["/healthz", "/readyz"]))
    worker = served(web)
    jobs = {"fairness-exporter": {"basic_auth": {"username": "prometheus", "password": PASSWORD}},
            "wrong-password": {"basic_auth": {"username": "prometheus", "password": "guess"}},
            "no-password": {}}  # fmt: skip
    with PrometheusServer(tmp_path, [f"127.0.0.1:{worker.port}"], jobs=jobs) as prometheus:
        for job, health in (("fairness-exporter", "up"), ("wrong-password", "down"), ("no-password", "down")):
            seen = wait_until(lambda job=job: target_health(prometheus, job), 30, f"a scrape by {job}")
            assert seen[0] == health, (job, seen)
            assert health == "up" or "401 Unauthorized" in seen[1], seen
        wait_until(lambda: prometheus.query('demo_events_total{job="fairness-exporter"}'), 30, "the scraped sample")
    wait_for(lambda: min(refused(worker.port, user="prometheus")[r] for r in ("wrong_password", "no_credentials")),
             what="the refused scrapes counted on /metrics (within a publication)")  # fmt: skip
    assert refused(worker.port, user="prometheus")["unknown_user"] == 0
    base = f"http://127.0.0.1:{worker.port}"
    assert get(f"{base}/healthz") == get(f"{base}/readyz") == 200  # excluded: the kubelet sends no password
    assert get(f"{base}/metrics", "nobody", PASSWORD) == get(f"{base}/", "prometheus", "guess") == 401
    assert get(f"{base}/metrics", "prometheus", "x" * 100) == 401  # longer than bcrypt reads: refused, no error
    wait_for(lambda: refused(worker.port, user="prometheus")["unknown_user"] == 1, what="the unknown user counted")


def test_prometheus_scrapes_through_mutual_tls_and_other_certificates_fail_the_handshake(
    tmp_path: Path, pki: dict[str, dict[str, str]], served: Callable[[WebConfig], HttpWorker]
) -> None:
    import ssl

    web = load(web_file(tmp_path, tls_server_config={
        "cert_file": pki["server"]["cert"], "key_file": pki["server"]["key"],
        "client_auth_type": "RequireAndVerifyClientCert", "client_ca_file": pki["ca"]["cert"]}))  # fmt: skip
    worker = served(web)
    tls = {"ca_file": pki["ca"]["cert"]}
    jobs = {"fairness-exporter": {"scheme": "https", "tls_config": {
                **tls, "cert_file": pki["client"]["cert"], "key_file": pki["client"]["key"]}},
            "rogue-certificate": {"scheme": "https", "tls_config": {
                **tls, "cert_file": pki["rogue"]["cert"], "key_file": pki["rogue"]["key"]}},
            "no-certificate": {"scheme": "https", "tls_config": tls}}  # fmt: skip
    with PrometheusServer(tmp_path, [f"127.0.0.1:{worker.port}"], jobs=jobs) as prometheus:
        for job, health in (("fairness-exporter", "up"), ("rogue-certificate", "down"), ("no-certificate", "down")):
            seen = wait_until(lambda job=job: target_health(prometheus, job), 30, f"a scrape by {job}")
            assert seen[0] == health, (job, seen)
            # TLS 1.3: the client has sent its request when the server refuses its certificate: a TLS alert or reset
            assert health == "up" or any(w in seen[1].lower() for w in ("tls", "certificate", "reset")), seen
    mine = ssl.create_default_context(cafile=pki["ca"]["cert"])
    mine.load_cert_chain(pki["client"]["cert"], pki["client"]["key"])
    wait_for(lambda: min(refused(worker.port, "https", context=mine)[r] for r in (
        "client_certificate_invalid", "client_certificate_missing")), what="the refused handshakes counted")
    bare = ssl.create_default_context(cafile=pki["ca"]["cert"])  # no client certificate: not even the probes
    with pytest.raises(OSError):
        get(f"https://127.0.0.1:{worker.port}/healthz", context=bare)


def test_with_excluded_paths_the_probes_need_no_certificate_and_metrics_still_does(
    tmp_path: Path, pki: dict[str, dict[str, str]], served: Callable[[WebConfig], HttpWorker]
) -> None:
    """The kubelet presents no client certificate: the handshake asks for one and verifies what it gets, and each
    request outside auth_excluded_paths needs a verified one."""
    import ssl

    web = load(web_file(tmp_path, auth_excluded_paths=["/healthz", "/readyz"], tls_server_config={
        "cert_file": pki["server"]["cert"], "key_file": pki["server"]["key"],
        "client_auth_type": "RequireAndVerifyClientCert", "client_ca_file": pki["ca"]["cert"],
        "client_allowed_sans": ["prometheus.monitoring"]}))  # fmt: skip
    worker = served(web)
    base = f"https://127.0.0.1:{worker.port}"
    bare = ssl.create_default_context(cafile=pki["ca"]["cert"])
    assert get(f"{base}/healthz", context=bare) == get(f"{base}/readyz", context=bare) == 200
    assert get(f"{base}/metrics", context=bare) == 401
    mine = ssl.create_default_context(cafile=pki["ca"]["cert"])
    mine.load_cert_chain(pki["client"]["cert"], pki["client"]["key"])
    assert get(f"{base}/metrics", context=mine) == 200
    rogue = ssl.create_default_context(cafile=pki["ca"]["cert"])
    rogue.load_cert_chain(pki["rogue"]["cert"], pki["rogue"]["key"])
    with pytest.raises(OSError):  # a certificate given is verified in the handshake, even for a probe
        get(f"{base}/healthz", context=rogue)
    wait_for(lambda: refused(worker.port, "https", context=mine)["client_certificate_missing"] == 1,
             what="the request without a certificate counted")  # fmt: skip


def test_a_flood_of_wrong_passwords_holds_up_neither_a_known_scraper_nor_the_probes(
    tmp_path: Path, served: Callable[[WebConfig], HttpWorker]
) -> None:
    """Each wrong password costs a bcrypt check (cost 12 here, a third of a second), one at a time; a scraper whose
    password was verified once, and the excluded probes, are served meanwhile. Checked by order, not by time:
    both are answered while most of the flood still waits."""
    slow = bcrypt.hashpw(PASSWORD.encode(), bcrypt.gensalt(12)).decode()
    worker = served(load(web_file(tmp_path, basic_auth_users={"prometheus": slow}, auth_excluded_paths=["/healthz"])))
    base = f"http://127.0.0.1:{worker.port}"
    assert get(f"{base}/metrics", "prometheus", PASSWORD) == 200  # verified once: kept
    answered: list[str] = []
    lock = threading.Lock()

    def guess(i: int) -> None:  # the last of 12 serial bcrypt checks can wait past 10 s on a loaded machine
        code = get(f"{base}/metrics", "prometheus", f"guess {i}", timeout=60)
        with lock:
            answered.append(f"guess {code}")

    flood = [threading.Thread(target=guess, args=(i,)) for i in range(12)]
    for thread in flood:
        thread.start()
    time.sleep(0.2)  # the flood is queued on bcrypt
    for name, code in (("scrape", get(f"{base}/metrics", "prometheus", PASSWORD)), ("probe", get(f"{base}/healthz"))):
        with lock:
            answered.append(f"{name} {code}")
    for thread in flood:
        thread.join()
    assert answered.index("scrape 200") < 6 and answered.index("probe 200") < 6, answered
    assert answered.count("guess 401") == 12
    wait_for(lambda: refused(worker.port, user="prometheus")["wrong_password"] == 12, what="every guess counted")


def test_a_changed_web_configuration_is_served_to_the_next_request(
    tmp_path: Path, served: Callable[[WebConfig], HttpWorker]
) -> None:
    path = web_file(tmp_path, basic_auth_users={"prometheus": HASH})
    worker = served(load(path))
    url = f"http://127.0.0.1:{worker.port}/metrics"
    assert get(url, "grafana", PASSWORD) == 401
    web_file(tmp_path, basic_auth_users={"prometheus": HASH, "grafana": HASH})
    wait_for(lambda: get(url, "grafana", PASSWORD) == 200, what="the added user let in")
    Path(path).write_text("basic_auth_users: {grafana: plaintext}\n")  # cannot be served: the last good one is
    time.sleep(1.5)
    assert get(url, "grafana", PASSWORD) == 200


def test_every_problem_of_a_web_configuration_is_one_line_and_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = web_file(tmp_path, basic_auth_users={"alice": "hunter2"}, rate_limit={"interval": "soon"},
                    auth_excluded_paths=["healthz"], http_server_config={"headers": {"Server": "x"}},
                    tls_server_config={"cert_file": "cert.pem", "key_file": "key.pem",
                                       "client_auth_type": "RequireAnyClientCert", "cipher_suites": ["TLS_AES"]},
                    basic_auth_user={"bob": HASH})  # fmt: skip
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump({"model_id": "m1", "protected_attributes": [{"name": "g", "groups": ["a", "b"]}],
                                      "kafka": {"bootstrap_servers": "127.0.0.1:1", "topic": "t"}}))  # fmt: skip
    assert main(["serve", "--config", str(config), "--web.config.file", path]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert lines[0] == f"fairness-exporter serve: --web.config.file {path}: invalid web configuration:"
    problems = [line.strip() for line in lines[1:]]
    assert problems == [
        "basic_auth_user: unknown key (accepted: auth_excluded_paths, basic_auth_users, http_server_config, "
        "rate_limit, tls_server_config)",
        "tls_server_config.cipher_suites: not supported (Go's suite names are not mapped: OpenSSL's default suites "
        "are used); remove it",
        "tls_server_config.client_auth_type: 'RequireAnyClientCert' accepts certificates nobody verifies, which "
        "prove nothing (accepted: NoClientCert, VerifyClientCertIfGiven, RequireAndVerifyClientCert)",
        "basic_auth_users.alice: not a bcrypt hash (make one with htpasswd -nBC 10 \"\" | tr -d ':\\n')",
        "auth_excluded_paths: 'healthz' is not a path (e.g. /healthz)",
        "http_server_config.headers.Server: cannot be set (accepted: Strict-Transport-Security, "
        "X-Content-Type-Options, X-Frame-Options, X-XSS-Protection, Content-Security-Policy)",
        "rate_limit.interval: 'soon' is not a duration (e.g. 1s, 100ms, 0)",
    ]
    with pytest.raises(WebConfigError, match=r"tls_server_config.key_file: .*key.pem: No such file or directory"):
        load(web_file(tmp_path, tls_server_config={"cert_file": "web.yml", "key_file": "key.pem"}))


def test_the_configs_tls_files_still_serve_tls_and_cannot_be_doubled_by_the_web_configuration(
    tmp_path: Path, pki: dict[str, dict[str, str]]
) -> None:
    listen = {"address": "127.0.0.1", "port": 0, "tls_cert_file": pki["server"]["cert"],
              "tls_key_file": pki["server"]["key"]}  # fmt: skip
    users = web_file(tmp_path, basic_auth_users={"prometheus": HASH})
    daemon = Daemon(make_config(listen=listen), web_config_file=users)  # TLS from the config, users from the file
    daemon.serve()
    try:
        import ssl

        context = ssl.create_default_context(cafile=pki["ca"]["cert"])
        url = f"https://127.0.0.1:{daemon.port}/"
        assert get(url, "prometheus", PASSWORD, context) == 200 and get(url, context=context) == 401
    finally:
        assert daemon.http is not None
        daemon.http.stop()
    both = web_file(tmp_path, tls_server_config={"cert_file": pki["server"]["cert"], "key_file": pki["server"]["key"]})
    with pytest.raises(WebConfigError, match=r"tls_server_config and the config's listen\.tls_cert_file both set"):
        Daemon(make_config(listen=listen), web_config_file=both).serve()


def test_the_containers_healthcheck_reads_healthz_over_http_and_over_tls(served: Callable[[WebConfig], HttpWorker],
                                                                          pki: dict[str, dict[str, str]],
                                                                          tmp_path: Path) -> None:  # fmt: skip
    from exporter.serve.healthcheck import healthy

    plain = served(WebConfig())  # no web configuration: plain HTTP, nobody asked for credentials
    assert healthy(plain.port) == (True, "ok: running")
    tls = served(load(web_file(tmp_path, tls_server_config={"cert_file": pki["server"]["cert"],
                                                             "key_file": pki["server"]["key"]})))  # fmt: skip
    assert healthy(tls.port) == (True, "ok: running")
    guarded = served(load(web_file(tmp_path, basic_auth_users={"prometheus": HASH})))
    assert healthy(guarded.port) == (False, "http: HTTP 401: unauthorized")  # exclude /healthz in the web config
    plain.stop()
    ok, why = healthy(plain.port)
    assert not ok and why.startswith("https: ")
