"""Oracle coverage (from review 17): the intervals against statsmodels, DeLong's variance against the raw placements,
the LL144 scoring-rate table against pandas (model_id filter, unknown values, an intersection, small categories)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import yaml
from statsmodels.stats.proportion import confint_proportions_2indep, proportion_confint

from exporter.core import scores
from exporter.core.fairness import group_stats
from exporter.core.metric_table import METRICS
from exporter.gate.fairness.audit import run_audit


def test_newcombe_wilson_and_the_ratio_score_interval_are_statsmodels_own() -> None:
    rng = np.random.default_rng(1)
    for _ in range(200):
        na, nb = rng.integers(5, 500, 2)
        ka, kb = rng.integers(0, na + 1), rng.integers(0, nb + 1)
        counts = np.array([[ka, na - ka, 0, 0, 0, 0], [kb, nb - kb, 0, 0, 0, 0]])
        v = METRICS["demographic_parity_difference"].compute(counts, np.array([0]), np.array([1]))
        lo, hi = confint_proportions_2indep(ka, na, kb, nb, method="newcomb", compare="diff")
        folded = (0.0, max(-lo, hi)) if lo <= 0 <= hi else (min(abs(lo), abs(hi)), max(abs(lo), abs(hi)))
        np.testing.assert_allclose([v.lower[0], v.upper[0]], folded, atol=1e-12)
        g = group_stats(counts)
        np.testing.assert_allclose([g.selection_rate_ci[0][0], g.selection_rate_ci[1][0]],
                                   proportion_confint(ka, na, method="wilson"), atol=1e-12)  # fmt: skip
        if 0 < ka < na and 0 < kb < nb:  # away from the boundaries, where statsmodels' root finder is reliable
            v = METRICS["disparate_impact_ratio"].compute(counts, np.array([0]), np.array([1]))
            args = (ka, na, kb, nb) if ka / na <= kb / nb else (kb, nb, ka, na)  # the lower rate first
            lo, hi = confint_proportions_2indep(*args, method="score", compare="ratio")
            # the min/max of every ratio in the score interval: beyond 1 the higher group's rate may be the lower
            folded = [min(max(lo, 0), 1 / hi), 1.0] if hi >= 1 else [max(lo, 0), hi]
            np.testing.assert_allclose([v.lower[0], v.upper[0]], folded, rtol=1e-7)


def test_delong_variance_from_the_histogram_is_the_placements_own() -> None:
    rng = np.random.default_rng(2)
    for _ in range(10):
        n = int(rng.integers(20, 300))
        y = (rng.random(n) < 0.4).astype(int)
        s = np.minimum(rng.integers(0, 10, n) + y * rng.integers(0, 3, n), 9)
        pos, neg = s[y == 1], s[y == 0]
        v10 = np.array([((neg < x).sum() + 0.5 * (neg == x).sum()) / len(neg) for x in pos])
        v01 = np.array([((pos > x).sum() + 0.5 * (pos == x).sum()) / len(pos) for x in neg])
        h = np.stack([np.bincount(neg, minlength=10), np.bincount(pos, minlength=10)], -1)[None]
        value, variance, _ = scores.auc(h)
        assert abs(value[0] - v10.mean()) < 1e-12
        assert abs(variance[0] - (v10.var(ddof=1) / len(pos) + v01.var(ddof=1) / len(neg))) < 1e-12


def test_ll144_scoring_rates_are_pandas_own(tmp_path) -> None:
    rng = np.random.default_rng(9)
    n = 2001
    s = np.round(rng.random(n), 1)  # ties at the median
    frame = pd.DataFrame({"sex": rng.choice(["M", "F", None], n, p=[0.55, 0.4, 0.05]),
                          "race": rng.choice(["W", "B", "A", "N"], n, p=[0.6, 0.3, 0.085, 0.015]),
                          "score": s, "prediction": (s > 0.5).astype(int),
                          "model_id": rng.choice(["m", "x"], n, p=[0.8, 0.2])})  # fmt: skip
    config = {"model_id": "m", "min_samples": 1, "columns": {"score": "score"},
              "protected_attributes": [{"name": "sex", "groups": ["M", "F"]},
                                       {"name": "race", "groups": ["W", "B", "A", "N"]}],
              "intersections": [["sex", "race"]],
              "metrics": [{"name": "disparate_impact_ratio", "threshold": 0.8, "severity_on_fail": "warning"}]}
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(config))
    frame.to_csv(tmp_path / "d.csv", index=False)
    table = run_audit(tmp_path / "c.yaml", tmp_path / "d.csv")["impact_ratios"]
    own = frame[frame.model_id == "m"]
    median = own.score.median()
    assert table["score_median"] == median
    own = own.assign(above=(own.score > median).astype(int))
    for name, cols in (("sex", ["sex"]), ("race", ["race"]), ("sex_x_race", ["sex", "race"])):
        block = table["attributes"][name]
        known = own.dropna(subset=cols)
        key = known[cols].astype(str).agg(":".join, axis=1)
        rates, sizes = known.groupby(key).above.mean(), known.groupby(key).size()
        small = sizes < 0.02 * len(own)
        best = rates[~small].max()
        assert block["unknown_rows"] == len(own) - len(known)
        for row in block["categories"]:
            k = row["category"]
            assert row["samples"] == sizes[k] and row["small_category"] == bool(small[k])
            assert abs(row["rate"] - rates[k]) < 1e-12
            if small[k]:  # left out of the impact ratios, as the DCWP rules allow: rate / best may exceed 1
                assert row["impact_ratio"] is None
            else:
                assert abs(row["impact_ratio"] - rates[k] / best) < 1e-12
