"""`bias-report` features whose report names collide are refused (exit 2, one line naming every problem), by the
code that refuses the gate's colliding intersections (exporter/config/sections_intersections.py,
tests/test_intersection_names.py).

A feature is reported under its column, an intersection under its columns joined with ``_x_``, and each feature's
rows are tallied under that name. Before (review 20), on 200 rows of columns a, b and one literally named a_x_b:

1. ``--protected a,a``: exit 0, feature a with 400 rows (every row counted twice, intervals as for twice the data);
2. ``--protected a+b,a_x_b``: one feature a_x_b of 400 rows mixing the groups of both (x:u, ..., p, q), exit 1;
3. ``--protected a+b,a+b``: 400 rows again; ``a+a`` compared groups x:x and y:y.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

import pandas as pd
import pytest

from exporter import BiasAuditor
from exporter.cli import main
from exporter.config import ConfigError


def write(path: Path, rows: int = 200) -> Path:
    rng = random.Random(20)
    lines = ["a,b,a_x_b,outcome"] + [f"{rng.choice('xy')},{rng.choice('uv')},{rng.choice('pq')},{rng.randint(0, 1)}"
                                     for _ in range(rows)]  # fmt: skip
    path.write_text("\n".join(lines) + "\n")
    return path


def bias_report(tmp_path: Path, protected: str, capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = main(["bias-report", str(write(tmp_path / "d.csv")), "--protected", protected, "--outcome", "outcome",
                 "--audit-log", str(tmp_path / "log.jsonl"), "--junit", str(tmp_path / "j.xml")])  # fmt: skip
    out, err = capsys.readouterr()
    return code, out, err


def test_colliding_features_are_refused_in_one_line_naming_every_one(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = bias_report(tmp_path, "a,a,a+b,a_x_b,b+a,a+a", capsys)
    if code != 2:  # before: every row of a counted twice, a_x_b mixing two features' groups
        sizes = {f: sum(r["group_sizes"].values()) for f, r in json.loads(out).items()}
        assert sizes == {"a": 200, "a_x_b": 200}, sizes
    assert code == 2
    (line,) = err.strip().splitlines()
    assert line.startswith("fairness-exporter bias-report: colliding protected features: ")
    for problem in ("a: listed more than once", "a+b: its name 'a_x_b' is also a protected attribute's",
                    "b+a: ['b', 'a'] repeats a+b", "a+a: ['a', 'a'] lists ['a'] more than once"):  # fmt: skip
        assert problem in line, line
    assert not (tmp_path / "log.jsonl").exists()  # nothing was evaluated, nothing logged as a run
    assert 'errors="1"' in (tmp_path / "j.xml").read_text()


def test_features_whose_names_differ_are_each_evaluated_once(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The case the refusal must not refuse: columns, their intersection, and a column named a_x_b beside b+a (whose
    name is b_x_a)."""
    code, out, _ = bias_report(tmp_path, "a,b,a_x_b,b+a", capsys)
    assert code in (0, 1)
    report = json.loads(out)
    assert {f: sum(r["group_sizes"].values()) for f, r in report.items()} == dict.fromkeys(
        ("a", "b", "a_x_b", "b_x_a"), 200)  # fmt: skip
    assert sorted(report["b_x_a"]["group_sizes"]) == ["u:x", "u:y", "v:x", "v:y"]


def test_the_python_api_refuses_a_feature_given_twice() -> None:
    """``BiasAuditor(["a", ["a"]])``: a one-column list is reported as the column itself."""
    df = pd.DataFrame({"a": ["x", "y"] * 5, "outcome": [0, 1] * 5})
    with pytest.raises(ConfigError, match=r"^colliding protected features: a: its name 'a' is also a protected "):
        BiasAuditor(["a", ["a"]], "outcome").evaluate_bias(df)


def test_two_value_combinations_named_alike_are_refused_not_merged(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """An intersection's group is named by its values joined with ``:``: ``x:y`` + ``u`` and ``x`` + ``y:u`` are
    both ``x:y:u``. Before, one group silently held the rows of both (here 30 rows at mean 1.0 and 30 at 0.0 became
    one group of 60 at 0.5, and the 1.0 gap vanished). Across a folder's files as within one file."""
    folder = tmp_path / "data"
    folder.mkdir()
    rows = [("x:y", "u", 1)] * 30 + [("z", "u", 1)] * 30
    later = [("x", "y:u", 0)] * 30 + [("z", "u", 1)] * 30
    for name, part in (("part-0.csv", rows), ("part-1.csv", later)):
        pd.DataFrame(part, columns=["a", "b", "outcome"]).to_csv(folder / name, index=False)
    code = main(["bias-report", str(folder), "--protected", "a+b", "--outcome", "outcome",
                 "--audit-log", str(tmp_path / "log.jsonl")])  # fmt: skip
    out, err = capsys.readouterr()
    assert code == 2, out
    assert err.strip() == (f"fairness-exporter bias-report: {folder}: protected feature ['a', 'b']: the values "
                           "['x:y', 'u'] and ['x', 'y:u'] are both named 'x:y:u' (their values joined by ':'); "
                           "rename the values that hold it")
    assert not (tmp_path / "log.jsonl").exists()

    frame = pd.concat([pd.DataFrame(rows, columns=["a", "b", "outcome"]),
                       pd.DataFrame(later, columns=["a", "b", "outcome"])])  # fmt: skip
    with pytest.raises(ValueError, match=r"^<data>: protected feature \['a', 'b'\]: the values"):
        BiasAuditor([["a", "b"]], "outcome").evaluate_bias(frame)
    distinct = BiasAuditor([["a", "b"]], "outcome").evaluate_bias(pd.DataFrame(rows, columns=["a", "b", "outcome"]))
    assert distinct["a_x_b"]["group_sizes"] == {"x:y:u": 30, "z:u": 30}
