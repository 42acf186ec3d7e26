"""The backtest report's sections as of the replay's end (its last step): the worst comparisons, and the
conditional, proxy and estimated comparisons, each by the daemon's own function on the replayed store
(serve/snapshot.py)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from functools import partial
from typing import Any

import numpy as np

from exporter.backtest.series import evaluate_steps, iso, number
from exporter.config import ModelSpec, Windowing
from exporter.core.attributes import Attribute
from exporter.core.evaluate import Evaluation
from exporter.core.metric_table import METRICS
from exporter.stream.state.window import WindowStore

Final = tuple[dict[str, np.ndarray], list[Any]]
"""The last step's window counts ``(1, rows, counts)`` and its labelled histograms and score sums (a score metric)."""


def evaluated(spec: ModelSpec, windowing: Windowing, store: WindowStore, final: Final,
              now: float) -> dict[tuple[str, str], Evaluation]:  # fmt: skip
    """Per window and attribute: the evaluation of the last step, with the conditional metrics (``strata:``) among its
    comparisons from the segment counts at ``now``, as the daemon's computation makes it (snapshot.conditioned)."""
    from exporter.serve.snapshot import conditioned

    evaluations = evaluate_steps(spec, windowing, store.layout.split, *final, spec.exported_metrics)
    if not spec.conditional_metrics:
        return evaluations
    found = conditioned(spec, store.segments.snapshot(now), store.segments, store.layout.split,
                        [(w, ev) for (w, _), ev in evaluations.items()])  # fmt: skip
    return dict(zip(evaluations, found, strict=True))


def worst(spec: ModelSpec, evaluations: Mapping[tuple[str, str], Evaluation]) -> list[dict[str, Any]]:
    """Per window, attribute and exported metric (conditional ones included): the worst comparison, as the daemon
    shows it (model_worst_comparison)."""
    metrics = (*spec.exported_metrics, *spec.conditional_metrics)
    return [{"window": window, **row} for (window, _), ev in evaluations.items() for row in ev.worst_rows(metrics)]


def conditional(spec: ModelSpec, evaluations: Mapping[tuple[str, str], Evaluation], store: WindowStore,
                now: float) -> dict[str, Any]:  # fmt: skip
    """The conditional metrics' comparisons (``strata:``) per window and attribute, their evidence judged under
    ``multiplicity:``, as the daemon's; and the events replayed that they leave out (no stratum value, or past the
    cap), as the gate's result counts them."""
    return {"as_of": iso(now), **store.segments.excluded(spec.strata), "comparisons": [
        c for (window, _), ev in evaluations.items() for c in comparisons(
            spec, window, ev.attribute, {m: ev.values(m) for m in spec.conditional_metrics}, ev.sufficient, "",
            ev.evidence)]}  # fmt: skip


def proxied(spec: ModelSpec, store: WindowStore, now: float) -> dict[str, Any]:
    """The proxy attributes' comparisons and group rates per window, as the daemon's (snapshot.py)."""
    from exporter.serve.snapshot import proxied
    from exporter.stream.state.proxy import evidence_rows

    evaluations = proxied(spec, store.proxy, store.window_proxy_counts(now))
    return {"as_of": iso(now), "proxy": True, "evidence": [
                {"window": w, "attribute": a.name, "rows": evidence_rows(counts[k])} for w, counts in
                store.window_proxy_evidence(now).items() for k, a in enumerate(store.proxy.attributes)],
            "comparisons": [c for w, ev in evaluations for c in comparisons(
                spec, w, ev.attribute, ev.comparisons.metrics, ev.sufficient, "_proxy", ev.evidence)],
            "groups": [{"window": w, "attribute": ev.attribute.name, "subgroup": g, "samples": float(n),
                        "selection_rate": number(r)} for w, ev in evaluations for g, n, r in
                       zip(ev.attribute.groups, ev.groups.samples, ev.groups.selection_rate, strict=True)]}


def estimated(spec: ModelSpec, store: WindowStore, reference: dict[str, np.ndarray], now: float) -> dict[str, Any]:
    """The estimated comparisons and calibration statistics of every window, as the daemon's computation makes them
    (serve/snapshot.py)."""
    from exporter.serve.snapshot import estimated

    found, calibration = [], []
    for window, est in estimated(spec, reference, store.window_estimate_counts(now), store.layout.split):
        groups = est.attribute.groups
        found += comparisons(spec, window, est.attribute, est.values,
                             partial(est.sufficient, min_samples=spec.min_samples), "_estimated")  # fmt: skip
        z = est.check.statistic
        calibration += [{"window": window, "attribute": est.attribute.name, "subgroup": g, "predicted": p,
                         "statistic": number(z[i, p])} for i, g in enumerate(groups) for p in (0, 1)]
    return {"as_of": iso(now), "comparisons": found, "calibration": calibration}


def comparisons(spec: ModelSpec, window: str, attribute: Attribute, values: dict[str, Any],
                sufficient: Callable[[str], Any], suffix: str,
                judge: Callable[[str, float], Any] | None = None) -> list[dict[str, Any]]:  # fmt: skip
    """Each metric's comparisons of one attribute in one window, named with ``suffix`` (not an observed one);
    ``judge(metric, threshold)``: their evidence (a proxy's, under the multiplicity rule), else each alone."""
    thresholds, groups, out = spec.thresholds(), attribute.groups, []
    for metric, v in values.items():
        t = thresholds[metric]
        ok, evidence = sufficient(metric), (judge(metric, t) if judge else
                                            METRICS[metric].evidence(v.lower, v.upper, t)).tolist()  # fmt: skip
        out += [{"window": window, "attribute": attribute.name, "dimension": f"{groups[a]}_vs_{groups[b]}",
                 "metric": f"{metric}{suffix}", "value": number(v.value[k]) if ok[k] else None,
                 "ci_95": [number(v.lower[k]), number(v.upper[k])] if ok[k] else None,
                 "status": "ok" if ok[k] else "insufficient_samples",
                 "evidence": evidence[k] if ok[k] else "inconclusive"}
                for k, (a, b) in enumerate(attribute.pairs)]  # fmt: skip
    return out
