"""Shared fixtures: the real Kafka-protocol broker (broker_fixture.py), daemons on it for both
client libraries (daemon_fixture.py), an S3 API on loopback (s3_fixture.py); tooling.py handles missing tools.

The order of the files: `make test` runs the suite as `pytest -n 4 --dist loadfile` (docs/development.md), each
file on one worker. The files that take longest start first, so that no long file starts last and holds the end
alone while the other workers are idle; the others follow in collection order."""

from collections.abc import Iterator
from pathlib import Path

import pytest

pytest_plugins = ["broker_fixture", "daemon_fixture", "s3_fixture"]

# The files of the suite taking 15 s or more, longest first (seconds in a full run of 2026-12-03, pytest --durations:
# restarts 428, the staged join 244, the direct join 201, the image 156 ...). A new long file belongs here.
LONGEST_FIRST = (
    "test_restarts.py", "test_attribute_join_staged.py", "test_attribute_join_kafka.py", "test_image.py",
    "test_direct_replicas.py", "test_stream_faults.py", "test_demo.py", "test_payload_seldon.py",
    "test_payload_staged.py", "test_rules.py", "test_stages_scale_out.py", "test_spark.py", "test_staged_poison.py",
    "test_log_resets.py", "test_counterfactual.py", "test_startup_faults.py", "test_ci_templates.py",
    "test_gate_daemon_agreement.py", "test_worker_orphans.py", "test_daemon_kafka.py", "test_web_config.py",
    "test_backtest.py", "test_helm_hardening.py", "test_alertmanager_e2e.py", "test_decode_oracle.py",
    "test_prometheus_e2e.py", "test_dead_letters.py", "test_stages.py", "test_config_refusals.py",
    "test_payload_kserve.py", "test_helm.py", "fleet.md", "test_scale_out.py", "safety-redteam.md",
)  # fmt: skip
_RANK = {name: rank for rank, name in enumerate(LONGEST_FIRST)}


def pytest_configure(config: pytest.Config) -> None:
    """pytest-xdist hands out whole files in the order collected when loadscope reordering is off (by default it
    orders them by their number of tests, which puts a long file of few tests last)."""
    if hasattr(config.option, "loadscopereorder"):
        config.option.loadscopereorder = False


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The longest files first (a stable sort: each file's tests stay together and in their order)."""
    items.sort(key=lambda item: _RANK.get(Path(str(item.path)).name, len(_RANK)))


@pytest.fixture(scope="session", autouse=True)
def _audit_log_outside_the_repo(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """Every command logs its run; a test that names no --audit-log writes to a tmp folder, not the work tree."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("FAIRNESS_AUDIT_LOG", str(tmp_path_factory.mktemp("audit") / "audit-log.jsonl"))
        yield
