"""The soak's account: the window against the logs, every fault against its counter, the daemon's resources over
the run, the scrapes and the ingest, as one markdown section with its target verdicts."""

from __future__ import annotations

import itertools
from collections import defaultdict
from dataclasses import dataclass

from bench.report import Section, fmt, median, percentile, table
from bench.soak_traffic import DUPLICATE_LABEL_SHARE, MALFORMED, MODELS, STRAY_LABEL_SHARE, Expected, Traffic
from bench.soak_watch import DaemonProcess, Sample, Scrape, SlowRead

SETTLED_SECONDS = 150.0
"""Resource samples of a daemon process younger than this are left out: it is reading back what it missed, and its
label join's memory (pending predictions, ids joined) fills for one label horizon (bench/soak.py: 2 minutes)."""
RSS_DRIFT = 0.10
STALL_SECONDS = 30.0
SCRAPE_P99_SECONDS = 1.0
CONSUMED = "fairness_exporter_events_consumed_total"
RESTORES = "fairness_exporter_state_restores_total"


@dataclass
class Fault:
    kind: str
    at: float
    back: float  # when the daemon or the broker was running again
    replica: str = ""  # the daemon killed


@dataclass
class Run:
    minutes: float
    rate: float
    started: float
    produced: float
    caught_up: bool
    catch_up_seconds: float
    settle_seconds: float  # from the last computation after the catch-up until the models' series stopped changing
    faults: list[Fault]
    traffic: Traffic
    expected: Expected
    final: dict[tuple[str, frozenset[tuple[str, str]]], float]
    owners: dict[str, list[str]]  # model -> the replicas exporting it at the end
    scrapes: list[Scrape]  # of every replica, in time order
    slow: list[SlowRead]
    samples: list[Sample]
    load: list[float]
    daemons: list[DaemonProcess]
    stages: str
    sigterm_exits: list[int]
    partitions: dict[str, int]
    log_tail: str
    restored: int  # daemon starts that restored a checkpoint (its log says so)


def _got(run: Run, name: str, **labels: str) -> float | None:
    return run.final.get((name, frozenset({**labels, "window": "24h"}.items())))


def window_check(run: Run) -> tuple[str, bool, bool, str]:
    """(table, window counts exact, labelled counts exact, mismatches listed)."""
    want, rows, wrong = run.expected, [], []
    exact = {"samples": True, "labelled": True}
    by_attribute: dict[tuple[str, str], list[tuple[str, int, int, int]]] = defaultdict(list)
    for (model, attribute, group), n in want.samples.items():
        by_attribute[(model, attribute)].append((group, n, want.labelled[(model, attribute, group)],
                                                 want.positives[(model, attribute, group)]))  # fmt: skip
    for (model, attribute), groups in by_attribute.items():
        ok = {"samples": 0, "labelled": 0, "positives": 0}
        for group, n, labelled, positives in groups:
            got_n = _got(run, "model_subgroup_samples", model_id=model, attribute=attribute, subgroup=group)
            got_l = _got(run, "model_subgroup_labelled_samples", model_id=model, attribute=attribute, subgroup=group)
            rate = _got(run, "model_positive_prediction_rate", model_id=model, attribute=attribute, subgroup=group)
            got_p = round(rate * got_n) if rate is not None and rate == rate and got_n else 0
            for what, expect, got in (("samples", n, got_n), ("labelled", labelled, got_l),
                                      ("positives", positives, got_p)):  # fmt: skip
                if got == expect:
                    ok[what] += 1
                else:
                    exact["labelled" if what == "labelled" else "samples"] = False
                    wrong.append(f"{model} {attribute}={group} {what}: expected {expect}, got {got}")
        unknown = _got(run, "model_subgroup_unknown_samples", model_id=model, attribute=attribute)
        if unknown != want.unknown[(model, attribute)]:
            exact["samples"] = False
            wrong.append(f"{model} {attribute} unknown: expected {want.unknown[(model, attribute)]}, got {unknown}")
        overall = next(n for g, n, _, _ in groups if g == "overall")
        labelled = next(lab for g, _, lab, _ in groups if g == "overall")
        rows.append((model, attribute, len(groups), f"{overall:,}", f"{labelled:,}",
                     f"{want.unknown[(model, attribute)]:,} / {fmt(unknown or 0)}",
                     f"{ok['samples']}/{len(groups)}", f"{ok['labelled']}/{len(groups)}",
                     f"{ok['positives']}/{len(groups)}"))  # fmt: skip
    text = table(["model", "attribute", "subgroups (+ overall)", "expected samples", "expected labelled",
                  "unknown category expected / got", "samples equal", "labelled equal", "positives equal"], rows)
    return text, exact["samples"], exact["labelled"], "\n".join(f"- {w}" for w in wrong[:20])


def _per_process(run: Run, name: str) -> float:
    """A counter summed over the daemon processes of the run: each one's last value (a restart starts at 0)."""
    last: dict[int | None, float] = {}
    for s in run.scrapes:
        if s.seconds is not None and name in s.values:
            last[s.pid] = s.values[name]
    return sum(last.values())


def _per_process_all(run: Run, family: str) -> dict[str, float]:
    """:func:`_per_process` of every series of a family the scraper kept."""
    names = sorted({n for s in run.scrapes for n in s.values if n.startswith(family + "{")})
    return {n: _per_process(run, n) for n in names}


def _progress(run: Run, replica: str | None = None) -> list[float]:
    """When a daemon's events-consumed counter was seen to move (a new process counts from 0): of one replica, or
    of any."""
    times: list[float] = []
    previous: dict[str, tuple[int | None, float]] = {}
    for s in run.scrapes:
        if s.seconds is None or (replica is not None and s.replica != replica):
            continue
        pid, n = s.pid, s.values.get(CONSUMED, 0.0)
        before = previous.get(s.replica)
        if n > (0.0 if before is None or pid != before[0] else before[1]):
            times.append(s.at)
        previous[s.replica] = (pid, n)
    return times


def _recovered(fault: Fault, progress: list[float]) -> float | None:
    return next((t for t in progress if t > fault.back), None)


def fault_check(run: Run) -> tuple[str, bool]:
    rows, visible = [], True
    ok = [s for s in run.scrapes if s.seconds is not None]
    progress = _progress(run)
    kills = [f for f in run.faults if f.kind == "daemon SIGKILL"]
    resets = sum(1 for d in run.daemons for a, b in itertools.pairwise(s for s in ok if s.replica == d.name)
                 if b.pid != a.pid or b.values.get(CONSUMED, 0) < a.values.get(CONSUMED, 0))  # fmt: skip
    recoveries = [r - f.at for f in kills if (r := _recovered(f, _progress(run, f.replica))) is not None]
    processes = sum(len(d.started) for d in run.daemons)
    visible &= resets >= len(kills) and processes == len(kills) + len(run.daemons)
    restored = (f"{run.restored} of them restored a checkpoint" if run.stages == "direct" else
                "state restored from snapshots: " + ", ".join(f"{k.split('{', 1)[1].rstrip('}')} {n:,.0f}" for k, n
                                                              in _per_process_all(run, RESTORES).items()))
    rows.append((f"daemon SIGKILL x{len(kills)}", f"{processes} daemon processes, {restored}",
                 f"{resets} counter resets seen by the scraper (Prometheus: `resets()`); exit codes "
                 + ", ".join(str(c) for d in run.daemons for c in d.exit_codes), _spread(recoveries)))  # fmt: skip
    for fault in (f for f in run.faults if f.kind == "broker restart"):
        seen = [s for s in ok if fault.at <= s.at <= (_recovered(fault, progress) or fault.back + 60)]
        down = any(s.values.get("fairness_exporter_kafka_connected") == 0 for s in seen)
        before = next((s for s in reversed(ok) if s.at < fault.at), None)
        errors = max((s.values.get("fairness_exporter_consumer_errors_total", 0) for s in seen
                      if before is not None and s.pid == before.pid), default=0.0)  # fmt: skip
        errors -= before.values.get("fairness_exporter_consumer_errors_total", 0) if before else 0
        visible &= down  # kafka-python rides out an outage by itself: consumer_errors_total moves only sometimes
        recovered = _recovered(fault, progress)
        rows.append((f"broker restart at {fault.at - run.started:.0f} s", f"down {fault.back - fault.at:.0f} s",
                     f"kafka_connected 0: {'seen' if down else 'NOT SEEN'}; consumer_errors_total +{errors:.0f}",
                     f"{recovered - fault.at:.0f} s" if recovered else "none"))  # fmt: skip
    malformed = _per_process(run, 'fairness_exporter_events_rejected_total{reason="malformed_json"}')
    bursts = sum(1 for f in run.faults if f.kind == "malformed burst")
    visible &= malformed >= run.expected.malformed
    rows.append((f"malformed bursts x{bursts}", f"{run.expected.malformed:,} malformed records in the log "
                 f"({len(MALFORMED)} kinds)", f'`events_rejected_total{{reason="malformed_json"}}` {malformed:,.0f} '
                 "over the processes (events re-read after a SIGKILL are counted again)", "-"))  # fmt: skip
    for reason in ("invalid_prediction", "missing_field", "invalid_label"):
        n = _per_process(run, f'fairness_exporter_events_rejected_total{{reason="{reason}"}}')
        rows.append((f"invalid events: {reason}", "~0.6% of the events", f"{n:,.0f} counted over the processes",
                     "-"))  # fmt: skip
    ignored = _per_process(run, 'fairness_exporter_events_ignored_total{reason="unconfigured_model"}')
    rows.append(("events of an unmonitored model", "~3% of the events", f"ignored{{unconfigured_model}} {ignored:,.0f}",
                 "-"))  # fmt: skip
    labels = {reason: _per_process(run, f'fairness_exporter_labels_{family}_total{{reason="{reason}"}}')
              for family, reason in (("dropped", "duplicate_label"), ("dropped", "invalid_label_event"),
                                     ("expired", "never_labelled"), ("expired", "unknown_prediction"))}  # fmt: skip
    rows.append(("delayed labels: duplicates, invalid, never sent, of no prediction",
                 f"{DUPLICATE_LABEL_SHARE:.0%} sent twice; {STRAY_LABEL_SHARE:.1%} of the predictions get an invalid "
                 "label event and a label of no prediction; the label of a rejected prediction finds none",
                 f"joined {_per_process(run, 'fairness_exporter_labels_joined_total'):,.0f}; "
                 + ", ".join(f"{reason} {n:,.0f}" for reason, n in labels.items()), "-"))  # fmt: skip
    return table(["fault", "what happened", "what the daemon counted", "time to counting again"], rows), visible


def _spread(values: list[float]) -> str:
    return f"median {median(values):.0f} s, max {max(values):.0f} s" if values else "-"


def _drift(samples: list[Sample], process: str, attr: str) -> tuple[float, float, float]:
    """(median of the first quarter, of the last quarter, max) of the settled samples."""
    values = [getattr(s, attr) for s in samples if s.process == process and s.age >= SETTLED_SECONDS]
    if len(values) < 4:
        return float("nan"), float("nan"), float("nan")
    quarter = len(values) // 4
    return median(values[:quarter]), median(values[-quarter:]), max(values)


def resource_check(run: Run) -> tuple[str, bool]:
    rows, flat = [], True
    for process in dict.fromkeys(s.process for s in run.samples):
        rss = _drift(run.samples, process, "rss_mb")
        fds = _drift(run.samples, process, "open_files")
        threads = _drift(run.samples, process, "threads")
        drift = rss[1] / rss[0] - 1
        flat &= abs(drift) <= RSS_DRIFT and abs(fds[1] - fds[0]) <= 2
        if drift != drift:
            rows.append((process, f"n/a: no process lived past {SETTLED_SECONDS:.0f} s", "", "", "", ""))
            continue
        rows.append((process, f"{rss[0]:.1f} / {rss[1]:.1f} / {rss[2]:.1f} MB", f"{drift:+.1%}",
                     f"{fds[0]:.0f} / {fds[1]:.0f} / {fds[2]:.0f}", f"{fds[1] - fds[0]:+.0f}",
                     f"{threads[0]:.0f} / {threads[1]:.0f} / {threads[2]:.0f}"))  # fmt: skip
    return table(["process", "RSS: first quarter / last quarter / max", "drift", "open files: first / last / max",
                  "drift", "threads: first / last / max"], rows), flat


def scrape_check(run: Run) -> tuple[str, float, float]:
    """(table, scrape p99, longest ingest pause outside the faults)."""
    ok = [s.seconds for s in run.scrapes if s.seconds is not None]
    progress = [t for t in _progress(run) if t <= run.produced]
    windows = [(f.at, _recovered(f, progress) or f.back) for f in run.faults if f.kind != "malformed burst"]
    gaps = [b - a for a, b in itertools.pairwise(progress)
            if not any(start <= b and a <= end for start, end in windows)]  # fmt: skip
    first = next((s.at for s in run.scrapes if s.seconds is not None), float("inf"))  # before: starting up
    failed = [s for s in run.scrapes if s.seconds is None and s.at > first
              and not any(a <= s.at <= b + 5 for a, b in windows)]  # fmt: skip
    rows = [("scrapes every second", f"{len(ok):,} answered; p50 {percentile(ok, 50) * 1000:.0f} ms, p99 "
             f"{percentile(ok, 99) * 1000:.0f} ms, max {max(ok) * 1000:.0f} ms; {len(failed)} failed outside a fault"
             + "".join(f"; at {s.at - run.started:.0f} s: {s.error}" for s in failed[:5])),
            ("slow clients (1 byte / 100 ms, at most 30 s each)", _slow(run.slow)),
            ("consumer lag (messages, summed over the partitions of a replica)", _lag(run)),
            ("ingest", f"counting progressed every {median(gaps):.1f} s (median), longest pause outside a fault "
             f"{max(gaps):.1f} s (the producer sends a batch every 5 s)" if gaps else "no progress seen")]  # fmt: skip
    return table(["what", "seen"], rows), percentile(ok, 99), max(gaps) if gaps else float("inf")


def _lag(run: Run) -> str:
    """The lag over the run, and in its last quarter (bounded lag: no higher there than before), and how soon it
    was 0 again once producing stopped."""
    lags = [(s.at, s.values["lag"]) for s in run.scrapes if s.seconds is not None and s.at <= run.produced]
    if not lags:
        return "not seen"
    late = [lag for at, lag in lags if at >= run.started + (run.produced - run.started) * 0.75]
    zero = next((s.at for s in run.scrapes if s.at > run.produced and s.seconds is not None and s.values["lag"] == 0
                 and s.values["lag_partitions"] > 0), None)  # fmt: skip
    values = [lag for _, lag in lags]
    return (f"median {median(values):,.0f}, p99 {percentile(values, 99):,.0f}, max {max(values):,.0f}; last quarter "
            f"of the run: median {median(late):,.0f}, max {max(late):,.0f}; first 0 "
            + (f"{zero - run.produced:.0f} s after producing stopped" if zero else "never"))  # fmt: skip


def _slow(reads: list[SlowRead]) -> str:
    if not reads:
        return "no request completed"
    parts = []
    for mode in sorted({r.mode for r in reads}):
        mine = [r for r in reads if r.mode == mode]
        ended: dict[str, int] = defaultdict(int)
        for read in mine:
            ended[read.ended] += 1
        parts.append(f"{mode}: {len(mine)} requests, {median([r.seconds for r in mine]):.0f} s and "
                     f"{median([r.received for r in mine]):,.0f} bytes each (median); "
                     + ", ".join(f"{n} {why}" for why, n in sorted(ended.items())))  # fmt: skip
    return "<br>".join(parts)


def report(run: Run) -> Section:
    want, traffic = run.expected, run.traffic
    layout = "" if run.stages == "direct" else f", staged path, {len(run.daemons)} replicas"
    section = Section(f"Soak: {run.minutes:g} minutes at {run.rate:,.0f} events/s{layout} with SIGKILLs, broker "
                      "restarts, slow clients and malformed bursts")  # fmt: skip
    cpu = sum(d.cpu for d in run.daemons)
    owners = "; ".join(f"{m} on {', '.join(r)}" for m, r in run.owners.items())
    command = f"--minutes {run.minutes:g}" + ("" if run.stages == "direct" else
                                              f" --stages {run.stages} --replicas {len(run.daemons)}")
    load = f"mean {sum(run.load) / len(run.load):.1f}, max {max(run.load):.1f}" if run.load else "n/a"
    section.add(f"`python -m bench --only soak {command}` (bench/soak.py). Produced "
                f"{traffic.sent:,} predictions, {traffic.labels_sent:,} label events and {traffic.malformed_sent:,} "
                f"malformed events; the logs read back hold {want.records:,} and {want.label_records:,} records "
                f"({want.duplicated} predictions twice, {want.missing} missing; {len(traffic.failed)} sends failed). "
                f"The daemon {'caught up' if run.caught_up else 'did NOT catch up'} "
                f"{run.catch_up_seconds:.0f} s after producing stopped, and its models' series "
                f"stopped changing {run.settle_seconds:.0f} s later; SIGTERM at the end exited "
                f"{', '.join(str(c) for c in run.sigterm_exits)}. Models at the end: {owners}. The daemon's "
                f"processes used {cpu:,.0f} CPU s ({cpu / max(want.records, 1) * 1e6:.0f} µs per prediction read, "
                "labels included). "
                f"Load average (1 min, 2 cores, shared): {load}.")  # fmt: skip
    windows, samples_exact, labelled_exact, wrong = window_check(run)
    section.add("**The 24h window against the logs** (every subgroup, `overall` and the unknown category; positives "
                "are `model_positive_prediction_rate` x samples):\n\n" + windows + (f"\n\n{wrong}" if wrong else ""))
    faults, visible = fault_check(run)
    section.add("**Every fault and its counter:**\n\n" + faults)
    resources, flat = resource_check(run)
    section.add(f"**Resources** (/proc, every 2 s, from processes at least {SETTLED_SECONDS:.0f} s old; medians of "
                "the first and last quarter of the run):\n\n" + resources)
    scrapes, p99, stall = scrape_check(run)
    section.add("**Scrapes and ingest:**\n\n" + scrapes)
    if not (run.caught_up and samples_exact and labelled_exact):
        section.add("Daemon log, last lines:\n\n```\n" + run.log_tail + "\n```")
    whole = all(len(r) == 1 for r in run.owners.values()) and len(run.owners) == len(MODELS)
    section.target("24h window counts equal the logs (samples, positives, unknown)", "exact" if samples_exact
                   else "DIFFER", samples_exact and run.caught_up and whole)  # fmt: skip
    section.target("labelled counts equal the logs", "exact" if labelled_exact else "DIFFER", labelled_exact)
    section.target("every fault seen in its counter", "yes" if visible else "NO", visible)
    section.target(f"RSS within {RSS_DRIFT:.0%}, open files within 2 (first vs last quarter)",
                   "flat" if flat else "DRIFT", flat)  # fmt: skip
    section.target(f"scrape p99 < {SCRAPE_P99_SECONDS:g} s beside the slow scraper", f"{p99 * 1000:.0f} ms",
                   p99 < SCRAPE_P99_SECONDS)  # fmt: skip
    section.target(f"no ingest pause over {STALL_SECONDS:g} s outside a fault", f"{stall:.1f} s",
                   stall <= STALL_SECONDS)  # fmt: skip
    return section
