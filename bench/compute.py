"""Computation: the daemon's counts-based Computer.compute against recomputing from the raw rows of the window.

Three protected attributes (3, 4 and 5 groups), every pair compared, one 24h window of 1-minute buckets holding
10^5, 10^6 and 10^7 events. The daemon's store is filled with vectorised ``WindowStore.add`` calls (no JSON),
then timed: ``Computer.compute`` (window sums, rates, gaps and their intervals for every pair) against

* a pandas groupby over the raw window rows: selection rate, TPR and FPR per group, then the pairwise gaps
  (point values only, no intervals: a lower bound on what pandas would have to do);
* Fairlearn's ``MetricFrame`` doing the same (selection rate over all rows; TPR and FPR over labelled rows).
  It is slow, so it is measured at 10^5 and 10^6 and extrapolated linearly to 10^7.

Every recompute's numbers are checked against the daemon's.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import numpy as np
import pandas as pd
from prometheus_client import CollectorRegistry

from bench.report import Section, fmt, package_version, standalone, table
from exporter.config import Config, parse_config
from exporter.core.attributes import Attribute
from exporter.health.counters import Health
from exporter.serve.snapshot import Computer, FleetSnapshot
from exporter.stream.state.fleet import Fleet
from exporter.stream.state.window import WindowStore

ATTRIBUTES = {"gender": ["male", "female", "non_binary"], "age_group": ["18_29", "30_44", "45_59", "60_plus"],
              "ethnicity": ["a", "b", "c", "d", "e"]}  # fmt: skip
BUCKET = 60
WINDOW = 86_400
NOW = 1_800_000_000.0 - 1.0  # the last second of a bucket, so the window holds exactly its 1440 buckets
FILL_CHUNK = 1_000_000
TARGET_SPEEDUP = 10_000
TARGET_STATE_BYTES = 50_000_000
Results = dict[str, dict[str, np.ndarray]]
"""Per attribute: selection_rate, tpr, fpr per group; dpd, eod, di per pair."""


def config() -> Config:
    return parse_config({
        "model_id": "bench",
        "protected_attributes": [{"name": name, "groups": groups, "pairwise_comparisons": "all"}
                                 for name, groups in ATTRIBUTES.items()],
        "windows": ["24h"],
        "bucket": "1m",
        "min_samples": 30,
        "listen": {"address": "127.0.0.1", "port": 0},
    }, "bench-compute")  # fmt: skip


def window_rows(n: int, seed: int = 7) -> dict[str, np.ndarray]:
    """n events spread over the 24h window ending at NOW: group codes, a prediction, a label on 30% of them."""
    rng = np.random.default_rng(seed)
    first_bucket = int(NOW // BUCKET) - WINDOW // BUCKET + 1
    rows: dict[str, np.ndarray] = {"ts": rng.uniform(first_bucket * BUCKET, NOW, n)}
    for name, groups in ATTRIBUTES.items():
        weights = np.arange(len(groups), 0, -1, dtype=float)  # unequal group sizes
        rows[name] = rng.choice(len(groups), size=n, p=weights / weights.sum())
    rate = 0.25 + 0.03 * rows["gender"] + 0.02 * rows["ethnicity"]  # unequal selection rates
    rows["prediction"] = (rng.random(n) < rate).astype(np.int64)
    truth = np.where(rng.random(n) < 0.8, rows["prediction"], 1 - rows["prediction"])
    rows["label"] = np.where(rng.random(n) < 0.3, truth, -1)
    return rows


def filled_fleet(cfg: Config, rows: dict[str, np.ndarray]) -> Fleet:
    """The daemon's stream state with the rows counted in its one model's window."""
    fleet = Fleet(cfg)
    (store,) = (m.store for m in fleet.models.values())
    for start in range(0, len(rows["ts"]), FILL_CHUNK):
        part = slice(start, start + FILL_CHUNK)
        late = store.add(rows["ts"][part], {name: rows[name][part] for name in ATTRIBUTES}, rows["prediction"][part],
                         rows["label"][part], NOW)  # fmt: skip
        if late:
            raise RuntimeError(f"{late} events fell outside the window while filling the store")
    return fleet


def frame(rows: dict[str, np.ndarray]) -> pd.DataFrame:
    """The raw window as pandas would hold it at its leanest: categorical attributes, int8 outcomes."""
    columns: dict[str, Any] = {"ts": rows["ts"], "prediction": rows["prediction"].astype(np.int8),
                               "label": rows["label"].astype(np.int8)}  # fmt: skip
    for name, groups in ATTRIBUTES.items():
        columns[name] = pd.Categorical.from_codes(rows[name], groups)
    return pd.DataFrame(columns)


def _pairwise(attribute: Attribute, sr: np.ndarray, tpr: np.ndarray, fpr: np.ndarray) -> dict[str, np.ndarray]:
    a, b = np.array(attribute.pairs).T
    with np.errstate(divide="ignore", invalid="ignore"):
        di = np.minimum(sr[a], sr[b]) / np.maximum(sr[a], sr[b])
    return {"selection_rate": sr, "tpr": tpr, "fpr": fpr, "dpd": np.abs(sr[a] - sr[b]),
            "eod": np.maximum(np.abs(tpr[a] - tpr[b]), np.abs(fpr[a] - fpr[b])), "di": di}  # fmt: skip


def pandas_recompute(cfg: Config, df: pd.DataFrame) -> Results:
    """What a raw-row system does at every evaluation: select the window, group, derive the gaps."""
    window = df[df["ts"] >= NOW + 1 - WINDOW]
    labelled = window[window["label"] >= 0]
    positives, negatives = labelled[labelled["label"] == 1], labelled[labelled["label"] == 0]
    out = {}
    for attribute in cfg.model().attributes:
        groups = list(attribute.groups)

        def rate(rows: pd.DataFrame, groups: list[str] = groups, name: str = attribute.name) -> np.ndarray:
            return rows.groupby(name, observed=False)["prediction"].mean().reindex(groups).to_numpy(dtype=float)

        out[attribute.name] = _pairwise(attribute, rate(window), rate(positives), rate(negatives))
    return out


def fairlearn_recompute(cfg: Config, df: pd.DataFrame) -> Results:
    """The same with Fairlearn's MetricFrame (selection rate over all rows, TPR/FPR over labelled rows)."""
    from fairlearn.metrics import MetricFrame, false_positive_rate, selection_rate, true_positive_rate

    window = df[df["ts"] >= NOW + 1 - WINDOW]
    labelled = window[window["label"] >= 0]
    out = {}
    for attribute in cfg.model().attributes:
        groups = list(attribute.groups)
        selected = MetricFrame(metrics=selection_rate, y_true=window["prediction"], y_pred=window["prediction"],
                               sensitive_features=window[attribute.name]).by_group  # fmt: skip
        errors = MetricFrame(metrics={"tpr": true_positive_rate, "fpr": false_positive_rate},
                             y_true=labelled["label"], y_pred=labelled["prediction"],
                             sensitive_features=labelled[attribute.name]).by_group  # fmt: skip
        out[attribute.name] = _pairwise(attribute, selected.reindex(groups).to_numpy(dtype=float),
                                        errors["tpr"].reindex(groups).to_numpy(dtype=float),
                                        errors["fpr"].reindex(groups).to_numpy(dtype=float))  # fmt: skip
    return out


def daemon_results(snapshot: FleetSnapshot) -> Results:
    out = {}
    for _, ev in snapshot.models[0].evaluations:
        g, c = ev.groups, ev.comparisons.metrics
        out[ev.attribute.name] = {"selection_rate": g.selection_rate, "tpr": g.true_positive_rate,
                                  "fpr": g.false_positive_rate, "dpd": c["demographic_parity_difference"].value,
                                  "eod": c["equalised_odds_difference"].value,
                                  "di": c["disparate_impact_ratio"].value}  # fmt: skip
    return out


def max_difference(a: Results, b: Results) -> float:
    return max(float(np.max(np.abs(a[name][key] - b[name][key]))) for name in a for key in a[name])


def best_time(fn: Callable[[], Any], reps: int) -> tuple[Any, float]:
    """The result and the shortest wall seconds of ``reps`` calls (noise only ever adds time)."""
    times = []
    result = None
    for _ in range(reps):
        start = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - start)
    return result, min(times)


def run(quick: bool = False) -> Section:
    sizes = [10**5, 10**6] if quick else [10**5, 10**6, 10**7]
    fairlearn_sizes = [10**5] if quick else [10**5, 10**6]
    cfg = config()
    section = Section("Computation: counts in buckets vs recomputing from raw rows")
    timing_rows, memory_rows = [], []
    fairlearn_seconds: dict[int, float] = {}
    speedups: dict[int, float] = {}
    state_bytes = WindowStore(cfg.model(), cfg.windowing).counts.nbytes
    for n in sizes:
        rows = window_rows(n)
        fleet = filled_fleet(cfg, rows)
        computer = Computer(fleet, Health(CollectorRegistry()), clock=lambda: NOW)
        snapshot, daemon_s = best_time(computer.compute, 50 if quick else 200)
        expected = daemon_results(snapshot)
        df = frame(rows)
        del rows, fleet
        reps = 3 if n >= 10**7 else 5
        by_pandas, pandas_s = best_time(lambda df=df: pandas_recompute(cfg, df), reps)
        strings = df.astype({name: "str" for name in ATTRIBUTES})
        by_strings, strings_s = best_time(lambda strings=strings: pandas_recompute(cfg, strings), reps)
        check = [max_difference(expected, by_pandas), max_difference(expected, by_strings)]
        memory_rows.append((f"{n:,}", f"{state_bytes / 1e6:.2f} MB",
                            f"{df.memory_usage(deep=True).sum() / 1e6:,.1f} MB",
                            f"{strings.memory_usage(deep=True).sum() / 1e6:,.1f} MB",
                            f"{df.memory_usage(deep=True).sum() / state_bytes:,.1f}x"))  # fmt: skip
        del strings
        if n in fairlearn_sizes:
            by_fairlearn, fairlearn_seconds[n] = best_time(lambda df=df: fairlearn_recompute(cfg, df), 1)
            check.append(max_difference(expected, by_fairlearn))
            fairlearn_cell = fmt(fairlearn_seconds[n])
        else:
            fairlearn_cell = f"{fmt(_extrapolate(fairlearn_seconds, n))} (extrapolated)"
        fairlearn_estimate = fairlearn_seconds.get(n, _extrapolate(fairlearn_seconds, n))
        speedups[n] = pandas_s / daemon_s
        timing_rows.append((f"{n:,}", fmt(daemon_s * 1e3), fmt(pandas_s), fmt(strings_s), fairlearn_cell,
                            fmt(speedups[n]), fmt(strings_s / daemon_s), fmt(fairlearn_estimate / daemon_s),
                            f"{max(check):.1e}"))  # fmt: skip
        del df
    pairs = sum(len(a.pairs) for a in cfg.model().attributes)
    groups = ", ".join(f"{name}: {len(g)} groups" for name, g in ATTRIBUTES.items())
    section.add(f"{len(cfg.model().attributes)} attributes ({groups}), all {pairs} pairs, one 24h window of 1-minute "
                "buckets, 30% of events labelled. Times are the best of several calls (daemon: 200 (quick: 50), "
                "pandas: 5 (3 at 10^7), Fairlearn: 1). Daemon: `Computer.compute()`, every rate, gap and interval "
                "and the snapshot built. pandas: boolean window selection, then groupby means (selection rate, "
                "TPR, FPR) and the pairwise gaps, point values only, on categorical attribute columns (pandas' "
                "fastest layout: the ratio the targets use) and on pandas' default string columns (what a frame "
                f"built from the JSON events holds). Fairlearn {package_version('fairlearn')}: `MetricFrame` on "
                "the categorical frame, no bootstrap intervals; extrapolated on a straight line through the "
                "measured points (through the origin when there is only one). The last column is the largest "
                "difference between any recompute's values and the daemon's.")  # fmt: skip
    section.add(table(["window events", "daemon compute (ms)", "pandas, categorical (s)", "pandas, strings (s)",
                       "Fairlearn MetricFrame (s)", "pandas categorical / daemon", "pandas strings / daemon",
                       "Fairlearn / daemon", "max abs difference"], timing_rows))  # fmt: skip
    store = WindowStore(cfg.model(), cfg.windowing)
    section.add(f"Memory: the daemon's window state is `WindowStore.counts`, {store.n_buckets} buckets (24h of "
                f"1-minute buckets + allowed lateness) x {store.layout.n_rows} subgroup rows x 6 counts, int64, "
                "whatever the traffic; the raw rows are the pandas frames above (`memory_usage(deep=True)`).")
    section.add(table(["window events", "window state", "raw rows, categorical", "raw rows, strings",
                       "raw rows (categorical) / window state"], memory_rows))  # fmt: skip
    largest = sizes[-1]
    where = "" if largest == 10**7 else f" (quick run: at {largest:,})"
    section.target(f"computation at 10^7 events >= {TARGET_SPEEDUP:,}x faster than pandas recompute{where}",
                   f"{speedups[largest]:,.0f}x", speedups[largest] >= TARGET_SPEEDUP)  # fmt: skip
    section.target("window state < 50 MB (24h of 1-minute buckets)", f"{state_bytes / 1e6:.2f} MB",
                   state_bytes < TARGET_STATE_BYTES)  # fmt: skip
    return section


def _extrapolate(measured: dict[int, float], n: int) -> float:
    points = sorted(measured.items())
    if len(points) == 1:
        (x, y), = points
        return y * n / x
    (x0, y0), (x1, y1) = points[-2:]
    return y1 + (y1 - y0) / (x1 - x0) * (n - x1)


if __name__ == "__main__":
    standalone(run)
