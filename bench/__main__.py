"""Run the benchmarks: ``python -m bench`` (``make bench``), or ``python -m bench --quick`` for a smaller run.

The soak (bench/soak.py: N minutes of traffic and faults) is left out of a plain run, which stays short: it runs
when named (``--only soak``, 30 minutes; 3 with ``--quick``) or when ``--minutes N`` is given.

Each benchmark runs in a process of its own; its markdown section is printed as it finishes. A full run (every
benchmark, not ``--quick``) also writes bench/RESULTS.md with every table, the date, the machine and each target
beside earlier full runs (bench/history.json, to which it appends itself); a quick or ``--only`` run writes a report
only when given ``--output``.
"""

from __future__ import annotations

import argparse
import functools
import json
import multiprocessing
import re
import sys
import time
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

from bench import alerts, anysize, compute, estimate, explain, fleet, ingest, payloads, refused, scale, scrape, soak
from bench.report import Section, history_table, machine, machine_table, quiet_logging, table, verdict

BENCHMARKS: dict[str, Callable[[bool], Section]] = {
    "ingest": ingest.run, "compute": compute.run, "scrape": scrape.run, "alerts": alerts.run, "fleet": fleet.run,
    "refused": refused.run, "scale": scale.run, "estimate": estimate.run, "payloads": payloads.run,
    "anysize": anysize.run, "explain": explain.run, "soak": soak.run}
ON_DEMAND = ("soak",)
"""Run only when named with --only, or (the soak) when --minutes is given: a plain full run stays short."""
RESULTS = Path(__file__).with_name("RESULTS.md")
HISTORY = Path(__file__).with_name("history.json")
"""Every earlier full run's target figures, oldest first: RESULTS.md shows this run's beside them, and a full run
(of every benchmark) appends its own."""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    parser.add_argument("--quick", action="store_true", help="50k events, 10^5 and 10^6 windows, fewer scrapes")
    parser.add_argument("--only", choices=sorted(BENCHMARKS), action="append", help="run only this one (repeatable)")
    parser.add_argument("--output", type=Path, help=f"write the report here (default for a full run of every "
                                                    f"benchmark: {RESULTS}; other runs print only)")
    parser.add_argument("--minutes", type=float, help=f"the soak's length (default {soak.MINUTES:g}, with --quick "
                        f"{soak.QUICK_MINUTES:g}); without --only, adds the soak to the run")  # fmt: skip
    parser.add_argument("--stages", choices=("direct", "staged"), default="direct",
                        help="the soak's path (kafka.stages); staged runs --replicas replicas of one group")
    parser.add_argument("--replicas", type=int, default=1, help="the soak's replicas (staged only; default 1)")
    parser.add_argument("--anysize-rows", type=float, help="rows of the anysize audit (default 10^7; 1e8 for the "
                        "large case, heavy on a shared machine)")
    parser.add_argument("--label", default="run", help=f"this run's name in {HISTORY.name} (a full run appends it)")
    args = parser.parse_args(argv)
    quiet_logging()
    full = not args.quick and args.only is None
    output = args.output or (RESULTS if full else None)  # a partial run never replaces the full record

    sections: list[Section] = []
    started = time.monotonic()
    runners: dict[str, Callable[[bool], Section]] = {
        **BENCHMARKS,
        "soak": functools.partial(soak.run, minutes=args.minutes, stages=args.stages, replicas=args.replicas),
        "anysize": functools.partial(anysize.run, rows=int(args.anysize_rows) if args.anysize_rows else None)}
    chosen = args.only or [n for n in BENCHMARKS if n not in ON_DEMAND or (n == "soak" and args.minutes)]
    for name in chosen:
        print(f"running {name}{' (quick)' if args.quick else ''}...", file=sys.stderr, flush=True)
        section = _isolated(runners[name], args.quick)
        print(section.markdown(), flush=True)
        sections.append(section)
    elapsed = time.monotonic() - started

    if output is not None:
        mode = ("quick run (`python -m bench --quick`)" if args.quick else "full run (`python -m bench`)" if full
                else f"partial run (`python -m bench {' '.join(f'--only {n}' for n in chosen)}`)")
        summary = [(s.title.split(":")[0], target, measured, verdict(met))
                   for s in sections for target, measured, met in s.targets]  # fmt: skip
        earlier = json.loads(HISTORY.read_text())["runs"] if HISTORY.exists() else []
        now = [(bench, target, measured) for bench, target, measured, _ in summary]
        report = [
            "# Benchmark results",
            f"Written by `python -m bench`, a {mode}, in {elapsed / 60:.1f} minutes. The machine is shared and "
            "noisy: compare the ratios (each measured against a baseline in the same run), not the absolute "
            "numbers, across runs.",
            machine_table(),
            "## Targets",
            table(["benchmark", "target", "measured", "verdict"], summary),
            "## Beside earlier runs",
            f"What earlier full runs measured for the same targets ({HISTORY.name}, oldest first; '-': not measured "
            "then). Absolute rates move with the machine's load; the ratios are comparable.",
            history_table(earlier, now),
            *(s.markdown() for s in sections),
            *([] if "soak" in chosen else _soak_sections(output)),
        ]
        output.write_text("\n\n".join(part.strip() for part in report) + "\n")
        print(f"wrote {output}", file=sys.stderr)
        if full:
            run = {"label": args.label, "date": machine()["date"][:10], "targets": {t: m for _, t, m in now}}
            HISTORY.write_text(json.dumps({"runs": [*earlier, run]}, indent=1, ensure_ascii=False) + "\n")
            print(f"appended this run to {HISTORY}", file=sys.stderr)
    return 0


def _isolated(runner: Callable[[bool], Section], quick: bool) -> Section:
    """One benchmark run in a fresh process of its own (spawned, as the daemon starts): what an earlier benchmark
    left in a process (its heap, its threads, the allocator's fragments) is not timed again by the next. In one
    long process the full run of 2026-12-04 18:28 had grown to 5.2 GB of RSS by its late sections, whose
    numpy-heavy targets then read 2.5-5x slower than the same code in processes of their own."""
    with ProcessPoolExecutor(max_workers=1, mp_context=multiprocessing.get_context("spawn"),
                             initializer=quiet_logging) as pool:  # fmt: skip
        return pool.submit(runner, quick).result()


def _soak_sections(path: Path) -> list[str]:
    """The soak sections of the report being replaced: a full run does not run the soak (30 minutes and more, on
    demand), so it keeps the last soak's figures, which say when and how they were made."""
    if not path.exists():
        return []
    kept: list[str] = []
    for part in re.split(r"(?m)^(?=## )", path.read_text()):
        if part.startswith("## Soak"):
            kept.append(part)
    return kept


if __name__ == "__main__":
    sys.exit(main())
