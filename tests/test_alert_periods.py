"""The periods the daemon exports for its health alerts: `evaluation_interval` and `checkpoint.interval` as they run
now (at start, after a reload), and the checkpoint's as 0 when no checkpoint file is written."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from daemon_config import make_config
from prometheus_client import CollectorRegistry

from exporter.config import Config
from exporter.daemon import Daemon


def _exported(config: Config) -> dict[str, float]:
    """The periods a daemon of ``config`` exports for the alerts (its constructor does no I/O)."""
    registry = CollectorRegistry()
    Daemon(config, registry=registry)
    exported = {}
    for name in ("fairness_exporter_checkpoint_interval_seconds", "fairness_exporter_evaluation_interval_seconds"):
        value = registry.get_sample_value(name)
        assert value is not None, f"{name} is not on the page"
        exported[name] = value
    return exported


def test_the_daemon_exports_its_periods_at_start_and_after_a_reload(tmp_path: Path) -> None:
    def config(evaluation: str, checkpoint: str) -> Config:
        return make_config(evaluation_interval=evaluation, checkpoint={"path": str(tmp_path), "interval": checkpoint})

    registry = CollectorRegistry()
    daemon = Daemon(config("15m", "1h"), registry=registry, loader=lambda: config("30s", "10m"))
    assert registry.get_sample_value("fairness_exporter_evaluation_interval_seconds") == 900
    assert registry.get_sample_value("fairness_exporter_checkpoint_interval_seconds") == 3600
    assert daemon.reload()[0]
    assert registry.get_sample_value("fairness_exporter_evaluation_interval_seconds") == 30
    assert registry.get_sample_value("fairness_exporter_checkpoint_interval_seconds") == 600
    assert (registry.get_sample_value("fairness_exporter_start_timestamp_seconds") or 0) > 1_700_000_000


@pytest.mark.parametrize("overrides", [
    {},  # direct, no checkpoint.path
    {"kafka": {"group_id": "fx", "stages": "staged"}, "checkpoint": {"interval": "10m"}},  # snapshots, no file
], ids=["direct-without-checkpoint", "staged"])  # fmt: skip
def test_a_daemon_that_writes_no_checkpoint_file_exports_a_checkpoint_interval_of_0(overrides: dict[str, Any]) -> None:
    """Its last checkpoint stays 0; the alert reads the interval's 0 as "nothing to fail", not as a failure."""
    assert _exported(make_config(**overrides))["fairness_exporter_checkpoint_interval_seconds"] == 0
