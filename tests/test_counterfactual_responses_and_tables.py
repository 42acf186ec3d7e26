"""The counterfactual gate (exporter/gate/counterfactual/, docs/ml/counterfactual.md) against what its targets send
and what its users audit: a reply with HTTP 200 that is no chat completion is a failed request, never a traceback;
the answer cache answers only for the model version it was asked under; a name list's ``by:`` of two columns gives
the LL144 intersectional table; the example's unquoted ``positive: yes`` reads a yes as positive. Targets are real
OpenAI-compatible HTTP servers on loopback (tests/chat_servers.py, or a minimal one here for replies that are no
chat completion). Written as review 25's failing tests, with tests of the fixes beside them."""

from __future__ import annotations

import csv
import io
import json
import re
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import chat_servers
import pandas as pd
import pytest
import scripted_screener
import yaml

from exporter.cli import main
from exporter.config import ConfigError
from exporter.gate import audit_log
from exporter.gate.counterfactual import calls, names
from exporter.gate.counterfactual.run import judge, plan
from exporter.gate.counterfactual.suite import load_suite

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "counterfactual-screener.yaml"


@pytest.fixture(autouse=True)
def _key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", chat_servers.KEY)


@contextmanager
def replying(body: bytes, content_type: str) -> Iterator[str]:
    """A loopback endpoint that answers every POST with HTTP 200 and ``body``: what a proxy's error page, an
    error object sent with status 200, or a reply cut short looks like to the client."""
    with replying_by(lambda request: (body, content_type)) as url:
        yield url


@contextmanager
def replying_by(reply: Callable[[dict], tuple[bytes, str]]) -> Iterator[str]:
    """A loopback endpoint that answers each POST with HTTP 200 and the body and content type ``reply`` gives for
    the request."""

    def answer(request: dict) -> tuple[int, dict[str, str], bytes]:
        body, content_type = reply(request)
        return 200, {"Content-Type": content_type}, body

    with chat_servers.answering(answer) as url:
        yield url


NOT_A_COMPLETION = {
    "html_error_page": (b"<html><body>502 Bad Gateway</body></html>", "text/html"),
    "error_object_with_status_200": (json.dumps({"error": {"message": "overloaded"}}).encode(), "application/json"),
    "body_cut_short": (b'{"id": "x", "choices": [{"index": 0, "message": {"role": "assistant", "content": "Ye',
                       "application/json"),
}


@pytest.mark.parametrize("reply", sorted(NOT_A_COMPLETION))
def test_a_reply_that_is_no_chat_completion_is_a_failed_request_not_a_crash(
        reply: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:  # fmt: skip
    """A reply with HTTP 200 whose body is no chat completion (a gateway's HTML page, an error object sent with
    200, a body cut short) is retried like a 5xx, then a failed request; an endpoint that sends nothing else ends
    the run with exit 2 and an audit-log record. Before, the worker caught Retryable and RuntimeError only: the
    AttributeError ('str' object has no attribute 'choices'), TypeError or JSONDecodeError escaped future.result()
    as a traceback, with no report and no audit-log record."""
    body, content_type = NOT_A_COMPLETION[reply]
    suite = tmp_path / "suite.yaml"
    suite.write_text(yaml.safe_dump(scripted_screener.suite(4, requests={"retries": 1, "backoff_seconds": 0})))
    log = tmp_path / "log.jsonl"
    with replying(body, content_type) as url:
        code = main(["counterfactual", str(suite), "--target", url, "--model", chat_servers.MODEL,
                     "--cache", str(tmp_path / "cache"), "--audit-log", str(log)])  # fmt: skip
    capsys.readouterr()
    assert code in (1, 2)
    records = audit_log.records(log)
    assert records and records[-1]["type"] in ("counterfactual", "counterfactual_error"), records


def test_the_ll144_table_of_the_shipped_names_has_the_intersectional_categories(tmp_path: Path) -> None:
    """The DCWP rules (6 RCNY 5-301) ask for the impact ratio of each sex category, each race/ethnicity category
    and each intersectional category of sex and race. The shipped example suite asks the Bertrand-Mullainathan
    names with ``by: [gender, race]`` too, and its impact_ratios has a table of the four combinations. Before, a
    name list's ``by:`` took one column only: the example had the female/male and white/black tables and no suite
    over the shipped list could ask for the intersection."""
    suite = load_suite(EXAMPLE, "http://127.0.0.1:1/v1", chat_servers.MODEL)
    report = judge(suite, plan(suite), lambda prompt: ["yes"])
    tables = report["impact_ratios"]["attributes"]
    sizes = {name: [c["category"] for c in t["categories"]] for name, t in tables.items()}
    assert any(len(categories) == 4 for categories in sizes.values()), sizes


def test_a_new_model_version_behind_the_same_endpoint_is_asked_not_judged_on_the_old_answers(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:  # fmt: skip
    """The answer cache is keyed by the model version too: version 2 of the screener, deployed behind the same URL
    and model name and audited with --model-version 2, is asked again and judged on its own answers (FAIL, the
    docs' 60% vs 45% example). Before, the cache was keyed by the request alone (URL, model name, messages,
    temperature, n, seed): the run for version 2 sent no request and reported version 1's PASS under version 2's
    name."""
    suite = tmp_path / "suite.yaml"
    suite.write_text(yaml.safe_dump(scripted_screener.suite(200)))
    answers = {"now": scripted_screener.screener({"female": 0.5, "male": 0.5})}
    with chat_servers.serve(lambda system, user: answers["now"](system, user)) as server:
        def run(version: str) -> tuple[int, dict]:
            code = main(["counterfactual", str(suite), "--target", server.base_url, "--model", chat_servers.MODEL,
                         "--cache", str(tmp_path / "cache"), "--audit-log", str(tmp_path / "log.jsonl"),
                         "--model-version", version])  # fmt: skip
            return code, json.loads(capsys.readouterr().out)

        first_code, first = run("1")
        answers["now"] = scripted_screener.screener({"female": 0.60, "male": 0.45})
        code, second = run("2")
    assert first_code == 0 and first["model_version"] == "1"
    assert second["model_version"] == "2"
    assert second["requests"]["sent"] > 0 and code == 1, (code, second["verdict"], second["requests"])


def completion(content: str) -> bytes:
    """A chat completion with one answer, as an OpenAI-compatible server sends it."""
    return json.dumps({"id": "chatcmpl-1", "object": "chat.completion", "created": 0, "model": chat_servers.MODEL,
                       "choices": [{"index": 0, "message": {"role": "assistant", "content": content},
                                    "finish_reason": "stop"}]}).encode()  # fmt: skip


def test_a_reply_that_is_no_chat_completion_among_answers_is_a_blocking_failed_request(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:  # fmt: skip
    """Among answered requests, the ones answered with a gateway's error page are failed requests after their
    retries: failed_requests blocks (exit 1), names the error, and the run is in the audit log. Before, the first
    such reply was a traceback."""
    suite = tmp_path / "suite.yaml"
    suite.write_text(yaml.safe_dump(scripted_screener.suite(4, requests={"retries": 1, "backoff_seconds": 0})))
    log = tmp_path / "log.jsonl"
    page = NOT_A_COMPLETION["html_error_page"]
    with replying_by(lambda r: page if "profile 3:" in r["messages"][-1]["content"] else
                     (completion("Yes"), "application/json")) as url:  # fmt: skip
        code = main(["counterfactual", str(suite), "--target", url, "--model", chat_servers.MODEL,
                     "--cache", str(tmp_path / "cache"), "--audit-log", str(log)])  # fmt: skip
    report = json.loads(capsys.readouterr().out)
    failed = next(r for r in report["results"] if r["metric"] == "failed_requests")
    assert code == 1 and report["requests"]["failed"] == 2 and report["requests"]["calls"] == 6 + 2 * 2
    assert not failed["passed"] and failed["counts_as"] == "blocking"
    assert all("no chat completion" in e["error"] and "502 Bad Gateway" in e["error"] for e in failed["errors"])
    assert audit_log.records(log)[-1]["type"] == "counterfactual"


def test_anything_a_request_raises_fails_that_request_with_its_error(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:  # fmt: skip
    """Whatever goes wrong around one request (here, reading an answer raises KeyError) is that request's failure,
    with its error text, and the other requests are judged: never a traceback out of the worker. Before, only
    Retryable and RuntimeError were caught."""
    real = calls.reply_text

    def reading(choice: object, max_tokens: int) -> str:
        text = real(choice, max_tokens)
        if text == "No.":
            raise KeyError("no decision field")
        return text

    monkeypatch.setattr(calls, "reply_text", reading)
    suite = tmp_path / "suite.yaml"
    suite.write_text(yaml.safe_dump(scripted_screener.suite(20)))
    with chat_servers.serve(scripted_screener.screener({"female": 0.5, "male": 0.5})) as server:
        code = main(["counterfactual", str(suite), "--target", server.base_url, "--model", chat_servers.MODEL,
                     "--cache", str(tmp_path / "cache"), "--audit-log", str(tmp_path / "log.jsonl")])  # fmt: skip
    report = json.loads(capsys.readouterr().out)
    failed = next(r for r in report["results"] if r["metric"] == "failed_requests")
    assert code == 1 and 0 < report["requests"]["failed"] < report["requests"]["sent"]
    assert failed["errors"] and all(e["error"] == "KeyError: 'no decision field'" for e in failed["errors"])


def test_a_rerun_of_the_same_model_version_is_answered_from_the_cache(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:  # fmt: skip
    """Keying the cache by model version keeps a rerun of the same version free (0 requests sent, the same answers'
    hash) and a run naming no version still shares its answers with other runs naming none."""
    suite = tmp_path / "suite.yaml"
    suite.write_text(yaml.safe_dump(scripted_screener.suite(20)))
    with chat_servers.serve(scripted_screener.screener({"female": 0.5, "male": 0.5})) as server:
        def run(*version: str) -> dict:
            main(["counterfactual", str(suite), "--target", server.base_url, "--model", chat_servers.MODEL,
                  "--cache", str(tmp_path / "cache"), "--audit-log", str(tmp_path / "log.jsonl"),
                  *version])  # fmt: skip
            return json.loads(capsys.readouterr().out)

        first, again = run("--model-version", "7"), run("--model-version", "7")
        unversioned, unversioned_again = run(), run()
    assert first["requests"]["sent"] == 40 and again["requests"]["sent"] == 0
    assert again["cache"]["sha256"] == first["cache"]["sha256"]
    assert unversioned["requests"]["sent"] == 40 and unversioned_again["requests"]["sent"] == 0


def shipped_names() -> dict[str, tuple[str, str]]:
    """The shipped list's first names, each with its (gender, race)."""
    rows = csv.DictReader(io.StringIO(names.shipped_text(names.NAME_LISTS["bertrand-mullainathan-2004"])))
    return {r["first_name"]: (r["gender"], r["race"]) for r in rows}


INTERSECTIONAL_RATES = {("female", "white"): 0.7, ("female", "black"): 0.4, ("male", "white"): 0.6,
                        ("male", "black"): 0.5}  # fmt: skip


def intersectional_suite(tmp_path: Path) -> Path:
    raw = scripted_screener.suite(40)
    raw["attributes"] = [{"name": "gender_x_race", "slot": "name",
                          "names": {"list": "bertrand-mullainathan-2004", "by": ["gender", "race"]}}]  # fmt: skip
    path = tmp_path / "suite.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


def test_the_intersectional_table_is_the_audit_gates_table_of_the_same_decisions(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:  # fmt: skip
    """``by: [gender, race]`` asks each item with a name of each sex and race, and its LL144 table is the one the
    audit gate computes from the same decisions with ``intersections: [[gender, race]]``: the same categories,
    rates, impact ratios, reference and flags. The HTML page shows it, and the CI reports carry its comparisons,
    the paired test per pair of the suite's (all six). Before, ``by:`` took one column only."""
    of = shipped_names()

    def screener(system: str, user: str) -> str:
        found = scripted_screener.CANDIDATE.search(user)
        assert found is not None, user
        name, item = found.groups()
        return "Yes." if scripted_screener.uniform("x", item, name) < INTERSECTIONAL_RATES[of[name]] else "No."

    html, markdown = tmp_path / "cf.html", tmp_path / "cf.md"
    with chat_servers.serve(screener) as server:
        main(["counterfactual", str(intersectional_suite(tmp_path)), "--target", server.base_url, "--model",
              chat_servers.MODEL, "--cache", str(tmp_path / "cache"), "--audit-log", str(tmp_path / "log.jsonl"),
              "--html", str(html), "--summary-md", str(markdown)])  # fmt: skip
    report = json.loads(capsys.readouterr().out)
    groups = report["groups"]["gender_x_race"]
    assert list(groups) == ["female:white", "female:black", "male:white", "male:black"]
    decisions = pd.concat([pd.DataFrame({"gender": g.split(":")[0], "race": g.split(":")[1],
                                         "prediction": [1] * s["positive"] + [0] * (s["decided"] - s["positive"])})
                           for g, s in groups.items()], ignore_index=True)  # fmt: skip
    decisions.to_csv(tmp_path / "decisions.csv", index=False)
    config = {"model_id": "screener", "min_samples": 1,
              "protected_attributes": [{"name": "gender", "groups": ["female", "male"]},
                                       {"name": "race", "groups": ["white", "black"]}],
              "intersections": [["gender", "race"]],
              "metrics": [{"name": "disparate_impact_ratio", "threshold": 0.8, "severity_on_fail": "warning"}]}
    (tmp_path / "audit.yaml").write_text(yaml.safe_dump(config))
    main(["audit", str(tmp_path / "audit.yaml"), str(tmp_path / "decisions.csv"), "--audit-log",
          str(tmp_path / "audit-log.jsonl")])  # fmt: skip
    audited = json.loads(capsys.readouterr().out)["impact_ratios"]["attributes"]["gender_x_race"]
    assert report["impact_ratios"]["attributes"]["gender_x_race"] == audited
    assert [c["impact_ratio"] for c in audited["categories"]] != [1.0] * 4  # the rates differ: a real comparison
    page = html.read_text()
    assert all(f"<td>{g}</td>" in page for g in groups) and "<h3>gender_x_race</h3>" in page
    assert len([p for p in report["pairs"] if p["attribute"] == "gender_x_race"]) == 6
    assert markdown.read_text().count("gender_x_race") >= 6


@pytest.mark.parametrize(("by", "names_csv", "said"), [
    (["gender", "race"], "first_name,gender,race\nAnn,female,white\nBo,male,white\nCy,female,black\n",
     "no name with gender=male, race=black: every combination of the by columns is a category"),
    (["gender", "gender"], "first_name,gender,race\nAnn,female,white\n", "a list of distinct columns"),
    (["gender", "age"], "first_name,gender,race\nAnn,female,white\n", "it has ['first_name', 'gender', 'race']"),
])  # fmt: skip
def test_an_intersection_that_cannot_be_asked_is_refused_naming_why(
        by: list[str], names_csv: str, said: str, tmp_path: Path) -> None:  # fmt: skip
    """A combination of the ``by`` columns with no name (no Black man's name) is a category the table would leave
    out: refused, naming it, as are a column given twice and a column the list lacks (exit 2, ConfigError)."""
    (tmp_path / "names.csv").write_text(names_csv)
    raw = scripted_screener.suite(4)
    raw["attributes"] = [{"name": "both", "slot": "name", "names": {"file": "names.csv", "by": by}}]
    (tmp_path / "suite.yaml").write_text(yaml.safe_dump(raw))
    with pytest.raises(ConfigError, match=re.escape(said)):
        load_suite(tmp_path / "suite.yaml", "http://127.0.0.1:1/v1", chat_servers.MODEL)


def test_the_example_suites_unquoted_yes_reads_a_yes_as_positive() -> None:
    """``decision: {pattern: '^\\W*(yes|no)\\b', positive: yes}`` as the example suite and the docs write it: YAML
    reads the unquoted yes as true, which stands for yes, true and on. Before, it became the outcome "true", which
    the pattern never captures: every yes the model said was counted as a no (every rate 0)."""
    suite = load_suite(EXAMPLE, "http://127.0.0.1:1/v1", chat_servers.MODEL)
    assert yaml.safe_load(EXAMPLE.read_text())["decision"]["positive"] is True
    assert [suite.decision.decide(a) for a in ("Yes - invite to interview.", "no", "Maybe")] == [True, False, None]
    report = judge(suite, plan(suite), lambda prompt: ["Yes."])
    assert all(c["rate"] == 1.0 for t in report["impact_ratios"]["attributes"].values() for c in t["categories"])
