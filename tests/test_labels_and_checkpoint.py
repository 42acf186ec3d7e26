"""Delayed labels join their prediction's bucket; checkpoints restore state exactly, a changed model afresh.

These drive the daemon's Ingest.handle with in-memory records (the source's handler); the same paths run against
the real broker in test_daemon_kafka.py.
"""

from __future__ import annotations

import json
import socket
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import orjson
import pytest
from daemon_config import event, make_config
from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families

from exporter.daemon import Daemon
from exporter.stream.kafka.client import SimpleRecord
from exporter.stream.state import checkpoint
from exporter.stream.state.checkpoint import CheckpointError

T0 = 1_800_000_000.0


@dataclass
class Record:
    value: bytes
    offset: int


class Clock:
    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> float:
        return self.now


def records(payloads: list[dict], start: int = 0) -> list[Record]:
    return [Record(orjson.dumps(p), start + i) for i, p in enumerate(payloads)]


@pytest.fixture
def make_daemon(tmp_path: Path) -> Callable[..., Daemon]:
    def make(**overrides: object) -> Daemon:
        config = make_config(kafka={"labels_topic": "labels"}, **overrides)
        daemon = Daemon(config, registry=CollectorRegistry(), clock=Clock())
        daemon.checkpointer.restore()  # what start() does first
        return daemon

    return make


def value(daemon: Daemon, name: str, **labels: str) -> float | None:
    """A sample of the /metrics page, right after a computation."""
    daemon.computer.compute()
    if not name.startswith("fairness_exporter_"):  # the daemon's health metrics carry no model_id
        labels = {"model_id": "m1", **labels}
    for family in text_string_to_metric_families(daemon.metrics_page()):
        for s in family.samples:
            if s.name == name and s.labels == labels:
                return s.value
    return None


def predictions(n_pos: int, n: int, gender: str, prefix: str, ts: float = T0 - 60) -> list[dict]:
    return [event(gender, prediction=int(i < n_pos), ts=ts, prediction_id=f"{prefix}{i}") for i in range(n)]


def labels_for(prefix: str, labels: list[int]) -> list[dict]:
    return [{"prediction_id": f"{prefix}{i}", "label": y} for i, y in enumerate(labels)]


def test_delayed_labels_are_counted_in_the_bucket_of_the_prediction(make_daemon) -> None:
    d = make_daemon()
    d.ingest.handle("predictions", 0, records(predictions(5, 10, "male", "m")))
    group = {"attribute": "gender", "window": "1h", "subgroup": "male"}
    assert value(d, "model_subgroup_labelled_samples", **group) == 0
    assert value(d, "fairness_exporter_pending_predictions") == 10
    d.clock.now = T0 + 1800  # labels arrive 30 minutes later
    d.ingest.handle("labels", 0, records(labels_for("m", [1, 1, 1, 0, 0, 1, 0, 0, 0, 0])))
    # predicted 1 for m0..m4: TP m0-m2, FP m3-m4; predicted 0 for m5..m9: FN m5, TN m6-m9
    assert value(d, "model_true_positive_rate", **group) == 0.75
    assert value(d, "model_false_positive_rate", **group) == pytest.approx(2 / 6)
    assert value(d, "model_labelled_fraction", **group) == 1.0
    assert value(d, "fairness_exporter_labels_joined_total") == 10
    assert value(d, "fairness_exporter_pending_predictions") == 0


def test_delayed_labels_sent_as_booleans_count_as_1_and_0(make_daemon) -> None:
    """The labels topic follows the prediction decoder's rule: true/false are 1/0, text is an invalid label event."""
    d = make_daemon()
    d.ingest.handle("predictions", 0, records(predictions(2, 4, "male", "b")))
    outcomes = [True, False, True, "0"]
    d.ingest.handle("labels", 0, records([{"prediction_id": f"b{i}", "label": y} for i, y in enumerate(outcomes)]))
    group = {"attribute": "gender", "window": "1h", "subgroup": "male"}
    # predicted 1 for b0, b1 (TP, FP), 0 for b2 (FN); b3's label "0" is text
    assert value(d, "model_true_positive_rate", **group) == 0.5
    assert value(d, "model_false_positive_rate", **group) == 1.0
    assert value(d, "fairness_exporter_labels_joined_total") == 3
    assert value(d, "fairness_exporter_labels_dropped_total", reason="invalid_label_event") == 1


def test_labels_before_predictions_duplicates_and_unknowns_are_accounted(make_daemon) -> None:
    d = make_daemon(label_horizon="1h")
    duplicate, invalid = {"prediction_id": "x0", "label": 1}, {"prediction_id": "bad", "label": "yes"}
    d.ingest.handle("labels", 0, records([*labels_for("x", [1, 0]), duplicate, invalid]))
    d.ingest.handle("predictions", 0, records(predictions(1, 2, "female", "x")))  # the orphans join now
    group = {"attribute": "gender", "window": "1h", "subgroup": "female"}
    assert value(d, "model_subgroup_labelled_samples", **group) == 2
    assert value(d, "fairness_exporter_labels_dropped_total", reason="duplicate_label") == 1
    assert value(d, "fairness_exporter_labels_dropped_total", reason="invalid_label_event") == 1
    d.ingest.handle("labels", 0, records([{"prediction_id": "ghost", "label": 1}], start=10))
    d.ingest.handle("predictions", 0, records(predictions(0, 3, "female", "never", ts=T0), start=10))
    d.clock.now = T0 + 2 * 3600  # past the horizon: the ghost label and the unlabelled predictions expire
    d.ingest.expire()  # on the daemon's timer, with or without traffic
    assert value(d, "fairness_exporter_labels_expired_total", reason="unknown_prediction") == 1
    assert value(d, "fairness_exporter_labels_expired_total", reason="never_labelled") == 3


def test_joined_ids_are_remembered_for_the_horizon_only(make_daemon) -> None:
    """A second label of a joined prediction is a duplicate within the horizon; past it the id is forgotten like
    any other state, so this memory stops growing after one horizon (found by the soak: it held up to
    max_pending_labels ids whatever their age: 140 MB of RSS for a million)."""
    d = make_daemon(label_horizon="1h")
    d.ingest.handle("predictions", 0, records(predictions(5, 10, "male", "j")))
    d.ingest.handle("labels", 0, records(labels_for("j", [1] * 10)))
    d.clock.now = T0 + 1800
    d.ingest.handle("labels", 0, records(labels_for("j", [1] * 2), start=10))
    assert value(d, "fairness_exporter_labels_dropped_total", reason="duplicate_label") == 2
    d.clock.now = T0 + 3600 + 1  # an hour after the labels arrived
    d.ingest.expire()
    assert len(d.fleet.joins.recently_joined) == 0
    d.ingest.handle("labels", 0, records(labels_for("j", [1] * 3), start=12))  # now labels of no prediction held
    d.clock.now = T0 + 2 * 3600 + 2
    d.ingest.expire()
    assert value(d, "fairness_exporter_labels_dropped_total", reason="duplicate_label") == 2
    assert value(d, "fairness_exporter_labels_expired_total", reason="unknown_prediction") == 3
    assert value(d, "fairness_exporter_labels_joined_total") == 10


def test_a_restart_holds_expiry_at_the_labels_clock_of_its_checkpoint(make_daemon, tmp_path: Path) -> None:
    """A daemon reading labels an hour late writes a checkpoint; after an outage its successor holds expiry at
    that clock until it reads labels again (its first expiry can come before its first labels), then follows them.
    A checkpoint written before the labels' clock restores with the wall clock."""
    cp = {"path": str(tmp_path / "state"), "interval": "30s"}
    d1 = make_daemon(checkpoint=cp, label_horizon="1h")
    d1.ingest.handle("predictions", 0, records(predictions(2, 6, "male", "w")))  # event time T0 - 60
    d1.clock.now = T0 + 1800
    late = [SimpleRecord(orjson.dumps(v), i, int((T0 - 1800) * 1000)) for i, v in enumerate(labels_for("w", [1]))]
    d1.ingest.handle("labels", 0, late)  # read 1 hour after it was produced
    d1.checkpointer.write()
    d2 = make_daemon(checkpoint=cp, label_horizon="1h")
    d2.clock.now = T0 + 3 * 3600  # back after an outage: the labels' clock is the checkpoint's, T0 - 1800
    d2.ingest.expire()
    assert len(d2.fleet.joins.pending) == 5
    assert value(d2, "fairness_exporter_labels_expired_total", reason="never_labelled") == 0
    on_time = [SimpleRecord(orjson.dumps({"prediction_id": "w1", "label": 0}), 1, int((T0 + 3 * 3600) * 1000))]
    d2.ingest.handle("labels", 0, on_time)
    d2.ingest.expire()
    assert value(d2, "fairness_exporter_labels_joined_total") == 1
    assert value(d2, "fairness_exporter_labels_expired_total", reason="never_labelled") == 4

    path = d1.checkpointer.path
    assert path is not None
    state = checkpoint.read(path)
    assert state is not None and state[1]["join.labels_clock"].tolist() == [T0 - 1800]
    checkpoint.write(path, state[0], {k: v for k, v in state[1].items() if k != "join.labels_clock"})  # as before
    d3 = make_daemon(checkpoint=cp, label_horizon="1h")
    d3.clock.now = T0 + 3 * 3600
    d3.ingest.expire()
    assert value(d3, "fairness_exporter_labels_expired_total", reason="never_labelled") == 5


def test_checkpoint_restores_counts_offsets_and_pending_labels(make_daemon, tmp_path: Path) -> None:
    cp = {"path": str(tmp_path / "state"), "interval": "30s"}
    d1 = make_daemon(checkpoint=cp)
    d1.ingest.handle("predictions", 1, records(predictions(3, 8, "male", "a")))
    d1.ingest.handle("predictions", 2, records(predictions(1, 4, "female", "b"), start=100))
    d1.checkpointer.write()
    d2 = make_daemon(checkpoint=cp)
    assert d2.fleet.offsets == {("predictions", 1): 8, ("predictions", 2): 104}
    assert d2.checkpointer.committable() == d2.fleet.offsets
    assert len(d2.fleet.joins.pending) == 12
    group = {"attribute": "gender", "window": "1h", "subgroup": "male"}
    assert value(d2, "model_positive_prediction_rate", **group) == 3 / 8
    d2.ingest.handle("labels", 0, records(labels_for("a", [1] * 8)))
    assert value(d2, "model_true_positive_rate", **group) == 3 / 8


def test_a_model_whose_layout_changed_starts_afresh_and_keeps_the_checkpoints_offsets(make_daemon, tmp_path: Path,
                                                                                       caplog) -> None:  # fmt: skip
    cp = {"path": str(tmp_path / "state")}
    d1 = make_daemon(checkpoint=cp)
    d1.ingest.handle("predictions", 1, records(predictions(3, 8, "male", "a")))
    d1.checkpointer.write()
    group = {"attribute": "gender", "window": "1h", "subgroup": "male"}
    assert value(make_daemon(checkpoint=cp), "model_subgroup_samples", **group) == 8  # same layout: restored
    for changed, differs in (({"protected_attributes": [{"name": "gender", "groups": ["male", "female", "x"]}]},
                              "m1 (attributes: was"), ({"windows": ["1h", "12h"]}, "m1 (windows: was"),
                             ({"model_version": "2.0"}, "m1 (model_version: was")):  # fmt: skip
        caplog.clear()
        d2 = make_daemon(checkpoint=cp, **changed)
        assert "models reset (their layout changed): " + differs in caplog.text
        assert "their previous state is kept in" in caplog.text  # tests/test_layout_changes.py: how
        assert value(d2, "model_subgroup_samples", **group) == 0  # afresh, as a reload would leave it
        assert d2.fleet.offsets == {("predictions", 1): 8}  # those events are not read again
        assert not d2.fleet.joins.pending  # their codes belong to the old layout
        assert value(d2, "fairness_exporter_labels_dropped_total", reason="model_reconfigured") == 8


def test_checkpoint_is_written_atomically(make_daemon, tmp_path: Path) -> None:
    d = make_daemon(checkpoint={"path": str(tmp_path)})
    d.ingest.handle("predictions", 0, records(predictions(1, 2, "male", "a")))
    d.checkpointer.write()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["fleet.checkpoint.npz"]
    (tmp_path / "fleet.checkpoint.npz").write_bytes(b"garbage")
    with pytest.raises(CheckpointError, match="unreadable checkpoint"):
        make_daemon(checkpoint={"path": str(tmp_path)})


def test_a_duplicate_prediction_id_replaces_the_waiting_one_and_is_counted(make_daemon) -> None:
    d = make_daemon()
    d.ingest.handle("predictions", 0, records([event("male", prediction=1, ts=T0 - 60, prediction_id="same"),
                                               event("female", prediction=0, ts=T0 - 60, prediction_id="same")]))
    assert value(d, "fairness_exporter_labels_dropped_total", reason="duplicate_prediction") == 1
    assert value(d, "fairness_exporter_pending_predictions") == 1
    d.ingest.handle("labels", 0, records([{"prediction_id": "same", "label": 1}]))
    # the label joins the later prediction (female, predicted 0): a false negative for women
    assert value(d, "model_subgroup_labelled_samples", attribute="gender", window="1h", subgroup="female") == 1
    assert value(d, "model_subgroup_labelled_samples", attribute="gender", window="1h", subgroup="male") == 0


def test_pending_ids_are_bounded_and_stored_compactly(make_daemon, tmp_path: Path) -> None:
    cp = {"path": str(tmp_path)}
    d = make_daemon(checkpoint=cp)
    d.checkpointer.write()
    empty = (tmp_path / "fleet.checkpoint.npz").stat().st_size
    ids = [f"id-{i}" for i in range(199)]
    d.ingest.handle("predictions", 0, records([event(ts=T0 - 60, prediction_id=pid) for pid in ids]
                                              + [event(ts=T0 - 60, prediction_id="x" * 250_000)]))  # fmt: skip
    assert value(d, "fairness_exporter_events_rejected_total", reason="invalid_prediction_id") == 1
    assert value(d, "fairness_exporter_pending_predictions") == 199
    d.ingest.handle("predictions", 0, records([event(ts=T0 - 60, prediction_id="y" * 256)], start=200))
    d.checkpointer.write()
    # 200 ids, one of them 256 characters: a fixed-width array would add 200 * 256 * 4 = 204,800 bytes
    assert (tmp_path / "fleet.checkpoint.npz").stat().st_size - empty < 10_000
    restored = make_daemon(checkpoint=cp)
    assert sorted(restored.fleet.joins.pending) == sorted([*ids, "y" * 256])


def test_a_failed_checkpoint_is_counted_leaves_no_temp_file_and_commits_nothing_new(make_daemon,
                                                                                   tmp_path: Path) -> None:  # fmt: skip
    d = make_daemon(checkpoint={"path": str(tmp_path)})
    d.ingest.handle("predictions", 0, records(predictions(1, 2, "male", "a")))
    d.checkpointer.write()
    assert d.checkpointer.committable() == {("predictions", 0): 2}
    d.ingest.handle("predictions", 0, records(predictions(1, 2, "male", "b"), start=2))
    (tmp_path / "fleet.checkpoint.npz").unlink()
    (tmp_path / "fleet.checkpoint.npz").mkdir()  # the rename onto it fails after the temp file is written
    (tmp_path / "fleet.checkpoint.npz" / "keep").touch()
    d.checkpointer.flush()  # logs, does not raise
    assert value(d, "fairness_exporter_checkpoint_failures_total") == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["fleet.checkpoint.npz"]
    assert d.checkpointer.committable() == {("predictions", 0): 2}  # not 4: those events are not durable


def test_the_constructor_does_no_io_start_restores_and_binds(tmp_path: Path) -> None:
    (tmp_path / "fleet.checkpoint.npz").write_bytes(b"garbage")
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        config = make_config(checkpoint={"path": str(tmp_path)}, listen={"address": "127.0.0.1", "port": port})
        daemon = Daemon(config, registry=CollectorRegistry())  # neither the checkpoint nor the port is touched
        assert daemon.http is None
        with pytest.raises(CheckpointError, match="unreadable checkpoint"):
            daemon.start()  # the checkpoint is read first, before anything is bound or started
    assert not daemon.source.alive and not daemon.scheduler.running


def test_a_dead_letter_producer_that_cannot_be_made_drops_the_dead_letters_not_the_batch() -> None:
    # no broker answers kafka-python's producer as it is made (settings it refuses stop the start instead:
    # tests/test_dead_letters.py)
    config = make_config(kafka={"dead_letter_topic": "dlq", "bootstrap_servers": "127.0.0.1:1"})
    d = Daemon(config, registry=CollectorRegistry(), clock=Clock())
    d.ingest.handle("predictions", 0, [Record(b"{broken", 0), *records(predictions(1, 3, "male", "a"), start=1)])
    assert value(d, "fairness_exporter_dead_letters_failed_total", reason="no_producer") == 1
    assert value(d, "fairness_exporter_events_rejected_total", reason="malformed_json") == 1
    assert value(d, "model_subgroup_samples", attribute="gender", window="1h", subgroup="male") == 3
    assert d.fleet.offsets == {("predictions", 0): 4}


def _as_single_model_checkpoint(fleet_file: Path, directory: Path) -> Path:
    """The same state in the format of a daemon of one model (format 1): the model's arrays unprefixed, one row of
    codes per pending prediction, the layout at the top of the metadata."""
    with np.load(fleet_file) as data:
        arrays = {k: data[k] for k in data.files}
    meta = json.loads(str(arrays.pop("__meta__")))
    (model_id, written), = meta.pop("models").items()
    single = {k.removeprefix(written["prefix"]): v for k, v in arrays.items() if k.startswith(written["prefix"])}
    join = {k.removeprefix("join."): v for k, v in arrays.items() if k.startswith("join.")}
    width = int(join.pop("pending_model_width")[0]) if len(join["pending_model_width"]) else 2
    join["pending_codes"] = join.pop("pending_codes_flat").reshape(-1, width)
    for key in ("pending_model_name_id_bytes", "pending_model_name_id_lengths", "pending_model_size"):
        join.pop(key)
    directory.mkdir(parents=True, exist_ok=True)
    path = checkpoint.checkpoint_path(directory, model_id)
    meta = {**meta, "version": 1, "layout": written["layout"]}
    np.savez(path, __meta__=np.array(json.dumps(meta)), **single, **join)
    return path


def test_a_single_model_checkpoint_is_carried_into_the_fleets_file(make_daemon, tmp_path: Path) -> None:
    d1 = make_daemon(checkpoint={"path": str(tmp_path / "fleet")})
    d1.ingest.handle("predictions", 1, records(predictions(3, 8, "male", "a")))
    d1.checkpointer.write()
    old = _as_single_model_checkpoint(tmp_path / "fleet" / checkpoint.FLEET_FILE, tmp_path / "single")
    d2 = make_daemon(checkpoint={"path": str(tmp_path / "single")})
    group = {"attribute": "gender", "window": "1h", "subgroup": "male"}
    assert value(d2, "model_positive_prediction_rate", **group) == 3 / 8
    assert d2.fleet.offsets == {("predictions", 1): 8} and len(d2.fleet.joins.pending) == 8
    d2.checkpointer.write()  # the fleet's file now holds it, and the old one is set aside, never read again
    assert sorted(p.name for p in old.parent.iterdir()) == [checkpoint.FLEET_FILE, f"{old.name}.migrated"]
    assert value(make_daemon(checkpoint={"path": str(tmp_path / "single")}), "model_subgroup_samples", **group) == 8


def test_single_model_checkpoints_are_refused_by_a_daemon_of_several_models(make_daemon, tmp_path: Path) -> None:
    d1 = make_daemon(checkpoint={"path": str(tmp_path / "fleet")})
    d1.checkpointer.write()
    _as_single_model_checkpoint(tmp_path / "fleet" / checkpoint.FLEET_FILE, tmp_path / "single")
    attributes = [{"name": "gender", "groups": ["male", "female"]}]
    with pytest.raises(CheckpointError, match=r"m1\.checkpoint\.npz was written by a daemon of one model.*merged"):
        Daemon(make_config(checkpoint={"path": str(tmp_path / "single")}, model_id=None,
                           models=[{"model_id": "m1"}, {"model_id": "m2", "protected_attributes": attributes}]),
               registry=CollectorRegistry()).checkpointer.restore()  # fmt: skip
