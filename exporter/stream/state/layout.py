"""Where each subgroup's counts live among the rows of a window store's state (exporter/stream/state/window.py),
and the rows of a batch's events: one array for every attribute, so that a batch is counted in one ``np.add.at``
per kind of count, however many attributes the model has."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import numpy as np

from exporter.config import ModelSpec
from exporter.core.estimate import LABELLED_NEG, LABELLED_POS, Calibration


@dataclass(frozen=True)
class RowLayout:
    """Where each attribute's subgroups live among the rows of the state: its groups, then one row for its unknown
    category (events whose value is outside the groups, or missing; code ``-1``)."""

    names: tuple[str, ...]
    offsets: tuple[int, ...]
    sizes: tuple[int, ...]

    @classmethod
    def of(cls, model: ModelSpec) -> RowLayout:
        sizes = tuple(len(a.groups) + 1 for a in model.attributes)
        offsets = tuple(int(x) for x in np.cumsum((0, *sizes))[:-1])
        return cls(tuple(a.name for a in model.attributes), offsets, sizes)

    @property
    def n_rows(self) -> int:
        return sum(self.sizes)

    def split(self, rows: np.ndarray) -> dict[str, np.ndarray]:
        """Cut a ``(n_rows, ...)`` array into one block per attribute (its groups' rows, then its unknown row)."""
        return {n: rows[o : o + s] for n, o, s in zip(self.names, self.offsets, self.sizes, strict=True)}

    def rows(self, codes: dict[str, np.ndarray], n: int) -> np.ndarray:
        """State rows ``(attributes, n)`` of a batch's codes (each attribute's); ``-1`` (unknown) goes to the
        attribute's unknown row. One array for every attribute: a batch's counts are one ``np.add.at`` each."""
        if not self.names:
            return np.zeros((0, n), dtype=np.int64)
        stacked = np.array([codes[name] for name in self.names], dtype=np.int64)
        offsets, unknown = self._bounds
        return np.where(stacked < 0, unknown, stacked + offsets)

    @cached_property
    def _bounds(self) -> tuple[np.ndarray, np.ndarray]:
        """Each attribute's first row and its unknown row, as columns."""
        offsets = np.array(self.offsets, dtype=np.int64)[:, None]
        return offsets, offsets + np.array(self.sizes, dtype=np.int64)[:, None] - 1

    def calibration(self, reference: dict[str, np.ndarray], min_samples: int, n_bins: int) -> np.ndarray:
        """The calibration of every row and its sampling standard deviation ``(2, n_rows, n_bins)`` fitted on a
        reference's score counts per attribute; NaN (no calibration detector evidence) for an attribute's unknown
        row and for a subgroup with fewer than ``min_samples`` labelled positives or negatives in the reference,
        whose calibration is mostly the prior's."""
        out = np.full((2, self.n_rows, n_bins), np.nan)
        for name, offset, size in zip(self.names, self.offsets, self.sizes, strict=True):
            counts = reference[name][: size - 1]
            labelled = counts.sum(axis=(1, 2))
            enough = np.minimum(labelled[:, LABELLED_POS], labelled[:, LABELLED_NEG]) >= min_samples
            fit = Calibration.fit(counts)
            out[:, offset : offset + size - 1] = np.where(enough[:, None], [fit.rate, fit.spread], np.nan)
        return out
