"""``min_samples`` of the counterfactual gate counts the units its kind's test counts (docs/ml/counterfactual.md):
items decided for both groups of a pair in the decision kind (the paired test's units), prompts with an answer read
in ``kind: ambiguous`` (the sign test's and the interval's). Before, it counted answers, so ``samples: 3`` (or three
templates) tripled what 20 items had evaluated and passed a floor of 21 they do not reach. Scripted models behind
loopback OpenAI-compatible servers (tests/chat_servers.py), as in tests/test_counterfactual.py; each run checks
both edges of the floor: met at exactly the units asked, missed one above."""

from __future__ import annotations

import math
from pathlib import Path

import chat_servers
import numpy as np
import pytest
import scripted_screener
import yaml
from test_counterfactual import FAIR, SHIPPED_QUESTIONS, careful, counterfactual

from exporter.gate.counterfactual import paired


@pytest.fixture(autouse=True)
def _key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", chat_servers.KEY)


def comparisons(report: dict) -> list[dict]:
    return [r for r in report["results"] if r["metric"] in ("disparate_impact_ratio", "demographic_parity_difference")]


@pytest.mark.parametrize(("samples", "templates"), [(3, 1), (1, 3)])
def test_decision_min_samples_counts_items_not_the_answers_of_their_samples_or_templates(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], samples: int, templates: int) -> None:  # fmt: skip
    """20 items, 3 answers each per group (3 samples of one prompt, or one answer to each of 3 templates): 60
    answers per group, 20 paired items. min_samples 20 is met and the fair screener's comparisons have values;
    at 21 they are insufficient and block (exit 1), their support 20 items. Before: 60 answers >= 21, judged, and
    the run passed (exit 0) on 20 items."""
    items = 20
    raw = scripted_screener.suite(items, requests={"samples": samples})
    if templates > 1:
        raw["templates"] = [f"Wording {k}. " + raw["template"] for k in range(templates)]
        del raw["template"]
    with chat_servers.serve(scripted_screener.screener(FAIR)) as server:
        runs = {}
        for floor in (items, items + 1):
            raw["min_samples"] = floor
            (tmp_path / "suite.yaml").write_text(yaml.safe_dump(raw))
            runs[floor] = counterfactual(capsys, tmp_path, tmp_path / "suite.yaml", server)
    code, missed, err = runs[items + 1]
    assert (code, missed["verdict"]) == (1, "FAIL")  # before: (0, "PASS"), support 60
    assert {(r["status"], r["counts_as"], r["support"], r["support_counts"]) for r in comparisons(missed)} == {
        ("insufficient_samples", "blocking", items, "items decided for both groups")}  # fmt: skip
    assert "insufficient samples: 20 items decided for both groups, below min_samples 21" in err
    met = runs[items][1]
    assert {g["asked"] for g in met["groups"]["gender"].values()} == {items * 3}  # answers per group
    assert (met["pairs"][0]["paired_items"], met["min_samples_counts"]) == (items, "items decided for both groups")
    assert {(r["status"] != "insufficient_samples", r["value"] is not None, r["support"]) for r in comparisons(met)} \
        == {(True, True, items)}  # fmt: skip
    assert missed["impact_ratios"]["attributes"] == met["impact_ratios"]["attributes"]  # LL144: the floor plays no part


def test_ambiguous_min_samples_counts_prompts_not_their_samples(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:  # fmt: skip
    """The shipped questions: per category 3 questions x 6 value pairs x 2 orders x 2 forms = 72 prompts, asked
    with samples: 5 (360 answers). An answerer that always says "cannot be determined" passes at min_samples 72;
    at 73 every category is insufficient and blocks, its support 72 prompts. Before: 360 answers >= 73, PASS."""
    prompts = {c: len(b["questions"]) * max(map(len, b["groups"].values())) * 2 * 2
               for c, b in SHIPPED_QUESTIONS["categories"].items()}  # fmt: skip
    assert set(prompts.values()) == {72}
    with chat_servers.serve(careful) as server:
        runs = {}
        for floor in (72, 73):
            path = tmp_path / "ambiguous.yaml"
            path.write_text(yaml.safe_dump({"kind": "ambiguous", "model_id": "assistant-llm", "min_samples": floor,
                                            "requests": {"samples": 5}}))  # fmt: skip
            runs[floor] = counterfactual(capsys, tmp_path, path, server)
    code, missed, err = runs[73]
    assert (code, missed["verdict"]) == (1, "FAIL")  # before: (0, "PASS"), support 360
    scores = [r for r in missed["results"] if r["metric"] == "ambiguous_bias_score"]
    assert [(r["attribute"], r["status"], r["counts_as"], r["support"]) for r in scores] == [
        (c, "insufficient_samples", "blocking", 72) for c in ("gender", "age", "race")]  # fmt: skip
    assert {r["support_counts"] for r in scores} == {"prompts with an answer read"}
    assert "insufficient samples: 72 prompts with an answer read, below min_samples 73" in err
    code, met, _ = runs[72]
    assert (code, met["verdict"], met["min_samples_counts"]) == (0, "PASS", "prompts with an answer read")
    assert {(c["answered"], c["prompts_answered"]) for c in met["categories"].values()} == {(360, 72)}


def test_an_item_counts_when_one_of_its_pairs_is_decided_for_both_groups() -> None:
    """4 items x 2 samples. Item 0: both samples decided for both groups; item 1: a decided on sample 0 only, b on
    sample 1 only (each group has a decided answer, but no pair the test can use); item 2: one pair decided; item 3:
    nothing read. The paired test has items 0 and 2: 2 items, what min_samples counts."""
    y, n, u = paired.POSITIVE, paired.NEGATIVE, paired.UNPARSED
    a = np.array([[[y, n]], [[y, u]], [[u, y]], [[u, u]]], dtype=np.int8)
    b = np.array([[[n, n]], [[u, n]], [[u, n]], [[u, u]]], dtype=np.int8)
    assert paired.compare(a, b).paired_items == 2


def test_simultaneous_intervals_are_at_the_k_judged_in_items_not_in_answers() -> None:
    """Three groups, 40 items, one answer each: x unread on items 0-4, z on items 5-9, y read on all. In answers
    every pair has 35 (min of the groups' decided answers): at min_samples 33 all 3 are judged, K = 3. In items
    decided for both, x vs z has 30: K = 2, so x vs y's simultaneous interval is at 95%/2, here statsmodels' score
    interval of the ratio at alpha 0.05/2 (z = 2.241), not at 0.05/3 (z = 2.394) as before the support was
    replaced; the difference's Newcombe interval (continuity-corrected in a union) at the same z."""
    from statistics import NormalDist

    from statsmodels.stats.proportion import confint_proportions_2indep

    from exporter.core.attributes import Attribute
    from exporter.core.evaluate import evaluate_many
    from exporter.core.fairness import newcombe_interval
    from exporter.gate.counterfactual.run import _judged

    groups = ("x", "y", "z")
    decided, positive = np.array([35, 40, 35]), np.array([10, 30, 20])
    counts = np.zeros((3, 6), dtype=np.int64)
    counts[:, 0], counts[:, 1] = positive, decided - positive
    core = Attribute("gender", ("gender",), groups, ((0, 1), (0, 2), (1, 2)))
    ev, ci = evaluate_many([(core, counts), (core, counts)], 33)
    judged = _judged(ev, ci, [35, 30, 35])
    ratio, gap = "disparate_impact_ratio", "demographic_parity_difference"
    assert ci.sufficient(ratio).tolist() == [True, True, True]
    assert judged.sufficient(ratio).tolist() == [True, False, True]

    def z(k: int) -> float:
        return NormalDist().inv_cdf(1 - 0.05 / (2 * k))

    def ratio_at(k: int) -> list[float]:  # x vs y, the lower rate (x: 10/35) first
        lo, hi = confint_proportions_2indep(10, 35, 30, 40, method="score", compare="ratio", alpha=0.05 / k)
        return [lo, min(hi, 1.0)]

    def gap_at(k: int) -> list[float]:  # |x - y|: x - y < 0 throughout
        lo, hi = newcombe_interval(np.array([10]), np.array([35]), np.array([30]), np.array([40]), z(k), True)
        return [-hi[0], -lo[0]]

    assert (round(z(2), 3), round(z(3), 3)) == (2.241, 2.394)
    for name, at in ((ratio, ratio_at), (gap, gap_at)):
        before = ci.simultaneous.metrics[name]
        np.testing.assert_allclose([before.lower[0], before.upper[0]], at(3), rtol=1e-7)  # in answers: K = 3
        after = judged.simultaneous.metrics[name]
        np.testing.assert_allclose([after.lower[0], after.upper[0]], at(2), rtol=1e-7)  # before the fix: at(3)
    # the worst comparison's interval is the max over the K judged at 95%/K: computed again, not the answers' one
    assert [row["comparisons_judged"] for row in judged.worst_rows([ratio, gap])] == [2, 2]


def _judged_in_process(tmp_path: Path, items: int, samples: int) -> dict:
    """The fair screener's report over ``items`` items asked with ``samples`` answers per prompt (all alike: the
    screener judges the item), judged in process."""
    from exporter.gate.counterfactual.run import judge, plan
    from exporter.gate.counterfactual.suite import load_suite

    path = tmp_path / f"suite{items}.yaml"
    path.write_text(yaml.safe_dump(scripted_screener.suite(items, min_samples=20, requests={"samples": samples})))
    suite = load_suite(path, "http://in-process", "scripted")
    model = scripted_screener.screener(FAIR)
    return judge(suite, plan(suite), lambda p: [model("", p.messages[-1][1])] * samples)


def test_samples_to_decide_counts_items_decided_for_both_groups_as_min_samples_does(tmp_path: Path) -> None:
    """50 items asked with 3 answers each per group (150 answers, all alike: the screener judges the item): the
    impact ratio 0.96 against 0.8 is inconclusive, its half-width 0.182 for a gap of 0.16. The hint scales the 50
    items the paired test and min_samples count: 65 items (ceil(50 x (0.182 / 0.16)^2)), named as items decided
    for both groups in the report and in the CI report, and about what one answer per item asks (64): three alike
    answers of an item are worth one. Before: 194, the 150 answers scaled, three times the one-answer run's 64,
    beside a support of 50 items."""
    from exporter.gate.counterfactual import render

    report, once = _judged_in_process(tmp_path, 50, 3), _judged_in_process(tmp_path, 50, 1)
    ratio, alone = (next(r for r in x["results"] if r["metric"] == "disparate_impact_ratio") for x in (report, once))
    assert (ratio["exact_value"], ratio["evidence"], ratio["support"], ratio["samples"]) == (
        0.96, "inconclusive", 50, {"female": 150, "male": 150})  # fmt: skip
    factor = (ratio["half_width"] / abs(ratio["exact_value"] - ratio["threshold"])) ** 2
    assert ratio["samples_to_decide"] == {"female": math.ceil(50 * factor), "male": math.ceil(50 * factor)} == {
        "female": 65, "male": 65}  # before: {"female": 194, "male": 194}, answers at 3 an item
    assert ratio["samples_to_decide_counts"] == ratio["support_counts"] == "items decided for both groups"
    assert alone["samples_to_decide"] == {"female": 64, "male": 64}  # one answer an item: items are answers
    ci = render.ci_report({"model_id": "screener", "verdict": "PASS", "min_samples": 20,
                           "results": report["results"]})  # fmt: skip
    [check] = [c for c in ci.checks if c.name == "disparate_impact_ratio female vs male"]
    assert "evidence inconclusive (decided at about 65 items decided for both groups)" in check.message
