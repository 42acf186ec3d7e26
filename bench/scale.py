"""Scale: ingest throughput of 1, 2 and 4 replicas of the staged path (`kafka.stages: staged`), against one daemon
of the direct path in the same run.

Every replica is a real `fairness-exporter serve` process (bench/replicas.py) on the embedded Tansu broker, one
consumer group per run, on a fresh topic of 4 partitions. Once the group is settled (warm-up events counted, each
input partition held by exactly one replica, each model owned by exactly one), this process produces a fixed
number of events made for the run (COMPAS-like models of bench/fleet.py, round robin over the models and the
partitions, each event its own recent timestamp) with librdkafka's producer, the fastest at hand. The clock runs
from the first send until the models' owners have counted every event in a computation (the counters on their
/metrics, `evaluation_interval: 1s`: a run ends up to 1 s after its last count). The direct daemon is measured
the same way, reading every partition. Runs are interleaved by layout; the table gives each layout's median.

The machine has 2 cores, shared by the broker, the replicas and the producer: more replicas can at best use both
(about 2x one replica's rate); beyond two, they only share the same two cores. The CPU columns (replicas and
broker, per event) show what each layout costs, which the core count does not cap.
"""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass

from confluent_kafka import Producer

from bench.fleet import model_id, model_specs, payloads
from bench.ingest import DRAIN_TIMEOUT, produce
from bench.replicas import Page, Replicas, wait_until
from bench.report import Section, broker_cpu_seconds, fmt, median, standalone, table
from exporter.devtools.embedded_broker import EmbeddedBroker

PARTITIONS = 4
MODELS = 8
REPLICAS = (1, 2, 4)
LAYOUTS = (("direct", 1), *(("staged", n) for n in REPLICAS))
BASE = {"models": model_specs(MODELS), "windows": ["1h", "24h"], "bucket": "1m", "evaluation_interval": "1s"}
WARM_UP = 4 * PARTITIONS * MODELS
"""Events of a warm-up batch, read before the clock starts: a few of every model on every partition."""
SETTLED_SECONDS = 3.0
"""How long the group must hold the same assignment before the events are produced."""


@dataclass(frozen=True)
class Measured:
    seconds: float
    produce_seconds: float
    replica_cpu: float
    broker_cpu: float


def produce_fast(bootstrap: str, values: list[bytes], topic: str) -> float:
    """Send every value (round robin over the partitions) with librdkafka's producer, which sends several times
    faster than kafka-python's, so that producing overlaps the replicas' work as little as it can; the seconds
    until the broker acknowledged all."""
    failed: list[str] = []
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 20, "batch.size": 1_000_000,
                         "queue.buffering.max.messages": 2 * len(values) + 1})  # fmt: skip
    started = time.perf_counter()
    for i, value in enumerate(values):
        producer.produce(topic, value, partition=i % PARTITIONS,
                         on_delivery=lambda error, _: failed.append(str(error)) if error else None)  # fmt: skip
    if producer.flush(DRAIN_TIMEOUT) or failed:
        raise RuntimeError(f"{len(failed)} of {len(values)} sends failed, first: {failed[:1]}")
    return time.perf_counter() - started


COUNTED = ("fairness_predictions_total",)
HELD = ("fairness_exporter_consumer_lag_messages", "fairness_exporter_model_owned")


def counted(pages: list[Page]) -> int:
    """Events counted by the models on these pages (each event counts once per attribute: read `race`)."""
    return int(sum(value for page in pages for (name, labels), value in page.items()
                   if name == "fairness_predictions_total" and ("attribute", "race") in labels))  # fmt: skip


def assignment(pages: list[Page], topic: str) -> tuple[tuple[str, ...], ...]:
    """Per replica, the input partitions it holds and the models it owns."""
    return tuple(tuple(sorted({f"{topic}[{dict(labels)['partition']}]" for (name, labels) in page
                               if name == "fairness_exporter_consumer_lag_messages" and ("topic", topic) in labels}
                              | {dict(labels)["model_id"] for (name, labels), value in page.items()
                                 if name == "fairness_exporter_model_owned" and value == 1}))
                 for page in pages)  # fmt: skip


def settled(replicas: Replicas, topic: str, stages: str, warm_up: Callable[[], int]) -> int:
    """Send ``warm_up`` batches (it returns how many events it sent) until they are counted, each input partition
    is held by exactly one replica, every replica holds one at least and (staged) each model is owned by exactly
    one, unchanged for SETTLED_SECONDS; the events sent. A replica shows a partition it holds once it has read
    from it: hence a batch again every SETTLED_SECONDS until then."""
    models = [model_id(i) for i in range(MODELS)] if stages == "staged" else []
    wanted = sorted([f"{topic}[{p}]" for p in range(PARTITIONS)] + models)
    sent, since, before = warm_up(), time.monotonic(), assignment([], topic)

    def steady() -> bool:
        nonlocal sent, since, before
        pages = replicas.pages(COUNTED + HELD)
        now = assignment(pages, topic)
        if (counted(pages) == sent and sorted(item for items in now for item in items) == wanted and now == before
                and all(any(item.startswith(topic) for item in items) for items in now)):
            return time.monotonic() - since >= SETTLED_SECONDS
        if time.monotonic() - since >= SETTLED_SECONDS:
            sent += warm_up()
        since, before = time.monotonic(), now
        return False

    wait_until(steady, 180, f"{len(replicas.replicas)} replicas to settle on {topic}", 0.5)
    return sent


def measure(broker: EmbeddedBroker, stages: str, n_replicas: int, events: int) -> Measured:
    """One run of ``events`` (and the warm-up before the clock starts, see :func:`settled`), made for it: each
    event's timestamp is recent."""
    topic = f"scale-{uuid.uuid4().hex[:8]}"
    broker.create_topic(topic, partitions=PARTITIONS)
    bootstrap = broker.bootstrap_servers
    with Replicas(n_replicas, BASE, bootstrap, topic, f"bench-{topic}", stages) as replicas:
        warm_up = settled(replicas, topic, stages, lambda: produce(bootstrap, payloads(WARM_UP, MODELS), topic,
                                                                     PARTITIONS) and WARM_UP)  # fmt: skip
        values = payloads(events, MODELS)
        cpu, broker_cpu = replicas.cpu_seconds(), broker_cpu_seconds(broker.pid)
        started = time.perf_counter()
        sent = produce_fast(bootstrap, values, topic)
        total = warm_up + events
        wait_until(lambda: counted(replicas.pages(COUNTED)) >= total, DRAIN_TIMEOUT,
                   f"{events:,} events counted by {n_replicas} {stages} replicas", 0.2)  # fmt: skip
        seconds = time.perf_counter() - started
        found = counted(replicas.pages(COUNTED))
        if found != total:
            raise RuntimeError(f"{n_replicas} {stages} replicas counted {found:,} of {total:,} events")
        return Measured(seconds, sent, replicas.cpu_seconds() - cpu, broker_cpu_seconds(broker.pid) - broker_cpu)


def run(quick: bool = False) -> Section:
    events, rounds = (60_000, 1) if quick else (300_000, 2)
    runs: dict[tuple[str, int], list[Measured]] = {layout: [] for layout in LAYOUTS}
    load = os.getloadavg()[0]
    with EmbeddedBroker() as broker:
        for i in range(rounds):
            for layout in LAYOUTS if i % 2 == 0 else reversed(LAYOUTS):
                runs[layout].append(measure(broker, *layout, events))
    rate = {layout: events / median([m.seconds for m in r]) for layout, r in runs.items()}
    one = rate[("staged", 1)]
    rows = []
    for (stages, n), measured in runs.items():
        rows.append([f"{stages}, {n} replica{'s' if n > 1 else ''}", f"{rate[stages, n]:,.0f}",
                     fmt(rate[stages, n] / one), fmt(rate[stages, n] / rate["direct", 1]),
                     fmt(median([m.replica_cpu for m in measured]) / events * 1e6),
                     fmt(median([m.broker_cpu for m in measured]) / events * 1e6),
                     fmt(median([(m.replica_cpu + m.broker_cpu) / m.seconds for m in measured])),
                     fmt(median([m.produce_seconds for m in measured]))])  # fmt: skip
    cores = len(os.sched_getaffinity(0))
    section = Section("Scale: ingest throughput of 1, 2 and 4 replicas")
    section.add(__doc__.split("\n\n", 1)[1].strip())
    section.add(f"{events:,} events of {MODELS} models, {len(next(iter(runs.values())))} run(s) per layout, "
                f"{cores} cores; load average {load:.1f} before and {os.getloadavg()[0]:.1f} after (other work "
                "on the machine). The producer sends while the replicas read (its time is the last column): "
                "'cores busy' well below the cores means the replicas waited for events or for CPU that other "
                "work held, so the ratios are lower bounds of what the replicas alone would reach.")
    section.add(table(["layout", "events/s", "vs 1 staged replica", "vs the direct daemon",
                       "replicas' CPU (µs/event)", "broker CPU (µs/event)", "cores busy (replicas + broker)",
                       "producing took (s)"], rows))
    section.add(f"One replica is one Python process: its ingest and evaluation hold one GIL, about one core. Two "
                f"replicas can use both of the {cores} cores, which they share with the broker and the producer; "
                f"more replicas share the same {cores}. On this machine no number of replicas can exceed about "
                f"{cores}x one replica's rate; past {cores} replicas a gain comes from overlapping waits ('cores "
                f"busy' rising toward {cores}), not from more cores. On more cores the ceilings are the "
                "input topic's partitions (ingest) and the counts topic's (evaluation: each model on one replica).")
    for n in REPLICAS[1:]:
        ratio = rate["staged", n] / one
        ceiling = min(n, cores)
        section.target(f"{n} staged replicas: events/s >= 1 staged replica's (at most {ceiling}x on {cores} cores)",
                       fmt(ratio), ratio >= 1.0)  # fmt: skip
    return section


if __name__ == "__main__":
    standalone(run)
