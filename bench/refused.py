"""Refused events: the daemon's ingest path against the bare loop when a share of the events is refused.

A producer that sends one field in a type the schema refuses (here ``"prediction": "1"``, a string: rejected as
``invalid_prediction``) must not slow the good events beside it. For each share of refused events (0%, 1%, 10%,
100%), the same events are produced once to a topic of the embedded broker, then drained again and again,
interleaved: (a) the bare kafka-python loop with the source's settings and ``orjson.loads``, (b) the same loop
calling the daemon's ``Ingest.handle`` (decode, validate, count, reject). The ratio (b)/(a) of the best rounds is
the target's measure, as in bench/ingest.py (noise on a shared machine only ever adds time): at least 0.8 at 1% and
10%. The ratio of the medians and that of the process CPU time are shown beside it: on a machine shared with other
work, the median ratio at 10% moved from 0.751 to 0.896 between two runs of the same decoding code, the CPU ratio
by 0.016 (0.881 and 0.897).
"""

from __future__ import annotations

from typing import Any

import orjson
from prometheus_client import CollectorRegistry

from bench.ingest import PARTITIONS, Run, ceiling, config, drain, payloads, produce
from bench.report import Section, fmt, median, standalone, table
from exporter.daemon import Daemon
from exporter.devtools.embedded_broker import EmbeddedBroker

SHARES = (0.0, 0.01, 0.1, 1.0)
TARGET = 0.8


def with_refused(values: list[bytes], share: float) -> list[bytes]:
    """The events, every ``1/share``-th one (spread evenly) with its prediction sent as a string."""
    if not share:
        return values
    out = []
    every = round(1 / share)
    for i, value in enumerate(values):
        if i % every == 0:
            event = orjson.loads(value)
            event["prediction"] = str(event["prediction"])
            value = orjson.dumps(event)
        out.append(value)
    return out


def daemon_drain(broker: EmbeddedBroker, n: int, topic: str, refused: int) -> Run:
    """Loop (a) calling the daemon's ingest; every event counted or rejected as it should be."""
    daemon = Daemon(config(broker.bootstrap_servers, topic=topic), registry=CollectorRegistry())

    def handle(topic: str, partition: int, records: list[Any]) -> None:
        daemon.health.consumed.inc(len(records))
        daemon.ingest.handle(topic, partition, records)

    run = drain(broker, n, handle, topic=topic)
    rejected = daemon.registry.get_sample_value("fairness_exporter_events_rejected_total",
                                                {"reason": "invalid_prediction"})  # fmt: skip
    if rejected != refused:
        raise RuntimeError(f"{rejected} events rejected as invalid_prediction, {refused} sent")
    return run


def run(quick: bool = False) -> Section:
    n = 50_000 if quick else 300_000
    rounds = 3 if quick else 5
    section = Section("Refused events: ingest against the bare loop when a share of the events is refused")
    values = payloads(n)
    rates: dict[float, dict[str, list[float]]] = {s: {"a": [], "b": []} for s in SHARES}
    cpu: dict[float, dict[str, list[float]]] = {s: {"a": [], "b": []} for s in SHARES}
    with EmbeddedBroker() as broker:
        sets = {}
        for share in SHARES:
            topic = f"refused-{share:g}"
            broker.create_topic(topic, PARTITIONS)
            sets[share] = (topic, with_refused(values, share))
            produce(broker.bootstrap_servers, sets[share][1], topic=topic)
            ceiling(broker, n, topic=topic)  # warm-up: a topic's first read is slower than the next ones
        for r in range(rounds):
            for share in SHARES if r % 2 == 0 else reversed(SHARES):
                topic, events = sets[share]
                refused = sum(1 for v in events if b'"prediction":"' in v)
                for path in ("a", "b") if r % 2 == 0 else ("b", "a"):
                    measured = ceiling(broker, n, topic=topic) if path == "a" else \
                        daemon_drain(broker, n, topic, refused)  # fmt: skip
                    rates[share][path].append(n / measured.timing.wall)
                    cpu[share][path].append(measured.timing.cpu)
    rows = []
    ratios = {}
    for share in SHARES:
        a, b = max(rates[share]["a"]), max(rates[share]["b"])
        ratios[share] = b / a
        rows.append((f"{share:.0%}", f"{a:,.0f}", f"{b:,.0f}", fmt(ratios[share]),
                     fmt(median(rates[share]["b"]) / median(rates[share]["a"])),
                     fmt(min(cpu[share]["a"]) / min(cpu[share]["b"]))))  # fmt: skip
    section.add(f"{n:,} events per topic (devtools.synthetic.events), {PARTITIONS} partitions; {rounds} drains per "
                "path, interleaved; best rounds (the target's measure, as in the ingest benchmark), and beside them "
                "the ratio of the medians and of this process's CPU time. (a): bare kafka-python loop, the source's "
                "settings, `orjson.loads`; (b): the same loop calling `Ingest.handle`.")  # fmt: skip
    section.add(table(["refused", "(a) bare loop (events/s, best)", "(b) daemon path (events/s, best)", "(b) / (a)",
                       "(b) / (a), medians", "(a) / (b), CPU s"], rows))  # fmt: skip
    for share in (0.01, 0.1):
        section.target(f"ingest >= {TARGET} of the bare loop with {share:.0%} refused events", fmt(ratios[share]),
                       ratios[share] >= TARGET)  # fmt: skip
    return section


if __name__ == "__main__":
    standalone(run)
