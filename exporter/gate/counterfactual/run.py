"""The counterfactual run: every item asked once per group value (one request per template, item, attribute and
group), each answer read by the extractor, then per group the selection rate, per pair the flips and McNemar's
test, and the seed's metrics judged through the audit gate's own code (the core's evaluation, the gate's result
rows, the LL144 table), so ``0.06`` means here what it means in ``audit``.

The verdict (``verdict: paired_evidence``, the default): a comparison fails when its point estimate crosses the
seed's threshold (the gate's ``passed``) *and* the paired test says the groups were treated differently (McNemar's
exact test on the items, a sign test over items when an item is asked with several templates or samples,
Holm-adjusted over the run's pairs, under ``alpha``). A crossing the paired test cannot tell from chance
is a warning. So a model that treats the groups alike fails with probability at most ``alpha`` however few items
the suite has, while the seed's thresholds still set what size of difference matters. ``verdict: point_estimate``
judges the point estimates alone, as the gate does by default. A comparison with fewer than ``min_samples`` items
decided for both groups (the paired test's units, however many templates and samples each has) never passes, and
neither do unparsed answers over ``unparsed.max_share`` or a request that got no answer.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Final

import numpy as np

from exporter import __version__
from exporter.config.types import ModelSpec
from exporter.core.attributes import Attribute
from exporter.core.evaluate import Evaluation, evaluate_many
from exporter.core.fairness import N_COUNTS, PRED_NEG, PRED_POS, rate_counts, ratio_interval, wilson_interval
from exporter.core.metric_table import METRICS, samples_to_decide
from exporter.gate.counterfactual import paired
from exporter.gate.counterfactual.calls import Cache, Outcome, Prompt, answers_hash, ask_all
from exporter.gate.counterfactual.suite import ITEM_SLOT, CfAttribute, Requests, RunSettings, Suite, fill
from exporter.gate.fairness import ll144
from exporter.gate.fairness.ll144 import json_float
from exporter.gate.fairness.results import metric_results

UNDEFINED: Final = "undefined"
"""The status of a ratio of two groups that both selected no one, though enough items were decided for both."""
UNPARSED_METRIC: Final = "unparsed_share"
FAILED_METRIC: Final = "failed_requests"
ITEMS_COUNTED: Final = "items decided for both groups"
"""What ``min_samples`` counts in the decision kind, as the report says it."""
RUN_ATTRIBUTE: Final = "(run)"
SHOWN_ANSWER_CHARS: Final = 400


@dataclass(frozen=True)
class Asked:
    """One request of the plan: which attribute and group it varies, on which template and item."""

    attribute: str
    group: str
    template: int
    item: int
    prompt: Prompt


def prompt(run: RunSettings, user: str) -> Prompt:
    """A request's messages: the suite's system prompt (if any), then the filled template."""
    return Prompt(((("system", run.system_prompt),) if run.system_prompt else ()) + (("user", user),))


def plan(suite: Suite) -> list[Asked]:
    """Every request of the run, in a fixed order: per attribute, template, item and group."""
    out = []
    for a in suite.attributes:
        for t, template in enumerate(suite.templates):
            for i, item in enumerate(suite.items):
                for group in a.group_names:
                    values = {**suite.slot_defaults, **a.filling(group, i)}
                    user = fill(template, {**values, ITEM_SLOT: item})
                    out.append(Asked(a.name, group, t, i, prompt(suite.run, user)))
    return out


Answers = Callable[[Prompt], list[str] | None]
"""A prompt's answers (``samples`` texts), or None when its request got none."""


def _decisions(suite: Suite, a: CfAttribute, asked: list[Asked], answers: Answers) -> tuple[dict[str, np.ndarray],
                                                                                             dict[tuple, list[str]]]:
    """Per group, the decision cells of shape (items, templates, samples): an item's answers together, as the paired
    test counts them; and each request's answers by (group, item, template)."""
    n = suite.run.requests.samples
    cells = {g: np.full((len(suite.items), len(suite.templates), n), paired.FAILED, dtype=np.int8)
             for g in a.group_names}  # fmt: skip
    texts: dict[tuple, list[str]] = {}
    for q in asked:
        got = answers(q.prompt)
        if got is None:
            continue
        texts[(q.group, q.item, q.template)] = got
        for j, text in enumerate(got[:n]):
            d = suite.decision.decide(text)
            cells[q.group][q.item, q.template, j] = paired.UNPARSED if d is None else int(d)
    return cells, texts


def _counts(a: CfAttribute, cells: dict[str, np.ndarray]) -> np.ndarray:
    """The core's count rows: per group, positive and negative decisions (no labels)."""
    counts = np.zeros((len(a.group_names), N_COUNTS), dtype=np.int64)
    for k, g in enumerate(a.group_names):
        counts[k, PRED_POS] = int((cells[g] == paired.POSITIVE).sum())
        counts[k, PRED_NEG] = int((cells[g] == paired.NEGATIVE).sum())
    return counts


def _effective(a: CfAttribute, cells: dict[str, np.ndarray], counts: np.ndarray) -> np.ndarray:
    """The count rows each group's answers are worth as independent ones (:func:`paired.design_effect`): the
    intervals of the rates and of their comparisons rest on them, so an item asked with several templates or
    samples narrows them no more than its correlated answers warrant. The counts themselves where every item has
    one answer a group."""
    effects = np.array([paired.design_effect(cells[g]) for g in a.group_names])
    return counts if (effects == 1.0).all() else counts / effects[:, None]


def _group_block(a: CfAttribute, cells: dict[str, np.ndarray], ev: Evaluation, ci: Evaluation) -> dict[str, Any]:
    """Per group its answers' counts and selection rate (``ev``), the rate's interval by its effective counts
    (``ci``)."""
    lower, upper = ci.groups.selection_rate_ci
    return {g: {"asked": int(cells[g].size), "decided": int((cells[g] >= 0).sum()),
                "positive": int((cells[g] == paired.POSITIVE).sum()),
                "unparsed": int((cells[g] == paired.UNPARSED).sum()),
                "selection_rate": json_float(ev.groups.selection_rate[k]),
                "ci_95": [json_float(lower[k]), json_float(upper[k])]}
            for k, g in enumerate(a.group_names)}  # fmt: skip


def _flips(suite: Suite, a: CfAttribute, ga: str, gb: str, cells: dict[str, np.ndarray],
           texts: dict[tuple, list[str]]) -> list[dict[str, Any]]:  # fmt: skip
    """The prompts decided differently for the two groups, side by side (sample by sample)."""
    out = []
    flipped = np.nonzero((cells[ga] >= 0) & (cells[gb] >= 0) & (cells[ga] != cells[gb]))
    for i, t, j in zip(*(axis.tolist() for axis in flipped), strict=True):
        out.append({"template": t, "item": i, "sample": j, "item_text": suite.items[i],
                    **{g: {"values": a.filling(g, i), "decision": bool(cells[g][i, t, j]),
                           "answer": texts[(g, i, t)][j][:SHOWN_ANSWER_CHARS]} for g in (ga, gb)}})  # fmt: skip
    return out


def share_rows(run: RunSettings, attribute: str, groups: dict[str, Any]) -> list[dict[str, Any]]:
    """Per group, the share of answers the extractor could not read, against ``unparsed.max_share``."""
    out = []
    for g, block in groups.items():
        k, n = block["unparsed"], block["asked"]
        lo, hi = wilson_interval(np.array([k]), np.array([n]))
        value = k / n if n else None
        passed = value is not None and value <= run.max_unparsed_share
        out.append(check_row(attribute, UNPARSED_METRIC, g, value, [json_float(lo[0]), json_float(hi[0])],
                             run.max_unparsed_share, passed, run.unparsed_severity, {g: n}))
    return out


def check_row(attribute: str, metric: str, groups: str, value: float | None, ci: list[float | None], threshold: float,
         passed: bool, severity: str, samples: dict[str, int]) -> dict[str, Any]:  # fmt: skip
    """A result of the run's own checks, in the gate's result shape."""
    return {"attribute": attribute, "metric": metric, "groups": groups, "dimension": groups,
            "value": None if value is None else round(value, 4), "exact_value": value, "ci_95": ci,
            "half_width": None, "threshold": threshold, "passed": passed, "status": "pass" if passed else "fail",
            "evidence": "pass" if passed else "fail", "samples_to_decide": None, "severity": severity,
            "counts_as": "pass" if passed else severity, "samples": samples,
            "support": sum(samples.values())}  # fmt: skip


def _judged(ev: Evaluation, ci: Evaluation, paired_items: list[int]) -> Evaluation:
    """``ci`` (the effective counts' intervals) with the answers' own values (``ev``), and each pair's support (what
    ``min_samples`` counts) in items decided for both groups, the paired test's units, instead of answers: an item
    asked with several templates or samples is one item. The core's count stays where it is smaller (a metric that
    needs labels, which no answer has: 0). Other comparisons may meet ``min_samples`` in items than in answers, so
    the simultaneous intervals are computed again at the K judged in items (:meth:`Evaluation.with_support`)."""
    items = np.asarray(paired_items, dtype=np.int64)
    return ci.with_support({name: dataclasses.replace(v, value=ev.values(name).value, support=np.minimum(
        ev.values(name).support, items)) for name, v in ci.comparisons.metrics.items()})  # fmt: skip


def _ratio_without_selection(row: dict[str, Any], ev: Evaluation, pair: tuple[int, int]) -> None:
    """Judge a ratio the core leaves without a value because a group selected no one, when at least min_samples
    items were decided for both groups: they were asked the same items, so 0 of 40 is a rate, not a missing one.
    Against a group that selected some the ratio is 0 (as in the LL144 table), its interval from 0 to the score
    bound, judged like any value; of two groups that both selected no one it has no value (``undefined``), which
    never passes but is no evidence of a difference either: :func:`counts_as` leaves that to the paired test."""
    metric = METRICS.get(row["metric"])
    if row["status"] != "insufficient_samples" or metric is None or metric.kind != "ratio" or \
            row["support"] < ev.min_samples:  # fmt: skip
        return
    k, n = rate_counts(ev.counts, metric.rates[0])  # a ratio compares one rate
    (k_low, n_low), (k_high, n_high) = sorted(((k[g], n[g]) for g in pair), key=lambda c: c[0] / c[1])
    if k_high == 0:
        row.update(status=UNDEFINED, passed=False, evidence="inconclusive")
        return
    _, upper = ratio_interval(np.array([k_low]), np.array([n_low]), np.array([k_high]), np.array([n_high]), most=1.0)
    ci = (0.0, float(upper[0]))
    passed = metric.passes(0.0, row["threshold"])
    row.update(value=0.0, exact_value=0.0, ci_95=list(ci), half_width=ci[1] / 2, passed=passed,
               status="pass" if passed else "fail", evidence=str(metric.evidence(*ci, row["threshold"])))


def counts_as(run: RunSettings, r: dict[str, Any], adjusted_p: float) -> str:
    """What a comparison does to the verdict (see the module's docstring)."""
    if r["passed"]:
        return "pass"
    if run.verdict == "point_estimate" or r["status"] == "insufficient_samples" or adjusted_p < run.alpha:
        return str(r["severity"])
    return "warning"


def judge(suite: Suite, asked: list[Asked], answers: Answers) -> dict[str, Any]:
    """The report's numbers from the answers: ``groups``, ``pairs``, ``impact_ratios`` and ``results`` (no I/O: the
    simulations call this with scripted answers)."""
    spec = ModelSpec(model_id=suite.run.model_id, base_attributes=(), attributes=(), metrics=suite.metrics,
                     min_samples=suite.run.min_samples)  # fmt: skip
    groups: dict[str, Any] = {}
    pairs: list[dict[str, Any]] = []
    rows: list[tuple[dict[str, Any], int]] = []  # a comparison's row and the index of its pair
    checks: list[dict[str, Any]] = []
    tables: dict[str, Any] = {}
    for a in suite.attributes:
        cells, texts = _decisions(suite, a, [q for q in asked if q.attribute == a.name], answers)
        core = Attribute(a.name, (a.name,), a.group_names, a.pairs)
        counts = _counts(a, cells)
        effective = _effective(a, cells, counts)
        [ev, ci] = evaluate_many([(core, counts), (core, effective)], suite.run.min_samples)
        groups[a.name] = _group_block(a, cells, ev, ci)
        checks.extend(share_rows(suite.run, a.name, groups[a.name]))
        decided = sum(g["decided"] for g in groups[a.name].values())
        tables[a.name] = ll144.attribute_table(ev, 0, max(decided, 1))
        first_pair = len(pairs)
        for x, y in a.pairs:
            ga, gb = a.group_names[x], a.group_names[y]
            c = paired.compare(cells[ga], cells[gb])
            pairs.append({"attribute": a.name, "groups": f"{ga} vs {gb}", "both_positive": c.both_positive,
                          "a_only": c.a_only, "b_only": c.b_only, "neither": c.neither,
                          "mcnemar_p_value": c.p_value, "test": c.test, "paired_items": c.paired_items,
                          "flip_rate": None if c.flip_rate is None else round(c.flip_rate, 6),
                          "flipped_items": _flips(suite, a, ga, gb, cells, texts)})  # fmt: skip
        pair_of = {f"{a.group_names[x]} vs {a.group_names[y]}": first_pair + k for k, (x, y) in enumerate(a.pairs)}
        ci = _judged(ev, ci, [p["paired_items"] for p in pairs[first_pair:]])
        for r in metric_results(spec, ci):  # intervals by the effective counts, the answers as counted
            answered = {g: groups[a.name][g]["decided"] for g in r["samples"]}
            r.update(support_counts=ITEMS_COUNTED, samples=answered, samples_to_decide_counts=ITEMS_COUNTED)
            if r["samples_to_decide"] is not None:  # items needed, the unit min_samples counts, as many answers each
                items = pairs[pair_of[r["groups"]]]["paired_items"]
                r["samples_to_decide"] = samples_to_decide(r["half_width"], r["exact_value"], r["threshold"],
                                                           dict.fromkeys(answered, items))  # fmt: skip
            _ratio_without_selection(r, ci, a.pairs[pair_of[r["groups"]] - first_pair])
            rows.append((r, pair_of[r["groups"]]))
    adjusted = paired.holm([p["mcnemar_p_value"] for p in pairs])
    for p, q in zip(pairs, adjusted, strict=True):
        p["p_value_holm"] = q
        p["differs"] = q < suite.run.alpha
    results = []
    for r, k in rows:
        r["mcnemar_p_value"], r["p_value_holm"] = pairs[k]["mcnemar_p_value"], adjusted[k]
        r["counts_as"] = counts_as(suite.run, r, adjusted[k])
        results.append(r)
    impact_ratios = {"rate_kind": "selection_rate", "score_median": None, "date_range": None,
                     "small_category_share": ll144.SMALL_CATEGORY_SHARE,
                     "source": {"file": suite.run.source, "manifest_sha256": suite.run.sha256}, "attributes": tables}
    return {"groups": groups, "pairs": pairs, "impact_ratios": impact_ratios, "results": [*results, *checks]}


def failed_row(outcome: Outcome, keys: Iterable[str]) -> dict[str, Any]:
    """The run's check that every request got an answer: a request that failed after its retries blocks."""
    failed = sorted({k for k in keys if outcome.answers[k].texts is None})
    row = check_row(RUN_ATTRIBUTE, FAILED_METRIC, "all", float(len(failed)), [None, None], 0.0, not failed, "blocking",
               {"all": len(outcome.answers)})  # fmt: skip
    row["errors"] = [{"request": k, "error": outcome.answers[k].error} for k in failed[:20]]
    return row


def ask(run: RunSettings, prompts: list[Prompt], cache_dir: str | Path, max_calls: int | None,
        model_version: str | None) -> tuple[Requests, dict[Prompt, str], Outcome]:  # fmt: skip
    """Send the prompts (:func:`~exporter.gate.counterfactual.calls.ask_all`) under the suite's request settings,
    ``max_calls`` (the command line's) over its budget; the cache answers only for the same ``model_version`` (the
    command line's) or, without one, the suite's."""
    assert run.target is not None  # run_settings refuses a suite without one
    requests = run.requests if max_calls is None else dataclasses.replace(run.requests, max_calls=max_calls)
    cache = Cache(cache_dir)
    keys, outcome = ask_all(prompts, run.target, requests, cache, model_version or run.model_version)
    outcome.not_cached, outcome.cache_error = cache.not_written, cache.first_error
    return requests, keys, outcome


def finish(run: RunSettings, kind: str, judged: dict[str, Any], requests: Requests, keys: dict[Prompt, str],
           outcome: Outcome, cache_dir: str | Path, model_version: str | None,
           **facts: Any) -> dict[str, Any]:  # fmt: skip
    """The JSON report of a run of either kind: what was asked and how, the judged numbers, the verdict."""
    assert run.target is not None
    results = [*judged.pop("results"), failed_row(outcome, set(keys.values()))]
    failed = [r for r in results if r["counts_as"] != "pass"]
    blocking = [r for r in failed if r["counts_as"] == "blocking"]
    now = datetime.now(UTC).isoformat().replace("+00:00", "Z")
    return {
        "suite": "counterfactual", "kind": kind, "model_id": run.model_id,
        "model_version": model_version or run.model_version, "timestamp": now,
        "tool": f"fairness-exporter {__version__}", "suite_file": run.source, "suite_sha256": run.sha256,
        "target": {"url": run.target.base_url, "model": run.target.model},
        "cache": {"dir": str(cache_dir), "sha256": answers_hash(outcome.answers), "not_written": outcome.not_cached,
                  "first_error": outcome.cache_error},
        "requests": {"planned": len(keys), "distinct": len(outcome.answers), "cached": outcome.cached,
                     "sent": outcome.sent, "calls": outcome.calls, "retries": outcome.retries,
                     "failed": sum(a.texts is None for a in outcome.answers.values()), "max_calls": requests.max_calls,
                     "samples": requests.samples, "seed": requests.seed, "temperature": run.target.temperature,
                     "concurrency": requests.concurrency},
        **facts,
        "min_samples": run.min_samples, "alpha": run.alpha, "decision": run.verdict,
        "total_tests": len(results), "passed": len(results) - len(failed), "failed": len(failed),
        "blocking_failures": len(blocking), "warning_failures": len(failed) - len(blocking),
        "insufficient_samples": sum(r["status"] == "insufficient_samples" for r in results),
        "inconclusive": sum(r["evidence"] == "inconclusive" for r in results),
        "verdict": "FAIL" if blocking else "PASS",
        **judged,
        "results": results,
    }  # fmt: skip


def run_counterfactual(suite: Suite, cache_dir: str | Path, *, model_version: str | None = None,
                       max_calls: int | None = None) -> dict[str, Any]:  # fmt: skip
    """Ask, read and judge a decision suite against its target; the JSON report. TargetError (exit 2) when the
    budget is too small or the endpoint answers nothing."""
    asked = plan(suite)
    requests, keys, outcome = ask(suite.run, [q.prompt for q in asked], cache_dir, max_calls, model_version)
    judged = judge(suite, asked, lambda p: outcome.answers[keys[p]].texts)
    return finish(suite.run, "decision", judged, requests, keys, outcome, cache_dir, model_version,
                  items=len(suite.items), items_source=suite.items_source, templates=len(suite.templates),
                  min_samples_counts=ITEMS_COUNTED)  # fmt: skip
