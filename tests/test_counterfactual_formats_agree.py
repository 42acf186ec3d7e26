"""Every format of one counterfactual run says the same thing of each comparison, as for ``audit``
(tests/test_report_formats_agree.py): JSON, Markdown, JUnit, the HTML page and the stderr summary agree on what it
counts as, its value and interval, whether it is insufficient and its evidence, and on the run's counts.

Before (review 20), a suite of 20 items at ``min_samples: 21``: Markdown and JUnit showed each insufficient
comparison's exact value (``0.0500 [0.0000, 0.3276]``) and one reason ("insufficient samples: 20 items decided
for both groups, below min_samples 21"); stderr said "no value, threshold 0.1, status insufficient_samples (20 items
decided for both groups, min_samples 21)" and the HTML page ``—`` with a red ``fail``, neither its evidence, neither
the counts of insufficient and inconclusive comparisons. Scripted models on loopback OpenAI-compatible servers
(tests/chat_servers.py), as in tests/test_counterfactual.py.
"""

from __future__ import annotations

import html
import re
from collections.abc import Callable
from pathlib import Path

import chat_servers
import pytest
import scripted_screener
import yaml
from test_counterfactual import BIASED, FAIR, careful
from test_report_formats_agree import (
    Key,
    Said,
    counts_in,
    counts_of,
    from_html,
    from_junit,
    from_markdown,
    junit_counts,
    outputs,
    said,
)

from exporter.cli import main
from exporter.gate.counterfactual.render import SUMMARY_LINES


@pytest.fixture(autouse=True)
def _key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", chat_servers.KEY)


def from_summary(err: str, report: dict) -> dict[Key, Said]:
    """The stderr summary's comparison lines (``BLOCKING gender metric a vs b: value [lo, hi], ...``): it lists the
    comparisons that did not pass, so a passing one is absent, not contradicted."""
    out = {}
    for r in report["results"]:
        rest = [line.strip().split(" ", 1) for line in err.splitlines()[1:]
                if f" {r['attribute']} {r['metric']} {r['groups']}: " in line]  # fmt: skip
        if not rest:
            continue
        ((tag, text),) = rest
        evidence = re.search(r"evidence (\w+)", text)
        out[(r["attribute"], r["metric"], r["groups"])] = said(
            tag.lower(), text, "insufficient samples" in text, evidence[1] if evidence else "(none)")
    return out


def decision(items: int, **extra: object) -> Callable[[Path], Path]:
    def write(tmp_path: Path) -> Path:
        (tmp_path / "suite.yaml").write_text(yaml.safe_dump(scripted_screener.suite(items, **extra)))
        return tmp_path / "suite.yaml"

    return write


def ambiguous(**extra: object) -> Callable[[Path], Path]:
    def write(tmp_path: Path) -> Path:
        (tmp_path / "suite.yaml").write_text(yaml.safe_dump({"kind": "ambiguous", "model_id": "assistant-llm",
                                                             **extra}))  # fmt: skip
        return tmp_path / "suite.yaml"

    return write


def no_one(system: str, user: str) -> str:
    return "No."


WARNED = [{"name": "disparate_impact_ratio", "threshold": 0.8, "severity_on_fail": "blocking"},
          {"name": "demographic_parity_difference", "threshold": 0.1, "severity_on_fail": "warning"}]  # fmt: skip
SCENARIOS = {
    # 20 items decided for both groups, min_samples 21: both comparisons insufficient, blocking
    "decision, too few items": (decision(20, min_samples=21), scripted_screener.screener(FAIR)),
    # 200 items, the screener favours women's names: the ratio blocks, the parity gap warns
    "decision, biased, one metric warns": (decision(200, metrics=WARNED), scripted_screener.screener(BIASED)),
    # nobody selected in either group: the ratio is undefined (no value at all), the gap 0
    "decision, no one selected": (decision(40), no_one),
    # 72 prompts per category, min_samples 73: every category's bias score insufficient
    "ambiguous, too few prompts": (ambiguous(min_samples=73), careful),
}


@pytest.mark.parametrize("name", list(SCENARIOS))
def test_every_format_of_a_counterfactual_run_says_the_same_of_every_comparison(
    name: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """JSON, Markdown, JUnit, HTML and the stderr summary of one run: per comparison what it counts as, its value
    and interval, whether it is insufficient, and its evidence; and the counts each states."""
    write, model = SCENARIOS[name]
    suite, out = write(tmp_path), tmp_path / "out"
    with chat_servers.serve(model) as server:
        main(["counterfactual", str(suite), "--target", server.base_url, "--model", chat_servers.MODEL,
              "--cache", str(tmp_path / "cache"), "--audit-log", str(tmp_path / "l.jsonl"),
              "--report", str(out / "r.json"), "--junit", str(out / "j.xml"), "--summary-md", str(out / "s.md"),
              "--html", str(out / "r.html")])  # fmt: skip
    err = capsys.readouterr().err
    report, md, page, truth = outputs(out)
    if "too few" in name:
        assert counts_of(truth)["insufficient"] > 0
    formats = {"Markdown": from_markdown(md), "JUnit": from_junit(out / "j.xml", report["model_id"]),
               "HTML": from_html(page), "stderr": from_summary(err, report)}  # fmt: skip
    disagreements = [f"{fmt} {key}: {shown} where JSON {truth.get(key)}" for fmt, said in formats.items()
                     for key, shown in said.items() if shown != truth.get(key)]  # fmt: skip
    disagreements += [f"{fmt} lacks {key}" for fmt, said in formats.items() for key in truth if key not in said
                      and (fmt != "stderr" or truth[key].counts_as != "pass")]  # stderr lists what did not pass
    assert disagreements == [], f"{len(disagreements)}: " + "\n".join(disagreements[:6])
    assert sum(s.counts_as != "pass" for s in truth.values()) <= SUMMARY_LINES  # so stderr lists them all
    banner = re.search(r'<div class="verdict \w+"><strong>\w+</strong>([^<]*)', page)
    stated = {"Markdown": counts_in(md.splitlines()[2]), "JUnit": junit_counts(out / "j.xml"),
              "HTML": counts_in(html.unescape(banner[1]) if banner else ""), "stderr": counts_in(err.splitlines()[0])}
    assert {fmt: c for fmt, c in stated.items() if c != counts_of(truth)} == {}, counts_of(truth)
