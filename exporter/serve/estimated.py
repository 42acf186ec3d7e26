"""Estimated label-based comparisons on /metrics, under names of their own (``model_<metric>_estimated``), never in
a series of observed values; and the calibration statistic that says whether the estimate still holds."""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence

from prometheus_client.core import GaugeMetricFamily, Metric

from exporter.core.estimate import CALIBRATION_SHIFT
from exporter.core.metric_table import EVIDENCE, METRICS
from exporter.serve.snapshot import Snapshot

_PAIR = ["model_id", "attribute", "window", "dimension", "group_a", "group_b"]
SUFFIX = "_estimated"


def estimated_families(snapshots: Sequence[Snapshot], cadence: str) -> Iterator[Metric]:
    """Every estimated metric with its 95% interval, its sufficiency and evidence, and the calibration check."""
    estimating = [s for s in snapshots if s.estimated]
    if not estimating:
        return
    names = sorted({m for s in estimating for _, e in s.estimated for m in e.values})
    values = {m: GaugeMetricFamily(f"{METRICS[m].prometheus_name}{SUFFIX}", f"Estimated before the labels from "
                                   f"per-group calibrated scores (estimation:): {METRICS[m].formula}; absent when "
                                   "insufficient." + cadence, labels=_PAIR) for m in names}  # fmt: skip
    bounds = {m: tuple(GaugeMetricFamily(f"{METRICS[m].prometheus_name}{SUFFIX}_{side}", f"{side.title()} bound of "
                                         f"the 95% interval of {METRICS[m].prometheus_name}{SUFFIX}: the gap the "
                                         "labels will show, from the calibration's and the window's uncertainty.",
                                         labels=_PAIR) for side in ("lower", "upper")) for m in names}  # fmt: skip
    insufficient = GaugeMetricFamily(
        "model_estimated_comparison_insufficient_samples", "1 when the estimated metric has no value: a group has "
        "fewer than min_samples predictions in the window, or of the rate's labelled rows in the reference." + cadence,
        labels=[*_PAIR, "metric"])  # fmt: skip
    evidence = GaugeMetricFamily(
        "model_estimated_comparison_evidence", "1 for what the estimate's 95% interval says against the metric's "
        "threshold (pass, fail, inconclusive), 0 for the two others; valid while the calibration holds "
        "(model_calibration_statistic)." + cadence, labels=[*_PAIR, "metric", "evidence"])  # fmt: skip
    statistic = GaugeMetricFamily(
        "model_calibration_statistic", "(labelled positives - their expectation under the per-group calibration) / "
        "sqrt(its variance), over the window's labelled predictions of a subgroup and predicted class: about "
        "standard normal while the calibration holds; far from 0, the estimates are not to be trusted." + cadence,
        labels=["model_id", "attribute", "window", "subgroup", "predicted"])  # fmt: skip
    for snapshot in estimating:
        thresholds = {m: t for m, t, _ in snapshot.thresholds}
        min_samples = snapshot.evaluations[0][1].min_samples if snapshot.evaluations else 1
        for window, est in snapshot.estimated:
            attribute = est.attribute
            base = [snapshot.model_id, attribute.name, window]
            for metric, v in est.values.items():
                ok = est.sufficient(metric, min_samples)
                states = METRICS[metric].evidence(v.lower, v.upper, thresholds[metric]).tolist()
                for k, (a, b) in enumerate(attribute.pairs):
                    ga, gb = attribute.groups[a], attribute.groups[b]
                    labels = [*base, f"{ga}_vs_{gb}", ga, gb]
                    name = f"{metric}{SUFFIX}"
                    insufficient.add_metric([*labels, name], 0.0 if ok[k] else 1.0)
                    for state in EVIDENCE:
                        shown = states[k] if ok[k] else "inconclusive"
                        evidence.add_metric([*labels, name, state], 1.0 if shown == state else 0.0)
                    if ok[k]:
                        values[metric].add_metric(labels, float(v.value[k]))
                        for family, bound in zip(bounds[metric], (v.lower[k], v.upper[k]), strict=True):
                            if not math.isnan(bound):
                                family.add_metric(labels, float(bound))
            z = est.check.statistic
            for i, group in enumerate(attribute.groups):
                for predicted in (0, 1):
                    if not math.isnan(z[i, predicted]):
                        statistic.add_metric([*base, group, str(predicted)], float(z[i, predicted]))
    for m in names:
        yield values[m]
        yield from bounds[m]
    yield from (insufficient, evidence, statistic)


def calibration_detector_families() -> tuple[GaugeMetricFamily, GaugeMetricFamily]:
    """The calibration detectors' CUSUM statistic and alarm (filled by the collector's detector families)."""
    labels = ["model_id", "attribute", "subgroup", "predicted", "direction"]
    return (GaugeMetricFamily(
        "fairness_calibration_detector_statistic", "CUSUM of the log likelihood ratio of the subgroup's labels "
        f"against its calibrated scores, for the log odds of a positive label moved by {CALIBRATION_SHIFT:g} in the "
        "`direction` "
        "(estimation:), one step per bucket: the evidence that the estimated metrics no longer hold, in nats.",
        labels=labels), GaugeMetricFamily(
        "fairness_calibration_detector_alarm", "1 while the calibration detector is in alarm (as "
        "fairness_detector_alarm, on the same budget).", labels=labels))  # fmt: skip
