"""State that a clock running ahead, or a config change, leaves behind: a window head in the future (in a checkpoint
or in a running daemon) is brought back to the clock, and predictions waiting for labels no topic will bring are
given up at restore. Each test says what happened before. They need no broker."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from daemon_config import make_config
from prometheus_client import CollectorRegistry
from test_labels_and_checkpoint import predictions, records, value

from exporter.daemon import Daemon
from exporter.stream.state.clock import TRUST_SECONDS, SteadyClock

DAY = 86400.0
OVERALL_1H = {"attribute": "gender", "subgroup": "overall", "window": "1h"}
OVERALL_24H = {"attribute": "gender", "subgroup": "overall", "window": "24h"}


def test_a_checkpoint_written_while_the_wall_clock_was_days_ahead_does_not_blind_the_restarted_daemon(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A node booted with its clock two days ahead (a VM without a battery-backed clock, a wrong RTC): the daemon
    starts on it (no jump seen: that is simply its clock), reads, and writes checkpoints; the window head, saved in
    the checkpoint, is two days ahead. NTP sets the clock right and the pod is restarted on the same volume.

    A head (and a detector step) beyond the clock by more than ``max_future_skew`` is not trusted at restore
    (``WindowStore.follow``): the buckets after now are dropped, the head and the last step brought back to now's
    bucket, logged and counted (``fairness_exporter_window_rewinds_total``), so events of now are counted once the
    clock is set right.

    Before: ``WindowStore.restore`` took the checkpoint's head as it was, and the head never moved back, so every
    event of now was "older than the longest window plus allowed_lateness": dropped as late, for two days, after
    the restart as before it, with nothing paging (no alert read ``fairness_exporter_events_late_total``) and
    ``/readyz`` at 200. (One day ahead: nothing late, but the 1h window ended a day from now and showed 0 for a
    day.) The detectors' ``last_step`` was in the future too, so they took no step either."""
    real = time.time()
    config = make_config(checkpoint={"path": str(tmp_path), "interval": "30s"})
    monkeypatch.setattr(time, "time", lambda: real + 2 * DAY)  # the node's clock, as the daemon starts on it
    first = Daemon(config, registry=CollectorRegistry())
    first.checkpointer.restore()
    first.ingest.handle("predictions", 0, records(predictions(3, 10, "male", "a", ts=real - 60)))
    assert value(first, "fairness_exporter_events_late_total") == 10  # expected while the clock is wrong
    first.checkpointer.write()

    monkeypatch.setattr(time, "time", lambda: real + 60)  # NTP set the clock right; the pod restarts
    second = Daemon(config, registry=CollectorRegistry())
    second.checkpointer.restore()
    second.ingest.handle("predictions", 0, records(predictions(3, 10, "male", "b", ts=real + 30), start=10))
    late = value(second, "fairness_exporter_events_late_total")
    counted = value(second, "model_subgroup_samples", **OVERALL_1H), value(second, "model_subgroup_samples",
                                                                            **OVERALL_24H)  # fmt: skip
    assert (late, counted) == (0, (10, 10)), (
        f"after the restart with the clock set right, {late:.0f} of 10 events of now were dropped as late and the "
        f"1h/24h windows hold {counted}: the checkpoint's head, two days ahead, blinds the daemon for two days"
    )


def test_a_running_daemon_whose_wall_clock_is_set_back_after_running_ahead_counts_events_of_now_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The wall clock runs two days ahead for a while (a wrong NTP source; SteadyClock follows it after
    TRUST_SECONDS, by design: it must follow a correction), then is set right (followed again after TRUST_SECONDS).

    When the clock the daemon follows is set back past ``max_future_skew`` behind the head, the window follows it
    (the head and the detectors' last step brought back to the clock, logged and counted), and events of now are
    counted.

    Before: while the clock was ahead the head moved two days ahead (every computation advances it to ``now``), and
    it never moved back, so once the clock was right again every event was dropped as late until real time reached
    the head: two days in which the running daemon counted nothing, said ready, and paged nobody (a restart did not
    help: the checkpoint kept the head)."""
    real = time.time()
    wall, steady = [real], [1000.0]
    clock = SteadyClock(wall=lambda: wall[0], steady=lambda: steady[0])
    daemon = Daemon(make_config(), registry=CollectorRegistry(), clock=clock)
    monkeypatch.setattr(time, "time", lambda: wall[0])  # what the decoder reads, if anything, is the same clock

    def tick(seconds: float, offset: float) -> None:
        """``seconds`` pass on the steady clock with the wall clock ``offset`` from real time."""
        for _ in range(int(seconds // 60) + 1):
            steady[0] += 60
            wall[0] = real + (steady[0] - 1000.0) + offset
            clock()

    tick(60, 0)
    daemon.ingest.handle("predictions", 0, records(predictions(3, 10, "male", "a", ts=wall[0] - 30)))
    assert value(daemon, "model_subgroup_samples", **OVERALL_1H) == 10
    tick(TRUST_SECONDS + 120, 2 * DAY)  # a wrong source: two days ahead, followed after TRUST_SECONDS
    assert clock() == pytest.approx(wall[0])
    value(daemon, "model_subgroup_samples", **OVERALL_1H)  # a computation while the clock is ahead
    tick(TRUST_SECONDS + 120, 0)  # set right again, followed after TRUST_SECONDS
    assert clock() == pytest.approx(wall[0])
    now = wall[0]
    daemon.ingest.handle("predictions", 0, records(predictions(3, 10, "male", "b", ts=now - 30), start=10))
    late = value(daemon, "fairness_exporter_events_late_total")
    counted = value(daemon, "model_subgroup_samples", **OVERALL_1H)
    assert (late, counted) == (0, 10), (
        f"with the clock right again, {late:.0f} of 10 events of now were dropped as late and the 1h window holds "
        f"{counted:.0f}: the head stays two days ahead"
    )


def test_predictions_waiting_for_labels_in_a_checkpoint_are_given_up_after_the_labels_topic_is_dropped(
    tmp_path: Path,
) -> None:
    """A daemon with ``kafka.labels_topic`` checkpoints 10 predictions waiting for their labels; the team stops
    sending labels and restarts it without a labels topic (``kafka`` changes only by a restart).

    They are given up at restore, with the orphan labels, logged and counted
    (``fairness_exporter_labels_dropped_total{reason="model_reconfigured"}``: no topic will ever join them; a
    ``never_labelled`` expiry is accepted too), and leave the join. (Scheduling the expiry job alone would not be
    enough: the checkpoint's labels clock holds expiry back for one horizon after a restart until labels are read
    again, and none will be.)

    Before: ``Checkpointer.restore`` put the 10 back into the label join, but ``Daemon.start`` schedules the expiry
    job only with a labels topic (or attribute sources), so they waited forever: never expired, never counted as
    given up, carried into every checkpoint, held in memory (up to ``max_pending_labels``) and shown in
    ``fairness_exporter_pending_predictions``: state of another config kept in silence."""
    t0 = time.time()
    checkpoint = {"path": str(tmp_path), "interval": "30s"}
    with_labels = make_config(kafka={"labels_topic": "labels", "bootstrap_servers": "127.0.0.1:1"},
                              label_horizon="1h", checkpoint=checkpoint)  # fmt: skip
    first = Daemon(with_labels, registry=CollectorRegistry(), clock=lambda: t0)
    first.checkpointer.restore()
    first.ingest.handle("predictions", 0, records(predictions(3, 10, "male", "w", ts=t0 - 60)))
    assert len(first.fleet.joins.pending) == 10
    first.checkpointer.write()

    without = make_config(kafka={"bootstrap_servers": "127.0.0.1:1"}, label_horizon="1h", checkpoint=checkpoint)
    second = Daemon(without, registry=CollectorRegistry(), clock=lambda: t0 + 2 * 3600)  # past the horizon
    second.start()
    try:
        time.sleep(12)  # past the expiry job's period (EXPIRY_EVERY_SECONDS), had it been scheduled
        pending = len(second.fleet.joins.pending)
        given_up = sum(value(second, name, reason=reason) or 0 for name, reason in (
            ("fairness_exporter_labels_expired_total", "never_labelled"),
            ("fairness_exporter_labels_dropped_total", "model_reconfigured")))  # fmt: skip
    finally:
        second.stop()
    assert (pending, given_up) == (0, 10), (
        f"{pending} predictions of the old config still wait for labels no topic will bring, {given_up:.0f} counted "
        "as given up"
    )
