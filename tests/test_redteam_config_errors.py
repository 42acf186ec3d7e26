"""The red-team config's ``decision`` section and each case's ``params`` are validated with the rest of the config.

STYLE.md: "Config validation collects every invalid entry and reports them all in one message"; "Every failure a
user can cause is one line naming the field and exit code 2; a traceback is a bug report"; docs/ml/
safety-redteam.md: exit 2 "on a bad config ... (one line on stderr naming the field or the error)". Unvalidated,
``decision: 0.7`` was a traceback with no audit record, a misspelt key was ignored (the run decided at 0.5),
``threshold: .nan`` made every score ``allow`` (``score >= nan`` is False), labels given as one string became
its characters, and ``params: "rate=0.5"`` was a traceback.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from exporter.cli import main

CASES = [{"category": "homoglyphs", "test_cases": [
    {"name": "cyrillic", "technique": "homoglyph_cyrillic", "expected_behaviour": "block",
     "texts": ["you are a worthless idiot"]}]}]  # fmt: skip


@pytest.fixture
def scorer(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    (tmp_path / "idiot_scorer.py").write_text("def score(text):\n    return 0.9 if 'idiot' in text else 0.1\n")
    monkeypatch.chdir(tmp_path)
    return "idiot_scorer:score"


@pytest.mark.parametrize("decision", [0.7, {"treshold": 0.7}, {"threshold": float("nan")},
                                      {"block_labels": "unsafe"}],
                         ids=["a number", "a misspelt key", "a NaN threshold", "labels as one string"])
def test_a_bad_decision_section_is_one_line_and_exit_2(tmp_path: Path, scorer: str, decision: object,
                                                       capsys: pytest.CaptureFixture[str]) -> None:  # fmt: skip
    config = tmp_path / "red-team.yaml"
    config.write_text(yaml.safe_dump({"model_id": "moderator", "decision": decision, "red_team_tests": CASES}))
    log = tmp_path / "log.jsonl"
    code = main(["redteam", "--config", str(config), "--target", scorer, "--audit-log", str(log)])
    _, err = capsys.readouterr()
    assert code == 2 and err.count("\n") == 1 and "decision" in err, (code, err)
    assert [json.loads(line)["type"] for line in log.read_text().splitlines()] == ["redteam_error"]


def test_a_case_params_that_is_not_a_mapping_is_one_line_and_exit_2(tmp_path: Path, scorer: str,
                                                                    capsys: pytest.CaptureFixture[str]) -> None:
    """``params: "rate=0.5"`` on a case: one line naming the case's params, exit 2."""
    config = tmp_path / "red-team.yaml"
    cases = [{"category": "homoglyphs", "test_cases": [{**CASES[0]["test_cases"][0], "params": "rate=0.5"}]}]
    config.write_text(yaml.safe_dump({"model_id": "moderator", "red_team_tests": cases}))
    code = main(["redteam", "--config", str(config), "--target", scorer, "--audit-log", str(tmp_path / "log.jsonl")])
    _, err = capsys.readouterr()
    assert code == 2 and err.count("\n") == 1 and "params" in err, (code, err)


def parse(**extra: object) -> dict:
    from exporter.gate.redteam.config import load_library, parse_config

    return parse_config({"model_id": "m", "red_team_tests": CASES, **extra}, "red-team.yaml", load_library())


def problems(**extra: object) -> str:
    from exporter.config import ConfigError

    with pytest.raises(ConfigError) as error:
        parse(**extra)
    return str(error.value)


def test_every_problem_of_the_decision_section_is_listed_at_once() -> None:
    message = problems(decision={"threshold": float("inf"), "block_labels": "unsafe", "allow_labels": [1],
                                 "treshold": 0.7})  # fmt: skip
    assert "decision.treshold: unknown key (accepted: allow_labels, block_labels, review_labels, threshold)" in message
    assert "decision.threshold: inf is not a finite number" in message
    assert "decision.block_labels: 'unsafe' is not a list of labels, such as [block]" in message
    assert "decision.allow_labels: [1] is not a list of labels, such as [allow]" in message
    assert "\n" not in message


def test_a_label_given_two_decisions_is_refused() -> None:
    message = problems(decision={"block_labels": ["flagged", "hold"], "review_labels": ["hold"]})
    assert "decision: ['hold'] in both block_labels and review_labels: a label means one decision" in message


def test_a_label_given_one_decision_leaves_the_other_defaults() -> None:
    """``allow_labels: [true]`` (a classifier whose ``true`` means "safe") is read as the config says, though
    ``true`` is one of the default block labels; the defaults keep their other labels."""
    config = parse(decision={"allow_labels": ["true", "ok"], "threshold": 0.7})
    assert config["labels"]["allow"] == {"true", "ok"} and config["threshold"] == 0.7
    assert "true" not in config["labels"]["block"] and {"block", "unsafe"} <= config["labels"]["block"]


def test_a_valid_decision_section_decides_as_written(tmp_path: Path, scorer: str,
                                                    capsys: pytest.CaptureFixture[str]) -> None:  # fmt: skip
    """A threshold above the scorer's 0.9 reads every score as ``allow``: the plain text is a baseline failure, as
    the configured threshold says it is."""
    config = tmp_path / "red-team.yaml"
    config.write_text(yaml.safe_dump({"model_id": "moderator", "decision": {"threshold": 0.95},
                                      "red_team_tests": CASES}))  # fmt: skip
    code = main(["redteam", "--config", str(config), "--target", scorer, "--audit-log", str(tmp_path / "l.jsonl")])
    report = json.loads(capsys.readouterr().out)
    assert code == 1 and report["baseline_failures"] == 1


@pytest.mark.parametrize("params", [{"rate": 0}, {"rate": -0.5}, {"rate": 1.5}, {"rate": float("nan")},
                                    {"rate": "half"}, {"rate": True}])
def test_a_rate_outside_zero_to_one_is_refused(params: dict) -> None:
    message = problems(red_team_tests=[{"category": "c", "test_cases": [{**CASES[0]["test_cases"][0],
                                                                         "params": params}]}])  # fmt: skip
    assert f"red_team_tests[0].test_cases[0].params.rate: {params['rate']!r} is not a share in (0, 1]" in message


@pytest.mark.parametrize("params", [{"min_leak_chars": "forty"}, {"prefix_chars": 0}, {"templates": "{text}!"},
                                    {"scripts": "CYRILLIC"}, {"language": 7}])
def test_parameters_of_the_wrong_type_are_refused_naming_them(params: dict) -> None:
    [(key, value)] = params.items()
    message = problems(red_team_tests=[{"category": "c", "test_cases": [{**CASES[0]["test_cases"][0],
                                                                         "params": params}]}])  # fmt: skip
    assert f"red_team_tests[0].test_cases[0].params.{key}: {value!r} is not" in message


def test_a_rate_of_one_and_a_rate_of_a_half_are_accepted() -> None:
    for rate in (1, 0.5):
        cases = [{"category": "c", "test_cases": [{**CASES[0]["test_cases"][0], "params": {"rate": rate}}]}]
        assert parse(red_team_tests=cases)["cases"][0]["params"]["rate"] == rate
