"""A model with `estimation:` runs in the full image: the chart deploys that one, and the daemon image refuses it.

docs/auditor/estimated.md: the daemon reads the estimation reference at start and on a reload, through the gate's
`read_reference`, the one reader of the reference for the gate, the daemon and `backtest` (so their estimates are
one number). That reader is pyarrow's (parquet, CSV type inference, object stores) and the Dockerfile's `daemon`
target leaves pandas, pyarrow and fsspec out (tests/test_image.py). A second reader of the same file without them
could disagree with the gate's on the same rows, so the daemon image does not read a reference: the chart runs the
daemon's pods in the full image when a model of its config estimates (`image.target`, refused as `daemon` then),
and the daemon image refuses such a model in one line (`serve` exits 2; a reload is refused, the running config
kept) instead of a traceback.

The daemon image is modelled by the same interpreter with those distributions made unimportable; the control test
shows the model is faithful (the same daemon without `estimation:` serves /healthz).
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_fixture import wait_until
from test_helm import CHART, CI, RELEASE, container, helm, render, run_helm  # noqa: F401  (helm: the fixture)

from exporter.devtools.embedded_broker import free_port, terminate

NOT_IN_DAEMON_IMAGE = ("pandas", "pyarrow", "fsspec", "duckdb", "s3fs")
LAUNCHER = textwrap.dedent(f"""
    import importlib.abc, sys
    class NotInstalled(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path, target=None):
            if name.partition(".")[0] in {NOT_IN_DAEMON_IMAGE!r}:
                raise ModuleNotFoundError(f"No module named {{name!r}}", name=name)
    sys.meta_path.insert(0, NotInstalled())
    from exporter.cli import main
    sys.exit(main(sys.argv[1:]))
""")
REFERENCE = "score,label,gender\n" + "".join(
    f"{s},{y},{g}\n"
    for g in ("male", "female")
    for s, y in ((0.1, 0), (0.2, 0), (0.3, 1), (0.7, 0), (0.8, 1), (0.9, 1))
)
ESTIMATION = {"estimation": {"reference": "/data/labelled-reference.csv"}}
VERSION = yaml.safe_load((CHART / "Chart.yaml").read_text())["appVersion"]
DAEMON_IMAGE, FULL_IMAGE = f"fairness-exporter:{VERSION}", f"fairness-exporter:{VERSION}-full"


def config(tmp_path: Path, port: int, *, estimation: bool) -> Path:
    (tmp_path / "reference.csv").write_text(REFERENCE)
    lines = [
        "model_id: loan-approval",
        "protected_attributes: [{name: gender, groups: [male, female]}]",
        "metrics: [{name: equal_opportunity_difference, threshold: 0.05}]",
        "events: {score: score, score_threshold: 0.5}",
        "kafka: {bootstrap_servers: '127.0.0.1:1', topic: predictions}",
        f"listen: {{address: 127.0.0.1, port: {port}}}",
    ]
    if estimation:
        lines.append(f"estimation: {{reference: {tmp_path / 'reference.csv'}}}")
    path = tmp_path / "config.yaml"
    path.write_text("\n".join(lines) + "\n")
    return path


def healthz(port: int) -> int | None:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=2) as response:
            return int(response.status)
    except OSError:
        return None


def post_reload(port: int) -> tuple[int, str]:
    request = urllib.request.Request(f"http://127.0.0.1:{port}/-/reload", method="POST")
    try:
        with urllib.request.urlopen(request, timeout=40) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def start_in_daemon_image(tmp_path: Path, *, estimation: bool, flags: tuple[str, ...] = ()) -> \
        tuple[subprocess.Popen[bytes], int]:  # fmt: skip
    """`serve` as the daemon image would run it, its stderr in tmp_path/stderr.log; (the process, its port)."""
    port = free_port()
    with (tmp_path / "stderr.log").open("w") as stderr:
        process = subprocess.Popen([sys.executable, "-c", LAUNCHER, "serve", "--config",
                                    str(config(tmp_path, port, estimation=estimation)), *flags],
                                   stdout=subprocess.DEVNULL, stderr=stderr)  # fmt: skip
    return process, port


def serve_in_daemon_image(tmp_path: Path, *, estimation: bool) -> tuple[int | None, int | None, str]:
    """(/healthz status once it answers, or None; the exit code if it exited instead, or None; stderr)."""
    process, port = start_in_daemon_image(tmp_path, estimation=estimation)
    try:
        status = wait_until(lambda: process.poll() is not None or healthz(port), 30, "/healthz or an exit")
        answered = None if status is True else status
    finally:
        terminate(process, 10)
    return answered, None if answered else process.returncode, (tmp_path / "stderr.log").read_text()


def test_the_daemon_image_serves_a_model_without_estimation(tmp_path: Path) -> None:
    """Control: the modelled image runs `serve` (its broker unreachable, /healthz still answers)."""
    status, _, stderr = serve_in_daemon_image(tmp_path, estimation=False)
    assert status == 200, stderr[-2000:]


def test_the_daemon_image_refuses_a_model_with_estimation_in_one_line(tmp_path: Path) -> None:
    status, code, stderr = serve_in_daemon_image(tmp_path, estimation=True)
    assert (status, code) == (None, 2), stderr[-2000:]
    assert "Traceback" not in stderr and len(stderr.strip().splitlines()) == 1, stderr
    assert str(tmp_path / "config.yaml") in stderr and "estimation.reference (model loan-approval)" in stderr
    assert "needs pandas" in stderr and "full image" in stderr and "image.target: full" in stderr


def test_the_daemon_image_refuses_a_reload_that_adds_estimation_and_keeps_serving(tmp_path: Path) -> None:
    """A model ConfigMap that gains `estimation:` under a running daemon image: refused, the running config kept."""
    process, port = start_in_daemon_image(tmp_path, estimation=False, flags=("--web.enable-lifecycle",))
    try:
        wait_until(lambda: process.poll() is not None or healthz(port), 30, "/healthz or an exit")
        assert healthz(port) == 200, (tmp_path / "stderr.log").read_text()[-2000:]
        config(tmp_path, port, estimation=True)
        status, body = post_reload(port)
        assert status == 500 and body.startswith("refused: ") and "estimation.reference" in body, body
        assert "full image" in body and healthz(port) == 200
    finally:
        terminate(process, 10)


def values_file(tmp_path: Path, values: dict[str, Any]) -> tuple[str, str]:
    path = tmp_path / "values.yaml"
    path.write_text(yaml.safe_dump(values))
    return "--values", str(path)


def fleet_models(estimating: int) -> dict[str, Any]:
    """ci/fleet-values.yaml's models, the `estimating`-th with `estimation:`."""
    models = yaml.safe_load(CI["fleet"].read_text())["config"]["models"]
    models[estimating] = {**models[estimating], **ESTIMATION}
    return {"config": {"models": models}}


@pytest.mark.helm
@pytest.mark.parametrize("scenario", ["default", "fleet"])
def test_the_chart_runs_the_daemon_in_the_full_image_when_a_model_estimates(helm: str, scenario: str,  # noqa: F811
                                                                          tmp_path: Path) -> None:  # fmt: skip
    assert container(render(helm, scenario))["image"] == DAEMON_IMAGE  # without estimation
    estimating = {"config": ESTIMATION} if scenario == "default" else fleet_models(-1)
    main = container(render(helm, scenario, *values_file(tmp_path, estimating)))
    assert main["image"] == FULL_IMAGE and main["imagePullPolicy"] == "IfNotPresent"


@pytest.mark.helm
def test_the_chart_refuses_the_daemon_image_for_a_model_that_estimates(helm: str, tmp_path: Path) -> None:  # noqa: F811
    result = run_helm(helm, "template", RELEASE, str(CHART), "--values", str(CI["fleet"]),
                      *values_file(tmp_path, fleet_models(0)), "--set", "image.target=daemon")  # fmt: skip
    assert result.returncode != 0
    assert "image.target is daemon, but a model of config has estimation:" in result.stderr, result.stderr


@pytest.mark.helm
def test_model_configmaps_that_may_estimate_run_in_the_full_image_when_asked(helm: str) -> None:  # noqa: F811
    """The chart cannot see the models of modelConfigMaps: image.target: full says one may estimate."""
    assert container(render(helm, "model-configmaps"))["image"] == DAEMON_IMAGE
    assert container(render(helm, "model-configmaps", "--set", "image.target=full"))["image"] == FULL_IMAGE
