"""Audits at any size: `fairness-exporter audit` over a folder of parquet files beside DuckDB on the same files.

The data: the seed's three attributes (gender, age_group, ethnicity; 3, 4 and 5 groups), a prediction and a label
(missing on 30% of rows), written once into a temporary folder as parquet files of 10^6 rows. Each side runs in a
child process of its own, timed by the wall clock, its peak RSS read from the kernel (the child's own ``VmHWM``:
``os.wait4``'s ``ru_maxrss`` carries the parent's peak into a child it starts, so it said the bench's own size);
each side runs :data:`ROUNDS` times, interleaved, the best time of each compared:

* ours: ``fairness-exporter audit CONFIG FOLDER`` (DuckDB's counts of the local parquet files weighed by the gate's
  scan, the manifest's hashes, the report); its start-up is the same command on the shipped example (3,000 rows):
  Python's imports, mostly;
* DuckDB: the fastest DuckDB query that yields the counts the gate needs, and nothing else: one ``GROUP BY`` over
  the three attributes, the prediction and the label (360 combinations), rolled up per attribute in Python.
  Measured at 10^7 rows in ten files (best of 3, same process): 0.31 s, where one scan with ``GROUPING SETS`` of
  the three (attribute, prediction, label) took 0.39 s and three separate ``GROUP BY``s 0.46 s.

Every group's rows, labelled rows and positive predictions must equal DuckDB's. Then `backtest` replays a day of
10^7 events from parquet (one model, 1-minute buckets, 1h and 24h windows) and reports events per second; that its
final state is the daemon's is tests/test_backtest.py's job.

``python -m bench.anysize`` runs 10^7 rows; ``--rows 1e8`` the large case (heavy on a shared machine).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import yaml

from bench.report import Section, fmt, table

ATTRIBUTES = {"gender": ["male", "female", "non_binary"], "age_group": ["18_29", "30_44", "45_59", "60_plus"],
              "ethnicity": ["white", "black", "hispanic", "asian", "other"]}  # fmt: skip
FILE_ROWS = 1_000_000
TARGET_TIME_RATIO = 2.0
ROUNDS = 2
"""Runs of each, interleaved, alternating which goes first; the best time of each (noise only ever adds time) and the
largest peak. Whichever reads freshly written files first may read them from disk: this machine reclaims cold
pages (the full run of 2026-12-03 13:04, one run each, ours first: 10.7 s against DuckDB's 2.36 s)."""
TARGET_ROWS = 10**8
"""The time and memory targets are for 10^8 rows (``--rows 1e8``); a smaller run prints the same columns."""
ROOT = Path(__file__).resolve().parent.parent
TARGET_RSS = 1 << 30
TARGET_EVENTS_PER_SECOND = 1_000_000
BACKTEST_EVENTS = 10**7
"""A day of events, about 7,000 a minute: enough that the replay's time is its reading and counting rather than the
detectors' fixed work per one-minute step (1,440 steps a day whatever the volume)."""
DUCKDB = """
import collections, json, sys, duckdb
con = duckdb.connect()
con.execute("SET enable_progress_bar = false")
names = sys.argv[2].split(",")
rows = con.execute(f"SELECT {', '.join(names)}, prediction, label, count(*) "
                   f"FROM read_parquet('{sys.argv[1]}/*.parquet') GROUP BY ALL").fetchall()
out = {}
for i, a in enumerate(names):
    rolled = collections.Counter()
    for row in rows:
        rolled[(row[i], row[-3], row[-2])] += row[-1]
    out[a] = [[*key, n] for key, n in rolled.items()]
print(json.dumps(out))
"""
"""The baseline: one scan, one GROUP BY of every combination, rolled up per attribute (see the module's text)."""


def write_rows(folder: Path, rows: int, seed: int = 1) -> None:
    """``rows`` rows of the three attributes, a prediction and a label, as parquet files of FILE_ROWS rows."""
    rng = np.random.default_rng(seed)
    for k, start in enumerate(range(0, rows, FILE_ROWS)):
        n = min(FILE_ROWS, rows - start)
        columns = {name: pa.DictionaryArray.from_arrays(pa.array(rng.integers(0, len(groups), n).astype(np.int32)),
                                                        pa.array(groups)).cast(pa.string())
                   for name, groups in ATTRIBUTES.items()}  # fmt: skip
        columns["prediction"] = pa.array(rng.integers(0, 2, n))
        columns["label"] = pa.array(rng.integers(0, 2, n), mask=rng.random(n) < 0.3)
        pq.write_table(pa.table(columns), folder / f"part-{k:05d}.parquet")


PEAK = """
import atexit, os, runpy, sys
def peak():
    with open("/proc/self/status") as status, open(os.environ["BENCH_PEAK"], "w") as out:
        out.write(next(line for line in status if line.startswith("VmHWM:")).split()[1])
atexit.register(peak)
flag, target, *sys.argv = sys.argv[1:]
if flag == "-m":
    sys.argv.insert(0, target)
    runpy.run_module(target, run_name="__main__", alter_sys=True)
else:
    sys.argv.insert(0, "-c")
    exec(compile(target, "<string>", "exec"), {"__name__": "__main__"})
"""
"""Runs a child's ``-m module`` or ``-c code`` and writes its peak RSS in KiB (``VmHWM``, its own) at exit."""


def child(argv: list[str]) -> tuple[float, int, str]:
    """Run a child process (``python -m ...`` or ``python -c ...``): its wall seconds, its peak RSS in bytes, its
    stdout."""
    with tempfile.TemporaryFile() as out, tempfile.NamedTemporaryFile() as peak:
        started = time.perf_counter()
        process = subprocess.Popen([argv[0], "-c", PEAK, *argv[1:]], stdout=out, stderr=subprocess.DEVNULL,
                                   env={**os.environ, "BENCH_PEAK": peak.name})  # fmt: skip
        _, status, _ = os.wait4(process.pid, 0)
        seconds = time.perf_counter() - started
        process.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        text = out.read().decode()
        kib = Path(peak.name).read_text()
    if process.returncode not in (0, 1):
        raise RuntimeError(f"{argv[:4]} exited {process.returncode}")
    return seconds, int(kib) * 1024, text


def audit_config(folder: Path) -> Path:
    path = folder / "config.yaml"
    path.write_text(yaml.safe_dump({
        "model_id": "bench", "min_samples": 30,
        "protected_attributes": [{"name": n, "groups": g, "pairwise_comparisons": "all"}
                                 for n, g in ATTRIBUTES.items()],
        "metrics": [{"name": "demographic_parity_difference", "threshold": 0.05, "severity_on_fail": "blocking"},
                    {"name": "equalised_odds_difference", "threshold": 0.05, "severity_on_fail": "blocking"}]}))
    return path


def same_counts(report: dict, duck: dict) -> bool:
    """Every group's rows, labelled rows and positive predictions in the report equal DuckDB's."""
    for attribute, rows in duck.items():
        groups = report["attributes"][attribute]["groups"]
        for name in ATTRIBUTES[attribute]:
            mine = [r for r in rows if r[0] == name]
            samples = sum(r[3] for r in mine)
            g = groups[name]
            if (g["samples"], g["labelled"]) != (samples, sum(r[3] for r in mine if r[2] is not None)):
                return False
            if round(g["selection_rate"] * samples) != sum(r[3] for r in mine if r[1] == 1):
                return False
    return True


def backtest_rate(folder: Path, events: int) -> tuple[float, int]:
    """`backtest` of ``events`` events over a day from one parquet file: seconds and events replayed."""
    from exporter.backtest.replay import backtest
    from exporter.config import parse_config

    rng = np.random.default_rng(5)
    columns = {name: pa.DictionaryArray.from_arrays(pa.array(rng.integers(0, len(groups), events).astype(np.int32)),
                                                    pa.array(groups))
               for name, groups in ATTRIBUTES.items()}  # fmt: skip
    columns["timestamp"] = pa.array(np.sort(1_800_000_000.0 + rng.uniform(0, 86_400, events)).round(3))
    columns["prediction"] = pa.array(rng.integers(0, 2, events))
    columns["model_id"] = pa.DictionaryArray.from_arrays(pa.array(np.zeros(events, np.int32)), pa.array(["bench"]))
    path = folder / "events.parquet"
    pq.write_table(pa.table(columns), path)
    del columns
    config = parse_config({"model_id": "bench", "windows": ["1h", "24h"], "bucket": "1m", "min_samples": 30,
                           "protected_attributes": [{"name": n, "groups": g} for n, g in ATTRIBUTES.items()]})
    started = time.perf_counter()
    report = backtest(config, [str(path)])
    return time.perf_counter() - started, report["events"]


def run(quick: bool = False, rows: int | None = None, data: Path | None = None) -> Section:
    sizes = [rows] if rows else [10**6 if quick else 10**7]
    section = Section("Audits at any size: a folder of parquet files, beside DuckDB")
    section.add(__doc__.split("\n\n", 1)[1].strip())
    lines, rates = [], []
    for n in sizes:
        with tempfile.TemporaryDirectory() as directory:
            folder = data or Path(directory) / "data"
            if not (folder / "part-00000.parquet").exists():
                folder.mkdir(exist_ok=True)
                write_rows(folder, n)
            config = audit_config(Path(directory))
            commands = {"ours": [sys.executable, "-m", "exporter.cli", "audit", str(config), str(folder),
                                 "--audit-log", str(Path(directory) / "log.jsonl")],
                        "duckdb": [sys.executable, "-c", DUCKDB, str(folder), ",".join(ATTRIBUTES)]}  # fmt: skip
            runs: dict[str, list[tuple[float, int, str]]] = {"ours": [], "duckdb": []}
            for r in range(ROUNDS):  # interleaved, alternating which reads the files first
                for which in ("ours", "duckdb") if r % 2 == 0 else ("duckdb", "ours"):
                    runs[which].append(child(commands[which]))
            ours, duck = (min(t for t, _, _ in runs[w]) for w in ("ours", "duckdb"))
            ours_rss, duck_rss = (max(m for _, m, _ in runs[w]) for w in ("ours", "duckdb"))
            same = all(same_counts(json.loads(o[2]), json.loads(d[2])) for o, d in zip(*runs.values(), strict=True))
            ratio = ours / duck
            start_up, _, _ = child([sys.executable, "-m", "exporter.cli", "audit",
                                    str(ROOT / "examples/hiring-screener.yaml"),
                                    str(ROOT / "examples/hiring-predictions.csv"), "--audit-log",
                                    str(Path(directory) / "start.jsonl")])  # fmt: skip
            files = len(list(folder.glob("*.parquet")))
            lines.append([f"{n:,}", f"{files}", fmt(ours), fmt(start_up), f"{ours_rss / 2**20:,.0f}", fmt(duck),
                          f"{duck_rss / 2**20:,.0f}", f"{ratio:.2f}", "yes" if same else "NO"])  # fmt: skip
            if n >= TARGET_ROWS:  # below, the process's start (imports: about 0.5 s) weighs on the ratio
                section.target(f"audit of {n:,} rows <= {TARGET_TIME_RATIO:g} x DuckDB's time", f"{ratio:.2f} x",
                               ratio <= TARGET_TIME_RATIO)  # fmt: skip
                section.target(f"audit of {n:,} rows: peak RSS < 1 GiB", f"{ours_rss / 2**20:,.0f} MiB",
                               ours_rss < TARGET_RSS)
            section.target(f"audit of {n:,} rows: DuckDB's counts exactly", "same" if same else "differ", same)
            events = 10**6 if quick else BACKTEST_EVENTS
            seconds, replayed = backtest_rate(Path(directory), events)
            rates.append([f"{replayed:,}", fmt(seconds), f"{replayed / seconds:,.0f}"])
            section.target(f"backtest from parquet >= {TARGET_EVENTS_PER_SECOND:,} events/s",
                           f"{replayed / seconds:,.0f} events/s", replayed / seconds >= TARGET_EVENTS_PER_SECOND)
    section.add(table(["rows", "files", "audit s", "of which start-up s", "audit peak RSS MiB", "DuckDB s",
                       "DuckDB peak RSS MiB", "time vs DuckDB", "same counts"], lines))  # fmt: skip
    section.add(table(["backtest events (parquet, 24 h)", "seconds", "events/s"], rates))
    return section


if __name__ == "__main__":
    parser = argparse.ArgumentParser(prog="python -m bench.anysize")
    parser.add_argument("--rows", type=float, help="rows of the audited folder (default 10^7; 1e8 for the large case)")
    parser.add_argument("--quick", action="store_true", help="10^6 rows")
    parser.add_argument("--data", type=Path, help="keep the generated parquet files in this folder and reuse them")
    args = parser.parse_args()
    print(run(args.quick, int(args.rows) if args.rows else None, args.data).markdown())
