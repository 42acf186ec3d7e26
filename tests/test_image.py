"""The container image is built (tools/image.py with buildah, as `make image` does without docker) and run.

The image runs as its config says (User, Env, WorkingDir, Entrypoint, Cmd from `buildah inspect`) on its own
root filesystem, mounted by buildah and remounted read-only in a private mount namespace, with the daemon's
config bind-mounted where the chart mounts it and a tmpfs on /tmp (the chart's emptyDir). It shares the host's
network, so it reads the test's real broker and its /healthz is reachable on loopback.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shlex
import shutil
import subprocess
import sys
import time
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from importlib.metadata import version
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_fixture import wait_until
from s3_fixture import S3
from tooling import require_binary

from exporter.devtools.embedded_broker import EmbeddedBroker, free_port, terminate

pytestmark = pytest.mark.image

ROOT = Path(__file__).resolve().parent.parent
TAG = "localhost/fairness-exporter:test"
CONFIG_IN_IMAGE = "/etc/fairness-exporter/config.yaml"


def image_tool() -> Any:
    spec = importlib.util.spec_from_file_location("fairness_image", ROOT / "tools" / "image.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def buildah(*args: str) -> str:
    return subprocess.run([require_binary("buildah"), *args], capture_output=True, text=True, check=True).stdout


@dataclass
class Container:
    name: str
    rootfs: Path
    config: dict[str, Any]


@pytest.fixture(scope="module")
def container() -> Iterator[Container]:
    """A working container of the freshly built image, its root filesystem mounted; removed afterwards."""
    require_binary("buildah")
    require_binary("mmdebstrap")
    require_binary("unshare")
    started = time.monotonic()
    image_tool().build(TAG, engine="buildah")
    print(f"\nimage {TAG} built in {time.monotonic() - started:.0f}s", file=sys.stderr)
    name = buildah("from", "--pull-never", TAG).strip()
    try:
        rootfs = Path(buildah("mount", name).strip())
        config = json.loads(buildah("inspect", "--type", "image", TAG))["OCIv1"]["config"]
        yield Container(name, rootfs, config)
    finally:
        subprocess.run([require_binary("buildah"), "rm", name], capture_output=True)


def run_image(container: Container, config_file: Path, log: Path) -> subprocess.Popen[bytes]:
    """The image's entrypoint and command, as its user, on its read-only root; the process is the Popen's."""
    spec = container.config
    user = spec["User"]
    env = [*spec.get("Env", []), "HOME=/nonexistent"]
    argv = [*spec["Entrypoint"], *spec.get("Cmd", [])]
    root = shlex.quote(str(container.rootfs))
    target = f"{root}{CONFIG_IN_IMAGE}"
    devices = ("null", "zero", "random", "urandom")
    script = f"""set -e
        mount --make-rprivate /
        touch {target} {" ".join(f"{root}/dev/{dev}" for dev in devices)}
        mount --bind {root} {root}
        mount -o remount,bind,ro {root}
        mount --bind {shlex.quote(str(config_file))} {target}
        mount -t proc proc {root}/proc
        mount -t tmpfs -o mode=1777 tmpfs {root}/tmp
        for dev in {" ".join(devices)}; do mount --bind /dev/$dev {root}/dev/$dev; done
        exec chroot --userspec={user} {root} /usr/bin/env -i -C {shlex.quote(spec.get("WorkingDir") or "/")} \
            {shlex.join(env)} {shlex.join(argv)}
    """  # the root is read-only; /proc, /tmp (the chart's emptyDir), the devices and the config are mounted on it
    with log.open("wb") as out:
        return subprocess.Popen([require_binary("unshare"), "--mount", "sh", "-c", script],
                                stdout=out, stderr=subprocess.STDOUT)  # fmt: skip


@dataclass
class Running:
    proc: subprocess.Popen[bytes]
    port: int
    log: Path


@pytest.fixture(scope="module")
def running(container: Container, kafka_broker: EmbeddedBroker,
            tmp_path_factory: pytest.TempPathFactory) -> Iterator[Running]:  # fmt: skip
    topic = f"image-{uuid.uuid4().hex[:8]}"
    kafka_broker.create_topic(topic, partitions=1)
    port = free_port()
    directory = tmp_path_factory.mktemp("image")
    config = directory / "config.yaml"
    config.write_text(yaml.safe_dump({
        "model_id": "m1", "protected_attributes": [{"name": "gender", "groups": ["male", "female"]}],
        "kafka": {"bootstrap_servers": kafka_broker.bootstrap_servers, "topic": topic, "assignment": "manual"},
        "evaluation_interval": "1s", "listen": {"address": "127.0.0.1", "port": port},
    }))  # fmt: skip
    config.chmod(0o644)
    log = directory / "container.log"
    proc = run_image(container, config, log)
    try:
        yield Running(proc, port, log)
    finally:
        terminate(proc, 10)


def healthz(port: int) -> str | None:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=2) as response:
            return response.read().decode() if response.status == 200 else None
    except OSError:
        return None


def test_the_container_answers_healthz(running: Running) -> None:
    def answer() -> str | None:
        assert running.proc.poll() is None, running.log.read_text()
        return healthz(running.port)

    assert wait_until(answer, 60, "/healthz from the container").startswith("ok")


def proc_status(pid: int) -> dict[str, str]:
    lines = Path(f"/proc/{pid}/status").read_text().splitlines()
    return {key: value.strip() for key, _, value in (line.partition(":") for line in lines)}


def test_the_daemon_runs_as_uid_10001(running: Running, container: Container) -> None:
    wait_until(lambda: healthz(running.port), 60, "/healthz from the container")
    assert container.config["User"] == "10001:10001"
    status = proc_status(running.proc.pid)
    assert "fairness-exporter" in Path(f"/proc/{running.proc.pid}/cmdline").read_text()
    assert status["Uid"].split() == ["10001"] * 4
    assert status["Gid"].split() == ["10001"] * 4


def test_the_daemon_runs_on_a_read_only_root(running: Running) -> None:
    wait_until(lambda: healthz(running.port), 60, "/healthz from the container")
    mounts = [line.split() for line in Path(f"/proc/{running.proc.pid}/mountinfo").read_text().splitlines()]
    root = [fields for fields in mounts if fields[4] == "/"][-1]  # field 5: mount point; the last is on top
    assert "ro" in root[5].split(","), root


def test_version_in_the_image_is_the_package_version(container: Container) -> None:
    output = buildah("run", "--isolation", "chroot", container.name, "--", "fairness-exporter", "--version")
    assert output.split() == ["fairness-exporter", version("fairness-exporter")]


@pytest.mark.parametrize(("files", "mirror"), [
    ({"sources.list.d/debian.sources": "Types: deb\nURIs: http://mirror.example/debian\nSuites: bookworm "
      "bookworm-updates\nComponents: main\n\nTypes: deb\nURIs: http://mirror.example/debian-security\n"
      "Suites: bookworm-security\n"}, "http://mirror.example/debian"),
    ({"sources.list": "deb https://packages.cloud.google.com/apt cloud-sdk-bookworm main\n"
      "deb [arch=amd64] http://ftp.example/debian bookworm main\n"}, "http://ftp.example/debian"),
    ({"sources.list": "deb http://archive.ubuntu.com/ubuntu jammy main\n"}, "http://deb.debian.org/debian"),
])  # fmt: skip
def test_the_base_is_bootstrapped_from_the_mirror_apt_uses(tmp_path: Path, files: dict[str, str],
                                                          mirror: str) -> None:  # fmt: skip
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    assert image_tool().debian_mirror(tmp_path) == mirror


def test_the_seed_audit_runs_in_the_image_on_its_s3_dataset(container: Container, s3: S3, tmp_path: Path,
                                                            capsys: pytest.CaptureFixture[str]) -> None:  # fmt: skip
    """The chart's audit CronJob runs `audit` in this image, and the seed's config names its evaluation_dataset and
    report_destination on S3: the image carries the storage extra (before: no s3fs, so the seed's config could not
    run in it). Its report is the one the package gives on the same rows."""
    from test_seed_bias_config import SEED_CONFIG, hiring_eval, put_dataset

    from exporter.cli import main

    put_dataset(s3, hiring_eval(female_hired=4))
    s3.filesystem().mkdir("ml-audit-reports")
    data = tmp_path / "data"
    data.mkdir()
    shutil.copy(SEED_CONFIG, data / "bias-testing-config.yaml")
    for path in (tmp_path, data, data / "bias-testing-config.yaml"):
        path.chmod(0o755 if path.is_dir() else 0o644)
    env = [f"--env={k}={os.environ[k]}" for k in ("AWS_ENDPOINT_URL", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY",
                                                 "AWS_DEFAULT_REGION")]  # fmt: skip
    done = subprocess.run([require_binary("buildah"), "run", "--isolation", "chroot", *env, "-v", f"{data}:/data:ro",
                           container.name, "--", "fairness-exporter", "audit", "/data/bias-testing-config.yaml",
                           "--audit-log", "/tmp/audit-log.jsonl"], capture_output=True, text=True)  # fmt: skip
    assert done.returncode == 1, done.stderr  # women are hired at 0.4, the others at 0.5: demographic parity blocks
    in_image = json.loads(done.stdout)
    code = main(["audit", str(data / "bias-testing-config.yaml"), "--audit-log", str(tmp_path / "log.jsonl")])
    here = json.loads(capsys.readouterr().out)
    assert code == 1 and in_image["verdict"] == here["verdict"] == "FAIL"
    assert in_image["data_file"] == "s3://ml-datasets/hiring-eval-2026q1.parquet"
    for key in ("timestamp", "config_file", "audit_log"):  # when, and the paths each run was given
        in_image.pop(key), here.pop(key)
    assert in_image == here
    assert len(s3.filesystem().ls("ml-audit-reports")) == 2  # each run filed its JSON report
