"""The backtest report's bounded time series: per detector, at most SERIES_POINTS points however long the replay,
keeping the peaks of its statistic (so every alarm's height survives the downsampling), and what each step shows."""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import Any

import numpy as np

from exporter.core.attributes import Attribute
from exporter.core.evaluate import Evaluation
from exporter.stream.state.detectors import ALERT_OF_METRIC, Detector

SERIES_POINTS = 500
"""At most this many points per detector's series in the report (see :func:`keep_peaks`)."""
SERIES_OTHERS = 3
"""Besides the detectors that paged, the report's `series` has this many others: those with the largest statistic."""
SERIES_COLUMNS = ("step", "time", "value", "lower", "upper", "statistic", "alarm")


def iso(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).isoformat().replace("+00:00", "Z")


def number(x: float) -> float | None:
    """A report number: None for NaN (too few samples) or an infinite value."""
    return float(x) if math.isfinite(x) else None


def stacked(attribute: Attribute, copies: int) -> Attribute:
    """One attribute standing for ``copies`` steps of itself: its groups and pairs repeated, so that one
    evaluation (the daemon's own code) covers every step at once."""
    n, pairs = len(attribute.groups), np.array(attribute.pairs, dtype=np.int64).reshape(-1, 2)
    repeated = (pairs[None] + n * np.arange(copies)[:, None, None]).reshape(-1, 2)
    return replace(attribute, groups=attribute.groups * copies, pairs=tuple(zip(*repeated.T.tolist(), strict=True)))


def by_step(rows: np.ndarray) -> np.ndarray:
    """``(rows, steps, ...)`` counts as one block of every step's rows, step after step: a stacked attribute's."""
    return rows.swapaxes(0, 1).reshape(-1, *rows.shape[2:])


def keep_peaks(columns: dict[str, np.ndarray], width: int) -> dict[str, np.ndarray]:
    """Per bin of ``width`` steps (``step // width``), the step with the largest statistic (the earliest on a
    tie): a downsampled series that keeps every peak the detector reached, and so every alarm's height."""
    bins = columns["step"] // width
    order = np.lexsort((-columns["statistic"], bins))  # stable: by bin, then statistic descending
    first = np.r_[True, bins[order][1:] != bins[order][:-1]]
    keep = np.sort(order[first])
    return {k: v[keep] for k, v in columns.items()}


@dataclass
class Series:
    """One detector's bounded history: points of bins of `width` steps (a power of two), at most SERIES_POINTS."""

    columns: dict[str, np.ndarray]
    width: int = 1
    max_statistic: float = -math.inf

    def extend(self, block: dict[str, np.ndarray]) -> None:
        """Append a block of later steps, then keep the peaks of bins as wide as it takes to stay within
        SERIES_POINTS: one pass at the final width, which keeps what halving the points pass after pass kept (a
        bin's earliest largest statistic is its halves' earliest largest)."""
        self.max_statistic = max(self.max_statistic, float(np.max(block["statistic"], initial=-math.inf)))
        merged = {k: np.concatenate([self.columns[k], block[k]]) for k in SERIES_COLUMNS}
        width = self.width
        while np.count_nonzero(np.diff(merged["step"] // width)) >= SERIES_POINTS:  # steps increase: bins change
            width *= 2
        self.width = width
        self.columns = merged if width == 1 else keep_peaks(merged, width)  # width 1: one step per bin already


    def points(self) -> dict[str, list[Any]]:
        """The points as the report has them: ISO times, numbers (None: NaN or infinite), alarms."""
        c = self.columns
        times = {t: iso(t) for t in set(c["time"].tolist())}  # a replay's series share their steps' times
        return {"time": [times[t] for t in c["time"].tolist()],
                **{k: [x if math.isfinite(x) else None for x in c[k].tolist()]
                   for k in ("value", "lower", "upper", "statistic")},
                "alarm": c["alarm"].tolist()}  # fmt: skip


def compared(detector: Detector, attribute: Attribute, ev: Evaluation) -> tuple[np.ndarray, ...]:
    """What a detector's alert shows at every step of a stacked evaluation: the compared metric (the subgroup's
    selection rate) and its interval, NaN where the window has too few samples; a calibration detector shows
    nothing here (its statistic is the report's ``estimated.calibration``)."""
    if detector.predicted:
        return tuple(np.full(len(np.asarray(ev.groups.samples)) // len(attribute.groups), np.nan) for _ in range(3))
    if detector.subgroup:
        n, k = len(attribute.groups), attribute.groups.index(detector.subgroup)
        stats = ev.groups
        columns: tuple[np.ndarray, ...] = (stats.selection_rate, *stats.selection_rate_ci)
        ok = np.asarray(stats.samples).reshape(-1, n)[:, k] > 0
    else:
        metric = ALERT_OF_METRIC[detector.metric].shown.removeprefix("model_")
        pairs = [(attribute.groups[a], attribute.groups[b]) for a, b in attribute.pairs]
        n, k = len(pairs), pairs.index((detector.group_a, detector.group_b))
        columns = tuple(ev.metric(metric))
        ok = np.asarray(ev.sufficient(metric)).reshape(-1, n)[:, k]
    value, lower, upper = (np.asarray(c, dtype=np.float64).reshape(-1, n)[:, k] for c in columns)
    ok = ok & ~np.isnan(value)
    return tuple(np.where(ok, c, np.nan) for c in (value, lower, upper))


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
