"""`backtest --html`: the report's bounded series, and a page whose every number is the report's, self-contained
and rendered by Chromium (a screenshot with the chart's and the banner's colours, not a blank page)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from PIL import Image
from test_backtest import RAW_CONFIG, recorded  # noqa: F401 (the module fixture: three hours of events drifting after one)
from test_html_report import assert_self_contained, f4, interval, rows_of, screenshot

from exporter.backtest import replay as backtest_module
from exporter.backtest import series as backtest_series
from exporter.backtest.series import SERIES_OTHERS
from exporter.cli import main
from exporter.config import parse_config
from exporter.gate.reports.html import BAR


@pytest.fixture(scope="module")
def replayed(recorded: dict[str, Path]) -> tuple[dict, str, Path]:  # noqa: F811
    output, page = recorded["dir"] / "report.json", recorded["dir"] / "backtest.html"
    assert main(["backtest", "--config", str(recorded["config"]), str(recorded["parquet"]), "--output", str(output),
                 "--html", str(page)]) == 0  # fmt: skip
    return json.loads(output.read_text()), page.read_text(), page


def test_the_series_are_the_paging_comparisons_and_agree_with_the_alerts(replayed: tuple[dict, str, Path]) -> None:
    report, _, _ = replayed
    series = report["series"]
    paged = [s for s in series if s["alerted"]]
    assert paged and len(series) == len(paged) + SERIES_OTHERS
    assert all(not s["alerted"] for s in series[len(paged):])  # the paging ones first, then the most extreme others
    others = [s["max_statistic"] for s in series[len(paged):]]
    assert others == sorted(others, reverse=True)
    for s in paged:
        points = s["points"]
        assert s["steps_per_point"] == 1 and len(points["time"]) == report["steps"] == 179  # 180 minutes, 1 open
        assert s["max_statistic"] == max(points["statistic"]) >= report["alarm_level"]
        fired = [a for a in report["alerts"] if a["alert"] == s["alert"] and a.get("dimension") == s.get("dimension")
                 and a.get("subgroup") == s.get("subgroup") and a["direction"] == s["direction"]]  # fmt: skip
        assert fired
        for a in fired:  # the series' point at the moment the page fired is the alert's value, interval, statistic
            k = points["time"].index(a["fired_at"])
            assert (points["value"][k], [points["lower"][k], points["upper"][k]], points["statistic"][k]) == (
                a["value"], a["interval"], a["statistic"])
            assert points["alarm"][k]
    drift = next(s for s in paged if s["alert"] == "FairnessDemographicParityDrift")
    # the configured threshold (here the metric table's default)
    thresholds = parse_config(RAW_CONFIG).model().thresholds()
    assert drift["threshold"] == thresholds["demographic_parity_difference"] and drift["window"] == "1h"


def test_a_long_series_is_bounded_and_keeps_its_peaks(recorded: dict[str, Path],  # noqa: F811
                                                       monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    full = backtest_module.backtest(parse_config(RAW_CONFIG), [recorded["parquet"]])
    monkeypatch.setattr(backtest_series, "SERIES_POINTS", 50)
    bounded = backtest_module.backtest(parse_config(RAW_CONFIG), [recorded["parquet"]])
    assert full["alerts"] == bounded["alerts"]
    for f, b in zip(full["series"], bounded["series"], strict=True):
        assert (b["alert"], b["direction"], b["max_statistic"]) == (f["alert"], f["direction"], f["max_statistic"])
        assert b["steps_per_point"] == 4 and len(b["points"]["time"]) == 45  # 180 steps in bins of 4
        for k, t in enumerate(b["points"]["time"]):  # each point is the bin's step with the largest statistic
            i = f["points"]["time"].index(t)
            start = i - i % 4
            assert b["points"]["statistic"][k] == max(f["points"]["statistic"][start:start + 4])
            assert b["points"]["value"][k] == f["points"]["value"][i]


def test_keep_peaks_takes_the_largest_statistic_per_bin_and_the_earliest_on_a_tie() -> None:
    columns = {"step": np.arange(6), "statistic": np.array([1.0, 3.0, 2.0, 2.0, 0.0, 5.0])}
    kept = backtest_series.keep_peaks(columns, 2)
    assert kept["step"].tolist() == [1, 2, 5]


def test_keep_peaks_keeps_each_bins_earliest_largest_statistic_over_gaps_ties_and_nans() -> None:
    """Steps with gaps (what an earlier downsampling left), ties (0.0 and -0.0 too), infinities and NaN (the lowest;
    a bin of NaN only keeps its first): each bin's point is the one a plain scan of the bin picks."""
    rng = np.random.default_rng(3)
    for _ in range(300):
        steps = np.sort(rng.choice(400, int(rng.integers(1, 80)), replace=False))
        statistic = rng.choice([0.0, -0.0, 0.5, 2.0, np.inf, -np.inf, np.nan], len(steps))
        width = int(2 ** rng.integers(0, 6))
        expected = []
        for b in dict.fromkeys(steps // width):
            in_bin = np.flatnonzero(steps // width == b)
            numbers = [i for i in in_bin if not np.isnan(statistic[i])]
            expected.append(max(numbers, key=lambda i: (statistic[i], -i)) if numbers else in_bin[0])
        kept = backtest_series.keep_peaks({"step": steps, "statistic": statistic}, width)
        assert kept["step"].tolist() == steps[expected].tolist()


def test_backtest_html_shows_the_reports_numbers(replayed: tuple[dict, str, Path]) -> None:
    report, html, _ = replayed
    assert_self_contained(html)
    pages = [a for a in report["alerts"] if a["severity"] == "critical"]
    assert html.index(f"{len(pages)} PAGE(S)") < html.index("<svg")  # the verdict comes first
    assert f"{len(pages)} page(s) fired: " in html
    for name in {a["alert"] for a in pages}:
        assert f"{name} ({sum(a['alert'] == name for a in pages)})" in html
    assert f"Events: {report['events']} replayed in {report['steps']} steps" in html
    assert f"alarm level {f4(report['alarm_level'])}" in html
    assert html.count("<svg") == len(report["series"])
    rows = rows_of(html)
    for a in report["alerts"]:
        comparison = (a.get("dimension") or a.get("subgroup")) + (f" ({a['direction']})" if "direction" in a else "")
        assert [a["alert"], a["severity"], a["attribute"], comparison, a["window"] or "—", a["fired_at"],
                a["resolved_at"] or "still firing", f4(a["value"]), interval(a["interval"]),
                f4(a.get("statistic"))] in rows  # fmt: skip
    for s in report["series"]:
        comparison = (s.get("dimension") or s.get("subgroup")) + f" ({s['direction']})"
        fired = sum(a["alert"] == s["alert"] and a.get("dimension") == s.get("dimension")
                    and a.get("subgroup") == s.get("subgroup") and a.get("direction") == s["direction"]
                    for a in report["alerts"])  # fmt: skip
        assert [s["alert"], s["attribute"], comparison, s["window"], "yes" if s["alerted"] else "no", str(fired),
                f4(s["max_statistic"]), f4(s["alarm_level"]), f4(s["threshold"]), str(len(s["points"]["time"])),
                str(s["steps_per_point"])] in rows  # fmt: skip


def test_chromium_renders_the_backtest_report(replayed: tuple[dict, str, Path], tmp_path: Path) -> None:
    _, _, page = replayed
    png = tmp_path / "backtest.png"
    screenshot(page, png)
    with Image.open(png) as image:
        assert image.size == (1200, 1600)
        rgb = np.asarray(image.convert("RGB"), dtype=np.int64).reshape(-1, 3)
    packed = rgb[:, 0] << 16 | rgb[:, 1] << 8 | rgb[:, 2]
    assert len(np.unique(packed)) > 100  # text, lines, bands, banner: anti-aliased shades, not a blank page
    assert (packed != 0xFFFFFF).mean() > 0.05
    assert (packed == 0xFDE8E7).sum() > 10000  # the red banner: pages fired
    assert (packed == int(BAR[1:], 16)).sum() > 200  # the gap's line


def test_a_series_extended_block_by_block_keeps_the_peaks_of_every_step_at_its_final_width() -> None:
    rng = np.random.default_rng(4)
    statistic = rng.integers(0, 4, 5_000).astype(float)  # ties everywhere
    statistic[rng.random(5_000) < 0.05] = np.nan
    everything = {"step": np.arange(5_000), "time": rng.random(5_000), "value": rng.random(5_000),
                  "lower": rng.random(5_000), "upper": rng.random(5_000), "statistic": statistic,
                  "alarm": rng.random(5_000) < 0.5}  # fmt: skip
    series = backtest_series.Series({k: v[:0] for k, v in everything.items()})
    for start, stop in ((0, 7), (7, 400), (400, 1_440), (1_440, 1_441), (1_441, 5_000)):
        series.extend({k: v[start:stop] for k, v in everything.items()})
        width = 1 << int(np.ceil(np.log2(stop / backtest_series.SERIES_POINTS))) if stop > 500 else 1
        assert series.width == width
        expected = backtest_series.keep_peaks({k: v[:stop] for k, v in everything.items()}, width)
        for k, v in expected.items():
            np.testing.assert_array_equal(series.columns[k], v)


def test_the_detectors_series_kept_together_are_each_detectors_own() -> None:
    """Columns ``(steps, detectors)`` extended block by block: each detector's column has the points, width and
    largest statistic its own series gets (ties, NaN and blocks that cross widths)."""
    rng = np.random.default_rng(5)
    steps, n = 3_000, 4
    statistic = rng.integers(0, 4, (steps, n)).astype(float)
    statistic[rng.random((steps, n)) < 0.05] = np.nan
    everything = {"step": np.repeat(np.arange(steps)[:, None], n, axis=1), "time": rng.random((steps, n)),
                  "value": rng.random((steps, n)), "lower": rng.random((steps, n)), "upper": rng.random((steps, n)),
                  "statistic": statistic, "alarm": rng.random((steps, n)) < 0.5}  # fmt: skip
    together = backtest_series.Series({k: v[:0] for k, v in everything.items()})
    alone = [backtest_series.Series({k: v[:0, i] for k, v in everything.items()}) for i in range(n)]
    for start, stop in ((0, 300), (300, 1_440), (1_440, 1_441), (1_441, 3_000)):
        together.extend({k: v[start:stop] for k, v in everything.items()})
        for i, series in enumerate(alone):
            series.extend({k: v[start:stop, i] for k, v in everything.items()})
            column = together.column(i)
            assert (column.width, column.max_statistic) == (series.width, float(series.max_statistic))
            assert json.dumps(column.points()) == json.dumps(series.points())


def test_isos_writes_what_datetime_writes_for_every_kind_of_time() -> None:
    """The report's times, formatted thousands at a time, are datetime's own: microseconds rounded half to even
    (a carry into the next second included), left out when 0, before 1970 too."""
    from datetime import UTC, datetime

    t0 = 1_800_000_000.0
    rng = np.random.default_rng(4)
    times = np.concatenate([t0 + rng.uniform(0, 86_400, 5_000), t0 + 60.0 * np.arange(100),
                            rng.uniform(-1e9, 3e9, 500), t0 + np.arange(50) + 0.9999995,
                            np.nextafter(t0 + np.arange(50) + 0.9999995, 0), t0 + np.arange(50) + 0.5e-6,
                            np.arange(50) * 0.4999995, t0 + np.round(rng.uniform(0, 1, 50), 3)])  # fmt: skip
    expected = [datetime.fromtimestamp(t, UTC).isoformat().replace("+00:00", "Z") for t in times.tolist()]
    assert backtest_series.isos(times) == expected
    assert any(t.endswith(":00Z") for t in expected) and any(t.endswith("0Z") and "." in t for t in expected)
