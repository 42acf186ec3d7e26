"""The daemon's health alerts at every period the config accepts (review 16); FairnessExporterStateSnapshotFailing,
the staged path's, alike.

`checkpoint.interval` may be anything from 1s to 1h and `evaluation_interval` anything from 1s to the shortest window
(docs/faults.md, "A period or a floor out of range"). FairnessExporterCheckpointFailing and
FairnessExporterComputationStale read the periods the daemon exports (fairness_exporter_checkpoint_interval_seconds,
fairness_exporter_evaluation_interval_seconds), so that at each of them a failing checkpoint or a stopped computation
alerts and a healthy daemon stays quiet. Each case feeds promtool the committed rules and the series the daemon itself
exports at that period, scraped every minute; the default periods' edges and annotations are in
rules/tests/health.test.yaml.
"""

from __future__ import annotations

import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml
from daemon_config import make_config
from prometheus_client import CollectorRegistry
from tooling import require_binary

from exporter.config import Config, ConfigError
from exporter.daemon import Daemon

ROOT = Path(__file__).resolve().parent.parent
RULE_FILE = ROOT / "rules" / "fairness-exporter.rules.yaml"
LABELS = 'job="fairness-exporter",instance="a:9108"'
CHECKPOINT = "FairnessExporterCheckpointFailing"
SNAPSHOT = "FairnessExporterStateSnapshotFailing"
STALE = "FairnessExporterComputationStale"


def _promtool_test(tmp_path: Path, test: dict[str, Any]) -> subprocess.CompletedProcess[str]:
    """promtool on one test of the committed rules. The annotations are left out (their text is checked in
    rules/tests/health.test.yaml): an expected alert here is its labels at its times."""
    spec = yaml.safe_load(RULE_FILE.read_text(encoding="utf-8"))["spec"]
    for group in spec["groups"]:
        for rule in group["rules"]:
            rule.pop("annotations", None)
    (tmp_path / "plain-rules.yaml").write_text(yaml.safe_dump(spec, sort_keys=False), encoding="utf-8")
    (tmp_path / "case.test.yaml").write_text(yaml.safe_dump(
        {"rule_files": ["plain-rules.yaml"], "evaluation_interval": "1m", "tests": [test]}, sort_keys=False),
        encoding="utf-8")  # fmt: skip
    return subprocess.run([require_binary("promtool"), "test", "rules", "case.test.yaml"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=300, check=False)  # fmt: skip


def _steps(every: int, steps: int, per_step: int = 1, start: int = 0) -> str:
    """A promtool series that changes by ``per_step`` every ``every`` minutes: ``0x14 1x14 2x14 ...``."""
    return " ".join(f"{start + i * per_step}x{every - 1}" for i in range(steps))


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


def _series(instance: str, values: dict[str, list[float] | str]) -> list[dict[str, str]]:
    """promtool input series of one target, one value per minute (or promtool's own notation)."""
    def text(v: list[float] | str) -> str:
        return v if isinstance(v, str) else " ".join(f"{x:g}" for x in v)

    return [{"series": f'{name}{{job="fairness-exporter",instance="{instance}"}}', "values": text(v)}
            for name, v in values.items()]  # fmt: skip


def _alerts(alertname: str, minutes: range, firing: Callable[[int], list[str]]) -> list[dict[str, Any]]:
    """An alert_rule_test case for each minute: the instances ``firing(minute)`` fire, no other."""
    return [{"alertname": alertname, "eval_time": f"{minute}m",
             "exp_alerts": [{"exp_labels": {"severity": "warning", "job": "fairness-exporter", "instance": instance}}
                            for instance in firing(minute)]} for minute in minutes]  # fmt: skip


def _checkpointing(minutes: int, interval: float, fails: Callable[[float], bool] = lambda _: False, *,
                   restart: float | None = None, reload: tuple[float, float] | None = None,
                   ) -> dict[str, list[float]]:  # fmt: skip
    """The checkpoint series of a direct replica started at 0 (and again at ``restart``), scraped every minute: a
    checkpoint tried every ``interval`` seconds after its start, failing where ``fails(t)``; a ``reload`` (at, new
    interval) reschedules the checkpoints from then, as the daemon's scheduler does."""
    starts = [0.0] if restart is None else [0.0, restart]
    tried: list[tuple[float, float, bool]] = []  # (its process's start, time, written)
    for begin, end in zip(starts, [*starts[1:], minutes * 60.0], strict=True):
        at, every = begin, interval
        while True:
            if reload is not None and at < reload[0] <= at + every:
                at, every = reload[0], reload[1]
            at += every
            if at >= end:
                break
            tried.append((begin, at, not fails(at)))
    out: dict[str, list[float]] = {"fairness_exporter_start_timestamp_seconds": [],
                                   "fairness_exporter_checkpoint_interval_seconds": [],
                                   "fairness_exporter_last_checkpoint_timestamp_seconds": [],
                                   "fairness_exporter_checkpoint_failures_total": []}  # fmt: skip
    for minute in range(minutes):
        now = minute * 60.0
        start = max(s for s in starts if s <= now)
        mine = [(t, written) for s, t, written in tried if s == start and t <= now]
        out["fairness_exporter_start_timestamp_seconds"].append(start)
        out["fairness_exporter_checkpoint_interval_seconds"].append(
            reload[1] if reload is not None and now >= reload[0] else interval)
        out["fairness_exporter_last_checkpoint_timestamp_seconds"].append(max([t for t, w in mine if w], default=0))
        out["fairness_exporter_checkpoint_failures_total"].append(sum(1 for _, w in mine if not w))
    return out


STAGED_NAMES = {"fairness_exporter_checkpoint_interval_seconds": "fairness_exporter_state_snapshot_interval_seconds",
                "fairness_exporter_last_checkpoint_timestamp_seconds":
                    "fairness_exporter_last_state_snapshot_timestamp_seconds",
                "fairness_exporter_checkpoint_failures_total": "fairness_exporter_state_snapshot_failures_total"}


def _snapshotting(minutes: int, interval: float, fails: Callable[[float], bool] = lambda _: False, *,
                  restart: float | None = None, reload: tuple[float, float] | None = None,
                  ) -> dict[str, list[float]]:  # fmt: skip
    """The same, for a staged replica: its snapshot rounds run as the checkpoints do (every ``interval`` after its
    start), under the staged series' names; it writes no checkpoint file, so its checkpoint series stay 0."""
    rounds = _checkpointing(minutes, interval, fails, restart=restart, reload=reload)
    return {STAGED_NAMES.get(name, name): values for name, values in rounds.items()} | {
        name: [0.0] * minutes for name in STAGED_NAMES if name != "fairness_exporter_checkpoint_failures_total"}


PATHS = pytest.mark.parametrize(("alert", "other", "writing"), [
    (CHECKPOINT, SNAPSHOT, _checkpointing), (SNAPSHOT, CHECKPOINT, _snapshotting)], ids=["direct", "staged"])
"""The age-based alerts on a replica's durable state, each on its own path; the other path's never fires."""


def _computing(minutes: int, interval: float, fails: Callable[[float], bool]) -> dict[str, list[float]]:
    """The computation series of a daemon started at 0, scraped every minute: a computation at the start and every
    ``interval`` seconds after, failing (or not run) where ``fails(t)``."""
    times = [k * interval for k in range(int(minutes * 60 // interval) + 1)]
    return {"fairness_exporter_evaluation_interval_seconds": [interval] * minutes,
            "fairness_exporter_last_computation_timestamp_seconds": [
                max((t for t in times if t <= minute * 60 and not fails(t)), default=0) for minute in range(minutes)]}


@pytest.mark.prometheus
def test_a_checkpoint_that_fails_at_every_15_minute_interval_is_alerted(tmp_path: Path) -> None:
    """Review 16: with `checkpoint.interval: 15m` every checkpoint fails for 2 hours (8 failures, none succeeding).
    The alert was `rate(fairness_exporter_checkpoint_failures_total[10m]) > 0 for: 10m`: one failure every 15
    minutes keeps that rate above 0 for at most the 10 minutes after each, never for 10 minutes on end, so it never
    fired, and no offset was committed for hours. Now no checkpoint for 2 intervals and 300s since the start pages."""
    config = make_config(checkpoint={"path": str(tmp_path / "state"), "interval": "15m"})
    assert config.checkpoint_interval_seconds == 900  # accepted: no refusal at start
    exported = _exported(config)
    result = _promtool_test(tmp_path, {
        "interval": "1m",
        "input_series": [{"series": f"fairness_exporter_checkpoint_failures_total{{{LABELS}}}",
                          "values": _steps(15, 9)},  # 0 for 15m, then one more failure every 15m, to 135m
                         *_series("a:9108", {  # started at 0; no checkpoint written since
                             "fairness_exporter_start_timestamp_seconds": "0x135",
                             "fairness_exporter_last_checkpoint_timestamp_seconds": "0x135",
                             "fairness_exporter_checkpoint_interval_seconds":
                                 f"{exported['fairness_exporter_checkpoint_interval_seconds']:g}x135"})],
        "alert_rule_test": [{"alertname": CHECKPOINT, "eval_time": f"{minute}m",
                             "exp_alerts": [{"exp_labels": {"severity": "warning", "job": "fairness-exporter",
                                                            "instance": "a:9108"}}]}
                            for minute in (60, 90, 120)],
    })  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.prometheus
def test_a_healthy_daemon_computing_every_15_minutes_is_not_paged_as_stale(tmp_path: Path) -> None:
    """Review 16: `evaluation_interval` may be anything up to the shortest window (15m with windows [1h, 24h]), and
    the runbook even advises to lengthen it. The alert was `time() - last computation > 300 for: 5m`, which paged a
    daemon computing every 15 minutes, every computation succeeding, for the last 5 minutes of every interval."""
    config = make_config(evaluation_interval="15m")
    assert config.evaluation_interval_seconds == 900  # accepted: no refusal at start
    with pytest.raises(ConfigError):  # (the bound is real: beyond the shortest window it is refused)
        make_config(evaluation_interval="2h")
    exported = _exported(config)
    result = _promtool_test(tmp_path, {
        "interval": "1m",
        "input_series": [{"series": f"fairness_exporter_last_computation_timestamp_seconds{{{LABELS}}}",
                          "values": _steps(15, 8, per_step=900)},  # a computation at 0, 15m, 30m, ... 105m
                         *_series("a:9108", {"fairness_exporter_evaluation_interval_seconds":
                                             f"{exported['fairness_exporter_evaluation_interval_seconds']:g}x120"})],
        "alert_rule_test": [{"alertname": STALE, "eval_time": f"{minute}m"}
                            for minute in (28, 43, 58, 73, 88, 103)],  # 13 minutes after each computation
    })  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr


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


def test_a_staged_daemon_exports_its_snapshot_interval_at_start_and_after_a_reload() -> None:
    """The period of its snapshot rounds, which FairnessExporterStateSnapshotFailing reads (its checkpoint interval
    stays 0: it writes no checkpoint file)."""
    def config(checkpoint: str) -> Config:
        return make_config(kafka={"group_id": "fx", "stages": "staged"}, checkpoint={"interval": checkpoint})

    registry = CollectorRegistry()
    daemon = Daemon(config("1h"), registry=registry, loader=lambda: config("10m"))
    assert registry.get_sample_value("fairness_exporter_state_snapshot_interval_seconds") == 3600
    assert daemon.reload()[0]
    assert registry.get_sample_value("fairness_exporter_state_snapshot_interval_seconds") == 600
    assert registry.get_sample_value("fairness_exporter_last_state_snapshot_timestamp_seconds") == 0


@pytest.mark.parametrize("overrides", [
    {},  # direct, no checkpoint.path
    {"kafka": {"group_id": "fx", "stages": "staged"}, "checkpoint": {"interval": "10m"}},  # snapshots, no file
], ids=["direct-without-checkpoint", "staged"])  # fmt: skip
def test_a_daemon_that_writes_no_checkpoint_file_exports_a_checkpoint_interval_of_0(overrides: dict[str, Any]) -> None:
    """Its last checkpoint stays 0; the alert reads the interval's 0 as "nothing to fail", not as a failure."""
    assert _exported(make_config(**overrides))["fairness_exporter_checkpoint_interval_seconds"] == 0


@pytest.mark.prometheus
@PATHS
@pytest.mark.parametrize(("interval", "fires_at"), [
    # the last checkpoint written is the 3rd (3 intervals); its age passes 2 intervals + 300s at 5 intervals + 300s,
    # the first whole minute after that is pending and 5 minutes later it fires:
    (30, 13),  # 5 x 30s + 300s = 450s: pending at 8m, firing at 13m (11m after the first failure, at 2m)
    (900, 86),  # 4,800s: pending at 81m, firing at 86m
    (3600, 311),  # 18,300s: pending at 306m, firing at 311m
], ids=["30s", "15m", "1h"])  # fmt: skip
def test_one_failed_checkpoint_pages_nobody_and_failing_ones_page_at_every_interval(
        tmp_path: Path, interval: int, fires_at: int, alert: str, other: str,
        writing: Callable[..., dict[str, list[float]]]) -> None:  # fmt: skip
    """`once` fails its 4th checkpoint (staged: snapshot round) only, `broken` every one from its 4th on."""
    fourth = 4 * interval
    minutes = fires_at + 10
    result = _promtool_test(tmp_path, {
        "interval": "1m",
        "input_series": [*_series("once:9108", writing(minutes, interval, lambda t: t == fourth)),
                         *_series("broken:9108", writing(minutes, interval, lambda t: t >= fourth))],
        "alert_rule_test": [*_alerts(alert, range(minutes), lambda m: ["broken:9108"] if m >= fires_at else []),
                            *_alerts(other, range(0, minutes, 10), lambda _: [])],
    })  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.prometheus
@PATHS
def test_a_replica_restarted_at_the_longest_interval_is_not_paged_before_its_first_checkpoint(
        tmp_path: Path, alert: str, other: str, writing: Callable[..., dict[str, list[float]]]) -> None:  # fmt: skip
    """`checkpoint.interval: 1h`, restarted at 130m: its last checkpoint is 0 until 190m, and its age counts from its
    start. `broken` restarts alike and writes no checkpoint after: its age passes 2h 5m at 255m, so it is pending at
    256m and fires at 261m."""
    minutes = 280
    result = _promtool_test(tmp_path, {
        "interval": "1m",
        "input_series": [*_series("restarted:9108", writing(minutes, 3600, restart=7800)),
                         *_series("broken:9108", writing(minutes, 3600, lambda t: t > 7800, restart=7800))],
        "alert_rule_test": [*_alerts(alert, range(minutes), lambda m: ["broken:9108"] if m >= 261 else []),
                            *_alerts(other, range(0, minutes, 10), lambda _: [])],
    })  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.prometheus
@PATHS
def test_a_reload_that_shortens_the_checkpoint_interval_pages_nobody(
        tmp_path: Path, alert: str, other: str, writing: Callable[..., dict[str, list[float]]]) -> None:  # fmt: skip
    """From 1h to 10m at 110m: the last checkpoint (60m) is 50 minutes old, twice the new interval plus 300s is 25
    minutes, and the first checkpoint at the new interval comes at 120m. The old interval's threshold holds for 75
    minutes after the reload (max_over_time), so nothing pages. `broken` fails every checkpoint after the reload: from
    185m its last checkpoint (60m) is judged by the new interval, and it fires at 190m."""
    minutes = 200
    reload = (6600.0, 600.0)
    result = _promtool_test(tmp_path, {
        "interval": "1m",
        "input_series": [*_series("shortened:9108", writing(minutes, 3600, reload=reload)),
                         *_series("broken:9108", writing(minutes, 3600, lambda t: t > 6600, reload=reload))],
        "alert_rule_test": [*_alerts(alert, range(minutes), lambda m: ["broken:9108"] if m >= 190 else []),
                            *_alerts(other, range(0, minutes, 10), lambda _: [])],
    })  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.prometheus
@pytest.mark.parametrize(("interval", "fires_at"), [
    # the last computation is the 2nd (at 1 interval); its age passes max(3 intervals, 300s) at 1 interval + that,
    # the first whole minute after that is pending and 5 minutes later it fires:
    (15, 11),  # 15s + 300s: pending at 6m, firing at 11m, as before the interval was read
    (900, 66),  # 15m + 45m: pending at 61m, firing at 66m
    (3600, 246),  # 1h + 3h (the longest interval windows [1h, 24h] accept): pending at 241m, firing at 246m
], ids=["15s", "15m", "1h"])  # fmt: skip
def test_one_failed_computation_pages_nobody_and_stopped_ones_page_at_every_interval(
        tmp_path: Path, interval: int, fires_at: int) -> None:  # fmt: skip
    """`once` fails its 3rd computation only (at 2 intervals), `stopped` computes nothing from its 3rd on."""
    third = 2 * interval
    minutes = fires_at + 10
    result = _promtool_test(tmp_path, {
        "interval": "1m",
        "input_series": [*_series("once:9108", _computing(minutes, interval, lambda t: t == third)),
                         *_series("stopped:9108", _computing(minutes, interval, lambda t: t >= third))],
        "alert_rule_test": _alerts(STALE, range(minutes), lambda m: ["stopped:9108"] if m >= fires_at else []),
    })  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
