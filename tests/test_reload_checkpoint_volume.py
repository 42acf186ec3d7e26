"""A reload that resets a model's layout while the checkpoint volume cannot be written.

A reload that changes a model's layout first writes the model's state to a dated file beside the checkpoint
(Checkpointer.keep). When the checkpoint volume has gone read-only (or is full), that write raises an OSError that
Daemon.reload did not handle (review 16): the reload was neither applied nor counted as refused, and the reset was
counted although nothing was reset. It is now refused whole and counted, and nothing is reset.
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client import CollectorRegistry
from test_labels_and_checkpoint import Clock, predictions, records, value
from tooling import tmpfs

from exporter.config import load_config
from exporter.daemon import Daemon
from exporter.stream.state import checkpoint

BASE: dict[str, Any] = {
    "protected_attributes": [{"name": "gender", "groups": ["male", "female"]}],
    "min_samples": 5, "windows": ["1h", "24h"], "bucket": "1m", "evaluation_interval": "1s",
    "listen": {"address": "127.0.0.1", "port": 0},
    "models": [{"model_id": "m1"}, {"model_id": "m2"}],
}  # fmt: skip


@pytest.fixture
def volume(tmp_path: Path) -> Iterator[Path]:
    """An 8 MiB tmpfs for the checkpoint (remounted read-only by the test), unmounted afterwards."""
    with tmpfs(tmp_path, "8m") as mountpoint:
        yield mountpoint


def test_a_layout_reload_while_the_checkpoint_volume_is_read_only_is_refused_and_counted(
    tmp_path: Path, volume: Path
) -> None:
    """Claim (docs/sre/fleet.md "Reload without a restart", docs/faults.md "The same checks refuse a reload"): a
    reload that cannot be applied is refused whole, the running config stays,
    `fairness_exporter_config_reload_failures_total` counts it and `fairness_exporter_config_last_reload_successful`
    drops to 0 (alert FairnessExporterConfigReloadFailed); a model reset on a reload is counted in
    `fairness_exporter_model_resets_total` and its state kept in a dated file.

    Here the checkpoint volume went read-only (ext4 `errors=remount-ro`, a detached volume) and a ConfigMap update
    changes m1's `model_version`. The dated file cannot be written: `Checkpointer.keep` raises `OSError` out of
    `Daemon.reload` (only ConfigError is handled), so on the scheduler's watch (or SIGHUP's thread) the reload dies
    with a traceback. Found before: reload failures 0, last reload successful 1, `model_resets_total{m1}` 1 though
    m1 kept its old layout and counts, and the new config never applied (the watch took the new fingerprint before
    reloading, so it did not try again). A production user's edited model is silently not monitored as configured,
    with every health signal saying the reload went through.
    """
    config_file = tmp_path / "config.yaml"
    config_file.write_text(yaml.safe_dump({**BASE, "checkpoint": {"path": str(volume)}}))
    daemon = Daemon(load_config(config_file), registry=CollectorRegistry(), clock=Clock(),
                    loader=lambda: load_config(config_file))  # fmt: skip
    daemon.checkpointer.restore()
    daemon.watch.mark()  # what start() does before scheduling the watch
    daemon.ingest.handle("predictions", 0, records(predictions(3, 8, "male", "a")))
    daemon.checkpointer.flush()
    assert [p.name for p in volume.iterdir()] == [checkpoint.FLEET_FILE]

    subprocess.run(["mount", "-o", "remount,ro", str(volume)], check=True)  # the volume goes read-only
    config_file.write_text(yaml.safe_dump({**BASE, "checkpoint": {"path": str(volume)},
                                           "models": [{"model_id": "m1", "model_version": "2.0"},
                                                      {"model_id": "m2"}]}))  # fmt: skip
    raised: list[str] = []
    for _ in range(3):  # runs of the scheduled watch job: a change seen, then reloaded (APScheduler logs what a job
        try:  # raises, and goes on)
            daemon.watch.check()
        except Exception as exc:  # the scheduler logs what a job raises, and goes on
            raised.append(f"{type(exc).__name__}: {exc}")

    applied = {m.model_id: m.model_version for m in daemon.config.models}
    failures = value(daemon, "fairness_exporter_config_reload_failures_total")
    successful = value(daemon, "fairness_exporter_config_last_reload_successful")
    resets = value(daemon, "fairness_exporter_model_resets_total", model_id="m1", reason="model_version")
    found = (f"applied={applied}, reload_failures_total={failures}, last_reload_successful={successful}, "
             f"model_resets_total{{m1}}={resets}, raised={raised}")  # fmt: skip
    # refused and said so: counted, not successful, nothing reset, the running config kept
    assert failures == 1 and successful == 0 and not resets and applied["m1"] is None and not raised, found
    assert [p.name for p in volume.iterdir()] == [checkpoint.FLEET_FILE]
