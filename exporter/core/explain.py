"""Why a gap moved: Kitagawa's symmetric decomposition of a change in a signed gap over a segment column's values.

A group's rate is the mix-weighted mean of its rates within segments, ``r_g = sum_s w_gs * r_gs`` (``w_gs``: the
share of group g's trials in segment s), so the change of ``D = r_a - r_b`` from a baseline (0) to a current (1)
period splits exactly, per segment s, into

* ``mix_gs  = (w1_gs - w0_gs) * (r1_gs + r0_gs) / 2``: the group's rows moved into or out of the segment;
* ``rate_gs = (w1_gs + w0_gs) / 2 * (r1_gs - r0_gs)``: the group's rate within the segment moved;

and a segment's ``mix = mix_as - mix_bs``, ``rate = rate_as - rate_bs``. An empty cell takes the other period's
rate (its weight is 0, so the identity ``sum_s (mix + rate) = D1 - D0`` stays exact). The gate (two datasets), the
daemon (a window and the one a period before it) and ``backtest`` all call :func:`explanations`.

Each term's 95% interval is a normal one from the delta method: within a group and period, the segment shares are
multinomial and the rates within segments binomial given the segment sizes (so a share and a rate are
uncorrelated); the periods and groups are independent; the variance of each product of two independent factors
is Goodman's, ``x^2 var(y) + y^2 var(x) + var(x) var(y)``. Pure functions, no I/O, no pandas.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

import numpy as np
from numpy.typing import ArrayLike, NDArray

from exporter.core.attributes import Attribute
from exporter.core.encoding import value_text
from exporter.core.fairness import Z_95, FloatArray, rate_counts, ratio
from exporter.core.metric_table import METRICS

OTHER_SEGMENT: Final = "other"
"""The segment value every value past a column's cap (and every missing value) is counted under."""
DEFAULT_SEGMENT_CAP: Final = 20
"""Values kept per segment column unless ``segment_values`` says otherwise."""


STRATA_SEP: Final = "|"
"""Joins the values of several strata columns into one stratum's name."""


def segment_keys(segments: Sequence[str], strata: Sequence[str]) -> dict[str, tuple[str, ...]]:
    """Every key counted per (subgroup x value) and its columns: each segment column, then the strata (one key for
    all their columns, its values their values joined by :data:`STRATA_SEP`)."""
    out: dict[str, tuple[str, ...]] = {c: (c,) for c in segments}
    if strata:
        out[STRATA_SEP.join(strata)] = tuple(strata)
    return out


def key_value(values: Sequence[object]) -> str | None:
    """The value of a key from its columns' values (None: one of them is missing)."""
    return None if any(v is None for v in values) else STRATA_SEP.join(value_text(v) for v in values)


@dataclass
class SegmentValues:
    """A segment column's bounded table of values: the first ``cap`` distinct values seen get codes ``0..cap-1``,
    a missing value and every value after the cap the code ``cap`` (``other``), which the caller counts."""

    cap: int = DEFAULT_SEGMENT_CAP
    values: list[str] = field(default_factory=list)
    _codes: dict[str, int] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        self._codes = {v: i for i, v in enumerate(self.values)}

    @property
    def names(self) -> tuple[str, ...]:
        """The value of each code: the kept values in order of first sight, then ``other``."""
        return (*self.values, OTHER_SEGMENT)

    def code(self, value: object) -> tuple[int, bool]:
        """The code of one value (as :func:`value_text` writes it; None: missing), and whether it overflowed the cap
        (a missing value goes to ``other`` without overflowing)."""
        if value is None:
            return self.cap, False
        text = value_text(value)
        found = self._codes.get(text)
        if found is not None:
            return found, False
        if len(self.values) < self.cap:
            self._codes[text] = len(self.values)
            self.values.append(text)
            return len(self.values) - 1, False
        return self.cap, True


@dataclass(frozen=True)
class Decomposition:
    """Pairs of groups' changes split over one segment column's values: arrays ``(n_pairs,)`` for the gaps and
    ``(n_pairs, n_values)`` for the terms."""

    baseline: FloatArray
    current: FloatArray
    mix: FloatArray
    rate: FloatArray
    mix_se: FloatArray
    rate_se: FloatArray
    group_rate: FloatArray
    """Per value, group a's own rate term (``rate_as``): which group's rate moved."""
    trials: NDArray[np.int64]
    """Per value, the rate's trials of both groups in both periods (a value without any is left out)."""

    @property
    def change(self) -> FloatArray:
        return self.current - self.baseline


def decompose(baseline: NDArray, current: NDArray, a: ArrayLike, b: ArrayLike, rate: str) -> Decomposition:
    """The change of ``rate_a - rate_b`` for pairs ``(a[i], b[i])`` between two counts arrays of shape
    ``(n_groups, n_values, N_COUNTS)`` (per group and segment value), split per value into mix and rate terms with
    their standard errors.

    >>> base = np.zeros((2, 2, 6), int); cur = np.zeros((2, 2, 6), int)
    >>> base[0, :, :2] = [[5, 5], [5, 5]]; base[1, :, :2] = [[5, 5], [5, 5]]  # both 0.5 in both segments
    >>> cur[0, :, :2] = [[9, 1], [5, 5]]; cur[1, :, :2] = [[5, 5], [5, 5]]    # a's rate in segment 0 rose to 0.9
    >>> d = decompose(base, cur, [0], [1], "selection_rate")
    >>> d.change.round(3).tolist(), d.mix.round(3).tolist(), d.rate.round(3).tolist()
    ([0.2], [[0.0, 0.0]], [[0.2, 0.0]])
    """
    return decompose_columns([baseline], [current], a, b, (rate,))[rate][0]


def decompose_columns(baselines: Sequence[NDArray], currents: Sequence[NDArray], a: ArrayLike, b: ArrayLike,
                      rates: Sequence[str]) -> dict[str, list[Decomposition]]:  # fmt: skip
    """:func:`decompose` of several segment columns (their counts ``(n_groups, n_values, N_COUNTS)``, as many values
    as each has) and rates, all in one pass: per rate, one decomposition per column. Elementwise but for the integer
    totals per column: each column's and rate's numbers are those it has alone."""
    groups = np.stack([np.atleast_1d(np.asarray(a, np.int64)), np.atleast_1d(np.asarray(b, np.int64))], axis=1)
    widths = [np.shape(c)[1] for c in baselines]
    ends = np.cumsum(widths)
    base = np.concatenate([np.asarray(c) for c in baselines], axis=1)[groups]  # (n_pairs, 2 groups, n_values, 6)
    cur = np.concatenate([np.asarray(c) for c in currents], axis=1)[groups]
    # (n_rates, n_pairs, 2 groups, n_values): the columns' values side by side
    k0, n0 = (np.stack(x) for x in zip(*(rate_counts(base, rate) for rate in rates), strict=True))
    k1, n1 = (np.stack(x) for x in zip(*(rate_counts(cur, rate) for rate in rates), strict=True))

    def per_column(x: NDArray) -> NDArray:  # each column's sum over its values (integers: exact in any order)
        running = np.concatenate([np.zeros((*x.shape[:-1], 1), x.dtype), np.cumsum(x, axis=-1)], axis=-1)
        return running[..., ends] - running[..., ends - widths]

    sum0, sum1 = per_column(n0), per_column(n1)
    total0, total1 = np.repeat(sum0, widths, axis=-1), np.repeat(sum1, widths, axis=-1)
    w0, w1 = ratio(n0, total0), ratio(n1, total1)
    r0, r1 = ratio(k0, n0), ratio(k1, n1)
    g0, g1 = ratio(per_column(k0), sum0), ratio(per_column(k1), sum1)  # (n_rates, n_pairs, 2 groups, n_columns)
    copy0, copy1 = (n0 == 0) & (n1 > 0), (n1 == 0) & (n0 > 0)
    r0, r1 = np.where(copy0, r1, r0), np.where(copy1, r0, r1)
    empty = (n0 == 0) & (n1 == 0)
    r0, r1 = np.where(empty, 0.0, r0), np.where(empty, 0.0, r1)
    # a group with no trials in a period: its change is undefined (a share is a ratio in 0..1, or NaN)
    w0, w1 = np.where(np.isnan(w0), 0.0, w0), np.where(np.isnan(w1), 0.0, w1)
    mix = (w1 - w0) * (r1 + r0) / 2.0
    within = (w1 + w0) / 2.0 * (r1 - r0)

    with np.errstate(divide="ignore", invalid="ignore"):
        var_w = w0 * (1 - w0) / total0 + w1 * (1 - w1) / total1  # var(w1 - w0)
        var_r0 = np.where(n0 > 0, r0 * (1 - r0) / n0, 0.0)
        var_r1 = np.where(n1 > 0, r1 * (1 - r1) / n1, 0.0)
    # An empty cell's rate is the other period's: the two are one variable (correlation 1).
    var_mean_r = np.where(copy0, var_r1, np.where(copy1, var_r0, (var_r0 + var_r1) / 4.0))  # var((r1 + r0) / 2)
    var_diff_r = np.where(copy0 | copy1, 0.0, var_r0 + var_r1)  # var(r1 - r0)
    mean_r, diff_w = (r1 + r0) / 2.0, w1 - w0
    mean_w, diff_r = (w1 + w0) / 2.0, r1 - r0
    var_mix = mean_r**2 * var_w + diff_w**2 * var_mean_r + var_w * var_mean_r
    var_rate = diff_r**2 * var_w / 4.0 + mean_w**2 * var_diff_r + var_w / 4.0 * var_diff_r
    baselines_, currents_ = g0[:, :, 0] - g0[:, :, 1], g1[:, :, 0] - g1[:, :, 1]
    mixes, rates_ = mix[:, :, 0] - mix[:, :, 1], within[:, :, 0] - within[:, :, 1]
    mix_se, rate_se = np.sqrt(var_mix.sum(axis=2)), np.sqrt(var_rate.sum(axis=2))
    trials = (n0 + n1).sum(axis=2)
    columns = [slice(end - width, end) for end, width in zip(ends.tolist(), widths, strict=True)]
    return {rate: [Decomposition(baseline=baselines_[i, :, c], current=currents_[i, :, c], mix=mixes[i, :, v],
                                 rate=rates_[i, :, v], mix_se=mix_se[i, :, v], rate_se=rate_se[i, :, v],
                                 group_rate=within[i, :, 0, v], trials=trials[i, :, v])
                   for c, v in enumerate(columns)] for i, rate in enumerate(rates)}  # fmt: skip


SegmentCounts = Mapping[str, tuple[Sequence[str], NDArray, NDArray]]
"""Per segment column: its value names, the baseline's and the current's counts ``(n_groups, n_values, N_COUNTS)``
(the attribute's groups only, values in the order of the names)."""

_RATE_WORDS: Final = {"selection_rate": "selection rate", "true_positive_rate": "TPR", "false_positive_rate": "FPR",
                      "precision": "precision", "accuracy": "accuracy", "false_negative_rate": "FNR",
                      "true_negative_rate": "TNR", "negative_predictive_value": "NPV",
                      "false_discovery_rate": "FDR", "false_omission_rate": "FOR"}  # fmt: skip
"""The words of every rate of :data:`exporter.core.fairness.RATES` in a sentence (any metric's may be explained)."""


def explainable(metrics: Iterable[str]) -> list[str]:
    """The metrics whose change is explained: the differences of rates of the metric table (a ratio's change does not
    split into sums; a conditional metric is no difference of two rates; a score metric compares histograms)."""
    return [m for m in metrics if m in METRICS and METRICS[m].kind == "difference" and METRICS[m].rates]


def explanations(attribute: Attribute, metrics: Iterable[str], segments: SegmentCounts) -> list[dict[str, Any]]:
    """One JSON-ready explanation per explainable metric, rate of it, and configured pair of ``attribute``; every
    rate is decomposed once, for every pair and rate at once, and its terms sorted once for every pair. Two metrics
    of one rate (equal opportunity and equalised odds, of the TPR) explain its change alike: their explanations of
    a pair differ in ``metric`` only and share one ``segments`` list (read, not changed, by every consumer). A
    row's intervals are ``(low, high)`` tuples (JSON arrays like any pair): a tuple of floats leaves the garbage
    collector's lists at its first pass and its row dict at the next full one, where two lists per row kept every
    row of 100 models' 227,000 in every full collection (measured: the collector's time per evaluation 0.41-0.61 s
    with lists, 0.19-0.28 s with tuples)."""
    a, b = (np.array([p[i] for p in attribute.pairs], np.int64) for i in (0, 1))
    explained = explainable(metrics)
    rates = list(dict.fromkeys(rate for metric in explained for rate in METRICS[metric].rates))
    found = decompose_columns([base for _, base, _ in segments.values()], [cur for _, _, cur in segments.values()],
                              a, b, rates) if rates and segments else {}  # fmt: skip
    parts = {rate: {col: (names, d) for (col, (names, _, _)), d in zip(segments.items(), found[rate], strict=True)}
             for rate in found}  # fmt: skip
    parts.update({rate: {} for rate in rates if rate not in parts})
    blank = [column for column, (names, base, cur) in segments.items() if not _carried(names, base, cur)]
    terms = {rate: _Terms.of({c: part for c, part in parts[rate].items() if c not in blank}) for rate in rates}
    made: dict[tuple[str, int], dict[str, Any]] = {}
    out = []
    for metric in explained:
        for rate in METRICS[metric].rates:
            for k, pair in enumerate(attribute.pairs):
                same = made.get((rate, k))
                if same is None:
                    made[rate, k] = same = _explanation(attribute, metric, rate, pair, k, parts[rate], terms[rate],
                                                        blank)  # fmt: skip
                out.append(same if same["metric"] == metric else {**same, "metric": metric})
    return out


def _carried(names: Sequence[str], baseline: NDArray, current: NDArray) -> bool:
    """Whether any row of either period carried a kept value of the column: one counted outside ``other`` (a column
    whose every row is under ``other``, its one cell, explains nothing: its only term would be the whole change)."""
    kept = slice(None, -1) if names and names[-1] == OTHER_SEGMENT else slice(None)
    return bool(np.asarray(baseline)[:, kept].any() or np.asarray(current)[:, kept].any())


@dataclass(frozen=True)
class Unvalued:
    """A segment column's rows without a value of it in each period (counted under ``other``); ``past_cap``: the
    counts include rows whose value came past the column's cap (the daemon's windows cannot tell the two apart once
    both have happened)."""

    baseline: int
    current: int
    past_cap: bool = False


def with_unvalued(found: Iterable[dict[str, Any]], unvalued: Mapping[str, Unvalued]) -> list[dict[str, Any]]:
    """The explanations with each segment column's rows without a value (``missing_rows``), said next to the terms
    when there are any. A column sent on some rows of one period only (a field dropped or added upstream) moves rows
    into or out of ``other``: the summary names that as a candidate cause of the change."""
    missing = {c: {"baseline": u.baseline, "current": u.current, "past_cap_included": u.past_cap}
               for c, u in unvalued.items()}  # fmt: skip
    out = []
    for e in found:
        notes = []
        for column, u in unvalued.items():
            if not (u.baseline or u.current):
                continue
            none = f"no value{' (or one past its cap)' if u.past_cap else ''}"
            note = f"{u.baseline} rows of the baseline and {u.current} of the current period had {none} of {column}"
            if (u.baseline == 0) != (u.current == 0) and any(s["column"] == column for s in e["segments"]):
                note += (f", counted under {column}=other: a change upstream (a field no longer or newly sent) is a "
                         "candidate cause of the change")  # fmt: skip
            notes.append(note)
        out.append({**e, "summary": "; ".join([e["summary"], *notes]), "missing_rows": missing})
    return out


@dataclass(frozen=True)
class _Terms:
    """One rate's terms over every segment column's values, as lists per pair (one numpy pass for all pairs): each
    pair's values with trials, largest of |mix| and |rate| first (ties: column then value order)."""

    columns: list[str]
    values: list[Any]
    order: list[list[int]]
    mix: list[list[float]]
    rate: list[list[float]]
    mix_ci: tuple[list[list[float]], list[list[float]]]
    rate_ci: tuple[list[list[float]], list[list[float]]]
    group_rate: list[list[float]]

    @classmethod
    def of(cls, parts: Mapping[str, tuple[Sequence[str], Decomposition]]) -> _Terms:
        if not parts:
            return cls([], [], [], [], [], ([], []), ([], []), [])
        decompositions = [d for _, d in parts.values()]

        def joined(name: str) -> NDArray:
            return np.concatenate([getattr(d, name) for d in decompositions], axis=1)

        mix, within, trials = joined("mix"), joined("rate"), joined("trials")
        mix_half, rate_half = Z_95 * joined("mix_se"), Z_95 * joined("rate_se")
        size_mix, size_rate = np.abs(mix), np.abs(within)
        key = -np.where(size_rate > size_mix, size_rate, size_mix)  # -max(|mix|, |rate|), as Python's max picks
        order = np.argsort(np.where(trials > 0, key, np.inf), axis=1, kind="stable")
        kept = (trials > 0).sum(axis=1).tolist()
        return cls([col for col, (names, _) in parts.items() for _ in names],
                   [v for names, _ in parts.values() for v in names],
                   [row[:n] for row, n in zip(order.tolist(), kept, strict=True)], mix.tolist(), within.tolist(),
                   ((mix - mix_half).tolist(), (mix + mix_half).tolist()),
                   ((within - rate_half).tolist(), (within + rate_half).tolist()), joined("group_rate").tolist())

    def rows(self, k: int) -> list[dict[str, Any]]:
        """Pair ``k``'s terms, sorted (none without a column)."""
        if not self.order:
            return []
        columns, values, mix, rate = self.columns, self.values, self.mix[k], self.rate[k]
        (mix_lo, mix_hi), (rate_lo, rate_hi) = ((lo[k], hi[k]) for lo, hi in (self.mix_ci, self.rate_ci))
        return [{"column": columns[i], "value": values[i], "mix": mix[i], "rate": rate[i],
                 "mix_ci_95": (mix_lo[i], mix_hi[i]), "rate_ci_95": (rate_lo[i], rate_hi[i])}
                for i in self.order[k]]  # fmt: skip


def _number(x: float) -> float | None:
    return None if not np.isfinite(x) else float(x)


def _explanation(attribute: Attribute, metric: str, rate: str, pair: tuple[int, int], k: int,
                 parts: Mapping[str, tuple[Sequence[str], Decomposition]], terms: _Terms,
                 blank: Sequence[str]) -> dict[str, Any]:  # fmt: skip
    """The explanation of pair ``k`` of the decompositions (``blank``: the columns no row carried, left out of the
    terms and named)."""
    group_a, group_b = (attribute.groups[i] for i in pair)
    first = next(iter(parts.values()))[1] if parts else None
    baseline, current = (float(first.baseline[k]), float(first.current[k])) if first else (math.nan, math.nan)
    change = current - baseline
    rows = terms.rows(k) if math.isfinite(change) else []
    unexplained = (f"no row of either period carried a value of {', '.join(blank)} (every row counted under "
                   "other): it explains nothing") if blank else ""  # fmt: skip
    if rows:
        summary = _sentence(rate, group_a, group_b, (baseline, current), rows, parts, k,
                            terms.group_rate[k][terms.order[k][0]]) + (f"; {unexplained}" if blank else "")
    elif blank and math.isfinite(change):
        summary = f"{_head(rate, group_a, group_b, (baseline, current))}: {unexplained}"
    else:
        summary = (f"the {_RATE_WORDS[rate]} gap {group_a} vs {group_b} is undefined in a period (a group without "
                   f"{'rows' if rate == 'selection_rate' else 'trials of the rate'}), or no segment column is "
                   "configured")  # fmt: skip
    return {"attribute": attribute.name, "metric": metric, "rate": rate, "comparison": f"{group_a} vs {group_b}",
            "baseline_value": _number(baseline), "current_value": _number(current), "change": _number(change),
            "summary": summary, "segments": rows}  # fmt: skip


def _sentence(rate: str, group_a: str, group_b: str, gaps: tuple[float, float], rows: list[dict[str, Any]],
              parts: Mapping[str, tuple[Sequence[str], Decomposition]], k: int, own: float) -> str:  # fmt: skip
    """One sentence naming the largest term: ``the selection rate gap f vs m rose by 0.060 (0.030 to 0.090):
    +0.050 from f's selection rate within channel=broker, +0.010 from the mix over channel``; a mix term is named as
    ``the share of rows in channel=broker``; ``own``: the top row's rate term of group a alone."""
    word = _RATE_WORDS[rate]
    head = _head(rate, group_a, group_b, gaps)
    top = rows[0]
    kind = "rate" if abs(top["rate"]) >= abs(top["mix"]) else "mix"
    column, value = top["column"], top["value"]
    if kind == "rate":
        who = group_a if abs(own) >= abs(top["rate"] - own) else group_b
        what = f"{who}'s {word} within {column}={value}"
    else:
        what = f"the share of rows in {column}={value}"
    d = parts[column][1]
    other_kind = float((d.mix if kind == "rate" else d.rate)[k].sum())
    rest = float((d.rate if kind == "rate" else d.mix)[k].sum()) - top[kind]
    clauses = [f"{top[kind]:+.3f} from {what}"]
    if abs(other_kind) >= 0.0005:
        clauses.append(f"{other_kind:+.3f} from the {'mix' if kind == 'rate' else 'rates'} over {column}")
    if abs(rest) >= 0.0005:
        clauses.append(f"{rest:+.3f} from the {'rates' if kind == 'rate' else 'mix'} of the other {column} values")
    return f"{head}: {', '.join(clauses)}"


def _head(rate: str, group_a: str, group_b: str, gaps: tuple[float, float]) -> str:
    """The sentence's start: ``the selection rate gap f vs m rose by 0.060 (0.030 to 0.090)``."""
    baseline, current = gaps
    change = current - baseline
    return (f"the {_RATE_WORDS[rate]} gap {group_a} vs {group_b} {'rose' if change >= 0 else 'fell'} by "
            f"{abs(change):.3f} ({baseline:.3f} to {current:.3f})")  # fmt: skip
