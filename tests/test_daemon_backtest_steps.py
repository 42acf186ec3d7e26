"""The daemon and `backtest` step the detectors identically: the same steps from the same rows, however the daemon
computes (exporter/stream/state/detection.py: a step per bucket of the events' time, taken when the events enter a
later bucket, quiet buckets as empty steps).

The daemon here runs as it does in production: its computation is an APScheduler interval job (every
`evaluation_interval`, 15 s by default) on the wall clock, started whenever the process started, and events reach
it in real time (each one counted at most one tick after its timestamp); or, reading a backlog, long after. The
backtest replays the same events."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
from prometheus_client import CollectorRegistry
from test_backtest import RAW_CONFIG, T0, as_jsonl, drifting_events
from test_labels_and_checkpoint import Clock, Record

from exporter.backtest.replay import Replay, read_events
from exporter.config import parse_config
from exporter.daemon import Daemon
from exporter.stream.state.steps import add_stepped
from exporter.stream.state.window import WindowStore

TICK = 15.0  # the default evaluation_interval


def _daemon(**extra: object) -> Daemon:
    config = parse_config({**RAW_CONFIG, "listen": {"address": "127.0.0.1", "port": 0}, **extra})
    return Daemon(config, registry=CollectorRegistry(), clock=Clock())


def _daemon_in_real_time(jsonl: Path, frame: pd.DataFrame, ticks: np.ndarray, daemon: Daemon | None = None) -> Daemon:
    """The daemon, its computation at each of ``ticks`` (every TICK seconds from when the process started), each
    tick first counting the events whose time has come (a consumer without lag), then computing."""
    daemon = daemon or _daemon()
    payloads = jsonl.read_bytes().splitlines()
    times = frame["timestamp"].to_numpy()
    offset = 0
    for tick in ticks:
        upto = int(np.searchsorted(times, tick, side="right"))
        batch = [Record(p, offset + i) for i, p in enumerate(payloads[offset:upto])]
        daemon.clock.now = float(tick)
        if batch:
            daemon.ingest.handle("predictions", 0, batch)
        daemon.computer.compute()
        offset = upto
    return daemon


def _events_until(frame: pd.DataFrame, until: float, path: Path) -> tuple[pd.DataFrame, Path]:
    """The events the daemon has counted by ``until``, and the recording of them the backtest replays."""
    frame = frame[frame["timestamp"] <= until].reset_index(drop=True)
    return frame, as_jsonl(frame, path)


def _replayed(jsonl: Path) -> Replay:
    config = parse_config(RAW_CONFIG)
    replay = Replay(config.model(), config.windowing)
    for columns, _, _ in read_events([jsonl], config):
        replay.feed(columns[config.model().model_id])
    replay.finish()
    return replay


def _assert_same_detectors(daemon: Daemon, replay: Replay, steps: int) -> None:
    store = daemon.fleet.models["m1"].store
    np.testing.assert_array_equal(replay.store.totals, store.totals)  # the same rows were counted ...
    assert replay.store.detection.steps == store.detection.steps == steps  # ... in as many steps ...
    assert replay.store.detection.last_step == store.detection.last_step  # ... the same bucket open ...
    np.testing.assert_array_equal(replay.store.detection.seen, store.detection.seen)  # ... holding the same rows
    np.testing.assert_allclose(store.detection.state.statistic, replay.store.detection.state.statistic, rtol=1e-9)
    np.testing.assert_array_equal(store.detection.state.active, replay.store.detection.state.active)


def test_a_daemon_computing_off_the_minute_reaches_the_backtests_detector_state(tmp_path: Path) -> None:
    """A daemon started 7 s into a minute computes at :07, :22, :37, :52. Its step of a minute holds exactly that
    minute's events, as the backtest's: 89 steps for minutes 0 to 88, minute 89 (7 s of it) open in both.

    Before: its step was taken at the first computation in a minute and held the minute before plus the first 7 s
    of this one: same rows, same number of steps, two statistics 0.557 nats apart."""
    ticks = T0 + 7.0 + TICK * np.arange(4 * 89 + 1)  # :07, :22, ... up to minute 89's :07
    frame, jsonl = _events_until(drifting_events(hours=1.5), ticks[-1], tmp_path / "events.jsonl")
    _assert_same_detectors(_daemon_in_real_time(jsonl, frame, ticks), _replayed(jsonl), 89)


def test_a_quiet_minute_is_a_step_for_the_daemon_and_for_the_backtest(tmp_path: Path) -> None:
    """Traffic stops for 5 minutes (a deploy, a quiet night hour): both take an empty step for each quiet minute
    (the alarm level counts 1440 steps a day), 89 in all.

    Before: the daemon's clock took them, the backtest's head (the newest event) none: 90 steps against 85."""
    frame = drifting_events(hours=1.5)
    minute = ((frame["timestamp"] - T0) // 60).astype(int)
    frame = frame[(minute < 30) | (minute >= 35)].reset_index(drop=True)
    ticks = T0 + 59.0 + TICK * np.arange(4 * 89 + 1)  # :59, :14, :29, :44: each bucket's last tick is after its events
    frame, jsonl = _events_until(frame, ticks[-1], tmp_path / "events.jsonl")
    _assert_same_detectors(_daemon_in_real_time(jsonl, frame, ticks), _replayed(jsonl), 89)


def test_a_daemon_reading_a_backlog_takes_the_backtests_steps(tmp_path: Path) -> None:
    """The daemon starts 20 minutes after the last event (a consumer group reading what the topic holds, a restart
    after an outage) and reads 90 minutes of events in polls of 20,000 records, computing every 15 s meanwhile:
    a step per minute of the events, as the backtest, not one for the whole backlog."""
    _, jsonl = _events_until(drifting_events(hours=1.5), T0 + 90 * 60, tmp_path / "events.jsonl")
    daemon = _daemon()
    payloads = jsonl.read_bytes().splitlines()
    for i, start in enumerate(range(0, len(payloads), 20_000)):
        daemon.clock.now = T0 + 110 * 60 + TICK * i
        daemon.ingest.handle("predictions", 0, [Record(p, start + j) for j, p in
                                                enumerate(payloads[start : start + 20_000])])  # fmt: skip
        daemon.computer.compute()
    _assert_same_detectors(daemon, _replayed(jsonl), 89)


def test_steps_taken_but_not_yet_computed_survive_a_checkpoint(tmp_path: Path) -> None:
    """The events' steps are taken as they are counted, and run through the detectors at the next computation: a
    checkpoint written in between holds them, so the restarted daemon ends where one that never stopped does."""
    frame, jsonl = _events_until(drifting_events(hours=1.5), T0 + 90 * 60, tmp_path / "events.jsonl")
    half = int(np.searchsorted(frame["timestamp"].to_numpy(), T0 + 45 * 60 + 30))
    first = _daemon(checkpoint={"path": str(tmp_path / "state")})
    first.checkpointer.restore()
    first.clock.now = T0 + 45 * 60 + 30
    first.ingest.handle("predictions", 0, [Record(p, i) for i, p in
                                           enumerate(jsonl.read_bytes().splitlines()[:half])])  # fmt: skip
    assert len(first.fleet.models["m1"].store.detection.queued) == 45  # taken, not yet computed
    first.checkpointer.write()
    resumed = _daemon(checkpoint={"path": str(tmp_path / "state")})
    resumed.clock.now = first.clock.now
    resumed.checkpointer.restore()
    assert len(resumed.fleet.models["m1"].store.detection.queued) == 45
    ticks = T0 + 45 * 60 + 30 + TICK * np.arange(4 * 45)
    later = frame[frame["timestamp"] > frame["timestamp"][half - 1]].reset_index(drop=True)
    _daemon_in_real_time(as_jsonl(later, tmp_path / "later.jsonl"), later, ticks, resumed)
    _assert_same_detectors(resumed, _replayed(jsonl), 89)


def test_a_quiet_spell_longer_than_the_ring_takes_the_rings_length_of_empty_steps() -> None:
    """A restart after days down, two recordings a month apart: the spell's empty steps stop at the ring's length
    (the longest window plus the allowed lateness), in the daemon's counting and the backtest's batched one alike."""
    config = parse_config({**RAW_CONFIG, "windows": ["10m"], "allowed_lateness": "2m"})
    t = np.array([T0 + 1.0, T0 + 30.0, T0 + 86_400.0 * 30, T0 + 86_400.0 * 30 + 61.0])
    codes = {"gender": np.array([0, 1, 0, 1]), "age": np.array([0, 0, 1, 1])}
    predictions, labels = np.array([1, 0, 1, 1]), np.full(4, -1)
    counted, batched = WindowStore(config.model(), config.windowing), WindowStore(config.model(), config.windowing)
    for part in (slice(0, 2), slice(2, 4)):  # as they arrive, in real time
        counted.add(t[part], {k: v[part] for k, v in codes.items()}, predictions[part], labels[part],
                    float(t[part][-1]))
    steps = add_stepped(batched, t, codes, predictions, labels, np.maximum.accumulate(t), -np.inf)
    assert counted.n_buckets == 13
    # minute 0 (2 events), its 13 quiet successors, then the month's first minute (1 event); its next one is open
    assert counted.detection.steps == batched.detection.steps == len(steps.times) == 1 + 13 + 1
    queued, _ = counted.take_queued()
    np.testing.assert_array_equal(queued, steps.counts)
    assert queued.sum(axis=(1, 2)).tolist() == [2 * 2, *[0] * 13, 2]  # each event counts for both attributes
    np.testing.assert_array_equal(steps.times[1:14], T0 + 60.0 * np.arange(1, 14))  # a quiet step: its bucket's start
