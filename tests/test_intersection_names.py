"""Intersections whose names collide are refused when the config loads (exit 2, one message for every problem).

An intersection is named ``"_x_".join(names)`` and its subgroups ``":".join(groups)``
(exporter/config/sections_intersections.py), and every later stage keys by those names
(``BatchCounter.cells[attribute.name]`` in exporter/gate/fairness/frames.py, the report's ``attributes``,
``impact_ratios`` and each result's ``samples`` dicts). Before they were checked:

1. ``intersections: [[a, b], [a, b]]``: exit 0; every row counted twice in ``a_x_b`` (800 samples from 400 rows),
   each comparison reported twice with intervals as narrow as for twice the data.
2. an attribute named ``a_x_b`` beside ``intersections: [[a, b]]``: a ValueError traceback from numpy broadcasting,
   exit 1 (the code of a blocking fairness failure), nothing in the audit log.
3. groups holding ``:`` (``a: ["x:y", "x"]``, ``b: ["z", "y:z"]``): two subgroups both named ``x:y:z``, the report
   comparing "x:y:z vs x:y:z" (value 1.0, a blocking failure) and listing 3 of the 4 subgroups.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from exporter.config import ConfigError, parse_config

ROOT = Path(__file__).resolve().parent.parent
DP = {"name": "demographic_parity_difference", "threshold": 0.05, "severity_on_fail": "blocking"}


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("FAIRNESS_AUDIT_LOG_KEY", None)
    return subprocess.run([sys.executable, "-m", "exporter.cli", *args], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=300)  # fmt: skip


def write(tmp_path: Path, attributes: list[dict], intersections: list, columns: dict[str, list[str]],
          n: int = 400) -> tuple[Path, Path]:  # fmt: skip
    rng = random.Random(1)
    names = list(columns)
    lines = [",".join([*names, "prediction", "label"])]
    for _ in range(n):
        lines.append(",".join([*(rng.choice(columns[c]) for c in names), str(rng.randint(0, 1)),
                               str(rng.randint(0, 1))]))  # fmt: skip
    data = tmp_path / "d.csv"
    data.write_text("\n".join(lines) + "\n")
    config = tmp_path / "c.yaml"
    config.write_text(yaml.safe_dump({"model_id": "m1", "min_samples": 5, "protected_attributes": attributes,
                                      "intersections": intersections, "metrics": [DP]}))  # fmt: skip
    return config, data


def test_an_intersection_listed_twice_is_refused_not_counted_twice(tmp_path: Path) -> None:
    config, data = write(tmp_path, [{"name": "a", "groups": ["x", "y"]}, {"name": "b", "groups": ["u", "v"]}],
                         [["a", "b"], ["a", "b"]], {"a": ["x", "y"], "b": ["u", "v"]})  # fmt: skip
    done = cli("audit", str(config), str(data), "--audit-log", str(tmp_path / "log.jsonl"))
    if done.returncode != 2:
        report = json.loads(done.stdout)
        crossed = report["attributes"]["a_x_b"]
        # observed: exit 0, rows 400, a_x_b overall_samples 800 (each row counted twice), 12 a_x_b results for 6 pairs
        assert (report["rows"], crossed["overall_samples"]) == (400, 400)
        pairs = [r["groups"] for r in report["results"] if r["attribute"] == "a_x_b"]
        assert len(pairs) == len(set(pairs)), pairs
    assert done.returncode == 2 and "intersections" in done.stderr


def test_an_intersection_named_like_an_attribute_is_a_config_error(tmp_path: Path) -> None:
    attributes = [{"name": "a", "groups": ["x", "y"]}, {"name": "b", "groups": ["u", "v"]},
                  {"name": "a_x_b", "groups": ["p", "q"]}]  # fmt: skip
    config, data = write(tmp_path, attributes, [["a", "b"]], {"a": ["x", "y"], "b": ["u", "v"], "a_x_b": ["p", "q"]})
    done = cli("audit", str(config), str(data), "--audit-log", str(tmp_path / "log.jsonl"))
    # observed: "ValueError: operands could not be broadcast together with shapes (18,) (30,)", exit 1
    assert "Traceback" not in done.stderr, done.stderr[-300:]
    assert done.returncode == 2
    assert "a_x_b" in done.stderr


def test_group_names_holding_the_separator_do_not_make_two_subgroups_one(tmp_path: Path) -> None:
    attributes = [{"name": "a", "groups": ["x:y", "x"]}, {"name": "b", "groups": ["z", "y:z"]}]
    config, data = write(tmp_path, attributes, [["a", "b"]], {"a": ["x:y", "x"], "b": ["z", "y:z"]})
    done = cli("audit", str(config), str(data), "--audit-log", str(tmp_path / "log.jsonl"))
    if done.returncode == 2:  # refused as ambiguous: fine
        assert "a" in done.stderr
        return
    report = json.loads(done.stdout)
    crossed = [r for r in report["results"] if r["attribute"] == "a_x_b"]
    # observed: ['x:y:z vs x:y:y:z', 'x:y:z vs x:z', 'x:y:z vs x:y:z', ...]: "x:y:z vs x:y:z" compares two
    # different subgroups (x:y + z and x + y:z) under one name, and the groups table holds 3 subgroups, not 4
    assert all(len(r["samples"]) == 2 for r in crossed), [r["groups"] for r in crossed]
    assert len(report["attributes"]["a_x_b"]["groups"]) == 4, list(report["attributes"]["a_x_b"]["groups"])


def model(attributes: list[dict], intersections: list) -> dict:
    return {"model_id": "m1", "protected_attributes": attributes, "intersections": intersections, "metrics": [DP]}


def test_every_name_collision_of_the_intersections_is_listed_in_one_refusal() -> None:
    attributes = [{"name": n, "groups": ["p", "q"]} for n in ("a", "b", "c", "a_x_b", "b_x_c")]
    with pytest.raises(ConfigError) as refused:
        parse_config(model(attributes, [["a", "c"], ["c", "a"], ["a", "a"], ["a_x_b", "c"], ["a", "b_x_c"],
                                        ["a", "b"]]))  # fmt: skip
    assert str(refused.value).splitlines()[1:] == [
        "  intersections[1]: ['c', 'a'] repeats intersections[0]: every row would be counted twice; list each "
        "intersection once",
        "  intersections[2]: ['a', 'a'] lists ['a'] more than once: an intersection crosses different attributes",
        "  intersections[4]: its name 'a_x_b_x_c' is also the name of intersections[3]: rename an attribute so the "
        "two differ",
        "  intersections[5]: its name 'a_x_b' is also a protected attribute's: rename that attribute (an "
        "intersection is named by its attributes' names joined with '_x_')",
    ]


def test_the_refusal_names_both_groups_that_join_to_one_subgroup_name() -> None:
    attributes = [{"name": "a", "groups": ["x:y", "x"]}, {"name": "b", "groups": ["z", "y:z"]}]
    with pytest.raises(ConfigError, match=r"intersections\[0\]: groups \['x:y', 'z'\] and \['x', 'y:z'\] of "
                                          r"\['a', 'b'\] both make the subgroup 'x:y:z'"):  # fmt: skip
        parse_config(model(attributes, [["a", "b"]]))


def test_distinct_intersections_and_groups_holding_the_separator_that_do_not_collide_are_accepted() -> None:
    attributes = [{"name": "a", "groups": ["x:y", "x"]}, {"name": "b", "groups": ["z", "w"]},
                  {"name": "c", "groups": ["p", "q"]}]  # fmt: skip
    config = parse_config(model(attributes, [["a", "b"], ["a", "c"], ["b", "c"], ["a", "b", "c"]]))
    (spec,) = config.models
    crossed = {a.name: a.groups for a in spec.attributes if len(a.columns) > 1}
    assert list(crossed) == ["a_x_b", "a_x_c", "b_x_c", "a_x_b_x_c"]
    assert crossed["a_x_b"] == ("x:y:z", "x:y:w", "x:z", "x:w")
