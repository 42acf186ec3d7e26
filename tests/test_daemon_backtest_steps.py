"""Review 33: the daemon's scheduled computation and `backtest` must step the detectors identically (the same
steps from the same rows), as exporter/backtest/replay.py and docs/sre/alerts.md promise.

The daemon here runs as it does in production: its computation is an APScheduler interval job (every
`evaluation_interval`, 15 s by default) on the wall clock, started whenever the process started, and events reach
it in real time (each one counted at most one tick after its timestamp). The backtest replays the same events."""

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

TICK = 15.0  # the default evaluation_interval


def _daemon_in_real_time(frame: pd.DataFrame, jsonl: Path, ticks: np.ndarray) -> tuple[Daemon, dict[int, float]]:
    """The daemon, its computation at each of ``ticks`` (every TICK seconds from when the process started), each
    tick first counting the events whose time has come (a consumer without lag), then computing; with the time
    at which each detector first was in alarm (its first page)."""
    config = parse_config({**RAW_CONFIG, "listen": {"address": "127.0.0.1", "port": 0}})
    daemon = Daemon(config, registry=CollectorRegistry(), clock=Clock())
    payloads = jsonl.read_bytes().splitlines()
    times = frame["timestamp"].to_numpy()
    offset = 0
    paged: dict[int, float] = {}
    for tick in ticks:
        upto = int(np.searchsorted(times, tick, side="right"))
        batch = [Record(p, offset + i) for i, p in enumerate(payloads[offset:upto])]
        daemon.clock.now = float(tick)
        if batch:
            daemon.ingest.handle("predictions", 0, batch)
        daemon.computer.compute()
        offset = upto
        active = daemon.fleet.models["m1"].store.detection.state.active
        for i in np.flatnonzero(active):
            paged.setdefault(int(i), float(tick))
    return daemon, paged


def _events_until(frame: pd.DataFrame, ticks: np.ndarray, path: Path) -> tuple[pd.DataFrame, Path]:
    """The events the daemon has counted by its last tick, and the recording of them the backtest replays."""
    frame = frame[frame["timestamp"] <= ticks[-1]].reset_index(drop=True)
    return frame, as_jsonl(frame, path)


def _replayed(jsonl: Path) -> Replay:
    config = parse_config(RAW_CONFIG)
    replay = Replay(config.model(), config.windowing)
    for columns, _, _ in read_events([jsonl], config):
        replay.feed(columns[config.model().model_id])
    replay.finish()
    return replay


def test_a_daemon_computing_off_the_minute_reaches_the_backtests_detector_state(tmp_path: Path) -> None:
    """A daemon started 7 s into a minute computes at :07, :22, :37, :52: its step at :07 holds the minute before
    plus the first 7 s of this one, where the backtest's step holds exactly the minute before. Same events, same
    number of steps, but not the same statistics."""
    ticks = T0 + 7.0 + TICK * np.arange(4 * 89 + 1)  # :07, :22, ... up to minute 89's :07
    frame, jsonl = _events_until(drifting_events(hours=1.5), ticks, tmp_path / "events.jsonl")
    daemon, _ = _daemon_in_real_time(frame, jsonl, ticks)
    replay = _replayed(jsonl)
    store = daemon.fleet.models["m1"].store
    np.testing.assert_array_equal(replay.store.totals, store.totals)  # the same rows were counted ...
    assert replay.store.detection.steps == store.detection.steps == 90  # ... in as many steps
    np.testing.assert_allclose(store.detection.state.statistic, replay.store.detection.state.statistic, rtol=1e-9)


def test_a_quiet_minute_is_a_step_for_the_daemon_and_for_the_backtest(tmp_path: Path) -> None:
    """Traffic stops for 5 minutes (a deploy, a quiet night hour). The daemon's clock goes on, so it takes a step in
    each quiet bucket (the alarm level counts 1440 steps a day); the backtest's head is the newest event, so it
    takes none, and the two end with different step counts and statistics."""
    frame = drifting_events(hours=1.5)
    minute = ((frame["timestamp"] - T0) // 60).astype(int)
    frame = frame[(minute < 30) | (minute >= 35)].reset_index(drop=True)
    ticks = T0 + 59.0 + TICK * np.arange(4 * 89 + 1)  # :59, :14, :29, :44: each bucket's last tick is after its events
    frame, jsonl = _events_until(frame, ticks, tmp_path / "events.jsonl")
    daemon, _ = _daemon_in_real_time(frame, jsonl, ticks)
    replay = _replayed(jsonl)
    store = daemon.fleet.models["m1"].store
    np.testing.assert_array_equal(replay.store.totals, store.totals)
    assert replay.store.detection.steps == store.detection.steps
    np.testing.assert_allclose(store.detection.state.statistic, replay.store.detection.state.statistic, rtol=1e-9)
