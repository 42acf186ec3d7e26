"""The gate's counts per (subgroup x segment value): one more axis of the tally, for the explanations of a gap's
change (``segments:``) and for parity conditional on strata (``strata:``).

Each key (a segment column, or the strata's columns together) has a bounded table of values
(:class:`exporter.core.explain.SegmentValues`) shared by the baseline and the current data, so both are counted on
the same values; rows past the cap, or missing a value, are counted under ``other``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa

from exporter.config import ModelSpec
from exporter.core.conditional import CONDITIONAL_METRICS, Stratified, conditional_compare, excluded_rows, known_strata
from exporter.core.encoding import attribute_codes
from exporter.core.evaluate import Evaluation
from exporter.core.explain import STRATA_SEP, SegmentValues, explanations, key_value, segment_keys
from exporter.gate.data import columns as col
from exporter.gate.fairness.frames import CELLS, cell_counts


def keys(config: ModelSpec) -> dict[str, tuple[str, ...]]:
    """Every counted key and its columns (:func:`exporter.core.explain.segment_keys`)."""
    return segment_keys(config.segments, config.strata)


@dataclass
class SegmentTally:
    """Cells per (attribute, key): ``(n_groups + 1, cap + 1, CELLS)`` rows by group (the unknown category last),
    value code and prediction x label cell, added up over batches (of the baseline first, then the current)."""

    config: ModelSpec
    tables: dict[str, SegmentValues] = field(default_factory=dict)
    cells: dict[tuple[str, str], np.ndarray] = field(default_factory=dict)
    overflow_rows: dict[str, int] = field(default_factory=dict)
    missing_rows: dict[str, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for key in keys(self.config):
            self.tables.setdefault(key, SegmentValues(self.config.segment_values))

    @property
    def columns(self) -> list[str]:
        """The data columns the segment and strata counts read."""
        return list(dict.fromkeys([*self.config.segments, *self.config.strata]))

    def fresh(self) -> SegmentTally:
        """An empty tally on the same value tables (the current data's, after the baseline's)."""
        return SegmentTally(self.config, self.tables)

    def add(self, batch: pa.RecordBatch, base: Mapping[str, np.ndarray], cell: np.ndarray,
            weights: np.ndarray | None) -> None:  # fmt: skip
        """Count a batch: its rows' base attribute codes and cells (``prediction * 3 + label + 1``)."""
        width = self.config.segment_values + 1
        for key, cols in keys(self.config).items():
            codes, overflowed, missing = self._codes(key, [batch.column(c) for c in cols])
            count = (lambda m: int(m.sum() if weights is None else weights[m].sum()))  # noqa: E731
            self.overflow_rows[key] = self.overflow_rows.get(key, 0) + count(overflowed)
            self.missing_rows[key] = self.missing_rows.get(key, 0) + count(missing)
            for attribute in self.config.attributes:
                n = len(attribute.groups)
                groups = attribute_codes(attribute, base)
                index = (np.where(groups < 0, n, groups) * width + codes) * CELLS + cell
                found = np.bincount(index, weights=weights, minlength=(n + 1) * width * CELLS)
                found = found.astype(np.int64) if weights is None else np.rint(found).astype(np.int64)
                self.cells[attribute.name, key] = self.cells.get((attribute.name, key), 0) + found

    def _codes(self, key: str, arrays: list[pa.Array]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Each row's value code, whether its value overflowed the cap, whether it is missing: the table is asked
        once per distinct value (per distinct combination of the strata's columns), in order of first sight."""
        table = self.tables[key]
        parts = [col.distinct(a) for a in arrays]
        combined = np.zeros(len(arrays[0]), np.int64)
        for indices, values in parts:  # a mixed-radix number of each column's index (+1: missing is 0)
            combined = combined * (len(values) + 1) + (indices.astype(np.int64) + 1)
        combos, first, rows = np.unique(combined, return_index=True, return_inverse=True)
        lut = np.empty(len(combos), np.int64)
        over = np.zeros(len(combos), bool)
        blank = np.zeros(len(combos), bool)
        for k in np.argsort(first, kind="stable").tolist():  # first sight decides who gets a code under the cap
            digits, rest = [], int(combos[k])
            for _, values in reversed(parts):
                rest, digit = divmod(rest, len(values) + 1)
                digits.append(values[digit - 1] if digit else None)
            chosen = digits[::-1]
            value = key_value([None if col.is_missing(v) else v for v in chosen])
            blank[k] = value is None
            lut[k], over[k] = table.code(value)
        rows = rows.reshape(-1)
        return lut[rows], over[rows], blank[rows]

    def counts(self, attribute_name: str, key: str) -> tuple[tuple[str, ...], np.ndarray]:
        """The value names of a key and the core's counts ``(n_groups, n_values, N_COUNTS)`` of an attribute's groups
        on them (its unknown category left out, as from every comparison)."""
        attribute = next(a for a in self.config.attributes if a.name == attribute_name)
        n, width = len(attribute.groups), self.config.segment_values + 1
        table = self.tables[key]
        cells = self.cells.get((attribute_name, key), np.zeros((n + 1) * width * CELLS, np.int64))
        counts = cells.reshape(n + 1, width, CELLS) @ cell_counts()
        used = [*range(len(table.values)), width - 1]
        return table.names, counts[:n, used]

    def describe(self) -> dict[str, Any]:
        """What the report says of each key: its columns, kept values, cap and the rows counted as ``other``."""
        return {key: {"columns": list(cols), "values": list(self.tables[key].values),
                      "cap": self.config.segment_values, "overflow_rows": self.overflow_rows.get(key, 0),
                      "missing_rows": self.missing_rows.get(key, 0)}
                for key, cols in keys(self.config).items()}  # fmt: skip


def explain_change(config: ModelSpec, baseline: SegmentTally, current: SegmentTally) -> list[dict[str, Any]]:
    """The explanations of every configured difference metric's change from the baseline's counts to the current's,
    per attribute and pair, over the segment columns (:func:`exporter.core.explain.explanations`)."""
    out = []
    for attribute in config.attributes:
        parts = {}
        for column in config.segments:
            names, base = baseline.counts(attribute.name, column)
            _, cur = current.counts(attribute.name, column)
            parts[column] = (names, base, cur)
        out.extend(explanations(attribute, [m.name for m in config.metrics], parts))
    return out


def with_conditional(config: ModelSpec, evaluations: list[Evaluation], tally: SegmentTally | None) -> \
        tuple[list[Evaluation], dict[tuple[str, str], Stratified]]:  # fmt: skip
    """The evaluations with the configured conditional metrics among their comparisons (from the counts per
    known stratum, judged as every metric: :meth:`Evaluation.with_conditional`), and each one's strata used and
    dropped, by (attribute, metric). Rows under ``other`` (no stratum value, or past the cap) are left out
    (:func:`exporter.core.conditional.known_strata`)."""
    names = [m.name for m in config.metrics if m.name in CONDITIONAL_METRICS]
    if not names or tally is None:
        return evaluations, {}
    key = STRATA_SEP.join(config.strata)
    out, found = [], {}
    for ev in evaluations:
        strata = known_strata(tally.counts(ev.attribute.name, key)[1])
        c = ev.comparisons
        for name in names:
            found[ev.attribute.name, name] = conditional_compare(name, strata, c.group_a, c.group_b)
        out.append(ev.with_conditional(strata, {name: found[ev.attribute.name, name].values for name in names}))
    return out, found


def mark_conditional(results: list[dict[str, Any]], config: ModelSpec, found: Mapping[tuple[str, str], Stratified],
                     tally: SegmentTally | None) -> None:  # fmt: skip
    """Each conditional result's signed gap and strata: the columns, the strata used and those dropped (one group
    only), and the rows excluded from every stratum: missing a stratum value, or past the cap."""
    pair_index: dict[tuple[str, str], int] = {}
    for r in results:
        s = found.get((r["attribute"], r["metric"]))
        if s is None or tally is None:
            continue
        k = pair_index[r["attribute"], r["metric"]] = pair_index.get((r["attribute"], r["metric"]), -1) + 1
        key = STRATA_SEP.join(config.strata)
        r["signed_value"] = None if not np.isfinite(s.signed[k]) else float(s.signed[k])
        r["strata"] = {"columns": list(config.strata), "used": int(s.strata_used[k]),
                       "dropped_one_group_only": int(s.strata_dropped[k]),
                       **excluded_rows(tally.missing_rows.get(key, 0), tally.overflow_rows.get(key, 0))}  # fmt: skip
