"""Turn rows of predictions into per-subgroup counts for the core (the gate's side of the encoding), a batch at a
time: counts add up, so a dataset of any size is counted in the memory of one batch."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from functools import cache
from typing import Any, Protocol

import numpy as np
import pandas as pd
import pyarrow as pa

from exporter.config import ModelSpec
from exporter.core import bisg, estimate
from exporter.core.encoding import attribute_codes, score_predictions, value_text
from exporter.core.fairness import RATES, counts_from_arrays
from exporter.gate.data import columns as col
from exporter.gate.data.columns import code_lut
from exporter.gate.data.dataset import BATCH_ROWS, DataError, Dataset, open_dataset
from exporter.gate.fairness import ll144

CELLS = 6
"""A row's cell: its prediction (0, 1) times its label (missing, 0, 1), ``prediction * 3 + label + 1``."""


def encode(values: Sequence[object] | np.ndarray | pd.Series, groups: Sequence[str], *,
           other: bool = False) -> np.ndarray:  # fmt: skip
    """Codes of a column of values, by :func:`code_table` (``other``: the last group, ``other``, holds every value
    outside the others); a blank cell gets the attribute's unknown code.

    Cells are compared with the config's groups as :func:`value_text` writes them (as the daemon compares its
    JSON values), a whole float as an integer. Each distinct value is converted once.

    >>> encode(["f", "m", "x"], ("m", "f")).tolist()
    [1, 0, -1]
    >>> encode(["f", "m", None, "x"], ("m", "f", "other"), other=True).tolist()
    [1, 0, 2, 2]
    >>> encode(["f", "other", None, "x"], ("m", "f", "other")).tolist()  # a group like any (the seed's ethnicity)
    [1, 2, -1, -1]
    >>> encode([1.0, 2.0, float("nan")], ("1", "2")).tolist()  # an integer column with a blank cell
    [0, 1, -1]
    """
    positions, distinct = pd.factorize(pd.Series(values), use_na_sentinel=True)  # a blank is -1
    return code_lut(list(distinct), groups, other)[positions]  # position -1 picks the trailing unknown


def row_cells(y_pred: np.ndarray, y_true: np.ndarray | None) -> np.ndarray:
    """Each row's cell (:data:`CELLS`) from its 0/1 prediction and its label (-1: unlabelled; None: no label column)."""
    return y_pred * 3 + (0 if y_true is None else y_true + 1)


@cache
def cell_counts() -> np.ndarray:
    """What one row of each cell adds to its group's counts, by the core's own reduction."""
    return np.vstack([counts_from_arrays(np.zeros(1, np.int64), 1, np.array([p]), np.array([label]))[0]
                      for p in (0, 1) for label in (-1, 0, 1)])  # fmt: skip


@dataclass
class Tally:
    """Every configured attribute's rows per (group, cell), the attribute's unknown category last, added up over
    batches. :meth:`counts` turns them into the core's counts, exactly what one pass over all rows would give.
    ``scores``: each attribute's score counts per (group, score bin, prediction) for the estimation
    (:func:`exporter.core.estimate.score_counts`, binned by ``score_buckets`` as the daemon bins), when asked."""

    config: ModelSpec
    cells: dict[str, np.ndarray] = field(default_factory=dict)
    scores: dict[str, np.ndarray] = field(default_factory=dict)
    score_sums: dict[str, np.ndarray] = field(default_factory=dict)
    """A calibrating model's (``calibration_difference``): each attribute's labelled scores' sum per (group, score
    bin), as the daemon keeps them (:attr:`exporter.stream.state.window.WindowStore.labelled_sums`)."""
    moments: dict[str, np.ndarray] = field(default_factory=dict)
    """Each proxy attribute's sums of p p^T per cell (:func:`exporter.core.bisg.moments`), for the correction."""
    evidence: dict[str, np.ndarray] = field(default_factory=dict)
    """Each proxy attribute's rows by what their posterior rests on (:meth:`exporter.core.bisg.Tables.evidence`)."""

    def add(self, base: Mapping[str, np.ndarray], y_pred: np.ndarray, y_true: np.ndarray | None,
            weights: np.ndarray | None = None, scores: np.ndarray | None = None,
            proxies: Mapping[str, np.ndarray] | None = None) -> None:  # fmt: skip
        """Count a batch: each base attribute's codes (by column), predictions, labels (-1: unlabelled); ``weights``
        when each row stands for that many (counts an engine already aggregated); ``scores`` to count score bins;
        ``proxies``: each proxy attribute's posteriors (:meth:`exporter.core.bisg.Tables.posteriors`)."""
        cell = row_cells(y_pred, y_true)
        bounds = np.asarray(self.config.score_buckets, dtype=np.float64)
        bins = None if scores is None else estimate.score_bins(scores, bounds)
        for attribute in self.config.attributes:
            n = len(attribute.groups)
            if attribute.proxy is not None:
                assert proxies is not None
                self.cells[attribute.name] = self.cells.get(attribute.name, 0) + proxy_cells(
                    bisg.group_weights(proxies[attribute.name], attribute.groups), cell, weights)
                self.moments[attribute.name] = self.moments.get(attribute.name, 0) + bisg.moments(
                    proxies[attribute.name], cell, CELLS, weights)
                continue
            codes = attribute_codes(attribute, base)
            found = np.bincount(np.where(codes < 0, n, codes) * CELLS + cell, weights=weights,
                                minlength=(n + 1) * CELLS)  # fmt: skip
            found = found.astype(np.int64) if weights is None else np.rint(found).astype(np.int64)
            self.cells[attribute.name] = self.cells.get(attribute.name, 0) + found
            if bins is not None:
                binned = estimate.score_counts(codes, n, bins, len(bounds) + 1, y_pred, y_true, weights)
                self.scores[attribute.name] = self.scores.get(attribute.name, 0) + binned
            if scores is not None and bins is not None and y_true is not None and self.config.calibrates:
                summed = np.where(y_true >= 0, scores, 0.0) * (1 if weights is None else weights)
                self.score_sums[attribute.name] = self.score_sums.get(attribute.name, 0) + np.bincount(
                    np.where(codes < 0, n, codes) * (len(bounds) + 1) + bins, weights=summed,
                    minlength=(n + 1) * (len(bounds) + 1)).reshape(n + 1, len(bounds) + 1)  # fmt: skip

    def counts(self) -> dict[str, np.ndarray]:
        """Counts of every configured attribute: a row per group, then one row for its unknown category (values
        outside the groups, or missing), which the overall rate counts and no comparison does."""
        out = {}
        for attribute in self.config.attributes:
            n = len(attribute.groups)
            cells = self.cells.get(attribute.name, np.zeros((n + 1) * CELLS, dtype=np.int64))
            out[attribute.name] = cells.reshape(n + 1, CELLS) @ cell_counts()
        return out


def corrected(tally: Tally, name: str) -> dict[str, np.ndarray]:
    """A proxy attribute's rates of each Census category, corrected for the posteriors' overlap
    (:func:`exporter.core.bisg.corrected_rates`), from its moments per cell turned into moments per count column."""
    by_column = np.einsum("kc,kgh->cgh", cell_counts(), tally.moments.get(name, np.zeros((CELLS, 6, 6))))
    return bisg.corrected_rates(by_column, {r: RATES[r] for r in ("selection_rate", "true_positive_rate",
                                                                    "false_positive_rate")})  # fmt: skip


def proxy_cells(shares: np.ndarray, cell: np.ndarray, weights: np.ndarray | None) -> np.ndarray:
    """A proxy attribute's batch per (group, cell), its unknown category last: the sums of the rows' ``shares`` of
    each (:func:`exporter.core.bisg.group_weights`)."""
    w = np.ones(len(cell)) if weights is None else weights.astype(np.float64)
    return np.concatenate([np.bincount(cell, weights=shares[:, g] * w, minlength=CELLS)
                           for g in range(shares.shape[1])])  # fmt: skip


class BatchCounter(Protocol):
    """More counts of the same rows, taken in the same pass (:class:`exporter.gate.fairness.segments.SegmentTally`):
    the columns it reads, and a batch's rows with their base attribute codes and cells."""

    @property
    def columns(self) -> list[str]: ...

    def add(self, batch: pa.RecordBatch, base: Mapping[str, np.ndarray], cell: np.ndarray,
            weights: np.ndarray | None) -> None: ...  # fmt: skip


class Rows(Protocol):
    """Where the rows come from: a dataset (:class:`exporter.gate.data.dataset.Dataset`), a DataFrame, or an
    engine's per-combination counts (a ``count`` column of weights)."""

    @property
    def columns(self) -> list[str]: ...

    def batches(self, columns: Sequence[str], batch_rows: int = BATCH_ROWS) -> Iterator[pa.RecordBatch]: ...


@dataclass(frozen=True)
class FrameRows:
    """A DataFrame's rows as record batches (the audit of an in-memory frame takes the dataset's path)."""

    frame: pd.DataFrame

    @property
    def columns(self) -> list[str]:
        return [str(c) for c in self.frame.columns]

    def batches(self, columns: Sequence[str], batch_rows: int = BATCH_ROWS) -> Iterator[pa.RecordBatch]:
        arrays = [_arrow(self.frame[c]) for c in columns]
        yield from pa.Table.from_arrays(arrays, names=list(columns)).to_batches(batch_rows)


def _arrow(values: pd.Series) -> pa.Array:
    """A column as arrow; a column of mixed Python types (numbers and text) as the text of each value."""
    try:
        return pa.array(values, from_pandas=True)
    except (pa.ArrowInvalid, pa.ArrowTypeError):
        return pa.array([None if col.is_missing(v) or v is pd.NA else v if isinstance(v, str) else value_text(v)
                         for v in values], type=pa.string())  # fmt: skip


def prediction_column(config: ModelSpec) -> str:
    """The column a model's predictions come from: its score column when it emits scores (``events.score_threshold``:
    the daemon then reads the score and never the prediction field), else its prediction column."""
    return config.events.score if config.events.score_threshold is not None else config.prediction_column


@dataclass
class Checks:
    """The bad cells of the prediction, label and LL144 score columns over every batch; raised after the pass, so
    the message counts the whole file."""

    missing_prediction: col.Problems = field(default_factory=col.Problems)
    prediction: col.Problems = field(default_factory=col.Problems)
    unlabelled: col.Problems = field(default_factory=col.Problems)
    label: col.Problems = field(default_factory=col.Problems)
    score: col.Problems = field(default_factory=col.Problems)

    @property
    def refused(self) -> bool:
        """Whether a cell was found that the audit refuses (:meth:`raise_first`): a prediction or label that is no
        0/1 has no cell to count in, so the pass counts nothing more and only goes on to name every bad cell."""
        return bool(self.missing_prediction.count or self.prediction.count or self.label.count)

    def raise_first(self, config: ModelSpec, name: str, rows: int) -> None:
        """The first problem, in the order the gate has always checked: prediction, label, LL144 score."""
        threshold = config.events.score_threshold
        if threshold is not None and self.prediction.count:
            raise DataError(f"{name}: column {config.events.score!r} must hold scores, numbers between 0 and 1 "
                            f"(events.score_threshold is {threshold:g}); not so in {self.prediction.count} of {rows} "
                            f"rows{self.prediction.where()}")  # fmt: skip
        for column, missing, bad, allow in ((config.prediction_column, self.missing_prediction, self.prediction,
                                             False), (config.label_column, self.unlabelled, self.label, True)):
            if missing.count and not allow:
                raise DataError(f"{name}: column {column!r} has {missing.count} missing values{missing.where()}")
            if bad.count:
                raise DataError(f"{name}: column {column!r} must hold only 0 or 1 (numbers) or true/false "
                                f"(booleans){' or be empty' if allow else ''}; found {bad.samples}"
                                + (" (text is no number: a string column, or a CSV column mixing numbers and words)"
                                   if bad.text else ""))  # fmt: skip
        if self.score.count:
            raise DataError(f"{name}: score column {config.score_column!r} must be numeric with no gaps; found "
                            f"{self.score.samples}")


@dataclass
class Scan:
    """What one pass over a model's rows found: the counts, the rows (of this model, of others), the dates."""

    tally: Tally
    rows: int = 0
    labelled: int = 0
    """Rows of this model with a label (0 or 1): none at all is what lets the gate estimate."""
    other_models: int = 0
    date_range: dict[str, Any] | None = None
    checks: Checks = field(default_factory=Checks)


def required_columns(config: ModelSpec, columns: Sequence[str], needs_labels: bool) -> list[str]:
    """The columns the audit reads and the file must have (the label column only when a metric needs labels)."""
    required = [prediction_column(config), *attribute_columns(config)]
    return [*required, config.label_column] if needs_labels and config.label_column not in required else required


def attribute_columns(config: ModelSpec) -> list[str]:
    """The columns the attributes are read from: each one's column, a proxy's surname and ZCTA columns."""
    return list(dict.fromkeys(c for a in config.base_attributes
                              for c in ((a.proxy.surname, a.proxy.zcta) if a.proxy else a.columns[:1])))  # fmt: skip


def text_columns(config: ModelSpec) -> list[str]:
    """The columns read as dictionaries when they hold text: the attributes and model_id."""
    return ["model_id", *attribute_columns(config)]


def written_columns(config: ModelSpec) -> list[str]:
    """The attribute columns a CSV file gives as its text as written, matched to the groups by that text first
    (:func:`exporter.gate.data.columns.code_lut`): those of the attributes neither joined by id nor a proxy."""
    return [a.columns[0] for a in config.base_attributes if a.proxy is None and a.source is None]


def csv_text_columns(config: ModelSpec) -> list[str]:
    """The columns every engine (the gate's, ``backtest``'s, Spark) reads from a CSV file as its text as written: the
    attribute columns (:func:`written_columns`), and the segment and strata columns, whose values are their text
    as the daemon's JSON strings are (type inference made branches ``007`` and ``7`` one value, ``7``)."""
    return list(dict.fromkeys([*written_columns(config), *config.counted_columns]))


def open_rows(location: str, what: str, config: ModelSpec) -> Dataset:
    """A model's dataset, opened to be counted: its text columns read as dictionaries, the ids its side sources
    join by, and its attribute, segment and strata columns read from CSV as text (exporter/gate/data/dataset.py)."""
    return open_dataset(location, what, text_columns(config), [s.id for s in config.attribute_sources],
                        csv_text_columns(config))  # fmt: skip


def scan(config: ModelSpec, rows: Rows, name: str, *, above: float | None = None, weights: str | None = None,
         scores: bool = False, also: BatchCounter | None = None, csv: bool = False) -> Scan:  # fmt: skip
    """Count a model's rows, a batch at a time: with ``above``, the rows whose LL144 score column is above it (the
    scoring rate) in place of the predictions. ``weights``: the column saying how many rows each row stands for.
    ``scores``: count score bins too (:class:`Tally`), for a model that emits scores. ``also``: more counts of the
    same rows (segments and strata). ``csv``: the rows are a CSV file's, whose :func:`written_columns` hold its
    text as written (whichever engine read them)."""
    available = set(rows.columns)
    reading = [prediction_column(config), *attribute_columns(config)]
    optional = ["model_id", config.label_column, config.timestamp_column,
                *([config.score_column] if config.score_column else [])]
    reading = list(dict.fromkeys([*reading, *(c for c in optional if c in available), *([weights] if weights else []),
                                  *(also.columns if also is not None else [])]))  # fmt: skip
    result = Scan(Tally(config))
    written = written_columns(config)
    dates: list[dict[str, Any]] = []
    for batch in rows.batches(reading):
        w = batch.column(weights).to_numpy().astype(np.int64) if weights else None
        if "model_id" in available:
            indices, ids = col.text(batch.column("model_id"))
            own = np.array([i == config.model_id for i in ids] + [False])[indices]
            other = ~own
            result.other_models += int(other.sum() if w is None else w[other].sum())
            if not own.any():
                continue
            batch = batch.filter(pa.array(own))
            w = w[own] if w is not None else None
        offset = result.rows
        result.rows += batch.num_rows if w is None else int(w.sum())
        base = {a.columns[0]: col.group_codes(batch.column(a.columns[0]), a.groups, a.other,
                                              written=csv and a.columns[0] in written)
                for a in config.base_attributes if a.proxy is None}  # fmt: skip
        evidence = {a.name: bisg.tables().codes(batch.column(a.proxy.surname).to_pylist(),
                                                batch.column(a.proxy.zcta).to_pylist())
                    for a in config.base_attributes if a.proxy is not None}  # fmt: skip
        proxies = {name: bisg.tables().posteriors_of(codes) for name, codes in evidence.items()}
        y_pred, values = predictions(config, batch, result.checks, offset, w)
        y_true = (col.binary(batch.column(config.label_column), result.checks.unlabelled, result.checks.label,
                             offset, w) if config.label_column in available else None)  # fmt: skip
        if y_true is not None:
            labelled = y_true >= 0
            result.labelled += int(labelled.sum() if w is None else w[labelled].sum())
        binned = values if scores else None
        if config.score_column and config.score_column in available:
            ranked = col.numbers(batch.column(config.score_column))
            indices, distinct_values = col.distinct(batch.column(config.score_column))
            result.checks.score.add(np.isnan(ranked), offset, w, distinct_values, indices)
            if above is not None:
                y_pred, y_true = (ranked > above).astype(np.int64), None
        if not result.checks.refused:  # else the audit refuses the data after the pass, naming the values
            result.tally.add(base, y_pred, y_true, w, binned, proxies)
            for name, codes in evidence.items():
                result.tally.evidence[name] = result.tally.evidence.get(name, 0) + bisg.tables().evidence(codes, w)
            if also is not None:
                also.add(batch, base, row_cells(y_pred, y_true), w)
        if config.timestamp_column in available:
            stamps = batch.column(config.timestamp_column).to_pandas()
            dates.append(ll144.date_range(pd.DataFrame({config.timestamp_column: stamps}), config.timestamp_column)
                         or {})  # fmt: skip
    result.date_range = _merge_dates(config.timestamp_column, dates) if config.timestamp_column in available else None
    return result


def predictions(config: ModelSpec, batch: pa.RecordBatch, checks: Checks, offset: int,
                w: np.ndarray | None) -> tuple[np.ndarray, np.ndarray | None]:  # fmt: skip
    """Each row's 0/1 prediction, by the daemon's rules: from the score column against ``events.score_threshold``
    (a score is a number in [0, 1]), else from the prediction column (a 0/1 column); and the scores (None without
    a threshold), valid once ``checks`` raised nothing."""
    threshold = config.events.score_threshold
    if threshold is None:
        return col.binary(batch.column(config.prediction_column), checks.missing_prediction, checks.prediction,
                          offset, w), None  # fmt: skip
    values = col.scores(batch.column(config.events.score))
    checks.prediction.add(np.isnan(values) | (values < 0) | (values > 1), offset, w)
    return score_predictions(np.nan_to_num(values), threshold), values


def _merge_dates(column: str, parts: list[dict[str, Any]]) -> dict[str, Any]:
    """One date range from each batch's: the earliest start, the latest end, every row without a date."""
    starts = [p["start"] for p in parts if p.get("start")]
    ends = [p["end"] for p in parts if p.get("end")]
    when: Callable[[str], datetime] = lambda iso: datetime.fromisoformat(iso.replace("Z", "+00:00"))  # noqa: E731
    return {"column": column, "start": min(starts, key=when) if starts else None,
            "end": max(ends, key=when) if ends else None,
            "rows_without_date": sum(p.get("rows_without_date", 0) for p in parts)}  # fmt: skip
