"""The HTTP worker process dies with its daemon, and a restarted daemon takes its port back from an orphan (issue 31
item 2). Before: a daemon SIGKILLed alone left its worker holding the port for up to two seconds, so a restart
within them exited 2 "listen.port ... is already in use" (2 of 6 tries, 5 of 10 in another run).

The daemons are real ``fairness-exporter serve`` processes; their broker is an address where nothing listens (the
consumer retries, /healthz answers: nothing here needs Kafka).
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from daemon_fixture import probe
from prometheus_fixture import wait_until

from exporter.devtools.embedded_broker import free_port, terminate
from exporter.serve import web_config
from exporter.serve.http import bind
from exporter.serve.orphans import WORKER_MODULE, alive

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the parent-death signal is Linux's")
SOURCE_ROOT = str(Path(__file__).resolve().parents[1])


def _config(path: Path, port: int) -> Path:
    path.write_text(yaml.safe_dump({
        "model_id": "m1", "protected_attributes": [{"name": "gender", "groups": ["male", "female"]}],
        "kafka": {"bootstrap_servers": "127.0.0.1:1", "assignment": "manual"},
        "listen": {"address": "127.0.0.1", "port": port}}))  # fmt: skip
    return path


def _serve(config: Path, log: Path) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-m", "exporter.cli", "serve", "--config", str(config)],
                            stdout=subprocess.DEVNULL, stderr=log.open("wb"))  # fmt: skip


def _serving(process: subprocess.Popen[bytes], port: int, log: Path) -> bool:
    assert process.poll() is None, f"the daemon exited {process.returncode}: {log.read_text()[-2000:]}"
    return probe(port, "/healthz")[0] == 200


def _workers_of(pid: int) -> list[int]:
    """The HTTP worker processes whose parent is this process."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            if (entry.name.isdigit() and WORKER_MODULE.encode() in (entry / "cmdline").read_bytes()
                    and int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1]) == pid):
                found.append(int(entry.name))
        except (OSError, ValueError, IndexError):
            continue
    return found


def _killed(pid: int) -> bool:
    """Whether the process is gone, or has a SIGKILL pending (it is being torn down)."""
    if not alive(pid):
        return True
    try:
        status = dict(line.split(":\t", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines()
                      if ":\t" in line)  # fmt: skip
    except OSError:
        return True
    pending = int(status.get("ShdPnd", "0"), 16) | int(status.get("SigPnd", "0"), 16)
    return bool(pending & (1 << (signal.SIGKILL - 1))) or not alive(pid)


def test_six_immediate_restarts_after_a_sigkill_of_the_daemon_alone_all_serve(tmp_path: Path) -> None:
    port = free_port()
    config = _config(tmp_path / "config.yaml", port)
    process: subprocess.Popen[bytes] | None = None
    try:
        for start in range(7):  # the first start, then six restarts, each right after the SIGKILL
            log = tmp_path / f"serve-{start}.log"
            process = _serve(config, log)
            wait_until(lambda: _serving(process, port, log), 60, f"start {start} serving")  # noqa: B023
            workers = _workers_of(process.pid)
            assert len(workers) == 1, workers
            os.kill(process.pid, signal.SIGKILL)  # the daemon alone, not its process group
            process.wait()
            # the kernel sent the worker SIGKILL as its daemon died, before the daemon could be reaped (before: it
            # was alive and well, and left once it saw the end of its pipe)
            assert _killed(workers[0])
    finally:
        terminate(process, 15)


@pytest.fixture
def orphan(tmp_path: Path) -> Iterator[tuple[int, Path, subprocess.Popen[bytes]]]:
    """An HTTP worker on a port whose daemon (a stand-in process, then SIGKILLed) is gone, while something else
    keeps its parent alive and its pipe open: an orphan as a daemon of an earlier version, or of a platform without
    the parent-death signal, leaves. Yields (port, the config it names, the worker)."""
    port = free_port()
    config = _config(tmp_path / "config.yaml", port)
    stand_in = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    listening = bind("127.0.0.1", port)
    ours, theirs = multiprocessing.Pipe()
    fds = (theirs.fileno(), listening.fileno())
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [SOURCE_ROOT, os.environ.get("PYTHONPATH")]))}
    worker = subprocess.Popen([sys.executable, "-m", WORKER_MODULE, *map(str, fds), str(stand_in.pid),
                               str(config.resolve())], pass_fds=fds, env=env)  # fmt: skip
    theirs.close()
    listening.close()
    ours.send(("hello", "m1", web_config.resolve(None, None, None), False, 30.0))
    try:
        wait_until(lambda: probe(port, "/")[0] == 200, 30, "the worker serving its landing page")
        stand_in.kill()
        stand_in.wait()
        yield port, config, worker
    finally:
        terminate(worker, 5)
        terminate(stand_in, 5)
        ours.close()


def test_a_daemon_takes_its_port_back_from_an_orphaned_worker_of_its_config(
    orphan: tuple[int, Path, subprocess.Popen[bytes]], tmp_path: Path
) -> None:
    port, config, worker = orphan
    log = tmp_path / "serve.log"
    process = _serve(config, log)
    try:
        wait_until(lambda: _serving(process, port, log), 60, "the new daemon serving on the orphan's port")
        assert worker.wait(10) == -signal.SIGKILL
        assert f"port {port} is held by an HTTP worker (process {worker.pid}) of a dead daemon of this config: " \
               "taking it back" in log.read_text()  # fmt: skip
    finally:
        terminate(process, 15)


def test_a_port_held_by_an_orphan_of_another_config_is_still_refused_in_one_line(
    orphan: tuple[int, Path, subprocess.Popen[bytes]], tmp_path: Path
) -> None:
    port, _, worker = orphan
    other = _config(tmp_path / "other.yaml", port)
    result = subprocess.run([sys.executable, "-m", "exporter.cli", "serve", "--config", str(other)],
                            capture_output=True, text=True, timeout=60)  # fmt: skip
    assert result.returncode == 2
    assert result.stderr.strip().splitlines()[-1] == (f"fairness-exporter serve: {other}: listen.address, "
                                                      f"listen.port: 127.0.0.1:{port} is already in use")
    assert worker.poll() is None  # not ours to kill
