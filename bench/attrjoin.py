"""Attributes joined by id (``attribute_sources``): the daemon's ingest with the side join against without it, and
the memory of a side table of 10^7 ids.

(a) The default event format's events with their attributes inline, through ``Ingest.handle_poll`` (decode,
validate, count into buckets) in batches of ``BATCH`` records; (b) the same events carrying only ``applicant_id``,
whose gender and age group come from a side table of ``IDS`` ids filled beforehand (every record already there: the
join's usual case), through the same call. Rounds interleave; the ratio (b)/(a) of the best rounds is the target's
measure (at least 0.8; noise on a shared machine only ever adds time), the median and CPU ratios beside it.

The same two through the embedded broker (Tansu), as the daemon reads them: each kind of event produced once to a
3-partition topic, then drained again and again, interleaved, by the source's consumer settings calling
``Ingest.handle`` (bench/ingest.py's loop (b)); the ratio of the best drains is measured the same way.

The table: ``IDS`` ids (10^7; ``--quick``: 10^6) of two fields written into a ``SideTable`` in chunks, as the gate
loads a dataset; its arrays' bytes and the process's resident memory before and after.
"""

from __future__ import annotations

import gc
import resource
import time
from typing import Any, NamedTuple

import numpy as np
import orjson
from prometheus_client import CollectorRegistry

from bench.ingest import PARTITIONS, drain, produce
from bench.report import Section, fmt, median, standalone, table
from exporter.config import parse_config
from exporter.core.side_table import SideTable, id_hashes
from exporter.daemon import Daemon
from exporter.devtools.embedded_broker import EmbeddedBroker
from exporter.devtools.synthetic import AGES, GENDERS, events

BATCH = 5_000
ROUNDS = 7
TARGET = 0.8
IDS = 10_000_000
CHUNK = 1_000_000


class _Record(NamedTuple):
    value: bytes | None
    offset: int
    key: bytes | None = None
    timestamp: int = -1


def _daemon(joined: bool) -> Daemon:
    attributes = [{"name": "gender", "groups": list(GENDERS)}, {"name": "age_group", "groups": list(AGES)}]
    raw: dict[str, Any] = {
        "model_id": "hiring-screener-v2", "windows": ["1h", "24h"], "bucket": "1m",
        "protected_attributes": [{**a, "source": "applicants"} for a in attributes] if joined else attributes,
        "intersections": [["gender", "age_group"]],
        "kafka": {"topic": "predictions"}, "listen": {"address": "127.0.0.1", "port": 0},
    }  # fmt: skip
    if joined:
        raw["attribute_sources"] = {"applicants": {"topic": "applicants", "id": "applicant_id"}}
    return Daemon(parse_config(raw, "bench-attrjoin"), registry=CollectorRegistry())


def _traffic(n: int) -> tuple[list[bytes], list[bytes], list[tuple[bytes, bytes]]]:
    """The events inline, the same with the id only, and the side records (id, {gender, age_group})."""
    inline, by_id, side = [], [], []
    now = time.time()
    for i, event in enumerate(events(n, seed=20240601)):
        event["timestamp"] = now - 60 + 60 * i / n
        inline.append(orjson.dumps(event))
        key = f"applicant-{i:09d}"
        side.append((key.encode(), orjson.dumps(event["attributes"])))
        event["attributes"] = {"applicant_id": key}
        by_id.append(orjson.dumps(event))
    return inline, by_id, side


def _drain(daemon: Daemon, values: list[bytes]) -> tuple[float, float]:
    """Seconds (wall, and this process's CPU) to hand every value to the ingest, ``BATCH`` at a time."""
    polls = [{("predictions", 0): [_Record(v, at + i) for i, v in enumerate(values[at:at + BATCH])]}
             for at in range(0, len(values), BATCH)]  # fmt: skip
    start, cpu = time.perf_counter(), time.process_time()
    for poll in polls:
        daemon.ingest.handle_poll(poll)
    return time.perf_counter() - start, time.process_time() - cpu


def _rss_mib() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize() / 2**20


def table_memory(ids: int) -> tuple[SideTable, float, float, float]:
    """A table of ``ids`` ids, with the seconds it took to load, the MiB of its arrays and the MiB of resident
    memory the process gained (the ids' text is made and dropped a chunk at a time)."""
    gc.collect()
    before = _rss_mib()
    table = SideTable(["gender", "age_group"], ids + 1_000_000)
    rng = np.random.default_rng(1)
    start = time.perf_counter()
    for at in range(0, ids, CHUNK):
        n = min(CHUNK, ids - at)
        hashes = id_hashes([f"person-{i:09d}" for i in range(at, at + n)])  # other ids than the traffic's
        codes = np.column_stack([rng.integers(1, 3, n), rng.integers(1, 4, n)]).astype(np.uint16)
        table.load(hashes, codes)
    seconds = time.perf_counter() - start
    gc.collect()
    return table, seconds, table.nbytes() / 2**20, _rss_mib() - before


def _through_broker(n: int, inline: list[bytes], by_id: list[bytes], side: list[tuple[bytes, bytes]],
                    filled: SideTable) -> dict[str, list[float]]:  # fmt: skip
    """Events/s of each kind drained from the embedded broker into a daemon's ingest, rounds interleaved."""
    rates: dict[str, list[float]] = {"inline": [], "joined": []}
    stamp = int(time.time() * 1000) - 120_000
    with EmbeddedBroker() as broker:
        for name, values in (("inline", inline), ("joined", by_id)):
            broker.create_topic(name, partitions=PARTITIONS)
            produce(broker.bootstrap_servers, values, topic=name)
        for _ in range(ROUNDS // 2 + 1):
            for name in ("inline", "joined"):
                daemon = _daemon(name == "joined")
                if name == "joined":
                    daemon.fleet.attributes.tables["applicants"] = filled
                    daemon.ingest.handle_poll({("applicants", 0): [_Record(v, i, k, stamp)
                                                                   for i, (k, v) in enumerate(side)]})  # fmt: skip
                    filled.merge()

                def handle(topic: str, partition: int, records: list[Any], d: Daemon = daemon) -> None:
                    d.ingest.handle_poll({("predictions", partition): records})

                run = drain(broker, n, handle, topic=name)
                rates[name].append(n / run.timing.wall)
    return rates


def run(quick: bool = False) -> Section:
    n = 50_000 if quick else 200_000
    section = Section("Attributes joined by id: ingest with the side join against without, and a table's memory")
    ids = IDS // 10 if quick else IDS
    filled, seconds, arrays, resident = table_memory(ids)
    inline, by_id, side = _traffic(n)
    rates: dict[str, list[float]] = {"inline": [], "joined": []}
    cpu: dict[str, list[float]] = {"inline": [], "joined": []}
    stamp = int(time.time() * 1000) - 120_000  # the records are older than the predictions, as usual
    for _ in range(ROUNDS):
        plain, joined = _daemon(False), _daemon(True)
        joined.fleet.attributes.tables["applicants"] = filled  # lookups among as many ids as the table holds
        joined.ingest.handle_poll({("applicants", 0): [_Record(v, i, k, stamp)
                                                       for i, (k, v) in enumerate(side)]})  # fmt: skip
        joined.fleet.attributes.tables["applicants"].merge()  # as the first batch after the start-up read would
        for name, daemon, values in (("inline", plain, inline), ("joined", joined, by_id)):
            wall, used = _drain(daemon, values)
            rates[name].append(n / wall)
            cpu[name].append(n / used)
    best = max(rates["joined"]) / max(rates["inline"])
    section.add(table(["path", "best events/s", "median events/s", "best events per CPU second"],
                      [[name, fmt(max(r)), fmt(median(r)), fmt(max(cpu[name]))] for name, r in rates.items()]))
    section.add(f"{n:,} events, {ROUNDS} interleaved rounds, batches of {BATCH:,}; ratio of the best rounds "
                f"{best:.3f}, of the medians {median(rates['joined']) / median(rates['inline']):.3f}, of the best "
                f"CPU rates {max(cpu['joined']) / max(cpu['inline']):.3f}.")  # fmt: skip
    section.target("side join >= 0.8 x inline (handler)", f"{best:.3f}", best >= TARGET)
    broker = _through_broker(n, inline, by_id, side, filled)
    through = max(broker["joined"]) / max(broker["inline"])
    section.add(table(["through the broker", "best events/s", "median events/s"],
                      [[name, fmt(max(r)), fmt(median(r))] for name, r in broker.items()]))  # fmt: skip
    section.add(f"Through the broker: ratio of the best drains {through:.3f}, of the medians "
                f"{median(broker['joined']) / median(broker['inline']):.3f}.")
    section.target("side join >= 0.8 x inline (through the broker)", f"{through:.3f}", through >= TARGET)
    section.add(table(["ids", "load seconds", "table arrays MiB", "resident MiB added", "bytes per id"],
                      [[f"{ids:,}", f"{seconds:.1f}", fmt(arrays), fmt(resident),
                        fmt(resident * 2**20 / ids)]]))  # fmt: skip
    return section


if __name__ == "__main__":
    standalone(run)
