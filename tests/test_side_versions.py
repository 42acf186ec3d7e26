"""A side dataset with a time column (``attribute_sources.<name>.timestamp``) holds versions, as the daemon's
topic does: the gate, ``backtest`` and ``--engine spark`` count a prediction made before a correction with the value
it had then, exactly as the daemon counts it on the real broker, where before they counted it with the correction.
Without the column the dataset stays a snapshot (the latest row of an id, always)."""

from __future__ import annotations

import itertools
import math
import subprocess
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pandas as pd
import pytest
import yaml
from daemon_fixture import sample, scrape, wait_for
from hypothesis import given, settings
from hypothesis import strategies as st
from payload_logs import send
from test_attribute_join_kafka import send_side, started, topics
from test_spark import NOW, spark  # noqa: F401  (the local SparkSession fixture, skipped as test_spark skips it)

from exporter.backtest.input import read_events
from exporter.backtest.replay import backtest
from exporter.config import load_config, parse_config
from exporter.core.side_table import SideTable, id_hashes
from exporter.daemon import Daemon
from exporter.devtools.embedded_broker import EmbeddedBroker
from exporter.gate.data.dataset import DataError
from exporter.gate.fairness.audit import run_audit

GENDERS = ("male", "female")
RACES = ("white", "black", "asian")
HORIZON = 60.0
ATTRIBUTES = [{"name": "gender", "groups": list(GENDERS), "source": "applicants"},
              {"name": "race", "groups": list(RACES), "source": "applicants"}]  # fmt: skip


@dataclass
class Corrected:
    """Side records in topic order (id, record, Kafka time in seconds: ms resolution, off the whole second) and
    predictions before, between and after an id's two versions; ``truth``: (attribute, group) -> [rows,
    positives] as the versions in force say, ``unknown``: rows no version applies to (no id, or made more than the
    horizon before the id's first record)."""

    side: list[tuple[str, dict[str, str], float]] = field(default_factory=list)
    predictions: list[dict[str, Any]] = field(default_factory=list)
    truth: Counter[tuple[str, str, int]] = field(default_factory=Counter)
    unknown: int = 0


def corrected(n: int, t0: float, seed: int = 3) -> Corrected:
    rng = np.random.default_rng(seed)
    out = Corrected()
    first_at, second_at = t0 + 0.25, t0 + 100.75  # in force from the next whole second
    rows = []
    for i in range(n):
        aid = f"A{i:04d}"
        first = {"gender": GENDERS[i % 2], "race": RACES[int(rng.integers(3))]}
        second = {"gender": GENDERS[1 - i % 2], "race": RACES[(RACES.index(first["race"]) + 1) % 3]}
        if i % 7 == 0:  # a wrong record at the same time first: the later one in the topic (and file) wins
            out.side.append((aid, second, first_at))
        out.side.append((aid, first, first_at))
        corrected_ = i % 3 != 2
        if corrected_:
            out.side.append((aid, second, second_at))
        # before the first record (within the horizon, or not), between the versions, after the correction
        for at, version in ((t0 - 30, first), (t0 - 2 * HORIZON, None), (t0 + 50, first),
                            (t0 + 150, second if corrected_ else first)):  # fmt: skip
            if at == t0 - 2 * HORIZON and i % 4:
                continue
            rows.append((at, aid, version))
    rows += [(t0 + 10.0, None, None)] * 7  # no id: unknown for the source's attributes
    rows.sort(key=lambda r: r[0])  # in time order, so that the daemon finds none of them late
    for k, (at, aid, version) in enumerate(rows):
        prediction = int(rng.random() < (0.7 if version is not None and version["gender"] == "male" else 0.35))
        out.predictions.append({"model_id": "m1", "prediction_id": f"p{k}", "timestamp": at,
                                "prediction": prediction, "attributes": {"applicant_id": aid}})  # fmt: skip
        if version is None:
            out.unknown += 1
        for attribute, value in (version or {}).items():
            out.truth[(attribute, value, prediction)] += 1
    return out


def side_frame(s: Corrected, stamped: bool = True) -> pd.DataFrame:
    """The side records as a dataset, in topic order, with each record's Kafka time in ``updated_at``."""
    frame = pd.DataFrame([{"applicant_id": k, **v, "updated_at": t} for k, v, t in s.side])
    return frame if stamped else frame.drop(columns="updated_at")


def events_frame(s: Corrected) -> pd.DataFrame:
    return pd.DataFrame([{**{k: v for k, v in p.items() if k != "attributes"}, **p["attributes"]}
                         for p in s.predictions])  # fmt: skip


def gate_config(folder: Path, stamped: bool = True, **extra: Any) -> Path:
    source = {"path": "demographics.parquet", "id": "applicant_id", "horizon": f"{HORIZON:g}s",
              **({"timestamp": "updated_at"} if stamped else {})}  # fmt: skip
    raw = {"model_id": "m1", "protected_attributes": ATTRIBUTES, "min_samples": 5, "windows": ["1h"],
           "bucket": "1m", "attribute_sources": {"applicants": source}, **extra}  # fmt: skip
    path = folder / ("versions.yaml" if stamped else "snapshot.yaml")
    path.write_text(yaml.safe_dump(raw))
    return path


def report_counts(report: dict[str, Any]) -> tuple[Counter[tuple[str, str, int]], dict[str, int]]:
    """(attribute, group, predicted) -> rows, and each attribute's unknown rows, from a gate report."""
    out: Counter[tuple[str, str, int]] = Counter()
    for attribute, block in report["attributes"].items():
        for group, stats in block["groups"].items():
            positives = round(stats["selection_rate"] * stats["samples"]) if stats["samples"] else 0
            out[(attribute, group, 1)], out[(attribute, group, 0)] = positives, stats["samples"] - positives
    return +out, {a: block["excluded_rows"] for a, block in report["attributes"].items()}


def written(s: Corrected, folder: Path, stamped: bool = True) -> tuple[Path, Path]:
    """The predictions (ids only) as parquet, the side dataset beside the config, and the config."""
    side_frame(s, stamped).to_parquet(folder / "demographics.parquet")
    events_frame(s).to_parquet(folder / "predictions.parquet")
    return gate_config(folder, stamped), folder / "predictions.parquet"


# --- the table: a bulk load of versions is put of each row in time order -----------------------------------------

RECORDS = st.lists(st.tuples(st.integers(0, 5), st.integers(0, 3), st.integers(0, 2),
                             st.sampled_from([-3.0, 0.0, 0.4, 1.0, 1.2, 2.0, 7.5, 8.0, 30.0])),
                   max_size=40)  # fmt: skip


@settings(max_examples=300, deadline=None)
@given(before=RECORDS, records=RECORDS, cuts=st.lists(st.integers(0, 40), max_size=4))
def test_a_bulk_load_of_versions_equals_put_of_each_row_in_time_order(
        before: list[tuple[int, int, int, float]], records: list[tuple[int, int, int, float]],
        cuts: list[int]) -> None:  # fmt: skip
    """Rows put in time order first, then more loaded batch by batch in any order: the table put gives them all in
    the order of their seconds (a stable sort: within a second, as they came)."""
    hashes = id_hashes([f"id-{i}" for i in range(6)])

    def second(record: tuple[int, int, int, float]) -> int:
        return math.ceil(max(record[3], 0.0))

    bulk, one_by_one = SideTable(["a", "b"], 100), SideTable(["a", "b"], 100)
    for i, a, b, t in sorted(before, key=second):
        bulk.put(int(hashes[i]), (a, b), t)
    bounds = sorted({0, len(records), *(c for c in cuts if c <= len(records))})
    for lo, hi in itertools.pairwise(bounds):
        part = records[lo:hi]
        assert bulk.load(hashes[[r[0] for r in part]], np.array([r[1:3] for r in part], np.uint16).reshape(-1, 2),
                         np.array([r[3] for r in part], np.float64))  # fmt: skip
    for i, a, b, t in sorted([*sorted(before, key=second), *records], key=second):
        one_by_one.put(int(hashes[i]), (a, b), t)
    bulk.merge(), one_by_one.merge()
    assert bulk.keys.tolist() == one_by_one.keys.tolist() and len(bulk) == len(one_by_one)
    assert bulk.codes.tolist() == one_by_one.codes.tolist() and bulk.since.tolist() == one_by_one.since.tolist()
    assert bulk.previous == one_by_one.previous
    asked = np.repeat(hashes, 8)
    at = np.tile(np.array([-100.0, -1.0, 0.0, 0.5, 1.0, 2.5, 8.0, 99.0]), 6)
    for got, want in zip(bulk.get(asked, at, 5.0), one_by_one.get(asked, at, 5.0), strict=True):
        assert got.tolist() == want.tolist()


def test_a_bulk_load_past_max_records_writes_nothing() -> None:
    table = SideTable(["a"], 2)
    h = id_hashes(["x", "y", "z"])
    assert table.load(h[:1], np.array([[1]], np.uint16), np.array([5.0]))
    assert not table.load(h, np.array([[2], [2], [2]], np.uint16), np.array([9.0, 9.0, 9.0]))
    found, codes, _ = table.get(h[:1], np.array([10.0]))
    assert found.tolist() == [True] and codes.tolist() == [[1]] and len(table) == 1 and not table.previous


# --- the gate's, backtest's and Spark's counts are the daemon's on the real broker --------------------------------


def daemon_counts(broker: EmbeddedBroker, tmp_path: Path, daemons: list[Daemon],
                  s: Corrected) -> tuple[Counter[tuple[str, str, int]], dict[str, int]]:  # fmt: skip
    """The side records on a compacted topic at their Kafka times, then the predictions: the daemon's counts."""
    events, side = topics(broker)
    send_side(broker, side, [(k, v, t) for k, v, t in s.side])
    raw = {"model_id": "m1", "protected_attributes": ATTRIBUTES, "min_samples": 5,
           "attribute_sources": {"applicants": {"topic": side, "id": "applicant_id", "horizon": f"{HORIZON:g}s"}},
           "kafka": {"bootstrap_servers": broker.bootstrap_servers, "topic": events, "assignment": "manual",
                     "group_id": f"g-{events}"},
           "windows": ["1h"], "bucket": "1m", "evaluation_interval": "1s",
           "listen": {"address": "127.0.0.1", "port": 0}}  # fmt: skip
    daemon = started(tmp_path / "daemon.yaml", raw, daemons)
    wait_for(lambda: sample(scrape(daemon.port), "fairness_exporter_side_records_total", source="applicants")
             == len(s.side), what="every side record in the table")  # fmt: skip
    send(broker.bootstrap_servers, events, [(orjson.dumps(p), [], None) for p in s.predictions])
    joined = sum(p["attributes"]["applicant_id"] is not None for p in s.predictions)
    wait_for(lambda: sum(sample(scrape(daemon.port), "fairness_exporter_attribute_joins_total", source="applicants",
                                outcome=o) or 0 for o in ("joined", "joined_after_wait", "never_joined")) == joined,
             what="every prediction joined or given up")  # fmt: skip
    daemon.computer.compute()
    page = scrape(daemon.port)
    out: Counter[tuple[str, str, int]] = Counter()
    for attribute, groups in (("gender", GENDERS), ("race", RACES)):
        for group in groups:
            for predicted in (0, 1):
                out[(attribute, group, predicted)] = int(sample(
                    page, "fairness_predictions_total", model_id="m1", attribute=attribute, subgroup=group,
                    predicted=str(predicted)) or 0)  # fmt: skip
    unknown = {a: int(sample(page, "model_subgroup_unknown_samples", model_id="m1", attribute=a, window="1h") or 0)
               for a in ("gender", "race")}  # fmt: skip
    return +out, unknown


def test_the_gate_counts_what_the_daemon_counts_from_the_topic_of_the_same_records(
        kafka_broker: EmbeddedBroker, tmp_path: Path, daemons: list[Daemon]) -> None:  # fmt: skip
    s = corrected(90, float(int(time.time()) - 400))  # whole seconds: the Kafka times (ms) are the file's exactly
    daemon = daemon_counts(kafka_broker, tmp_path, daemons, s)
    assert daemon == (s.truth, {"gender": s.unknown, "race": s.unknown})  # the versions in force, by hand
    config, predictions = written(s, tmp_path)
    assert report_counts(run_audit(config, predictions)) == daemon
    # without the column the dataset is a snapshot, the corrections counted for the predictions made before them
    snapshot = run_audit(written(s, tmp_path, stamped=False)[0], predictions)
    assert report_counts(snapshot) != daemon
    assert report_counts(snapshot)[1] == {"gender": 7, "race": 7}  # only the rows without an id are unknown


def tallied(config: Path, location: Path) -> tuple[Counter[tuple[str, str, int]], dict[str, int]]:
    """The rows ``backtest`` replays into its windows (read_events: after the join), by group and prediction."""
    model = load_config(config)
    out: Counter[tuple[str, str, int]] = Counter()
    unknown = dict.fromkeys(("gender", "race"), 0)
    for columns, _, _ in read_events([location], model):
        batch = columns["m1"]
        for attribute, groups in (("gender", GENDERS), ("race", RACES)):
            codes = batch.codes[attribute]
            unknown[attribute] += int((codes < 0).sum())
            for code, predicted in zip(codes[codes >= 0].tolist(), batch.predictions[codes >= 0].tolist(),
                                       strict=True):  # fmt: skip
                out[(attribute, groups[code], int(predicted))] += 1
    return out, unknown


def test_backtest_replays_the_versions_as_the_daemon_and_the_gate(tmp_path: Path) -> None:
    """The same scenario as above, whose daemon counts equal ``truth``: backtest's parquet and CSV events (the gate's
    join) and JSON lines (the daemon's own join) all take the versions in force."""
    s = corrected(90, 1_800_000_000.0)
    config, predictions = written(s, tmp_path)
    want = (s.truth, {"gender": s.unknown, "race": s.unknown})
    assert tallied(config, predictions) == want
    events_frame(s).to_csv(tmp_path / "events.csv", index=False)
    assert tallied(config, tmp_path / "events.csv") == want
    (tmp_path / "events.jsonl").write_bytes(b"\n".join(orjson.dumps(p) for p in s.predictions))
    assert tallied(config, tmp_path / "events.jsonl") == want
    # the whole replay: the same as the events carrying the attributes in force inline
    inline = tmp_path / "inline.jsonl"
    versions = version_of(s)
    inline.write_bytes(b"\n".join(orjson.dumps({**p, "attributes": versions[k]}) for k, p in enumerate(s.predictions)))
    plain = yaml.safe_load(config.read_text())
    del plain["attribute_sources"]
    plain["protected_attributes"] = [{k: v for k, v in a.items() if k != "source"} for a in ATTRIBUTES]
    expected = backtest(parse_config(plain, str(tmp_path / "plain.yaml")), [inline])
    assert backtest(load_config(config), [predictions]) == expected and expected["events"] == len(s.predictions)
    assert tallied(gate_config(tmp_path, stamped=False), predictions) != want  # the snapshot: proves it can fail


def test_backtest_joins_the_versions_at_the_time_column_columns_timestamp_names(tmp_path: Path) -> None:
    """Before: backtest's join read each prediction's time from a column named 'timestamp' whatever
    ``columns.timestamp`` said. A decoy 'timestamp' column after every correction would take the corrected
    versions for every prediction if it were read."""
    s = corrected(90, 1_800_000_000.0)
    config, _ = written(s, tmp_path)
    raw = yaml.safe_load(config.read_text())
    config.write_text(yaml.safe_dump({**raw, "columns": {"timestamp": "event_time"}}))
    frame = events_frame(s)
    frame = frame.rename(columns={"timestamp": "event_time"}).assign(timestamp=frame["timestamp"] + 1000)
    frame.to_parquet(tmp_path / "renamed.parquet")
    frame.to_csv(tmp_path / "renamed.csv", index=False)
    want = (s.truth, {"gender": s.unknown, "race": s.unknown})
    assert tallied(config, tmp_path / "renamed.parquet") == want
    assert tallied(config, tmp_path / "renamed.csv") == want
    config.write_text(yaml.safe_dump({**raw, "columns": {"timestamp": "timestamp"}}))
    assert tallied(config, tmp_path / "renamed.parquet") != want  # the decoy's times: proves it can fail


def version_of(s: Corrected) -> list[dict[str, str]]:
    """Each prediction's attributes as the versions in force give them (``corrected``'s rule, computed apart)."""
    records: dict[str, list[tuple[int, dict[str, str]]]] = {}
    for key, value, at in s.side:
        versions = records.setdefault(key, [])
        since = math.ceil(at)
        if versions and versions[-1][0] == since:
            versions[-1] = (since, value)
        else:
            versions.append((since, value))
    out = []
    for p in s.predictions:
        versions = records.get(p["attributes"]["applicant_id"] or "", [])
        in_force = [v for since, v in versions if since <= p["timestamp"]]
        first_in_time = versions and versions[0][0] <= p["timestamp"] + HORIZON
        out.append(in_force[-1] if in_force else versions[0][1] if first_in_time else {})
    return out


def test_spark_counts_the_versions_as_the_local_engine(spark: Any, tmp_path: Path) -> None:  # noqa: F811
    s = corrected(90, 1_800_000_000.0)
    config, predictions = written(s, tmp_path)
    local = run_audit(config, predictions, now=NOW)
    assert report_counts(local) == (s.truth, {"gender": s.unknown, "race": s.unknown})
    assert run_audit(config, predictions, now=NOW, engine="spark") == local
    events_frame(s).to_csv(tmp_path / "predictions.csv", index=False)  # epoch seconds read back as numbers
    assert report_counts(run_audit(config, tmp_path / "predictions.csv", engine="spark")) == report_counts(local)
    snapshot = run_audit(gate_config(tmp_path, stamped=False), predictions, engine="spark")
    assert report_counts(snapshot) != report_counts(local)


# --- what is refused ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("cell", "line"), [
    (None, r"row 2 of column 'updated_at' \(attribute_sources.applicants.timestamp\) is empty"),
    ("yesterday", r"row 2 of column 'updated_at' \(attribute_sources.applicants.timestamp\) is neither epoch "
                  r"seconds nor ISO 8601 text"),
    (-5.0, r"row 2 of column 'updated_at' .* is outside 1970-01-01 to 2106-02-07"),
])  # fmt: skip
def test_a_side_row_without_a_time_is_refused_in_one_line(tmp_path: Path, cell: object, line: str) -> None:
    s = corrected(10, 1_800_000_000.0)
    config, predictions = written(s, tmp_path)
    frame = side_frame(s)
    if isinstance(cell, str):  # ISO text, one cell of words
        frame["updated_at"] = iso(frame["updated_at"])
    frame = frame.astype({"updated_at": object})
    frame.loc[2, "updated_at"] = cell
    frame.to_parquet(tmp_path / "demographics.parquet")
    with pytest.raises(DataError, match=line):
        run_audit(config, predictions)
    cli = subprocess.run([sys.executable, "-m", "exporter.cli", "audit", str(config), str(predictions)],
                         capture_output=True, text=True)  # fmt: skip
    assert cli.returncode == 2 and len(cli.stderr.strip().splitlines()) == 1, cli.stderr
    assert cli.stderr.startswith("fairness-exporter audit: attribute_sources.applicants.path: ")
    assert not any(v in cli.stderr for v in (*GENDERS, *RACES))


def test_iso_text_times_give_the_counts_of_epoch_seconds(tmp_path: Path) -> None:
    """The side dataset's times and the predictions' as ISO 8601 text (naive means UTC), as a CSV file holds them."""
    s = corrected(30, 1_800_000_000.0)
    config, predictions = written(s, tmp_path)
    want = report_counts(run_audit(config, predictions))
    side_frame(s).assign(updated_at=lambda f: iso(f["updated_at"])).to_csv(tmp_path / "side.csv", index=False)
    events_frame(s).assign(timestamp=lambda f: iso(f["timestamp"])).to_csv(tmp_path / "p.csv", index=False)
    raw = yaml.safe_load(config.read_text())
    raw["attribute_sources"]["applicants"]["path"] = "side.csv"
    config.write_text(yaml.safe_dump(raw))
    assert want == (s.truth, {"gender": s.unknown, "race": s.unknown})
    assert report_counts(run_audit(config, tmp_path / "p.csv")) == want


def iso(seconds: pd.Series) -> pd.Series:
    """Epoch seconds as naive ISO 8601 text (UTC), to the microsecond."""
    return pd.to_datetime(seconds, unit="s").dt.strftime("%Y-%m-%dT%H:%M:%S.%f")


def test_predictions_without_their_time_column_are_refused_naming_it(tmp_path: Path) -> None:
    s = corrected(10, 1_800_000_000.0)
    config, _ = written(s, tmp_path)
    events_frame(s).drop(columns="timestamp").to_parquet(tmp_path / "untimed.parquet")
    with pytest.raises(DataError, match=r"no column 'timestamp' \(columns.timestamp\), each row's time that "
                                        r"attribute_sources.applicants.timestamp joins at"):  # fmt: skip
        run_audit(config, tmp_path / "untimed.parquet")


@pytest.mark.parametrize(("source", "line"), [
    ({"topic": "people", "id": "applicant_id", "timestamp": "updated_at"},
     r"attribute_sources.applicants.timestamp: the time column of the dataset at path, and there is no path"),
    ({"path": "d.parquet", "id": "applicant_id", "timestamp": "applicant_id"},
     r"attribute_sources.applicants.timestamp: 'applicant_id' is the id column"),
    ({"path": "d.parquet", "id": "applicant_id", "timestamp": ["a"]},
     r"attribute_sources.applicants.timestamp: \['a'\] is invalid"),
    ({"path": "d.parquet", "id": "applicant_id", "timestamp": "gender"},
     r"protected_attributes\[0\].column: 'gender' is the id or time column of source 'applicants'"),
])  # fmt: skip
def test_a_bad_timestamp_key_is_one_line_naming_it(source: dict[str, Any], line: str) -> None:
    from exporter.config.types import ConfigError

    with pytest.raises(ConfigError, match=line):
        parse_config({"model_id": "m1", "protected_attributes": ATTRIBUTES,
                      "attribute_sources": {"applicants": source}}, "c.yaml")  # fmt: skip


def test_spark_reads_naive_iso_text_as_utc_whatever_its_session_time_zone(spark: Any, tmp_path: Path) -> None:  # noqa: F811
    """A CSV's ISO 8601 text without an offset means UTC in the local engine (and the daemon, and ``backtest``);
    Spark's own CSV inference would read it in the session's time zone, 5 hours off in New York: the versions in
    force and the LL144 table's dates would then differ from the local engine's. The same counts and dates."""
    s = corrected(30, 1_800_000_000.0)
    config, _ = written(s, tmp_path)
    events_frame(s).assign(timestamp=lambda f: iso(f["timestamp"])).to_csv(tmp_path / "p.csv", index=False)
    local = run_audit(config, tmp_path / "p.csv", now=NOW)
    assert report_counts(local) == (s.truth, {"gender": s.unknown, "race": s.unknown})
    before = spark.conf.get("spark.sql.session.timeZone")
    spark.conf.set("spark.sql.session.timeZone", "America/New_York")
    try:
        assert run_audit(config, tmp_path / "p.csv", now=NOW, engine="spark") == local
    finally:
        spark.conf.set("spark.sql.session.timeZone", before)
