"""The backtest report's bounded time series: per detector, at most SERIES_POINTS points however long the replay,
keeping the peaks of its statistic (so every alarm's height survives the downsampling), and what each step shows."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from exporter.config import ModelSpec, Windowing
from exporter.core.attributes import Attribute
from exporter.core.evaluate import Evaluation, evaluate_many
from exporter.stream.state.detectors import ALERT_OF_METRIC, Detector, Trace

SERIES_POINTS = 500
"""At most this many points per detector's series in the report (see :func:`keep_peaks`)."""
SERIES_OTHERS = 3
"""Besides the detectors that paged, the report's `series` has this many others: those with the largest statistic."""
SERIES_COLUMNS = ("step", "time", "value", "lower", "upper", "statistic", "alarm")


def iso(ts: float) -> str:
    return isos(np.array([ts]))[0]


def isos(times: np.ndarray) -> list[str]:
    """Epoch seconds as ISO-8601 UTC text, what ``datetime.fromtimestamp(t, UTC).isoformat()`` writes with ``Z``
    for ``+00:00`` (microseconds rounded half to even, left out when 0), thousands at numpy's speed."""
    fraction, whole = np.modf(np.asarray(times, dtype=np.float64))
    micro = np.rint(fraction * 1e6)
    carry, borrow = micro >= 1e6, micro < 0
    micro = (micro - 1e6 * carry + 1e6 * borrow).astype(np.int64)
    seconds = np.datetime_as_string((whole + carry - borrow).astype(np.int64).astype("datetime64[s]"))
    return [f"{s}.{m:06d}Z" if m else f"{s}Z" for s, m in zip(seconds.tolist(), micro.tolist(), strict=True)]


def number(x: float) -> float | None:
    """A report number: None for NaN (too few samples) or an infinite value."""
    return float(x) if math.isfinite(x) else None


def stacked(attribute: Attribute, copies: int) -> Attribute:
    """One attribute standing for ``copies`` steps of itself: its groups and pairs repeated, so that one
    evaluation (the daemon's own code) covers every step at once. The pairs are an int array, not tuples."""
    n, pairs = len(attribute.groups), np.array(attribute.pairs, dtype=np.int64).reshape(-1, 2)
    repeated = (pairs[None] + n * np.arange(copies)[:, None, None]).reshape(-1, 2)
    return replace(attribute, groups=attribute.groups * copies, pairs=repeated)


def evaluate_steps(spec: ModelSpec, windowing: Windowing, split: Callable[[np.ndarray], dict[str, np.ndarray]],
                   windows: dict[str, np.ndarray], labelled: list[Any],
                   metrics: Iterable[str], worsts: bool = True) -> dict[tuple[str, str], Evaluation]:  # fmt: skip
    """Per window and attribute: the evaluation of every step, as one stacked evaluation (the daemon's own code,
    each step a family of its own). ``windows``: each window's counts, (steps, rows, counts); ``labelled``: each
    step's labelled histograms and score sums (empty: the model compares no scores)."""
    steps = len(next(iter(windows.values())))
    blocks, histograms, sums = [], [], []  # type: list[Any], list[np.ndarray], list[np.ndarray]
    for window in windowing.windows:  # rows first, then steps: each attribute's block cut once
        by_attribute = split(windows[window.name].swapaxes(0, 1))
        stepped = [split(np.stack([x[window.name] for x in xs], 1)) if xs else {}
                   for xs in ([h for h, _ in labelled], [s for _, s in labelled if s])]  # fmt: skip
        for attribute in (a for a in spec.attributes if a.proxy is None):  # proxies: the report's proxy
            n_groups = len(attribute.groups)  # each step's block ends with the unknown row: no comparison reads it
            blocks.append((window.name, attribute, by_step(by_attribute[attribute.name][:n_groups])))
            for out, rows in zip((histograms, sums), stepped, strict=True):
                out.extend([by_step(rows[attribute.name][:n_groups])] if rows else [])
    stacks = {a.name: stacked(a, steps) for a in spec.attributes if a.proxy is None}  # every window's
    results = evaluate_many([(stacks[a.name], c) for _, a, c in blocks], spec.min_samples, metrics,
                            spec.multiplicity, families=steps, scores=histograms or None,
                            score_sums=sums or None, worsts=worsts, added_bound=spec.added_score_bound)  # fmt: skip
    return {(window_name, a.name): ev for (window_name, a, _), ev in zip(blocks, results, strict=True)}


def by_step(rows: np.ndarray) -> np.ndarray:
    """``(rows, steps, ...)`` counts as one block of every step's rows, step after step: a stacked attribute's."""
    return rows.swapaxes(0, 1).reshape(-1, *rows.shape[2:])


def keep_peaks(columns: dict[str, np.ndarray], width: int) -> dict[str, np.ndarray]:
    """Per bin of ``width`` steps (``step // width``), the step with the largest statistic (the earliest on a
    tie): a downsampled series that keeps every peak the detector reached, and so every alarm's height. Columns
    of shape ``(steps, series)`` are that many series kept apart, whose rows fall in the same bins (extended
    together, each keeps one step per bin)."""
    bins, statistic = columns["step"] // width, columns["statistic"]
    runs = bins.reshape(len(bins), -1)[:, 0]
    starts = np.flatnonzero(np.r_[True, runs[1:] != runs[:-1]])  # steps increase: a bin is a run of rows
    peak = np.repeat(np.fmax.reduceat(statistic, starts, axis=0), np.diff(np.r_[starts, len(runs)]), axis=0)
    rows = np.arange(len(runs)).reshape(-1, *(1,) * (statistic.ndim - 1))
    at_peak = np.where((statistic == peak) | np.isnan(peak), rows, len(runs))  # NaN is the lowest; a bin of NaN
    keep = np.minimum.reduceat(at_peak, starts, axis=0)  # only keeps its first. Each bin's earliest at its peak
    return {k: np.take_along_axis(v, keep, axis=0) for k, v in columns.items()}


@dataclass
class Series:
    """A detector's bounded history: points of bins of `width` steps (a power of two), at most SERIES_POINTS. With
    columns of shape ``(steps, detectors)``, every detector's, extended together (:meth:`column`: one of them)."""

    columns: dict[str, np.ndarray]
    width: int = 1
    max_statistic: Any = -math.inf
    """The largest statistic of a block without NaN (per detector)."""

    def extend(self, block: dict[str, np.ndarray]) -> None:
        """Append a block of later steps, then keep the peaks of bins as wide as it takes to stay within
        SERIES_POINTS: one pass at the final width, which keeps what halving the points pass after pass kept (a
        bin's earliest largest statistic is its halves' earliest largest)."""
        peak = np.max(block["statistic"], axis=0, initial=-math.inf)
        self.max_statistic = np.where(peak > self.max_statistic, peak, self.max_statistic)
        merged = {k: np.concatenate([self.columns[k], block[k]]) for k in SERIES_COLUMNS}
        steps, width = merged["step"].reshape(len(merged["step"]), -1)[:, 0], self.width
        while np.count_nonzero(np.diff(steps // width)) >= SERIES_POINTS:  # steps increase: bins change
            width *= 2
        self.width = width
        self.columns = merged if width == 1 else keep_peaks(merged, width)  # width 1: one step per bin already

    def column(self, i: int) -> Series:
        """Detector i's series, of columns ``(steps, detectors)``."""
        return Series({k: v[:, i] for k, v in self.columns.items()}, self.width, float(self.max_statistic[i]))

    def points(self) -> dict[str, list[Any]]:
        """The points as the report has them: ISO times, numbers (None: NaN or infinite), alarms."""
        c = self.columns
        return {"time": isos(c["time"]),
                **{k: [x if math.isfinite(x) else None for x in c[k].tolist()]
                   for k in ("value", "lower", "upper", "statistic")},
                "alarm": c["alarm"].tolist()}  # fmt: skip


def compared(detector: Detector, attribute: Attribute, ev: Evaluation) -> tuple[np.ndarray, ...]:
    """What a detector's alert shows at every step of a stacked evaluation: the compared metric (the subgroup's
    selection rate) and its interval, NaN where the window has too few samples; a calibration detector shows
    nothing here (its statistic is the report's ``estimated.calibration``)."""
    if detector.predicted:
        return tuple(np.full(len(np.asarray(ev.groups.samples)) // len(attribute.groups), np.nan) for _ in range(3))
    return tuple(c[:, _column(detector, attribute)] for c in _shown(detector, attribute, ev))


def _column(detector: Detector, attribute: Attribute) -> int:
    """A subgroup detector's group, a pair detector's pair."""
    if detector.subgroup:
        return attribute.groups.index(detector.subgroup)
    groups = attribute.groups
    return [(groups[a], groups[b]) for a, b in attribute.pairs].index((detector.group_a, detector.group_b))


def _shown(detector: Detector, attribute: Attribute, ev: Evaluation) -> tuple[np.ndarray, ...]:
    """What the detectors of an attribute and metric (a subgroup's or a pair's) show: (value, lower, upper) of
    shape (steps, groups or pairs), NaN where too few samples (:func:`compared`: one column)."""
    if detector.subgroup:
        n, stats = len(attribute.groups), ev.groups
        columns: tuple[np.ndarray, ...] = (stats.selection_rate, *stats.selection_rate_ci)
        ok = np.asarray(stats.samples).reshape(-1, n) > 0
    else:
        metric = ALERT_OF_METRIC[detector.metric].shown.removeprefix("model_")
        n, columns = len(attribute.pairs), tuple(ev.metric(metric))
        ok = np.asarray(ev.sufficient(metric)).reshape(-1, n)
    value, lower, upper = (np.asarray(c, dtype=np.float64).reshape(-1, n) for c in columns)
    ok = ok & ~np.isnan(value)
    return tuple(np.where(ok, c, np.nan) for c in (value, lower, upper))


def block_of(detectors: Sequence[Detector], attributes: Mapping[str, Attribute],
             evaluations: Mapping[tuple[str, str], Evaluation], window: str, first: int, times: np.ndarray,
             trace: Trace) -> dict[str, np.ndarray]:  # fmt: skip
    """A block of steps (the first: step ``first``) of every detector's series, columns ``(steps, detectors)``:
    the alerts' value in ``window`` (:func:`compared`: each attribute and metric's once), the statistic, the alarm."""
    shown: dict[tuple[str, str], tuple[np.ndarray, ...]] = {}
    each = []
    for d in detectors:
        attribute, ev = attributes[d.attribute], evaluations[(window, d.attribute)]
        if d.predicted:
            each.append(compared(d, attribute, ev))
        else:
            key = (d.attribute, d.metric)
            if key not in shown:
                shown[key] = _shown(d, attribute, ev)
            each.append(tuple(c[:, _column(d, attribute)] for c in shown[key]))
    value, lower, upper = (np.stack([s[c] for s in each], axis=1) for c in range(3))
    steps = np.arange(first, first + len(times))
    return {"step": np.repeat(steps[:, None], len(detectors), axis=1),
            "time": np.repeat(times[:, None], len(detectors), axis=1), "value": value, "lower": lower,
            "upper": upper, "statistic": trace.statistic, "alarm": trace.active}  # fmt: skip


def identity(detector: Detector) -> dict[str, Any]:
    """What names a detector in an alert: its subgroup or comparison, metric and direction."""
    if detector.predicted:
        return {"subgroup": detector.subgroup, "predicted": detector.predicted, "metric": detector.metric,
                "direction": detector.direction}  # fmt: skip
    if detector.subgroup:
        return {"subgroup": detector.subgroup, "direction": detector.direction}
    return {"dimension": detector.dimension, "group_a": detector.group_a, "group_b": detector.group_b,
            "metric": detector.metric, "direction": detector.direction}  # fmt: skip


def shown(detector: Detector, attribute: Attribute, windows: list[tuple[str, Evaluation]], t: int) -> dict[str, Any]:
    """What the alert's annotation shows at step t of a stacked evaluation: the compared metric with its interval
    in every window (None where the window has too few samples), and the first window's as `value`/`interval`."""
    out: dict[str, Any] = {}
    for window, ev in windows:
        value, lower, upper = (float(c[t]) for c in compared(detector, attribute, ev))
        out[window] = None if math.isnan(value) else {"value": value, "interval": [lower, upper]}
    first = next(iter(out.values()), None)
    return {"value": first and first["value"], "interval": first and first["interval"], "windows": out}
