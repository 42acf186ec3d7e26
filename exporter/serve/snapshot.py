"""The scheduled computation: every model's window counts in, one complete immutable FleetSnapshot out."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from exporter.config import ModelSpec, Windowing
from exporter.core import estimate
from exporter.core.attributes import Attribute
from exporter.core.evaluate import Evaluation, evaluate_many
from exporter.health.counters import Health
from exporter.serve.segment_rows import excluded, explained
from exporter.stream.state.detection import Detection
from exporter.stream.state.detectors import DetectorBank
from exporter.stream.state.fleet import Fleet, Monitored
from exporter.stream.state.proxy import ProxyRing
from exporter.stream.state.segments import SegmentCounts, conditional

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Snapshot:
    """Everything /metrics shows about fairness, as of one computation."""

    model_id: str
    computed_at: float
    evaluations: tuple[tuple[str, Evaluation], ...]
    """(window name, evaluation) for every window and attribute."""
    totals: dict[str, np.ndarray]
    """Monotonic per-attribute counts since start, for the fleet-wide counters."""
    metrics: tuple[str, ...] = ()
    """The pairwise metrics to export (Config.exported_metrics)."""
    thresholds: tuple[tuple[str, float, str], ...] = ()
    """(metric, threshold, severity) of each exported metric, exported so that rules compare against the config."""
    detection: Detection | None = None
    """The change detectors' statistics after their latest step."""
    detectors: DetectorBank | None = None
    """What each detector watches, and the alarm level."""
    score_bounds: tuple[float, ...] = ()
    """Upper bounds of the score histograms (empty: the model emits no scores)."""
    scores: tuple[tuple[str, str, np.ndarray, np.ndarray], ...] = ()
    """(window, attribute, count per row and bin, sum of scores per row) for each window and attribute; the rows
    are the attribute's groups, then its unknown category."""
    model_version: str | None = None
    """The configured version of the model (fairness_model_info)."""
    estimated: tuple[tuple[str, estimate.Estimated], ...] = ()
    """(window, estimated comparisons) per window and attribute, for a model that estimates (estimation:)."""
    explained: dict[str, Any] | None = None
    """Per window, why each gap moved since the window before it (``segments:``; /explain serves it)."""
    conditional_excluded: dict[str, dict[str, int | None]] | None = None
    """Per window, the predictions its conditional metrics leave out, and why (``strata:``,
    :func:`exporter.serve.explained.excluded`)."""
    proxied: tuple[tuple[str, Evaluation], ...] = ()
    """(window, evaluation) for every window and proxy attribute (proxy:): posterior-weighted, never mixed with
    :attr:`evaluations` (exporter/stream/state/proxy.py; served with the suffix ``_proxy``)."""
    proxy_evidence: tuple[tuple[str, str, np.ndarray], ...] = ()
    """(window, proxy attribute, its predictions by what their posteriors rest on, in ``proxy.EVIDENCE`` order)."""


@dataclass(frozen=True)
class FleetSnapshot:
    """Every model's snapshot as of one computation: what /metrics shows, swapped in as one reference."""

    computed_at: float
    models: tuple[Snapshot, ...]


def estimated(spec: ModelSpec, reference: dict[str, np.ndarray], windows: dict[str, np.ndarray],
              split: Callable[[np.ndarray], dict[str, np.ndarray]]) -> tuple[tuple[str, estimate.Estimated], ...]:
    """The estimated comparisons of every window (its estimation counts, cut per attribute by ``split``) and
    attribute, against the reference's counts (``backtest`` calls this too)."""
    metrics = tuple(m for m in spec.exported_metrics if m in estimate.ESTIMATED_METRICS)
    return tuple((window, estimate.estimate_attribute(a, reference[a.name], split(counts)[a.name], metrics))
                 for window, counts in windows.items() for a in spec.attributes)  # fmt: skip


def proxied(spec: ModelSpec, ring: ProxyRing, windows: dict[str, np.ndarray]) -> tuple[tuple[str, Evaluation], ...]:
    """The evaluation of every window (its proxy counts, :meth:`WindowStore.window_proxy_counts`) and proxy
    attribute, by the core's weighted counts (``backtest`` calls this too)."""
    blocks = [(window, a, ring.split(counts)[a.name]) for window, counts in windows.items() for a in ring.attributes]
    evaluated = evaluate_many([(a, c) for _, a, c in blocks], spec.min_samples, spec.exported_metrics,
                              spec.multiplicity)  # fmt: skip
    return tuple((window, ev) for (window, _, _), ev in zip(blocks, evaluated, strict=True))


def conditioned(spec: ModelSpec, taken: Any, segments: SegmentCounts,
                split: Callable[[np.ndarray], dict[str, np.ndarray]],
                evaluated: Sequence[tuple[str, Evaluation]]) -> list[Evaluation]:  # fmt: skip
    """Each (window, evaluation) with the configured conditional metrics among its comparisons, from the counts per
    group and stratum of the window's current period (``taken``: :meth:`SegmentCounts.snapshot`), judged as the gate
    judges them: evidence under ``multiplicity:``, a worst comparison (``backtest`` calls this too)."""
    pairs = {a.name: (np.array([p[0] for p in a.pairs], np.int64), np.array([p[1] for p in a.pairs], np.int64))
             for a in spec.attributes}  # fmt: skip
    found = conditional(spec, taken, segments, split, pairs)
    out = []
    for window, ev in evaluated:
        strata, stratified = found[window, ev.attribute.name]
        out.append(ev.with_conditional(strata, {n: s.values for n, s in stratified.items()}))
    return out


@dataclass(frozen=True)
class _Gathered:
    """One model's window counts as of ``now``, read under its store's lock, with the blocks it evaluates."""

    monitored: Monitored
    now: float
    thresholds: tuple[tuple[str, float, str], ...]
    reference: dict[str, np.ndarray] | None
    detection: Detection
    proxies: tuple[tuple[str, Evaluation], ...]
    evidence: dict[str, np.ndarray]
    window_scores: dict[str, tuple[np.ndarray, np.ndarray]]
    estimation: dict[str, np.ndarray]
    by_segment: Any
    segment_others: tuple[np.ndarray, np.ndarray]
    """Each segment key's events without a value and past the cap since the counts began, read with ``by_segment``."""
    keys: list[str]
    blocks: list[tuple[Attribute, np.ndarray]]
    histograms: list[np.ndarray]
    labelled_sums: list[np.ndarray]

    @property
    def settings(self) -> tuple[Any, ...]:
        """What :func:`evaluate_many` is called with besides the blocks: models alike are evaluated in one pass."""
        spec = self.monitored.spec
        return (spec.min_samples, spec.exported_metrics, spec.multiplicity, spec.compares_scores,
                bool(self.labelled_sums), tuple((m, t) for m, t, _ in self.thresholds if m in spec.exported_metrics),
                spec.added_score_bound)


def _gather(monitored: Monitored, windowing: Windowing, now: float, thresholds: tuple[tuple[str, float, str], ...],
            reference: dict[str, np.ndarray] | None) -> _Gathered:  # fmt: skip
    """One model's windows and attributes as of ``now`` (``thresholds``: of its exported metrics, with their
    severity; ``reference``: the estimation reference's score counts per attribute, when it estimates), ready to
    evaluate."""
    spec, store = monitored.spec, monitored.store
    detection = store.detect(store.calibration_rows(reference) if reference is not None else None)
    with store.lock:  # counts and score histograms of the same events
        windows = store.window_counts(now)
        proxies = proxied(spec, store.proxy, store.window_proxy_counts(now))
        evidence = store.window_proxy_evidence(now)
        window_scores = store.window_scores(now)
        estimation = store.window_estimate_counts(now) if reference is not None or spec.compares_scores else {}
        labelled_sums = store.window_labelled_sums(now)
        by_segment = store.segments.snapshot(now) if spec.counted_columns else None
        others = (store.segments.missing_rows.copy(), store.segments.overflow_rows.copy())
    keys, blocks, histograms, labelled_sums_of = [], [], [], []
    for window in windowing.windows:
        by_attribute = store.layout.split(windows[window.name])
        labelled = store.layout.split(estimation[window.name]) if spec.compares_scores else {}
        summed = store.layout.split(labelled_sums[window.name]) if labelled_sums else {}
        for attribute in spec.attributes:
            if attribute.proxy is None:
                keys.append(window.name)
                blocks.append((attribute, by_attribute[attribute.name]))
                histograms.extend([labelled[attribute.name]] if labelled else [])
                labelled_sums_of.extend([summed[attribute.name]] if summed else [])
    return _Gathered(monitored, now, thresholds, reference, detection, proxies, evidence, window_scores, estimation,
                     by_segment, others, keys, blocks, histograms, labelled_sums_of)  # fmt: skip


def _evaluated(gathered: Sequence[_Gathered]) -> list[list[Evaluation]]:
    """Every model's evaluations, models of the same :attr:`_Gathered.settings` in one :func:`evaluate_many` pass
    (each block is evaluated alone within it: the numbers are those of a pass per model, at a fraction of numpy's
    per-call cost)."""
    alike: dict[tuple[Any, ...], list[int]] = {}
    for i, g in enumerate(gathered):
        alike.setdefault(g.settings, []).append(i)
    out: list[list[Evaluation]] = [[] for _ in gathered]
    for (min_samples, metrics, multiplicity, compares_scores, sums, thresholds, added_bound), members in alike.items():
        evaluated = evaluate_many([b for i in members for b in gathered[i].blocks], min_samples, metrics,
                                  multiplicity, scores=[h for i in members for h in gathered[i].histograms]
                                  if compares_scores else None,
                                  score_sums=[s for i in members for s in gathered[i].labelled_sums] if sums else None,
                                  thresholds=dict(thresholds), added_bound=added_bound)  # fmt: skip
        start = 0
        for i in members:
            out[i] = evaluated[start : start + len(gathered[i].blocks)]
            start += len(gathered[i].blocks)
    return out


def _snapshot(g: _Gathered, evaluated: list[Evaluation]) -> Snapshot:
    """One model's Snapshot from its gathered counts and their evaluations."""
    spec, store, by_segment = g.monitored.spec, g.monitored.store, g.by_segment
    metrics = spec.exported_metrics
    if by_segment is not None and spec.conditional_metrics:  # over the strata's counts, as the gate's (strata:)
        evaluated = conditioned(spec, by_segment, store.segments, store.layout.split,
                                list(zip(g.keys, evaluated, strict=True)))  # fmt: skip
        metrics = (*metrics, *spec.conditional_metrics)
    scores: list[tuple[str, str, np.ndarray, np.ndarray]] = []
    for window_name, (bins, sums) in g.window_scores.items():
        bins_of, sums_of = store.layout.split(bins), store.layout.split(sums)
        scores.extend((window_name, a.name, bins_of[a.name], sums_of[a.name]) for a in spec.attributes
                      if a.proxy is None)
    return Snapshot(spec.model_id, g.now, tuple(zip(g.keys, evaluated, strict=True)),
                    store.layout.split(store.totals_copy()), metrics, g.thresholds, g.detection,
                    store.detectors, score_bounds=spec.score_buckets, scores=tuple(scores),
                    model_version=spec.model_version,
                    estimated=estimated(spec, g.reference, g.estimation, store.layout.split)
                    if g.reference is not None and g.estimation else (),
                    explained=explained(spec, by_segment, store.segments, store.layout.split, g.segment_others)
                    if by_segment is not None and spec.segments else None,
                    conditional_excluded=excluded(spec, by_segment, store.segments, store.layout.split,
                                                  g.segment_others)
                    if by_segment is not None and spec.conditional_metrics else None,
                    proxied=g.proxies, proxy_evidence=tuple((window, a.name, counts[k]) for window, counts in
                                                            g.evidence.items()
                                                            for k, a in enumerate(store.proxy.attributes)))  # fmt: skip


class Computer:
    """Builds every model's Snapshot from the fleet and swaps them in with one reference assignment."""

    def __init__(
        self, fleet: Fleet, health: Health, clock: Callable[[], float] = time.time,
        on_snapshot: Callable[[FleetSnapshot], None] | None = None,
    ) -> None:  # fmt: skip
        """``on_snapshot`` runs after each swap, on the computation's thread (the daemon serialises it there)."""
        self.on_snapshot = on_snapshot
        self.fleet = fleet
        self.health = health
        self.clock = clock
        self.latest: FleetSnapshot | None = None
        self._computing = threading.Lock()
        """One computation at a time (the schedule's, a reload's): snapshots are published in the order taken."""
        self._facts: dict[str, tuple[ModelSpec, tuple[tuple[str, float, str], ...]]] = {}
        self.references: dict[str, dict[str, np.ndarray]] = {}
        """Per model that estimates (estimation:), its reference's score counts per attribute (the daemon reads the
        reference at start and on a reload)."""

    def _facts_of(self, spec: ModelSpec) -> tuple[tuple[str, float, str], ...]:
        """Facts of a model's config, not of its counts (its thresholds and severities): derived once per spec (a
        reload brings a new one)."""
        cached = self._facts.get(spec.model_id)
        if cached is None or cached[0] is not spec:
            severities = spec.severities()
            cached = (spec, tuple((m, t, severities[m]) for m, t in spec.thresholds().items()))
            self._facts[spec.model_id] = cached
        return cached[1]

    def compute(self) -> FleetSnapshot:
        """Compute every model's windows and attributes; publish the result as the latest snapshot."""
        with self._computing:
            return self._compute()

    def _compute(self) -> FleetSnapshot:
        started = time.perf_counter()
        now = self.clock()
        fleet = self.fleet
        models, windowing = fleet.models, fleet.config.windowing  # one configuration, even across a reload
        references = self.references
        gathered = [_gather(m, windowing, now, self._facts_of(m.spec), references.get(m.spec.model_id))
                    for m in models.values()]  # fmt: skip
        snapshot = FleetSnapshot(now, tuple(_snapshot(g, ev) for g, ev in zip(gathered, _evaluated(gathered),
                                                                                strict=True)))  # fmt: skip
        self._facts = {k: v for k, v in self._facts.items() if k in models}
        self.latest = snapshot
        if self.on_snapshot is not None:
            self.on_snapshot(snapshot)
        self.health.last_computation.set(now)
        self.health.computation_duration.set(time.perf_counter() - started)
        return snapshot

    def model(self, model_id: str) -> Snapshot | None:
        """The latest snapshot of one model (None before the first computation, or for a model not computed)."""
        latest = self.latest
        return next((m for m in latest.models if m.model_id == model_id), None) if latest else None

    def run_scheduled(self) -> None:
        """The APScheduler job: never raises, counts failures."""
        try:
            self.compute()
        except Exception:
            self.health.computation_errors.inc()
            log.exception("fairness computation failed; /metrics keeps the previous snapshot")
