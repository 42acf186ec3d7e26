"""A SIGTERM to the daemon's whole process group (systemd's default, ``kill -- -PGID``) stops it as quietly as one to
the daemon alone: no ERROR on the way out, exit 0, no process left behind."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import yaml
from daemon_fixture import GROUPS, kafka_config, probe, wait_for

from exporter.devtools.embedded_broker import EmbeddedBroker, free_port


def _group_gone(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return True
    return False


def test_a_sigterm_to_the_whole_process_group_stops_quietly(kafka_broker: EmbeddedBroker, topic: str,
                                                            tmp_path: Path, client_library: str) -> None:  # fmt: skip
    """Before: the HTTP worker died of the SIGTERM first, and the daemon logged "ERROR ... the HTTP worker process
    exited (signal 15); starting another" on its way out (3 of 3 times)."""
    port = free_port()
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump({
        "model_id": "m1", "protected_attributes": [{"name": k, "groups": v} for k, v in GROUPS.items()],
        "listen": {"address": "127.0.0.1", "port": port}, "checkpoint": {"path": str(tmp_path / "state")},
        **kafka_config(kafka_broker.bootstrap_servers, topic, client_library)}))  # fmt: skip
    log = tmp_path / "daemon.log"
    with log.open("wb") as out:
        daemon = subprocess.Popen([sys.executable, "-m", "exporter.cli", "serve", "--config", str(config)],
                                  stdout=out, stderr=subprocess.STDOUT, start_new_session=True)  # fmt: skip
    try:
        wait_for(lambda: probe(port, "/readyz")[0] == 200, what="the daemon ready")
        os.killpg(daemon.pid, signal.SIGTERM)
        assert daemon.wait(30) == 0
    finally:
        if daemon.poll() is None:
            os.killpg(daemon.pid, signal.SIGKILL)
            daemon.wait()
    wait_for(lambda: _group_gone(daemon.pid), 10, "every process of the group gone")
    text = log.read_text()
    assert "HTTP worker process exited" not in text and " ERROR " not in text, text
    assert (tmp_path / "state" / "fleet.checkpoint.npz").exists()  # the shutdown wrote its final checkpoint
