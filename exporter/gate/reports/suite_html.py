"""The safety and red-team reports as HTML pages, from the blocks of :mod:`exporter.gate.reports.html` (``page``,
``table``): the verdict, one row per test, then for each red-team test with a finding its evasions and baseline
failures apart, every attacked text as it was sent (invisible characters shown by their code points).

Every number is read from the JSON report the command prints, never recomputed.
"""

from __future__ import annotations

import unicodedata
from collections.abc import Mapping
from html import escape
from typing import Any, Final

from exporter.gate.reports.html import fmt, page, table
from exporter.gate.suite import unmeasured

TITLES: Final = {"safety": "Safety suite", "redteam": "Red-team suite"}
SHOWN_ATTEMPTS: Final = 50
FINDINGS: Final = {"evasion": "evasion", "baseline_failure": "baseline failure", "error": "error (not judged)",
                   "unaltered": "attack changed nothing (not counted)"}


def visible(text: Any) -> str:
    """A text as sent, with each invisible format character (Unicode category Cf) written as ``<U+200B>``."""
    if text is None:
        return "—"
    return "".join(f"<U+{ord(c):04X}>" if unicodedata.category(c) == "Cf" else c for c in str(text))


def _tone(report: Mapping[str, Any]) -> str:
    if report["verdict"] != "PASS":
        return "bad"
    return "warn" if report["failed"] else "good"


def _row(report: Mapping[str, Any], r: Mapping[str, Any]) -> list[Any]:
    d = r["details"]
    head = [r["test_name"], r["category"], r["severity"], "pass" if r["passed"] else "fail"]
    if report["suite"] != "redteam":
        return [*head, d.get("summary", "")]
    rate = d.get("attack_success_rate")
    return [*head, d.get("attempts", d.get("plain_texts_judged")), d.get("baseline_failures"), d.get("evasions", "—"),
            "—" if "evasions" not in d else "n/a" if rate is None else rate, d.get("summary", "")]  # fmt: skip


def _attempts(r: Mapping[str, Any]) -> str:
    """A red-team test's attempts with a finding: evasions first, then baseline failures, errors (the error in
    place of the decision) and attacks that changed nothing."""
    failures = sorted(r["details"].get("failures", []), key=lambda f: f.get("finding") != "evasion")
    if not failures:
        return ""
    rows = [[FINDINGS.get(f.get("finding"), str(f.get("finding"))), visible(f["original_text"]),
             str(f["original_decision"] or f.get("original_error") or "—"), visible(f["attacked_text"]),
             str(f["attacked_decision"] or f.get("attacked_error") or "—")]
            for f in failures[:SHOWN_ATTEMPTS]]  # fmt: skip
    more = len(failures) - SHOWN_ATTEMPTS
    note = f'<p class="meta">... and {more} more in the JSON report</p>' if more > 0 else ""
    return (f"<h3>{escape(r['test_name'])}</h3><p class=\"meta\">{escape(r['details'].get('summary', ''))}</p>"
            + table(["finding", "plain text", "plain decision", "attacked text (as sent)", "attacked decision"], rows)
            + note)


def suite_html(report: Mapping[str, Any]) -> str:
    """A safety or red-team report as a page."""
    redteam = report["suite"] == "redteam"
    summary = f"{report['passed']}/{report['total_tests']} tests passed · {report['critical_failures']} critical " \
              "failure(s)"  # fmt: skip
    if redteam:
        summary += (f" · {report['evasions']} evasion(s) and {report['baseline_failures']} baseline failure(s) in "
                    f"{report['attempts']} attempts{unmeasured(report)}")  # fmt: skip
    meta = [f"Model: {report['model_id']} (version {fmt(report.get('model_version'))})",
            f"Run: {report['timestamp']} by {report['tool']}, seed {report['seed']}",
            f"Config: {report.get('config_file')} (sha256 {report.get('config_sha256')})"]  # fmt: skip
    if redteam:
        meta.append(f"Target: {report.get('target')} ({report.get('target_kind')})")
        meta.append("An evasion is an attempt whose plain text got the expected outcome and whose attacked text did "
                    "not; a baseline failure is a plain text that already got the wrong one.")  # fmt: skip
    columns = ["test", "category", "severity", "outcome"]
    columns += ["attempts", "baseline failures", "evasions", "attack success rate", "summary"] if redteam \
        else ["summary"]  # fmt: skip
    sections = ["<h2>Tests</h2>" + table(columns, [_row(report, r) for r in report["results"]])]
    if redteam:
        found = "".join(_attempts(r) for r in report["results"])
        sections.append("<h2>Evasions and baseline failures</h2>" + (found or "<p>None.</p>"))
    return page(f"{TITLES[report['suite']]}: {report['model_id']}", report["verdict"], _tone(report), summary,
                sections, meta)  # fmt: skip
