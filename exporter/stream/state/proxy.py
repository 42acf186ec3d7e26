"""The window counts of a model's proxy attributes (``proxy: {method: bisg, ...}``): per bucket, group and count
column, the sums of the rows' posterior shares, as floats, beside (never in) the
exact integer counts of the other attributes. A proxy attribute's rows carry their evidence as a code
(:meth:`exporter.core.bisg.Tables.codes`: which surname and ZCTA), so the label join, the checkpoint's pending
predictions and the internal topics hold an int as for any attribute; the posterior is taken here, when counted."""

from __future__ import annotations

from typing import Final

import numpy as np

from exporter.config import ModelSpec
from exporter.core import bisg
from exporter.core.fairness import N_COUNTS, PRED_NEG, PRED_POS

UNRECORDED: Final = "unrecorded"
EVIDENCE: Final = (*bisg.EVIDENCE, UNRECORDED)
"""What a prediction's posterior rests on (:data:`bisg.EVIDENCE`), or ``unrecorded``: counted from a checkpoint
written before the daemon counted its evidence (the window's predictions all accounted for, none guessed)."""


def evidence_rows(counts: np.ndarray) -> dict[str, int]:
    """A window's predictions of a proxy attribute by what their posteriors rest on, named as the gate's
    ``proxy_evidence`` rows; ``unrecorded`` only where there are such predictions."""
    return {kind: n for kind, n in zip(EVIDENCE, counts.tolist(), strict=True) if n or kind != UNRECORDED}


class ProxyRing:
    """The float counts of a model's proxy attributes, ``(n_buckets, rows, N_COUNTS)``: each attribute's groups then
    its unknown category, as the gate's weighted counts (exporter/gate/fairness/frames.py)."""

    def __init__(self, model: ModelSpec, n_buckets: int) -> None:
        self.attributes = tuple(a for a in model.attributes if a.proxy is not None)
        sizes = [len(a.groups) + 1 for a in self.attributes]
        self.offsets = tuple(int(x) for x in np.cumsum([0, *sizes])[:-1])
        self.counts = np.zeros((n_buckets, sum(sizes), N_COUNTS), dtype=np.float64)
        self.evidence = np.zeros((n_buckets, len(self.attributes), len(EVIDENCE)), dtype=np.int64)
        """Per bucket and proxy attribute, its predictions by what their posterior rests on (:data:`EVIDENCE`, by
        :meth:`bisg.Tables.evidence_of`, as the gate's ``proxy_evidence``)."""

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

    def add_evidence(self, slots: np.ndarray, codes: dict[str, np.ndarray]) -> None:
        """Count each prediction (once: not its label) in its slot's bucket by what its posterior rests on."""
        if not len(slots):
            return
        width = len(EVIDENCE)
        for k, attribute in enumerate(self.attributes):
            kinds = bisg.tables().evidence_of(codes[attribute.name])
            cells = (slots * len(self.attributes) + k) * width + kinds
            self.evidence.reshape(-1)[:] += np.bincount(cells, minlength=self.evidence.size)

    def split(self, rows: np.ndarray) -> dict[str, np.ndarray]:
        """A window's ``(rows, N_COUNTS)`` sums cut per proxy attribute (its groups, then its unknown row)."""
        return {a.name: rows[o : o + len(a.groups) + 1] for a, o in zip(self.attributes, self.offsets, strict=True)}

    def restore(self, counts: np.ndarray, evidence: np.ndarray | None) -> None:
        """Load a checkpoint's counts and evidence; without evidence (a checkpoint written before it was counted),
        each bucket's predictions of each attribute count as :data:`UNRECORDED`."""
        self.counts[...] = counts
        if evidence is not None:
            self.evidence[...] = evidence
            return
        self.evidence[...] = 0
        for k, (attribute, offset) in enumerate(zip(self.attributes, self.offsets, strict=True)):
            predicted = counts[:, offset : offset + len(attribute.groups) + 1, (PRED_POS, PRED_NEG)]
            self.evidence[:, k, -1] = np.rint(predicted.sum(axis=(1, 2))).astype(np.int64)
