"""Replay recorded prediction events through the daemon's own path on a simulated clock, and list the alerts.

``fairness-exporter backtest --config CONFIG EVENTS... [--output PATH]``. The events go through the daemon's
decoder (JSON lines, the topic's event format) or the gate's encoding (parquet/CSV), the daemon's WindowStore,
its detectors (exporter/stream/state/detectors.py) and the alert conditions that the shipped rules state
(detectors.py ALERTS, and the seed's raw-value warnings from the rules' TUNING table, every SEED_INTERVAL).

The clock is the events' own, in file order (the topic's order). The detectors' steps follow the events in the
daemon too (exporter/stream/state/detection.py: a step per bucket of the stream, quiet ones empty, the open one
not yet), so the replay takes the daemon's steps from the same events, to the count, and ends in its detector
state; the windows of each step are the daemon's at that bucket.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from exporter.backtest.input import Columns, read_events, reference
from exporter.backtest.sections import Final, conditional, estimated, evaluated, proxied, worst
from exporter.backtest.series import SERIES_OTHERS, Series, block_of, evaluate_steps, identity, iso, number, shown
from exporter.config import Config, ModelSpec, Windowing
from exporter.core.evaluate import Evaluation
from exporter.core.explain import with_unvalued
from exporter.serve.segment_rows import segment_rows, unvalued
from exporter.stream.state.detectors import ALERT_OF_METRIC, Trace
from exporter.stream.state.segments import paged
from exporter.stream.state.steps import add_stepped, batchable
from exporter.stream.state.window import WindowStore

FLUSH_STEPS = 1440
"""Steps evaluated in one vectorised pass (a day of one-minute buckets)."""
@dataclass
class _Open:
    """An alert condition that holds: since when, and the entry it fired as (None while pending)."""

    since: float
    entry: dict[str, Any] | None = None


class _Steps(NamedTuple):
    """Pending steps: each one's time, counts and estimation counts (the detectors'), and windows' counts."""

    times: np.ndarray
    counts: np.ndarray
    estimates: np.ndarray
    windows: dict[str, np.ndarray]


@dataclass
class Replay:
    """The simulated daemon: its store and detectors, its computation, and the alerts its rules would raise.

    The store takes the steps as the daemon's does (WindowStore.add), and the replay reads the windows' counts at
    each (window_counts); it then evaluates up to a day of steps in one pass with the daemon's functions
    (DetectorBank.advance, evaluate_many), which is what makes a replay fast.
    """

    config: ModelSpec
    windowing: Windowing
    reference: dict[str, np.ndarray] | None = None
    """The estimation reference's score counts per attribute (estimation:): the report then has ``estimated``."""
    store: WindowStore = field(init=False)
    alerts: list[dict[str, Any]] = field(default_factory=list)
    events: int = 0
    late: int = 0
    rejected: Counter[str] = field(default_factory=Counter)  # by reason
    ignored: int = 0
    steps: int = 0
    _open: dict[tuple[str, ...], _Open] = field(default_factory=dict)
    _now: float = field(default=-math.inf)
    _pending: list[_Steps] = field(default_factory=list)
    _queued: int = 0
    _segments: list[Any] = field(default_factory=list)
    """Per pending step, the segment counts' windows (a model with ``segments:``), for the explanation of a page."""
    _series: Series | None = None  # every detector's, a column each
    _alerted: set[int] = field(default_factory=set)
    _labelled: list[tuple[dict[str, np.ndarray], dict[str, np.ndarray]]] = field(default_factory=list)
    """Per pending step, its windows' labelled score histograms and score sums (a score metric: auc_difference)."""

    def __post_init__(self) -> None:
        self.store = WindowStore(self.config, self.windowing)
        self._calibration = self.store.calibration_rows(self.reference) if self.reference is not None else None
        self._batched = batchable(self.store, bool(self.config.counted_columns or self.config.segments))
        self._no_estimate = np.zeros_like(self.store.estimate_totals)
        self._attributes = {a.name: a for a in self.config.attributes}
        read = {ALERT_OF_METRIC[d.metric].shown.removeprefix("model_") for d in self.store.detectors.detectors
                if not (d.subgroup or d.predicted)}  # fmt: skip
        from exporter.devtools.rules import SEED_INTERVAL, TUNING  # the seed rules' thresholds and `for:`, as shipped

        self._seed_interval = _seconds(SEED_INTERVAL)

        self._seed = [(name, metric, TUNING[name]) for name, metric in (
            ("FairnessDemographicParityAboveThreshold", "demographic_parity_difference"),
            ("FairnessDisparateImpactBelowThreshold", "disparate_impact_ratio"))]  # fmt: skip
        # the metrics read at every step (the alerts' values, the seed rules); the replay's end evaluates them all
        self._per_step = tuple(m for m in self.config.exported_metrics if m in read | {m for _, m, _ in self._seed})

    def feed(self, columns: Columns) -> None:
        """Count a batch in file order, taking the steps the stream takes."""
        self.rejected.update(columns.rejected)
        self.ignored += columns.ignored
        if not len(columns.timestamps):
            return
        heads = np.maximum.accumulate(np.maximum(columns.timestamps, self._now))
        if self._batched and columns.timestamps.min() >= 0:
            return self._feed_stepped(columns, heads)
        observed: list[tuple[Any, ...]] = []
        head_buckets = np.floor(heads / self.store.bucket_seconds).astype(np.int64)
        cuts = np.flatnonzero(np.diff(head_buckets)) + 1
        for start, stop in zip(np.r_[0, cuts], np.r_[cuts, len(heads)], strict=True):
            # the steps first (the segment counts they read are those before this part), then the part's events
            self.store.enter(int(head_buckets[start]), lambda t: observed.append(self._observe(t)))
            part = slice(int(start), int(stop))
            self._now = float(heads[stop - 1])
            scores = columns.scores[part] if columns.scores is not None and len(columns.scores) else None
            segments = self.store.segments.codes({c: v[part] for c, v in columns.segments.items()}) \
                if self.config.counted_columns and columns.segments else None  # fmt: skip
            self.late += self.store.add(columns.timestamps[part], {k: v[part] for k, v in columns.codes.items()},
                                        columns.predictions[part], columns.labels[part], self._now,
                                        scores=scores, segment_codes=segments)  # fmt: skip
            self.events += int(stop - start)
        counts, estimates = self.store.take_queued()
        times, windows, labelled, segmented = zip(*observed, strict=True) if observed else ((), (), (), ())
        self._take(_Steps(np.array(times), counts, estimates, {w.name: np.array([c[w.name] for c in windows])
                                                              for w in self.windowing.windows}),
                   list(labelled), list(segmented))  # fmt: skip

    def _observe(self, now: float) -> tuple[Any, ...]:
        """What the replay reads at a step (the head at its bucket): its time, the windows' counts, their labelled
        histograms and score sums (a score metric), and the segment counts (for a page's explanation)."""
        store = self.store
        return (now, store.window_counts(now),
                (store.window_estimate_counts(now), store.window_labelled_sums(now))
                if self.config.compares_scores else None,
                (store.segments.snapshot(now),
                 (store.segments.missing_rows.copy(), store.segments.overflow_rows.copy()))
                if self.config.segments else None)  # fmt: skip

    def _feed_stepped(self, columns: Columns, heads: np.ndarray) -> None:
        """What :meth:`feed` does, a day of head buckets at a time (:func:`add_stepped`: the same counts)."""
        cuts = np.flatnonzero(np.diff(np.floor(heads / self.store.bucket_seconds))) + 1
        ends = np.r_[cuts[FLUSH_STEPS - 1 :: FLUSH_STEPS], len(heads)]
        for start, stop in zip(np.r_[0, ends[:-1]], ends, strict=True):
            part = slice(int(start), int(stop))
            taken = add_stepped(self.store, columns.timestamps[part], {k: v[part] for k, v in columns.codes.items()},
                                columns.predictions[part], columns.labels[part], heads[part], self._now)
            self._now = float(heads[stop - 1])
            self.late, self.events = self.late + taken.late, self.events + int(stop - start)
            n = len(taken.times)
            self._take(_Steps(taken.times, taken.counts, np.broadcast_to(self._no_estimate,
                                                                         (n, *self._no_estimate.shape)),
                              taken.windows), [None] * n, [None] * n)  # fmt: skip

    def _take(self, steps: _Steps, labelled: list[Any], segments: list[Any]) -> None:
        """Add steps to the pending block, evaluating it whenever it holds FLUSH_STEPS (blocks end every FLUSH_STEPS
        steps, however the steps came)."""
        t = 0
        while t < len(steps.times):
            n = min(len(steps.times) - t, FLUSH_STEPS - self._queued)
            part = slice(t, t + n)
            self._pending.append(_Steps(steps.times[part], steps.counts[part], steps.estimates[part],
                                        {w: c[part] for w, c in steps.windows.items()}))  # fmt: skip
            self._labelled += [x for x in labelled[part] if x is not None]
            self._segments += segments[part]
            self.steps, self._queued, t = self.steps + n, self._queued + n, t + n
            if self._queued >= FLUSH_STEPS:
                self._flush()

    def finish(self) -> dict[str, Any]:
        """The report (alerts still firing have resolved_at null), as of the last event: the steps the stream
        took (the open bucket's is not one yet, as in the daemon), the windows with every event."""
        self._flush()
        bank, now, spec = self.store.detectors, self._now if self._now > -math.inf else 0.0, self.config
        final: Final | None = None
        if self._now > -math.inf:  # the windows as the daemon shows them after the last event
            final = ({w: c[None] for w, c in self.store.window_counts(now).items()},
                     [(self.store.window_estimate_counts(now), self.store.window_labelled_sums(now))]
                     if spec.compares_scores else [])  # fmt: skip
        evaluations = evaluated(spec, self.windowing, self.store, final, now) if final is not None else {}
        return {
            "model_id": self.config.model_id,
            "events": self.events, "late": self.late, "rejected": self.rejected.total(),
            "rejected_reasons": dict(self.rejected.most_common()), "ignored": self.ignored,
            "steps": self.steps, "alarm_level": bank.level, "detectors": len(bank),
            "false_pages_per_day": self.config.alerting.false_pages_per_day,
            "alerts": sorted(self.alerts, key=lambda a: (a["fired_at"], a["alert"], a["attribute"])),
            "series": self._series_report(),
            "worst": worst(spec, evaluations),
            **({"conditional": conditional(spec, evaluations, self.store, now)} if spec.conditional_metrics else {}),
            **({"estimated": estimated(self.config, self.store, self.reference, now)}
               if self.reference is not None else {}),
            **({"proxy": proxied(self.config, self.store, now)} if self.store.proxy.attributes else {}),
        }  # fmt: skip

    def _series_report(self) -> list[dict[str, Any]]:
        """The series of the detectors whose alert fired (pages and warnings), then of the SERIES_OTHERS others
        with the largest statistic."""
        bank, every = self.store.detectors, self._series
        if every is None:
            return []
        others = sorted((i for i in range(len(bank)) if i not in self._alerted),
                        key=lambda i: (-every.max_statistic[i], i))[:SERIES_OTHERS]  # fmt: skip
        window = self.windowing.windows[0].name
        thresholds = self.config.thresholds()
        out = []
        for i in [*sorted(self._alerted), *others]:
            detector, series = bank.detectors[i], every.column(i)
            alert = ALERT_OF_METRIC[detector.metric]
            out.append({"alert": alert.name, "severity": alert.severity, "attribute": detector.attribute,
                        **identity(detector), "alerted": i in self._alerted, "window": window,
                        "threshold": thresholds.get(alert.shown.removeprefix("model_")), "alarm_level": bank.level,
                        "max_statistic": number(series.max_statistic), "steps_per_point": series.width,
                        "points": series.points()})  # fmt: skip
        return out

    # --- alert conditions, over a block of steps ----------------------------------------------------------

    def _flush(self) -> None:
        if not self._pending:
            return
        times, counts, estimates = (np.concatenate(x) for x in zip(*(p[:3] for p in self._pending), strict=True))
        windows = {w.name: np.concatenate([p.windows[w.name] for p in self._pending]) for w in self.windowing.windows}
        trace = self.store.advance_detectors(counts, estimates, self._calibration)
        steps = len(times)
        evaluations = evaluate_steps(self.config, self.windowing, self.store.layout.split, windows, self._labelled,
                                     self._per_step, worsts=False)  # the worst: at the replay's end (finish)
        self._pending.clear()
        self._queued = 0
        segments, self._segments = self._segments, []
        self._labelled.clear()
        self._record_series(times, trace, evaluations)

        holding: dict[tuple[str, ...], tuple[np.ndarray, np.ndarray, float, Any]] = {}
        bank = self.store.detectors
        for i in np.flatnonzero(trace.active.any(axis=0)):
            detector = bank.detectors[i]
            holding[(ALERT_OF_METRIC[detector.metric].name, detector.key)] = (trace.active[:, i], times, 0.0,
                                                                              ("detector", i))  # fmt: skip
        # The seed rules' group is evaluated every SEED_INTERVAL: at the steps whose bucket ends one, each holding
        # what that evaluation found (until the block's first, what the last block's last found) at its time.
        bucket, interval = np.floor(times / self.store.bucket_seconds), self._seed_interval
        grid = np.floor((bucket + 1) * self.store.bucket_seconds / interval)
        last = np.maximum.accumulate(np.where(grid > np.floor(bucket * self.store.bucket_seconds / interval),
                                              np.arange(steps), -1))  # fmt: skip
        seed_times = np.where(last >= 0, grid[np.maximum(last, 0)] * interval, -np.inf)

        def evaluated_every_interval(condition: np.ndarray, key: tuple[str, ...]) -> np.ndarray:
            return np.where(last >= 0, condition[np.maximum(last, 0)], key in self._open)

        attributes = self._attributes
        for name, metric, tuning in self._seed:
            threshold = float(tuning.threshold or 0)
            for (window_name, attribute_name), ev in evaluations.items():
                value, _, _ = ev.metric(metric)
                beyond = value < threshold if metric == "disparate_impact_ratio" else value > threshold
                conditions = (ev.sufficient(metric) & beyond).reshape(steps, -1)
                for k in np.flatnonzero(conditions.any(axis=0)):
                    a, b = attributes[attribute_name].pairs[k]
                    groups = attributes[attribute_name].groups
                    seed_key = (name, attribute_name, f"{groups[a]}_vs_{groups[b]}", window_name)
                    holding[seed_key] = (evaluated_every_interval(conditions[:, k], seed_key), seed_times,
                                    _seconds(tuning.for_),
                                    ("seed", name, tuning, metric, window_name, attribute_name, k))  # fmt: skip
        seeds = {name for name, _, _ in self._seed}

        for key in sorted(set(self._open) | set(holding), key=str):  # in one order whatever PYTHONHASHSEED
            active, at, hold, source = holding.get(key) or (
                (evaluated_every_interval(np.zeros(steps, dtype=bool), key), seed_times, 0.0, None) if key[0] in seeds
                else (np.zeros(steps, dtype=bool), times, 0.0, None))  # fmt: skip
            state = self._open.get(key)
            edges = np.flatnonzero(np.diff(np.r_[0, active, 0]))  # the block's runs of steps where it holds
            if state is not None and (not len(edges) or edges[0] > 0):  # held at the last block's end, not now
                if state.entry is not None:
                    state.entry["resolved_at"] = iso(at[0])
                state = None
            for start, stop in zip(edges[::2], edges[1::2], strict=True):  # the first may continue the last block's
                state = state or _Open(float(at[start]))
                if state.entry is None and len(due := np.flatnonzero(at[start:stop] - state.since >= hold)):
                    t = int(start + due[0])  # its `for:` has passed: it fires
                    state.entry = self._entry(source, t, trace.statistic, evaluations, at[t])
                    if source is not None and source[0] == "detector" and segments[t] is not None:
                        state.entry["explanation"] = self._explained(state.entry, segments[t])
                    self.alerts.append(state.entry)
                if stop < steps:  # the step after the run: it no longer holds
                    if state.entry is not None:
                        state.entry["resolved_at"] = iso(at[stop])
                    state = None
            if state is None:
                self._open.pop(key, None)
            else:
                self._open[key] = state

    def _explained(self, entry: dict[str, Any], segments: tuple[Any, tuple[np.ndarray, np.ndarray]]) -> \
            dict[str, Any] | None:  # fmt: skip
        """Why the paged gap moved, as the daemon's /explain said it at that step (the longest window; ``segments``:
        the segment counts then, and each column's missing and overflowing events since they began)."""
        from exporter.devtools.rule_text import EXPLAINED_RATES

        taken, others = segments
        found = paged(self.config, taken, self.store, entry, EXPLAINED_RATES.get(entry.get("metric", "")))
        if found is None:
            return None
        rows = segment_rows(self.config, taken, self.store.segments, self.store.layout.split, others)[found["window"]]
        (found,) = with_unvalued([found], unvalued(rows))
        return {**found, "baseline": [iso(t) for t in found["baseline"]], "current": [iso(t) for t in found["current"]]}

    def _record_series(self, times: np.ndarray, trace: Trace, evaluations: dict[tuple[str, str], Evaluation]) -> None:
        """Each detector's steps of the block (the alerts' value in the first window, the statistic, the alarm)
        into its bounded series."""
        detectors = self.store.detectors.detectors
        if detectors:  # from the block's first step (_take counted the block's steps)
            block = block_of(detectors, self._attributes, evaluations, self.windowing.windows[0].name,
                                    self.steps - len(times), times, trace)  # fmt: skip
            self._series = self._series or Series({k: v[:0] for k, v in block.items()})
            self._series.extend(block)

    def _entry(self, source: Any, t: int, statistics: np.ndarray, evaluations: dict[tuple[str, str], Evaluation],
               now: float) -> dict[str, Any]:  # fmt: skip
        """The alert as it fired at step t of the block: what, where, the value with its interval."""
        if source[0] == "detector":
            bank = self.store.detectors
            detector = bank.detectors[source[1]]
            self._alerted.add(int(source[1]))
            alert = ALERT_OF_METRIC[detector.metric]
            attribute = self._attributes[detector.attribute]
            windows = shown(detector, attribute, [(w.name, evaluations[(w.name, attribute.name)])
                                                  for w in self.windowing.windows], t)  # fmt: skip
            return {"alert": alert.name, "severity": alert.severity, "attribute": detector.attribute,
                    **identity(detector), "window": None, **windows,
                    "statistic": float(statistics[t, source[1]]), "alarm_level": bank.level,
                    "fired_at": iso(now), "resolved_at": None}  # fmt: skip
        _, name, tuning, metric, window, attribute_name, k = source
        attribute = self._attributes[attribute_name]
        a, b = attribute.pairs[k]
        row = t * len(attribute.pairs) + k
        value, lower, upper = (x[row] for x in evaluations[(window, attribute_name)].metric(metric))
        return {"alert": name, "severity": tuning.severity, "attribute": attribute_name,
                "dimension": f"{attribute.groups[a]}_vs_{attribute.groups[b]}", "group_a": attribute.groups[a],
                "group_b": attribute.groups[b], "window": window, "value": float(value),
                "interval": [float(lower), float(upper)], "fired_at": iso(now), "resolved_at": None}  # fmt: skip


def _seconds(duration: str) -> float:
    from exporter.config import parse_duration

    return 0.0 if duration.rstrip("smhdw") == "0" else parse_duration(duration)


def backtest(config: Config, paths: Sequence[str | Path]) -> dict[str, Any]:
    """Replay the events files and return the report with its `alerts` list: of the one model, or per model
    under ``models`` (each model on its own events' clock)."""
    replays = {m.model_id: Replay(m, config.windowing, reference(m)) for m in config.models}
    ignored = malformed = 0
    for columns, unrouted, bad in read_events(paths, config):
        for model_id, batch in columns.items():
            replays[model_id].feed(batch)
        ignored += unrouted
        malformed += bad
    reports = [replay.finish() for replay in replays.values()]
    reasons = sum((Counter(r["rejected_reasons"]) for r in reports), Counter({"malformed_json": malformed}))
    rejected = {"rejected": reasons.total(), "rejected_reasons": dict((+reasons).most_common())}
    if len(reports) == 1:
        (report,) = reports
        return {**report, "ignored": report["ignored"] + ignored, **rejected}
    return {"models": reports, "events": sum(r["events"] for r in reports), "ignored": ignored, **rejected,
            "alerts": sorted(({"model_id": r["model_id"], **a} for r in reports for a in r["alerts"]),
                             key=lambda a: (a["fired_at"], a["model_id"], a["alert"], a["attribute"]))}  # fmt: skip

