"""The conditional metrics (``strata:``) are judged among their comparisons as every metric is: a ``fail`` under the
configured ``multiplicity`` (holm / bonferroni), a ``worst[]`` row with its simultaneous interval, in the gate and in
the daemon alike (found by review 17: they were judged alone at 95%, with no worst row, under ``multiplicity: holm``).

docs/auditor/numbers.md, Many comparisons: "``multiplicity: holm | bonferroni | none`` (per model; default
``holm``) says how a comparison's ``fail`` evidence is judged among its metric's K judged comparisons of the
attribute. [...] ``holm``: Holm's step-down, the same first step [its interval at 5%/K must lie wholly beyond the
threshold]"; "Per attribute and metric, the report's ``worst[]`` [...] names the comparison with the largest
difference". On one stratum the Mantel-Haenszel difference is the plain difference and its interval Newcombe's
(method 10 alone, the continuity-corrected method 11 as one of K), so statsmodels' ``newcomb`` interval and scipy's
continuity-corrected Wilson intervals are the oracles.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pandas as pd
import pytest
import yaml
from daemon_config import make_config
from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families
from scipy.stats import binomtest
from statsmodels.stats.proportion import confint_proportions_2indep

from exporter.backtest.replay import backtest
from exporter.backtest.series import iso
from exporter.core.conditional import conditional_compare
from exporter.core.fairness import N_COUNTS, PRED_NEG, PRED_POS
from exporter.daemon import Daemon
from exporter.gate.fairness.audit import run_audit

CONDITIONAL = "conditional_demographic_parity_difference"
GROUPS = ("a", "b", "c", "d")


def _rows(selected: dict[str, int], n: int = 400) -> pd.DataFrame:
    """``n`` rows per group in one stratum (``band`` x), ``selected[g]`` of them predicted positive."""
    rows = [(g, 1) for g, k in selected.items() for _ in range(k)] + \
        [(g, 0) for g, k in selected.items() for _ in range(n - k)]  # fmt: skip
    return pd.DataFrame(rows, columns=["g", "prediction"]).assign(band="x")


def _config(multiplicity: str, threshold: float = 0.02) -> dict[str, Any]:
    return {"model_id": "m", "min_samples": 30, "decision": "evidence", "multiplicity": multiplicity,
            "strata": ["band"],
            "failure_policy": {"blocking_failures": "halt_deployment", "warning_failures": "log_and_continue",
                               "inconclusive": "warn"},
            "protected_attributes": [{"name": "g", "groups": list(GROUPS)}],
            "metrics": [{"name": CONDITIONAL, "threshold": threshold, "severity_on_fail": "blocking"},
                        {"name": "demographic_parity_difference", "threshold": threshold,
                         "severity_on_fail": "blocking"}]}  # fmt: skip


def _newcombe(k1: int, k0: int, alpha: float, n: int = 400) -> tuple[float, float]:
    """Newcombe's interval of k1/n - k0/n at level 1 - alpha: statsmodels' (method 10) alone, from scipy's
    continuity-corrected Wilson intervals (method 11) as one of several (alpha < 5%)."""
    if alpha >= 0.05:
        low, high = confint_proportions_2indep(k1, n, k0, n, method="newcomb", alpha=alpha)
        return float(low), float(high)
    c1, c0 = (binomtest(k, n).proportion_ci(1 - alpha, method="wilsoncc") for k in (k1, k0))
    d = (k1 - k0) / n
    return d - math.hypot(k1 / n - c1.low, c0.high - k0 / n), d + math.hypot(c1.high - k1 / n, k0 / n - c0.low)


def _audit(tmp_path: Path, config: dict[str, Any], frame: pd.DataFrame) -> dict[str, Any]:
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(config))
    return run_audit(path, frame)


def test_a_conditional_comparison_fails_under_holm_only_if_its_interval_at_5_percent_over_k_is_beyond(
    tmp_path: Path,
) -> None:
    """Under ``multiplicity: holm`` a comparison fails on evidence only if its interval at 5%/K lies beyond the
    threshold (the first Holm step), K the metric's judged comparisons (the result says ``comparisons_judged: 6``).

    Four groups of 400 in one stratum: a, b, c selected 120 times, d 156 times; gap 0.09 against a threshold of
    0.02. Newcombe's interval at 95% is [0.0241, 0.1548], beyond 0.02; at 5%/6 (Holm's first step, Bonferroni's
    only one) it is [-0.0004, 0.1784], not beyond: inconclusive. With ``decision: evidence`` and
    ``failure_policy.inconclusive: warn`` nothing blocks: PASS (found before: the three d pairs judged alone at 95%,
    ``fail``, verdict FAIL, no ``worst[]`` row), as the same rows' unconditional parity is judged."""
    frame = _rows({"a": 120, "b": 120, "c": 120, "d": 156})
    alone, holm_first = _newcombe(156, 120, 0.05), _newcombe(156, 120, 0.05 / 6)
    assert alone[0] > 0.02 and holm_first[0] < 0.02  # fails alone, inconclusive among the six
    report = _audit(tmp_path, _config("holm"), frame)
    conditional = {r["groups"]: r for r in report["results"] if r["metric"].startswith("conditional_")}["a vs d"]
    plain = {r["groups"]: r for r in report["results"] if r["metric"] == "demographic_parity_difference"}["a vs d"]
    assert abs(conditional["ci_95"][0] - alone[0]) < 1e-9 and conditional["comparisons_judged"] == 6
    assert plain["evidence"] == "inconclusive"
    worst_metrics = {w["metric"] for w in report["worst"]}
    assert (report["multiplicity"], conditional["evidence"], report["verdict"],
            "conditional_demographic_parity_difference" in worst_metrics) == ("holm", "inconclusive", "PASS", True), \
        (report["multiplicity"], conditional["evidence"], report["verdict"], sorted(worst_metrics))


def test_the_conditional_worst_row_holds_the_newcombe_interval_at_5_percent_over_k(tmp_path: Path) -> None:
    """The ``worst[]`` row of the conditional metric: the largest gap (a vs d, 0.09), its simultaneous interval the
    widest of the six pairs' intervals at 5%/6 (continuity-corrected Newcombe, folded: it holds 0), and what that
    interval says; the unconditional parity's worst row on the same rows is the same."""
    report = _audit(tmp_path, _config("holm"), _rows({"a": 120, "b": 120, "c": 120, "d": 156}))
    worst = {w["metric"]: w for w in report["worst"]}
    low, high = _newcombe(156, 120, 0.05 / 6)
    conditional = worst[CONDITIONAL]
    assert (conditional["dimension"], conditional["comparisons_judged"], conditional["evidence"]) == \
        ("a_vs_d", 6, "inconclusive")  # fmt: skip
    assert conditional["value"] == pytest.approx(0.09, abs=1e-12)
    assert low < 0 and conditional["ci_simultaneous"] == pytest.approx([0.0, high], abs=1e-9)
    assert conditional["ci_simultaneous"] == pytest.approx(worst["demographic_parity_difference"]["ci_simultaneous"],
                                                           abs=1e-12)  # fmt: skip


@pytest.mark.parametrize("multiplicity", ["holm", "bonferroni", "none"])
def test_conditional_fails_are_those_of_the_rule_on_the_comparisons_intervals(tmp_path: Path,
                                                                              multiplicity: str) -> None:  # fmt: skip
    """Holm's later steps too: with a, b, c, d selected 100, 100, 134 and 178 times of 400, five of the six gaps fail
    alone, Bonferroni fails two (a vs d, b vs d) and Holm three, c vs d at its third step, 5%/4 (numbers.md: "once r
    comparisons fail the others are judged again at 5%/(K - r), until none more fails", on the oracle intervals).
    The gate fails exactly those conditional comparisons, as it fails the unconditional ones on the same rows."""
    selected = {"a": 100, "b": 100, "c": 134, "d": 178}
    pairs = {f"{x} vs {y}": (selected[y], selected[x]) for x, y in itertools.combinations(GROUPS, 2)}

    def beyond(left: set[str], k: int) -> set[str]:
        return {p for p in left if _newcombe(*pairs[p], 0.05 / k)[0] > 0.02}

    expected = beyond(set(pairs), {"none": 1, "bonferroni": 6, "holm": 6}[multiplicity])
    while multiplicity == "holm" and (more := beyond(set(pairs) - expected, 6 - len(expected))):
        expected |= more
    report = _audit(tmp_path, _config(multiplicity), _rows(selected))
    failed = {m: {r["groups"] for r in report["results"] if r["metric"] == m and r["evidence"] == "fail"}
              for m in (CONDITIONAL, "demographic_parity_difference")}  # fmt: skip
    assert len(expected) == {"holm": 3, "bonferroni": 2, "none": 5}[multiplicity]
    assert failed[CONDITIONAL] == expected == failed["demographic_parity_difference"]


def test_a_lone_conditional_comparison_keeps_its_95_interval_bit_for_bit() -> None:
    """K = 1: the interval as one of one is the 95% interval, to the bit (Z_95, not the quantile computed again)."""
    strata = np.zeros((2, 3, N_COUNTS), np.int64)
    strata[..., PRED_POS] = [[30, 12, 7], [22, 15, 3]]
    strata[..., PRED_NEG] = [[70, 40, 20], [80, 31, 25]]
    a, b = np.array([0]), np.array([1])
    for name in (CONDITIONAL, "conditional_demographic_disparity"):
        alone = conditional_compare(name, strata, a, b).values
        one_of_one = conditional_compare(name, strata, a, b, np.array([1])).values
        assert [alone.lower.tobytes(), alone.upper.tobytes()] == [one_of_one.lower.tobytes(),
                                                                  one_of_one.upper.tobytes()]  # fmt: skip


@dataclass
class _Record:
    value: bytes
    offset: int


def test_the_daemon_judges_conditional_comparisons_as_the_gate_does_under_holm(tmp_path: Path) -> None:
    """The review's rows through the daemon (its counts per subgroup x stratum, serve/snapshot.py) and through the
    gate: the same conditional evidence per pair under holm (a vs d inconclusive, not fail) and the same worst
    comparison, its simultaneous interval and its K on /metrics as in the report's ``worst[]``."""
    now = 1_800_000_000.0
    rows = _rows({"a": 120, "b": 120, "c": 120, "d": 156})
    settings: dict[str, Any] = {
        "protected_attributes": [{"name": "g", "groups": list(GROUPS)}], "strata": ["band"], "min_samples": 30,
        "multiplicity": "holm", "windows": ["10m"], "bucket": "10s", "allowed_lateness": "15m",
        "metrics": [{"name": CONDITIONAL, "threshold": 0.02}],
    }  # fmt: skip
    daemon = Daemon(make_config(checkpoint={"path": str(tmp_path / "state")}, **settings),
                    registry=CollectorRegistry(), clock=lambda: now)  # fmt: skip
    events = [orjson.dumps({"model_id": "m1", "prediction_id": f"p{i}", "timestamp": now - 120,
                            "prediction": int(r.prediction), "label": None,
                            "attributes": {"g": r.g, "band": r.band}}) for i, r in enumerate(rows.itertuples())]
    daemon.ingest.handle("predictions", 0, [_Record(e, i) for i, e in enumerate(events)])
    daemon.computer.compute()
    samples = [s for family in text_string_to_metric_families(daemon.metrics_page()) for s in family.samples
               if s.labels.get("metric") == CONDITIONAL]  # fmt: skip
    page = {s.labels["dimension"]: s.labels["evidence"] for s in samples
            if s.name == "model_comparison_evidence" and s.value == 1.0}  # fmt: skip
    report = run_audit(make_config(**settings).model(), rows.assign(label=None))
    gate = {r["dimension"]: r["evidence"] for r in report["results"] if r["metric"] == CONDITIONAL}
    assert page == gate and gate["a_vs_d"] == "inconclusive"
    (worst,) = [w for w in report["worst"] if w["metric"] == CONDITIONAL]
    shown = {s.name: s for s in samples if s.name.startswith(("model_worst_comparison", "model_comparisons_judged"))}
    assert shown["model_comparisons_judged"].value == worst["comparisons_judged"] == 6
    assert shown["model_worst_comparison"].labels["dimension"] == worst["dimension"]
    assert [shown[f"model_worst_comparison{s}"].value for s in ("", "_lower", "_upper")] == pytest.approx(
        [worst["value"], *worst["ci_simultaneous"]], abs=1e-9)


CONDITIONAL_NAMES = (CONDITIONAL, "conditional_equal_opportunity_difference", "conditional_demographic_disparity")


def _stratified_rows() -> pd.DataFrame:
    """Four groups over two bands in different mixes (a mostly in x, b mostly in y), selected more often from a to d
    within each band, labels half positive: Mantel-Haenszel over two strata, some gaps clearly beyond 0.02, c vs d
    beyond it alone but not among the six."""
    rng = np.random.default_rng(7)
    parts = []
    for g, sizes, lift in zip(GROUPS, [(300, 100), (100, 300), (200, 200), (250, 150)], [0, 0.02, 0.08, 0.14],
                              strict=True):  # fmt: skip
        for band, n, base in zip(("x", "y"), sizes, (0.5, 0.2), strict=True):
            label = (rng.random(n) < 0.5).astype(int)
            parts.append(pd.DataFrame({"g": g, "band": band, "label": label,
                                       "prediction": (rng.random(n) < base + lift + 0.2 * label).astype(int)}))
    return pd.concat(parts, ignore_index=True).sample(frac=1, random_state=1, ignore_index=True)


@pytest.mark.parametrize("multiplicity", ["holm", "none"])
def test_backtest_reports_the_conditional_comparisons_of_the_gate_and_the_daemon(
    tmp_path: Path, multiplicity: str
) -> None:
    """The same rows (with their stratum) through the gate, the daemon (/metrics) and backtest (its ``conditional``
    section and ``worst`` rows, as of the replay's end): in each window, every conditional comparison's value,
    interval and evidence under ``multiplicity:``, and each metric's worst comparison, are one number to 1e-9."""
    now = 1_800_000_000.0
    rows = _stratified_rows()
    settings: dict[str, Any] = {
        "protected_attributes": [{"name": "g", "groups": list(GROUPS)}], "strata": ["band"], "min_samples": 30,
        "multiplicity": multiplicity, "windows": ["10m", "1h"], "bucket": "10s", "allowed_lateness": "15m",
        "metrics": [{"name": name, "threshold": 0.02} for name in CONDITIONAL_NAMES],
    }  # fmt: skip
    events = [orjson.dumps({"model_id": "m1", "prediction_id": f"p{i}", "timestamp": now - 250 + 200 * i / len(rows),
                            "prediction": int(r.prediction), "label": int(r.label),
                            "attributes": {"g": r.g, "band": r.band}}) for i, r in enumerate(rows.itertuples())]
    (tmp_path / "events.jsonl").write_bytes(b"\n".join(events) + b"\n")
    daemon = Daemon(make_config(checkpoint={"path": str(tmp_path / "state")}, **settings),
                    registry=CollectorRegistry(), clock=lambda: now)  # fmt: skip
    daemon.ingest.handle("predictions", 0, [_Record(e, i) for i, e in enumerate(events)])
    daemon.computer.compute()
    page: dict[tuple[str, ...], Any] = {}  # (window, metric, dimension, what) of the comparisons and worst rows
    for s in (s for family in text_string_to_metric_families(daemon.metrics_page()) for s in family.samples):
        window, dimension = s.labels.get("window", ""), s.labels.get("dimension", "")
        if s.name == "model_comparison_evidence" and s.value == 1.0:
            page[window, s.labels["metric"], dimension, "evidence"] = s.labels["evidence"]
        elif s.name.startswith(("model_worst_comparison", "model_comparisons_judged")):
            page[window, s.labels["metric"], s.name] = (dimension, s.value)
        elif (name := s.name.removeprefix("model_").removesuffix("_lower").removesuffix("_upper")) in CONDITIONAL_NAMES:
            page[window, name, dimension, s.name.removeprefix(f"model_{name}")] = s.value
    gate = run_audit(make_config(**settings).model(), rows)
    report = backtest(make_config(**settings), [tmp_path / "events.jsonl"])

    replayed = report["conditional"]["comparisons"]
    assert report["conditional"]["as_of"] == iso(now - 250 + 200 * (len(rows) - 1) / len(rows))  # the last event
    assert len(replayed) == 2 * 3 * 6 and {c["status"] for c in replayed} == {"ok"}
    results = {(r["metric"], r["dimension"]): r for r in gate["results"]}
    for c in replayed:  # both windows hold every row: each equals the gate's
        r, key = results[c["metric"], c["dimension"]], (c["window"], c["metric"], c["dimension"])
        assert [c["value"], *c["ci_95"]] == pytest.approx([r["exact_value"], *r["ci_95"]], abs=1e-9), (c, r)
        assert [page[(*key, "")], page[(*key, "_lower")], page[(*key, "_upper")]] == pytest.approx(
            [c["value"], *c["ci_95"]], abs=1e-9)
        assert c["evidence"] == r["evidence"] == page[(*key, "evidence")], (c, r)
    evidence = {c["dimension"]: c["evidence"] for c in replayed if (c["window"], c["metric"]) == ("10m", CONDITIONAL)}
    assert evidence["c_vs_d"] == {"holm": "inconclusive", "none": "fail"}[multiplicity]  # beyond alone, not among 6
    assert evidence["a_vs_d"] == evidence["b_vs_d"] == "fail" and evidence["a_vs_b"] == "inconclusive"

    worst = [w for w in report["worst"] if w["metric"] in CONDITIONAL_NAMES]
    assert len(worst) == len(gate["worst"]) * 2 == 2 * 3
    gate_worst = {w["metric"]: w for w in gate["worst"]}
    for w in worst:
        theirs, key = gate_worst[w["metric"]], (w["window"], w["metric"])
        shown = [page[(*key, f"model_worst_comparison{s}")] for s in ("", "_lower", "_upper")]
        assert (w["dimension"], w["comparisons_judged"]) == (theirs["dimension"], theirs["comparisons_judged"]) == \
            (shown[0][0], page[(*key, "model_comparisons_judged")][1]), (w, theirs)  # fmt: skip
        assert [w["value"], *w["ci_simultaneous"]] == pytest.approx([theirs["value"], *theirs["ci_simultaneous"]],
                                                                    abs=1e-9) == [v for _, v in shown]  # fmt: skip
