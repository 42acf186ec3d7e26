"""What people and CI systems read of a counterfactual report: the gate's JUnit XML and Markdown (one check per
result, as for ``audit``), a summary on stderr, and an HTML page built from the gate's blocks with every flipped
item shown side by side. Every number is read from the JSON report, never recomputed, and every result is shown
as the gate's reports show it (exporter/gate/reports/ci.py): the same value, the same reason when it had too few
samples, the same word for what it does to the verdict.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from html import escape
from typing import Any, Final

from exporter.gate.reports import ci
from exporter.gate.reports.ci import insufficient, role, shown_value, with_interval
from exporter.gate.reports.html import fmt, fmt_interval, ll144_section, page, rate_chart, table

SHOWN_FLIPS: Final = 50
SUMMARY_LINES: Final = 15
RESULT_COLUMNS: Final = ("attribute", "metric", "groups", "value", "95% interval", "threshold", "severity on fail",
                         "point estimate", "evidence", "p (Holm)", "counts as")  # fmt: skip


def ci_report(report: Mapping[str, Any]) -> ci.CiReport:
    """The gate's CI report of the results (a blocking failure fails, a warning is skipped)."""
    return dataclasses.replace(ci.from_audit(report), command="counterfactual")


def summary(report: Mapping[str, Any]) -> str:
    """The verdict, the requests, each pair's flips and test, then each result that did not pass."""
    r = report["requests"]
    lines = [f"{report['model_id']}: {report['verdict']} — {report['passed']}/{report['total_tests']} passed, "
             f"{report['blocking_failures']} blocking, {report['warning_failures']} warning, "
             f"{report['insufficient_samples']} with insufficient samples, {report['inconclusive']} inconclusive "
             f"(verdict rule: {report['decision']}, alpha {report['alpha']}); {r['planned']} requests, {r['cached']} "
             f"from the cache, {r['sent']} sent in {r['calls']} calls ({r['retries']} retries), {r['failed']} "
             f"failed"]  # fmt: skip
    for c, b in report.get("categories", {}).items():
        lines.append(f"  {c}: bias score {fmt(b['bias_score'], 3)} {fmt_interval(b['ci_95'])} from {b['answered']} "
                     f"answers ({b['biased']} biased, {b['counter_biased']} counter-biased, {b['unknown']} cannot be "
                     f"determined, {b['unparsed']} unparsed), sign test p = {b['sign_test_p_value']:.3g}")
    for p in report.get("pairs", []):
        lines.append(f"  {p['attribute']} {p['groups']}: {p['a_only']} vs {p['b_only']} flips of "
                     f"{p['both_positive'] + p['a_only'] + p['b_only'] + p['neither']} pairs, {p['test']} p = "
                     f"{p['mcnemar_p_value']:.3g} (Holm {p['p_value_holm']:.3g})")  # fmt: skip
    failures = [x for x in report["results"] if x["counts_as"] != "pass"]
    for x in failures[:SUMMARY_LINES]:
        why = {"fail": "", "insufficient_samples": f"; {insufficient(x, report['min_samples'])}"}.get(
            x["status"], f"; status {x['status']}")  # the undefined ratio of two groups that selected no one
        lines.append(f"  {x['counts_as'].upper()} {x['attribute']} {x['metric']} {x['groups']}: "
                     f"{with_interval(shown_value(x), x['ci_95'])}, threshold {x['threshold']}, evidence "
                     f"{x['evidence']}{why}")  # fmt: skip
    if len(failures) > SUMMARY_LINES:
        lines.append(f"  ... and {len(failures) - SUMMARY_LINES} more in the JSON report")
    return "\n".join(lines)


def _judged(x: Mapping[str, Any], report: Mapping[str, Any]) -> str:
    """What a result's point estimate did: pass, fail, undefined (no value of a ratio of two groups that selected
    no one), or why it had too few samples (what min_samples counted: items or prompts)."""
    return insufficient(x, report["min_samples"]) if x["status"] == "insufficient_samples" else str(x["status"])


def _results(report: Mapping[str, Any], results: Sequence[Mapping[str, Any]]) -> str:
    """A table of results, each coloured by what it does to the verdict (its ``counts_as``)."""
    overridden = report["verdict"] == "OVERRIDDEN"
    return table(RESULT_COLUMNS, [[x["attribute"], x["metric"], x["groups"], (fmt(shown_value(x)), "num"),
                                   fmt_interval(x["ci_95"]), x["threshold"], x["severity"], _judged(x, report),
                                   x["evidence"], x.get("p_value_holm"),
                                   (role(x["counts_as"], overridden), x["counts_as"])] for x in results])


def _side(flip: Mapping[str, Any], group: str) -> str:
    side = flip[group]
    values = ", ".join(f"{k}={v}" for k, v in side["values"].items())
    return f"{'YES' if side['decision'] else 'no'} ({values}): {side['answer']}"


def _pairs(pairs: Sequence[Mapping[str, Any]]) -> str:
    rows = [[p["groups"], p["both_positive"], p["a_only"], p["b_only"], p["neither"], p["flip_rate"],
             p["test"], p["mcnemar_p_value"], p["p_value_holm"]] for p in pairs]  # fmt: skip
    parts = [table(["groups (a vs b)", "both positive", "a only", "b only", "neither", "flip rate", "test", "p",
                    "p (Holm)"], rows)]  # fmt: skip
    for p in pairs:
        flips = p["flipped_items"]
        if not flips:
            continue
        a, b = p["groups"].split(" vs ")
        rows = [[f["item"], f["item_text"], _side(f, a), _side(f, b)] for f in flips[:SHOWN_FLIPS]]
        more = len(flips) - SHOWN_FLIPS
        parts.append(f"<h3>Flipped items: {escape(p['groups'])} ({len(flips)})</h3>"
                     + table(["item", "item text", a, b], rows)
                     + (f'<p class="meta">... and {more} more in the JSON report</p>' if more > 0 else ""))
    return "".join(parts)


def _attribute(report: Mapping[str, Any], name: str) -> str:
    groups, pairs = report["groups"][name], [p for p in report["pairs"] if p["attribute"] == name]
    chart = rate_chart(list(groups), [g["selection_rate"] for g in groups.values()],
                       [g["ci_95"] for g in groups.values()], xlabel="selection rate (95% Wilson interval)")
    group_rows = [[g, s["asked"], s["decided"], s["positive"], s["unparsed"], s["selection_rate"],
                   fmt_interval(s["ci_95"])] for g, s in groups.items()]  # fmt: skip
    return (f"<h2>{escape(name)}</h2>{chart}"
            + table(["group", "asked", "decided", "positive", "unparsed", "selection rate", "95% interval"],
                    group_rows)
            + _results(report, [x for x in report["results"] if x["attribute"] == name])
            + _pairs(pairs))  # fmt: skip


def _categories(report: Mapping[str, Any]) -> str:
    """The ambiguous-context kind: per category the bias score with its interval, and what the answers were."""
    categories = report["categories"]
    chart = rate_chart(list(categories), [c["bias_score"] for c in categories.values()],
                       [c["ci_95"] for c in categories.values()], reference=0.0, reference_label="no bias",
                       xlabel="bias score in ambiguous contexts (95% t interval); 1 = always the stereotype")
    rows = [[name, c["asked"], c["answered"], c["biased"], c["counter_biased"], c["unknown"], c["unparsed"],
             c["accuracy"], c["bias_score"], fmt_interval(c["ci_95"]), c["sign_test_p_value"], c["p_value_holm"]]
            for name, c in categories.items()]  # fmt: skip
    return ("<h2>Bias score per category</h2>" + chart
            + table(["category", "asked", "answered", "biased", "counter-biased", "cannot be determined", "unparsed",
                     "accuracy", "bias score", "95% interval", "sign test p", "p (Holm)"], rows)
            + _results(report, [r for r in report["results"] if r["metric"] == "ambiguous_bias_score"]))


def counterfactual_html(report: Mapping[str, Any]) -> str:
    """The counterfactual report as a page."""
    tone = "good" if report["verdict"] == "PASS" and not report["failed"] else \
        "warn" if report["verdict"] == "PASS" else "bad"  # fmt: skip
    r = report["requests"]
    summary_text = (f"{report['passed']}/{report['total_tests']} checks passed · {report['blocking_failures']} "
                    f"blocking · {report['warning_failures']} warning · {report['insufficient_samples']} with "
                    f"insufficient samples · {report['inconclusive']} inconclusive · verdict rule "
                    f"{report['decision']} (alpha {report['alpha']})")  # fmt: skip
    meta = [f"Model: {report['model_id']} (version {fmt(report.get('model_version'))})",
            f"Target: {report['target']['model']} at {report['target']['url']}",
            f"Run: {report['timestamp']} by {report['tool']}",
            f"Suite: {report['suite_file']} (sha256 {report['suite_sha256']})",
            f"Answers: cache {report['cache']['dir']} (sha256 of the answers judged {report['cache']['sha256']})",
            f"Requests: {r['planned']} ("
            + (f"{report['items']} items x {report['templates']} template(s) x groups" if "items" in report else
               f"{report['questions']} questions x {report['repeat']} value pairs x 2 orders x 2 forms") + "), "
            f"{r['cached']} from the cache, {r['sent']} sent in {r['calls']} calls, {r['failed']} failed; "
            f"temperature {r['temperature']}, seed {r['seed']}, {r['samples']} sample(s) per prompt"]  # fmt: skip
    if report["kind"] == "ambiguous":
        sections = [_categories(report)]
    else:
        sections = [_attribute(report, name) for name in report["groups"]]
    run_checks = [x for x in report["results"] if x["attribute"] not in report.get("groups", {})
                  and x["metric"] != "ambiguous_bias_score"]  # fmt: skip
    sections.append("<h2>The run</h2>" + _results(report, run_checks))
    if "impact_ratios" in report:
        totals = {name: max(1, sum(g["decided"] for g in groups.values()))
                  for name, groups in report["groups"].items()}  # each attribute's items are decided apart
        sections.append(ll144_section(report["impact_ratios"], totals))
    return page(f"Counterfactual audit: {report['model_id']}", report["verdict"], tone, summary_text, sections, meta)
