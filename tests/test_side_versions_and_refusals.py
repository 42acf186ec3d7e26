"""Attributes joined by id (attribute_sources), found by review 29: versions held in time order whatever order they
come in, refusals of a side table that name no value, the per-field value cap never read as missing in silence,
binary id columns joined as their UTF-8 text. Each failed before the fix. The daemon's join is driven in memory
through its ingest (the helpers of tests/test_attribute_join.py); the gate's through run_audit / the CLI."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st
from test_attribute_join import T0, daemon, events, samples, side

from exporter.cli import main
from exporter.core.side_table import SideTable, id_hashes
from exporter.gate.fairness.audit import run_audit


def gate_config(tmp_path: Path, side_file: str, timestamp: str | None = None, other: bool = False) -> Path:
    source = {"path": side_file, "id": "applicant_id", "horizon": "1m", **({"timestamp": timestamp} if timestamp
                                                                              else {})}  # fmt: skip
    raw = {"model_id": "m1", "min_samples": 1, "attribute_sources": {"applicants": source},
           "protected_attributes": [{"name": "gender", "groups": ["male", "female"], "source": "applicants"}],
           "metrics": [{"name": "demographic_parity_difference", "threshold": 0.05}]}  # fmt: skip
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


def gate_samples(report: dict) -> dict[str, float]:
    block = report["attributes"]["gender"]
    return {**{g: v["samples"] for g, v in block["groups"].items()}, "unknown": block["excluded_rows"]}


# --- 1. a side record whose time is earlier than the version held ---------------------------------------------


def test_a_side_record_older_than_the_held_version_does_not_erase_it_and_the_gate_agrees(tmp_path: Path) -> None:
    """The same two versions of applicant A, in the same order (topic offsets / file rows): male in force from
    T0-50, then a record in force from T0-100 (female: a backfill of the older value, or two producers whose
    CreateTimes interleave). A prediction at T0-20.

    docs/ml/joined-attributes.md: "A record is in force from its time ... as in Kafka Streams' versioned stream-table
    joins: a prediction uses the version in force at its own event time". At T0-20 that is male (the gate, which
    orders a dataset's versions by time, says so). The daemon's SideTable.put makes the later-offset record
    current and keeps the held one in ``previous`` only when it is older (``held[1] < since``): the male version is
    discarded, and the prediction counts as female. Gate and daemon disagree on the same records."""
    d = daemon()
    side(d, [("A", {"gender": "male", "race": "white"}, T0 - 50),
             ("A", {"gender": "female", "race": "white"}, T0 - 100)], 0)  # fmt: skip
    events(d, [{"model_id": "m1", "prediction_id": "p0", "timestamp": T0 - 20, "prediction": 1,
                "attributes": {"applicant_id": "A"}},
               {"model_id": "m1", "prediction_id": "p1", "timestamp": T0 - 70, "prediction": 1,
                "attributes": {"applicant_id": "A"}}])  # fmt: skip
    got = samples(d)
    daemon_counts = {g: got[("model_subgroup_samples", "gender", g)] for g in ("male", "female")}

    pd.DataFrame({"applicant_id": ["A", "A"], "gender": ["male", "female"],
                  "updated_at": [T0 - 50, T0 - 100]}).to_parquet(tmp_path / "side.parquet")  # fmt: skip
    pd.DataFrame({"applicant_id": ["A", "A"], "prediction": [1, 1],
                  "timestamp": [T0 - 20, T0 - 70]}).to_parquet(tmp_path / "pred.parquet")  # fmt: skip
    report = run_audit(gate_config(tmp_path, "side.parquet", "updated_at"), tmp_path / "pred.parquet")
    gate = gate_samples(report)
    # by time: female in force T0-100..T0-50 (the prediction at T0-70), male from T0-50 (the one at T0-20)
    assert {"male": gate["male"], "female": gate["female"]} == {"male": 1, "female": 1}
    assert daemon_counts == {"male": 1, "female": 1}, f"daemon {daemon_counts}, gate {gate}"


@settings(max_examples=300, deadline=None)
@given(records=st.lists(st.tuples(st.integers(0, 3), st.integers(0, 3),
                                  st.sampled_from([0.0, 0.4, 1.0, 2.0, 7.5, 8.0, 30.0])), max_size=30))  # fmt: skip
def test_records_put_in_any_order_hold_what_they_hold_put_in_time_order(
        records: list[tuple[int, int, float]]) -> None:  # fmt: skip
    """The property behind the test above: whatever order an id's records come in, the table holds the versions
    that put of them in time order (within a second, as they came) holds, and every lookup answers alike."""
    hashes = id_hashes([f"id-{i}" for i in range(4)])
    arrived, in_order = SideTable(["a"], 100), SideTable(["a"], 100)
    for i, a, t in records:
        arrived.put(int(hashes[i]), (a,), t)
    for i, a, t in sorted(records, key=lambda r: math.ceil(r[2])):
        in_order.put(int(hashes[i]), (a,), t)
    arrived.merge(), in_order.merge()
    assert arrived.keys.tolist() == in_order.keys.tolist() and len(arrived) == len(in_order)
    assert arrived.codes.tolist() == in_order.codes.tolist() and arrived.since.tolist() == in_order.since.tolist()
    assert arrived.previous == in_order.previous
    asked = np.repeat(hashes, 6)
    at = np.tile(np.array([-100.0, 0.0, 1.0, 2.5, 8.0, 99.0]), 4)
    for got, want in zip(arrived.get(asked, at, 5.0), in_order.get(asked, at, 5.0), strict=True):
        assert got.tolist() == want.tolist()


# --- 2. the firewall: a refusal of a bad side table row prints the row ------------------------------------------


def test_a_malformed_side_table_row_is_refused_without_printing_its_values(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:  # fmt: skip
    """docs/ml/joined-attributes.md, The firewall: "errors name files, columns, fields and counts, never a value of a
    side table". A CSV side table with one ragged row is refused (exit 2, one line: good), but the line is
    pyarrow's parse error, which quotes the row: the applicant's id and their demographics reach stderr and the
    CI log."""
    rows = ["applicant_id,gender,race", *(f"A{i},male,white" for i in range(50)), "Z-9731,female,black,extra"]
    (tmp_path / "side.csv").write_text("\n".join(rows) + "\n")
    (tmp_path / "pred.csv").write_text("applicant_id,prediction\nA1,1\nZ-9731,0\n")
    code = main(["audit", str(gate_config(tmp_path, "side.csv")), str(tmp_path / "pred.csv")])
    err = capsys.readouterr().err
    assert code == 2 and len(err.strip().splitlines()) == 1
    assert "Z-9731" not in err and "female" not in err and "black" not in err, err


def test_a_malformed_side_table_row_is_named_by_its_file_and_line(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:  # fmt: skip
    """What the refusal above says instead of the row: the file, the line and the counts of fields."""
    (tmp_path / "side.csv").write_text("applicant_id,gender\nA1,male\nZ-9731,female,extra\n")
    (tmp_path / "pred.csv").write_text("applicant_id,prediction\nA1,1\n")
    assert main(["audit", str(gate_config(tmp_path, "side.csv")), str(tmp_path / "pred.csv")]) == 2
    err = capsys.readouterr().err
    assert "side.csv" in err and "line 3 has 3 fields where the header has 2" in err, err


# --- 3. the gate caps a field's values in silence ---------------------------------------------------------------


def test_the_gate_does_not_silently_read_a_configured_value_as_missing_past_the_value_cap(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:  # fmt: skip
    """A side field past 4,096 distinct values reads as missing (side_table.MAX_VALUES). The daemon counts each such
    record (fairness_exporter_side_records_rejected_total{reason="too_many_values"}); the gate's
    SideTable.encode_column throws its ``problems`` away: a free-text gender field whose 4,096 first spellings are
    variants makes every later "female"/"male" row unknown, the report says nothing, and the audit is not refused.
    Either count the rows in their groups or refuse/flag the table (exit 2)."""
    n_junk = 4096
    ids = [f"A{i}" for i in range(n_junk + 4)]
    gender = [f"variant-{i}" for i in range(n_junk)] + ["female", "male", "female", "male"]
    pd.DataFrame({"applicant_id": ids, "gender": gender}).to_parquet(tmp_path / "side.parquet")
    pd.DataFrame({"applicant_id": ids[-4:], "prediction": [1, 0, 1, 0]}).to_parquet(tmp_path / "pred.parquet")
    config = gate_config(tmp_path, "side.parquet")
    code = main(["audit", str(config), str(tmp_path / "pred.parquet")])
    err = capsys.readouterr().err
    if code != 2:
        got = gate_samples(run_audit(config, tmp_path / "pred.parquet"))
        assert got == {"male": 2, "female": 2, "unknown": 0}, f"exit {code}, {got}, stderr: {err!r}"


def test_a_side_field_past_the_value_cap_is_refused_naming_the_file_field_and_rows(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:  # fmt: skip
    """The gate's choice above: refused (exit 2, one line), as a side table past ``max_records`` is; the line
    counts the rows past the cap over the whole table, and names no value."""
    ids = [f"A{i}" for i in range(4096 + 3)]
    gender = [f"variant-{i}" for i in range(4096)] + ["female", "male", "female"]
    pd.DataFrame({"applicant_id": ids, "gender": gender}).to_parquet(tmp_path / "side.parquet")
    pd.DataFrame({"applicant_id": ids[:2], "prediction": [1, 0]}).to_parquet(tmp_path / "pred.parquet")
    code = main(["audit", str(gate_config(tmp_path, "side.parquet")), str(tmp_path / "pred.parquet")])
    err = capsys.readouterr().err
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert "side.parquet" in err and "field 'gender' has 3 rows past its first 4,096 distinct values" in err, err
    assert "female" not in err and "variant" not in err, err


def test_a_side_field_at_the_value_cap_with_missing_cells_is_read(tmp_path: Path) -> None:
    """The case the refusal must not catch: 4,096 distinct values exactly, and missing cells (no value at all)."""
    ids = [f"A{i}" for i in range(4096 + 2)]
    gender = ["male", "female", *(f"variant-{i}" for i in range(4094)), None, None]
    pd.DataFrame({"applicant_id": ids, "gender": gender}).to_parquet(tmp_path / "side.parquet")
    pd.DataFrame({"applicant_id": [ids[0], ids[1], ids[-1]], "prediction": [1, 0, 1]}).to_parquet(
        tmp_path / "pred.parquet")  # fmt: skip
    got = gate_samples(run_audit(gate_config(tmp_path, "side.parquet"), tmp_path / "pred.parquet"))
    assert got == {"male": 1, "female": 1, "unknown": 1}


# --- 4. ids of a parquet BYTE_ARRAY column without the string annotation -----------------------------------------


def test_a_binary_id_column_joins_as_its_utf8_text(tmp_path: Path) -> None:
    """The daemon keys a side record by its Kafka key's UTF-8 text ("A1"). A parquet side table whose id column is
    BYTE_ARRAY without the UTF8 annotation (binary: Hive/Impala writers, Spark without binaryAsString) is hashed
    by the gate as str(b"A1") == "b'A1'": no prediction ever joins, every row is silently unknown."""
    pq.write_table(pa.table({"applicant_id": pa.array([b"A1", b"A2"], pa.binary()),
                             "gender": pa.array(["male", "female"])}), tmp_path / "side.parquet")  # fmt: skip
    pq.write_table(pa.table({"applicant_id": pa.array(["A1", "A2"]), "prediction": [1, 0]}),
                   tmp_path / "pred.parquet")  # fmt: skip
    got = gate_samples(run_audit(gate_config(tmp_path, "side.parquet"), tmp_path / "pred.parquet"))
    assert got == {"male": 1, "female": 1, "unknown": 0}


def test_binary_attribute_columns_count_as_their_utf8_text(tmp_path: Path) -> None:
    """The same reading for a binary attribute column of the side table and one inline in the predictions (the gate
    counted both as the groups "b'male'" and "b'female'", which no config names)."""
    pq.write_table(pa.table({"applicant_id": pa.array(["A1", "A2"]),
                             "gender": pa.array([b"male", b"female"], pa.binary())}), tmp_path / "side.parquet")
    pq.write_table(pa.table({"applicant_id": pa.array(["A1", "A2", "A2"]), "prediction": [1, 0, 1],
                             "region": pa.array([b"north", b"south", b"south"], pa.large_binary())}),
                   tmp_path / "pred.parquet")  # fmt: skip
    config = yaml.safe_load(gate_config(tmp_path, "side.parquet").read_text())
    config["protected_attributes"].append({"name": "region", "groups": ["north", "south"]})
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(config))
    report = run_audit(tmp_path / "c.yaml", tmp_path / "pred.parquet")
    assert gate_samples(report) == {"male": 1, "female": 2, "unknown": 0}
    region = report["attributes"]["region"]
    assert {g: v["samples"] for g, v in region["groups"].items()} == {"north": 1, "south": 2}
    assert region["excluded_rows"] == 0


def test_a_binary_id_that_is_no_utf8_text_is_refused_in_one_line(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:  # fmt: skip
    pq.write_table(pa.table({"applicant_id": pa.array([b"A1", b"\xff\xfe"], pa.binary()),
                             "gender": pa.array(["male", "female"])}), tmp_path / "side.parquet")  # fmt: skip
    pq.write_table(pa.table({"applicant_id": pa.array(["A1"]), "prediction": [1]}), tmp_path / "pred.parquet")
    code = main(["audit", str(gate_config(tmp_path, "side.parquet")), str(tmp_path / "pred.parquet")])
    err = capsys.readouterr().err
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert "side.parquet: column 'applicant_id' (an id): a binary column holds bytes that are no UTF-8 text" in err
