"""What every benchmark shares: timing, robust summaries, markdown tables, PASS/MISS verdicts, machine facts.

The machine is small (2 cores) and shared, so absolute numbers drift from run to run. Each benchmark therefore
measures its own baseline in the same run, interleaves the rounds (baseline, subject, subject, baseline, ...)
and reports medians and ratios; the ratios are what to compare across runs.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import logging
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any


@dataclass(frozen=True)
class Timing:
    """Wall-clock and process CPU seconds of one measured run (CPU of every thread of this process)."""

    wall: float
    cpu: float


def quiet_logging() -> None:
    """Warnings and above, and none of kafka-python's below errors: kafka-python 3 warns whenever its IO thread
    waited >100 ms for the GIL, expected while a benchmark keeps the consumer thread busy, and too many lines to read
    past. Set in ``python -m bench`` and in each benchmark's process."""
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    logging.getLogger("kafka").setLevel(logging.ERROR)


def timed(fn: Callable[[], Any]) -> tuple[Any, Timing]:
    """Run ``fn`` once; return its result and how long it took."""
    wall, cpu = time.perf_counter(), time.process_time()
    result = fn()
    return result, Timing(time.perf_counter() - wall, time.process_time() - cpu)


def median(values: Sequence[float]) -> float:
    return statistics.median(values)


def percentile(values: Sequence[float], q: float) -> float:
    """The q-th percentile (0..100) by linear interpolation between closest ranks."""
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    k = (len(ordered) - 1) * q / 100.0
    lo = int(k)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (k - lo)


def verdict(ok: bool) -> str:
    return "PASS" if ok else "MISS"


def fmt(value: float, digits: int = 3) -> str:
    """A number with ``digits`` significant digits, thousands separated when large."""
    if value != value:  # NaN
        return "n/a"
    if abs(value) >= 10 ** digits:
        return f"{value:,.0f}"
    return f"{value:,.{digits}g}"


def table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """A GitHub-flavoured markdown table."""
    cells = [[str(c) for c in row] for row in rows]
    lines = ["| " + " | ".join(headers) + " |", "|" + "|".join(" --- " for _ in headers) + "|"]
    lines += ["| " + " | ".join(row) + " |" for row in cells]
    return "\n".join(lines)


@dataclass
class Section:
    """One benchmark's report: a title, markdown paragraphs and tables, and its target verdicts."""

    title: str
    parts: list[str] = field(default_factory=list)
    targets: list[tuple[str, str, bool]] = field(default_factory=list)
    """(target, measured, met)."""

    def add(self, text: str) -> None:
        self.parts.append(text)

    def target(self, name: str, measured: str, met: bool) -> None:
        self.targets.append((name, measured, met))

    def markdown(self) -> str:
        body = [f"## {self.title}", *self.parts]
        if self.targets:
            body.append(table(["target", "measured", "verdict"],
                              [(name, measured, verdict(met)) for name, measured, met in self.targets]))  # fmt: skip
        return "\n\n".join(body) + "\n"


def history_table(earlier: Sequence[dict[str, Any]], now: Sequence[tuple[str, str, str]]) -> str:
    """Each target of this run beside what earlier full runs measured for it (bench/history.json): ``earlier`` is
    that file's runs, oldest first, ``now`` this run's (benchmark, target, measured)."""
    headers = ["benchmark", "target", *(f"{run['label']} ({run['date']})" for run in earlier), "this run"]
    rows = [(bench, target, *(run["targets"].get(target, "-") for run in earlier), measured)
            for bench, target, measured in now]  # fmt: skip
    return table(headers, rows)


def package_version(name: str) -> str:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


PACKAGES = ("numpy", "pandas", "kafka-python", "crc32c", "orjson", "prometheus-client", "fairlearn")


def machine() -> dict[str, str]:
    """The facts a reader needs to compare this run with another."""
    return {
        "date": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "nproc": str(len(os.sched_getaffinity(0))),
        "cpu": cpu_model(),
        "python": platform.python_version(),
        **{p: package_version(p) for p in PACKAGES},
    }


def machine_table() -> str:
    facts = machine()
    return table(["fact", "value"], list(facts.items()))


def broker_cpu_seconds(pid: int | None) -> float:
    """User + system CPU seconds of another process (the broker), from /proc; NaN when unknown."""
    if pid is None:
        return float("nan")
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return float("nan")
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def standalone(run: Callable[[bool], Section]) -> None:
    """``python -m bench.<name> [--quick]``: run one benchmark and print its section."""
    parser = argparse.ArgumentParser(description=sys.modules["__main__"].__doc__)
    parser.add_argument("--quick", action="store_true", help="a smaller, faster run")
    args = parser.parse_args()
    print(run(args.quick).markdown(), flush=True)
