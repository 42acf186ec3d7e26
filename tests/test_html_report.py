"""HTML reports: every number in the page is the JSON report's, the page is self-contained, and Chromium renders
it (a screenshot with the charts' and the verdict's colours, not a blank page)."""

from __future__ import annotations

import json
import re
import subprocess
import tempfile
from html.parser import HTMLParser
from pathlib import Path

import numpy as np
import pytest
from PIL import Image
from test_ll144 import hand_case, ll144_config
from tooling import require_binary

from exporter.cli import main
from exporter.gate.reports.ci import insufficient
from exporter.gate.reports.html import BAR

ROOT = Path(__file__).resolve().parent.parent


class Tables(HTMLParser):
    """The text of every table cell, as a list of tables of rows."""

    def __init__(self) -> None:
        super().__init__()
        self.tables: list[list[list[str]]] = []
        self._cell: list[str] | None = None

    def handle_starttag(self, tag: str, attrs: list) -> None:
        if tag == "table":
            self.tables.append([])
        elif tag == "tr":
            self.tables[-1].append([])
        elif tag in ("td", "th"):
            self._cell = []

    def handle_endtag(self, tag: str) -> None:
        if tag in ("td", "th") and self._cell is not None:
            self.tables[-1][-1].append("".join(self._cell))
            self._cell = None

    def handle_data(self, data: str) -> None:
        if self._cell is not None:
            self._cell.append(data)


def rows_of(html: str) -> list[list[str]]:
    parser = Tables()
    parser.feed(html)
    return [row for t in parser.tables for row in t]


def f4(x: float | None) -> str:
    return "—" if x is None else f"{x:.4f}"


def interval(bounds: list) -> str:
    return "—" if bounds[0] is None else f"[{f4(bounds[0])}, {f4(bounds[1])}]"


def assert_self_contained(html: str) -> None:
    assert "<script" not in html and "<link" not in html and "<img" not in html
    assert not re.search(r"(?:src|href)\s*=\s*[\"']?(?:https?:)?//", html)
    assert html.count("<svg") >= 1


def test_audit_html_shows_the_reports_numbers(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    page = tmp_path / "audit.html"
    config = ll144_config(tmp_path, min_samples=5, metrics=[
        {"name": "demographic_parity_difference", "threshold": 0.1, "severity_on_fail": "blocking"},
        {"name": "disparate_impact_ratio", "threshold": 0.8, "severity_on_fail": "warning"}])  # fmt: skip
    code = main(["audit", str(config), str(hand_case(tmp_path)), "--audit-log", str(tmp_path / "log"),
                 "--html", str(page)])  # fmt: skip
    report = json.loads(capsys.readouterr().out)
    html = page.read_text()
    assert_self_contained(html)
    assert code == 1 and html.index("FAIL") < html.index("<svg")  # the verdict comes first
    assert (f"{report['passed']}/{report['total_tests']} comparisons passed · {report['blocking_failures']} blocking"
            in html)  # fmt: skip
    rows = rows_of(html)
    for block in report["attributes"].values():
        for group, s in block["groups"].items():
            assert [group, str(s["samples"]), f4(s["selection_rate"]), interval(s["selection_rate_ci"]),
                    f4(s["true_positive_rate"]), f4(s["false_positive_rate"])] in rows  # fmt: skip
    outcomes = set()
    for r in report["results"]:
        outcome = insufficient(r, 5) if r["status"] == "insufficient_samples" else r["status"]
        outcomes.add(outcome.split(":")[0])
        need = r["samples_to_decide"]
        counts_as = {"pass": "pass", "warning": "warning (does not block)", "blocking": "blocking"}[r["counts_as"]]
        assert [r["metric"], r["groups"], f4(r["exact_value"]), interval(r["ci_95"]), f4(r["threshold"]),
                r["severity"], outcome, r["evidence"], counts_as,
                " · ".join(f"{g} {n:,}" for g, n in need.items()) if need else "—"] in rows  # fmt: skip
    assert outcomes == {"pass", "fail", "insufficient samples"}  # non_binary's single row cannot be judged
    assert f"{report['insufficient_samples']} with insufficient samples · {report['inconclusive']} inconclusive" in html
    table = report["impact_ratios"]
    assert f"Data: {table['source']['file']} (manifest sha256 {table['source']['manifest_sha256']})" in html
    assert "2026-01-05T00:00:00Z to 2026-03-31T00:00:00Z" in html
    assert "Categories under 2% of the 100 rows are left out of the impact ratios (unless all are)" in html
    for name, block in table["attributes"].items():
        for r in block["categories"]:
            ratio = "excluded (<2%)" if r["small_category"] else f4(r["impact_ratio"])  # left out, as LL144 allows
            assert [r["category"], str(r["samples"]), f4(r["share"]), f4(r["rate"]), ratio,
                    "under 2%" if r["small_category"] else ""] in rows, (name, r)  # fmt: skip
        assert ["(unknown)", str(block["unknown_rows"]), f4(block["unknown_rows"] / report["rows"]), "—", "—",
                ""] in rows  # fmt: skip


def test_bias_report_one_file_is_the_auditors_report(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    data = ROOT / "tests" / "data" / "bias_example.csv"
    page = tmp_path / "bias.html"
    code = main(["bias-report", str(data), "--protected", "gender,race,gender+race", "--outcome",
                 "prediction_accuracy", "--html", str(page)])  # fmt: skip
    report = json.loads(capsys.readouterr().out)
    assert code == 1 and list(report) == ["gender", "race", "gender_x_race"]
    assert (report["race"]["fairness_gap"], report["race"]["is_biased"]) == (pytest.approx(0.16), True)
    html = page.read_text()
    assert_self_contained(html)
    assert html.index("BIASED") < html.index("<svg")
    rows = rows_of(html)
    for feature, r in report.items():
        assert [feature, f4(r["fairness_gap"]), f4(r["threshold"]), r["highest_group"], r["lowest_group"],
                str(r["excluded_rows"]), "yes" if r["is_biased"] else "no", "fail" if r["is_biased"] else "pass"] \
            in rows  # fmt: skip
        for g, mean in r["group_stats"].items():
            assert [g, str(r["group_sizes"][g]), f4(mean), interval(r["group_intervals"][g])] in rows


def test_bias_report_several_files_and_the_threshold(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    data = ROOT / "tests" / "data" / "bias_example.csv"
    copy = tmp_path / "second.parquet"
    import pandas as pd

    pd.read_csv(data).to_parquet(copy)
    code = main(["bias-report", str(data), str(copy), "--protected", "gender,race", "--outcome",
                 "prediction_accuracy", "--threshold", "0.2"])  # fmt: skip
    reports = json.loads(capsys.readouterr().out)
    assert code == 0 and list(reports) == [str(data), str(copy)]
    assert reports[str(data)] == reports[str(copy)]
    assert reports[str(copy)]["race"]["threshold"] == 0.2 and not reports[str(copy)]["race"]["is_biased"]


@pytest.mark.parametrize(("args", "message"), [
    (["--outcome", "accuracy"], "no outcome column 'accuracy'"),
    (["--outcome", "race"], "outcome column 'race' must be numeric"),
    (["--outcome", "prediction_accuracy", "--protected", "age"], "no protected feature column(s) ['age']"),
])  # fmt: skip
def test_bias_report_bad_input_exits_2(args: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    data = str(ROOT / "tests" / "data" / "bias_example.csv")
    argv = ["bias-report", data, "--protected", "gender", *args]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"fairness-exporter bias-report: {data}: {message}") and err.count("\n") == 1


def screenshot(page: Path, out: Path) -> None:
    chromium = require_binary("chromium")
    with tempfile.TemporaryDirectory() as profile:
        subprocess.run([chromium, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                        "--disable-background-networking", "--disable-component-update", "--disable-sync",
                        f"--user-data-dir={profile}", f"--screenshot={out}", "--window-size=1200,1600",
                        page.resolve().as_uri()], check=True, capture_output=True, timeout=180)  # fmt: skip


def test_chromium_renders_the_report_with_its_charts(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    page, png = tmp_path / "audit.html", tmp_path / "audit.png"
    main(["audit", str(ROOT / "examples/hiring-screener.yaml"), str(ROOT / "examples/hiring-predictions.csv"),
          "--audit-log", str(tmp_path / "log"), "--html", str(page)])  # fmt: skip
    capsys.readouterr()
    screenshot(page, png)
    with Image.open(png) as image:  # Pillow comes with matplotlib, i.e. with the reports extra
        assert image.size == (1200, 1600)
        rgb = np.asarray(image.convert("RGB"), dtype=np.int64).reshape(-1, 3)
    packed = rgb[:, 0] << 16 | rgb[:, 1] << 8 | rgb[:, 2]
    assert len(np.unique(packed)) > 100  # text, bars, band, banner: anti-aliased shades, not a blank page
    assert (packed != 0xFFFFFF).mean() > 0.1
    assert (packed == int(BAR[1:], 16)).sum() > 5000  # the bars of the first charts are on screen
    assert (packed == 0xFDE8E7).sum() > 10000  # the red FAIL banner
