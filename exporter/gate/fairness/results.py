"""The gate's result rows: one per configured metric and pair of an evaluation, judged against the metric's
threshold and by its interval, as ``audit`` reports them and as the counterfactual gate reuses them (so a threshold
means the same in both)."""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

from exporter.config import ModelSpec
from exporter.core.evaluate import Evaluation
from exporter.core.metric_table import samples_to_decide
from exporter.gate.fairness import ll144
from exporter.gate.fairness.ll144 import json_float


def metric_results(config: ModelSpec, ev: Evaluation, estimated: Collection[str] | None = None) -> list[dict[str, Any]]:
    """One result per configured metric and pair: the point estimate against the threshold (``passed``, the seed's
    rule) whenever the comparison has a value, and what its interval says (``evidence``). ``estimated``: the metrics
    whose values are estimates (the gate's estimation; each result then says whether it is one). An estimate has no
    ``samples_to_decide``: most of its interval is the reference's calibration, which no number of audited rows
    narrows (scaled from them, the count promised a decision that 22 times the rows did not bring)."""
    out = []
    groups = ev.attribute.groups
    samples = ev.groups.samples
    for spec in config.metrics:
        v = ev.values(spec.name)
        sufficient = ev.sufficient(spec.name)
        evidence = ev.evidence(spec.name, spec.threshold).tolist()
        decidable = estimated is None or spec.name not in estimated
        judged = int(sufficient.sum())
        for k, (a, b) in enumerate(ev.attribute.pairs):
            ok = bool(sufficient[k])
            passed = ok and spec.passes(float(v.value[k]))
            pair_samples = {groups[a]: ll144.count(samples[a]), groups[b]: ll144.count(samples[b])}
            out.append({
                "attribute": ev.attribute.name,
                "metric": spec.name,
                "groups": f"{groups[a]} vs {groups[b]}",
                "dimension": f"{groups[a]}_vs_{groups[b]}",
                "value": round(float(v.value[k]), 4) if ok else None,
                "exact_value": json_float(v.value[k]),
                "ci_95": [json_float(v.lower[k]), json_float(v.upper[k])],
                "half_width": json_float(v.half_width[k]),
                "threshold": spec.threshold,
                "passed": passed,
                "status": "insufficient_samples" if not ok else ("pass" if passed else "fail"),
                "evidence": evidence[k],
                "samples_to_decide": samples_to_decide(float(v.half_width[k]), float(v.value[k]), spec.threshold,
                                                       pair_samples)
                if evidence[k] == "inconclusive" and decidable else None,
                "severity": spec.severity,
                "counts_as": _counts_as(config, spec.severity, ok, passed, evidence[k]),
                "samples": pair_samples,
                "support": int(v.support[k]),
                "comparisons_judged": judged,
                **({"proxy": True} if ev.attribute.proxy else {}),
                **({"estimated": not decidable} if estimated is not None else {}),
            })  # fmt: skip
    return out


def _counts_as(config: ModelSpec, severity: str, sufficient: bool, passed: bool, evidence: str) -> str:
    """``pass``, ``blocking`` or ``warning``: what a result does to the verdict under ``decision`` and
    ``failure_policy.inconclusive``. A comparison with too few samples evaluated nothing: it counts at its severity
    under every policy (``inconclusive: warn`` softens an interval that straddles the threshold, not a missing
    value), as the counterfactual gate's do."""
    if config.decision == "point_estimate" or not sufficient:
        return "pass" if passed else severity
    if evidence == "inconclusive":
        return severity if config.inconclusive == "fail" else "warning"
    return "pass" if evidence == "pass" else severity
