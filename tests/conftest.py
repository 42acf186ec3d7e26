"""Shared fixtures: the real Kafka-protocol broker (broker_fixture.py), daemons on it for both
client libraries (daemon_fixture.py), an S3 API on loopback (s3_fixture.py); tooling.py handles missing tools."""

from collections.abc import Iterator

import pytest

pytest_plugins = ["broker_fixture", "daemon_fixture", "s3_fixture"]


@pytest.fixture(scope="session", autouse=True)
def _audit_log_outside_the_repo(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """Every command logs its run; a test that names no --audit-log writes to a tmp folder, not the work tree."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("FAIRNESS_AUDIT_LOG", str(tmp_path_factory.mktemp("audit") / "audit-log.jsonl"))
        yield
