"""Reports that CI systems read: JUnit XML and a Markdown summary, from the JSON reports of ``audit``, ``safety``,
``redteam`` and ``bias-report`` (or from the one-line error of a run that exits 2).

Each report becomes a :class:`CiReport` of :class:`Check` s (one per comparison, suite test or bias feature); one
renderer per format writes any of them. JUnit XML follows the Jenkins xUnit plugin's ``junit-10.xsd`` (the shape
pytest writes, read by Jenkins, GitLab, GitHub's report actions, Azure DevOps and Buildkite) plus ``<properties>``
on test cases, as pytest's ``record_property``, googletest and Playwright write them. A blocking failure is a
``<failure>``; a warning is a ``<skipped>`` whose message starts with ``warning``: JUnit has no warning state, every
CI counts and lists skipped cases with their reason, and a ``<failure>`` would fail the check of report actions
(dorny/test-reporter fails on any) for a result that by policy lets the model ship.
"""

from __future__ import annotations

import html
import json
import math
import re
import xml.etree.ElementTree as ET
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from exporter.core.attributes import titled
from exporter.core.conditional import CONDITIONAL_METRICS
from exporter.core.metric_table import METRICS
from exporter.gate.suite import BLOCKING_SEVERITY, UNMEASURED

Outcome = Literal["passed", "failed", "warning", "error"]
Properties = tuple[tuple[str, str], ...]

OUTCOME_CELL = {"passed": "✅ pass", "failed": "❌ blocking", "warning": "⚠️ warning", "error": "🛑 error"}
VERDICT_ICON = {"PASS": "✅", "FAIL": "❌", "OVERRIDDEN": "⚠️", "ERROR": "🛑"}
TITLES = {"audit": "Fairness audit", "safety": "Safety suite", "redteam": "Red-team suite",
          "bias-report": "Bias report"}  # fmt: skip
AUDIT_COLUMNS = ("attribute", "metric", "groups", "value [95% interval]", "threshold", "evidence")
SUITE_COLUMNS = ("test", "category", "severity", "details")
REDTEAM_COLUMNS = ("test", "category", "severity", "attempts", "baseline failures", "evasions", "attack success rate",
                   "details")  # fmt: skip
BIAS_COLUMNS = ("feature", "gap (max - min)", "threshold", "highest group [95% interval]",
                "lowest group [95% interval]")  # fmt: skip
# XML 1.0 cannot hold these characters (model outputs and attacked texts may); both formats write them as \xNN
_NOT_XML = re.compile("[^\t\n\r\x20-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]")
_DETAIL_CHARS = 160


@dataclass(frozen=True)
class Check:
    """One JUnit test case (its classname also names its test suite) and one row of the Markdown table."""

    classname: str
    name: str
    outcome: Outcome
    message: str
    cells: tuple[str, ...]
    properties: Properties = ()
    details: str = ""
    note: str = ""


@dataclass(frozen=True)
class CiReport:
    """What every CI format shows of one run: its verdict, facts about the run, and every check."""

    command: str
    subject: str
    verdict: str
    timestamp: str
    columns: tuple[str, ...]
    checks: tuple[Check, ...]
    properties: Properties = ()
    notes: tuple[str, ...] = ()
    appendix: tuple[str, ...] = ()
    """Markdown blocks after the checks' table (the audit's segment explanations)."""
    tally: tuple[str, ...] = ()
    """Counts after the outcomes' (the audit's insufficient and inconclusive comparisons), as the JSON counts them."""


def number(x: Any) -> str:
    """A number as the reports print it (4 places), ``n/a`` when there is none."""
    if isinstance(x, bool) or not isinstance(x, int | float) or not math.isfinite(x):
        return "n/a"
    return f"{x:.4f}"


def with_interval(value: Any, interval: Any) -> str:
    """``0.2760 [0.1970, 0.3530]``: a number and its 95% interval."""
    lo, hi = interval if isinstance(interval, list | tuple) and len(interval) == 2 else (None, None)
    return f"{number(value)} [{number(lo)}, {number(hi)}]"


def _text(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return repr(value) if isinstance(value, float) else str(value)


def _brief(value: Any) -> str:
    return f"{value:.4g}" if isinstance(value, float) else _text(value)


def flatten(record: Mapping[str, Any], prefix: str = "", text: Callable[[Any], str] = _text) -> Properties:
    """Every scalar of a record as (name, text) pairs: nested mappings by dotted names, a 95% interval as
    ``.lower`` / ``.upper``, lists of scalars as ``[a, b]``; None, empty lists and lists of records are left
    out. Floats keep every digit (``text`` may shorten them)."""
    out: list[tuple[str, str]] = []
    for key, value in record.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            out.extend(flatten(value, f"{name}.", text))
        elif isinstance(value, list | tuple):
            if key.startswith("ci_") and len(value) == 2:
                out.extend((f"{name}.{end}", text(v)) for end, v in zip(("lower", "upper"), value, strict=True)
                           if v is not None)  # fmt: skip
            elif value and all(isinstance(v, str | int | float) for v in value):
                out.append((name, "[" + ", ".join(text(v) for v in value) + "]"))
        elif value is not None:
            out.append((name, text(value)))
    return tuple(out)


def _run_properties(report: Mapping[str, Any]) -> Properties:
    """The run's own facts (model, verdict, files and their hashes, audit-log head): the report's scalars and
    its one-level records, without the per-check lists and the per-group tables."""
    skip = {"results", "attributes", "impact_ratios", "explanations", "segment_values"}
    return flatten({k: v for k, v in report.items() if k not in skip})


def shown_value(r: Mapping[str, Any]) -> Any:
    """A result's value as every format shows it: the exact value where ``value`` is null for too few samples (a
    hidden number hides what the reader needed; every format marks it insufficient beside it, saying why)."""
    return r["value"] if r.get("value") is not None else r.get("exact_value")


def role(counts_as: str, overridden: bool) -> str:
    """What a result's ``counts_as`` does to the verdict, as JUnit's message and the HTML page say it."""
    return {"pass": "pass", "warning": "warning (does not block)"}.get(
        counts_as, "blocking, overridden" if overridden else "blocking")


def estimated_value(shown: str, r: Mapping[str, Any]) -> str:
    """A result's value as every report shows it: marked ``estimated`` when no label was seen, so an estimated
    number is never shown as an observed one (docs/auditor/estimated.md)."""
    return f"{shown} estimated" if r.get("estimated") else shown


def estimation_basis(report: Mapping[str, Any]) -> list[str]:
    """What an audit's estimated results rest on (none without one), from the report's ``estimation`` section: the
    reference they were calibrated on and the assumption that must hold for them to be the labels' numbers."""
    estimation = report.get("estimation")
    if not estimation or not any(r.get("estimated") for r in report["results"]):
        return []
    sha = estimation.get("manifest_sha256")
    return [f"Estimated results (marked estimated): no label in the audited data; each is estimated from the "
            f"scores, calibrated per group on the reference {estimation.get('file') or '(in memory)'}"
            + (f" (manifest sha256 {sha})" if sha else "") + f", {estimation.get('labelled_rows')} labelled rows. "
            f"Assumption: {estimation.get('assumption')}."]  # fmt: skip


def from_audit(report: Mapping[str, Any]) -> CiReport:
    """One check per comparison of an audit report."""
    overridden = report.get("verdict") == "OVERRIDDEN"
    checks = tuple(_comparison(str(report["model_id"]), r, report.get("min_samples"), overridden)
                   for r in report["results"])  # fmt: skip
    notes = estimation_basis(report)
    if report.get("override"):
        o = report["override"]
        notes.append(f"Overridden by {o.get('author')}: {o.get('justification')}")
    tally = (f"{report.get('insufficient_samples')} with insufficient samples",
             f"{report.get('inconclusive')} inconclusive (decision: {report.get('decision')})")  # fmt: skip
    return CiReport("audit", str(report["model_id"]), str(report["verdict"]), str(report.get("timestamp", "")),
                    AUDIT_COLUMNS, checks, _run_properties(report), (*notes, *_log_note(report)),
                    tuple(_explanation(e) for e in report.get("explanations", ())), tally)  # fmt: skip


EXPLAINED_ROWS = 8
"""Segments of an explanation the Markdown table shows, the largest first."""


def _explanation(e: Mapping[str, Any]) -> str:
    """One explanation as Markdown: its sentence, then a table of its largest terms, each with a bar of its size."""
    top = e["segments"][:EXPLAINED_ROWS]
    scale = max([abs(s[k]) for s in top for k in ("mix", "rate")] + [1e-12])
    bar = lambda x: ("🟥" if x < 0 else "🟦") * round(8 * abs(x) / scale)  # noqa: E731
    lines = [f"#### {_cell(e['attribute'])} · {_cell(e['metric'])} · {_cell(e['comparison'])}", "",
             _cell(e["summary"]), ""]  # fmt: skip
    if top:
        lines += ["| segment | mix [95% interval] | | rate [95% interval] | |", "|---|---|---|---|---|"]
        lines += [f"| {_cell(str(s['column']))}={_cell(str(s['value']))} | {with_interval(s['mix'], s['mix_ci_95'])} "
                  f"| {bar(s['mix'])} | {with_interval(s['rate'], s['rate_ci_95'])} | {bar(s['rate'])} |"
                  for s in top]  # fmt: skip
    return "\n".join(lines)


def _comparison(model_id: str, r: Mapping[str, Any], min_samples: Any, overridden: bool) -> Check:
    shown = estimated_value(with_interval(shown_value(r), r.get("ci_95")), r)
    metric = METRICS.get(r["metric"]) or CONDITIONAL_METRICS.get(r["metric"])
    side = "" if metric is None else ("≤ " if metric.kind == "difference" else "≥ ")
    threshold = f"{side}{r['threshold']}"
    evidence = str(r.get("evidence"))
    reasons = [insufficient(r, min_samples)] if r.get("status") == "insufficient_samples" else []
    if evidence == "inconclusive" and r.get("samples_to_decide"):
        need, unit = r["samples_to_decide"], r.get("samples_to_decide_counts")  # the counterfactual's: items
        per_group = ", ".join(f"{g} {n}" for g, n in need.items())
        evidence = f"inconclusive (decided at about {max(need.values())} {unit})" if unit else \
            f"inconclusive (decided at about {per_group} per group)"  # fmt: skip
    outcome: Outcome = "passed" if r["counts_as"] == "pass" else "warning" if r["counts_as"] == "warning" else "failed"
    proxy = ["proxy: true (groups inferred by BISG, rates posterior-weighted)"] if r.get("proxy") else []
    message = "; ".join([f"{role(r['counts_as'], overridden)}: {shown}, threshold {threshold}, evidence {evidence}",
                         *reasons, *proxy])  # fmt: skip
    samples = ", ".join(f"{g} {n}" for g, n in (r.get("samples") or {}).items())
    details = (f"{r['attribute']} {r['metric']} {r['groups']}: samples {samples} (support {r.get('support')}), "
               f"severity {r.get('severity')}, point estimate passes: {_text(r.get('passed'))}")
    attribute = titled(str(r["attribute"]), r.get("proxy"))
    cells = (attribute, str(r["metric"]), str(r["groups"]), shown, threshold, evidence)
    return Check(f"{model_id}.{r['attribute']}", f"{r['metric']} {r['groups']}", outcome, message,
                 cells, flatten(r), details, "; ".join(reasons))


def insufficient(r: Mapping[str, Any], min_samples: Any) -> str:
    """Why a result has too few samples, as every format says it: which count fell short of min_samples (the
    counterfactual's results name their unit in ``support_counts``), or that the metric is undefined."""
    support, known = r.get("support"), METRICS.get(r["metric"]) or CONDITIONAL_METRICS.get(r["metric"])
    if isinstance(support, int) and isinstance(min_samples, int) and support < min_samples:
        counted = (f"the smallest count of {known.counted} in a group is {support}" if known is not None and
                   not r.get("support_counts") else f"{support} {r.get('support_counts') or 'counted'}")  # fmt: skip
        return f"insufficient samples: {counted}, below min_samples {min_samples}"
    return "insufficient samples: the metric is undefined on these groups (a compared rate is 0 in a group)"


def _log_note(report: Mapping[str, Any]) -> tuple[str, ...]:
    log = report.get("audit_log") or {}
    return (f"Audit log head `{log['hash']}` (record {log.get('seq')} of {log.get('path')})",) if log.get("hash") \
        else ()  # fmt: skip


def from_suite(report: Mapping[str, Any]) -> CiReport:
    """One check per test of a safety or red-team report: a failed critical test blocks, any other warns. A red-team
    test shows its attempts, baseline failures (plain texts already wrong), evasions and attack success rate; the
    run's attempts that measured nothing (errors, attacks that changed nothing) are counted after the outcomes."""
    checks = []
    redteam = report["suite"] == "redteam" and "evasions" in report  # a report from before the split has none
    for r in report["results"]:
        outcome: Outcome = "passed" if r["passed"] else ("failed" if r["severity"] == BLOCKING_SEVERITY
                                                         else "warning")  # fmt: skip
        details = r.get("details") or {}
        short = _short(details)
        role = {"passed": "pass", "failed": f"{r['severity']} failure, blocks",
                "warning": f"warning ({r['severity']} failure, does not block)"}[outcome]  # fmt: skip
        said = details.get("summary") or short
        split = _attack_cells(details) if redteam else ()
        checks.append(Check(f"{report['model_id']}.{report['suite']}.{r['category']}", str(r["test_name"]), outcome,
                            f"{role}: {said}" if said else role,
                            (str(r["test_name"]), str(r["category"]), str(r["severity"]), *split, short),
                            (("category", str(r["category"])), ("severity", str(r["severity"])), *flatten(details)),
                            json.dumps(details, indent=2, ensure_ascii=False, default=str)))  # fmt: skip
    return CiReport(str(report["suite"]), str(report["model_id"]), str(report["verdict"]),
                    str(report.get("timestamp", "")), REDTEAM_COLUMNS if redteam else SUITE_COLUMNS, tuple(checks),
                    _run_properties(report), _log_note(report),
                    tally=tuple(f"{report[key]} {said}" for key, said in UNMEASURED if report.get(key)))  # fmt: skip


def _attack_cells(details: Mapping[str, Any]) -> tuple[str, str, str, str]:
    """A red-team result's attempts, baseline failures, evasions and attack success rate (``—`` where the result
    has none: baseline_detection counts plain texts only)."""
    rate = details.get("attack_success_rate")
    return (_text(details.get("attempts", details.get("plain_texts_judged", "—"))),
            _text(details.get("baseline_failures", "—")), _text(details.get("evasions", "—")),
            "—" if "evasions" not in details else number(rate))  # fmt: skip


def _short(details: Mapping[str, Any]) -> str:
    """A test's details in one line (``attempts=10, failed_attempts=3``), cut at a readable length."""
    text = ", ".join(f"{k}={v}" for k, v in flatten(details, text=_brief))
    return text if len(text) <= _DETAIL_CHARS else text[: _DETAIL_CHARS - 1] + "…"


def from_bias(reports: Mapping[str, Mapping[str, Mapping[str, Any]]], timestamp: str) -> CiReport:
    """One check per feature and data file of ``bias-report``: a gap above the threshold blocks (exit 1)."""
    checks = []
    for source, features in reports.items():
        for feature, r in features.items():
            high, low = _group(r, r["highest_group"]), _group(r, r["lowest_group"])
            outcome: Outcome = "failed" if r["is_biased"] else "passed"
            unmeasured = "; ".join(f"{g} not compared: no outcome values in its {n} rows"
                                   for g, n in r["groups_without_outcome"].items())  # fmt: skip
            message = (f"{'biased' if r['is_biased'] else 'pass'}: gap {number(r['fairness_gap'])} "
                       f"{'>' if r['is_biased'] else '≤'} threshold {r['threshold']}; highest {high}, lowest {low}"
                       + (f"; {unmeasured}" if unmeasured else ""))  # fmt: skip
            details = "\n".join(f"{r['outcome']} mean of {_group(r, g)}, {r['interval_method']} interval"
                                for g in r["group_stats"])  # fmt: skip
            checks.append(Check(f"bias-report.{source}", str(feature), outcome, message,
                                (str(feature), number(r["fairness_gap"]), str(r["threshold"]), high, low),
                                (("source", source), *flatten(r)), details, unmeasured))  # fmt: skip
    verdict = "FAIL" if any(c.outcome == "failed" for c in checks) else "PASS"
    return CiReport("bias-report", ", ".join(reports), verdict, timestamp, BIAS_COLUMNS, tuple(checks),
                    (("verdict", verdict), ("sources", ", ".join(reports))))  # fmt: skip


def _group(r: Mapping[str, Any], g: str) -> str:
    """``female 0.3100 [0.2700, 0.3500] (n=500)``: a group's mean outcome, its interval and its size."""
    return f"{g} {with_interval(r['group_stats'][g], r['group_intervals'].get(g))} (n={r['group_sizes'].get(g)})"


def from_error(command: str, subject: str, message: str, timestamp: str) -> CiReport:
    """A run that could not evaluate anything (exit 2): one errored check, so no CI shows it as passed."""
    check = Check(f"{subject}.{command}", "run", "error", message, ("run", message))
    return CiReport(command, subject, "ERROR", timestamp, ("check", "error"), (check,), (("verdict", "ERROR"),))


def _xml_safe(text: str) -> str:
    return _NOT_XML.sub(lambda m: f"\\x{ord(m.group()):02x}", text)


def _add_properties(parent: ET.Element, properties: Properties) -> None:
    if properties:
        node = ET.SubElement(parent, "properties")
        for name, value in properties:
            ET.SubElement(node, "property", name=_xml_safe(name), value=_xml_safe(value))


def _counts(checks: Iterable[Check]) -> dict[str, str]:
    checks = list(checks)
    n = {o: sum(c.outcome == o for c in checks) for o in ("failed", "error", "warning")}
    return {"tests": str(len(checks)), "failures": str(n["failed"]), "errors": str(n["error"]),
            "skipped": str(n["warning"])}  # fmt: skip


def junit_xml(report: CiReport) -> str:
    """The report as JUnit XML: a ``<testsuite>`` per attribute (audit), category (suites) or data file (bias),
    a ``<testcase>`` per check. The gate does not time its checks: every ``time`` is 0."""
    name = f"fairness-exporter {report.command} {report.subject}"
    counts = _counts(report.checks)
    root = ET.Element("testsuites", name=_xml_safe(name), tests=counts["tests"], failures=counts["failures"],
                      errors=counts["errors"], time="0")  # fmt: skip
    suites: dict[str, list[Check]] = {}
    for check in report.checks:
        suites.setdefault(check.classname, []).append(check)
    for suite, checks in suites.items():
        classname = _xml_safe(suite)  # GitLab shows a case's classname as its suite
        node = ET.SubElement(root, "testsuite", {"name": classname, **_counts(checks), "time": "0",
                                                 "timestamp": report.timestamp})  # fmt: skip
        _add_properties(node, report.properties)
        for check in checks:
            case = ET.SubElement(node, "testcase", name=_xml_safe(check.name), classname=classname, time="0")
            _add_properties(case, check.properties)
            tag = {"failed": "failure", "warning": "skipped", "error": "error"}.get(check.outcome)
            body = ET.SubElement(case, tag or "system-out")
            if tag:
                body.set("message", _xml_safe(check.message))
                body.set("type", {"failed": "blocking", "warning": "warning", "error": "error"}[check.outcome])
            body.text = _xml_safe(f"{check.message}\n{check.details}".strip())
    ET.indent(root)
    return ET.tostring(root, encoding="unicode", xml_declaration=True)


def _cell(text: str) -> str:
    return html.escape(_xml_safe(text), quote=False).replace("|", "&#124;").replace("\n", " ")


def _outcome_cell(report: CiReport, check: Check) -> str:
    overridden = " (overridden)" if check.outcome == "failed" and report.verdict == "OVERRIDDEN" else ""
    return OUTCOME_CELL[check.outcome] + overridden + (f": {check.note}" if check.note else "")


def markdown(report: CiReport) -> str:
    """The report as a Markdown table for a GitHub job summary or a merge-request note: the verdict first, then
    every check with its outcome."""
    counts = {o: sum(c.outcome == o for c in report.checks) for o in OUTCOME_CELL}
    title = TITLES.get(report.command, report.command)
    lines = [f"### {VERDICT_ICON.get(report.verdict, '')} {title}: {report.verdict} — {_cell(report.subject)}", "",
             f"{counts['passed']} of {len(report.checks)} checks passed, {counts['failed']} blocking, "
             f"{counts['warning']} warning(s)" + (f", {counts['error']} error(s)" if counts["error"] else "")
             + (f"; {', '.join(report.tally)}" if report.tally else "") + ".",
             *(f"\n{_cell(note)}" for note in report.notes), "",
             "| " + " | ".join((*report.columns, "outcome")) + " |",
             "|" + "---|" * (len(report.columns) + 1)]  # fmt: skip
    lines += ["| " + " | ".join(_cell(c) for c in (*check.cells, _outcome_cell(report, check))) + " |"
              for check in report.checks]  # fmt: skip
    if report.appendix:
        lines += ["", "### Why the gaps moved (segment explanations)", *(f"\n{block}" for block in report.appendix)]
    return "\n".join(lines)
