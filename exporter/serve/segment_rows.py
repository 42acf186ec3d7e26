"""The rows a segment column counts under ``other`` (no value, or one past the cap), per window and period, and what
the daemon explains with them: why each gap moved (GET /explain), and the rows its conditional metrics leave out.
Computed with each snapshot (exporter/serve/snapshot.py) and by ``backtest``; exporter/serve/explained.py shows them on
/metrics."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from exporter.config import ModelSpec
from exporter.core.explain import Unvalued, with_unvalued
from exporter.core.fairness import PRED_NEG, PRED_POS
from exporter.stream.state.segments import STRATA_SEP, SegmentCounts, explain

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
