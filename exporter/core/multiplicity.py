"""Many comparisons of one metric: each pair's interval at 95%/K (Bonferroni over the K judged), the worst comparison
with an interval that holds over all of them, and the multiplicity rules that judge a ``fail`` among them.

:mod:`exporter.core.evaluate` applies them to every metric of an evaluation (docs/auditor/numbers.md#many-comparisons).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from exporter.core.conditional import metric
from exporter.core.metric_table import Comparisons, MetricValues, Request

Compute = Callable[[Sequence[Request]], list[MetricValues]]
"""Each request's pairs at the level of its K (``compute_many`` of :mod:`exporter.core.metric_table` over the groups'
counts, of :mod:`exporter.core.conditional` over their counts per stratum)."""


@dataclass(frozen=True)
class Worst:
    """Per family of comparisons (one but in ``backtest``): the worst comparison of a metric and its simultaneous
    interval; ``pair`` is -1 (and the numbers NaN) when none was judged."""

    pair: np.ndarray
    value: np.ndarray
    lower: np.ndarray
    upper: np.ndarray
    judged: np.ndarray


def worst_of(kind: str, values: MetricValues, simultaneous: MetricValues, judged: np.ndarray, family: np.ndarray,
             families: int) -> Worst:  # fmt: skip
    """Per family, over its ``judged`` pairs: the worst value (a difference's largest, a ratio's smallest) and, from
    every pair's interval at 95%/K (Bonferroni over the K judged), the max (a ratio: min) of their lower and of their
    upper bounds: if every interval holds its pair's true value, which happens with 95% probability at least, this
    one holds the true worst. Vectorised over families (``backtest`` judges a day of steps at once)."""
    return worsts_of([kind], [values], [simultaneous], [judged], family, families)[0]


def worsts_of(kinds: Sequence[str], values: Sequence[MetricValues], simultaneous: Sequence[MetricValues],
              judged: Sequence[np.ndarray], family: np.ndarray, families: int) -> list[Worst]:  # fmt: skip
    """:func:`worst_of` of several metrics of the same pairs, in one pass: each metric's families are families of
    their own."""
    if not kinds:
        return []
    size, n = len(family), len(kinds) * families
    signs = np.array([-1.0 if kind == "ratio" else 1.0 for kind in kinds])  # the worst is the largest sign * value
    sign, family_sign = np.repeat(signs, size), np.repeat(signs, families)
    family = np.add.outer(np.arange(len(kinds)) * families, family).ravel()
    ok = np.concatenate(judged)
    value = np.concatenate([v.value for v in values])
    key = np.where(ok, sign * value, -np.inf)
    order = np.lexsort((-key, family))  # by family, the worst first
    first = np.searchsorted(family[order], np.arange(n))
    count = np.bincount(family[ok], minlength=n)
    pair = np.where(count > 0, order[np.minimum(first, len(order) - 1)] if len(order) else -1, -1)
    bounds = []
    for side in (np.concatenate([s.lower for s in simultaneous]), np.concatenate([s.upper for s in simultaneous])):
        top = np.full(n, -np.inf)
        np.maximum.at(top, family[ok], sign[ok] * side[ok])
        bounds.append(np.where(count > 0, family_sign * top, np.nan))
    worst = np.where(count > 0, value[np.maximum(pair, 0)] if len(order) else np.nan, np.nan)
    local = np.where(pair >= 0, pair - np.repeat(np.arange(len(kinds)) * size, families), -1).astype(np.int64)
    count = count.astype(np.int64)
    return [Worst(local[part], worst[part], bounds[0][part], bounds[1][part], count[part])
            for part in (slice(i * families, (i + 1) * families) for i in range(len(kinds)))]  # fmt: skip


MULTIPLICITY = ("holm", "bonferroni", "none")
"""How ``fail`` is judged across one metric's comparisons of an attribute: Holm's step-down (the default), each at
95%/K (Bonferroni), or each alone. ``pass`` needs no adjustment (docs/auditor/numbers.md)."""


def fails(name: str, threshold: float, multiplicity: str, compute: Compute, pairs: np.ndarray, judged: np.ndarray,
          family: np.ndarray, simultaneous: MetricValues) -> np.ndarray:  # fmt: skip
    """Per pair (``pairs`` of groups, ``judged`` the ones with a value, ``family`` their family): whether its
    interval lies wholly beyond the threshold as one of its family's K judged comparisons: each at the 5%/K error
    level (``simultaneous``: Bonferroni), or Holm's step-down: once r of them fail, the others are judged again at
    5%/(K - r), until none more fails. That fails the same comparisons as Holm's rule on their p-values, since an
    interval at a lower error level holds the one at a higher. Vectorised over families (one per attribute and
    window of a whole fleet, in the daemon's computation)."""
    return fails_many({name: threshold}, multiplicity, compute, pairs, {name: judged}, family,
                      {name: simultaneous})[name, threshold]  # fmt: skip


def fails_many(thresholds: Mapping[str, float], multiplicity: str, compute: Compute, pairs: np.ndarray,
               judged: Mapping[str, np.ndarray], family: np.ndarray,
               simultaneous: Mapping[str, MetricValues]) -> dict[tuple[str, float], np.ndarray]:  # fmt: skip
    """:func:`fails` of several metrics at their thresholds, each Holm step of all of them in one ``compute``
    pass."""
    names, size = list(thresholds), len(family)
    if not names:
        return {}
    failed = np.concatenate([judged[name] & metric(name).fails(simultaneous[name].lower, simultaneous[name].upper,
                                                                thresholds[name]) for name in names])  # fmt: skip
    out = {(name, thresholds[name]): failed[i * size : (i + 1) * size] for i, name in enumerate(names)}  # views
    if multiplicity == "bonferroni" or not size:
        return out
    # every metric's families are families of their own: one bincount per step for all metrics
    n = int(family.max()) + 1
    index = np.add.outer(np.arange(len(names)) * n, family).ravel()
    ok = np.concatenate([judged[name] for name in names])
    total = np.bincount(index[ok], minlength=len(names) * n)[index]
    stepping = np.ones(len(names), dtype=bool)
    while True:
        left = ok & ~failed & np.repeat(stepping, size)
        remaining = np.bincount(index[left], minlength=len(names) * n)[index]
        step = np.flatnonzero(left & (remaining < total))  # a family where some failed: its others, at 5%/left
        if not step.size:
            return out
        bounds = np.searchsorted(step, np.arange(len(names) + 1) * size).tolist()
        steps = [(i, step[bounds[i] : bounds[i + 1]]) for i in range(len(names)) if bounds[i] < bounds[i + 1]]
        again = compute([(metric(names[i]), pairs[at - i * size, 0], pairs[at - i * size, 1], remaining[at])
                         for i, at in steps])  # fmt: skip
        stepping[:] = False
        for (i, at), values in zip(steps, again, strict=True):
            newly = metric(names[i]).fails(values.lower, values.upper, thresholds[names[i]])
            if newly.any():
                failed[at[newly]] = True
                stepping[i] = True


def simultaneous(compute: Compute, pairs: np.ndarray, comparisons: Comparisons, judged: Mapping[str, np.ndarray],
                 family: np.ndarray) -> Comparisons:  # fmt: skip
    """Every metric's pairs at the level of their family (a block's pairs, or each of its ``families`` runs): K
    judged comparisons in a family put each of its pairs' intervals at 95%/K, all metrics in one pass. A family of
    K <= 1 keeps its 95% intervals, which is what 95%/1 computes again."""
    names = list(comparisons.metrics)
    if not names or not len(pairs):
        return comparisons
    n = int(family.max()) + 1
    # every metric's K per pair in one pass: each metric's families are families of their own
    index = np.add.outer(np.arange(len(names)) * n, family).ravel()
    ok = np.concatenate([judged[name] for name in names])
    k = np.maximum(np.bincount(index, weights=ok, minlength=len(names) * n).astype(np.int64)[index], 1)
    k = k.reshape(len(names), len(pairs))
    wide = k > 1
    every, some = wide.all(axis=1).tolist(), wide.any(axis=1).tolist()
    a, b = pairs[:, 0], pairs[:, 1]
    requests, wider = [], {}
    for i, name in enumerate(names):
        if every[i]:
            requests.append((metric(name), a, b, k[i]))
        elif some[i]:
            wider[name] = at = np.flatnonzero(wide[i])
            requests.append((metric(name), a[at], b[at], k[i][at]))
    found = iter(compute(requests))
    out = {}
    for i, (name, alone) in enumerate(comparisons.metrics.items()):
        if every[i]:
            out[name] = next(found)
        elif some[i]:
            out[name] = alone.replaced(wider[name], next(found))
        else:
            out[name] = alone
    return Comparisons(comparisons.group_a, comparisons.group_b, out)
