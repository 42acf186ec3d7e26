"""A model whose layout changed (groups, windows, bucket, unknown_values, model_version ...), on start and on reload
(issue 31 item 4): it starts afresh under the new layout, the other models keep their state, and the state it had
is never destroyed in silence: it stays on disk under a dated name beside the checkpoint, one log line says which
models were reset and why, and ``fairness_exporter_model_resets_total{model_id,reason}`` counts them.

Before: the daemon logged a warning, started the model empty and overwrote the old checkpoint within 2 s.
"""

from __future__ import annotations

import logging
import shutil
from pathlib import Path
from typing import Any

import pytest
from daemon_config import make_config
from prometheus_client import CollectorRegistry
from test_labels_and_checkpoint import Clock, predictions, records, value

from exporter.config import Config
from exporter.daemon import Daemon
from exporter.stream.state import checkpoint

MALE = {"attribute": "gender", "window": "1h", "subgroup": "male"}
ATTRIBUTES = [{"name": "gender", "groups": ["male", "female"]}]


def fleet(**m1: Any) -> dict[str, Any]:
    """Two models; ``m1`` overrides m1's keys (m2 is never changed)."""
    return {"model_id": None,
            "models": [{"model_id": "m1", **m1}, {"model_id": "m2", "protected_attributes": ATTRIBUTES}]}


def daemon(config: Config, loader: Any = None) -> Daemon:
    d = Daemon(config, registry=CollectorRegistry(), clock=Clock(), loader=loader)
    d.checkpointer.restore()  # what start() does first
    return d


def counted(d: Daemon, model_id: str) -> float | None:
    return value(d, "model_subgroup_samples", **{**MALE, "model_id": model_id})


def resets(d: Daemon, model_id: str, reason: str) -> float | None:
    return value(d, "fairness_exporter_model_resets_total", model_id=model_id, reason=reason)


def kept_files(directory: Path) -> list[Path]:
    return sorted(p for p in directory.iterdir() if p.name != checkpoint.FLEET_FILE)


def counts_m1_and_m2(d: Daemon) -> None:
    d.ingest.handle("predictions", 0, records([*predictions(3, 8, "male", "a"),
                                               *({**e, "model_id": "m2"} for e in predictions(1, 5, "male", "b"))]))


@pytest.mark.parametrize(("change", "reason"), [
    ({"windows": ["1h", "12h"]}, "windows"),
    ({"bucket": "30s"}, "bucket_seconds"),
    ({"protected_attributes": [{"name": "gender", "groups": ["male", "female", "x"]}]}, "attributes"),
    ({"unknown_values": "other"}, "attributes"),
    ({"model_version": "2.0"}, "model_version"),
])  # fmt: skip
def test_a_layout_change_at_start_keeps_the_old_checkpoint_beside_the_new_one_and_says_so(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, change: dict[str, Any], reason: str
) -> None:
    cp = {"checkpoint": {"path": str(tmp_path)}}
    shared = {k: v for k, v in change.items() if k in ("windows", "bucket")}
    per_model = {k: v for k, v in change.items() if k not in shared}
    d1 = daemon(make_config(**cp, **fleet()))
    counts_m1_and_m2(d1)
    d1.checkpointer.write()
    before = (tmp_path / checkpoint.FLEET_FILE).read_bytes()

    with caplog.at_level(logging.WARNING):
        d2 = daemon(make_config(**cp, **shared, **fleet(**per_model)))
    reset = ["m1", "m2"] if shared else ["m1"]  # windows and bucket are every model's
    lines = [r.getMessage() for r in caplog.records if "models reset" in r.getMessage()]
    assert len(lines) == 1 and all(f"{m} ({reason}: was" in lines[0] for m in reset)
    (kept,) = kept_files(tmp_path)
    assert kept.name == "fleet.checkpoint.20270115T080000Z.npz" and f"kept in {kept}" in lines[0]
    assert kept.read_bytes() == before
    assert all(resets(d2, m, reason) == 1 for m in reset)
    assert counted(d2, "m1") == 0 and counted(d2, "m2") == (0 if shared else 5)  # m2 untouched: its state kept
    d2.checkpointer.write()  # the next checkpoint replaces the file, not the kept state
    assert kept.read_bytes() == before and (tmp_path / checkpoint.FLEET_FILE).read_bytes() != before

    # what the line says: the old config and the kept file resume the old state
    shutil.move(kept, tmp_path / checkpoint.FLEET_FILE)
    d3 = daemon(make_config(**cp, **fleet()))
    assert counted(d3, "m1") == 8 and counted(d3, "m2") == 5 and not kept_files(tmp_path)


def test_a_layout_change_on_reload_writes_the_state_it_had_to_a_dated_file(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    cp = {"checkpoint": {"path": str(tmp_path / "state")}}
    configs = [make_config(**cp, **fleet()), make_config(**cp, **fleet(model_version="2.0"))]
    d = daemon(configs[0], loader=lambda: configs[1])
    counts_m1_and_m2(d)  # counted since the last checkpoint (none was written): only in memory
    with caplog.at_level(logging.WARNING):
        applied, what = d.reload()
    assert applied and "restarted afresh m1" in what and "unchanged m2" in what
    (kept,) = kept_files(tmp_path / "state")
    assert ("models reset (their layout changed): m1 (model_version: was {'model_version': None}, now "
            f"{{'model_version': '2.0'}}); their previous state is kept in {kept}") in caplog.text
    assert resets(d, "m1", "model_version") == 1
    assert counted(d, "m1") == 0 and counted(d, "m2") == 5
    shutil.move(kept, tmp_path / "state" / checkpoint.FLEET_FILE)
    restored = daemon(configs[0])
    assert counted(restored, "m1") == 8 and counted(restored, "m2") == 5
    assert restored.fleet.offsets == {("predictions", 0): 13}


def test_without_checkpoints_a_reset_on_reload_is_still_said_and_counted(caplog: pytest.LogCaptureFixture) -> None:
    configs = [make_config(**fleet()), make_config(**fleet(unknown_values="other"))]
    d = daemon(configs[0], loader=lambda: configs[1])
    counts_m1_and_m2(d)
    with caplog.at_level(logging.WARNING):
        assert d.reload()[0]
    assert "m1 (attributes: was" in caplog.text and "so their previous counts are dropped" in caplog.text
    assert resets(d, "m1", "attributes") == 1 and counted(d, "m2") == 5
