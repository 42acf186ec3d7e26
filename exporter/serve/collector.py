"""Render each Snapshot for /metrics: fresh metric families per snapshot, nothing mutated in place.

A series that leaves the data (a window that empties, a comparison that becomes insufficient) leaves /metrics
by itself. Each snapshot is serialised once (CachedExposition); a scrape never triggers or waits for a computation.
"""

from __future__ import annotations

import gzip
import math
from collections.abc import Callable, Iterator

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from exporter.config import METRIC_NAMES
from exporter.core.fairness import COUNT_NAMES, FN, FP, PRED_NEG, PRED_POS, TN, TP
from exporter.serve.snapshot import Snapshot

_CI = "95% interval"
_PAIR = ["model_id", "attribute", "window", "dimension", "group_a", "group_b"]
_GROUP = ["model_id", "attribute", "window", "subgroup"]
_PAIR_HELP = {
    "demographic_parity_difference": "|selection rate a - selection rate b|",
    "equalised_odds_difference": "max(|TPR a - TPR b|, |FPR a - FPR b|) over labelled predictions",
    "disparate_impact_ratio": "min/max of the two selection rates (four-fifths rule: below 0.8 is adverse)",
}


class _Family:
    """A gauge with optional _lower/_upper companions, filled with finite values only."""

    def __init__(self, name: str, doc: str, labels: list[str], bounds: bool = False) -> None:
        self.main = GaugeMetricFamily(name, doc, labels=labels)
        self.bounds = (
            (GaugeMetricFamily(f"{name}_lower", f"Lower bound of the {_CI} of {name}.", labels=labels),
             GaugeMetricFamily(f"{name}_upper", f"Upper bound of the {_CI} of {name}.", labels=labels))
            if bounds else ()
        )  # fmt: skip

    def add(self, labels: list[str], value: float, lower: float = math.nan, upper: float = math.nan) -> None:
        if math.isnan(value):
            return
        self.main.add_metric(labels, float(value))
        for family, bound in zip(self.bounds, (lower, upper), strict=False):
            if not math.isnan(bound):
                family.add_metric(labels, float(bound))

    def families(self) -> list[Metric]:
        return [self.main, *self.bounds]


class SnapshotCollector(Collector):
    """A custom collector over whatever snapshot ``source`` returns (None before the first computation)."""

    def __init__(self, source: Callable[[], Snapshot | None], evaluation_interval: str) -> None:
        self.source = source
        self.every = evaluation_interval

    def collect(self) -> Iterator[Metric]:
        snapshot = self.source()
        if snapshot is None:
            return
        cadence = f" Computed every {self.every} over the event-time window in the window label."
        rate = _Family("model_positive_prediction_rate", "Share of predictions that are positive (selection rate)."
                       + cadence, _GROUP, bounds=True)  # fmt: skip
        tpr = _Family("model_true_positive_rate", "True positive rate among labelled predictions." + cadence, _GROUP,
                      bounds=True)  # fmt: skip
        fpr = _Family("model_false_positive_rate", "False positive rate among labelled predictions." + cadence,
                      _GROUP, bounds=True)  # fmt: skip
        samples = _Family("model_subgroup_samples", "Predictions in the window." + cadence, _GROUP)
        labelled = _Family("model_subgroup_labelled_samples", "Labelled predictions in the window." + cadence, _GROUP)
        fraction = _Family("model_labelled_fraction", "Labelled / all predictions in the window: low means the "
                           "model's error rates are not yet known." + cadence, _GROUP)  # fmt: skip
        pairs = {m: _Family(f"model_{m}", _PAIR_HELP[m] + "; absent when the comparison has too few samples."
                            + cadence, _PAIR, bounds=True) for m in METRIC_NAMES}  # fmt: skip
        insufficient = GaugeMetricFamily(
            "model_comparison_insufficient_samples",
            "1 when a group of the comparison has fewer than min_samples predictions (labelled ones for "
            "equalised_odds_difference) in the window, so the metric is not reported." + cadence,
            labels=[*_PAIR, "metric"],
        )

        for window, ev in snapshot.evaluations:
            base = [snapshot.model_id, ev.attribute.name, window]
            names = [*ev.attribute.groups, "overall"]
            for stats, offset in ((ev.groups, 0), (ev.overall, len(ev.attribute.groups))):
                for i in range(len(stats.samples)):
                    labels = [*base, names[offset + i]]
                    rate.add(labels, stats.selection_rate[i], *(b[i] for b in stats.selection_rate_ci))
                    tpr.add(labels, stats.true_positive_rate[i], *(b[i] for b in stats.true_positive_rate_ci))
                    fpr.add(labels, stats.false_positive_rate[i], *(b[i] for b in stats.false_positive_rate_ci))
                    samples.add(labels, stats.samples[i])
                    labelled.add(labels, stats.labelled[i])
                    if stats.samples[i]:
                        fraction.add(labels, stats.labelled[i] / stats.samples[i])
            for metric, family in pairs.items():
                value, lower, upper = ev.metric(metric)
                ok = ev.sufficient(metric)
                for k, (a, b) in enumerate(ev.attribute.pairs):
                    ga, gb = ev.attribute.groups[a], ev.attribute.groups[b]
                    labels = [*base, f"{ga}_vs_{gb}", ga, gb]
                    insufficient.add_metric([*labels, metric], 0.0 if ok[k] else 1.0)
                    if ok[k]:
                        family.add(labels, value[k], lower[k], upper[k])

        for family in (rate, tpr, fpr, samples, labelled, fraction, *pairs.values()):
            yield from family.families()
        yield insufficient
        yield from self._counters(snapshot)
        yield from detector_families(snapshot)

    @staticmethod
    def _counters(snapshot: Snapshot) -> Iterator[Metric]:
        predictions = CounterMetricFamily(
            "fairness_predictions", "Predictions counted by this replica since it started (or since its checkpoint), "
            "by predicted class: sum across replicas with the shipped recording rules.",
            labels=["model_id", "attribute", "subgroup", "predicted"])  # fmt: skip
        outcomes = CounterMetricFamily(
            "fairness_labelled_predictions", "Labelled predictions counted by this replica, by outcome.",
            labels=["model_id", "attribute", "subgroup", "outcome"])  # fmt: skip
        groups = {ev.attribute.name: ev.attribute.groups for _, ev in snapshot.evaluations}
        for attribute, counts in snapshot.totals.items():
            for i, group in enumerate(groups[attribute]):
                labels = [snapshot.model_id, attribute, group]
                predictions.add_metric([*labels, "1"], float(counts[i, PRED_POS]))
                predictions.add_metric([*labels, "0"], float(counts[i, PRED_NEG]))
                for column in (TP, FP, TN, FN):
                    outcomes.add_metric([*labels, COUNT_NAMES[column]], float(counts[i, column]))
        yield predictions
        yield outcomes


_DETECTOR_PAIR = ["model_id", "attribute", "dimension", "group_a", "group_b", "metric", "direction"]
_DETECTOR_SUBGROUP = ["model_id", "attribute", "subgroup", "direction"]


def detector_families(snapshot: Snapshot) -> Iterator[Metric]:
    """The change detectors: each CUSUM statistic, the model's alarm level, and the steps taken."""
    if snapshot.detection is None or snapshot.detectors is None:
        return
    bank, detection = snapshot.detectors, snapshot.detection
    model = snapshot.model_id
    pairs = GaugeMetricFamily(
        "fairness_detector_statistic", "CUSUM of the exact log likelihood ratio of a gap of twice the threshold "
        "(impact ratio: threshold squared) in the `direction` against equal rates, one step per bucket: the "
        "evidence of a change now, in nats.", labels=_DETECTOR_PAIR)  # fmt: skip
    subgroups = GaugeMetricFamily(
        "fairness_subgroup_detector_statistic", "CUSUM of the log likelihood ratio of a subgroup's selection rate "
        "moving by twice alerting.rate_shift from its own baseline.",
        labels=_DETECTOR_SUBGROUP)  # fmt: skip
    pair_alarms = GaugeMetricFamily(
        "fairness_detector_alarm", "1 while the detector is in alarm: raised when its Shiryaev-Roberts evidence "
        "reaches fairness_detector_alarm_level, held until its CUSUM statistic is back at 0.",
        labels=_DETECTOR_PAIR)  # fmt: skip
    subgroup_alarms = GaugeMetricFamily(
        "fairness_subgroup_detector_alarm", "1 while the subgroup's detector is in alarm (as fairness_detector_alarm).",
        labels=_DETECTOR_SUBGROUP)  # fmt: skip
    state = detection.state
    for detector, value, active in zip(bank.detectors, state.statistic.tolist(), state.active.tolist(), strict=True):
        if detector.subgroup:
            labels = [model, detector.attribute, detector.subgroup, detector.direction]
            subgroups.add_metric(labels, value)
            subgroup_alarms.add_metric(labels, float(active))
        else:
            labels = [model, detector.attribute, detector.dimension, detector.group_a, detector.group_b,
                      detector.metric, detector.direction]  # fmt: skip
            pairs.add_metric(labels, value)
            pair_alarms.add_metric(labels, float(active))
    level = GaugeMetricFamily(
        "fairness_detector_alarm_level", "The level of a detector's Shiryaev-Roberts evidence that raises an "
        "alarm: log(detectors x steps per day x replicas / alerting.false_pages_per_day).",
        labels=["model_id"])  # fmt: skip
    level.add_metric([model], bank.level)
    steps = CounterMetricFamily("fairness_detector_steps", "Detector steps taken (at most one per bucket).",
                                labels=["model_id"])  # fmt: skip
    steps.add_metric([model], float(detection.steps))
    yield from (pairs, pair_alarms, subgroups, subgroup_alarms, level, steps)


class CachedExposition:
    """Each snapshot serialised once, in prometheus-client's own text format, plain and gzipped.

    Rendering ten thousand series costs a computation's worth of CPU; doing it per scrape would let ten scrapers
    starve ingest of the GIL. The computation job calls :meth:`update`; a scrape only copies bytes.
    """

    def __init__(self, evaluation_interval: str) -> None:
        self.every = evaluation_interval
        self._bytes = (b"", gzip.compress(b""))  # (text, gzipped), swapped as one reference

    def update(self, snapshot: Snapshot) -> None:
        """Serialise a new snapshot (on the computation's thread)."""
        registry = CollectorRegistry(auto_describe=False)
        registry.register(SnapshotCollector(lambda: snapshot, self.every))
        text = generate_latest(registry)
        gzipped = gzip.compress(text, compresslevel=6)
        self._bytes = (text, gzipped)

    def page(self, registry: CollectorRegistry, accept_encoding: str) -> tuple[bytes, bool]:
        """The whole /metrics page: the live registry (health) then the cached snapshot; gzipped when accepted.

        Two gzip members in a row are one valid gzip stream (RFC 1952), so the cached member is reused as is.
        """
        live = generate_latest(registry)
        text, gzipped = self._bytes
        if "gzip" in accept_encoding:
            return gzip.compress(live, compresslevel=1) + gzipped, True
        return live + text, False
