"""The counts-based fairness core: every metric is a function of per-group outcome counts.

Pure functions, vectorised over groups, no I/O and no pandas. The audit gate and the daemon both reduce their
data to a ``counts`` array of shape ``(n_groups, N_COUNTS)`` and call :func:`group_stats` and :func:`compare`, so
CI and production can never disagree about what a number means.

Columns of a counts array (one row per group):

* ``PRED_POS`` / ``PRED_NEG`` -- every prediction, labelled or not, by predicted class;
* ``TP`` / ``FP`` / ``TN`` / ``FN`` -- the labelled subset of those predictions.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final, NamedTuple

import numpy as np
from numpy.typing import NDArray

PRED_POS, PRED_NEG, TP, FP, TN, FN = range(6)
N_COUNTS: Final = 6
COUNT_NAMES: Final = ("pred_pos", "pred_neg", "tp", "fp", "tn", "fn")

Z_95: Final = 1.959963984540054  # two-sided 95% normal quantile

RATES: Final[dict[str, tuple[tuple[int, ...], tuple[int, ...]]]] = {
    "selection_rate": ((PRED_POS,), (PRED_POS, PRED_NEG)),
    "true_positive_rate": ((TP,), (TP, FN)),
    "false_positive_rate": ((FP,), (FP, TN)),
    "precision": ((TP,), (TP, FP)),
    "accuracy": ((TP, TN), (TP, FP, TN, FN)),
    "false_negative_rate": ((FN,), (TP, FN)),
    "true_negative_rate": ((TN,), (FP, TN)),
    "negative_predictive_value": ((TN,), (TN, FN)),
    "false_discovery_rate": ((FP,), (TP, FP)),
    "false_omission_rate": ((FN,), (TN, FN)),
}
"""Every per-group rate as (numerator columns, denominator columns) of a counts array."""
RATE_TRIALS: Final = {
    "selection_rate": "predictions",
    "true_positive_rate": "labelled positives",
    "false_positive_rate": "labelled negatives",
    "precision": "labelled predicted positives",
    "accuracy": "labelled predictions",
    "false_negative_rate": "labelled positives",
    "true_negative_rate": "labelled negatives",
    "negative_predictive_value": "labelled predicted negatives",
    "false_discovery_rate": "labelled predicted positives",
    "false_omission_rate": "labelled predicted negatives",
}
"""What the denominator of each rate counts: the basis of a comparison's sufficiency."""

FloatArray = NDArray[np.float64]
IntArray = NDArray[np.int64]


def ratio(num: NDArray, den: NDArray) -> FloatArray:
    """num / den elementwise, NaN where den is 0 (an empty group has no rate)."""
    num = np.asarray(num, dtype=np.float64)
    den = np.asarray(den, dtype=np.float64)
    out = np.full(np.broadcast(num, den).shape, np.nan)
    np.divide(num, den, out=out, where=den > 0)
    return out


def exact(counts: NDArray) -> NDArray:
    """A counts array as int64, unless its counts are weighted (floats: a proxy attribute's posterior sums)."""
    c = np.asarray(counts)
    return c if c.dtype == np.int64 or np.issubdtype(c.dtype, np.floating) else c.astype(np.int64)


def rate_counts(counts: NDArray, rate: str) -> tuple[NDArray, NDArray]:
    """(successes, trials) of one named rate for every row of a counts array.

    Weighted counts (a proxy attribute's: each row adds its posterior p of the group) give the weighted rate
    ``sum p y / sum p``, and the binomial variance r(1 - r) / sum p of the intervals built on them is, by the delta
    method, the rate's sampling variance sum p^2 (y - r)^2 / (sum p)^2 plus the proxy's, from each row's unknown
    membership, sum p (1 - p) (y - r)^2 / (sum p)^2 (docs/auditor/proxy.md).
    """
    c = exact(counts)
    numerator, denominator = RATES[rate]
    return sum(c[..., i] for i in numerator), sum(c[..., i] for i in denominator)  # type: ignore[return-value]


def wilson_interval(
    successes: NDArray, trials: NDArray, z: float | FloatArray = Z_95, continuity: bool | NDArray = False
) -> tuple[FloatArray, FloatArray]:
    """Wilson score interval for a binomial proportion; NaN bounds where trials is 0.

    ``continuity`` (for all or per element): with Yates' continuity correction (Newcombe 1998, method 4), whose
    coverage reaches its level at (nearly) every rate and size, not just on average: what a Bonferroni union of
    intervals needs.
    """
    _, lower, upper = _wilson(successes, trials, z, continuity)
    return lower, upper


def _wilson(successes: NDArray, trials: NDArray, z: float | FloatArray,
            continuity: bool | NDArray) -> tuple[FloatArray, FloatArray, FloatArray]:  # fmt: skip
    """(rate, lower, upper) of :func:`wilson_interval`, ``continuity`` for all or per element (each element's
    bounds are those it has alone: both formulas are elementwise)."""
    k = np.asarray(successes, dtype=np.float64)
    n = np.asarray(trials, dtype=np.float64)
    p = ratio(k, n)
    z2 = z * z
    some, every = (continuity, continuity) if isinstance(continuity, bool) else \
        (bool(continuity.any()), bool(continuity.size) and bool(continuity.all()))  # fmt: skip
    with np.errstate(divide="ignore", invalid="ignore"):
        if some:
            q, denom = 1.0 - p, 2.0 * (n + z2)
            lower = (2 * n * p + z2 - 1 - z * np.sqrt(np.maximum(z2 - 2 - 1 / n + 4 * p * (n * q + 1), 0))) / denom
            upper = (2 * n * p + z2 + 1 + z * np.sqrt(np.maximum(z2 + 2 - 1 / n + 4 * p * (n * q - 1), 0))) / denom
            lower, upper = np.where(k == 0, 0.0, lower), np.where(k == n, 1.0, upper)
        if not every:
            denom = 1.0 + z2 / n
            centre = (p + z2 / (2.0 * n)) / denom
            half = z * np.sqrt(p * (1.0 - p) / n + z2 / (4.0 * n * n)) / denom
            if some:
                lower, upper = np.where(continuity, lower, centre - half), np.where(continuity, upper, centre + half)
            else:
                lower, upper = centre - half, centre + half
    nan = np.isnan(p)
    return p, np.where(nan, np.nan, np.clip(lower, 0.0, 1.0)), np.where(nan, np.nan, np.clip(upper, 0.0, 1.0))


def t_interval(
    means: NDArray, std: NDArray, n: NDArray, confidence: float = 0.95
) -> tuple[FloatArray, FloatArray]:
    """Student t interval for a mean from its sample standard deviation (ddof=1); NaN bounds where n < 2.

    scipy provides the t quantile; it is imported here so the daemon, which never calls this, does not need it.
    """
    try:
        from scipy.stats import t as student_t
    except ImportError as exc:
        raise ImportError("the t interval needs scipy: pip install 'fairness-exporter[reports]'") from exc

    m = np.asarray(means, dtype=np.float64)
    s = np.asarray(std, dtype=np.float64)
    n = np.asarray(n, dtype=np.float64)
    ok = n >= 2
    dof = np.where(ok, n - 1.0, 1.0)
    half = np.where(ok, student_t.ppf(0.5 + confidence / 2.0, dof) * s / np.sqrt(np.where(ok, n, 1.0)), np.nan)
    return m - half, m + half


def newcombe_interval(
    k1: NDArray, n1: NDArray, k2: NDArray, n2: NDArray, z: float | FloatArray = Z_95, continuity: bool = False
) -> tuple[FloatArray, FloatArray]:
    """Newcombe's hybrid score interval for p1 - p2 from two Wilson intervals: method 10, or with ``continuity``
    method 11 (continuity-corrected Wilson intervals)."""
    _, lower, upper = newcombe(k1, n1, k2, n2, z, continuity)
    return lower, upper


def newcombe(k1: NDArray, n1: NDArray, k2: NDArray, n2: NDArray, z: float | FloatArray,
             continuity: bool | NDArray) -> tuple[FloatArray, FloatArray, FloatArray]:  # fmt: skip
    """``p1 - p2`` and :func:`newcombe_interval` of it, ``continuity`` for all pairs or per pair; both groups'
    Wilson intervals in one call (numpy's cost per call dominates on a handful of pairs)."""
    size = np.size(k1)
    both = np.concatenate([k1, k2]), np.concatenate([n1, n2])
    tiled = (z if np.ndim(z) == 0 else np.concatenate([z, z]),
             continuity if isinstance(continuity, bool) else np.concatenate([continuity, continuity]))
    p, lower, upper = _wilson(*both, *tiled)
    p1, p2, l1, l2, u1, u2 = p[:size], p[size:], lower[:size], lower[size:], upper[:size], upper[size:]
    d = p1 - p2
    return d, *mover(d, p1, l1, u1, p2, l2, u2)


def mover(d: FloatArray, p1: FloatArray, l1: FloatArray, u1: FloatArray, p2: FloatArray, l2: FloatArray,
          u2: FloatArray) -> tuple[FloatArray, FloatArray]:  # fmt: skip
    """The interval of ``d = p1 - p2``, two independent estimates, from each one's interval ``[l, u]`` (Newcombe's
    hybrid; Zou and Donner's MOVER): each side the root of the sum of squares of the two estimates' distances to
    their bounds in that direction, so an interval that is asymmetric near 0 or 1 stays so in the difference."""
    return d - np.sqrt((p1 - l1) ** 2 + (u2 - p2) ** 2), d + np.sqrt((u1 - p1) ** 2 + (p2 - l2) ** 2)


def abs_interval(lower: FloatArray, upper: FloatArray) -> tuple[FloatArray, FloatArray]:
    """Map an interval for d onto the interval for |d| (0 is inside when the interval straddles it)."""
    lo_abs, hi_abs = np.abs(lower), np.abs(upper)
    straddles = (lower <= 0.0) & (upper >= 0.0)
    return np.where(straddles, 0.0, np.minimum(lo_abs, hi_abs)), np.maximum(lo_abs, hi_abs)


class _RatioTerms(NamedTuple):
    """What the ratio's score statistic needs of each pair's counts, computed once per interval."""

    k1: FloatArray
    n1: FloatArray
    k0: FloatArray
    n0: FloatArray
    n: FloatArray
    k: FloatArray
    rate1: FloatArray
    rate0: FloatArray
    correction: FloatArray

    @classmethod
    def of(cls, k1: FloatArray, n1: FloatArray, k0: FloatArray, n0: FloatArray) -> _RatioTerms:
        n = n1 + n0
        return cls(k1, n1, k0, n0, n, k1 + k0, k1 / n1, k0 / n0, n / (n - 1.0))

    def score_parts(self, theta: FloatArray) -> tuple[FloatArray, FloatArray]:
        """Miettinen and Nurminen's score statistic of p1 / p0 = theta as (numerator, variance): the rates' MLE
        under theta, the variance with their n / (n - 1) correction; numerator / sqrt(variance) decreases in
        theta."""
        a = self.n * theta
        b = -(self.n1 * theta + self.k1 + self.n0 + self.k0 * theta)
        p0 = (-b - np.sqrt(np.maximum(b * b - 4.0 * a * self.k, 0.0))) / (2.0 * a)
        p1 = p0 * theta
        var = (p1 * (1.0 - p1) / self.n1 + theta * theta * p0 * (1.0 - p0) / self.n0) * self.correction
        return self.rate1 - theta * self.rate0, var

    def excess(self, log_theta: FloatArray, target: FloatArray) -> FloatArray:
        """Where the score at ``exp(log_theta)`` stands against ``target``, as ``numerator - target * sqrt(variance)``:
        the score's sign against the target, smooth (no division; a variance of 0 reads the numerator's sign), and
        decreasing through 0 at the bound."""
        diff, var = self.score_parts(np.exp(log_theta))
        return diff - target * np.sqrt(np.maximum(var, 0.0))

    def take(self, rows: NDArray) -> _RatioTerms:
        return _RatioTerms(*(v[rows] for v in self))


def _ratio_score(theta: FloatArray, k1: FloatArray, n1: FloatArray, k0: FloatArray, n0: FloatArray) -> FloatArray:
    """The score statistic itself (a variance of 0 read as +-inf)."""
    diff, var = _RatioTerms.of(k1, n1, k0, n0).score_parts(theta)
    return np.where(var > 0, diff / np.sqrt(np.maximum(var, 1e-300)), np.sign(diff) * np.inf)


_RATIO_RANGE = (1e-9, 1e9)
"""Where the score interval's bounds are looked for: a bound beyond it is 0 (below) or infinite (above)."""
_HALVINGS = 10
"""Halvings of each bracket before the false-position steps: a 1,024th of it, where the statistic is close enough to
straight for them (fewer cost more steps on the pairs whose rates are near 0 or 1)."""
_TOLERANCE = 1e-13
"""How close to its root a bound is taken as found, on the log scale (relative beyond 1)."""
_MOST_STEPS = 100
"""False-position steps at most (5-7 in practice, 10 for the flattest statistics): no input can hold the loop."""


def ratio_interval(
    k_num: NDArray, n_num: NDArray, k_den: NDArray, n_den: NDArray, z: float | FloatArray = Z_95,
    most: float = np.inf,
) -> tuple[FloatArray, FloatArray]:
    """Score interval for a ratio of two proportions (Miettinen and Nurminen, 1985; statsmodels'
    ``confint_proportions_2indep(compare="ratio", method="score")``): the ratios whose score statistic lies within
    ``z``, found for every pair and both bounds at once (:func:`_roots`). Unlike Katz' log interval it does not take a
    rate of k = n as exactly known, nor a small group's rate beside a large one's as symmetric on the log scale
    (review 17: at a true ratio of 0.8, 30 rows against 1,000, Katz failed 4.8% of outcomes for a one-sided 2.5%).
    The lower bound is 0 where ``k_num`` is 0; NaN where a group has no trial or ``k_den`` is 0. An upper bound above
    ``most`` is ``most``, never searched for (the counterfactual gate's ratio; the metrics search it all and fold)."""
    k1, n1, k0, n0 = np.broadcast_arrays(*(np.asarray(a, dtype=np.float64) for a in (k_num, n_num, k_den, n_den)))
    z = np.broadcast_to(np.asarray(z, dtype=np.float64), k1.shape)
    usable = (n1 > 0) & (n0 > 0) & (k0 > 0)
    k1, n1, k0, n0 = (np.where(usable, x, 1.0) for x in (k1, n1, k0, n0))
    size = k1.size
    point = np.log(np.maximum(k1 / n1 / (k0 / n0), _RATIO_RANGE[0])).ravel()
    # the lower bound (score z) below the point and the upper (score -z) above it, searched together
    terms = _RatioTerms.of(*(np.concatenate([x.ravel(), x.ravel()]) for x in (k1, n1, k0, n0)))
    target = np.concatenate([z.ravel(), -z.ravel()])
    ceiling = np.log(min(most, _RATIO_RANGE[1]))
    far = np.concatenate([np.full(size, np.log(_RATIO_RANGE[0])), np.full(size, ceiling)])
    lo, hi = np.concatenate([far[:size], point]), np.concatenate([point, far[size:]])
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        beyond = terms.excess(far, target)  # the score's excess over the target at the far end: a bound in between
        searched = np.flatnonzero(np.concatenate([beyond[:size] > 0, beyond[size:] < 0]) & (lo < hi))
        root = far.copy()
        root[searched] = _roots(terms.take(searched), target[searched], lo[searched], hi[searched])
    bound = np.exp(root)
    lower = np.where(bound[:size] <= _RATIO_RANGE[0] * 1.0000001, 0.0, bound[:size]).reshape(k1.shape)
    upper = np.where(bound[size:] >= _RATIO_RANGE[1] * 0.9999999, np.inf, bound[size:])
    upper = np.minimum(upper, most).reshape(k1.shape)
    return np.where(usable, lower, np.nan), np.where(usable, upper, np.nan)


def _roots(terms: _RatioTerms, target: FloatArray, lo: FloatArray, hi: FloatArray) -> FloatArray:
    """The log ratio in each bracket ``[lo, hi]`` where the score equals ``target`` (its excess falls through 0 once
    there): :data:`_HALVINGS` halvings, then Illinois' false position (Dowell and Jarratt, 1971) until the step
    from an end is within :data:`_TOLERANCE`, the unfinished brackets alone at each step. Against 60 halvings
    (review 17's bisection): 5-7 evaluations after the halvings instead of 50, the same bounds to 2e-12 (4e-11 where
    both rates are 1, where the statistic is flattest)."""
    start_lo, start_hi = lo.copy(), hi.copy()
    for _ in range(_HALVINGS):
        mid = (lo + hi) / 2.0
        above = terms.excess(mid, target) > 0
        lo, hi = np.where(above, mid, lo), np.where(above, hi, mid)
    root = (lo + hi) / 2.0
    f_lo, f_hi = terms.excess(lo, target), terms.excess(hi, target)
    # an end the halvings never moved is the point or the far end: the point's variance may be 0, its excess no
    # evidence of where the root is
    ok_lo, ok_hi = lo != start_lo, hi != start_hi
    left = np.arange(len(lo))
    side = np.zeros(len(lo))
    for _ in range(_MOST_STEPS):
        if not left.size:
            break
        x = lo + (hi - lo) * (f_lo / (f_lo - f_hi))
        x = np.where((x >= lo) & (x <= hi), x, (lo + hi) / 2.0)
        # the step from an end to x is that end's excess over the secant's slope: the root is within it of x
        tolerance = _TOLERANCE * np.maximum(1.0, np.abs(x))
        near_lo, near_hi = x - lo <= tolerance, hi - x <= tolerance
        blind = (near_lo & ~ok_lo) | (near_hi & ~ok_hi)
        x = np.where(blind, (lo + hi) / 2.0, x)
        f_x = terms.excess(x, target)
        above = f_x > 0
        # Illinois: an end kept twice in a row has its excess halved, so that neither end stalls
        f_lo = np.where(above, f_x, np.where(side > 0, f_lo / 2.0, f_lo))
        f_hi = np.where(above, np.where(side < 0, f_hi / 2.0, f_hi), f_x)
        lo, hi = np.where(above, x, lo), np.where(above, hi, x)
        ok_lo, ok_hi, side = ok_lo | above, ok_hi | ~above, np.where(above, -1.0, 1.0)
        done = ((near_lo | near_hi) & ~blind) | (f_x == 0) | (hi - lo <= tolerance)
        if done.any():
            root[left[done]] = x[done]
            keep = ~done
            left, lo, hi, f_lo, f_hi, ok_lo, ok_hi, side, target = (
                a[keep] for a in (left, lo, hi, f_lo, f_hi, ok_lo, ok_hi, side, target))  # fmt: skip
            terms = terms.take(keep)
    root[left] = (lo + hi) / 2.0  # none in any case met (Illinois' steps converge): a bound within its bracket
    return root


@dataclass(frozen=True)
class GroupStats:
    """Per-group rates with their Wilson intervals; arrays aligned with the rows of the counts."""

    samples: IntArray
    labelled: IntArray
    selection_rate: FloatArray
    selection_rate_ci: tuple[FloatArray, FloatArray]
    true_positive_rate: FloatArray
    true_positive_rate_ci: tuple[FloatArray, FloatArray]
    false_positive_rate: FloatArray
    false_positive_rate_ci: tuple[FloatArray, FloatArray]
    accuracy: FloatArray
    precision: FloatArray
    false_negative_rate: FloatArray
    true_negative_rate: FloatArray
    negative_predictive_value: FloatArray
    false_discovery_rate: FloatArray
    false_omission_rate: FloatArray


_WITH_INTERVAL: Final = ("selection_rate", "true_positive_rate", "false_positive_rate")
"""The per-group rates exported with their interval (the others are only compared, each comparison with its own)."""


def group_stats(counts: NDArray, rates: dict[str, tuple[NDArray, NDArray]] | None = None) -> GroupStats:
    """Every rate of :data:`RATES` for every group (with a Wilson interval for the exported ones), NaN where
    undefined. ``rates``: the rates' (successes, trials) already reduced from these counts; the missing ones are
    added to it (:func:`exporter.core.metric_table.compare` shares them)."""
    rates = {} if rates is None else rates
    for rate in RATES:
        if rate not in rates:
            rates[rate] = rate_counts(counts, rate)
    c = exact(counts)
    # one call per step for all rates (numpy's cost per call dominates on a handful of groups); row by row the
    # same numbers as each rate alone
    k, n = (np.stack([rates[rate][i] for rate in RATES]) for i in (0, 1))
    values: dict[str, object] = dict(zip(RATES, ratio(k, n), strict=True))
    shown = [list(RATES).index(rate) for rate in _WITH_INTERVAL]
    lower, upper = wilson_interval(k[shown], n[shown])
    values.update({f"{rate}_ci": (lower[i], upper[i]) for i, rate in enumerate(_WITH_INTERVAL)})
    return GroupStats(samples=c[..., PRED_POS] + c[..., PRED_NEG], labelled=c[..., [TP, FP, TN, FN]].sum(axis=-1),
                      **values)  # type: ignore[arg-type]


_OUTCOME_OF: Final = np.array([TN, FN, FP, TP, -1], dtype=np.int64)
"""The outcome column of ``2 * prediction + label`` for a 0/1 prediction and label; the last entry for the rest."""


def outcome_columns(predictions: NDArray, labels: NDArray) -> tuple[IntArray, IntArray]:
    """Per row: its predicted-class column (PRED_POS/PRED_NEG), and its TP/FP/TN/FN column (-1 when unlabelled,
    or when the prediction or label is not 0/1)."""
    predictions, labels = np.asarray(predictions), np.asarray(labels)
    predicted = np.where(predictions == 1, PRED_POS, PRED_NEG)
    valid = ((predictions == 0) | (predictions == 1)) & ((labels == 0) | (labels == 1))
    outcome = _OUTCOME_OF[np.where(valid, 2 * predictions + labels, 4)]
    return predicted, outcome


def counts_from_arrays(
    codes: NDArray, n_groups: int, y_pred: NDArray, y_true: NDArray | None = None
) -> IntArray:
    """Reduce per-row group codes (``-1`` = excluded), predictions and optional labels (``-1`` = unlabelled).

    >>> counts_from_arrays(np.array([0, 0, 1]), 2, np.array([1, 0, 1]), np.array([1, 1, -1])).tolist()
    [[1, 1, 1, 0, 0, 1], [1, 0, 0, 0, 0, 0]]
    """
    codes = np.asarray(codes, dtype=np.int64)
    y_pred = np.asarray(y_pred, dtype=np.int64)
    y_true = np.full_like(y_pred, -1) if y_true is None else np.asarray(y_true, dtype=np.int64)
    keep = codes >= 0
    codes, y_pred, y_true = codes[keep], y_pred[keep], y_true[keep]
    predicted, outcome = outcome_columns(y_pred, y_true)
    labelled = outcome >= 0
    out = np.bincount(codes * N_COUNTS + predicted, minlength=n_groups * N_COUNTS)
    out += np.bincount(codes[labelled] * N_COUNTS + outcome[labelled], minlength=n_groups * N_COUNTS)
    return out.reshape(n_groups, N_COUNTS).astype(np.int64)
