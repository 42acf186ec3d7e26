"""Every format of one audit run says the same thing: JSON, Markdown, JUnit, HTML and the stderr summary agree on
each comparison's verdict (``counts_as``), value, interval, evidence and insufficient mark, and on the counts.

Before (review 18), on the shipped example and the seed's config:

1. A comparison that counts as a warning (``decision: evidence`` with ``failure_policy.inconclusive: warn``, the
   point estimate over the threshold, the interval across it): JSON ``counts_as: warning``, Markdown
   ``⚠️ warning``, JUnit ``<skipped message="warning (does not block) ...">``, stderr ``counts as warning``, the
   HTML banner "0 blocking · 1 warning"; the HTML row showed severity ``blocking`` and a red ``fail``, nothing said
   warning (the page showed ``status`` and never ``counts_as``).
2. A comparison with too few samples: Markdown and JUnit showed its exact value, the HTML row ``—`` (the JSON's
   null ``value``) and stderr "no value": different numbers for one check of one run.
3. The Markdown counts line omitted the insufficient (and inconclusive) comparisons that JSON, stderr and HTML
   count; stderr showed values to 3 places where every other format shows 4.
"""

from __future__ import annotations

import html
import json
import re
from dataclasses import dataclass
from html.parser import HTMLParser
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml
from junitparser import Failure, Skipped
from junitparser.xunit2 import JUnitXml

from exporter.cli import main

ROOT = Path(__file__).resolve().parent.parent


def html_rows(page: str, metric: str) -> dict[str, list[str]]:
    """The comparison rows of the page's tables: groups -> the row's cells (text, unescaped)."""
    out = {}
    for row in re.findall(r"<tr>(<td[^>]*>" + re.escape(metric) + r"</td>.*?)</tr>", page):
        cells = [html.unescape(c) for c in re.findall(r"<td[^>]*>(.*?)</td>", row)]
        out[cells[1]] = cells
    return out


def test_a_comparison_that_counts_as_a_warning_is_a_warning_on_the_html_page(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rows = ["gender,prediction,label"]
    rows += [f"male,{int(i < 500)},{i % 2}" for i in range(1000)]      # 50% selected
    rows += [f"female,{int(i < 440)},{i % 2}" for i in range(1000)]    # 44%: a gap of 0.06 over the threshold 0.05
    (tmp_path / "d.csv").write_text("\n".join(rows) + "\n")
    (tmp_path / "c.yaml").write_text(yaml.safe_dump({
        "model_id": "m1", "min_samples": 30, "decision": "evidence", "failure_policy": {"inconclusive": "warn"},
        "protected_attributes": [{"name": "gender", "groups": ["male", "female"]}],
        "metrics": [{"name": "demographic_parity_difference", "threshold": 0.05, "severity_on_fail": "blocking"}]}))
    out = tmp_path / "out"
    code = main(["audit", str(tmp_path / "c.yaml"), str(tmp_path / "d.csv"), "--audit-log", str(tmp_path / "l.jsonl"),
                 "--junit", str(out / "j.xml"), "--summary-md", str(out / "s.md"), "--html", str(out / "r.html")])
    capsys.readouterr()
    assert code == 0  # the warning does not block
    (case,) = [c for s in JUnitXml.fromfile(str(out / "j.xml")) for c in s]
    assert isinstance(case.result[0], Skipped) and case.result[0].message.startswith("warning (does not block)")
    assert "| ⚠️ warning |" in (out / "s.md").read_text()
    page = (out / "r.html").read_text()
    assert "0 blocking · 1 warning" in page
    row = html_rows(page, "demographic_parity_difference")["male vs female"]
    # observed: ['demographic_parity_difference', 'male vs female', '0.0600', '[0.0163, 0.1034]', '0.0500',
    #            'blocking', 'fail', 'inconclusive', 'male 18,997 · female 18,997']
    assert any("warning" in cell for cell in row), row
    assert '<td class="warning">warning (does not block)</td>' in page  # in the colour of a warning, not red


def test_an_insufficient_comparison_shows_the_same_value_in_html_and_markdown(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "hiring.yaml"
    config.write_text((ROOT / "examples" / "hiring-screener.yaml").read_text())
    out = tmp_path / "out"
    main(["audit", str(config), str(ROOT / "examples" / "hiring-predictions.csv"), "--audit-log",
          str(tmp_path / "l.jsonl"), "--summary-md", str(out / "s.md"), "--html", str(out / "r.html")])
    capsys.readouterr()
    md = (out / "s.md").read_text()
    page = (out / "r.html").read_text()
    md_rows = {tuple(c.strip() for c in line.split("|")[1:4]): line.split("|")[4].strip()
               for line in md.splitlines() if line.startswith("| ") and "insufficient samples" in line}
    assert md_rows, "the shipped example has insufficient comparisons"
    disagreements = []
    for (attribute, metric, groups), md_value in md_rows.items():
        cells = html_rows(page, metric)[groups]
        md_number = md_value.split(" [")[0]
        if cells[2] != md_number:
            disagreements.append(f"{attribute} {metric} {groups}: Markdown {md_number}, HTML {cells[2]}")
    # observed e.g. "gender_x_age_group equalised_odds_difference male:18_29 vs non_binary:18_29: Markdown 0.1343,
    # HTML —" for each of the 21 insufficient comparisons that have a value
    assert disagreements == [], f"{len(disagreements)} of {len(md_rows)}: {disagreements[:3]}"


def test_the_markdown_counts_say_how_many_comparisons_had_too_few_samples(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The JSON (``insufficient_samples: 21``), the stderr summary and the HTML banner ("21 with insufficient
    samples") count the comparisons that evaluated nothing; the Markdown's counts line, the one a job summary
    shows, was "49 of 123 checks passed, 59 blocking, 15 warning(s)." and said nothing of them (``markdown`` in
    exporter/gate/reports/ci.py counted outcomes only)."""
    config = tmp_path / "hiring.yaml"
    config.write_text((ROOT / "examples" / "hiring-screener.yaml").read_text())
    out = tmp_path / "out"
    main(["audit", str(config), str(ROOT / "examples" / "hiring-predictions.csv"), "--audit-log",
          str(tmp_path / "l.jsonl"), "--summary-md", str(out / "s.md"), "--html", str(out / "r.html"),
          "--report", str(out / "r.json")])
    capsys.readouterr()
    n = json.loads((out / "r.json").read_text())["insufficient_samples"]
    assert n == 21
    assert f"{n} with insufficient samples" in (out / "r.html").read_text()
    counts_line = (out / "s.md").read_text().splitlines()[2]
    assert counts_line.startswith("49 of 123 checks passed")
    assert f"{n} " in counts_line and "insufficient" in counts_line, counts_line


# --- every format of one run, comparison by comparison ----------------------------------------------------------

Key = tuple[str, str, str]
"""(attribute, metric, groups) of one comparison."""


@dataclass(frozen=True)
class Said:
    """What one format says of one comparison: what it counts as, its value and interval (4 places, None where the
    format shows none), whether it is marked estimated and insufficient, and its evidence."""

    counts_as: str
    value: str | None
    interval: tuple[str, str] | None
    estimated: bool
    insufficient: bool
    evidence: str


NUMBER = r"(n/a|—|-?[0-9]+\.[0-9]{4})"
SHOWN = re.compile(rf"{NUMBER} \[{NUMBER}, {NUMBER}\]( estimated)?")


def number(text: str) -> str | None:
    return None if text in ("n/a", "—") else text


def said(counts_as: str, shown: str, insufficient: bool, evidence: str) -> Said:
    """A format's ``value [lo, hi]`` (``estimated`` after it when marked) as a Said."""
    m = SHOWN.search(shown)
    if m is None:  # no value and interval where the others have them
        return Said(counts_as, "(not shown)", None, False, insufficient, evidence.split(" ")[0])
    lo, hi = number(m[2]), number(m[3])
    return Said(counts_as, number(m[1]), None if lo is None or hi is None else (lo, hi), bool(m[4]), insufficient,
                evidence.split(" ")[0])  # fmt: skip


def from_json(report: dict) -> dict[Key, Said]:
    def four(x: float | None) -> str | None:
        return None if x is None else f"{x:.4f}"

    out = {}
    for r in report["results"]:
        value = r["value"] if r["value"] is not None else r["exact_value"]
        lo, hi = r["ci_95"]
        out[(r["attribute"], r["metric"], r["groups"])] = Said(
            r["counts_as"], four(value), None if lo is None or hi is None else (four(lo), four(hi)),
            bool(r.get("estimated")), r["status"] == "insufficient_samples", r["evidence"])  # fmt: skip
    return out


MARKDOWN_OUTCOME = {"✅": "pass", "❌": "blocking", "⚠️": "warning"}


def from_markdown(text: str) -> dict[Key, Said]:
    lines = text.splitlines()
    head = next(i for i, line in enumerate(lines) if line.startswith("| attribute |"))
    columns = [c.strip() for c in lines[head].strip("|").split("|")]
    out = {}
    for line in lines[head + 2:]:
        if not line.startswith("| "):
            break
        cell = dict(zip(columns, (html.unescape(c.strip()) for c in line.strip("|").split("|")), strict=True))
        outcome = cell["outcome"]
        key = (cell["attribute"].removesuffix(" (proxy: true)"), cell["metric"], cell["groups"])
        out[key] = said(MARKDOWN_OUTCOME[outcome.split(" ")[0]], cell["value [95% interval]"],
                        "insufficient samples" in outcome, cell["evidence"])  # fmt: skip
    return out


def from_junit(path: Path, model_id: str) -> dict[Key, Said]:
    out = {}
    for suite in JUnitXml.fromfile(str(path)):
        for case in suite:
            result = case.result[0] if case.result else None
            message = result.message if result is not None else case.system_out.splitlines()[0]
            counts_as = "blocking" if isinstance(result, Failure) else "warning" if isinstance(result, Skipped) \
                else "pass"  # fmt: skip
            metric, groups = case.name.split(" ", 1)
            evidence = re.search(r"evidence (\w+)", message)[1]  # type: ignore[index]
            out[(case.classname.removeprefix(f"{model_id}."), metric, groups)] = said(
                counts_as, message, "insufficient samples" in message, evidence)
    return out


class _Page(HTMLParser):
    """The cells of every table on a page, each table under the ``<h2>`` it follows."""

    def __init__(self) -> None:
        super().__init__()
        self.tables: list[tuple[str, list[list[str]]]] = []
        self.heading: list[str] | None = None
        self.section = ""
        self.cell: list[str] | None = None

    def handle_starttag(self, tag: str, attrs: list) -> None:
        if tag == "h2":
            self.heading = []
        elif tag == "table":
            self.tables.append((self.section, []))
        elif tag == "tr":
            self.tables[-1][1].append([])
        elif tag in ("td", "th"):
            self.cell = []

    def handle_endtag(self, tag: str) -> None:
        if tag == "h2" and self.heading is not None:
            self.section, self.heading = "".join(self.heading), None
        elif tag in ("td", "th") and self.cell is not None:
            self.tables[-1][1][-1].append("".join(self.cell))
            self.cell = None

    def handle_data(self, data: str) -> None:
        for part in (self.heading, self.cell):
            if part is not None:
                part.append(data)


def from_html(page: str) -> dict[Key, Said]:
    """Every comparison row of the page's tables, under the attribute its column or else its section names."""
    parser = _Page()
    parser.feed(page)
    out = {}
    for section, rows in parser.tables:
        header = rows[0]
        if not {"metric", "groups", "value"} <= set(header):
            continue
        for row in rows[1:]:
            cell = dict(zip(header, row, strict=True))
            shown = f"{cell['value']} [" + (cell["95% interval"].strip("[]") if cell["95% interval"] != "—"
                                           else "—, —") + "]"  # fmt: skip
            shown = shown.replace(" estimated [", " [") + (" estimated" if " estimated" in cell["value"] else "")
            counts_as = cell.get("counts as", "(not shown)").split(",")[0].split(" ")[0]
            attribute = cell.get("attribute", section.removesuffix(" (proxy: true)"))  # a table of several
            out[(attribute, cell["metric"], cell["groups"])] = said(
                counts_as, shown, "insufficient samples" in cell.get("point estimate", ""),
                cell.get("evidence", "(none)"))  # fmt: skip
    return out


def from_stderr(err: str, report: dict) -> dict[Key, Said]:
    lines = err.splitlines()
    out = {}
    for r in report["results"]:
        head = f"  {r['status'].upper()} {r['severity']} {r['attribute']}"
        head += " (proxy: true)" if r.get("proxy") else ""
        head += f" {r['metric']} {r['groups']}: "
        (line,) = [x for x in lines if x.startswith(head)]
        rest = line[len(head):]
        m = re.search(r"; counts as (\w+)$", rest)
        counts_as = m[1] if m else "pass" if r["status"] == "pass" else r["severity"]  # point_estimate: by status
        out[(r["attribute"], r["metric"], r["groups"])] = said(
            counts_as, rest, "insufficient samples" in rest, re.search(r"evidence (\w+)", rest)[1])  # type: ignore[index]
    return out


COUNTS = {"passed": r"(\d+)(?:/| of )\d+ (?:checks |comparisons )?passed", "total": r"\d+(?:/| of )(\d+) ",
          "blocking": r"(\d+) blocking", "warning": r"(\d+) warning",
          "insufficient": r"(\d+) with insufficient samples",
          "inconclusive": r"(\d+) inconclusive"}  # fmt: skip


def counts_in(text: str) -> dict[str, int | None]:
    """The counts a format's summary line states (None for a count it does not state)."""
    found = {k: re.search(pattern, text) for k, pattern in COUNTS.items()}
    return {k: int(m[1]) if m else None for k, m in found.items()}


def counts_of(said: dict[Key, Said]) -> dict[str, int]:
    """The counts the comparisons themselves make."""
    values = list(said.values())
    return {"passed": sum(s.counts_as == "pass" for s in values), "total": len(values),
            "blocking": sum(s.counts_as == "blocking" for s in values),
            "warning": sum(s.counts_as == "warning" for s in values),
            "insufficient": sum(s.insufficient for s in values),
            "inconclusive": sum(s.evidence == "inconclusive" for s in values)}  # fmt: skip


def junit_counts(path: Path) -> dict[str, int | None]:
    suites = list(JUnitXml.fromfile(str(path)))
    run = {p.name: p.value for p in suites[0].properties()}
    tests, failures, skipped = (sum(getattr(s, k) for s in suites) for k in ("tests", "failures", "skipped"))
    return {"passed": tests - failures - skipped, "total": tests, "blocking": failures, "warning": skipped,
            "insufficient": int(run["insufficient_samples"]), "inconclusive": int(run["inconclusive"])}


SEED_CONFIG = ROOT / "tests" / "data" / "seed" / "bias-testing-config.yaml"
EVIDENCE_WARN = "decision: evidence\nfailure_policy: {inconclusive: warn}\n"


def seed_data(path: Path) -> Path:
    """The seed config's attributes with groups of very different sizes (some below min_samples), rates apart,
    and one ethnicity never selected (its impact ratios undefined)."""
    rng = np.random.default_rng(18)
    n = 4000
    gender = rng.choice(["male", "female", "non_binary"], n, p=[0.55, 0.43, 0.02])
    age = rng.choice(["18_29", "30_44", "45_59", "60_plus"], n, p=[0.3, 0.35, 0.3, 0.05])
    ethnicity = rng.choice(["white", "black", "hispanic", "asian", "other"], n, p=[0.5, 0.2, 0.15, 0.14, 0.01])
    label = rng.random(n) < 0.5
    prediction = (rng.random(n) < np.where(gender == "female", 0.35, 0.42) + 0.2 * label) & (ethnicity != "other")
    pd.DataFrame({"gender": gender, "age_group": age, "ethnicity": ethnicity, "prediction": prediction.astype(int),
                  "label": label.astype(int)}).to_csv(path, index=False)  # fmt: skip
    return path


def scenario(name: str, tmp_path: Path) -> tuple[Path, Path, list[str]]:
    """A config, its data and extra arguments: the shipped example and the seed's config, each under the seed's
    point-estimate rule and under decision: evidence (inconclusive results warning, or failing and overridden)."""
    example, seed = (ROOT / "examples" / "hiring-screener.yaml").read_text(), SEED_CONFIG.read_text()
    seed = seed.replace("s3://ml-audit-reports/", str(tmp_path / "filed") + "/")
    text, data = {
        "example": (example, ROOT / "examples" / "hiring-predictions.csv"),
        "example, evidence, inconclusive warns": (example.replace("failure_policy: {", "failure_policy: {inconclusive: "
                                                                  "warn, ") + "decision: evidence\n",
                                                  ROOT / "examples" / "hiring-predictions.csv"),
        "example, evidence, overridden": (example + "decision: evidence\n",
                                          ROOT / "examples" / "hiring-predictions.csv"),
        "seed": (seed, seed_data(tmp_path / "seed.csv")),
        "seed, evidence, inconclusive warns": (seed.replace("  report_destination", "  inconclusive: warn\n  "
                                                            "report_destination") + "decision: evidence\n",
                                               seed_data(tmp_path / "seed.csv")),
    }[name]  # fmt: skip
    (tmp_path / "c.yaml").write_text(text)
    extra = ["--override-justification", "known gap, tracked in TICKET-1", "--override-author", "a.reviewer"] \
        if "overridden" in name else []  # fmt: skip
    return tmp_path / "c.yaml", data, extra


@pytest.mark.parametrize("name", ["example", "example, evidence, inconclusive warns", "example, evidence, overridden",
                                  "seed", "seed, evidence, inconclusive warns"])  # fmt: skip
def test_every_format_says_the_same_of_every_comparison(
    name: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """JSON, Markdown, JUnit, HTML and the stderr summary of one run: per comparison what it counts as, its value
    and interval, whether it is estimated, insufficient, and its evidence; and the counts each states."""
    config, data, extra = scenario(name, tmp_path)
    out = tmp_path / "out"
    main(["audit", str(config), str(data), "--audit-log", str(tmp_path / "l.jsonl"), "--report", str(out / "r.json"),
          "--junit", str(out / "j.xml"), "--summary-md", str(out / "s.md"), "--html", str(out / "r.html"), *extra])
    err = capsys.readouterr().err
    report, md, page, truth = outputs(out)
    formats = {"Markdown": from_markdown(md), "JUnit": from_junit(out / "j.xml", report["model_id"]),
               "HTML": from_html(page), "stderr": from_stderr(err, report)}  # fmt: skip
    disagreements = [f"{fmt} {key}: {shown} where JSON {truth.get(key)}" for fmt, said in formats.items()
                     for key, shown in said.items() if shown != truth.get(key)]  # fmt: skip
    disagreements += [f"{fmt} lacks {key}" for fmt, said in formats.items() for key in truth if key not in said]
    assert disagreements == [], f"{len(disagreements)}: " + "\n".join(disagreements[:6])
    banner = re.search(r'<div class="verdict \w+"><strong>\w+</strong>([^<]*)', page)
    stated = {"Markdown": counts_in(md.splitlines()[2]), "JUnit": junit_counts(out / "j.xml"),
              "HTML": counts_in(html.unescape(banner[1]) if banner else ""), "stderr": counts_in(err.splitlines()[0])}
    assert {fmt: c for fmt, c in stated.items() if c != counts_of(truth)} == {}, counts_of(truth)


def outputs(out: Path) -> tuple[dict, str, str, dict[Key, Said]]:
    """A run's JSON report, Markdown summary and HTML page in ``out`` (r.json, s.md, r.html), and what the JSON says
    of each comparison, checked against the counts the JSON states."""
    report = json.loads((out / "r.json").read_text())
    md, page = (out / "s.md").read_text(), (out / "r.html").read_text()
    truth = from_json(report)
    assert counts_of(truth) == {k: report[f] for k, f in (
        ("passed", "passed"), ("total", "total_tests"), ("blocking", "blocking_failures"),
        ("warning", "warning_failures"), ("insufficient", "insufficient_samples"), ("inconclusive", "inconclusive"))}
    return report, md, page, truth
