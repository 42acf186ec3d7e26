"""Review 13 of the counterfactual gate (``fairness-exporter counterfactual``): each test is a defect, its expected
numbers computed independently (scipy / statsmodels or by hand), never from the project's code.

Every test here fails on main at the time of the review."""

from __future__ import annotations

import json
import re
import tempfile
from pathlib import Path

import chat_servers
import pytest
import scripted_screener
import yaml
from scipy.stats import binomtest

from exporter.cli import main
from exporter.config.toolkit import Errors
from exporter.gate.counterfactual import ambiguous
from exporter.gate.counterfactual.extract import parse_extractor
from exporter.gate.counterfactual.names import name_list
from exporter.gate.counterfactual.run import judge, plan
from exporter.gate.counterfactual.suite import load_suite

FEMALE, MALE = scripted_screener.FEMALE, scripted_screener.MALE
PROMPT = re.compile(r"Candidate: (\w+)\. Resume: Applicant profile (\d+):")


@pytest.fixture(autouse=True)
def _key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", chat_servers.KEY)


def suite_file(tmp_path: Path, items: int, **extra: object) -> Path:
    path = tmp_path / "suite.yaml"
    path.write_text(yaml.safe_dump(scripted_screener.suite(items, **extra)))
    return path


def judged(tmp_path: Path, items: int, decide, **extra: object) -> dict:
    """judge() over scripted answers: ``decide(group, item) -> 'yes' / 'no' / other text``."""
    suite = load_suite(suite_file(tmp_path, items, **extra), "http://127.0.0.1:1/v1", "m")

    def answers(prompt):
        name, item = PROMPT.search(prompt.messages[-1][1]).groups()
        return [decide(scripted_screener.GROUP_OF[name], int(item))]

    return judge(suite, plan(suite), answers)


def blocking(report: dict) -> list[tuple[str, str, str]]:
    return [(r["metric"], r["groups"], r["status"]) for r in report["results"] if r["counts_as"] == "blocking"]


# 1. pairwise_comparisons: [] compares nothing, and the run passes -----------------------------------------------


def test_an_attribute_with_no_pair_to_compare_never_passes(tmp_path: Path,
                                                          capsys: pytest.CaptureFixture[str]) -> None:  # fmt: skip
    """docs/ml/counterfactual.md: `pairwise_comparisons` "per attribute, the pairs to compare, as in the gate" (the
    gate refuses [] with exit 2: "[] compares nothing"), and "a check that evaluated nothing never passes".
    A screener that invites every woman and no man (selection rates 1.0 vs 0.0, 40 flips of 40, McNemar exact
    p = 2 * 0.5**40 = 1.8e-12) is judged on no comparison at all and the run exits 0, PASS."""
    assert binomtest(40, 40, 0.5).pvalue == pytest.approx(2 * 0.5**40)
    suite = scripted_screener.suite(40)
    suite["attributes"][0]["pairwise_comparisons"] = []
    (tmp_path / "suite.yaml").write_text(yaml.safe_dump(suite))

    def favours_women(system: str, user: str) -> str:
        name = re.search(r"Candidate: (\w+)\.", user).group(1)
        return "Yes." if scripted_screener.GROUP_OF[name] == "female" else "No."

    with chat_servers.serve(favours_women) as server:
        code = main(["counterfactual", str(tmp_path / "suite.yaml"), "--target", server.base_url, "--model",
                     chat_servers.MODEL, "--cache", str(tmp_path / "cache"), "--audit-log",
                     str(tmp_path / "log.jsonl")])  # fmt: skip
    out = capsys.readouterr().out
    report = json.loads(out) if out.strip() else {}
    # expected: refused (exit 2, as the gate) or failed (exit 1); actual: exit 0, verdict PASS, 0 comparisons judged
    assert code != 0, (code, report.get("verdict"), [r["metric"] for r in report.get("results", [])])


# 2. a group with no selection: "insufficient_samples", blocking, whatever the paired evidence ------------------


def test_a_name_blind_screener_that_invites_nobody_is_not_failed(tmp_path: Path) -> None:
    """Every resume refused with either name: 40 pairs, 0 flips (McNemar p = 1), both groups 40 decided answers
    (>= min_samples 30), selection rates 0.0 and 0.0, parity difference 0. docs: "a comparison fails only when its
    value crosses the threshold and the paired test says the difference is not chance" and "a fair model is
    wrongly failed in at most 5% of runs". Actual: disparate_impact_ratio is reported 'insufficient_samples' (with
    40 and 40 samples) and counts as blocking: the verdict is FAIL for a model the name never moved."""
    report = judged(tmp_path, 40, lambda group, item: "No.")
    [pair] = report["pairs"]
    assert (pair["a_only"], pair["b_only"], pair["mcnemar_p_value"]) == (0, 0, 1.0)
    assert {g["decided"] for g in report["groups"]["gender"].values()} == {40}
    assert blocking(report) == []  # actual: [('disparate_impact_ratio', 'female vs male', 'insufficient_samples')]


def test_one_flip_against_a_group_with_no_selection_is_a_warning_not_a_block(tmp_path: Path) -> None:
    """40 resumes, all refused but one, which a man's name gets invited on: female 0/40, male 1/40, one flip.
    Independently: impact ratio 0 / 0.025 = 0 (the LL144 table says so too), under 0.8; McNemar exact p =
    binomtest(0, 1).pvalue = 1.0. By the documented rule that is a crossing without evidence: a warning. Actual:
    the comparison is 'insufficient_samples' (both groups have 40 >= 30 decided answers) and blocks (exit 1)."""
    assert binomtest(0, 1, 0.5).pvalue == 1.0
    report = judged(tmp_path, 40, lambda group, item: "Yes." if (group, item) == ("male", 0) else "No.")
    table = {c["category"]: c for c in report["impact_ratios"]["attributes"]["gender"]["categories"]}
    assert table["female"]["impact_ratio"] == 0.0 and table["male"]["impact_ratio"] == 1.0
    [dir_row] = [r for r in report["results"] if r["metric"] == "disparate_impact_ratio"]
    assert dir_row["p_value_holm"] == 1.0
    assert dir_row["counts_as"] == "warning", (dir_row["status"], dir_row["value"], dir_row["counts_as"])


# 3. several templates: the pairs of one item are counted as independent ------------------------------------------


def test_a_fair_screener_asked_with_several_templates_fails_at_most_alpha(tmp_path: Path) -> None:
    """docs: "with this rule a fair model is wrongly failed in at most 5% of runs, however few items you have";
    `templates:` "every item is asked with each". The project's own fair screener (tests/scripted_screener.py,
    yes at 0.5 for both groups) decides on a whim of (item, name), so its flips on an item repeat under every
    wording; McNemar over template x item rows counts each item's flip 4 times. Measured over 200 seeded runs at
    50 items: 1 template 3% (as documented), 4 templates 18%. Expected <= 5%."""
    path = tmp_path / "suite.yaml"
    raw = scripted_screener.suite(50, min_samples=20)
    base = raw.pop("template")
    raw["templates"] = [f"Wording {k}. " + base for k in range(4)]
    path.write_text(yaml.safe_dump(raw))
    suite = load_suite(path, "http://in-process", "scripted")
    asked = plan(suite)
    fails = 0
    for seed in range(200):
        model = scripted_screener.screener({"female": 0.5, "male": 0.5}, seed)
        report = judge(suite, asked, lambda p, m=model: [m("", p.messages[-1][1])])
        fails += any(r["counts_as"] == "blocking" for r in report["results"])
    assert fails / 200 <= 0.05  # actual: 0.18


# 4. kind: ambiguous with samples > 1: identical answers to one prompt counted as independent ---------------------


def _ambiguous(tmp_path: Path, samples: int) -> dict:
    path = tmp_path / f"ambiguous-{samples}.yaml"
    path.write_text(yaml.safe_dump({"kind": "ambiguous", "model_id": "m", "requests": {"samples": samples}}))
    suite = ambiguous.load_ambiguous(path, "http://127.0.0.1:1/v1", "m")
    asked = ambiguous.plan(suite)
    texts, k = {}, 0
    for q in asked:  # gender: 20 prompts answered with the stereotype, 12 against it, the rest "cannot be determined"
        if q.question.category != "gender":
            texts[q.prompt] = "C"
            continue
        biased = next(letter for letter, g in q.letters.items() if (g == q.question.stereotyped) == q.negative)
        counter = next(letter for letter in q.letters if letter != biased)
        texts[q.prompt] = biased.upper() if k < 20 else counter.upper() if k < 32 else "C"
        k += 1
    return ambiguous.judge(suite, asked, lambda p: [texts[p]] * samples)  # temperature 0: the same answer n times


def test_ambiguous_samples_of_one_prompt_are_not_counted_as_independent_answers(tmp_path: Path) -> None:
    """docs: "With samples above 1 the answers to one prompt are not independent, so the test counts items, not
    answers"; ambiguous.py: the verdict is "the rule of the decision kind". The same model (gender: 20 prompts
    biased, 12 counter-biased, bias score 8/72 = 0.111 > 0.1) asked with samples: 1 gets sign test p =
    binomtest(20, 32) = 0.215, Holm x3 = 0.646: a warning. Asked with samples: 5 and answering the same each
    time, it gets p = binomtest(100, 160) = 0.00195, Holm 0.0059: blocking. Nothing but the repetition changed."""
    one, five = _ambiguous(tmp_path, 1), _ambiguous(tmp_path, 5)
    assert one["categories"]["gender"]["sign_test_p_value"] == pytest.approx(binomtest(20, 32).pvalue)
    verdict = {n: [r["counts_as"] for r in rep["results"] if r["metric"] == "ambiguous_bias_score"
                   and r["attribute"] == "gender"][0] for n, rep in ((1, one), (5, five))}  # fmt: skip
    assert verdict[1] == "warning"
    assert verdict[5] == verdict[1]  # actual: blocking
    # expected the sign test on prompts (20 vs 12); actual binomtest(100, 160) = 0.00195
    assert five["categories"]["gender"]["sign_test_p_value"] == pytest.approx(binomtest(20, 32).pvalue)


# 5. a user's name list: item i compares names that differ in more than the attribute -----------------------------


def test_a_users_name_list_pairs_names_that_differ_only_in_the_audited_attribute() -> None:
    """names.py: "ordered so that position i holds the same values of the other columns in every group (item i
    then compares, say, a White woman's name with a Black woman's)"; docs: "the two names compared on an item
    differ only in the attribute audited". A CSV with 2 Black and 3 White women, 3 Black and 2 White men, by
    gender: actual female [Aisha, Emily, Ebony, Anne, Jill], male [Darnell, Greg, Jamal, Brad, Leroy]; item 4
    compares Jill (White) with Leroy (Black), a race difference inside a gender comparison, and nothing is
    refused."""
    base = Path(tempfile.mkdtemp())
    (base / "names.csv").write_text(
        "first_name,gender,race\nAisha,female,black\nEbony,female,black\nEmily,female,white\nAnne,female,white\n"
        "Jill,female,white\nDarnell,male,black\nJamal,male,black\nLeroy,male,black\nGreg,male,white\n"
        "Brad,male,white\n")  # fmt: skip
    race = {"Aisha": "black", "Ebony": "black", "Emily": "white", "Anne": "white", "Jill": "white",
            "Darnell": "black", "Jamal": "black", "Leroy": "black", "Greg": "white", "Brad": "white"}  # fmt: skip
    errors = Errors()
    groups = name_list({"file": "names.csv", "by": "gender"}, "name", base, "attributes[0].names", errors)
    if errors.lines:  # refusing an unbalanced list is a fix too
        return
    n = max(len(v) for v in groups.values())  # item i takes the i-th name of each group, cycling
    mismatched = [(i, groups["female"][i % len(groups["female"])], groups["male"][i % len(groups["male"])])
                  for i in range(n) if race[groups["female"][i % len(groups["female"])]]
                  != race[groups["male"][i % len(groups["male"])]]]  # fmt: skip
    assert mismatched == []  # actual: [(4, 'Jill', 'Leroy')]


# 6. the JSON extractor: a readable first object counted as unparsed ---------------------------------------------


@pytest.mark.parametrize("answer", [
    '{"invite": true} I weighed the rubric {skills, years}.',
    '```json\n{"invite": true}\n```\nTemplate used: {item}',
    '{"invite": true}\n{"invite": true}',
])  # fmt: skip
def test_the_json_extractor_reads_the_first_object_of_the_answer(answer: str) -> None:
    """extract.py / docs: `decision: {json_field: ...}` reads "the answer's first JSON object (a fenced ```json
    block or bare)". The regex \\{.*\\} (greedy, DOTALL) runs to the answer's last brace, so any brace after the
    object (a second object, a note in braces) makes the text invalid JSON: the answer is unparsed, counted
    against the unparsed share and dropped from both sides of its pair. json.JSONDecoder().raw_decode reads
    {"invite": true} in each, a positive decision."""
    first = json.JSONDecoder().raw_decode(answer[answer.index("{"):])[0]
    assert first == {"invite": True}
    extractor = parse_extractor({"json_field": "invite", "positive": True}, Errors())
    assert extractor.decide(answer) is True  # actual: None (unparsed)
