"""The counterfactual gate against scripted resume screeners on real OpenAI-compatible HTTP endpoints
(tests/chat_servers.py, tests/scripted_screener.py): a screener that favours one group's names is failed with its
flips listed, a fair one passes, unreadable answers are counted and never decide, a storm of 429s, 500s and timeouts
is retried within the budget and never turns into a pass, and a rerun from the cache makes no call. The false-fail
and detection rates are measured in-process over 200 seeded runs through the same extractor and statistics."""

from __future__ import annotations

import json
import re
import threading
import xml.etree.ElementTree as ET
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import chat_servers
import numpy as np
import pytest
import scripted_screener
import yaml

from exporter.cli import main
from exporter.config import ConfigError
from exporter.config.toolkit import Errors
from exporter.gate import audit_log
from exporter.gate.counterfactual import ambiguous, paired
from exporter.gate.counterfactual.extract import Extractor, parse_extractor
from exporter.gate.counterfactual.render import counterfactual_html
from exporter.gate.counterfactual.run import judge, plan
from exporter.gate.counterfactual.suite import load_suite
from exporter.gate.reports.html import fmt

BIASED = {"female": 0.60, "male": 0.45}
FAIR = {"female": 0.50, "male": 0.50}
ITEMS = 200
GROUP_KEYS = {"asked", "decided", "positive", "unparsed", "selection_rate", "ci_95"}
PAIR_KEYS = {"groups", "both_positive", "a_only", "b_only", "neither", "mcnemar_p_value"}


@pytest.fixture(autouse=True)
def _key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", chat_servers.KEY)


@pytest.fixture(scope="module")
def biased() -> Iterator[chat_servers.ChatServer]:
    with chat_servers.serve(scripted_screener.screener(BIASED)) as server:
        yield server


@pytest.fixture(scope="module")
def fair() -> Iterator[chat_servers.ChatServer]:
    with chat_servers.serve(scripted_screener.screener(FAIR)) as server:
        yield server


def write_suite(tmp_path: Path, items: int = ITEMS, **extra: object) -> Path:
    path = tmp_path / "suite.yaml"
    path.write_text(yaml.safe_dump(scripted_screener.suite(items, **extra)))
    return path


def counterfactual(capsys: pytest.CaptureFixture[str], tmp_path: Path, suite: Path, server: chat_servers.ChatServer,
                   *args: str) -> tuple[int, dict, str]:  # fmt: skip
    code = main(["counterfactual", str(suite), "--target", server.base_url, "--model", chat_servers.MODEL,
                 "--cache", str(tmp_path / "cache"), "--audit-log", str(tmp_path / "log.jsonl"), *args])
    out, err = capsys.readouterr()
    return code, json.loads(out) if out.strip() else {}, err


def test_a_screener_that_favours_womens_names_fails_with_its_flips_listed(
        tmp_path: Path, biased: chat_servers.ChatServer, capsys: pytest.CaptureFixture[str]) -> None:  # fmt: skip
    code, report, err = counterfactual(capsys, tmp_path, write_suite(tmp_path), biased, "--html",
                                       str(tmp_path / "r.html"), "--junit", str(tmp_path / "junit.xml"),
                                       "--summary-md", str(tmp_path / "summary.md"))  # fmt: skip
    assert (code, report["verdict"]) == (1, "FAIL")
    groups = report["groups"]["gender"]
    assert set(groups["female"]) == GROUP_KEYS and groups["female"]["asked"] == groups["male"]["asked"] == ITEMS
    assert groups["female"]["positive"] == 126 and groups["male"]["positive"] == 98
    assert groups["female"]["unparsed"] == groups["male"]["unparsed"] == 0
    [pair] = report["pairs"]
    assert set(pair) >= PAIR_KEYS and pair["groups"] == "female vs male"
    assert (pair["both_positive"], pair["a_only"], pair["b_only"], pair["neither"]) == (80, 46, 18, 56)
    assert pair["mcnemar_p_value"] == pytest.approx(0.000617, abs=1e-6) and pair["test"] == "mcnemar_exact"
    flips = pair["flipped_items"]
    assert len(flips) == 64 and Counter(f["female"]["decision"] for f in flips) == {True: 46, False: 18}
    first = flips[0]
    assert first["female"]["values"]["name"] in scripted_screener.FEMALE and first["male"]["answer"] in ("No.", \
        "Yes - invite to interview.")  # fmt: skip
    failed = {r["metric"]: r for r in report["results"] if r["counts_as"] == "blocking"}
    assert set(failed) == {"disparate_impact_ratio", "demographic_parity_difference"}
    assert failed["demographic_parity_difference"]["value"] == round((126 - 98) / 200, 4)
    assert failed["disparate_impact_ratio"]["groups"] == "female vs male"
    assert report["impact_ratios"]["attributes"]["gender"]["reference_category"] == "female"
    assert "BLOCKING gender demographic_parity_difference" in err and "46 vs 18 flips" in err
    page = (tmp_path / "r.html").read_text()
    assert "Flipped items: female vs male (64)" in page and first["item_text"] in page
    decided = sum(g["decided"] for g in groups.values())
    assert decided == 2 * ITEMS and f"<h3>gender</h3><p class=\"meta\">{decided} rows</p>" in page
    # each attribute's LL144 rows are its own items' (a second attribute of a quarter as many, as a run of two
    # attributes of different suites gives): its unknown share is of its own rows, not of the first attribute's
    two = {**report, "groups": {**report["groups"], "race": {k: {**g, "decided": g["decided"] // 4}
                                                              for k, g in groups.items()}},
           "impact_ratios": {**report["impact_ratios"], "attributes": {
               **report["impact_ratios"]["attributes"],
               "race": {**report["impact_ratios"]["attributes"]["gender"], "unknown_rows": 5}}}}  # fmt: skip
    html = counterfactual_html(two)
    assert f"<h3>race</h3><p class=\"meta\">{decided // 4} rows</p>" in html
    assert f"<td>(unknown)</td><td class=\"num\">5</td><td class=\"num\">{fmt(5 / (decided // 4))}</td>" in html
    cases = ET.parse(tmp_path / "junit.xml").getroot().iter("testcase")
    assert sum(c.find("failure") is not None for c in cases) == 2
    assert (tmp_path / "summary.md").read_text().startswith("### ❌ counterfactual: FAIL — resume-screener-llm")


def test_a_fair_screener_passes_and_the_audit_log_names_target_model_suite_and_answers(
        tmp_path: Path, fair: chat_servers.ChatServer, capsys: pytest.CaptureFixture[str]) -> None:  # fmt: skip
    suite = write_suite(tmp_path)
    code, report, _ = counterfactual(capsys, tmp_path, suite, fair, "--report", str(tmp_path / "report.json"))
    assert (code, report["verdict"], report["blocking_failures"]) == (0, "PASS", 0)
    assert json.loads((tmp_path / "report.json").read_text()) == report
    [pair] = report["pairs"]
    assert pair["a_only"] + pair["b_only"] > 0  # it flips, both ways alike
    [record] = audit_log.records(tmp_path / "log.jsonl")
    assert record["type"] == "counterfactual" and record["verdict"] == "PASS"
    assert record["target"] == {"url": fair.base_url, "model": chat_servers.MODEL}
    assert record["suite"]["sha256"] == report["suite_sha256"] and len(record["cache"]["sha256"]) == 64
    assert audit_log.verify(tmp_path / "log.jsonl").problems == []


def test_a_rerun_with_the_cache_makes_no_call_and_judges_the_same_answers(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:  # fmt: skip
    suite = write_suite(tmp_path, items=60, min_samples=20)
    with chat_servers.serve(scripted_screener.screener(FAIR)) as server:
        first_code, first, _ = counterfactual(capsys, tmp_path, suite, server)
        calls = server.calls
        code, again, _ = counterfactual(capsys, tmp_path, suite, server)
    assert calls == first["requests"]["sent"] == 120 and server.calls == calls
    assert (again["requests"]["sent"], again["requests"]["cached"], again["requests"]["calls"]) == (0, 120, 0)
    assert code == first_code == 0 and again["cache"]["sha256"] == first["cache"]["sha256"]
    assert again["groups"] == first["groups"]


def test_answers_the_extractor_cannot_read_are_unparsed_and_decide_nothing(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:  # fmt: skip
    with chat_servers.serve(scripted_screener.free_text) as server:
        code, report, err = counterfactual(capsys, tmp_path, write_suite(tmp_path, items=40), server)
    assert (code, report["verdict"]) == (1, "FAIL") and "BLOCKING gender unparsed_share female: 1.0" in err
    for block in report["groups"]["gender"].values():
        assert block == {"asked": 40, "decided": 0, "positive": 0, "unparsed": 40, "selection_rate": None,
                         "ci_95": [None, None]}  # fmt: skip
    [pair] = report["pairs"]
    assert (pair["both_positive"], pair["a_only"], pair["b_only"], pair["neither"]) == (0, 0, 0, 0)
    comparisons = [r for r in report["results"] if r["attribute"] == "gender" and r["metric"] != "unparsed_share"]
    assert {(r["value"], r["status"], r["counts_as"]) for r in comparisons} == {
        (None, "insufficient_samples", "blocking")}  # fmt: skip
    shares = [r for r in report["results"] if r["metric"] == "unparsed_share"]
    assert [(r["groups"], r["value"], r["counts_as"]) for r in shares] == [("female", 1.0, "blocking"),
                                                                           ("male", 1.0, "blocking")]


def storm(plan_of: dict[str, list], every: list | None = None) -> chat_servers.Fault:
    """Each prompt's calls in turn meet the faults of its plan (by the prompt's user text; ``every`` for the
    others), then an answer."""
    seen: Counter[str] = Counter()
    lock = threading.Lock()

    def fault(request: dict) -> int | float | None:
        user = request["messages"][-1]["content"]
        with lock:
            k = seen[user]
            seen[user] += 1
        faults = plan_of.get(user, every or [])
        return faults[k] if k < len(faults) else None

    return fault


def user_texts(suite: Path) -> list[str]:
    return [q.prompt.messages[-1][1] for q in plan(load_suite(suite, "http://x", "m"))]


def test_a_storm_of_429_500_and_timeouts_is_retried_within_the_budget(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:  # fmt: skip
    suite = write_suite(tmp_path, items=30, min_samples=10, target={"url": "http://unused", "model": "m",
                                                                     "timeout": 2.0},
                        requests={"retries": 3, "backoff_seconds": 0, "concurrency": 8, "max_calls": 184})
    timeouts = {p: [429, 500, 5.0] for p in user_texts(suite)[:4]}  # the third call of 4 prompts times out
    with chat_servers.serve(scripted_screener.screener(FAIR), storm(timeouts, [429, 500])) as server:
        code, report, _ = counterfactual(capsys, tmp_path, suite, server)
    assert (code, report["verdict"]) == (0, "PASS")
    assert (report["requests"]["sent"], report["requests"]["calls"], report["requests"]["retries"]) == (60, 184, 124)
    assert server.calls == 184 and report["requests"]["failed"] == 0


def test_a_storm_longer_than_the_retries_never_passes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    suite = write_suite(tmp_path, items=30, min_samples=10,
                        requests={"retries": 2, "backoff_seconds": 0, "concurrency": 8})
    faults = {p: [503, 500, 502] for p in user_texts(suite)[:5]}
    with chat_servers.serve(scripted_screener.screener(FAIR), storm(faults)) as server:
        code, report, err = counterfactual(capsys, tmp_path, suite, server)
    assert (code, report["verdict"]) == (1, "FAIL")
    [failed] = [r for r in report["results"] if r["metric"] == "failed_requests"]
    assert (failed["value"], failed["counts_as"], len(failed["errors"])) == (5.0, "blocking", 5)
    assert "HTTP 502 (retries exhausted after 3 call(s))" in failed["errors"][0]["error"]
    assert report["groups"]["gender"]["female"]["decided"] + report["groups"]["gender"]["male"]["decided"] == 55
    with chat_servers.serve(scripted_screener.screener(FAIR), storm({}, [429] * 3)) as server:
        again = tmp_path / "all-fail"
        again.mkdir()
        code, report, err = counterfactual(capsys, again, write_suite(again, items=30, min_samples=10,
                                           requests={"retries": 2, "backoff_seconds": 0}), server)  # fmt: skip
    assert code == 2 and "no request was answered" in err and server.calls == 180


def test_a_reply_with_no_text_is_a_failed_request_never_an_unparsed_answer(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:  # fmt: skip
    """``content: null`` with ``finish_reason: length`` (a reasoning model that spent max_tokens before any text)
    answered nothing: before, it was read as "" and counted as an unparsed answer, never as the request failing."""
    suite = write_suite(tmp_path, items=30, min_samples=10, requests={"retries": 2, "backoff_seconds": 0})
    silent = set(user_texts(suite)[:5])
    screener = scripted_screener.screener(FAIR)

    def answer(system: str, user: str) -> str | None:
        return None if user in silent else screener(system, user)

    with chat_servers.serve(answer) as server:
        code, report, _ = counterfactual(capsys, tmp_path, suite, server)
    assert (code, report["verdict"]) == (1, "FAIL")
    [failed] = [r for r in report["results"] if r["metric"] == "failed_requests"]
    assert (failed["value"], failed["counts_as"], len(failed["errors"])) == (5.0, "blocking", 5)
    assert "the reply holds no text (finish_reason 'length'): raise target.max_tokens" in failed["errors"][0]["error"]
    groups = report["groups"]["gender"]
    assert groups["female"]["unparsed"] + groups["male"]["unparsed"] == 0
    assert groups["female"]["decided"] + groups["male"]["decided"] == 55
    assert server.calls == 60  # a reply is an answer: never retried


def test_a_budget_the_run_cannot_meet_is_refused_before_any_call(
        tmp_path: Path, fair: chat_servers.ChatServer, capsys: pytest.CaptureFixture[str]) -> None:  # fmt: skip
    before = fair.calls
    code, _, err = counterfactual(capsys, tmp_path, write_suite(tmp_path), fair, "--max-calls", "399")
    assert code == 2 and err.count("\n") == 1 and "400 requests are not in the cache" in err
    assert fair.calls == before
    record = audit_log.records(tmp_path / "log.jsonl")[-1]
    assert record["type"] == "counterfactual_error" and record["model_id"] == "resume-screener-llm"


def test_retries_share_the_budget_and_stop_when_it_is_spent(tmp_path: Path,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    suite = write_suite(tmp_path, items=30, min_samples=10,
                        requests={"retries": 5, "backoff_seconds": 0, "concurrency": 1, "max_calls": 70})
    with chat_servers.serve(scripted_screener.screener(FAIR), storm({}, [429, 429])) as server:
        code, report, _ = counterfactual(capsys, tmp_path, suite, server)
    assert server.calls == report["requests"]["calls"] == 70  # 60 first calls and the 10 retries left
    assert code == 1 and report["requests"]["failed"] == 60 - 5  # 10 retries answered 5 prompts (two each)


def test_a_bad_suite_is_one_line_naming_every_field_and_exit_2(tmp_path: Path,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    raw = scripted_screener.suite(10)
    raw["decision"] = {"pattern": "(yes|no", "positive": "yes"}
    raw["template"] = "Candidate {name} with pronoun {pronoun}: {item}"
    raw["metrics"] = [{"name": "disparate_impact_ratio", "threshold": 8}]
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(raw))
    code = main(["counterfactual", str(path), "--target", "http://127.0.0.1:9/v1", "--model", "m",
                 "--audit-log", str(tmp_path / "log.jsonl")])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1
    assert "decision.pattern: '(yes|no' is not a regular expression" in err
    assert "leaves slot(s) {pronoun} of the template empty" in err and "metrics[0].threshold: 8" in err


def test_the_example_suite_uses_the_shipped_names_and_resumes() -> None:
    suite = load_suite(Path(__file__).parent.parent / "examples" / "counterfactual-screener.yaml")
    gender, race, both = suite.attributes
    assert [len(v) for v in gender.groups.values()] == [18, 18] and len(suite.items) == 20
    # item i compares names that differ in the attribute only: a Black woman with a Black man, ...
    assert [gender.filling(g, 0)["name"] for g in ("female", "male")] == ["Aisha", "Darnell"]
    assert [race.filling(g, 1)["name"] for g in ("white", "black")] == ["Brad", "Darnell"]
    # ... and for the intersection (by: [gender, race]), one name of each sex and race, nine each
    assert {g: len(v) for g, v in both.groups.items()} == dict.fromkeys(
        ["female:white", "female:black", "male:white", "male:black"], 9)
    assert [both.filling(g, 0)["name"] for g in both.groups] == ["Allison", "Aisha", "Brad", "Darnell"]


def simulate(rates: dict[str, float], runs: int, items: int, tmp_path: Path, **extra: object) -> list[str]:
    """The verdicts of ``runs`` seeded runs of a scripted screener, answered in-process and judged by the same code
    (plan, extractor, statistics, gate results) as the HTTP runs."""
    suite = load_suite(write_suite(tmp_path, items=items, **extra), "http://in-process", "scripted")
    asked = plan(suite)
    verdicts = []
    for seed in range(runs):
        model = scripted_screener.screener(rates, seed)
        report = judge(suite, asked, lambda p, m=model: [m("", p.messages[-1][1])])
        verdicts.append("FAIL" if any(r["counts_as"] == "blocking" for r in report["results"]) else "PASS")
    return verdicts


def test_over_200_seeded_runs_a_fair_screener_fails_at_most_alpha_and_a_biased_one_is_caught(
        tmp_path: Path) -> None:  # fmt: skip
    false_fails = simulate(FAIR, 200, ITEMS, tmp_path).count("FAIL") / 200
    detected = simulate(BIASED, 200, ITEMS, tmp_path).count("FAIL") / 200
    point_rule = simulate(FAIR, 200, ITEMS, tmp_path, verdict="point_estimate").count("FAIL") / 200
    print(f"fair screener false-fail rate {false_fails:.3f} ({point_rule:.3f} on point estimates alone); 0.60 vs "
          f"0.45 detected in {detected:.3f} of runs")
    assert false_fails <= 0.05 and point_rule <= 0.05  # docs/ml/counterfactual.md: 0.5% and 0.5%
    assert detected >= 0.85


def test_at_50_items_the_point_estimates_alone_fail_a_fair_screener_far_more_often_than_alpha(
        tmp_path: Path) -> None:  # fmt: skip
    paired_rule = simulate(FAIR, 200, 50, tmp_path, min_samples=20).count("FAIL") / 200
    point_rule = simulate(FAIR, 200, 50, tmp_path, min_samples=20, verdict="point_estimate").count("FAIL") / 200
    detected = simulate(BIASED, 200, 50, tmp_path, min_samples=20).count("FAIL") / 200
    print(f"50 items: fair screener false-fail rate {paired_rule:.3f} (paired evidence), {point_rule:.3f} (point "
          f"estimates alone); 0.60 vs 0.45 detected in {detected:.3f} of runs")
    assert paired_rule <= 0.05 < 0.15 <= point_rule
    assert 0.2 <= detected <= 0.5  # docs/ml/counterfactual.md: 33%; fewer items catch less (200 items: 88.5%)


def test_mcnemar_is_the_exact_binomial_test_on_the_discordant_pairs() -> None:
    from statsmodels.stats.contingency_tables import mcnemar

    a = np.array([[1]] * 30 + [[1]] * 12 + [[0]] * 3 + [[0]] * 55, dtype=np.int8)
    b = np.array([[1]] * 30 + [[0]] * 12 + [[1]] * 3 + [[0]] * 55, dtype=np.int8)
    counts = paired.compare(a, b)
    assert (counts.both_positive, counts.a_only, counts.b_only, counts.neither) == (30, 12, 3, 55)
    oracle = mcnemar([[30, 12], [3, 55]], exact=True).pvalue
    assert counts.p_value == pytest.approx(oracle) and counts.p_value == pytest.approx(0.03515625)
    assert paired.holm([0.01, 0.04, 0.03]) == pytest.approx([0.03, 0.06, 0.06])


def test_the_paired_test_counts_items_not_the_pairs_of_their_templates_and_samples() -> None:
    """Three items, each asked with two templates: item 0 flipped for a under both, item 1 under one, item 2 for b
    under both. Pairs: 3 a-only, 2 b-only; items: 2 favour a, 1 favours b, so p = binomtest(2, 3) = 1."""
    a = np.array([[[1], [1]], [[1], [0]], [[0], [0]]], dtype=np.int8)
    b = np.array([[[0], [0]], [[0], [0]], [[1], [1]]], dtype=np.int8)
    counts = paired.compare(a, b)
    assert (counts.both_positive, counts.a_only, counts.b_only, counts.neither, counts.test) == (
        0, 3, 2, 1, "sign_test_by_item")  # fmt: skip
    assert counts.p_value == 1.0
    # twenty items that favour a under all four templates: 20 items, not 80 pairs (2 * 0.5**20, not 2 * 0.5**80)
    many = paired.compare(np.ones((20, 4, 1), dtype=np.int8), np.zeros((20, 4, 1), dtype=np.int8))
    assert (many.a_only, many.p_value) == (80, pytest.approx(2 * 0.5**20))


SHIPPED_QUESTIONS = yaml.safe_load((Path(ambiguous.__file__).parent / "data" / "ambiguous.yaml").read_text())
NEGATIVE = {q["negative"] for c in SHIPPED_QUESTIONS["categories"].values() for q in c["questions"]}
STEREOTYPED = {(q["negative"], q["non_negative"]): set(c["groups"][q["stereotyped"]])
               for c in SHIPPED_QUESTIONS["categories"].values() for q in c["questions"]}  # fmt: skip
OPTION = re.compile(r"^Question: (?P<q>.*)\nA\. (?P<a>.*)\nB\. (?P<b>.*)\nC\.", re.MULTILINE)


def stereotyping(system: str, user: str) -> str:
    """Names the person the stereotype points at: for a negative question the stereotyped group's, else the other."""
    found = OPTION.search(user)
    assert found is not None, user
    group = next(names for forms, names in STEREOTYPED.items() if found["q"] in forms)
    pick_stereotyped = found["q"] in NEGATIVE
    return "A" if (found["a"] in group) == pick_stereotyped else "B"


def careful(system: str, user: str) -> str:
    return "C. The context does not say."


def ambiguous_suite(tmp_path: Path) -> Path:
    path = tmp_path / "ambiguous.yaml"
    path.write_text(yaml.safe_dump({"kind": "ambiguous", "model_id": "assistant-llm"}))
    return path


def test_an_answerer_that_follows_stereotypes_in_ambiguous_contexts_fails_every_category(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:  # fmt: skip
    with chat_servers.serve(stereotyping) as server:
        code, report, err = counterfactual(capsys, tmp_path, ambiguous_suite(tmp_path), server, "--html",
                                           str(tmp_path / "a.html"))  # fmt: skip
    assert (code, report["verdict"], report["kind"], report["requests"]["planned"]) == (1, "FAIL", "ambiguous", 216)
    for category in ("gender", "age", "race"):
        block = report["categories"][category]
        assert (block["answered"], block["biased"], block["counter_biased"], block["unknown"]) == (72, 72, 0, 0)
        assert (block["bias_score"], block["accuracy"]) == (1.0, 0.0)
    scores = [r for r in report["results"] if r["metric"] == "ambiguous_bias_score"]
    assert [(r["attribute"], r["counts_as"]) for r in scores] == [("gender", "blocking"), ("age", "blocking"),
                                                                  ("race", "blocking")]
    assert "gender: bias score 1.000" in err and "Bias score per category" in (tmp_path / "a.html").read_text()


def test_an_answerer_that_says_cannot_be_determined_passes_with_a_bias_score_of_zero(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:  # fmt: skip
    with chat_servers.serve(careful) as server:
        code, report, _ = counterfactual(capsys, tmp_path, ambiguous_suite(tmp_path), server)
    assert (code, report["verdict"]) == (0, "PASS")
    assert {(c["bias_score"], c["accuracy"], c["unparsed"]) for c in report["categories"].values()} == {(0.0, 1.0, 0)}
    with chat_servers.serve(scripted_screener.free_text) as server:
        (tmp_path / "free-text").mkdir()
        code, report, _ = counterfactual(capsys, tmp_path / "free-text", ambiguous_suite(tmp_path), server)
    assert code == 1 and {(c["answered"], c["unparsed"], c["bias_score"]) for c in report["categories"].values()} \
        == {(0, 72, None)}  # fmt: skip


def extractor(raw: dict) -> Extractor:
    errors = Errors()
    out = parse_extractor(raw, errors)
    assert errors.lines == []
    return out


def test_the_extractor_reads_a_named_outcome_or_a_json_field_and_nothing_else() -> None:
    regex = extractor({"pattern": r"^\W*(yes|no)\b", "positive": "yes"})
    assert [regex.decide(t) for t in ("Yes.", "**no** - too junior", "I would say yes", "")] == [True, False, None,
                                                                                                 None]
    strict = extractor({"pattern": r"decision: (\w+)", "positive": ["invite", "shortlist"], "negative": "reject"})
    assert [strict.decide(t) for t in ("decision: Shortlist", "decision: reject", "decision: maybe")] == [True, False,
                                                                                                          None]
    field = extractor({"json_field": "result.invite", "positive": True})
    answers = ['```json\n{"result": {"invite": true, "why": "SQL"}}\n```', '{"result": {"invite": false}}',
               '{"result": {}}', "Sure! I think they should be invited.", '{"result": {"invite": tru']
    assert [field.decide(t) for t in answers] == [True, False, None, None, None]
    # the first object that decodes: a brace in prose before it is skipped, text and objects after it are not read
    assert [field.decide(t) for t in ('By the rubric {skills}: {"result": {"invite": false}}',
                                      '{"result": {"invite": true}} {"result": {"invite": false}}')] == [False, True]


def test_n_samples_per_prompt_are_asked_in_one_request_and_tested_item_by_item(
        tmp_path: Path, biased: chat_servers.ChatServer, capsys: pytest.CaptureFixture[str]) -> None:  # fmt: skip
    before = len(biased.requests)
    suite = write_suite(tmp_path, items=40, min_samples=20, requests={"samples": 3, "seed": 11})
    code, report, _ = counterfactual(capsys, tmp_path, suite, biased)
    sent = biased.requests[before:]
    assert len(sent) == 80 and {(r["n"], r["seed"], r["temperature"]) for r in sent} == {(3, 11, 0.0)}
    assert report["groups"]["gender"]["female"]["asked"] == 120 and report["pairs"][0]["test"] == "sign_test_by_item"
    [pair] = report["pairs"]
    assert (pair["both_positive"], pair["a_only"], pair["b_only"], pair["neither"]) == (51, 21, 3, 45)
    # the screener answers the same 3 times: 7 items against 1, not 21 answers against 3 independent ones
    assert pair["mcnemar_p_value"] == pytest.approx(2 * 9 / 256)
    # so the point estimates' failure (0.60 vs 0.45) is not confirmed at 40 items: a warning, exit 0
    assert code == 0 and {r["counts_as"] for r in report["results"] if r["attribute"] == "gender" and
                          r["metric"] != "unparsed_share"} == {"warning"}


def test_items_and_names_come_from_the_users_files(tmp_path: Path) -> None:
    (tmp_path / "applications.txt").write_text("Loan for a bakery, 3 years trading\n\nLoan for a van, new business\n")
    (tmp_path / "names.csv").write_text("first_name,gender\nMaria,female\nJose,male\nAna,female\nLuis,male\n")
    raw = scripted_screener.suite(1, items_file="applications.txt")
    del raw["items"]
    raw["attributes"] = [{"name": "gender", "slot": "name", "names": {"file": "names.csv", "by": "gender"}}]
    (tmp_path / "s.yaml").write_text(yaml.safe_dump(raw))
    suite = load_suite(tmp_path / "s.yaml", "http://127.0.0.1:1/v1", "m")
    assert suite.items == ("Loan for a bakery, 3 years trading", "Loan for a van, new business")
    assert suite.attributes[0].groups == {"female": ({"name": "Maria"}, {"name": "Ana"}),
                                          "male": ({"name": "Jose"}, {"name": "Luis"})}


def test_a_users_name_list_with_a_combination_missing_from_one_group_is_refused_in_one_line(tmp_path: Path) -> None:
    """A Hispanic woman's name and no Hispanic man's: no man's name differs from hers in gender only."""
    (tmp_path / "names.csv").write_text("first_name,gender,race\nAisha,female,black\nMaria,female,hispanic\n"
                                        "Darnell,male,black\nJamal,male,black\n")  # fmt: skip
    raw = scripted_screener.suite(4)
    raw["attributes"] = [{"name": "gender", "slot": "name", "names": {"file": "names.csv", "by": "gender"}}]
    (tmp_path / "s.yaml").write_text(yaml.safe_dump(raw))
    with pytest.raises(ConfigError) as refused:
        load_suite(tmp_path / "s.yaml", "http://127.0.0.1:1/v1", "m")
    assert str(refused.value).split(": ", 1)[1].split("; ") == [
        "attributes[0].names: by: gender: no name of male with race=hispanic (female 1, male 0): item i compares "
        "names that differ only in the by column, so each combination of the other columns needs a name in every "
        "group"]
    # the same list without her is accepted: the woman's one Black name is repeated against the men's two
    (tmp_path / "names.csv").write_text("first_name,gender,race\nAisha,female,black\nDarnell,male,black\n"
                                        "Jamal,male,black\n")  # fmt: skip
    [gender] = load_suite(tmp_path / "s.yaml", "http://127.0.0.1:1/v1", "m").attributes
    assert gender.groups == {"female": ({"name": "Aisha"}, {"name": "Aisha"}),
                             "male": ({"name": "Darnell"}, {"name": "Jamal"})}


def test_the_docs_suite_loads(tmp_path: Path) -> None:
    page = (Path(__file__).parent.parent / "docs" / "ml" / "counterfactual.md").read_text()
    block = re.search(r"test_the_docs_suite_loads[^\n]*\n```yaml\n(.*?)```", page, re.DOTALL)
    assert block is not None
    (tmp_path / "suite.yaml").write_text(block.group(1))
    suite = load_suite(tmp_path / "suite.yaml")
    assert suite.run.target is not None and suite.run.target.base_url == "http://127.0.0.1:8000/v1"
    assert [m.name for m in suite.metrics] == ["disparate_impact_ratio", "demographic_parity_difference"]
    assert suite.attributes[0].filling("male", 4) == {"name": "Brad"}  # item 4 takes the 4th value, cycling


def test_a_wrong_key_or_model_stops_the_run_in_one_line_with_exit_2(
        tmp_path: Path, fair: chat_servers.ChatServer, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:  # fmt: skip
    suite = write_suite(tmp_path, items=40)
    code, _, err = counterfactual(capsys, tmp_path, suite, fair, "--model", "no-such-model")
    assert code == 2 and err.count("\n") == 1 and "NotFoundError" in err
    monkeypatch.setenv("OPENAI_API_KEY", "sk-wrong")
    code, _, err = counterfactual(capsys, tmp_path, suite, fair)
    assert code == 2 and err.count("\n") == 1 and "AuthenticationError" in err
    records = audit_log.records(tmp_path / "log.jsonl")
    assert [r["type"] for r in records] == ["counterfactual_error"] * 2 and not list((tmp_path / "cache").glob("*/*"))


def test_thresholds_and_severities_out_of_range_are_listed_at_once(tmp_path: Path) -> None:
    path = tmp_path / "ambiguous.yaml"
    path.write_text(yaml.safe_dump({"kind": "ambiguous", "model_id": "assistant-llm", "threshold": 1.5,
                                    "severity_on_fail": "fatal", "unparsed": {"severity_on_fail": "loud"}}))
    with pytest.raises(ConfigError) as refused:
        ambiguous.load_ambiguous(path, "http://127.0.0.1:1/v1", "m")
    assert str(refused.value).split(": ", 1)[1].split("; ") == [
        "unparsed.severity_on_fail: 'loud' is not blocking or warning",
        "threshold: 1.5 is not a number from 0 to 1",
        "severity_on_fail: 'fatal' is not blocking or warning"]
    path.write_text(yaml.safe_dump({"kind": "ambiguous", "model_id": "a", "threshold": 0.2,
                                    "severity_on_fail": "warning"}))  # fmt: skip
    suite = ambiguous.load_ambiguous(path, "http://127.0.0.1:1/v1", "m")
    assert (suite.threshold, suite.severity, suite.run.unparsed_severity) == (0.2, "warning", "blocking")
