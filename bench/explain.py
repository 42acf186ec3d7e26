"""Segment explanations at fleet size: memory and evaluation cost with 3 segment columns of 20 values each at 100
models (the sizes issue 40 names).

Each model has two protected attributes (gender: 3 groups, age_group: 4 groups; every pair compared) and the
difference metrics demographic parity, equal opportunity and equalised odds (4 rates explained per pair). Its
counts per (subgroup x segment value) are an int64 array ``(buckets, subgroup rows, 3 x 21 values, 6 counts)``: the
7 groups plus each attribute's unknown row, the 20 kept values plus ``other`` per column. An explanation compares a
24h window with the 24h before it, so the ring holds 48h of buckets.

* Memory: the bytes of that array at 100 models, for 1-minute buckets (the fairness windows' own width: computed,
  not allocated) and for 1-hour buckets (allocated and filled).
* Evaluation: per model, the two windows' sums over the ring, then :func:`exporter.core.explain.explanations` for
  every attribute, metric, rate and pair; timed over the 100 models, best of a few repetitions. Each
  explanation's terms are checked to add up to its change.
"""

from __future__ import annotations

import time

import numpy as np

from bench.report import Section, fmt, standalone, table
from exporter.core.attributes import Attribute
from exporter.core.explain import explanations
from exporter.core.fairness import N_COUNTS

MODELS = 100
COLUMNS = ("channel", "region", "product")
VALUES = 20
WIDTH = VALUES + 1  # the kept values, then "other"
ATTRIBUTES = (Attribute("gender", ("gender",), ("male", "female", "non_binary"), ((0, 1), (0, 2), (1, 2))),
              Attribute("age_group", ("age_group",), ("18_29", "30_44", "45_59", "60_plus"),
                        ((0, 1), (0, 2), (0, 3), (1, 2), (1, 3), (2, 3))))  # fmt: skip
METRICS = ("demographic_parity_difference", "equal_opportunity_difference", "equalised_odds_difference")
ROWS = sum(len(a.groups) + 1 for a in ATTRIBUTES)
TARGET_SECONDS = 1.0
"""Explaining every comparison of 100 models within one second: well inside a 15 s evaluation interval."""


def state_bytes(bucket_seconds: int, models: int = MODELS) -> int:
    """Bytes of the segment counts of ``models`` models over 48h of buckets."""
    buckets = 2 * 86_400 // bucket_seconds
    return models * buckets * ROWS * len(COLUMNS) * WIDTH * N_COUNTS * 8


def filled(rng: np.random.Generator, buckets: int) -> np.ndarray:
    """One model's ring of hourly buckets, each (row, value) cell holding a few predictions of every outcome; every
    column counts the same rows (its values a shuffle of the first column's)."""
    first = rng.integers(0, 20, size=(buckets, ROWS, WIDTH, N_COUNTS), dtype=np.int64)
    return np.concatenate([first, *(first[:, :, rng.permutation(WIDTH)] for _ in COLUMNS[1:])], axis=2)


def explain_model(ring: np.ndarray, half: int) -> list[dict]:
    """The current window (the ring's last half) against the one before it, every attribute and column."""
    baseline, current = ring[:half].sum(axis=0), ring[half:].sum(axis=0)
    out, start = [], 0
    for attribute in ATTRIBUTES:
        n = len(attribute.groups)
        parts = {column: ([f"v{i}" for i in range(VALUES)] + ["other"],
                          baseline[start:start + n, k * WIDTH:(k + 1) * WIDTH],
                          current[start:start + n, k * WIDTH:(k + 1) * WIDTH])
                 for k, column in enumerate(COLUMNS)}  # fmt: skip
        out.extend(explanations(attribute, METRICS, parts))
        start += n + 1
    return out


def run(quick: bool = False) -> Section:
    models = 10 if quick else MODELS
    rng = np.random.default_rng(0)
    buckets = 48  # hourly buckets of two 24h windows
    rings = [filled(rng, buckets) for _ in range(models)]
    allocated = sum(r.nbytes for r in rings)
    best = float("inf")
    count = 0
    for _ in range(2 if quick else 3):
        start = time.perf_counter()
        found = [explain_model(r, buckets // 2) for r in rings]
        best = min(best, time.perf_counter() - start)
        count = sum(len(f) for f in found)
    worst = max(abs(sum(s["mix"] + s["rate"] for s in e["segments"] if s["column"] == column) - e["change"])
                for f in found for e in f for column in COLUMNS)  # fmt: skip
    per_100 = best * MODELS / models
    section = Section("Segment explanations: 3 segment columns of 20 values at 100 models")
    section.add(__doc__.split("\n\n", 1)[1].strip())
    section.add(table(["", "value"], [
        ("models measured", f"{models}" + ("" if models == MODELS else f" (scaled to {MODELS})")),
        ("explanations per evaluation", f"{count:,} ({count // models} per model)"),
        ("evaluation (window sums + explanations), all models", f"{fmt(best * 1e3)} ms"),
        ("evaluation scaled to 100 models", f"{fmt(per_100 * 1e3)} ms"),
        ("largest |sum of a column's terms - change|", f"{worst:.1e}"),
        ("state allocated here (hourly buckets, 48h)", f"{allocated / 1e6:,.1f} MB"),
        ("state at 100 models, hourly buckets", f"{state_bytes(3600) / 1e6:,.1f} MB"),
        ("state at 100 models, 1-minute buckets (computed)", f"{state_bytes(60) / 1e9:,.2f} GB"),
    ]))  # fmt: skip
    section.target(f"explaining every comparison of {MODELS} models <= {TARGET_SECONDS:g} s", f"{fmt(per_100)} s",
                   per_100 <= TARGET_SECONDS)  # fmt: skip
    return section


if __name__ == "__main__":
    standalone(run)
