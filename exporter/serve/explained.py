"""Why each gap moved, as the daemon serves it: GET /explain has every term and, per window and segment column, the
rows counted under ``other`` (no value, or one past the cap); /metrics has the largest terms of each explained gap
change (``segments:``), for the paging alerts' descriptions, and those rows of each window's current period."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
from prometheus_client.core import GaugeMetricFamily, Metric

from exporter.config import ModelSpec
from exporter.core.explain import Unvalued, with_unvalued
from exporter.core.fairness import PRED_NEG, PRED_POS
from exporter.stream.state.segments import STRATA_SEP, SegmentCounts, explain

if TYPE_CHECKING:  # the snapshot computes through this module
    from exporter.serve.snapshot import Snapshot

TOP_TERMS = 3
"""Terms of each explained change on /metrics (model_explanation_top_contribution)."""
_PAIR = ["model_id", "attribute", "window", "dimension", "group_a", "group_b"]
SegmentRows = dict[str, dict[str, dict[str, dict[str, int | None]]]]
"""Per window, segment column and period: its predictions, those under ``other``, and why (:func:`segment_rows`)."""
AMBIGUOUS = "missing_or_overflow"
"""The reason of a window's rows under ``other`` once both reasons have happened since the counts began."""


def explained(spec: ModelSpec, taken: Any, counts: SegmentCounts, split: Callable[[np.ndarray], dict[str, np.ndarray]],
              others: tuple[np.ndarray, np.ndarray]) -> dict[str, Any]:  # fmt: skip
    """Per window, why each gap moved since the window before (:func:`exporter.stream.state.segments.explain`, the
    gate's explanations), with each segment column's rows under ``other`` in both periods (``segment_rows``,
    :func:`segment_rows`), also said in the explanations next to their terms, as the gate's report says them."""
    found = explain(spec, taken, counts, split)
    rows = segment_rows(spec, taken, counts, split, others)
    return {window: {**f, "segment_rows": rows[window],
                     "explanations": with_unvalued(f["explanations"], unvalued(rows[window]))}
            for window, f in found.items()}  # fmt: skip


def segment_rows(spec: ModelSpec, taken: Any, counts: SegmentCounts,
                 split: Callable[[np.ndarray], dict[str, np.ndarray]], others: tuple[np.ndarray, np.ndarray],
                 columns: Sequence[str] | None = None) -> SegmentRows:  # fmt: skip
    """Per window, segment column (``columns``, else ``segments:``) and period (``baseline``, ``current``): its
    predictions (``rows``), those counted under ``other``, and why: ``missing`` (no value) and ``overflow`` (a value
    past the cap). The segment ring counts both under ``other``; ``others`` (the column's missing and overflowing
    events since the counts began, read with ``taken``) tells them apart when only one has happened, else both are
    None."""
    windows, _, _ = taken
    missing, overflow = others
    out: SegmentRows = {}
    for window, periods in windows.items():
        out[window] = {}
        for column in spec.segments if columns is None else columns:
            k = counts.columns.index(column)
            found = {}
            for period, period_counts in zip(("baseline", "current"), periods, strict=True):
                # one attribute's rows (its groups and its unknown row) hold every prediction once
                block = next(iter(split(period_counts).values()))[:, k * counts.width : (k + 1) * counts.width]
                predicted = block[..., PRED_POS] + block[..., PRED_NEG]
                other = int(predicted[:, -1].sum())
                both = bool(missing[k] and overflow[k])
                found[period] = {"rows": int(predicted.sum()), "other": other,
                                 "missing": None if both else other if missing[k] else 0,
                                 "overflow": None if both else other if overflow[k] else 0}  # fmt: skip
            out[window][column] = found
    return out


def excluded(spec: ModelSpec, taken: Any, counts: SegmentCounts, split: Callable[[np.ndarray], dict[str, np.ndarray]],
             others: tuple[np.ndarray, np.ndarray]) -> dict[str, dict[str, int | None]]:  # fmt: skip
    """Per window: the predictions of its current period the conditional metrics leave out (``strata:``, the rows
    under the strata's ``other``: no value of a stratum column, or a combination past the cap,
    :func:`exporter.core.conditional.known_strata`), as :func:`segment_rows` counts a column's."""
    column = STRATA_SEP.join(spec.strata)
    return {window: found[column]["current"] for window, found in
            segment_rows(spec, taken, counts, split, others, [column]).items()}  # fmt: skip


def unvalued(rows: Mapping[str, Mapping[str, Mapping[str, int | None]]]) -> dict[str, Unvalued]:
    """Each column's rows without a value per period, from a window's :func:`segment_rows` (those under ``other``,
    marked as including values past the cap, when the two cannot be told apart)."""
    def without(found: Mapping[str, int | None]) -> int:
        missing = found["missing"]
        return int(found["other"] or 0) if missing is None else missing

    return {column: Unvalued(without(found["baseline"]), without(found["current"]),
                             past_cap=found["current"]["missing"] is None)
            for column, found in rows.items()}  # fmt: skip


def explanation_families(snapshots: Sequence[Snapshot], cadence: str) -> Iterator[Metric]:
    """The largest terms of each explained change (``segments:``): :data:`TOP_TERMS` series per comparison, rate
    and window, whatever the number of segment values, for the paging alerts' descriptions (/explain has all); and
    each window's predictions under a segment column's ``other``, by reason."""
    yield from _excluded_family(snapshots, cadence)
    if not any(s.explained for s in snapshots):
        return
    family = GaugeMetricFamily(
        "model_explanation_top_contribution", f"The {TOP_TERMS} largest terms (rank 1 the largest) of the change "
        "of the gap rate_a - rate_b from the window before this one (segments:): the segment (column=value), the "
        "term (mix: the groups' shares of it moved; rate: their rates within it moved), its contribution; GET "
        "/explain has every term with its interval." + cadence,
        labels=[*_PAIR, "rate", "rank", "segment", "term"])  # fmt: skip
    others = GaugeMetricFamily(
        "model_segment_other_samples", "Predictions of the window's current period (in the segment buckets) counted "
        "under a segment column's other value (segments:), by reason: missing (the event had no value of the "
        "column: a producer that stops sending it shows here, not as rows leaving its values), overflow (a value "
        f"past segment_values), {AMBIGUOUS} (both have happened since the counts began: the windows cannot tell "
        "them apart)." + cadence, labels=["model_id", "window", "column", "reason"])  # fmt: skip
    for snapshot in snapshots:
        seen = set()
        for window, found in (snapshot.explained or {}).items():
            for column, periods in found.get("segment_rows", {}).items():
                current = periods["current"]
                if current["missing"] is None:
                    others.add_metric([snapshot.model_id, window, column, AMBIGUOUS], current["other"])
                else:
                    for reason in ("missing", "overflow"):
                        others.add_metric([snapshot.model_id, window, column, reason], current[reason])
            for e in found["explanations"]:
                key = (window, e["attribute"], e["comparison"], e["rate"])
                if key in seen:  # one rate's change, explained once for every metric comparing it
                    continue
                seen.add(key)
                a, b = e["comparison"].split(" vs ", 1)
                terms = sorted(((s[t], f"{s['column']}={s['value']}", t) for s in e["segments"]
                                for t in ("rate", "mix")), key=lambda x: -abs(x[0]))[:TOP_TERMS]  # fmt: skip
                for rank, (value, segment, term) in enumerate(terms, start=1):
                    family.add_metric([snapshot.model_id, e["attribute"], window, f"{a}_vs_{b}", a, b, e["rate"],
                                       str(rank), segment, term], value)  # fmt: skip
    yield family
    yield others


def _excluded_family(snapshots: Sequence[Snapshot], cadence: str) -> Iterator[Metric]:
    """Each window's predictions its conditional metrics leave out, by reason (:func:`excluded`)."""
    if not any(s.conditional_excluded for s in snapshots):
        return
    family = GaugeMetricFamily(
        "model_conditional_excluded_samples", "Predictions of the window's current period that the conditional "
        "metrics (strata:) leave out, by reason: missing (the event had no value of a stratum column), overflow (its "
        f"combination came past segment_values), {AMBIGUOUS} (both have happened since the counts began: the windows "
        "cannot tell them apart). The gate's report says the same of its rows (strata.rows_excluded)." + cadence,
        labels=["model_id", "window", "reason"])  # fmt: skip
    for snapshot in snapshots:
        for window, current in (snapshot.conditional_excluded or {}).items():
            if current["missing"] is None:
                family.add_metric([snapshot.model_id, window, AMBIGUOUS], float(current["other"] or 0))
            else:
                for reason in ("missing", "overflow"):
                    family.add_metric([snapshot.model_id, window, reason], float(current[reason] or 0))
    yield family
