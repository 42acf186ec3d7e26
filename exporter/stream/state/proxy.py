"""The window counts of a model's proxy attributes (``proxy: {method: bisg, ...}``): per bucket, group and count
column, the sums of the rows' posterior shares, as floats, beside (never in) the
exact integer counts of the other attributes. A proxy attribute's rows carry their evidence as a code
(:meth:`exporter.core.bisg.Tables.codes`: which surname and ZCTA), so the label join, the checkpoint's pending
predictions and the internal topics hold an int as for any attribute; the posterior is taken here, when counted."""

from __future__ import annotations

import numpy as np

from exporter.config import ModelSpec
from exporter.core import bisg
from exporter.core.fairness import N_COUNTS


class ProxyRing:
    """The float counts of a model's proxy attributes, ``(n_buckets, rows, N_COUNTS)``: each attribute's groups then
    its unknown category, as the gate's weighted counts (exporter/gate/fairness/frames.py)."""

    def __init__(self, model: ModelSpec, n_buckets: int) -> None:
        self.attributes = tuple(a for a in model.attributes if a.proxy is not None)
        sizes = [len(a.groups) + 1 for a in self.attributes]
        self.offsets = tuple(int(x) for x in np.cumsum([0, *sizes])[:-1])
        self.counts = np.zeros((n_buckets, sum(sizes), N_COUNTS), dtype=np.float64)

    def add(self, slots: np.ndarray, codes: dict[str, np.ndarray], columns: np.ndarray) -> None:
        """Add each row's shares to the count ``columns`` (PRED_POS, ..., FN) of its slot's bucket."""
        if not len(slots):
            return
        flat = self.counts.reshape(-1)
        n_rows = self.counts.shape[1]
        for attribute, offset in zip(self.attributes, self.offsets, strict=True):
            shares = bisg.group_weights(bisg.tables().posteriors_of(codes[attribute.name]), attribute.groups)
            rows = offset + np.arange(shares.shape[1])
            cells = ((slots[:, None] * n_rows + rows[None, :]) * N_COUNTS + columns[:, None]).reshape(-1)
            np.add.at(flat, cells, shares.reshape(-1))

    def split(self, rows: np.ndarray) -> dict[str, np.ndarray]:
        """A window's ``(rows, N_COUNTS)`` sums cut per proxy attribute (its groups, then its unknown row)."""
        return {a.name: rows[o : o + len(a.groups) + 1] for a, o in zip(self.attributes, self.offsets, strict=True)}
