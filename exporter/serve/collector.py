"""Render each Snapshot for /metrics: fresh metric families per snapshot, nothing mutated in place.

A series that leaves the data (a window that empties, a comparison that becomes insufficient) leaves /metrics
by itself. Each snapshot is serialised once (CachedExposition); a scrape never triggers or waits for a computation.
"""

from __future__ import annotations

import math
import struct
import threading
import zlib
from collections.abc import Callable, Iterator
from typing import Final, NamedTuple

import numpy as np
from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.exposition import choose_encoder
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

from exporter.core.fairness import COUNT_NAMES, FN, FP, PRED_NEG, PRED_POS, TN, TP
from exporter.core.metric_table import METRICS
from exporter.serve.snapshot import Snapshot

_CI = "95% interval"
_PAIR = ["model_id", "attribute", "window", "dimension", "group_a", "group_b"]
_GROUP = ["model_id", "attribute", "window", "subgroup"]


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
        pairs = {m: _Family(METRICS[m].prometheus_name, METRICS[m].help + cadence, _PAIR, bounds=True)
                 for m in snapshot.metrics}  # fmt: skip
        insufficient = GaugeMetricFamily(
            "model_comparison_insufficient_samples",
            "1 when the metric is not reported for the comparison: a group has fewer than min_samples of what the "
            "metric counts (predictions; labelled positives and negatives for TPR/FPR-based metrics), the metric "
            "is undefined, or its interval is wider than max_interval_width." + cadence,
            labels=[*_PAIR, "metric"],
        )
        unknown = _Family("model_subgroup_unknown_samples", "Predictions in the window whose value of the attribute "
                          "is outside its groups or missing: its unknown category, counted in the overall rate and "
                          "in no comparison." + cadence, ["model_id", "attribute", "window"])  # fmt: skip

        for window, ev in snapshot.evaluations:
            base = [snapshot.model_id, ev.attribute.name, window]
            unknown.add(base, float(ev.unknown_samples))
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

        for family in (rate, tpr, fpr, samples, labelled, fraction, unknown, *pairs.values()):
            yield from family.families()
        yield insufficient
        yield from self._scores(snapshot, cadence)
        yield from self._settings(snapshot)
        yield from self._counters(snapshot)
        yield from detector_families(snapshot)

    @staticmethod
    def _scores(snapshot: Snapshot, cadence: str) -> Iterator[Metric]:
        """Per-subgroup score histograms (a model that emits scores): calibration within groups, and the LL144
        scoring rate (the share above the overall median) by ``histogram_quantile``, in PromQL."""
        if not snapshot.score_bounds:
            return
        family = HistogramMetricFamily(
            "model_prediction_score", "Scores of the predictions in the window, per subgroup (subgroup=\"overall\": "
            "every prediction). Windowed, not a counter: read it without rate()." + cadence, labels=_GROUP)
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
    def _settings(snapshot: Snapshot) -> Iterator[Metric]:
        """The configured thresholds and limits as series, so one rule file serves every model's config."""
        threshold = GaugeMetricFamily("fairness_threshold", "The threshold of a metric, as configured or the metric "
                                      "table's default (differences pass at or below it, ratios at or above it).",
                                      labels=["model_id", "metric"])  # fmt: skip
        width = GaugeMetricFamily("fairness_max_interval_width", "A metric is reported only when its 95% interval's "
                                  "half-width is at most this.", labels=["model_id", "metric"])  # fmt: skip
        min_samples = GaugeMetricFamily("fairness_min_samples", "A comparison needs at least this many of what its "
                                        "metric counts in each group.", labels=["model_id"])  # fmt: skip
        for metric, value in snapshot.thresholds:
            threshold.add_metric([snapshot.model_id, metric], value)
        if snapshot.evaluations:
            ev = snapshot.evaluations[0][1]
            for metric in snapshot.metrics:
                width.add_metric([snapshot.model_id, metric], ev.max_widths[metric])
            min_samples.add_metric([snapshot.model_id], ev.min_samples)
        yield from (threshold, width, min_samples)

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


class Page(NamedTuple):
    """One /metrics response: its body, content type and whether the body is gzipped."""

    body: bytes
    content_type: str
    gzipped: bool


class Rendered(NamedTuple):
    """A snapshot's exposition in one format: the text, its raw deflate stream ended by a sync flush (no final
    block: the live part's blocks follow it) and its CRC-32, so that a scrape deflates and checksums only the small
    live part (the CRC of the whole megabyte-sized page took most of a scrape's CPU)."""

    text: bytes
    deflated: bytes
    crc: int

    @classmethod
    def of(cls, text: bytes) -> Rendered:
        return cls(text, _deflate(text, 6, final=False), zlib.crc32(text))


_GZIP_HEADER: Final = b"\x1f\x8b\x08\x00\x00\x00\x00\x00\x00\xff"  # deflate, no name, no mtime, OS unknown
_OM_EOF: Final = b"# EOF\n"
MAX_FORMATS: Final = 4
"""Formats kept per snapshot: the text format, OpenMetrics and a few escaping variants clients may ask for."""


def _deflate(text: bytes, level: int, final: bool) -> bytes:
    compressor = zlib.compressobj(level, zlib.DEFLATED, -zlib.MAX_WBITS)
    return compressor.compress(text) + compressor.flush(zlib.Z_FINISH if final else zlib.Z_SYNC_FLUSH)


def gzip_one_member(head: Rendered, tail: bytes) -> bytes:
    """``head.text + tail`` as ONE gzip member, reusing the head's cached deflate stream and CRC-32.

    A sync flush ended the head's deflate blocks on a byte boundary without a final block, so the tail's
    independently compressed blocks (the last one final) follow it in the same member (as pigz joins blocks); the
    trailer's CRC-32 continues the head's over the tail. Single-member decoders (curl --compressed, urllib3) read
    the whole page.
    """
    crc = zlib.crc32(tail, head.crc)
    size = (len(head.text) + len(tail)) & 0xFFFFFFFF
    return b"".join((_GZIP_HEADER, head.deflated, _deflate(tail, 1, final=True), struct.pack("<II", crc, size)))


class CachedExposition:
    """Each snapshot serialised once per format, plain and deflated, on the computation's thread.

    Rendering ten thousand series costs a computation's worth of CPU; doing it per scrape would let ten scrapers
    starve ingest of the GIL. The computation job calls :meth:`update`; a scrape renders only the small live
    registry, gzips it and copies the cached bytes. The format follows the Accept header as prometheus-client's
    own exposition does (:func:`choose_encoder`): the text format 0.0.4 by default, OpenMetrics when asked. A
    format first asked for is rendered by that scrape, then by every later :meth:`update`; a format nobody asked
    for is never rendered.
    """

    def __init__(self, evaluation_interval: str) -> None:
        self.every = evaluation_interval
        # only the formats scrapers asked for: Prometheus asks for OpenMetrics, so the text format is not rendered
        self._encoders: dict[str, Callable[[CollectorRegistry], bytes]] = {}
        self._lock = threading.Lock()
        # (the snapshot's registry, {content type: its rendering}), swapped as one reference
        self._current: tuple[CollectorRegistry, dict[str, Rendered]] = (CollectorRegistry(), {})

    def _render(self, registry: CollectorRegistry, encoder: Callable[[CollectorRegistry], bytes]) -> Rendered:
        return Rendered.of(encoder(registry).removesuffix(_OM_EOF))  # one "# EOF" line: the live part's, last

    def update(self, snapshot: Snapshot) -> None:
        """Serialise a new snapshot in every format asked for so far (on the computation's thread)."""
        registry = CollectorRegistry(auto_describe=False)
        registry.register(SnapshotCollector(lambda: snapshot, self.every))
        with self._lock:
            encoders = dict(self._encoders)
        self._current = (registry, {kind: self._render(registry, encoder) for kind, encoder in encoders.items()})

    def _cached(self, content_type: str, encoder: Callable[[CollectorRegistry], bytes]) -> Rendered:
        registry, rendered = self._current
        if content_type in rendered:
            return rendered[content_type]
        page = self._render(registry, encoder)
        with self._lock:
            # bounded: an Accept header's version and escaping are the client's to choose
            if content_type in self._encoders or len(self._encoders) < MAX_FORMATS:
                self._encoders[content_type] = encoder
                rendered[content_type] = page
        return page

    def page(self, registry: CollectorRegistry, accept_encoding: str, accept: str = "") -> Page:
        """The whole /metrics page: the cached snapshot then the live registry (health); gzipped when accepted."""
        encoder, content_type = choose_encoder(accept)
        live = encoder(registry)
        cached = self._cached(content_type, encoder)
        if "gzip" in accept_encoding:
            return Page(gzip_one_member(cached, live), content_type, True)
        return Page(cached.text + live, content_type, False)
