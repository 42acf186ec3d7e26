"""Self-contained HTML reports: the verdict first, then per attribute a chart and the tables behind it.

Every number shown is read from a JSON report dict (the one the command prints), only formatted, never
recomputed. Pages are built from three blocks -- :func:`page`, :func:`rate_chart` and :func:`table` -- so a new
report kind is one more ``*_html(report)`` function over its own dict. Plots are inline SVG drawn
by matplotlib's SVG backend (a bare Figure, no pyplot state) with text as paths: the file needs no network and no fonts.
"""

from __future__ import annotations

import io
from collections.abc import Mapping, Sequence
from datetime import datetime
from html import escape
from typing import Any

from exporter.core.attributes import titled
from exporter.gate.reports.ci import estimated_value, estimation_basis, insufficient, role, shown_value

MATPLOTLIB_HINT = "HTML reports need matplotlib: pip install 'fairness-exporter[reports]'"

CSS = """
body{font-family:system-ui,-apple-system,'Segoe UI',Roboto,sans-serif;margin:2rem auto;max-width:1100px;color:#1d2430;
padding:0 1rem}
h1{font-size:1.6rem;margin-bottom:.3rem}h2{margin-top:2.2rem;border-bottom:2px solid #e2e6ec;padding-bottom:.3rem}
.verdict{padding:1rem 1.4rem;border-radius:8px;font-size:1.25rem;margin:1rem 0}
.verdict strong{font-size:1.8rem;margin-right:1rem}
.good{background:#e3f4e8;border-left:8px solid #1e8e3e}.bad{background:#fde8e7;border-left:8px solid #c5221f}
.warn{background:#fff4d6;border-left:8px solid #e09a00}
table{border-collapse:collapse;margin:.8rem 0;font-size:.92rem}
th,td{border:1px solid #d5dae1;padding:.3rem .6rem;text-align:left}th{background:#f1f3f6}
td.num{text-align:right;font-variant-numeric:tabular-nums}td.pass{color:#1e8e3e;font-weight:600}
td.fail,td.blocking{color:#c5221f;font-weight:600}td.inconclusive,td.warning{color:#a86b00;font-weight:600}
.meta{color:#5b6472;font-size:.9rem}.chart svg{max-width:100%;height:auto}
"""

BAR, BAR_OUT, REFERENCE, BAND, FIRING = "#4a78b5", "#d9822b", "#1d2430", "#9fd3a8", "#c5221f"


def fmt(value: Any, places: int = 4) -> str:
    """A report value for display: numbers to ``places`` decimals, None as an em dash."""
    if value is None:
        return "—"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return f"{value:.{places}f}"
    return str(value)


def fmt_interval(bounds: Sequence[float | None] | None) -> str:
    """``[lo, hi]`` for display."""
    if not bounds or bounds[0] is None or bounds[1] is None:
        return "—"
    return f"[{fmt(bounds[0])}, {fmt(bounds[1])}]"


def table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """An HTML table; numbers right-aligned, a cell whose text is pass/fail/inconclusive coloured, a cell given as
    ``(text, class)`` of that class (a comparison's ``counts as``, coloured by what it does to the verdict)."""
    head = "".join(f"<th>{escape(h)}</th>" for h in headers)
    body = []
    for row in rows:
        cells = []
        for cell in row:
            cell, cls = cell if isinstance(cell, tuple) else (cell, "")
            text = cell if isinstance(cell, str) else fmt(cell)
            if text in ("pass", "fail", "inconclusive"):
                cls = text
            elif isinstance(cell, int | float) and not isinstance(cell, bool):
                cls = cls or "num"
            cells.append(f'<td class="{cls}">{escape(text)}</td>' if cls else f"<td>{escape(text)}</td>")
        body.append("<tr>" + "".join(cells) + "</tr>")
    return f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>"


def fmt_samples(samples: Mapping[str, int] | None) -> str:
    """``samples_to_decide`` for display: ``a 1,234 · b 567``, an em dash when there is none."""
    return " · ".join(f"{g} {n:,}" for g, n in samples.items()) if samples else "—"


def rate_chart(
    groups: Sequence[str],
    values: Sequence[float | None],
    intervals: Sequence[Sequence[float | None]],
    *,
    xlabel: str,
    reference: float | None = None,
    reference_label: str = "",
    band: tuple[float, float] | None = None,
    band_label: str = "",
    flag_outside: bool = False,
) -> str:
    """Horizontal bars of one value per group with interval whiskers, a reference line and a threshold band, as
    an inline ``<svg>``. With ``flag_outside`` (when the band is the pass criterion) bars outside it are orange.
    Groups without a value are labelled "no data" instead of drawing a zero."""
    Figure = _figure_class()
    n = len(groups)
    fig = Figure(figsize=(8.0, 1.1 + 0.42 * n))
    ax = fig.add_subplot()
    ys = list(range(n))[::-1]
    if band is not None:
        ax.axvspan(band[0], band[1], color=BAND, alpha=0.45, label=band_label, lw=0)
    for y, value, bounds in zip(ys, values, intervals, strict=True):
        if value is None:
            ax.text(0.0, y, "  no data", va="center", fontsize=9, color="#5b6472")
            continue
        outside = flag_outside and band is not None and not band[0] <= value <= band[1]
        ax.barh(y, value, color=BAR_OUT if outside else BAR, height=0.6)
        lo, hi = bounds
        if lo is not None and hi is not None:
            ax.errorbar(value, y, xerr=[[max(value - lo, 0.0)], [max(hi - value, 0.0)]], fmt="none",
                        ecolor=REFERENCE, capsize=4, lw=1.2)  # fmt: skip
    if reference is not None:
        ax.axvline(reference, color=REFERENCE, ls="--", lw=1.3, label=reference_label)
    ax.set_yticks(ys, [str(g) for g in groups])
    ax.set_xlabel(xlabel)
    ax.set_xlim(left=min([0.0, *(b[0] for b in intervals if b[0] is not None)]))
    ax.grid(axis="x", color="#e2e6ec")
    ax.set_axisbelow(True)
    if band is not None or reference is not None:
        ax.legend(loc="lower center", bbox_to_anchor=(0.5, 1.0), ncols=2, frameon=False, fontsize=9)
    return _svg(fig)


def _figure_class() -> Any:
    try:
        from matplotlib.figure import Figure
    except ImportError as exc:  # pragma: no cover - exercised only without the extra
        raise ImportError(MATPLOTLIB_HINT) from exc
    return Figure


def _svg(fig: Any) -> str:
    """A figure as an inline ``<svg>`` (text as paths, no date, stable ids)."""
    import matplotlib

    fig.tight_layout()
    out = io.StringIO()
    with matplotlib.rc_context({"svg.fonttype": "path", "svg.hashsalt": "fairness-exporter"}):
        fig.savefig(out, format="svg", metadata={"Date": None})
    svg = out.getvalue()
    return f'<div class="chart">{svg[svg.index("<svg"):]}</div>'


def time_chart(
    times: Sequence[str],
    value: Sequence[float | None],
    lower: Sequence[float | None],
    upper: Sequence[float | None],
    statistic: Sequence[float | None],
    *,
    ylabel: str,
    threshold: float | None,
    alarm_level: float,
    spans: Sequence[tuple[str, str | None]],
) -> str:
    """Two panels over time, as an inline ``<svg>``: a value with its interval band and the threshold line, and
    the detector's statistic with its alarm level; each span (ISO start, end or None = still firing) is shaded in
    both, with a vertical marker where it starts."""
    Figure = _figure_class()
    at = [datetime.fromisoformat(t) for t in times]
    missing = float("nan")
    fig = Figure(figsize=(9.0, 4.6))
    top, bottom = fig.subplots(2, 1, sharex=True, height_ratios=(3, 2))
    top.fill_between(at, [missing if x is None else x for x in lower], [missing if x is None else x for x in upper],
                     color=BAND, alpha=0.5, lw=0, label="95% interval")  # fmt: skip
    top.plot(at, [missing if x is None else x for x in value], color=BAR, lw=1.4, label=ylabel)
    if threshold is not None:
        top.axhline(threshold, color=BAR_OUT, ls="--", lw=1.3, label=f"threshold {fmt(threshold, 2)}")
    bottom.plot(at, [missing if x is None else x for x in statistic], color=REFERENCE, lw=1.2,
                label="detector statistic")  # fmt: skip
    bottom.axhline(alarm_level, color=FIRING, ls="--", lw=1.3, label=f"alarm level {fmt(alarm_level, 2)}")
    for k, (start, end) in enumerate(spans):
        begin, stop = datetime.fromisoformat(start), datetime.fromisoformat(end) if end else at[-1]
        for ax in (top, bottom):
            ax.axvspan(begin, stop, color=FIRING, alpha=0.15, lw=0, label="firing" if k == 0 and ax is top else None)
            ax.axvline(begin, color=FIRING, lw=1.2)
    top.set_ylabel(ylabel)
    bottom.set_ylabel("statistic")
    for ax in (top, bottom):
        ax.grid(color="#e2e6ec")
        ax.set_axisbelow(True)
    top.legend(loc="lower center", bbox_to_anchor=(0.5, 1.0), ncols=4, frameon=False, fontsize=9)
    bottom.legend(loc="upper left", frameon=False, fontsize=9)
    fig.autofmt_xdate()
    return _svg(fig)


def page(title: str, verdict: str, tone: str, summary: str, sections: Sequence[str], meta: Sequence[str]) -> str:
    """A whole HTML document: title, the verdict banner (tone good/bad/warn), facts, then the sections."""
    facts = "".join(f"<div>{escape(m)}</div>" for m in meta)
    return (
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
        f"<title>{escape(title)}</title><style>{CSS}</style></head><body>"
        f"<h1>{escape(title)}</h1>"
        f'<div class="verdict {tone}"><strong>{escape(verdict)}</strong>{escape(summary)}</div>'
        f'<div class="meta">{facts}</div>' + "".join(sections) + "</body></html>\n"
    )


def _source(label: str, path: str | None, sha: str | None, kind: str = "sha256") -> str:
    return f"{label}: {path or '(in memory)'}" + (f" ({kind} {sha})" if sha else "")


def _audit_attribute(name: str, report: Mapping[str, Any]) -> str:
    block, results = report["attributes"][name], [r for r in report["results"] if r["attribute"] == name]
    groups = block["groups"]
    dpd = next((r for r in results if r["metric"] == "demographic_parity_difference"), None)
    overall = block["overall_selection_rate"]
    band = None
    band_label = ""
    if dpd is not None and overall is not None:
        band = (overall - dpd["threshold"], overall + dpd["threshold"])
        band_label = f"overall ± demographic parity threshold {fmt(dpd['threshold'], 2)}"
    chart = rate_chart(list(groups), [g["selection_rate"] for g in groups.values()],
                       [g["selection_rate_ci"] for g in groups.values()], xlabel="selection rate (95% Wilson interval)",
                       reference=overall, reference_label=f"overall selection rate {fmt(overall)}",
                       band=band, band_label=band_label)  # fmt: skip
    group_rows = [[g, s["samples"], s["selection_rate"], fmt_interval(s["selection_rate_ci"]),
                   s["true_positive_rate"], s["false_positive_rate"]] for g, s in groups.items()]  # fmt: skip
    overridden = report["verdict"] == "OVERRIDDEN"
    comparison_rows = [[r["metric"], r["groups"], (estimated_value(fmt(shown_value(r)), r), "num"),
                        fmt_interval(r["ci_95"]), r["threshold"], r["severity"],
                        r["status"] if r["status"] in ("pass", "fail") else insufficient(r, report["min_samples"]),
                        r["evidence"],
                        (role(r["counts_as"], overridden), r["counts_as"]),
                        fmt_samples(r["samples_to_decide"])] for r in results]  # fmt: skip
    proxy = (f"<p class=\"meta\">proxy: true. {escape(block['proxy_bias'])}</p>" if block.get("proxy") else "")
    return (f"<h2>{escape(titled(name, block.get('proxy')))}</h2>{proxy}{chart}"
            f"<p class=\"meta\">Rows excluded (value not a configured group): {block['excluded_rows']}</p>"
            + table(["group", "rows", "selection rate", "95% interval", "TPR", "FPR"], group_rows)
            + table(["metric", "groups", "value", "95% interval", "threshold", "severity on fail", "point estimate",
                     "evidence", "counts as", "samples per group to decide"], comparison_rows))  # fmt: skip


def ll144_section(table_dict: Mapping[str, Any], total_rows: int | Mapping[str, int]) -> str:
    """The NYC Local Law 144 table of an audit report; ``total_rows``: the rows of every attribute, or of each (a
    counterfactual run decides each attribute's items apart)."""
    rate, dates = table_dict["rate_kind"].replace("_", " "), table_dict["date_range"]
    apart, share = isinstance(total_rows, Mapping), table_dict["small_category_share"]
    totals = total_rows if isinstance(total_rows, Mapping) else dict.fromkeys(table_dict["attributes"], total_rows)
    facts = [_source("Data", table_dict["source"]["file"], table_dict["source"]["manifest_sha256"],
                     "manifest sha256"),
             f"Date range: {dates['start']} to {dates['end']} (column {dates['column']}, "
             f"{dates['rows_without_date']} rows without a date)" if dates else "Date range: no timestamp column",
             f"Rate: {rate}" + (f" (share of rows scoring above the median score {fmt(table_dict['score_median'])})"
                                if table_dict["score_median"] is not None else ""),
             f"Categories under {share:.0%} of " + ("their attribute's rows" if apart else f"the {total_rows} rows")
             + " are left out of the impact ratios (unless all are), as the DCWP rules allow, and shown with their "
             "rows and rate; the reference (impact ratio 1) is the most selected of the others."]  # fmt: skip
    parts = ["<h2>NYC Local Law 144 impact ratios</h2>", *(f'<p class="meta">{escape(f)}</p>' for f in facts)]
    for name, block in table_dict["attributes"].items():
        rows = [[r["category"], r["samples"], r["share"], r["rate"], f"excluded (<{share:.0%})" if r["small_category"]
                 and r["impact_ratio"] is None else r["impact_ratio"], f"under {share:.0%}" if r["small_category"]
                 else ""] for r in block["categories"]]  # fmt: skip
        rows.append(["(unknown)", block["unknown_rows"], block["unknown_rows"] / totals[name], None, None, ""])
        parts.append(f"<h3>{escape(titled(name, block.get('proxy')))}</h3>"
                     + (f'<p class="meta">{totals[name]} rows</p>' if apart else "")
                     + table(["category", "rows", "share", rate, "impact ratio", "flag"], rows))  # fmt: skip
    return "".join(parts)


EXPLAINED_SEGMENTS = 8
"""Segments (each with its mix and rate terms) an explanation's chart and table show, the largest first."""


def explanations_section(explanations: Sequence[Mapping[str, Any]]) -> str:
    """Why each gap moved from the baseline: its sentence, the largest terms as signed bars with their 95% interval
    (the dashed line is the whole change), and their table."""
    parts = ["<h2>Why the gaps moved (segment explanations)</h2>"]
    for e in explanations:
        parts.append(f"<h3>{escape(e['attribute'])} · {escape(e['metric'])} · {escape(e['comparison'])}</h3>"
                     f"<p>{escape(e['summary'])}</p>")  # fmt: skip
        top = e["segments"][:EXPLAINED_SEGMENTS]
        if not top:
            continue
        terms = [(f"{s['column']}={s['value']} {kind}", s[kind], s[f"{kind}_ci_95"]) for s in top
                 for kind in ("rate", "mix")]  # fmt: skip
        parts.append(rate_chart([t[0] for t in terms], [t[1] for t in terms], [t[2] for t in terms],
                                xlabel="contribution to the change of the gap (95% interval)",
                                reference=e["change"], reference_label=f"change {fmt(e['change'])}"))  # fmt: skip
        parts.append(table(["segment", "mix", "95% interval", "rate", "95% interval"],
                           [[f"{s['column']}={s['value']}", s["mix"], fmt_interval(s["mix_ci_95"]), s["rate"],
                             fmt_interval(s["rate_ci_95"])] for s in top]))  # fmt: skip
    return "".join(parts)


def audit_html(report: Mapping[str, Any]) -> str:
    """The audit gate's report as a page."""
    tone = {"PASS": "good", "FAIL": "bad"}.get(report["verdict"], "warn")
    summary = (f"{report['passed']}/{report['total_tests']} comparisons passed · {report['blocking_failures']} "
               f"blocking · {report['warning_failures']} warning · {report['insufficient_samples']} with insufficient "
               f"samples · {report['inconclusive']} inconclusive (decision: {report['decision']})")  # fmt: skip
    if report.get("override"):
        summary += f" · overridden by {report['override']['author']}: {report['override']['justification']}"
    meta = [f"Model: {report['model_id']}", f"Run: {report['timestamp']} by {report['tool']}",
            _source("Config", report["config_file"], report["config_sha256"]),
            _source("Data", report["data_file"], report["data_manifest_sha256"], "manifest sha256"),
            f"Rows: {report['rows']} · minimum samples per group: {report['min_samples']}",
            *estimation_basis(report)]  # fmt: skip
    sections = [_audit_attribute(name, report) for name in report["attributes"]]
    if "impact_ratios" in report:
        sections.append(ll144_section(report["impact_ratios"], report["rows"]))
    if report.get("explanations"):
        sections.append(explanations_section(report["explanations"]))
    return page(f"Fairness audit: {report['model_id']}", report["verdict"], tone, summary, sections, meta)


def _bias_feature(name: str, r: Mapping[str, Any]) -> str:
    stats, sizes, intervals = r["group_stats"], r["group_sizes"], r["group_intervals"]
    lowest = stats[r["lowest_group"]]
    method = "Wilson" if r["interval_method"] == "wilson" else "Student t"
    chart = rate_chart(list(stats), list(stats.values()), list(intervals.values()),
                       xlabel=f"mean {r['outcome']} ({r['confidence']:.0%} {method} interval)",
                       reference=lowest, reference_label=f"lowest group ({r['lowest_group']}) {fmt(lowest)}",
                       band=(lowest, lowest + r["threshold"]),
                       band_label=f"within the threshold {fmt(r['threshold'], 2)} of the lowest",
                       flag_outside=True)  # fmt: skip
    verdict = "fail" if r["is_biased"] else "pass"
    summary = table(["feature", "fairness gap", "threshold", "highest group", "lowest group", "excluded rows",
                     "biased", "outcome"],
                    [[name, r["fairness_gap"], r["threshold"], r["highest_group"], r["lowest_group"],
                      r["excluded_rows"], r["is_biased"], verdict]])  # fmt: skip
    rows = [[g, sizes[g], stats[g], fmt_interval(intervals[g])] for g in stats]
    unmeasured = "; ".join(f"{g} ({n} rows)" for g, n in r["groups_without_outcome"].items())
    summary += f'<p class="meta">Not compared, no outcome values: {escape(unmeasured)}</p>' if unmeasured else ""
    return (f"<h3>{escape(name)}</h3>{summary}{chart}"
            + table(["group", "rows", f"mean {r['outcome']}", f"{r['confidence']:.0%} interval"], rows))


def bias_html(reports: Mapping[str, Mapping[str, Mapping[str, Any]]]) -> str:
    """The bias auditor's reports, keyed by data source, as one page."""
    biased = [(src, f) for src, rep in reports.items() for f, r in rep.items() if r["is_biased"]]
    total = sum(len(rep) for rep in reports.values())
    verdict = "BIASED" if biased else "NOT BIASED"
    summary = (f"{len(biased)} of {total} features over their threshold"
               + (": " + ", ".join(f"{f} in {src}" for src, f in biased) if biased else ""))
    sections = [f"<h2>{escape(src)}</h2>" + "".join(_bias_feature(f, r) for f, r in rep.items())
                for src, rep in reports.items()]  # fmt: skip
    return page("Bias report", verdict, "bad" if biased else "good", summary, sections,
                ["Fairness gap = highest group mean - lowest group mean; biased when it exceeds the threshold."])


def _compared(a: Mapping[str, Any]) -> str:
    """Which comparison an alert or series is about: the pair (or subgroup), its direction, the window."""
    what = a.get("dimension") or a.get("subgroup") or ""
    return what + (f" ({a['direction']})" if a.get("direction") else "")


def _same_comparison(alert: Mapping[str, Any], series: Mapping[str, Any]) -> bool:
    keys = ("alert", "attribute", "dimension", "subgroup", "direction")
    return all(alert.get(k) == series.get(k) for k in keys)


def _backtest_series(s: Mapping[str, Any], alerts: Sequence[Mapping[str, Any]]) -> str:
    p = s["points"]
    fired = [a for a in alerts if _same_comparison(a, s)]
    shown = "selection rate" if s.get("subgroup") else (s.get("metric") or "value").replace("_", " ")
    chart = time_chart(p["time"], p["value"], p["lower"], p["upper"], p["statistic"], ylabel=shown,
                       threshold=s["threshold"], alarm_level=s["alarm_level"],
                       spans=[(a["fired_at"], a["resolved_at"]) for a in fired])  # fmt: skip
    facts = table(["alert", "attribute", "comparison", "window", "alerted", "alerts", "max statistic", "alarm level",
                   "threshold", "points", "steps per point"],
                  [[s["alert"], s["attribute"], _compared(s), s["window"], s["alerted"], len(fired), s["max_statistic"],
                    s["alarm_level"], s["threshold"], len(p["time"]), s["steps_per_point"]]])  # fmt: skip
    return f"<h3>{escape(s['alert'])}: {escape(s['attribute'])} {escape(_compared(s))}</h3>{facts}{chart}"


def backtest_html(report: Mapping[str, Any]) -> str:
    """The backtest's report as a page: the pages that fired, each paging comparison's gap and detector over
    time (with the most extreme others), and the alerts table."""
    alerts = report["alerts"]
    pages = [a for a in alerts if a["severity"] == "critical"]
    counts: dict[str, int] = {}
    for a in pages:
        counts[a["alert"]] = counts.get(a["alert"], 0) + 1
    warnings = len(alerts) - len(pages)
    summary = (f"{len(pages)} page(s) fired" + (": " + ", ".join(f"{k} ({n})" for k, n in counts.items()) if pages
                                                 else "") + f" · {warnings} warning(s)")  # fmt: skip
    verdict = f"{len(pages)} PAGE(S)" if pages else "NO PAGES"
    tone = "bad" if pages else ("warn" if warnings else "good")
    meta = [f"Model: {report['model_id']}",
            f"Events: {report['events']} replayed in {report['steps']} steps · late {report['late']} · rejected "
            f"{report['rejected']} · ignored {report['ignored']}",
            f"Detectors: {report['detectors']} · alarm level {fmt(report['alarm_level'])} · false pages per day "
            f"budget {fmt(report['false_pages_per_day'])}"]  # fmt: skip
    series = report.get("series", [])
    sections = ["<h2>Comparisons over time</h2>",
                '<p class="meta">Each point is the step with the largest detector statistic among "steps per '
                "point\" steps; shaded spans are the alerts' firing intervals.</p>",
                *(_backtest_series(s, alerts) for s in series)]  # fmt: skip
    rows = [[a["alert"], a["severity"], a["attribute"], _compared(a), a["window"] or "—", a["fired_at"],
             a["resolved_at"] or "still firing", a["value"], fmt_interval(a["interval"]), a.get("statistic")]
            for a in alerts]  # fmt: skip
    sections.append("<h2>Alerts</h2>" + table(["alert", "severity", "attribute", "dimension", "window", "fired_at",
                                               "resolved_at", "value", "interval", "detector statistic"], rows))
    return page(f"Backtest: {report['model_id']}", verdict, tone, summary, sections, meta)
