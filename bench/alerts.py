"""Alerts: how often fair traffic pages, and how fast a real change does, for the detectors and the seed rules.

Synthetic streams (exporter/devtools/synthetic.py): 3 attributes of 3, 4 and 5 groups, every pair compared,
1-minute buckets, 1h and 24h windows, the default thresholds (parity 0.05, impact ratio 0.80) and budget
(0.01 false pages a day). Each event belongs to one group of every attribute, all equally likely, and "V events
per group per hour" means 5V events an hour in total, so the five groups of the third attribute get V each
(the others more).

* Fair days: every group at the base rate; the share of simulated days (streams of several days, the first one
  starting cold) with any page.
* Time to page: after a fair day, one group of the third attribute falls from 0.30 to 0.20 (a gap of 0.10) or to
  0.21 (an impact ratio of 0.7); the median time from the change to the first page of that alert.

Many days are simulated at once: the detectors are the daemon's (DetectorBank.advance, its batch dimension holds
independent streams), and the seed rules are evaluated on the daemon's window sums with the daemon's
evaluate_many. A backtest of one recorded day, from parquet and from JSON lines, checks that the backtest pages
exactly when the batched detectors do on the same traffic, and measures its speed.
"""

from __future__ import annotations

import math
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pandas as pd
from scipy.stats import binom

from bench import staged_replay
from bench.report import Section, fmt, standalone, table
from exporter.backtest.replay import backtest
from exporter.backtest.series import stacked
from exporter.config import Config, parse_config, parse_duration
from exporter.core.evaluate import evaluate_many
from exporter.devtools.embedded_broker import EmbeddedBroker
from exporter.devtools.rules import SEED_INTERVAL, TUNING
from exporter.devtools.synthetic import attribute_counts, cell_counts, cell_events
from exporter.stream.state.detectors import ALERT_OF_METRIC, DetectorBank
from exporter.stream.state.window import RowLayout

ATTRIBUTES = {"a": ("a0", "a1", "a2"), "b": ("b0", "b1", "b2", "b3"), "c": ("c0", "c1", "c2", "c3", "c4")}
SIZES = tuple(len(g) for g in ATTRIBUTES.values())
VOLUMES = (100, 500, 2000)  # events per group per hour (the five groups of attribute c)
BASE_RATES = (0.05, 0.1, 0.3, 0.5)
STEPS_PER_DAY = 1440
T0 = 1_800_000_000.0
TARGET_FAIR = 0.01
TARGET_MINUTES = {2000: 45, 500: 180, 100: 720}
SCENARIOS = {"gap 0.30 -> 0.20": ("FairnessDemographicParityDrift", "FairnessDemographicParityAboveThreshold", 0.20),
             "ratio 1.0 -> 0.7": ("FairnessDisparateImpactViolation", "FairnessDisparateImpactBelowThreshold", 0.21)}
SEED = {"FairnessDemographicParityAboveThreshold": "demographic_parity_difference",
        "FairnessDisparateImpactBelowThreshold": "disparate_impact_ratio"}  # fmt: skip
CHANGED_CELLS = np.unravel_index(np.arange(int(np.prod(SIZES))), SIZES)[2] == 0  # cells of group c0


def raw_config(**extra: Any) -> dict[str, Any]:
    return {"model_id": "bench", "windows": ["1h", "24h"], "bucket": "1m",
            "protected_attributes": [{"name": k, "groups": list(v)} for k, v in ATTRIBUTES.items()], **extra}


def config(**extra: Any) -> Config:
    return parse_config(raw_config(**extra))


@dataclass
class Run:
    """Per stream and step: which paging alerts (detector and seed) are firing."""

    detector: dict[str, np.ndarray]
    """alert name -> (steps, streams) bool"""
    seed: dict[str, np.ndarray]


def bank_of(cfg: Config) -> DetectorBank:
    """The detectors of the config's one model, as its window store builds them."""
    model = cfg.model()
    return DetectorBank(model, cfg.windowing, RowLayout.of(model).offsets, RowLayout.of(model).n_rows)


def seed_firing(cfg: Config, counts: np.ndarray, history: np.ndarray | None) -> dict[str, np.ndarray]:
    """The seed rules on the daemon's window sums: (steps, streams) bool per seed alert (value beyond the threshold
    with enough samples, in some window and pair, at every evaluation for `for:`; evaluated every SEED_INTERVAL, at
    the steps whose bucket ends one, as their group and `backtest`)."""
    steps, streams = counts.shape[:2]
    before = np.zeros_like(counts[:0]) if history is None else history
    cumulative = np.cumsum(np.concatenate([before, counts]), axis=0)
    cumulative = np.concatenate([np.zeros_like(cumulative[:1]), cumulative])
    end = np.arange(len(before), len(before) + steps) + 1
    model = cfg.model()
    layout = RowLayout.of(model)
    out = {}
    every = round(parse_duration(SEED_INTERVAL) / cfg.windowing.bucket_seconds)  # steps between evaluations
    t = np.arange(steps)
    evaluations = t[(t + 1) % every == 0]  # a day is a whole number of intervals: the grid is the same every day
    for name, metric in SEED.items():
        tuning = TUNING[name]
        hold = round(parse_duration(tuning.for_) / parse_duration(SEED_INTERVAL))  # `for: 30m`: 7 evaluations
        beyond = np.zeros((steps, streams), dtype=bool)
        for window in cfg.windowing.windows:
            k = int(window.seconds // cfg.windowing.bucket_seconds)
            sums = cumulative[end] - cumulative[np.maximum(end - k, 0)]  # (steps, streams, rows, 6)
            blocks = layout.split(np.moveaxis(sums, 2, 0))
            for attribute in model.attributes:
                groups = np.moveaxis(blocks[attribute.name][: len(attribute.groups)], 0, 2).reshape(-1, 6)
                (ev,) = evaluate_many([(stacked(attribute, steps * streams), groups)], model.min_samples,
                                      model.exported_metrics)
                value = ev.metric(metric)[0]
                bad = value < tuning.threshold if metric == "disparate_impact_ratio" else value > tuning.threshold
                beyond |= (bad & ev.sufficient(metric)).reshape(steps, streams, -1).any(axis=2)
        e = np.arange(len(evaluations))[:, None]
        last_quiet = np.maximum.accumulate(np.where(~beyond[evaluations], e, -1), axis=0)
        firing = e - last_quiet > hold  # at each evaluation; it holds until the next one
        latest = np.searchsorted(evaluations, t, side="right") - 1
        out[name] = np.where((latest >= 0)[:, None], firing[np.maximum(latest, 0)], False)
    return out


def simulate(cfg: Config, rng: np.random.Generator, days: int, streams: int, volume: int,
             rates: np.ndarray, seed_rules: bool = True) -> Run:  # fmt: skip
    """``rates``: (days * 1440, cells) selection probabilities. Returns what fires at every step of every stream."""
    bank = bank_of(cfg)
    state = bank.initial_state((streams,))
    detector: dict[str, list[np.ndarray]] = {a: [] for a in {ALERT_OF_METRIC[d.metric].name for d in bank.detectors}}
    seed: dict[str, list[np.ndarray]] = {name: [] for name in SEED}
    history = None
    for day in range(days):
        part = slice(day * STEPS_PER_DAY, (day + 1) * STEPS_PER_DAY)
        counts = attribute_counts(cell_counts(rng, STEPS_PER_DAY, streams, SIZES, 5 * volume / 60, rates[part]),
                                  SIZES)  # fmt: skip
        state, trace = bank.advance(state, counts)
        alarms = trace.active
        for name in detector:
            columns = [i for i, d in enumerate(bank.detectors) if ALERT_OF_METRIC[d.metric].name == name]
            detector[name].append(np.asarray(alarms[..., columns].any(axis=-1)))
        if seed_rules:
            for name, firing in seed_firing(cfg, counts, history).items():
                seed[name].append(firing)
        history = counts
    return Run({k: np.concatenate(v) for k, v in detector.items()},
               {k: np.concatenate(v) for k, v in seed.items() if v})  # fmt: skip


REPLICAS = (1, 2, 4)
REPLICA_SCENARIO, REPLICA_VOLUME = "gap 0.30 -> 0.20", 2000
TARGET_REPLICA_RATIO = 1.10
REPLAY_SEED, REPLAY_MINUTES = 23, 360  # past the page: 88 minutes' median at 2,000/h since the null is the threshold
PAGING = ("FairnessDemographicParityDrift", "FairnessDisparateImpactViolation")


def fair_days(cfg: Config, streams: int, days: int, seed_rules: bool = True,
              volumes: tuple[int, ...] = VOLUMES) -> tuple[list[list[str]], list[tuple[str, str, bool]]]:  # fmt: skip
    """Share of fair days with a page per volume and base rate; targets: pooled share <= 1%, and no configuration
    significantly above 1% (one-sided binomial test at 5%: a handful of days cannot show 1% more precisely)."""
    rows, worst, paged, pages_of = [], 0.0, 0, []
    for volume in volumes:
        for rate in BASE_RATES:
            rng = np.random.default_rng(volume * 1000 + int(rate * 100) + days * streams)
            run = simulate(cfg, rng, days, streams, volume, np.full((days * STEPS_PER_DAY, int(np.prod(SIZES))), rate),
                           seed_rules)  # fmt: skip

            def share(firing: np.ndarray) -> float:
                """Days on which the alert starts firing (a page), of all simulated days."""
                starts = firing & ~np.concatenate([np.zeros_like(firing[:1]), firing[:-1]])
                return float(starts.reshape(days, STEPS_PER_DAY, streams).any(axis=1).mean())

            pages = share(np.logical_or.reduce([run.detector[a] for a in PAGING]))
            worst = max(worst, pages)
            pages_of.append(round(pages * days * streams))
            seed = [f"{share(run.seed[name]):.0%}" if seed_rules else "not run" for name in SEED]
            rows.append([f"{volume:,}", f"{rate:g}", f"{days * streams}", f"{pages:.1%}",
                         f"{share(run.detector['SubgroupPredictionRateShift']):.1%}", *seed])  # fmt: skip
    n = days * streams
    paged = sum(pages_of)
    total = len(pages_of) * n
    # P(at least this many page days in n days | a true share of 1%): small means significantly above 1%
    p_values = [float(binom.sf(k - 1, n, TARGET_FAIR)) for k in pages_of]
    return rows, [(f"fair days with a page <= {TARGET_FAIR:.0%}, all volumes and base rates together",
                   f"{paged / total:.2%} ({paged} of {total:,} days)", paged / total <= TARGET_FAIR),
                  (f"no volume and base rate significantly above {TARGET_FAIR:.0%} of fair days with a page",
                   f"worst {worst:.1%} of {n} days (p = {min(p_values):.2f})", min(p_values) >= 0.05)]  # fmt: skip


def minutes_to(firing: np.ndarray, start: int) -> np.ndarray:
    """Minutes from step `start` to the first firing step at or after it, per stream (inf when never)."""
    after = firing[start:]
    return np.where(after.any(axis=0), np.argmax(after, axis=0) + 1.0, np.inf)


def change(rate: float) -> np.ndarray:
    """(2 days, cells) selection probabilities: 0.30 everywhere, and ``rate`` in group c0's cells on day two."""
    rates = np.full((2 * STEPS_PER_DAY, int(np.prod(SIZES))), 0.30)
    rates[STEPS_PER_DAY:, CHANGED_CELLS] = rate
    return rates


def time_to_page(cfg: Config, streams: int) -> tuple[list[list[str]], list[tuple[str, str, bool]]]:
    rows, targets = [], []
    for scenario, (alert, seed_alert, changed) in SCENARIOS.items():
        for volume in sorted(VOLUMES, reverse=True):
            run = simulate(cfg, np.random.default_rng(volume + 7), 2, streams, volume, change(changed))
            detector = minutes_to(run.detector[alert], STEPS_PER_DAY)
            seed = minutes_to(run.seed[seed_alert], STEPS_PER_DAY)
            median = float(np.median(detector))
            target = TARGET_MINUTES[volume]
            rows.append([scenario, f"{volume:,}", fmt(median), f"{np.isfinite(detector).mean():.0%}", f"{target}",
                         fmt(float(np.median(seed)))])  # fmt: skip
            targets.append((f"{scenario} at {volume:,}/h: median time to {alert} <= {target} min",
                            f"{fmt(median)} min", median <= target))  # fmt: skip
    return rows, targets


def sharded_minutes(runs: int, replicas: int, volume: int, scenario: str) -> tuple[np.ndarray, float]:
    """The layout before the staged path: each of ``replicas`` replicas sees 1/N of the traffic and alarms at the
    level for 1/N of the budget (the retired `alerting.replicas`); a change pages when the first replica does.
    Per run, minutes from the change to that page; and the level."""
    alert, _, changed = SCENARIOS[scenario]
    cfg = config(alerting={"false_pages_per_day": config().model().alerting.false_pages_per_day / replicas})
    run = simulate(cfg, np.random.default_rng(volume + 7), 2, runs * replicas, volume // replicas, change(changed),
                   seed_rules=False)  # fmt: skip
    minutes = minutes_to(run.detector[alert], STEPS_PER_DAY).reshape(runs, replicas).min(axis=1)
    return minutes, bank_of(cfg).level


def replicas_check(runs: int) -> tuple[list[list[str]], list[tuple[str, str, bool]]]:
    """Time to page on 1, 2 and 4 replicas, sharded (each detector on 1/N of the traffic) and staged (each model
    whole on its owner), at REPLICA_VOLUME; the staged figure replayed through real staged replicas."""
    scenario, volume = REPLICA_SCENARIO, REPLICA_VOLUME
    alert, _, changed = SCENARIOS[scenario]
    one, level = sharded_minutes(runs, 1, volume, scenario)
    baseline = float(np.median(one))
    rng = np.random.default_rng(REPLAY_SEED)
    cells = int(np.prod(SIZES))
    history = cell_counts(rng, STEPS_PER_DAY, 1, SIZES, 5 * volume / 60, np.full(cells, 0.30)).sum(axis=0)[0]
    after = cell_counts(rng, REPLAY_MINUTES, 1, SIZES, 5 * volume / 60, change(changed)[-1])[:, 0]
    rows = [["1", "one replica", f"{volume:,}", fmt(level), fmt(baseline), "1.00", "-", "-"]]
    targets = []
    with EmbeddedBroker() as broker:
        for n in REPLICAS[1:]:
            minutes, sharded_level = sharded_minutes(runs, n, volume, scenario)
            median = float(np.median(minutes))
            rows.append([f"{n}", "sharded (before: 1/N of the traffic and of the budget)", f"{volume // n:,}",
                         fmt(sharded_level), fmt(median), f"{median / baseline:.2f}", "-", "-"])  # fmt: skip
        for n in REPLICAS:
            replayed = staged_replay.replay(broker, n, raw_config(), history, after, alert, REPLAY_SEED)
            # a replay that never paged compared nothing (inf = inf): no pass
            same = replayed.equal == replayed.steps and replayed.minutes == replayed.reference_minutes and \
                math.isfinite(replayed.minutes)
            # The owner's detectors are one replica's on the whole stream (the replay shows it step by step), so
            # its time to page is one replica's: the simulated median above.
            ratio = 1.0 if same else float("nan")
            rows.append([f"{n}", "staged (each model whole on its owner)", f"{volume:,}", fmt(level),
                         fmt(baseline) if same else "differs", f"{ratio:.2f}",
                         f"{replayed.equal} of {replayed.steps}",
                         f"{fmt(replayed.minutes)} / {fmt(replayed.reference_minutes)}"])  # fmt: skip
            targets.append((f"{scenario} at {volume:,}/h on {n} staged replica{'s' if n > 1 else ''}: time to page "
                            f"<= {TARGET_REPLICA_RATIO:g} x one replica's",
                            f"{ratio:.2f} (replayed: {replayed.equal} of {replayed.steps} steps equal one "
                            "replica's)", same and ratio <= TARGET_REPLICA_RATIO))  # fmt: skip
    return rows, targets


CALLS = 3
"""Backtest calls timed per file: a single cold call moved 0.156-0.5 s for the same code within minutes here."""


def backtest_check(cfg: Config) -> tuple[list[list[str]], list[tuple[str, str, bool]]]:
    """One recorded day at 2,000/h with the gap appearing at noon, and 6 hours at 100,000/h, replayed by
    `backtest` from parquet and JSON lines: same pages as the batched detectors, and events per second."""
    rows, targets = [], []
    with tempfile.TemporaryDirectory() as directory:
        for volume, hours in ((2000, 24), (100_000, 6)):
            steps = hours * 60
            rates = np.full((steps, int(np.prod(SIZES))), 0.30)
            rates[steps // 2 :, CHANGED_CELLS] = 0.20
            cells = cell_counts(np.random.default_rng(1), steps, 1, SIZES, 5 * volume / 60, rates)
            bank = bank_of(cfg)
            _, trace = bank.advance(bank.initial_state((1,)), attribute_counts(cells, SIZES))
            alarms = trace.active[:, 0]
            first_step = int(np.argmax(alarms.any(axis=-1))) if alarms.any() else None
            frame = pd.DataFrame(cell_events(cells[:, 0], ATTRIBUTES, T0, 60.0))
            frame["model_id"] = "bench"
            frame["prediction_id"] = np.arange(len(frame)).astype(str)
            parquet = Path(directory) / "events.parquet"
            frame.to_parquet(parquet)
            files = [("parquet", parquet)]
            if volume <= 2000:
                jsonl = Path(directory) / "events.jsonl"
                with jsonl.open("wb") as f:
                    for row in frame.itertuples(index=False):
                        f.write(orjson.dumps({"model_id": "bench", "prediction_id": row.prediction_id,
                                              "timestamp": row.timestamp, "prediction": int(row.prediction),
                                              "attributes": {k: getattr(row, k) for k in ATTRIBUTES}}) + b"\n")
                files.append(("JSON lines", jsonl))
            for kind, path in files:
                times = []
                for _ in range(CALLS):  # the first call also pays imports and this process's first allocations
                    started = time.perf_counter()
                    report = backtest(cfg, [path])
                    times.append(time.perf_counter() - started)
                seconds = min(times)
                # The backtest fires at the step that ends a bucket, stamped with the newest event's time.
                pages = [a for a in report["alerts"] if a["severity"] == "critical"]
                fired = [pd.Timestamp(a["fired_at"]).timestamp() for a in pages]
                first = int((min(fired) - T0) // 60) if fired else None
                same = first == first_step
                rate = report["events"] / seconds
                rows.append([f"{volume:,}/h, {hours} h", kind, f"{report['events']:,}", fmt(times[0]), fmt(seconds),
                             f"{report['events'] / times[0]:,.0f}", f"{rate:,.0f}",
                             "yes" if same else f"no (minute {first} vs {first_step})"])  # fmt: skip
                targets.append((f"backtest pages when the batched detectors do ({kind}, {volume:,}/h)",
                                "same minute" if same else "differs", same))  # fmt: skip
                goal = 1_000_000 if kind == "parquet" else 100_000
                targets.append((f"backtest speed from {kind} at {volume:,}/h >= {goal:,} events/s",
                                f"{rate:,.0f} events/s", rate >= goal))  # fmt: skip
    return rows, targets


def run(quick: bool = False) -> Section:
    cfg = config()
    bank = bank_of(cfg)
    streams, days, runs = (10, 2, 8) if quick else (50, 2, 30)
    section = Section("Alerts: fair days with a page, and time to page a real change")
    section.add(__doc__.split("\n\n", 1)[1].strip())
    section.add(f"{len(bank)} detectors ({bank.n_pairs} on pairs: parity and impact ratio, two directions each; "
                f"{len(bank) - bank.n_pairs} on subgroups), alarm level h = {bank.level:.2f} "
                "= log(detectors x 1440 steps a day / 0.01).")  # fmt: skip
    fair_rows, fair_targets = fair_days(cfg, streams, days)
    section.add(table(["events/group/h", "base rate", "days", "days with a page (detectors)",
                       "days with a SubgroupPredictionRateShift warning", "seed parity rule (30m)",
                       "seed four-fifths rule (30m)"], fair_rows))  # fmt: skip
    ttp_rows, ttp_targets = time_to_page(cfg, runs)
    section.add(table(["change", "events/group/h", "median minutes to page (detectors)", f"paged within 24 h "
                       f"({runs} runs)", "target (min)", "seed rule: median minutes"], ttp_rows))  # fmt: skip
    rep_rows, rep_targets = replicas_check(runs)
    section.add(f"Time to page on 1, 2 and 4 replicas: {REPLICA_SCENARIO} at {REPLICA_VOLUME:,} events per group per "
                f"hour, {runs} runs each. Sharded, the layout before `kafka.stages: staged`: each replica's "
                "detectors see 1/N of the traffic, at the alarm level of 1/N of the budget, and the first replica "
                "to page pages. Staged: each model's detectors live on its owner and see all of its traffic; the "
                "time to page is one replica's because the detectors are, which the replay checks. "
                + staged_replay.__doc__.split("\n\n", 1)[1].strip())  # fmt: skip
    section.add(table(["replicas", "layout", "each detector sees (events/group/h)", "alarm level h",
                       "median minutes to page", "vs 1 replica", "replay: steps equal to one replica's",
                       "replay: minutes to page, owner / one replica"], rep_rows))  # fmt: skip
    bt_rows, bt_targets = backtest_check(cfg)
    section.add(f"Each file replayed {CALLS} times in this process; the target reads the best call (as every timed "
                "target here: noise only ever adds time), the first call is shown beside it.")
    section.add(table(["recorded traffic", "file", "events", "seconds, first call", "seconds, best",
                       "events/s, first call", "events/s, best", "first page as batched"], bt_rows))  # fmt: skip
    for target in (*fair_targets, *ttp_targets, *rep_targets, *bt_targets):
        section.target(*target)
    return section


if __name__ == "__main__":
    standalone(run)
