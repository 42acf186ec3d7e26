"""The ratio score interval's root finder (halvings, then Illinois' false position on the unfinished brackets alone,
:func:`exporter.core.fairness._roots`): the bounds a plain bisection of 80 halvings finds, each pair's bounds the
same alone as in any batch, and ``most`` clipping the upper bound without searching beyond it."""

from __future__ import annotations

import numpy as np

from exporter.core import fairness as core
from exporter.core.fairness import Z_95


def bisection(k1: np.ndarray, n1: np.ndarray, k0: np.ndarray, n0: np.ndarray, z: np.ndarray
              ) -> tuple[np.ndarray, np.ndarray]:  # fmt: skip
    """The reference: 80 halvings of [1e-9, point] and [point, 1e9] on the log scale by the score's sign alone."""
    k1, n1, k0, n0 = (np.asarray(x, dtype=np.float64) for x in (k1, n1, k0, n0))
    bounds = []
    with np.errstate(divide="ignore", invalid="ignore"):
        point = np.log(np.maximum(k1 / n1 / np.maximum(k0 / n0, 1e-300), 1e-9))
    floor, ceiling = np.full_like(point, np.log(1e-9)), np.full_like(point, np.log(1e9))
    for target, lo, hi in ((z, floor, point), (-z, point, ceiling)):
        for _ in range(80):
            mid = (lo + hi) / 2
            with np.errstate(divide="ignore", invalid="ignore"):
                score = core._ratio_score(np.exp(mid), k1, n1, k0, n0)
            above = score > target
            lo, hi = np.where(above, mid, lo), np.where(above, hi, mid)
        bounds.append(np.exp((lo + hi) / 2))
    lower = np.where(bounds[0] <= 1e-9 * 1.0000001, 0.0, bounds[0])
    upper = np.where(bounds[1] >= 1e9 * 0.9999999, np.inf, bounds[1])
    return np.where(k0 > 0, lower, np.nan), np.where(k0 > 0, upper, np.nan)  # no success below: no ratio


def pairs(seed: int, size: int) -> tuple[np.ndarray, ...]:
    """Random pairs, rates near 0 and 1 as often as between, with the edge cases review 17 and the bisection met."""
    rng = np.random.default_rng(seed)
    n1, n0 = rng.integers(1, 3000, size), rng.integers(1, 3000, size)
    p1 = rng.random(size) ** rng.choice([1, 3, 8], size)
    p0 = 1 - rng.random(size) ** rng.choice([1, 3, 8], size)
    k1, k0 = rng.binomial(n1, p1), rng.binomial(n0, p0)
    edges = np.array([[0, 30, 5, 1000], [30, 30, 750, 1000], [30, 30, 30, 30], [0, 30, 30, 30], [1, 1, 1, 1],
                      [1, 2, 1, 1], [1000, 1000, 1, 1000], [5, 5, 1, 1000], [1, 1, 1000, 1000], [3, 30, 0, 30],
                      [1, 100_000, 100_000, 100_000], [10**6, 10**6, 1, 10**6]])  # fmt: skip
    k1, n1, k0, n0 = (np.r_[a, e] for a, e in zip((k1, n1, k0, n0), edges.T, strict=True))
    z = rng.choice([Z_95, 2.39, 2.8, 3.1], len(k1))  # 95% and the simultaneous levels of 2-10 comparisons
    return k1, n1, k0, n0, z


def test_the_bounds_are_the_bisections() -> None:
    k1, n1, k0, n0, z = pairs(43, 20_000)
    got, want = core.ratio_interval(k1, n1, k0, n0, z), bisection(k1, n1, k0, n0, z)
    for g, w in zip(got, want, strict=True):
        assert np.array_equal(g == 0, w == 0) and np.array_equal(np.isinf(g), np.isinf(w))
        assert np.array_equal(np.isnan(g), np.isnan(w))
        finite = (g > 0) & np.isfinite(g)
        # 1e-12 on the log scale but where both rates are about 1: the statistic is so flat there that both
        # methods' bounds move by 1e-10 with the last bits of the score
        assert np.abs(np.log(g[finite] / w[finite])).max() < 1e-9
        assert np.quantile(np.abs(np.log(g[finite] / w[finite])), 0.999) < 1e-12
    assert (got[0] == 0).sum() > 10 and (got[0] > 0.99).sum() > 10 and (got[1] > 100).sum() > 10  # the edges drawn


def test_a_pair_has_the_same_bounds_alone_as_in_any_batch() -> None:
    """What the gate computes for one model's pairs, the daemon for a fleet's and ``backtest`` for a day of steps:
    the same numbers to the bit (each pair's steps depend on its own counts only)."""
    k1, n1, k0, n0, z = pairs(44, 3_000)
    batch = core.ratio_interval(k1, n1, k0, n0, z)
    rng = np.random.default_rng(0)
    for i in rng.choice(len(k1), 150, replace=False):
        alone = core.ratio_interval(k1[i : i + 1], n1[i : i + 1], k0[i : i + 1], n0[i : i + 1], z[i : i + 1])
        assert [a[0].tobytes() for a in alone] == [b[i].tobytes() for b in batch], (k1[i], n1[i], k0[i], n0[i])
    half = slice(0, len(k1) // 2)
    part = core.ratio_interval(k1[half], n1[half], k0[half], n0[half], z[half])
    assert all(np.array_equal(p, b[half], equal_nan=True) for p, b in zip(part, batch, strict=True))


def test_most_clips_the_upper_bound_it_does_not_search() -> None:
    k1, n1, k0, n0, z = pairs(45, 5_000)
    low = k1 / n1 <= k0 / n0  # the metrics' order: the lower rate over the higher, a ratio of at most 1
    k1, n1, k0, n0 = np.where(low, k1, k0), np.where(low, n1, n0), np.where(low, k0, k1), np.where(low, n0, n1)
    lower, upper = core.ratio_interval(k1, n1, k0, n0, z, most=1.0)
    lower_any, upper_any = core.ratio_interval(k1, n1, k0, n0, z)
    assert np.array_equal(lower, lower_any, equal_nan=True)
    clipped = np.minimum(upper_any, 1.0)
    assert np.array_equal(np.isnan(upper), np.isnan(clipped)) and np.array_equal(upper == 1.0, clipped == 1.0)
    below = upper < 1.0
    assert below.sum() > 100 and (upper == 1.0).sum() > 100
    assert np.abs(np.log(upper[below] / clipped[below])).max() < 1e-9
