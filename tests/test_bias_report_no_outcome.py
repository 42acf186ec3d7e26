"""`bias-report` on a group whose every outcome is missing: the seed's API lists it with a NaN mean (and skips it in
the gap); the command writes it as null in valid JSON and says, on every report it writes, that the group was not
compared, instead of passing it by omission. A feature left with fewer than two groups that have outcome values
compared nothing and is refused (exit 2), as a feature of one group is."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from exporter.cli import main

# white 3 of 4 approved, black 3 of 4, men 3 of 4, women 3 of 4 (gaps 0); asian's 3 rows have no outcome (blank)
ROWS = [("male", "white", "1"), ("female", "white", "1"), ("male", "white", "0"), ("female", "white", "1"),
        ("male", "black", "1"), ("female", "black", "0"), ("male", "black", "1"), ("female", "black", "1"),
        ("male", "asian", ""), ("female", "asian", ""), ("male", "asian", "")]  # fmt: skip


def strict_json(text: str) -> Any:
    """JSON as the standard defines it: NaN and Infinity are no JSON (Python's parser would take them)."""

    def refuse(constant: str) -> None:
        raise ValueError(f"not JSON: {constant}")

    return json.loads(text, parse_constant=refuse)


def write(path: Path, rows: list[tuple[str, str, str]]) -> Path:
    path.write_text("gender,race,approved\n" + "".join(f"{g},{r},{o}\n" for g, r, o in rows))
    return path


def test_a_group_without_outcome_values_is_null_and_named_as_not_compared_on_every_report(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data = write(tmp_path / "data.csv", ROWS)
    out = {k: tmp_path / f"bias.{k}" for k in ("html", "xml", "md")}
    code = main(["bias-report", str(data), "--protected", "gender,race", "--outcome", "approved",
                 "--audit-log", str(tmp_path / "log.jsonl"), "--html", str(out["html"]), "--junit", str(out["xml"]),
                 "--summary-md", str(out["md"])])  # fmt: skip
    printed = capsys.readouterr()
    race = strict_json(printed.out)["race"]
    assert code == 0  # the seed's verdict on the groups compared: white and black, gap 0
    assert race["group_stats"] == {"white": 0.75, "black": 0.75, "asian": None}
    assert (race["fairness_gap"], race["is_biased"], race["groups_without_outcome"]) == (0.0, False, {"asian": 3})
    assert f"NOT COMPARED {data}: race group asian: no outcome values in its 3 rows" in printed.err
    assert "gender group" not in printed.err
    for kind in ("xml", "md"):
        assert "asian not compared: no outcome values in its 3 rows" in out[kind].read_text(), kind
    assert "Not compared, no outcome values: asian (3 rows)" in out["html"].read_text()
    [record] = [strict_json(line) for line in (tmp_path / "log.jsonl").read_text().splitlines()]
    assert record["report"][str(data)]["race"]["group_stats"]["asian"] is None


@pytest.mark.parametrize(("rows", "named"), [
    ([r for r in ROWS if r[1] != "black"], "race (white; asian: no outcome values)"),
    ([(g, r, "" if r != "asian" else "1") for g, r, _ in ROWS if r != "asian"] + [("male", None, "1")],
     "race (white: no outcome values; black: no outcome values)"),
], ids=["one group with outcomes", "no group with outcomes: a NaN gap"])  # fmt: skip
def test_a_feature_with_fewer_than_two_groups_with_outcomes_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], rows: list[tuple[str, Any, str]], named: str
) -> None:
    """The seed's API gives a gap of 0 (one group) or NaN (none), both "not biased"; nothing was compared."""
    data = write(tmp_path / "data.csv", [(g, r or "", o) for g, r, o in rows])
    code = main(["bias-report", str(data), "--protected", "race", "--outcome", "approved",
                 "--audit-log", str(tmp_path / "log.jsonl")])  # fmt: skip
    assert code == 2
    refusal = f"one group with outcome values at most in {named}: a gap needs two, nothing was compared"
    assert refusal in capsys.readouterr().err
