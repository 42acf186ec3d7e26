"""The paired evidence: each item was asked once per group with everything else fixed, so two groups' decisions on
the same item form a pair. Concordant pairs say nothing about a difference; the discordant ones (decided for one
group and not the other: a flip) do. McNemar's exact test asks whether the flips go one way more often than a fair
coin would send them (scipy's binomial test on the discordant pairs), which has far more power than comparing two
rates as if they came from different people.

An item asked with several templates, or with ``samples`` > 1 answers per prompt, gives several pairs that are not
independent (a model that flips an item on a whim of the name flips it under every wording), so the test counts
items, not pairs: per item, its pairs flipped for a less those flipped for b, and the exact sign test on those
differences, ties dropped (an item counts for the group its flips favour). When each item has one pair this is
exactly McNemar's exact test. The p-values of every pair of the run are adjusted together (Holm), so the chance
that a fair model fails anywhere in the run stays under ``alpha``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

try:
    from scipy.stats import binomtest
except ImportError as exc:  # the gate's other commands run without it
    raise ImportError("the counterfactual gate's McNemar test needs scipy: pip install "
                      "'fairness-exporter[reports]'") from exc  # fmt: skip

POSITIVE, NEGATIVE, UNPARSED, FAILED = 1, 0, -1, -2
"""A decision cell: the extractor's outcome, an answer it could not read, or a request that got no answer."""


@dataclass(frozen=True)
class PairCounts:
    """Two groups' decisions on the same (item, template, sample): both positive, only a, only b, neither; the
    exact test on the items (:func:`compare`), and how many items it had: those with at least one pair decided on
    both sides (what ``min_samples`` counts)."""

    both_positive: int
    a_only: int
    b_only: int
    neither: int
    p_value: float
    test: str
    paired_items: int

    @property
    def paired(self) -> int:
        return self.both_positive + self.a_only + self.b_only + self.neither

    @property
    def flip_rate(self) -> float | None:
        return (self.a_only + self.b_only) / self.paired if self.paired else None


def exact_p_value(k: int, m: int) -> float:
    """Two-sided exact binomial test of k successes in m trials at 1/2 (McNemar's exact test when k and m - k are
    the two kinds of discordant pairs); 1 when there is no trial."""
    return float(binomtest(k, m, 0.5).pvalue) if m else 1.0


def sign_test(differences: NDArray[np.integer]) -> tuple[int, int, float]:
    """The exact sign test on one number per item: the items above 0, those below, and the p-value (ties, items
    that favour neither side, dropped)."""
    above, below = int((differences > 0).sum()), int((differences < 0).sum())
    return above, below, exact_p_value(above, above + below)


def compare(a: NDArray[np.int8], b: NDArray[np.int8]) -> PairCounts:
    """Pair two groups' decisions, arrays of shape (items, ...) of POSITIVE / NEGATIVE / UNPARSED / FAILED, the
    pairs of an item along its other axes (templates, samples); a pair with an undecided side is left out. The
    counts are of pairs, the test of items (see the module's docstring)."""
    a, b = a.reshape(len(a), -1), b.reshape(len(b), -1)
    decided = (a >= 0) & (b >= 0)
    pa, pb = (a == POSITIVE) & decided, (b == POSITIVE) & decided
    na, nb = (a == NEGATIVE) & decided, (b == NEGATIVE) & decided
    both, a_only, b_only, neither = (int((x & y).sum()) for x, y in ((pa, pb), (pa, nb), (na, pb), (na, nb)))
    _, _, p = sign_test((pa & nb).sum(axis=1) - (na & pb).sum(axis=1))
    return PairCounts(both, a_only, b_only, neither, p, "mcnemar_exact" if a.shape[1] == 1 else "sign_test_by_item",
                      int(decided.any(axis=1).sum()))  # fmt: skip


def holm(p_values: list[float]) -> list[float]:
    """Holm's step-down adjustment: the family-wise error of rejecting where the adjusted p is under alpha is at most
    alpha, whatever the dependence between the tests."""
    m = len(p_values)
    order = sorted(range(m), key=lambda i: p_values[i])
    adjusted = [1.0] * m
    running = 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (m - rank) * p_values[i]))
        adjusted[i] = running
    return adjusted


def design_effect(cells: NDArray) -> float:
    """How many answers one independent answer is worth, for a group's decision cells ``(items, templates,
    samples)``: an item's answers under several templates and samples share the item (a model that judges the
    resume answers it alike every time), so a rate over answers varies as one over items does. Kish's design effect
    of the clustered mean: the items' variance of ``k_i - p n_i`` (the cluster-robust variance of the rate) against
    the binomial variance of the answers, at least 1; exactly 1 when no item has more than one answer decided."""
    decided = cells >= 0
    n = decided.reshape(len(cells), -1).sum(axis=1).astype(np.float64)
    k = (cells == POSITIVE).reshape(len(cells), -1).sum(axis=1).astype(np.float64)
    total, items = n.sum(), int(np.count_nonzero(n))
    if n.max(initial=0) <= 1 or items < 2 or k.sum() in (0.0, total):
        return 1.0
    p = k.sum() / total
    clustered = items / (items - 1) * float(((k - p * n) ** 2).sum()) / total**2
    return max(1.0, clustered / (p * (1 - p) / total))
