"""Render each Snapshot for /metrics: fresh metric families per snapshot, nothing mutated in place.

A series that leaves the data (a window that empties, a comparison that falls below min_samples) leaves /metrics
by itself. Each snapshot is serialised once (CachedExposition); a scrape never triggers or waits for a computation.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterator, Sequence

import numpy as np
from prometheus_client import CollectorRegistry
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    InfoMetricFamily,
    Metric,
)
from prometheus_client.exposition import choose_encoder
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

from exporter.core.conditional import CONDITIONAL_METRICS
from exporter.core.conditional import metric as table_metric
from exporter.core.fairness import COUNT_NAMES, FN, FP, PRED_NEG, PRED_POS, TN, TP
from exporter.core.metric_table import EVIDENCE, METRICS
from exporter.serve.estimated import calibration_detector_families, estimated_families
from exporter.serve.explained import explanation_families
from exporter.serve.exposition import DEFAULT_CONTENT_TYPE, EXPLANATIONS, MAX_FORMATS, Page, Pages
from exporter.serve.families import Family, put
from exporter.serve.snapshot import FleetSnapshot, Snapshot
from exporter.stream.state.proxy import evidence_rows

PROXY = "_proxy"
PROXIED = (" Proxy (proxy: true): the attribute was never collected; each prediction counts in each group by its BISG "
           "posterior (surname and ZCTA), intervals include the proxy's uncertainty, and gaps are understated "
           "(docs/auditor/proxy.md).")  # fmt: skip
_PAIR = ["model_id", "attribute", "window", "dimension", "group_a", "group_b"]
_GROUP = ["model_id", "attribute", "window", "subgroup"]


def _evidence(snapshots: Sequence[Snapshot], cadence: str) -> Metric:
    """Per proxy attribute, its predictions in the window by what their BISG posterior rests on (the gate's
    ``proxy_evidence``): how much of a gap the geography or the surname alone carries."""
    family = GaugeMetricFamily("model_proxy_evidence_samples", "Predictions in the window of a proxy attribute by "
                               "what their BISG posterior rests on: surname_and_zcta, surname_only, zcta_only, neither "
                               "(its unknown category), unrecorded (restored from a checkpoint written before this "
                               "was counted)." + cadence, labels=["model_id", "attribute", "window", "evidence"])
    for snapshot in snapshots:
        for window, attribute, counts in snapshot.proxy_evidence:
            for kind, n in evidence_rows(counts).items():
                family.add_metric([snapshot.model_id, attribute, window, kind], float(n))
    return family


class SnapshotCollector(Collector):
    """A custom collector over whatever snapshot ``source`` returns (None before the first computation)."""

    def __init__(self, source: Callable[[], FleetSnapshot | None], evaluation_interval: str) -> None:
        self.source = source
        self.every = evaluation_interval

    def collect(self) -> Iterator[Metric]:
        fleet = self.source()
        if fleet is None:
            return
        snapshots = fleet.models
        cadence = f" Computed every {self.every} over the event-time window in the window label."
        yield from self._families(snapshots, cadence)
        if any(s.proxied for s in snapshots):
            yield from self._families(snapshots, PROXIED + cadence, PROXY)
            yield _evidence(snapshots, cadence)
        yield from estimated_families(snapshots, cadence)
        yield from self._worst(snapshots, cadence)
        yield from self._scores(snapshots, cadence)
        yield from self._settings(snapshots)
        yield from self._counters(snapshots)
        yield from detector_families(snapshots)
        yield from explanation_families(snapshots, cadence)

    @staticmethod
    def _families(snapshots: Sequence[Snapshot], cadence: str, suffix: str = "") -> Iterator[Metric]:
        """The subgroups' rates and the comparisons of every evaluation; with ``suffix`` (PROXY), of the proxy
        attributes' posterior-weighted evaluations, under names of their own."""
        rate = Family(f"model_positive_prediction_rate{suffix}", "Share of predictions that are positive (selection "
                       "rate)." + cadence, _GROUP, bounds=True)  # fmt: skip
        tpr = Family(f"model_true_positive_rate{suffix}", "True positive rate among labelled predictions." + cadence,
                      _GROUP, bounds=True)  # fmt: skip
        fpr = Family(f"model_false_positive_rate{suffix}", "False positive rate among labelled predictions."
                      + cadence, _GROUP, bounds=True)  # fmt: skip
        samples = Family(f"model_subgroup_samples{suffix}", "Predictions in the window." + cadence, _GROUP)
        labelled = Family(f"model_subgroup_labelled_samples{suffix}", "Labelled predictions in the window."
                           + cadence, _GROUP)  # fmt: skip
        fraction = Family(f"model_labelled_fraction{suffix}", "Labelled / all predictions in the window: low means "
                           "the model's error rates are not yet known." + cadence, _GROUP)  # fmt: skip
        exported = {m for snapshot in snapshots for m in snapshot.metrics}
        pairs = {m: Family(table_metric(m).prometheus_name + suffix, table_metric(m).help + cadence, _PAIR,
                            bounds=True)
                 for m in [*METRICS, *CONDITIONAL_METRICS] if m in exported}  # fmt: skip
        insufficient = GaugeMetricFamily(
            f"model_comparison_insufficient_samples{suffix}",
            "1 when the metric has no value for the comparison: a group has fewer than min_samples of what the "
            "metric counts (predictions; labelled positives and negatives for TPR/FPR-based metrics), or the metric "
            "is undefined (a ratio whose rate is 0 in a group: no positive prediction, for disparate impact). Else 0, "
            "and the value is exported with its interval however wide." + cadence,
            labels=[*_PAIR, "metric"],
        )
        evidence = GaugeMetricFamily(
            f"model_comparison_evidence{suffix}",
            "1 for the state of what the metric's 95% interval says against its threshold (fairness_threshold), 0 for "
            "the two others: pass (wholly on the passing side), fail (wholly beyond), inconclusive (it contains the "
            "threshold, or the comparison has no value)." + cadence,
            labels=[*_PAIR, "metric", "evidence"],
        )
        thresholds = {s.model_id: {m: t for m, t, _ in s.thresholds} for s in snapshots}
        unknown = Family(f"model_subgroup_unknown_samples{suffix}", "Predictions in the window whose value of the "
                          "attribute is outside its groups or missing: its unknown category, counted in the overall "
                          "rate and in no comparison." + cadence, ["model_id", "attribute", "window"])  # fmt: skip

        for snapshot, window, ev in ((s, w, e) for s in snapshots for w, e in (s.proxied if suffix else
                                                                               s.evaluations)):  # fmt: skip
            base = [snapshot.model_id, ev.attribute.name, window]
            unknown.add(base, ev.unknown_samples)
            names = [*ev.attribute.groups, "overall"]
            for stats, offset in ((ev.groups, 0), (ev.overall, len(ev.attribute.groups))):
                rates = [(family, getattr(stats, name).tolist(), *(b.tolist() for b in getattr(stats, f"{name}_ci")))
                         for family, name in ((rate, "selection_rate"), (tpr, "true_positive_rate"),
                                              (fpr, "false_positive_rate"))]  # fmt: skip
                for i, (n, n_labelled) in enumerate(zip(stats.samples.tolist(), stats.labelled.tolist(), strict=True)):
                    named = dict(zip(_GROUP, [*base, names[offset + i]], strict=True))
                    for family, value, lower, upper in rates:
                        family.add_named(named, value[i], lower[i], upper[i])
                    samples.add_named(named, n)
                    labelled.add_named(named, n_labelled)
                    if n:
                        fraction.add_named(named, n_labelled / n)
            compared = [dict(zip(_PAIR, [*base, f"{ga}_vs_{gb}", ga, gb], strict=True)) for ga, gb in
                        ((ev.attribute.groups[a], ev.attribute.groups[b]) for a, b in ev.attribute.pairs)]
            for metric in snapshot.metrics:
                family = pairs[metric]
                value, lower, upper = (x.tolist() for x in ev.metric(metric))
                ok = ev.sufficient(metric).tolist()
                states = ev.evidence(metric, thresholds[snapshot.model_id][metric]).tolist()
                for k, named in enumerate(compared):
                    judged = {**named, "metric": metric}
                    put(insufficient, judged, 0.0 if ok[k] else 1.0)
                    for state in EVIDENCE:
                        put(evidence, {**judged, "evidence": state}, 1.0 if states[k] == state else 0.0)
                    if ok[k]:
                        family.add_named(named, value[k], lower[k], upper[k])

        for family in (rate, tpr, fpr, samples, labelled, fraction, unknown, *pairs.values()):
            yield from family.families()
        yield insufficient
        yield evidence

    @staticmethod
    def _worst(snapshots: Sequence[Snapshot], cadence: str) -> Iterator[Metric]:
        """Per attribute and metric: its worst comparison with the interval that holds over all its judged ones, and
        how many were judged (the K of that interval and of the multiplicity rule); per subgroup, its scores' AUC
        (a model comparing scores)."""
        attribute = ["model_id", "attribute", "window", "metric"]
        worst = Family("model_worst_comparison", "The metric's worst comparison of the attribute (largest "
                        "difference, smallest ratio) over those judged, its bounds a 95% interval for the true worst "
                        "that holds over all of them at once (Bonferroni); absent when none was judged." + cadence,
                        [*attribute, "dimension", "group_a", "group_b"], bounds=True)  # fmt: skip
        judged = GaugeMetricFamily("model_comparisons_judged", "Comparisons of the metric and attribute that have a "
                                   "value (meet min_samples): the K over which the worst comparison's interval and "
                                   "the multiplicity rule of its fail evidence hold." + cadence, labels=attribute)
        auc = Family("model_score_auc", "AUC of the model's scores (binned by events.score_buckets) among the "
                      "subgroup's labelled predictions, with DeLong's 95% interval; only with a score metric "
                      "(auc_difference) configured." + cadence, ["model_id", "attribute", "window", "subgroup"],
                      bounds=True)  # fmt: skip
        ece = Family("model_score_calibration_error", "Expected calibration error of the model's scores over the "
                      "score bins among the subgroup's labelled predictions, with a conservative 95% interval; only "
                      "with calibration_difference configured." + cadence, ["model_id", "attribute", "window",
                      "subgroup"], bounds=True)  # fmt: skip
        for snapshot, window, ev in ((s, w, e) for s in snapshots for w, e in s.evaluations):
            groups = ev.attribute.groups
            for family, scored in ((auc, ev.auc()), (ece, ev.calibration())):
                for i, group in enumerate(groups) if scored is not None else ():
                    family.add([snapshot.model_id, ev.attribute.name, window, group], *(x[i] for x in scored or ()))
            for metric in snapshot.metrics:
                w = ev.worst(metric)
                labels = [snapshot.model_id, ev.attribute.name, window, metric]
                judged.add_metric(labels, float(w.judged[0]))
                if w.pair[0] >= 0:
                    a, b = (groups[g] for g in ev.attribute.pairs[w.pair[0]])
                    worst.add([*labels, f"{a}_vs_{b}", a, b], w.value[0], w.lower[0], w.upper[0])
        yield from worst.families()
        yield judged
        if any(table_metric(m).scores for s in snapshots for m in s.metrics):
            yield from (*auc.families(), *ece.families())

    @staticmethod
    def _scores(snapshots: Sequence[Snapshot], cadence: str) -> Iterator[Metric]:
        """Per-subgroup score histograms (a model that emits scores): calibration within groups, and the LL144
        scoring rate (the share above the overall median) by ``histogram_quantile``, in PromQL."""
        if not any(s.score_bounds for s in snapshots):
            return
        family = HistogramMetricFamily(
            "model_prediction_score", "Scores of the predictions in the window, per subgroup (subgroup=\"overall\": "
            "every prediction). Windowed, not a counter: read it without rate()." + cadence, labels=_GROUP)
        for snapshot in snapshots:
            les = [*(floatToGoString(b) for b in snapshot.score_bounds), "+Inf"]
            groups = {ev.attribute.name: ev.attribute.groups for _, ev in snapshot.evaluations}
            for window, attribute, bins, sums in snapshot.scores:
                names = groups[attribute]
                rows = [(name, bins[i], sums[i]) for i, name in enumerate(names)]
                rows.append(("overall", bins.sum(axis=0), sums.sum()))  # the unknown category counts here too
                for name, counts, total in rows:
                    cumulative = np.cumsum(counts).tolist()
                    family.add_metric([snapshot.model_id, attribute, window, name],
                                      list(zip(les, map(float, cumulative), strict=True)), float(total))
        yield family

    @staticmethod
    def _settings(snapshots: Sequence[Snapshot]) -> Iterator[Metric]:
        """The configured version, thresholds and limits as series, so one rule file serves every model's config
        (and a canary gate tells blocking metrics from the others)."""
        info = InfoMetricFamily("fairness_model", "The model's configured model_version (empty when the config names "
                                "none), 1 for every model the daemon monitors.", labels=["model_id"])  # fmt: skip
        threshold = GaugeMetricFamily("fairness_threshold", "The threshold of a metric, as configured or the metric "
                                      "table's default (differences pass at or below it, ratios at or above it); "
                                      "severity: its severity_on_fail, none for a seed metric exported without being "
                                      "configured (the gate does not judge it).",
                                      labels=["model_id", "metric", "severity"])  # fmt: skip
        min_samples = GaugeMetricFamily("fairness_min_samples", "A comparison needs at least this many of what its "
                                        "metric counts in each group.", labels=["model_id"])  # fmt: skip
        for snapshot in snapshots:
            info.add_metric([snapshot.model_id], {"model_version": snapshot.model_version or ""})
            for metric, value, severity in snapshot.thresholds:
                threshold.add_metric([snapshot.model_id, metric, severity], value)
            if snapshot.evaluations:
                min_samples.add_metric([snapshot.model_id], snapshot.evaluations[0][1].min_samples)
        yield from (info, threshold, min_samples)

    @staticmethod
    def _counters(snapshots: Sequence[Snapshot]) -> Iterator[Metric]:
        predictions = CounterMetricFamily(
            "fairness_predictions", "Predictions counted by this replica since it started (or since its checkpoint), "
            "by predicted class: sum across replicas with the shipped recording rules.",
            labels=["model_id", "attribute", "subgroup", "predicted"])  # fmt: skip
        outcomes = CounterMetricFamily(
            "fairness_labelled_predictions", "Labelled predictions counted by this replica, by outcome.",
            labels=["model_id", "attribute", "subgroup", "outcome"])  # fmt: skip
        for snapshot in snapshots:
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


def detector_families(snapshots: Sequence[Snapshot]) -> Iterator[Metric]:
    """The change detectors: each CUSUM statistic, the model's alarm level, and the steps taken."""
    watched = [s for s in snapshots if s.detection is not None and s.detectors is not None]
    if not watched:
        return
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
    level = GaugeMetricFamily(
        "fairness_detector_alarm_level", "The level of a detector's Shiryaev-Roberts evidence that raises an "
        "alarm: log(detectors x steps per day / alerting.false_pages_per_day).",
        labels=["model_id"])  # fmt: skip
    steps = CounterMetricFamily("fairness_detector_steps", "Detector steps taken (at most one per bucket).",
                                labels=["model_id"])  # fmt: skip
    calibration, calibration_alarms = calibration_detector_families()
    for snapshot in watched:
        bank, detection, model = snapshot.detectors, snapshot.detection, snapshot.model_id
        assert bank is not None and detection is not None
        state = detection.state
        for detector, value, active in zip(bank.detectors, state.statistic.tolist(), state.active.tolist(),
                                           strict=True):  # fmt: skip
            if detector.predicted:
                labels = [model, detector.attribute, detector.subgroup, detector.predicted, detector.direction]
                calibration.add_metric(labels, value)
                calibration_alarms.add_metric(labels, float(active))
            elif detector.subgroup:
                labels = [model, detector.attribute, detector.subgroup, detector.direction]
                subgroups.add_metric(labels, value)
                subgroup_alarms.add_metric(labels, float(active))
            else:
                labels = [model, detector.attribute, detector.dimension, detector.group_a, detector.group_b,
                          detector.metric, detector.direction]  # fmt: skip
                pairs.add_metric(labels, value)
                pair_alarms.add_metric(labels, float(active))
        level.add_metric([model], bank.level)
        steps.add_metric([model], float(detection.steps))
    yield from (pairs, pair_alarms, subgroups, subgroup_alarms, level, steps)
    if len(calibration.samples):
        yield from (calibration, calibration_alarms)


class _Collected(Collector):
    """Metric families collected once, rendered by every encoder that asks (encoders only read them)."""

    def __init__(self, families: list[Metric]) -> None:
        self.families = families

    def collect(self) -> Iterator[Metric]:
        return iter(self.families)


class CachedExposition:
    """Each snapshot serialised once per format asked for, on the computation's thread (the daemon's process).

    Rendering ten thousand series costs a computation's worth of CPU; doing it per scrape would let ten scrapers
    starve ingest of the GIL. The computation job calls :meth:`update`; the daemon publishes :meth:`texts` and the
    small live registry's :meth:`live` rendering to the HTTP worker process, which assembles and serves the pages
    (exporter.serve.exposition.Pages). The format follows the Accept header as prometheus-client's own exposition
    does (:func:`choose_encoder`): the text format 0.0.4 by default, OpenMetrics when asked. A format first asked
    for (:meth:`ask`) is rendered then, and by every later :meth:`update`; a format nobody asked for is never
    rendered.
    """

    def __init__(self, evaluation_interval: str) -> None:
        self.every = evaluation_interval
        # only the formats scrapers asked for (Prometheus asks for OpenMetrics); replaced, never mutated
        self._encoders: dict[str, Callable[[CollectorRegistry], bytes]] = {}
        self._rendering = threading.Lock()  # one update or ask at a time
        # (the snapshot's registry, generation, {content type: its rendering}), swapped as one reference
        self._current: tuple[CollectorRegistry, int, dict[str, bytes]] = (CollectorRegistry(), 0, {})

    def update(self, snapshot: FleetSnapshot) -> None:
        """Serialise a new snapshot in every format asked for so far (on the computation's thread); its metric
        families are built once, whatever the number of formats."""
        registry = CollectorRegistry(auto_describe=False)
        registry.register(_Collected(list(SnapshotCollector(lambda: snapshot, self.every).collect())))
        explained = {m.model_id: m.explained for m in snapshot.models if m.explained is not None}
        with self._rendering:
            texts = {kind: encoder(registry) for kind, encoder in self._encoders.items()}
            if explained:
                texts[EXPLANATIONS] = json.dumps(explained, allow_nan=False).encode()
            self._current = (registry, self._current[1] + 1, texts)

    def ask(self, accept: str) -> str:
        """The content type for an Accept header, rendered from now on; bounded by :data:`MAX_FORMATS` (an Accept
        header's version and escaping are the client's to choose), beyond which the default format is served."""
        encoder, kind = choose_encoder(accept)
        if kind in self._encoders:
            return kind
        if len(self._encoders) >= MAX_FORMATS and kind != DEFAULT_CONTENT_TYPE:
            return self.ask("")
        with self._rendering:
            if kind not in self._encoders:
                registry, generation, texts = self._current
                self._current = (registry, generation + 1, {**texts, kind: encoder(registry)})
                self._encoders = {**self._encoders, kind: encoder}
        return kind

    def texts(self) -> tuple[int, dict[str, bytes]]:
        """The current snapshot's rendering per content type, and a number that changes whenever it changes."""
        _, generation, texts = self._current
        return generation, texts

    def live(self, registry: CollectorRegistry) -> dict[str, bytes]:
        """The live registry (health, lag) rendered in every format asked for."""
        return {kind: encoder(registry) for kind, encoder in self._encoders.items()}

    def page(self, registry: CollectorRegistry, accept_encoding: str, accept: str = "") -> Page:
        """The whole /metrics page as the HTTP worker serves it: the same parts, assembled by the same Pages."""
        kind = self.ask(accept)
        pages = Pages()
        pages.apply(self.texts()[1], self.live(registry))
        page = pages.get(kind, accept_encoding)
        assert page is not None, f"{kind} was asked for, so it is rendered"
        return page
