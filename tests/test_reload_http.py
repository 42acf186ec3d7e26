"""Reload without a restart through the command line, as an operator triggers it: POST /-/reload (with
--web.enable-lifecycle, behind the same access rules as every path) and SIGHUP, with the file watch off."""

from __future__ import annotations

import base64
import signal
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import bcrypt
import pytest
import yaml
from daemon_fixture import scrape, wait_for

from exporter.devtools.embedded_broker import EmbeddedBroker, free_port

GENDER = {"name": "gender", "groups": ["male", "female"]}


def write(path: Path, bootstrap: str, topic: str, port: int, models: list[str], **extra: Any) -> None:
    path.write_text(yaml.safe_dump({
        "kafka": {"bootstrap_servers": bootstrap, "topic": topic, "assignment": "manual"},
        "listen": {"address": "127.0.0.1", "port": port}, "evaluation_interval": "1s", "windows": ["1h"],
        "protected_attributes": [GENDER], "models": [{"model_id": m} for m in models], **extra}))  # fmt: skip


def request(port: int, method: str, path: str = "/-/reload", user: str | None = None) -> tuple[int, str]:
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", method=method)
    if user:
        req.add_header("Authorization", "Basic " + base64.b64encode(f"{user}:secret".encode()).decode())
    try:
        with urllib.request.urlopen(req, timeout=40) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()
    except OSError:  # not listening yet
        return 0, ""


def models(port: int) -> set[str]:
    return {dict(labels)["model_id"] for (name, labels), _ in scrape(port).items() if name == "fairness_model_info"}


@pytest.fixture
def serve(tmp_path: Path) -> Iterator[Any]:
    started: list[subprocess.Popen[bytes]] = []

    def start(config: Path, *flags: str) -> subprocess.Popen[bytes]:
        process = subprocess.Popen([sys.executable, "-m", "exporter.cli", "serve", "--config", str(config),
                                    "--config.watch-interval", "0", *flags],
                                   stdout=(tmp_path / "daemon.log").open("ab"), stderr=subprocess.STDOUT)  # fmt: skip
        started.append(process)
        return process

    yield start
    for process in started:
        process.terminate()
        process.wait(20)


def test_post_reload_applies_a_new_config_and_answers_500_for_one_it_refuses(
    kafka_broker: EmbeddedBroker, topic: str, tmp_path: Path, serve: Any
) -> None:
    port, config = free_port(), tmp_path / "fleet.yaml"
    write(config, kafka_broker.bootstrap_servers, topic, port, ["a", "b"])
    serve(config, "--web.enable-lifecycle")
    wait_for(lambda: _up(port) and models(port) == {"a", "b"}, what="the daemon with models a and b")
    assert request(port, "GET")[0] == 405
    write(config, kafka_broker.bootstrap_servers, topic, port, ["a", "c"])
    assert models(port) == {"a", "b"}  # the file watch is off: nothing changes until asked
    assert request(port, "POST") == (200, "ok: added c; removed b; unchanged a\n")
    assert models(port) == {"a", "c"}
    config.write_text("models: [{model_id: broken}]\n")
    status, body = request(port, "PUT")
    assert status == 500 and body.startswith("refused: ") and "protected_attributes: required" in body
    assert models(port) == {"a", "c"}  # the running config stays


def test_without_lifecycle_there_is_no_reload_endpoint_and_sighup_reloads(
    kafka_broker: EmbeddedBroker, topic: str, tmp_path: Path, serve: Any
) -> None:
    port, config = free_port(), tmp_path / "fleet.yaml"
    write(config, kafka_broker.bootstrap_servers, topic, port, ["a"])
    daemon = serve(config)
    wait_for(lambda: _up(port) and models(port) == {"a"}, what="the daemon with model a")
    assert request(port, "POST")[0] == 405  # only GET and HEAD are served: no lifecycle endpoint
    write(config, kafka_broker.bootstrap_servers, topic, port, ["a", "b"])
    daemon.send_signal(signal.SIGHUP)
    wait_for(lambda: models(port) == {"a", "b"}, what="SIGHUP to reload the config")


def test_reload_is_behind_the_web_configs_rules(kafka_broker: EmbeddedBroker, topic: str, tmp_path: Path,
                                                serve: Any) -> None:  # fmt: skip
    port, config = free_port(), tmp_path / "fleet.yaml"
    write(config, kafka_broker.bootstrap_servers, topic, port, ["a"])
    web = tmp_path / "web.yaml"
    web.write_text(yaml.safe_dump({"basic_auth_users": {"operator": bcrypt.hashpw(b"secret", bcrypt.gensalt(4))
                                                        .decode()}, "auth_excluded_paths": ["/healthz"]}))
    serve(config, "--web.enable-lifecycle", "--web.config.file", str(web))
    wait_for(lambda: request(port, "GET", "/healthz")[0] == 200, what="the daemon")
    assert request(port, "POST")[0] == 401
    write(config, kafka_broker.bootstrap_servers, topic, port, ["a", "b"])
    assert request(port, "POST", user="operator") == (200, "ok: added b; unchanged a\n")


def _up(port: int) -> bool:
    try:
        scrape(port)
        return True
    except OSError:
        return False
