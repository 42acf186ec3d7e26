"""A CSV file's attribute cells meet the groups by their text as written: ``01`` is group ``"01"``, as in a parquet
file or a JSON event of the same rows, where type inference had made it the integer 1 (every row of a region coded
``01``, ``02`` counted outside the groups). A cell that names no group and writes a number still meets the group of
that number (``1.0``, as pandas writes an integer column with a blank cell, is group ``"1"``), as before. One rule
for the local engine, ``backtest``'s file input and Spark."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
import yaml
from test_spark import spark  # noqa: F401  (a local SparkSession; skipped without pyspark or Java, failed under CI)

from exporter.backtest.input import read_events
from exporter.backtest.replay import Replay, backtest
from exporter.config import load_config
from exporter.gate.fairness.audit import run_audit

NOW = datetime(2026, 1, 1, tzinfo=UTC)
T0 = 1_800_000_000
GROUPS = ["01", "02", "10"]
FILE_KEYS = ("data_file", "data_manifest_sha256", "data_manifest")


def write(tmp_path: Path, groups: list[Any], cells: list[str], *, other: bool = False) -> dict[str, Path]:
    """A config of one attribute ``region`` with ``groups`` (as YAML writes them), a CSV file whose region cells
    are ``cells`` exactly as written, and the same rows in parquet with a string column (a blank cell missing)."""
    rng = np.random.default_rng(7)
    n = len(cells)
    frame = pd.DataFrame({"timestamp": T0 + 6 * np.arange(n), "model_id": "m1", "region": cells,
                          "prediction": (rng.random(n) < 0.2 + 0.5 * (np.arange(n) % 3 == 0)).astype(int),
                          "label": rng.integers(0, 2, n)})  # fmt: skip
    config = {"model_id": "m1", "min_samples": 5, "windows": ["1h"], "bucket": "1m",
              "protected_attributes": [{"name": "region", "groups": groups}],
              **({"unknown_values": "other"} if other else {})}  # fmt: skip
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(config))
    header = ",".join(frame.columns)
    lines = [",".join(str(v) for v in row) for row in frame.itertuples(index=False)]
    (tmp_path / "p.csv").write_text("\n".join([header, *lines]) + "\n")
    frame.assign(region=[c or None for c in cells]).astype({"region": "object"}).to_parquet(tmp_path / "p.parquet")
    return {"config": tmp_path / "config.yaml", "csv": tmp_path / "p.csv", "parquet": tmp_path / "p.parquet"}


def report(config: Path, data: Path | pd.DataFrame, **kwargs: Any) -> dict[str, Any]:
    """The gate's JSON report of ``data``, without what names the file it was read from."""
    out = {k: v for k, v in run_audit(config, data, now=NOW, **kwargs).items() if k not in FILE_KEYS}
    out["impact_ratios"] = {k: v for k, v in out["impact_ratios"].items() if k != "source"}
    return out


def samples(found: dict[str, Any]) -> dict[str, int]:
    """Rows per group of ``region``, and the rows outside them under ``excluded``."""
    region = found["attributes"]["region"]
    return {**{g: v["samples"] for g, v in region["groups"].items()}, "excluded": region["excluded_rows"]}


def region_cells(n: int = 600, seed: int = 3) -> list[str]:
    """Region codes as a CSV holds them: three groups, one code outside them (``03``) and blanks."""
    return list(np.random.default_rng(seed).choice(["01", "02", "10", "03", ""], n, p=[0.3, 0.3, 0.2, 0.1, 0.1]))


def replayed(config: Path, data: Path) -> np.ndarray:
    """``backtest``'s counts of every (window bucket, group, cell) after replaying ``data``."""
    parsed = load_config(config)
    replay = Replay(parsed.model(), parsed.windowing)
    for columns, _, _ in read_events([data], parsed):
        replay.feed(columns["m1"])
    replay.finish()
    return np.asarray(replay.store.totals)


def test_zero_padded_codes_in_a_csv_count_as_the_same_rows_in_parquet(tmp_path: Path) -> None:
    cells = region_cells()
    files = write(tmp_path, GROUPS, cells)
    from_csv = report(files["config"], files["csv"])
    assert samples(from_csv) == {"01": cells.count("01"), "02": cells.count("02"), "10": cells.count("10"),
                                 "excluded": cells.count("03") + cells.count("")}  # fmt: skip
    assert from_csv == report(files["config"], files["parquet"])


def test_zero_padded_codes_in_a_csv_replay_as_the_same_rows_in_parquet(tmp_path: Path) -> None:
    files = write(tmp_path, GROUPS, region_cells())
    totals = replayed(files["config"], files["csv"])
    np.testing.assert_array_equal(totals, replayed(files["config"], files["parquet"]))
    assert totals.sum() > 0
    parsed = load_config(files["config"])
    assert backtest(parsed, [files["csv"]]) == backtest(parsed, [files["parquet"]])


def test_zero_padded_codes_and_a_configured_other_count_as_in_parquet(tmp_path: Path) -> None:
    """``unknown_values: other``: ``03`` and a blank are ``other``, ``01`` its own group."""
    cells = region_cells()
    files = write(tmp_path, ["01", "02"], cells, other=True)
    from_csv = report(files["config"], files["csv"])
    named = {"01": cells.count("01"), "02": cells.count("02")}
    assert samples(from_csv) == {**named, "other": len(cells) - sum(named.values()), "excluded": 0}
    assert from_csv == report(files["config"], files["parquet"])


def test_a_float_written_column_meets_integer_groups_as_before(tmp_path: Path) -> None:
    """An integer column with a blank cell, as pandas writes it (``1.0``, ``0.0``, empty), and groups ``[0, 1]``:
    counted as the frame pandas reads from the file, as its parquet file, and as before this change."""
    flags = np.random.default_rng(5).choice([1.0, 0.0, np.nan], 500, p=[0.45, 0.45, 0.1])
    cells = ["" if np.isnan(f) else str(f) for f in flags]
    assert set(cells) == {"1.0", "0.0", ""}
    files = write(tmp_path, [0, 1], cells)
    from_csv = report(files["config"], files["csv"])
    assert samples(from_csv) == {"0": cells.count("0.0"), "1": cells.count("1.0"), "excluded": cells.count("")}
    assert from_csv == report(files["config"], pd.read_csv(files["csv"]))
    float_parquet = tmp_path / "floats.parquet"
    pd.read_csv(files["csv"]).to_parquet(float_parquet)
    assert pd.read_parquet(float_parquet)["region"].dtype == np.float64
    assert from_csv == report(files["config"], float_parquet)
    np.testing.assert_array_equal(replayed(files["config"], files["csv"]), replayed(files["config"], float_parquet))


@pytest.mark.parametrize("neighbour", ["2", "x"], ids=["numbers only", "with a word"])
def test_01_meets_group_1_when_no_group_01_exists_whatever_its_column_holds(tmp_path: Path, neighbour: str) -> None:
    """``1`` and ``01`` in one column, groups ``1`` and ``2``: both are group ``1``, in the gate and in
    ``backtest``. Type inference gave that only while every cell of the column was a number (one word made ``01`` a
    text that met no group). No parquet file is the reference here: one holding ``01`` as text is never read as a
    number, as a JSON event's ``"01"`` is not."""
    cells = ["1", "01", "01", neighbour, "1", "2", "01"] * 20
    files = write(tmp_path, ["1", "2"], cells)
    found = samples(report(files["config"], files["csv"]))
    assert found == {"1": 100, "2": cells.count("2"), "excluded": cells.count("x")}
    rows = read_events([files["csv"]], load_config(files["config"]))
    codes = np.concatenate([columns["m1"].codes["region"] for columns, _, _ in rows])
    assert codes.tolist() == [{"1": 0, "01": 0, "2": 1, "x": -1}[c] for c in cells]


@pytest.mark.parametrize("case", ["zero-padded", "float-written", "mixed"])
def test_spark_reads_csv_attribute_cells_as_the_local_engine_does(spark: Any, tmp_path: Path, case: str) -> None:  # noqa: F811
    """Spark reads the attribute column of a CSV file as text, as the local engine does, and the gate's encoding
    matches it: the same rows per group (by hand) and the same report."""
    cells = {"zero-padded": region_cells(200), "float-written": ["1.0", "0.0", "", "1.0", "0.0"] * 40,
             "mixed": ["1", "01", "2", "x", "01"] * 40}[case]  # fmt: skip
    groups, expected = {
        "zero-padded": (GROUPS, {"01": cells.count("01"), "02": cells.count("02"), "10": cells.count("10"),
                                 "excluded": cells.count("03") + cells.count("")}),
        "float-written": ([0, 1], {"0": 80, "1": 80, "excluded": 40}),
        "mixed": (["1", "2"], {"1": 120, "2": 40, "excluded": 40}),
    }[case]  # fmt: skip
    files = write(tmp_path, groups, cells)
    with_spark = report(files["config"], files["csv"], engine="spark")
    assert samples(with_spark) == expected
    assert with_spark == report(files["config"], files["csv"])
    if case == "zero-padded":
        assert with_spark == report(files["config"], files["parquet"], engine="spark")
