"""`fairness-exporter backtest`: recorded events through the daemon's own path on a simulated clock."""

from __future__ import annotations

import json
import math
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import orjson
import pandas as pd
import pytest
import yaml
from prometheus_client import CollectorRegistry
from test_labels_and_checkpoint import Clock, Record

from exporter.backtest.replay import backtest
from exporter.cli import main
from exporter.config import parse_config
from exporter.daemon import Daemon
from exporter.devtools.synthetic import cell_counts, cell_events

T0 = 1_800_000_000.0
ATTRIBUTES = {"gender": ("male", "female"), "age": ("young", "old")}
RAW_CONFIG = {"model_id": "m1", "protected_attributes": [{"name": k, "groups": list(v)} for k, v in ATTRIBUTES.items()],
              "windows": ["1h", "24h"], "bucket": "1m", "min_samples": 30}  # fmt: skip


def drifting_events(hours: float = 3, drift_after_minutes: int = 60) -> pd.DataFrame:
    """600 events a minute, selection rate 0.3 for everybody, then 0.15 for women after `drift_after_minutes`."""
    steps = int(hours * 60)
    rates = np.full((steps, 4), 0.3)
    rates[drift_after_minutes:, 2:] = 0.15  # cells in C order of (gender, age): female is gender code 1
    cells = cell_counts(np.random.default_rng(11), steps, 1, (2, 2), 600, rates)
    columns = cell_events(cells[:, 0], ATTRIBUTES, T0, 60.0, seed=3)
    frame = pd.DataFrame(columns)
    frame["timestamp"] = frame["timestamp"].round(3)  # milliseconds: the same instant in every file format
    frame["model_id"] = "m1"
    frame["prediction_id"] = [f"p{i}" for i in range(len(frame))]
    return frame


def as_jsonl(frame: pd.DataFrame, path: Path) -> Path:
    """The same events in the topic's format (ISO-8601 timestamps, attributes nested, every other prediction a
    JSON boolean, as serving code often writes it)."""
    with path.open("wb") as f:
        for i, row in enumerate(frame.itertuples(index=False)):
            stamp = datetime.fromtimestamp(row.timestamp, UTC).isoformat()
            prediction = bool(row.prediction) if i % 2 else int(row.prediction)
            f.write(orjson.dumps({"model_id": row.model_id, "prediction_id": row.prediction_id, "timestamp": stamp,
                                  "prediction": prediction,
                                  "attributes": {"gender": row.gender, "age": row.age}}) + b"\n")  # fmt: skip
    return path


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    directory = tmp_path_factory.mktemp("backtest")
    frame = drifting_events()
    config = directory / "config.yaml"
    config.write_text(yaml.safe_dump(RAW_CONFIG))
    frame.to_parquet(directory / "events.parquet")
    frame.to_csv(directory / "events.csv", index=False)
    milliseconds = (frame["timestamp"] * 1000).round().astype("int64")
    instants = pd.to_datetime(milliseconds, unit="ms", utc=True).astype("datetime64[us, UTC]")
    stamped = frame.assign(timestamp=instants, prediction=frame["prediction"].astype(bool))  # a boolean column
    stamped.to_parquet(directory / "datetimes.parquet")
    return {"config": config, "parquet": directory / "events.parquet", "csv": directory / "events.csv",
            "jsonl": as_jsonl(frame, directory / "events.jsonl"), "datetimes": directory / "datetimes.parquet",
            "dir": directory}  # fmt: skip


def test_backtest_pages_on_the_drift_with_value_interval_and_statistic(recorded: dict[str, Path]) -> None:
    output = recorded["dir"] / "report.json"
    assert main(["backtest", "--config", str(recorded["config"]), str(recorded["parquet"]), "--output",
                 str(output)]) == 0  # fmt: skip
    report = json.loads(output.read_text())
    assert report["steps"] == 179  # a step per minute the events have left: the last one is open, as in the daemon
    pages = [a for a in report["alerts"] if a["alert"] == "FairnessDemographicParityDrift"]
    assert pages, report["alerts"]
    first = pages[0]
    assert (first["severity"], first["attribute"], first["dimension"], first["direction"]) == (
        "critical", "gender", "male_vs_female", "a_higher")
    fired = datetime.fromisoformat(first["fired_at"]).timestamp()
    assert T0 + 3600 < fired <= T0 + 2 * 3600  # after the drift, within the hour
    # the page is Shiryaev-Roberts' (log R >= the level); the statistic shown is CUSUM's S, the evidence of a change
    # now, and R <= steps x e^S: S is within log(steps) of the level (14.52 against 14.65 here)
    assert report["alarm_level"] - math.log(report["steps"]) <= first["statistic"]
    assert first["window"] is None and set(first["windows"]) == {"1h", "24h"}
    lower, upper = first["interval"]
    assert lower <= first["value"] <= upper
    assert first["value"] == first["windows"]["1h"]["value"]
    assert not [a for a in report["alerts"] if a["attribute"] == "age" and a["severity"] == "critical"]


def test_jsonl_csv_and_parquet_replay_to_the_same_report(recorded: dict[str, Path]) -> None:
    """Epoch seconds, ISO-8601 strings (JSON lines) and microsecond datetimes (parquet) are the same instants, and
    booleans (JSON lines, the datetimes file's prediction column) the same 0/1."""
    config = parse_config(RAW_CONFIG)
    reports = [backtest(config, [recorded[kind]]) for kind in ("parquet", "csv", "jsonl", "datetimes")]
    assert reports[0]["alerts"] == reports[1]["alerts"] == reports[2]["alerts"] == reports[3]["alerts"]
    assert reports[0]["events"] == reports[2]["events"] == reports[3]["events"] > 100_000
    assert reports[2]["rejected"] == reports[3]["rejected"] == 0


def test_backtest_takes_the_daemons_steps_and_reaches_its_statistics(recorded: dict[str, Path]) -> None:
    """The daemon, fed the same events a bucket at a time with its scheduled computation after each bucket,
    ends with exactly the detector state the backtest reports: a step for each of minutes 0 to 88 (the 89th is
    open in both)."""
    frame = drifting_events(hours=1.5)
    config = parse_config({**RAW_CONFIG, "listen": {"address": "127.0.0.1", "port": 0}})
    daemon = Daemon(config, registry=CollectorRegistry(), clock=Clock())
    minute = ((frame["timestamp"] - T0) // 60).astype(int)
    payloads = as_jsonl(frame, recorded["dir"] / "short.jsonl").read_bytes().splitlines()
    offset = 0
    for m in range(int(minute.max()) + 1):
        batch = [Record(p, offset + i) for i, p in enumerate(payloads[offset : offset + int((minute == m).sum())])]
        offset += len(batch)
        daemon.clock.now = frame["timestamp"][minute == m].max()
        daemon.ingest.handle("predictions", 0, batch)
        daemon.computer.compute()
    from exporter.backtest.replay import Replay, read_events

    replay = Replay(config.model(), config.windowing)
    for columns, _, _ in read_events([recorded["dir"] / "short.jsonl"], config):
        replay.feed(columns[config.model().model_id])
    replay.finish()
    store = daemon.fleet.models[config.model().model_id].store
    assert replay.store.detection.steps == store.detection.steps == 89
    np.testing.assert_allclose(replay.store.detection.state.statistic, store.detection.state.statistic)
    np.testing.assert_array_equal(replay.store.totals, store.totals)


def test_a_file_without_the_needed_columns_is_one_line_and_exit_2(
    recorded: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    broken = tmp_path / "broken.csv"
    pd.read_csv(recorded["csv"]).drop(columns=["timestamp"]).to_csv(broken, index=False)
    assert main(["backtest", "--config", str(recorded["config"]), str(broken)]) == 2
    error = capsys.readouterr().err.strip()
    assert error.count("\n") == 0
    assert str(broken) in error and "'timestamp'" in error


def test_the_time_column_named_by_columns_timestamp_replays_as_the_default_name(
    recorded: dict[str, Path], tmp_path: Path
) -> None:
    """Before: backtest read a column named 'timestamp' whatever ``columns.timestamp`` said, where the gate and Spark
    read the configured one. A decoy 'timestamp' column twelve hours off would move every alert if it were read."""
    renamed = parse_config({**RAW_CONFIG, "columns": {"timestamp": "event_time"}})
    expected = backtest(parse_config(RAW_CONFIG), [recorded["parquet"]])
    frame = pd.read_parquet(recorded["parquet"])
    frame = frame.rename(columns={"timestamp": "event_time"}).assign(timestamp=frame["timestamp"] + 12 * 3600)
    frame.to_parquet(tmp_path / "renamed.parquet")
    frame.to_csv(tmp_path / "renamed.csv", index=False)
    for path in (tmp_path / "renamed.parquet", tmp_path / "renamed.csv"):
        assert backtest(renamed, [path]) == expected
    assert expected["events"] == len(frame) and expected["alerts"]
    assert backtest(parse_config(RAW_CONFIG), [tmp_path / "renamed.parquet"])["alerts"] != expected["alerts"]


@pytest.mark.parametrize(("cell", "line"), [
    (None, "missing column(s) ['event_time'] (columns.timestamp: each event's time); the file has "),
    ("yesterday", "column 'event_time' (columns.timestamp) holds a cell that is neither epoch seconds nor ISO-8601 "
                  "text"),
])  # fmt: skip
def test_a_configured_time_column_missing_or_unreadable_is_one_line_naming_it_and_exit_2(
    recorded: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str], cell: str | None, line: str
) -> None:
    """The file still has a good 'timestamp' column: before, backtest read it and exited 0."""
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump({**RAW_CONFIG, "columns": {"timestamp": "event_time"}}))
    frame = pd.read_csv(recorded["csv"])
    if cell is not None:
        frame["event_time"] = frame["timestamp"].astype(object)
        frame.loc[5, "event_time"] = cell
    frame.to_csv(tmp_path / "events.csv", index=False)
    assert main(["backtest", "--config", str(config), str(tmp_path / "events.csv")]) == 2
    error = capsys.readouterr().err.strip()
    assert error.count("\n") == 0
    assert error.startswith(f"fairness-exporter backtest: {tmp_path / 'events.csv'}: ") and line in error, error


def test_a_file_whose_every_event_is_rejected_exits_2_with_the_reasons_and_their_counts(
    recorded: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Before: "0 events replayed ... 0 alert(s)" and exit 0, which a CI job reads as "no alerts"."""
    wrong = tmp_path / "wrong.jsonl"  # the gate's CSV rows, not the topic's JSON events
    wrong.write_text(recorded["csv"].read_text())
    assert main(["backtest", "--config", str(recorded["config"]), str(wrong)]) == 2
    out = capsys.readouterr()
    assert out.out == ""
    lines = len(pd.read_csv(recorded["csv"])) + 1  # the header is a line too
    assert out.err.strip().count("\n") == 0
    assert f"{wrong}: no event replayed: {lines:,} rejected (malformed_json: {lines:,}), 0 of no configured model" \
        in out.err  # fmt: skip

    other = tmp_path / "other.csv"  # every row of another model: nothing rejected, nothing replayed either
    pd.read_csv(recorded["csv"]).assign(model_id="m2").to_csv(other, index=False)
    assert main(["backtest", "--config", str(recorded["config"]), str(other)]) == 2
    assert f"0 rejected, {lines - 1:,} of no configured model (model_id m1)" in capsys.readouterr().err


def test_a_file_mostly_rejected_says_so_on_stderr_and_reports_each_reason(
    recorded: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    lines = recorded["jsonl"].read_bytes().splitlines()[:1000]
    events = [orjson.loads(line) for line in lines]
    for event in events[100:]:
        event["prediction"] = str(int(event["prediction"]))  # a string: rejected as invalid_prediction
    for event in events[:50]:
        event["timestamp"] = "yesterday"
    mostly = tmp_path / "mostly.jsonl"
    mostly.write_bytes(b"\n".join(map(orjson.dumps, events)) + b"\n")
    report_path = tmp_path / "report.json"
    assert main(["backtest", "--config", str(recorded["config"]), str(mostly), "--output", str(report_path)]) == 0
    report = json.loads(report_path.read_text())
    assert (report["events"], report["rejected"]) == (50, 950)
    assert report["rejected_reasons"] == {"invalid_prediction": 900, "invalid_timestamp": 50}
    err = capsys.readouterr().err
    assert "warning: most events were rejected: 50 replayed, 950 rejected (invalid_prediction: 900, " \
           "invalid_timestamp: 50)" in err  # fmt: skip

    half = tmp_path / "half.jsonl"  # as many replayed as rejected: no warning
    half.write_bytes(b"\n".join(map(orjson.dumps, events[50:100] * 10 + events[100:600])) + b"\n")
    assert main(["backtest", "--config", str(recorded["config"]), str(half), "--output", str(report_path)]) == 0
    assert "warning" not in capsys.readouterr().err


def test_a_value_outside_the_groups_is_its_attributes_unknown_category_in_every_file_format(
    recorded: dict[str, Path], tmp_path: Path
) -> None:
    """As in the gate and the daemon: the row counts overall and for its other attributes, in no comparison of
    that attribute; a table and the same events as JSON lines end in the same state."""
    frame = drifting_events(hours=1.5)
    frame.loc[::3, "gender"] = "Female"  # not a configured group
    frame.loc[::7, "age"] = None  # missing
    config = parse_config(RAW_CONFIG)
    table, jsonl = tmp_path / "odd.csv", as_jsonl(frame, tmp_path / "odd.jsonl")
    frame.to_csv(table, index=False)
    from exporter.backtest.replay import Replay, read_events

    stores = []
    for path in (table, jsonl):
        replay = Replay(config.model(), config.windowing)
        for columns, _, _ in read_events([path], config):
            replay.feed(columns["m1"])
        report = replay.finish()
        assert (report["events"], report["rejected"]) == (len(frame), 0)
        stores.append(replay.store)
    np.testing.assert_array_equal(stores[0].totals, stores[1].totals)
    gender = stores[0].layout.split(stores[0].totals)["gender"]
    assert int(gender[-1, :2].sum()) == len(frame[::3])  # the unknown row: every 'Female'
    np.testing.assert_allclose(stores[0].detection.state.statistic, stores[1].detection.state.statistic)


def test_a_file_of_many_models_replays_each_as_a_backtest_of_that_model_alone(tmp_path: Path) -> None:
    """One events file of two models through a fleet config: each model's report equals the backtest of a config
    of that model alone over the same file (the other's events are ignored there), in JSON lines and parquet."""
    drifting = drifting_events(hours=2)
    fair = drifting_events(hours=2, drift_after_minutes=10_000).assign(model_id="m2")
    fair["prediction_id"] = [f"q{i}" for i in range(len(fair))]
    both = pd.concat([drifting, fair]).sort_values("timestamp", kind="stable").reset_index(drop=True)
    fleet = parse_config({**{k: v for k, v in RAW_CONFIG.items() if k != "model_id"},
                          "models": [{"model_id": "m1"}, {"model_id": "m2"}]})  # fmt: skip
    for path in (as_jsonl(both, tmp_path / "both.jsonl"), tmp_path / "both.parquet"):
        if path.suffix == ".parquet":
            both.to_parquet(path)
        report = backtest(fleet, [path])
        by_model = {r["model_id"]: r for r in report["models"]}
        for model_id in ("m1", "m2"):
            alone = backtest(parse_config({**RAW_CONFIG, "model_id": model_id}), [path])
            assert alone["ignored"] == len(both) // 2  # the other model's events
            assert {**by_model[model_id], "ignored": 0} == {**alone, "ignored": 0}
        assert report["events"] == len(both) and report["ignored"] == 0
        assert {a["model_id"] for a in report["alerts"]} == {"m1"}  # only the drifting model pages
        assert any(a["alert"] == "FairnessDemographicParityDrift" for a in by_model["m1"]["alerts"])



def test_two_runs_list_the_alerts_in_one_order_whatever_the_hash_seed(tmp_path: Path) -> None:
    """Alerts of one minute, alert and attribute come in one order: a report filed twice must read the same.
    Before: the order followed a set of keys, so PYTHONHASHSEED changed it. Two groups stop being selected at once,
    so the comparisons with each page in the same minute."""
    import os
    import subprocess
    import sys

    rng = np.random.default_rng(5)
    minutes, per_group = 120, 200
    group = np.tile(np.repeat(["a", "b", "c"], per_group), minutes)
    minute = np.repeat(np.arange(minutes), 3 * per_group)
    rate = np.where((minute >= 60) & (group != "a"), 0.0, 0.3)
    frame = pd.DataFrame({"model_id": "m1", "prediction_id": [f"p{i}" for i in range(len(group))],
                          "timestamp": T0 + minute * 60.0 + rng.uniform(0, 59, len(group)).round(3),
                          "prediction": (rng.random(len(group)) < rate).astype(int), "g": group})  # fmt: skip
    frame.to_parquet(tmp_path / "events.parquet")
    config = {**RAW_CONFIG, "protected_attributes": [{"name": "g", "groups": ["a", "b", "c"]}]}
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(config))
    orders = set()
    for seed in ("1", "2", "3", "4", "5", "6"):
        output = tmp_path / f"seed-{seed}.json"
        subprocess.run([sys.executable, "-m", "exporter.cli", "backtest", "--config", str(tmp_path / "config.yaml"),
                        str(tmp_path / "events.parquet"), "--output", str(output)], check=True, capture_output=True,
                       env={**os.environ, "PYTHONHASHSEED": seed})  # fmt: skip
        alerts = json.loads(output.read_text())["alerts"]
        orders.add(tuple((a["fired_at"], a["alert"], a["attribute"], a.get("dimension"), a.get("window"))
                         for a in alerts))  # fmt: skip
    (order,) = orders
    assert len({(t, alert, attribute) for t, alert, attribute, _, _ in order}) < len(order)  # some share a minute


def test_the_seed_rules_alerts_do_not_depend_on_where_the_evaluated_blocks_end(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A gap from minute 60 to 120, then none: the seed rule's alert holds across blocks of any length (its `for:`
    counted from a step of an earlier block) and resolves once the 1h window is fair again, at the same minutes."""
    from exporter.backtest import replay

    drifted, fair = drifting_events(hours=4, drift_after_minutes=60), drifting_events(hours=4, drift_after_minutes=240)
    end = T0 + 120 * 60
    frame = pd.concat([drifted[drifted["timestamp"] < end], fair[fair["timestamp"] >= end]]).sort_values("timestamp")
    frame.to_parquet(tmp_path / "events.parquet")
    config = parse_config(RAW_CONFIG)

    def seed_alerts(block: int) -> list[tuple[str, str, str | None, str]]:
        monkeypatch.setattr(replay, "FLUSH_STEPS", block)
        report = backtest(config, [tmp_path / "events.parquet"])
        return [(a["alert"], a["fired_at"], a["resolved_at"], a["window"]) for a in report["alerts"]
                if a["alert"].endswith("Threshold")]  # fmt: skip

    alerts = seed_alerts(1440)
    assert alerts and all(resolved is not None for _, _, resolved, _ in alerts)
    assert seed_alerts(7) == alerts and seed_alerts(1) == alerts and seed_alerts(45) == alerts
