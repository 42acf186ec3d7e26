"""The conditional metrics (``strata:``) compare the groups within known strata only: a row without a stratum value
(missing, or its combination past ``segment_values``) has no stratum, and is left out and counted, never pooled into
one pseudo-stratum ``other`` (found by review 19: that pooled stratum carried the raw gap into the Mantel-Haenszel
difference and the CDD, 0.080 (fail) where the gap within the bands is 0, and the daemon exported the raw gap as the
conditional one when no event carried the strata). The gate, the daemon and ``backtest`` leave out the same rows and
compute the same number; the gate's result and ``backtest``'s section say how many rows were left out and why. Oracle:
the MH risk difference over the rows whose stratum is known, computed here with pandas."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import orjson
import pandas as pd
import pytest
import yaml
from daemon_config import make_config
from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families

from exporter.backtest.replay import backtest
from exporter.daemon import Daemon
from exporter.gate.fairness.audit import run_audit

CDPD = "conditional_demographic_parity_difference"
T0 = 1_800_000_000.0


def _simpson(n: int, missing: float, seed: int) -> pd.DataFrame:
    """Both genders approved at 0.6 in the high band and 0.2 in the low one; half the men and a quarter of the women
    in the high band (raw gap 0.10, conditional gap 0); a share ``missing`` of the rows, drawn at random, has no
    band recorded."""
    parts = []
    for group, high in (("female", 0.25), ("male", 0.5)):
        for band, share, rate in (("high", high, 0.6), ("low", 1 - high, 0.2)):
            m = int(n * share)
            k = round(m * rate)
            parts.append(pd.DataFrame({"gender": group, "age": "young", "income_band": band,
                                       "prediction": [1] * k + [0] * (m - k)}))  # fmt: skip
    frame = pd.concat(parts, ignore_index=True).sample(frac=1.0, random_state=seed).reset_index(drop=True)
    frame["income_band"] = frame["income_band"].astype(object)
    frame.loc[np.random.default_rng(seed).random(len(frame)) < missing, "income_band"] = None
    return frame


def _mh_oracle(frame: pd.DataFrame, strata: list[str], a: str, b: str) -> float:
    """The MH risk difference of a - b over the rows whose strata are all known (pandas)."""
    known = frame.dropna(subset=strata)
    num = den = 0.0
    for _, s in known.groupby(strata):
        x1, n1 = s.loc[s.gender == a, "prediction"].sum(), (s.gender == a).sum()
        x0, n0 = s.loc[s.gender == b, "prediction"].sum(), (s.gender == b).sum()
        if n1 and n0:
            t = n1 + n0
            num += (x1 * n0 - x0 * n1) / t
            den += n1 * n0 / t
    return num / den


def _config(tmp_path: Path, strata: list[str], **extra: object) -> Path:
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump({
        "model_id": "credit", "protected_attributes": [{"name": "gender", "groups": ["male", "female"]}],
        "strata": strata, "decision": "evidence", **extra,
        "metrics": [{"name": "demographic_parity_difference", "threshold": 0.05}, {"name": CDPD, "threshold": 0.05}]}))
    return path


def test_rows_without_a_stratum_value_do_not_bias_the_gates_conditional_gap(tmp_path: Path) -> None:
    frame = _simpson(40_000, missing=0.8, seed=1)
    want = _mh_oracle(frame, ["income_band"], "male", "female")
    assert abs(want) < 0.01  # within each band, no gap (but for the random rows that lost their band)
    result = next(r for r in run_audit(_config(tmp_path, ["income_band"]), frame)["results"] if r["metric"] == CDPD)
    # before: 0.080 [0.074, 0.087], evidence "fail" (oracle 0.004): the pooled "other" rows carried the raw gap
    assert result["exact_value"] == pytest.approx(abs(want), abs=0.01), result
    assert result["evidence"] != "fail"
    missing = int(frame["income_band"].isna().sum())
    assert {k: v for k, v in result["strata"].items() if k.startswith("rows_")} == {
        "rows_excluded": missing, "rows_excluded_missing_value": missing, "rows_excluded_beyond_cap": 0}


def test_strata_past_the_cap_are_not_pooled_into_one_stratum(tmp_path: Path) -> None:
    """Three regions x two bands make six strata; with segment_values: 4 the last two seen (region c's bands) are past
    the cap: left out, not pooled into one stratum where the bands' Simpson gap reappears."""
    frames = []
    for k, region in enumerate("abc"):
        f = _simpson(20_000, missing=0.0, seed=10 + k).assign(region=region)
        frames.append(f)
    frame = pd.concat(frames, ignore_index=True)
    want = _mh_oracle(frame, ["region", "income_band"], "male", "female")
    assert want == pytest.approx(0.0, abs=1e-12)
    report = run_audit(_config(tmp_path, ["region", "income_band"], segment_values=4), frame)
    result = next(r for r in report["results"] if r["metric"] == CDPD)
    assert (result["strata"]["rows_excluded_beyond_cap"], result["strata"]["rows_excluded_missing_value"]) == \
        (40_000, 0)  # fmt: skip
    # before: pooled into the value, 0.035 [0.030, 0.040] (a third of the rows carried the raw 0.10 gap)
    assert result["exact_value"] == pytest.approx(abs(want), abs=0.01), result
    assert result["strata"]["used"] == 4


def test_no_row_in_a_known_stratum_leaves_the_gates_comparison_insufficient(tmp_path: Path) -> None:
    """Not one row with a band: no stratum to compare within, so no value (never a pass, never the raw gap)."""
    frame = _simpson(4_000, missing=1.0, seed=2)
    for name in (CDPD, "conditional_demographic_disparity"):
        config = _config(tmp_path, ["income_band"])
        raw = yaml.safe_load(config.read_text())
        config.write_text(yaml.safe_dump({**raw, "metrics": [{"name": name, "threshold": 0.05}]}))
        (result,) = run_audit(config, frame)["results"]
        assert (result["status"], result["evidence"], result["exact_value"]) == \
            ("insufficient_samples", "inconclusive", None), result  # fmt: skip
        assert (result["strata"]["used"], result["strata"]["rows_excluded_missing_value"]) == (0, len(frame))


@dataclass
class _Record:
    value: bytes
    offset: int


def test_the_daemon_does_not_export_a_conditional_gap_conditioned_on_nothing() -> None:
    """Events whose attributes carry no income_band at all (the producer never sends it): the daemon exports the raw
    gap as the conditional one, 'conditioned' on a single pseudo-stratum, with nothing on /metrics saying so."""
    frame = _simpson(2_000, missing=1.0, seed=3)
    settings = {"strata": ["income_band"], "windows": ["10m"], "bucket": "10s", "allowed_lateness": "15m",
                "metrics": [{"name": "demographic_parity_difference", "threshold": 0.05},
                            {"name": CDPD, "threshold": 0.05}]}  # fmt: skip
    daemon = Daemon(make_config(**settings), registry=CollectorRegistry(), clock=lambda: T0)
    events = [orjson.dumps({"model_id": "m1", "prediction_id": f"p{i}", "timestamp": T0 - 120,
                            "prediction": int(r.prediction), "label": None,
                            "attributes": {"gender": r.gender, "age": r.age}})
              for i, r in enumerate(frame.itertuples())]  # fmt: skip
    daemon.ingest.handle("predictions", 0, [_Record(e, i) for i, e in enumerate(events)])
    daemon.computer.compute()
    page = {(s.name, s.labels.get("metric", "")): s.value
            for family in text_string_to_metric_families(daemon.metrics_page()) for s in family.samples
            if s.labels.get("attribute") == "gender"}  # fmt: skip
    raw = page["model_demographic_parity_difference", ""]
    assert raw == pytest.approx(0.10)
    # before: model_conditional_demographic_parity_difference = 0.100, the raw gap, exported as conditional parity
    assert ("model_conditional_demographic_parity_difference", "") not in page
    assert page["model_comparison_insufficient_samples", CDPD] == 1.0


def _three_regions(missing: float) -> pd.DataFrame:
    """Simpson's rows in regions a, b and c (in that order, so that with ``segment_values: 4`` region c's two bands
    come past the cap), a share ``missing`` of them without a band."""
    return pd.concat([_simpson(4_000, missing=missing, seed=20 + k).assign(region=region)
                      for k, region in enumerate("abc")], ignore_index=True)  # fmt: skip


def _events(frame: pd.DataFrame) -> list[bytes]:
    """The rows as the daemon's JSON events, a row without a band sent without the field."""
    return [orjson.dumps({"model_id": "m1", "prediction_id": f"p{i}", "timestamp": T0 - 120,
                          "prediction": int(r.prediction), "label": None,
                          "attributes": {"gender": r.gender, "age": r.age, "region": r.region,
                                         **({} if r.income_band is None else {"income_band": r.income_band})}})
            for i, r in enumerate(frame.itertuples())]  # fmt: skip


def _computed(settings: dict, events: list[bytes]) -> Daemon:
    """A daemon of these settings that read the events and computed once."""
    daemon = Daemon(make_config(**settings), registry=CollectorRegistry(), clock=lambda: T0)
    daemon.ingest.handle("predictions", 0, [_Record(e, i) for i, e in enumerate(events)])
    daemon.computer.compute()
    return daemon


def test_the_gate_the_daemon_and_backtest_leave_out_the_same_rows(tmp_path: Path) -> None:
    """The same rows, some without a band and a third past the cap, through the gate, the daemon (/metrics) and
    backtest (its ``conditional`` section): each conditional comparison is the oracle's over the known strata, one
    number to 1e-9 on the three paths, and the gate and backtest count the same rows left out, and why."""
    frame = _three_regions(missing=0.2)
    known = frame[frame.region != "c"]
    names = (CDPD, "conditional_demographic_disparity")
    settings = {"strata": ["region", "income_band"], "segment_values": 4, "windows": ["10m"], "bucket": "10s",
                "allowed_lateness": "15m", "metrics": [{"name": n, "threshold": 0.05} for n in names]}  # fmt: skip
    events = _events(frame)
    daemon = _computed(settings, events)
    page = {s.name: s.value for family in text_string_to_metric_families(daemon.metrics_page())
            for s in family.samples if s.labels.get("attribute") == "gender"}  # fmt: skip
    (tmp_path / "events.jsonl").write_bytes(b"\n".join(events) + b"\n")
    replayed = backtest(make_config(**settings), [tmp_path / "events.jsonl"])["conditional"]
    gate = run_audit(make_config(**settings).model(), frame.assign(label=None))
    results = {r["metric"]: r for r in gate["results"] if r["attribute"] == "gender"}
    for name in names:
        r = results[name]
        (c,) = [c for c in replayed["comparisons"] if c["metric"] == name and c["attribute"] == "gender"]
        assert [c["value"], *c["ci_95"]] == pytest.approx([r["exact_value"], *r["ci_95"]], abs=1e-9)
        assert [page[f"model_{name}"], page[f"model_{name}_lower"], page[f"model_{name}_upper"]] == \
            pytest.approx([r["exact_value"], *r["ci_95"]], abs=1e-9)  # fmt: skip
        assert r["strata"]["used"] == 4 and r["evidence"] == c["evidence"] == "pass"
    assert results[CDPD]["exact_value"] == pytest.approx(abs(_mh_oracle(known, ["region", "income_band"], "male",
                                                                         "female")), abs=1e-12)  # fmt: skip
    missing = int(frame.income_band.isna().sum())
    beyond = int(((frame.region == "c") & frame.income_band.notna()).sum())
    counted = {"rows_excluded": missing + beyond, "rows_excluded_missing_value": missing,
               "rows_excluded_beyond_cap": beyond}  # fmt: skip
    assert {k: v for k, v in results[CDPD]["strata"].items() if k.startswith("rows_")} == counted
    assert {k: v for k, v in replayed.items() if k.startswith("rows_")} == counted
    excluded = {s.labels["reason"]: s.value for family in text_string_to_metric_families(daemon.metrics_page())
                for s in family.samples if s.name == "model_conditional_excluded_samples"}  # fmt: skip
    assert excluded == {"missing_or_overflow": missing + beyond}  # both reasons met: the window cannot tell them apart


def test_the_daemon_exports_the_rows_its_conditional_metrics_leave_out() -> None:
    """Events without a stratum value are left out of the conditional metrics, and /metrics says how many, per
    window and reason: here only missing values, so the count is the missing rows, and none past the cap."""
    frame = _three_regions(missing=0.25)
    frame = frame[frame.region != "c"]  # two regions x two bands: four strata, within the cap
    settings = {"strata": ["region", "income_band"], "segment_values": 4, "windows": ["10m"], "bucket": "10s",
                "allowed_lateness": "15m", "metrics": [{"name": CDPD, "threshold": 0.05}]}  # fmt: skip
    events = _events(frame)
    daemon = _computed(settings, events)
    excluded = {(s.labels["window"], s.labels["reason"]): s.value
                for family in text_string_to_metric_families(daemon.metrics_page())
                for s in family.samples if s.name == "model_conditional_excluded_samples"}  # fmt: skip
    missing = int(frame.income_band.isna().sum())
    assert missing > 100
    assert excluded == {("10m", "missing"): missing, ("10m", "overflow"): 0}
    gate = run_audit(make_config(**settings).model(), frame.assign(label=None))
    (r,) = [r for r in gate["results"] if r["metric"] == CDPD and r["attribute"] == "gender"]
    assert r["strata"]["rows_excluded_missing_value"] == missing and r["strata"]["rows_excluded_beyond_cap"] == 0
