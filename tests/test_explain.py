"""Segment explanations of a gap's change (Kitagawa's symmetric decomposition): planted datasets put the change
where it was planted, the terms add up to the change, the intervals cover the planted terms at their nominal rate,
and the gate reports them (JSON, HTML, Markdown)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml

from exporter.cli import main
from exporter.core.attributes import Attribute
from exporter.core.explain import SegmentValues, decompose, explanations
from exporter.core.fairness import N_COUNTS, PRED_NEG, PRED_POS
from exporter.gate.fairness.audit import run_audit
from exporter.gate.reports import ci
from exporter.gate.reports.html import audit_html

GENDER = Attribute("gender", ("gender",), ("female", "male"), ((0, 1),))
CHANNELS = ("broker", "web", "branch")


def _config(tmp_path: Path, **extra: object) -> Path:
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump({
        "model_id": "credit", "protected_attributes": [{"name": "gender", "groups": ["female", "male"]}],
        "metrics": [{"name": "demographic_parity_difference", "threshold": 0.05},
                    {"name": "equal_opportunity_difference", "threshold": 0.05}],
        "segments": ["channel"], **extra}))  # fmt: skip
    return path


def _rows(rng: np.random.Generator, n: int, shares: dict[str, list[float]], rates: dict[str, list[float]]) -> \
        pd.DataFrame:  # fmt: skip
    """n rows per group, channel drawn by the group's shares, prediction by the group's rate in the channel; the
    label is the prediction flipped 10% of the time (so the TPR is defined)."""
    parts = []
    for group in ("female", "male"):
        channel = rng.choice(len(CHANNELS), size=n, p=shares[group])
        prediction = (rng.random(n) < np.asarray(rates[group])[channel]).astype(int)
        label = np.where(rng.random(n) < 0.1, 1 - prediction, prediction)
        parts.append(pd.DataFrame({"gender": group, "channel": np.asarray(CHANNELS)[channel],
                                   "prediction": prediction, "label": label}))  # fmt: skip
    return pd.concat(parts, ignore_index=True)


def _selection(report: dict) -> dict:
    return next(e for e in report["explanations"] if e["metric"] == "demographic_parity_difference")


def _term(explanation: dict, value: str, kind: str) -> float:
    return next(s[kind] for s in explanation["segments"] if s["value"] == value)


def test_a_planted_mix_shift_is_explained_by_the_mix_of_that_channel(tmp_path: Path) -> None:
    rng = np.random.default_rng(1)
    rates = {"female": [0.7, 0.4, 0.02], "male": [0.7, 0.4, 0.02]}  # the same rates for everyone, in both periods
    male = [0.3, 0.4, 0.3]
    before = _rows(rng, 200_000, {"female": [0.3, 0.4, 0.3], "male": male}, rates)
    after = _rows(rng, 200_000, {"female": [0.5, 0.4, 0.1], "male": male}, rates)  # women move branch -> broker
    e = _selection(run_audit(_config(tmp_path), after, baseline=before))
    assert e["change"] == pytest.approx(0.2 * 0.68, abs=0.01)
    assert _term(e, "broker", "mix") / e["change"] >= 0.9
    assert (e["segments"][0]["value"], abs(e["segments"][0]["mix"]) > abs(e["segments"][0]["rate"])) == ("broker", True)
    others = sum(abs(s["mix"]) + abs(s["rate"]) for s in e["segments"]) - abs(_term(e, "broker", "mix"))
    assert others <= 0.1 * abs(e["change"])
    assert "from the share of rows in channel=broker" in e["summary"]


def test_a_planted_rate_change_in_one_channel_is_explained_by_that_rate(tmp_path: Path) -> None:
    rng = np.random.default_rng(2)
    shares = {"female": [0.3, 0.4, 0.3], "male": [0.3, 0.4, 0.3]}
    before = _rows(rng, 200_000, shares, {"female": [0.4, 0.5, 0.3], "male": [0.4, 0.5, 0.3]})
    after = _rows(rng, 200_000, shares, {"female": [0.6, 0.5, 0.3], "male": [0.4, 0.5, 0.3]})  # women at the broker
    e = _selection(run_audit(_config(tmp_path), after, baseline=before))
    assert e["change"] == pytest.approx(0.3 * 0.2, abs=0.01)
    assert _term(e, "broker", "rate") / e["change"] >= 0.9
    others = sum(abs(s["mix"]) + abs(s["rate"]) for s in e["segments"]) - abs(_term(e, "broker", "rate"))
    assert others <= 0.1 * abs(e["change"])
    assert e["summary"].startswith("the selection rate gap female vs male rose by 0.06")
    assert "from female's selection rate within channel=broker" in e["summary"]


def _random_counts(rng: np.random.Generator, groups: int, values: int) -> np.ndarray:
    counts = rng.integers(0, 50, size=(groups, values, N_COUNTS))
    counts[rng.random((groups, values)) < 0.2] = 0  # empty cells, in one period or both
    counts[:, 0, PRED_POS] += 1  # every group has rows in each period
    return counts


def test_the_terms_add_up_to_the_change_exactly_with_empty_cells() -> None:
    rng = np.random.default_rng(3)
    for _ in range(200):
        base, cur = _random_counts(rng, 3, 7), _random_counts(rng, 3, 7)
        for rate in ("selection_rate", "accuracy"):
            d = decompose(base, cur, [2, 1], [0, 2], rate)
            for k in range(2):
                if np.isfinite(d.change[k]):
                    assert abs((d.mix[k] + d.rate[k]).sum() - d.change[k]) < 1e-12


def test_the_gap_is_the_cores_signed_difference_of_the_groups_rates() -> None:
    base = np.zeros((2, 2, N_COUNTS), np.int64)
    cur = np.zeros((2, 2, N_COUNTS), np.int64)
    base[:, :, PRED_POS], base[:, :, PRED_NEG] = [[3, 5], [2, 2]], [[7, 5], [8, 8]]
    cur[:, :, PRED_POS], cur[:, :, PRED_NEG] = [[6, 0], [2, 2]], [[4, 0], [8, 8]]  # group a's second cell empties
    d = decompose(base, cur, [0], [1], "selection_rate")
    assert (d.baseline[0], d.current[0]) == pytest.approx((8 / 20 - 4 / 20, 6 / 10 - 4 / 20))
    # the empty cell takes the baseline's rate 0.5: mix = (0 - 0.5) * 0.5 for a, 0 for b
    assert d.mix[0, 1] == pytest.approx(-0.25) and d.rate[0, 1] == 0.0


def test_the_intervals_cover_the_planted_terms_at_their_nominal_rate() -> None:
    """Counts drawn from known shares and rates: each term's 95% interval covers the term computed from the true
    parameters in 95% of draws (within simulation error, 4,000 draws)."""
    rng = np.random.default_rng(4)
    w0 = np.array([[0.3, 0.5, 0.2], [0.4, 0.4, 0.2]])
    w1 = np.array([[0.45, 0.35, 0.2], [0.4, 0.4, 0.2]])
    r0 = np.array([[0.4, 0.6, 0.2], [0.5, 0.5, 0.3]])
    r1 = np.array([[0.55, 0.6, 0.2], [0.5, 0.45, 0.3]])
    true_mix = ((w1 - w0) * (r1 + r0) / 2)
    true_rate = ((w1 + w0) / 2 * (r1 - r0))
    true_mix, true_rate = true_mix[0] - true_mix[1], true_rate[0] - true_rate[1]
    n, draws = 400, 4000
    covered_mix = np.zeros(3)
    covered_rate = np.zeros(3)
    for _ in range(draws):
        periods = []
        for w, r in ((w0, r0), (w1, r1)):
            counts = np.zeros((2, 3, N_COUNTS), np.int64)
            sizes = np.stack([rng.multinomial(n, w[g]) for g in range(2)])
            positives = rng.binomial(sizes, r)
            counts[:, :, PRED_POS], counts[:, :, PRED_NEG] = positives, sizes - positives
            periods.append(counts)
        d = decompose(periods[0], periods[1], [0], [1], "selection_rate")
        covered_mix += np.abs(d.mix[0] - true_mix) <= 1.959963984540054 * d.mix_se[0]
        covered_rate += np.abs(d.rate[0] - true_rate) <= 1.959963984540054 * d.rate_se[0]
    coverage = np.concatenate([covered_mix, covered_rate]) / draws
    # the third segment's rate term is 0 by construction (no change at all): its coverage is checked as the others
    assert coverage.min() >= 0.93 and coverage.max() <= 0.975, coverage


def test_values_past_the_cap_are_counted_as_other() -> None:
    table = SegmentValues(cap=2)
    assert [table.code(v) for v in ("a", 1.0, "a", "c", None)] == [(0, False), (1, False), (0, False), (2, True),
                                                                     (2, False)]  # fmt: skip
    assert table.names == ("a", "1", "other")


def test_the_gate_counts_overflowing_and_missing_segment_values(tmp_path: Path) -> None:
    rng = np.random.default_rng(5)
    shares = {"female": [0.3, 0.4, 0.3], "male": [0.3, 0.4, 0.3]}
    rates = {"female": [0.4, 0.5, 0.3], "male": [0.4, 0.5, 0.3]}
    before, after = _rows(rng, 500, shares, rates), _rows(rng, 500, shares, rates)
    after.loc[:9, "channel"] = None
    report = run_audit(_config(tmp_path, segment_values=2), after, baseline=before)
    counted = report["segment_values"]["current"]["channel"]
    assert counted["values"] == report["segment_values"]["baseline"]["channel"]["values"]
    assert counted["missing_rows"] == 10
    assert counted["overflow_rows"] == int((after["channel"] == _third(report)).sum())
    e = _selection(report)
    assert {s["value"] for s in e["segments"]} == {*counted["values"], "other"}
    assert abs(sum(s["mix"] + s["rate"] for s in e["segments"]) - e["change"]) < 1e-12


def _third(report: dict) -> str:
    kept = report["segment_values"]["current"]["channel"]["values"]
    return next(c for c in CHANNELS if c not in kept)


def test_every_difference_metric_and_rate_is_explained_and_ratios_are_not(tmp_path: Path) -> None:
    rng = np.random.default_rng(6)
    shares = {"female": [0.3, 0.4, 0.3], "male": [0.3, 0.4, 0.3]}
    rates = {"female": [0.4, 0.5, 0.3], "male": [0.4, 0.5, 0.3]}
    counts = np.zeros((2, 3, N_COUNTS), np.int64)
    counts[:, :, PRED_POS] = 5
    names = [(e["metric"], e["rate"]) for e in explanations(
        GENDER, ["disparate_impact_ratio", "equalised_odds_difference"], {"channel": (CHANNELS, counts, counts)})]
    assert names == [("equalised_odds_difference", "true_positive_rate"),
                     ("equalised_odds_difference", "false_positive_rate")]
    report = run_audit(_config(tmp_path), _rows(rng, 300, shares, rates), baseline=_rows(rng, 300, shares, rates))
    assert [e["metric"] for e in report["explanations"]] == ["demographic_parity_difference",
                                                             "equal_opportunity_difference"]
    assert set(report["explanations"][0]) == {"attribute", "metric", "rate", "comparison", "baseline_value",
                                              "current_value", "change", "summary", "segments", "missing_rows"}
    assert set(report["explanations"][0]["segments"][0]) == {"column", "value", "mix", "rate", "mix_ci_95",
                                                             "rate_ci_95"}


def test_the_html_and_markdown_reports_show_each_explanation(tmp_path: Path) -> None:
    rng = np.random.default_rng(7)
    shares = {"female": [0.3, 0.4, 0.3], "male": [0.3, 0.4, 0.3]}
    before = _rows(rng, 2000, shares, {"female": [0.4, 0.5, 0.3], "male": [0.4, 0.5, 0.3]})
    after = _rows(rng, 2000, shares, {"female": [0.7, 0.5, 0.3], "male": [0.4, 0.5, 0.3]})
    report = run_audit(_config(tmp_path), after, baseline=before)
    page = audit_html(report)
    assert "Why the gaps moved" in page and page.count("<svg") == 1 + len(report["explanations"])
    assert "channel=broker" in page
    text = ci.markdown(ci.from_audit(report))
    assert "### Why the gaps moved" in text and "| channel=broker |" in text
    assert _selection(report)["summary"] in text


def test_the_command_explains_a_change_from_a_baseline_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> \
        None:  # fmt: skip
    rng = np.random.default_rng(8)
    shares = {"female": [0.3, 0.4, 0.3], "male": [0.3, 0.4, 0.3]}
    rates = {"female": [0.4, 0.5, 0.3], "male": [0.4, 0.5, 0.3]}
    _rows(rng, 300, shares, rates).to_parquet(tmp_path / "before.parquet")
    _rows(rng, 300, shares, rates).to_csv(tmp_path / "after.csv", index=False)
    code = main(["audit", str(_config(tmp_path)), str(tmp_path / "after.csv"), "--baseline",
                 str(tmp_path / "before.parquet"), "--audit-log", str(tmp_path / "log.jsonl")])  # fmt: skip
    report = json.loads(capsys.readouterr().out)
    assert code == 0 and report["baseline"]["rows"] == 600 and len(report["explanations"]) == 2


def test_a_baseline_without_segments_is_refused_in_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> \
        None:  # fmt: skip
    config = tmp_path / "plain.yaml"
    config.write_text(yaml.safe_dump({"model_id": "m", "protected_attributes": [
        {"name": "gender", "groups": ["female", "male"]}]}))  # fmt: skip
    frame = pd.DataFrame({"gender": ["female", "male"] * 20, "prediction": [0, 1] * 20})
    frame.to_csv(tmp_path / "rows.csv", index=False)
    code = main(["audit", str(config), str(tmp_path / "rows.csv"), "--baseline", str(tmp_path / "rows.csv"),
                 "--audit-log", str(tmp_path / "log.jsonl")])  # fmt: skip
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and "segments" in err[-1]


def test_a_segment_column_missing_from_the_data_is_refused(tmp_path: Path) -> None:
    frame = pd.DataFrame({"gender": ["female", "male"] * 20, "prediction": [0, 1] * 20, "label": [0, 1] * 20})
    with pytest.raises(ValueError, match=r"missing column\(s\) \['channel'\] named by segments"):
        run_audit(_config(tmp_path), frame, baseline=frame)


SIDE = "attribute_sources: {applicants: {id: applicant_id, topic: applicant-demographics}}\n"
NOT_COUNTED = [
    ("  - {name: race, groups: [white, black], proxy: {method: bisg, surname: s, zcta: z}}\nsegments: [channel]\n",
     "  segments: not with attribute 'race': a proxy attribute has no group per row, and segments are counted per "
     "group"),
    ("  - {name: race, groups: [white, black], proxy: {method: bisg, surname: s, zcta: z}}\nstrata: [band]\n"
     "metrics: [{name: conditional_demographic_parity_difference, threshold: 0.05}]\n",
     "  strata: not with attribute 'race': a proxy attribute has no group per row, and strata are counted per group"),
    ("  - {name: gender, groups: [male, female], source: applicants}\nsegments: [channel]\n" + SIDE,
     "  segments: not with attribute 'gender': its group is joined by id, and segments are counted per group"),
]  # fmt: skip


@pytest.mark.parametrize(("attributes", "line"), NOT_COUNTED)
@pytest.mark.parametrize("command", ["audit", "serve"])
def test_segments_and_strata_are_refused_with_a_proxy_or_joined_attribute_in_one_line(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], attributes: str, line: str,
        command: str) -> None:  # fmt: skip
    """Segments and strata are counted per group of every attribute: a BISG proxy (a posterior per row) and an
    attribute joined by id (its group known after the join) have none there, so the gate and the daemon refuse the
    config in one line naming the field rather than count them under no group."""
    config = tmp_path / "c.yaml"
    config.write_text("model_id: m\nkafka: {bootstrap_servers: '127.0.0.1:1'}\nprotected_attributes:\n" + attributes)
    (tmp_path / "p.csv").write_text("s,z,gender,channel,band,prediction\nSmith,60601,male,web,a,1\n")
    argv = ["audit", str(config), str(tmp_path / "p.csv")] if command == "audit" else ["serve", "--config",
                                                                                        str(config)]  # fmt: skip
    assert main(argv) == 2
    assert capsys.readouterr().err.strip().splitlines()[1:] == [line]
