"""Behaviours of the counterfactual gate (``fairness-exporter counterfactual``) found wrong by a review (review13),
each test's expected numbers computed independently (scipy or by hand), never from the project's code. Every test
here failed before the fixes; each docstring says what happened then."""

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
from exporter.config import ConfigError
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


# 1. pairwise_comparisons: [] is refused, as in the gate ----------------------------------------------------------


def test_an_attribute_with_no_pair_to_compare_never_passes(tmp_path: Path,
                                                          capsys: pytest.CaptureFixture[str]) -> None:  # fmt: skip
    """`pairwise_comparisons: []` is refused with exit 2 naming the key, as the gate refuses it ("[] compares
    nothing"): a check that evaluated nothing never passes. Before, a screener that invites every woman and no man
    (selection rates 1.0 vs 0.0, 40 flips of 40, McNemar exact p = 2 * 0.5**40 = 1.8e-12) was judged on no
    comparison at all and the run exited 0, PASS."""
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
    out, err = capsys.readouterr()
    assert (code, out) == (2, "")  # before: exit 0, verdict PASS, 0 comparisons judged
    assert err.count("\n") == 1 and "attributes[0].pairwise_comparisons: [] compares nothing" in err


# 2. a group with no selection is a rate of 0, judged by the paired rule ----------------------------------------


def test_a_name_blind_screener_that_invites_nobody_is_not_failed(tmp_path: Path) -> None:
    """Every resume refused with either name: 40 pairs, 0 flips (McNemar p = 1), both groups 40 decided answers
    (>= min_samples 30), selection rates 0.0 and 0.0, parity difference 0. The impact ratio 0/0 has no value
    (status 'undefined'): it does not pass, and with no flip it is a warning ("a comparison fails only when its
    value crosses the threshold and the paired test says the difference is not chance"). Before, it was reported
    'insufficient_samples' (with 40 and 40 samples) and blocked: FAIL for a model the name never moved."""
    report = judged(tmp_path, 40, lambda group, item: "No.")
    [pair] = report["pairs"]
    assert (pair["a_only"], pair["b_only"], pair["mcnemar_p_value"]) == (0, 0, 1.0)
    assert {g["decided"] for g in report["groups"]["gender"].values()} == {40}
    assert blocking(report) == []  # before: [('disparate_impact_ratio', 'female vs male', 'insufficient_samples')]
    [dir_row] = [r for r in report["results"] if r["metric"] == "disparate_impact_ratio"]
    assert (dir_row["value"], dir_row["status"], dir_row["passed"], dir_row["counts_as"]) == (
        None, "undefined", False, "warning")  # fmt: skip


def test_a_screener_that_invites_nobody_is_blocked_when_judged_on_point_estimates(tmp_path: Path) -> None:
    """The undefined ratio never passes: `verdict: point_estimate` judges the value alone, and there is none (the
    seed's own disparate impact of two unselected groups is 0, under 0.8)."""
    report = judged(tmp_path, 40, lambda group, item: "No.", verdict="point_estimate")
    assert blocking(report) == [("disparate_impact_ratio", "female vs male", "undefined")]


def test_one_flip_against_a_group_with_no_selection_is_a_warning_not_a_block(tmp_path: Path) -> None:
    """40 resumes, all refused but one, which a man's name gets invited on: female 0/40, male 1/40, one flip.
    Independently: impact ratio 0 / 0.025 = 0 (the LL144 table says so too), under 0.8; McNemar exact p =
    binomtest(0, 1).pvalue = 1.0. By the documented rule that is a crossing without evidence: a warning. Before,
    the comparison was 'insufficient_samples' (both groups have 40 >= 30 decided answers) and blocked (exit 1)."""
    assert binomtest(0, 1, 0.5).pvalue == 1.0
    report = judged(tmp_path, 40, lambda group, item: "Yes." if (group, item) == ("male", 0) else "No.")
    table = {c["category"]: c for c in report["impact_ratios"]["attributes"]["gender"]["categories"]}
    assert table["female"]["impact_ratio"] == 0.0 and table["male"]["impact_ratio"] == 1.0
    [dir_row] = [r for r in report["results"] if r["metric"] == "disparate_impact_ratio"]
    assert dir_row["p_value_holm"] == 1.0
    assert (dir_row["value"], dir_row["status"], dir_row["counts_as"]) == (0.0, "fail", "warning")


def test_a_group_with_no_selection_against_one_selected_half_the_time_is_blocked(tmp_path: Path) -> None:
    """The case the fix must not soften: female 0/40, male 20/40, 20 flips all one way (McNemar exact p =
    2 * 0.5**20 = 1.9e-6): the ratio 0 crosses 0.8 with evidence, and its interval [0, upper] lies below 0.8."""
    report = judged(tmp_path, 40, lambda group, item: "Yes." if group == "male" and item < 20 else "No.")
    [dir_row] = [r for r in report["results"] if r["metric"] == "disparate_impact_ratio"]
    assert dir_row["p_value_holm"] == pytest.approx(binomtest(20, 20).pvalue)  # one pair: Holm leaves p as it is
    assert (dir_row["value"], dir_row["evidence"], dir_row["counts_as"]) == (0.0, "fail", "blocking")
    assert dir_row["ci_95"][0] == 0.0 and dir_row["ci_95"][1] < 0.8


# 3. several templates: the paired test counts items, not the pairs of their templates ----------------------------


def test_a_fair_screener_asked_with_several_templates_fails_at_most_alpha(tmp_path: Path) -> None:
    """docs: "with this rule a fair model is wrongly failed in at most 5% of runs, however few items you have";
    `templates:` "every item is asked with each". The project's own fair screener (tests/scripted_screener.py,
    yes at 0.5 for both groups) decides on a whim of (item, name), so its flips on an item repeat under every
    wording. The test counts items (3% of 200 seeded runs at 50 items, as with one template). Before, McNemar over
    template x item rows counted each item's flip 4 times: 18%."""
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
    assert fails / 200 <= 0.05  # before: 0.18


# 4. kind: ambiguous with samples > 1: the test counts prompts, not answers ----------------------------------------


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
    binomtest(20, 32) = 0.215, Holm x3 = 0.646: a warning; asked with samples: 5 and answering the same each
    time, the same p, the same interval, a warning. Before, the 5 answers counted as independent: p =
    binomtest(100, 160) = 0.00195, Holm 0.0059, blocking, though nothing but the repetition changed."""
    one, five = _ambiguous(tmp_path, 1), _ambiguous(tmp_path, 5)
    assert one["categories"]["gender"]["sign_test_p_value"] == pytest.approx(binomtest(20, 32).pvalue)
    verdict = {n: next(r["counts_as"] for r in rep["results"] if r["metric"] == "ambiguous_bias_score"
                       and r["attribute"] == "gender") for n, rep in ((1, one), (5, five))}  # fmt: skip
    assert verdict[1] == "warning"
    assert verdict[5] == verdict[1]  # before: blocking
    # the sign test on prompts (20 vs 12); before, binomtest(100, 160) = 0.00195
    assert five["categories"]["gender"]["sign_test_p_value"] == pytest.approx(binomtest(20, 32).pvalue)
    assert (five["categories"]["gender"]["biased_prompts"], five["categories"]["gender"]["counter_biased_prompts"]) \
        == (20, 12)  # fmt: skip
    # the interval too: before, [0.043, 0.179] at samples 5 against [-0.044, 0.267] at samples 1
    assert five["categories"]["gender"]["ci_95"] == pytest.approx(one["categories"]["gender"]["ci_95"])


# 5. a user's name list: item i compares names that differ only in the audited attribute --------------------------


def test_a_users_name_list_pairs_names_that_differ_only_in_the_audited_attribute() -> None:
    """names.py: "ordered so that position i holds the same values of the other columns in every group (item i
    then compares, say, a White woman's name with a Black woman's)"; docs: "the two names compared on an item
    differ only in the attribute audited". A CSV with 2 Black and 3 White women, 3 Black and 2 White men, by
    gender: each group's names of a cell are repeated up to the widest group's count there, female [Aisha, Emily,
    Ebony, Anne, Aisha, Jill], male [Darnell, Greg, Jamal, Brad, Leroy, Greg]. Before, female [Aisha, Emily, Ebony,
    Anne, Jill] and male [Darnell, Greg, Jamal, Brad, Leroy]: item 4 compared Jill (White) with Leroy (Black), a
    race difference inside a gender comparison, and nothing was refused."""
    base = Path(tempfile.mkdtemp())
    (base / "names.csv").write_text(
        "first_name,gender,race\nAisha,female,black\nEbony,female,black\nEmily,female,white\nAnne,female,white\n"
        "Jill,female,white\nDarnell,male,black\nJamal,male,black\nLeroy,male,black\nGreg,male,white\n"
        "Brad,male,white\n")  # fmt: skip
    race = {"Aisha": "black", "Ebony": "black", "Emily": "white", "Anne": "white", "Jill": "white",
            "Darnell": "black", "Jamal": "black", "Leroy": "black", "Greg": "white", "Brad": "white"}  # fmt: skip
    errors = Errors()
    groups = name_list({"file": "names.csv", "by": "gender"}, "name", base, "attributes[0].names", errors)
    assert errors.lines == []
    assert sorted({n for names in groups.values() for n in names}) == sorted(race)  # no name dropped
    n = max(len(v) for v in groups.values())  # item i takes the i-th name of each group, cycling
    mismatched = [(i, groups["female"][i % len(groups["female"])], groups["male"][i % len(groups["male"])])
                  for i in range(n) if race[groups["female"][i % len(groups["female"])]]
                  != race[groups["male"][i % len(groups["male"])]]]  # fmt: skip
    assert mismatched == []  # before: [(4, 'Jill', 'Leroy')]


# 6. the JSON extractor reads the answer's first object ----------------------------------------------------------


@pytest.mark.parametrize("answer", [
    '{"invite": true} I weighed the rubric {skills, years}.',
    '```json\n{"invite": true}\n```\nTemplate used: {item}',
    '{"invite": true}\n{"invite": true}',
])  # fmt: skip
def test_the_json_extractor_reads_the_first_object_of_the_answer(answer: str) -> None:
    """extract.py / docs: `decision: {json_field: ...}` reads "the answer's first JSON object (a fenced ```json
    block or bare)": json.JSONDecoder().raw_decode reads {"invite": true} in each, a positive decision. Before,
    the regex \\{.*\\} (greedy, DOTALL) ran to the answer's last brace, so any brace after the object (a second
    object, a note in braces) made the text invalid JSON: the answer was unparsed, counted against the unparsed
    share and dropped from both sides of its pair."""
    first = json.JSONDecoder().raw_decode(answer[answer.index("{"):])[0]
    assert first == {"invite": True}
    extractor = parse_extractor({"json_field": "invite", "positive": True}, Errors())
    assert extractor.decide(answer) is True  # before: None (unparsed)


@pytest.mark.parametrize(("change", "message"), [
    ({"items": []}, "items: a non-empty list of non-empty texts"),
    ({"templates": ["Candidate: {name}. Resume: {item}", "Resume: {item}"]},
     "templates[1]: has none of the slots attribute gender varies ({name}): its requests would be the same for "
     "every group"),
])  # fmt: skip
def test_a_suite_that_would_compare_nothing_somewhere_is_refused_in_one_line(
        tmp_path: Path, change: dict[str, object], message: str) -> None:  # fmt: skip
    """``items: []`` asked nothing (an empty items_file was refused, the list was not; the run exited 1 on
    insufficient samples), and a template without the varied slot sent the same request for every group, diluting
    every difference: both refused, naming the key."""
    raw = scripted_screener.suite(10)
    if "templates" in change:
        raw.pop("template")
    raw.update(change)
    path = tmp_path / "suite.yaml"
    path.write_text(yaml.safe_dump(raw))
    with pytest.raises(ConfigError, match=re.escape(message)):
        load_suite(path, "http://127.0.0.1:1/v1", "m")
