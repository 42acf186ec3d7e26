"""Protected attributes joined by id (attribute_sources): what a review (review12) found, each test failing before
its fix. Every expected value is worked out by hand in the test's comment, never from the project's code."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import yaml
from test_attribute_join import T0, counter, daemon, events, samples, side

from exporter.gate.fairness.audit import run_audit

V1 = {"gender": "male", "race": "white"}
V2 = {"gender": "female", "race": "black"}
V3 = {"gender": "female", "race": "asian"}


def pred(pid: str, aid: object, t: float, p: int = 1) -> dict:
    attributes = {} if aid is None else {"applicant_id": aid}
    return {"model_id": "m1", "prediction_id": pid, "timestamp": t, "prediction": p, "attributes": attributes}


def counts(d) -> dict[tuple[str, str], float]:  # type: ignore[no-untyped-def]
    """(attribute, subgroup) -> samples in the 1h window, and (attribute, "unknown") -> unknown samples."""
    out = {}
    for (name, attribute, subgroup), v in samples(d).items():
        if name == "model_subgroup_samples" and subgroup != "overall" and v:
            out[(attribute, subgroup)] = v
        elif name == "model_subgroup_unknown_samples" and v:
            out[(attribute, "unknown")] = v
    return out


# --- 1. a correction of a correction: the version in force is lost, and the answer depends on the reading order ---
# docs/ml/joined-attributes.md, "Corrections": "a prediction uses the version in force at its own event time, and
# one made before any record of its id takes the first record ... the answer does not depend on the order in which
# the topics happen to be read, so a restart that replays predictions after reading a later correction counts them
# as the first run did." SideTable kept one replaced version per id (``previous``), so with three versions a
# prediction between the first and the second met the second; it keeps every one a prediction may still need.


def test_a_restart_that_reads_two_later_corrections_first_counts_the_prediction_as_the_first_run_did(
        tmp_path: Path) -> None:  # fmt: skip
    # A: male/white from T0-300, female/black from T0-200, female/asian from T0-100; prediction at T0-250
    # -> in force at T0-250: male/white (by hand).
    first = daemon(tmp_path)
    offset = side(first, [("A", V1, T0 - 300)], 0)
    first.checkpointer.write()  # side offset 1, predictions offset 0
    events(first, [pred("p", "A", T0 - 250)])
    side(first, [("A", V2, T0 - 200), ("A", V3, T0 - 100)], offset)
    assert counts(first) == {("gender", "male"): 1, ("race", "white"): 1}  # holds
    # a crash before the next checkpoint: the restart reads the side topic's two corrections, then replays p
    again = daemon(tmp_path)
    side(again, [("A", V2, T0 - 200), ("A", V3, T0 - 100)], offset)
    events(again, [pred("p", "A", T0 - 250)])
    assert counts(again) == {("gender", "male"): 1, ("race", "white"): 1}  # before: female/black (the 2nd version)


def test_a_prediction_older_than_every_version_takes_the_first_even_when_three_arrive_together() -> None:
    # p at T0-350 waits; A's records at T0-330, -320, -310 (all within the 1m horizon) arrive in one side batch
    # -> "one made before any record of its id takes the first record": male/white (by hand).
    d = daemon()
    events(d, [pred("p", "A", T0 - 350)])
    side(d, [("A", V1, T0 - 330), ("A", V2, T0 - 320), ("A", V3, T0 - 310)], 0)
    assert counts(d) == {("gender", "male"): 1, ("race", "white"): 1}  # before: female/black


# --- 2. unknown_values: other: a prediction with no record (or no id) is not put in `other` by the daemon ---------
# docs/contract.md: a value "outside the groups, null or absent (an empty cell) is the attribute's unknown category
# (`other` with `unknown_values: other`)"; model_subgroup_unknown_samples: "With `unknown_values: other` they land in
# the bounded `other` subgroup instead and this is 0". docs/ml/joined-attributes.md: "`unknown_values: other` ...
# work on joined attributes exactly as on columns of the predictions", and no record/no id is "the unknown
# category". The gate (run_audit on the same rows) puts them in `other`; the daemon leaves them unknown (code -1
# set by the decoder, never mapped by the join), so daemon and gate disagree.


def test_with_unknown_values_other_a_prediction_without_a_record_or_an_id_counts_in_other() -> None:
    d = daemon(unknown_values="other")
    side(d, [("A", V1, T0 - 300), ("B", {"gender": "nonbinary", "race": "white"}, T0 - 300)], 0)
    events(d, [pred("p1", "A", T0 - 250),   # male / white
               pred("p2", "B", T0 - 250),   # gender outside the groups -> other; white
               pred("p3", "C", T0 - 250),   # never a record -> other / other
               pred("p4", None, T0 - 250)])  # no id -> other / other  # fmt: skip
    d.clock.now += 120  # type: ignore[attr-defined]  # past the 1m horizon: p3 is given up
    d.ingest.expire()
    assert counter(d, "fairness_exporter_attribute_joins_total", source="applicants", outcome="never_joined") == 1
    got = counts(d)
    # by hand: gender male 1, other 3 (p2, p3, p4); race white 2, other 2 (p3, p4); no unknown samples
    assert got == {("gender", "male"): 1, ("gender", "other"): 3, ("race", "white"): 2, ("race", "other"): 2}


def test_the_gate_puts_the_same_rows_in_other(tmp_path: Path) -> None:
    """The reference the daemon should match (this one passes): the gate on the rows of the test above."""
    pd.DataFrame({"applicant_id": ["A", "B", "C", None], "prediction": [1, 1, 1, 1]}).to_parquet(
        tmp_path / "p.parquet")
    pd.DataFrame({"applicant_id": ["A", "B"], "gender": ["male", "nonbinary"], "race": ["white", "white"]}).to_parquet(
        tmp_path / "demographics.parquet")
    config = {"model_id": "m1", "min_samples": 1, "unknown_values": "other",
              "attribute_sources": {"applicants": {"path": "demographics.parquet", "id": "applicant_id"}},
              "protected_attributes": [{"name": "gender", "groups": ["male", "female"], "source": "applicants"},
                                       {"name": "race", "groups": ["white", "black", "asian"],
                                        "source": "applicants"}]}  # fmt: skip
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(config))
    report = run_audit(str(tmp_path / "c.yaml"), str(tmp_path / "p.parquet"))
    gender = report["attributes"]["gender"]
    assert {g: v["samples"] for g, v in gender["groups"].items()} == {"male": 1, "female": 0, "other": 3}
    assert gender["excluded_rows"] == 0


# --- 3. the gate reads a CSV side table's id column as a number: ids change, and distinct ids merge --------------
# docs/ml/joined-attributes.md: the id is "key = the id (UTF-8)" on the topic and "the column holding the id" in the
# table; "the latest row of an id wins"; the gate "audits exactly as the merged table would". pyarrow's CSV type
# inference turns the id column `007` into int 7 (hashed as "7"), and 20-digit ids into one float64, so two
# applicants share one record.


def _gate(tmp_path: Path, side_csv: str, predictions: Path) -> dict:
    (tmp_path / "demographics.csv").write_text(side_csv)
    config = {"model_id": "m1", "min_samples": 1,
              "attribute_sources": {"applicants": {"path": "demographics.csv", "id": "applicant_id"}},
              "protected_attributes": [{"name": "gender", "groups": ["male", "female"], "source": "applicants"}]}
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(config))
    gender = run_audit(str(tmp_path / "c.yaml"), str(predictions))["attributes"]["gender"]
    return {"excluded": gender["excluded_rows"],
            **{g: (v["samples"], v["selection_rate"]) for g, v in gender["groups"].items()}}


def test_a_csv_side_table_of_zero_padded_ids_joins_the_same_ids_given_as_text(tmp_path: Path) -> None:
    # 20 predictions: 007 (predicted 1) x10, 012 (predicted 0) x10; 007 is male, 012 female
    # -> male 10 rows at rate 1.0, female 10 at 0.0, none excluded (by hand)
    pd.DataFrame({"applicant_id": ["007", "012"] * 10, "prediction": [1, 0] * 10}).to_parquet(
        tmp_path / "p.parquet")
    got = _gate(tmp_path, "applicant_id,gender\n007,male\n012,female\n", tmp_path / "p.parquet")
    assert got == {"excluded": 0, "male": (10, 1.0), "female": (10, 0.0)}  # before: all 20 excluded


def test_two_long_numeric_ids_of_a_csv_side_table_stay_two_applicants(tmp_path: Path) -> None:
    # ...890 is male (predicted 1), ...891 female (predicted 0), 10 predictions each, both files CSV
    # -> male 10 at 1.0, female 10 at 0.0 (by hand)
    rows = [("12345678901234567890", 1), ("12345678901234567891", 0)] * 10
    (tmp_path / "p.csv").write_text("applicant_id,prediction\n" + "".join(f"{i},{p}\n" for i, p in rows))
    got = _gate(tmp_path, "applicant_id,gender\n12345678901234567890,male\n12345678901234567891,female\n",
                tmp_path / "p.csv")
    assert got == {"excluded": 0, "male": (10, 1.0), "female": (10, 0.0)}  # before: female (20, 0.5), male 0


def test_a_csv_id_written_by_pandas_as_a_float_joins_its_integer(tmp_path: Path) -> None:
    """An integer id column with a blank cell is floats to pandas, and its CSV says ``12.0``: it joins the side
    table's ``12``, as a parquet file's 12.0 and the daemon's JSON 12.0 do; the blank is the unknown category."""
    frame = pd.DataFrame({"applicant_id": [12, 13, None] * 4, "prediction": [1, 0, 1] * 4})
    frame.to_csv(tmp_path / "p.csv", index=False)
    assert "12.0" in (tmp_path / "p.csv").read_text()
    got = _gate(tmp_path, "applicant_id,gender\n12,male\n13,female\n", tmp_path / "p.csv")
    assert got == {"excluded": 4, "male": (4, 1.0), "female": (4, 0.0)}
