"""Ingest: the daemon's whole ingest path against bare consumer loops, on the same data in one run.

Produces the events once to a 3-partition topic on the embedded broker (Tansu, a real Kafka-protocol broker),
then drains the topic again and again, interleaving:

(a) a bare kafka-python poll loop with the source's consumer settings that only ``orjson.loads`` each value;
(a') the ceiling of kafka-python: the same bare loop with large fetches (``max_poll_records=10000``,
     ``fetch_max_bytes`` 50 MB, ``max_partition_fetch_bytes`` 10 MB);
(a'') the ceiling of confluent-kafka: a bare ``consume(10000)`` + ``orjson.loads`` loop;
(b) the daemon's ingest path: loop (a) calling ``Daemon.handle`` (decode, validate, count into buckets);
(c) the shipped ``KafkaSource`` thread feeding a Daemon (as in production: lag gauges, periodic commits), and
(d) the same on confluent-kafka; (c) is held against (a'), (d) against (a'').

Plus a micro benchmark without Kafka: ``EventDecoder.decode``, ``WindowStore.add`` and ``Daemon.handle`` against
an ``orjson.loads`` loop over the same payloads, and from both a table of where an event's CPU goes. Tansu's
ListOffsets is unreliable, so nothing here asks for end offsets: a drain stops when it has seen every produced
message.
"""

from __future__ import annotations

import contextlib
import gc
import importlib.util
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, NamedTuple

import orjson
from kafka import KafkaConsumer, KafkaProducer, TopicPartition

from bench.report import Section, Timing, broker_cpu_seconds, fmt, median, package_version, standalone, table
from exporter.config import Config, parse_config
from exporter.core.fairness import PRED_NEG, PRED_POS
from exporter.daemon import Daemon, settle_heap
from exporter.devtools.embedded_broker import EmbeddedBroker
from exporter.devtools.synthetic import AGES, GENDERS, events
from exporter.stream.decode.events import EventDecoder
from exporter.stream.kafka.kafka_python import FETCH_DEFAULTS
from exporter.stream.kafka.source import MAX_RECORDS
from exporter.stream.state.window import WindowStore

TOPIC = "predictions"
PARTITIONS = 3
MICRO_ROUNDS = 5
MICRO_BATCH = 5_000  # about what one 1 MiB partition fetch (kafka-python's default) holds at ~220 bytes/event
DRAIN_TIMEOUT = 300.0
TARGET_RATIO = 0.8
TARGET_RATE = 60_000
TARGET_CONFLUENT_RATE = 200_000
TARGET_DECODER = 1.5
LARGE_FETCH: dict[str, Any] = {"max_poll_records": 10_000, "fetch_max_bytes": 50 * 1024 * 1024,
                               "max_partition_fetch_bytes": 10 * 1024 * 1024}  # fmt: skip
"""The bare kafka-python loop of issue 15: its ceiling with large fetches."""
CONFLUENT_BATCH = 10_000


class _Record(NamedTuple):
    """The two fields of a kafka-python ConsumerRecord that the daemon reads."""

    value: bytes
    offset: int


def crc32c_status() -> str:
    """Whether kafka-python verifies record batches with the C crc32c (it falls back to pure Python)."""
    if importlib.util.find_spec("crc32c") is None:
        return "crc32c NOT installed: kafka-python checks CRCs in pure Python"
    import crc32c
    from kafka.record import util

    in_use = util._crc32c is crc32c.crc32c  # the only way to see which one it picked
    return f"crc32c {package_version('crc32c')} installed, {'used' if in_use else 'NOT used'} by kafka-python"


def config(bootstrap: str, **kafka: Any) -> Config:
    """The default event format's model, with the gender x age_group intersection, windows 1h and 24h."""
    return parse_config({
        "model_id": "hiring-screener-v2",
        "protected_attributes": [{"name": "gender", "groups": list(GENDERS)},
                                 {"name": "age_group", "groups": list(AGES)}],
        "intersections": [["gender", "age_group"]],
        "windows": ["1h", "24h"],
        "bucket": "1m",
        "kafka": {"bootstrap_servers": bootstrap, "topic": TOPIC, **kafka},
        "listen": {"address": "127.0.0.1", "port": 0},
    }, "bench-ingest")  # fmt: skip


def payloads(n: int) -> list[bytes]:
    """n default-format events; each gets its own timestamp within the last minute, as real traffic has, so no
    per-string cache can flatter the decoder."""
    start = time.time() - 60.0
    out = []
    for i, event in enumerate(events(n, seed=20240601)):
        stamp = datetime.fromtimestamp(start + 60.0 * i / n, UTC).isoformat(timespec="microseconds")
        event["timestamp"] = stamp.replace("+00:00", "Z")
        out.append(orjson.dumps(event))
    return out


def produce(bootstrap: str, values: list[bytes], topic: str = TOPIC, partitions: int = PARTITIONS) -> Timing:
    """Send every value (round-robin over the partitions) and wait until the broker acknowledged all."""
    errors: list[BaseException] = []
    producer = KafkaProducer(bootstrap_servers=[bootstrap], linger_ms=20, batch_size=256 * 1024)
    wall, cpu = time.perf_counter(), time.process_time()
    try:
        for i, value in enumerate(values):
            producer.send(topic, value=value, partition=i % partitions).add_errback(errors.append)
        producer.flush(timeout=DRAIN_TIMEOUT)
    finally:
        producer.close(timeout=10)
    if errors:
        raise RuntimeError(f"{len(errors)} of {len(values)} sends failed, first: {errors[0]!r}")
    return Timing(time.perf_counter() - wall, time.process_time() - cpu)


class Run(NamedTuple):
    timing: Timing
    broker_cpu: float
    events: int


class Start(NamedTuple):
    """When a measured path began: wall and CPU time of this process, CPU time of the broker."""

    wall: float
    cpu: float
    broker_cpu: float


def start(broker: EmbeddedBroker) -> Start:
    """Taken before a path creates its consumer: every path, bare loops and shipped sources alike, is timed from
    there, so each pays for connecting and its first metadata round trip."""
    return Start(time.perf_counter(), time.process_time(), broker_cpu_seconds(broker.pid))


def finish(broker: EmbeddedBroker, since: Start, n: int) -> Run:
    timing = Timing(time.perf_counter() - since.wall, time.process_time() - since.cpu)
    return Run(timing, broker_cpu_seconds(broker.pid) - since.broker_cpu, n)


def _timed(broker: EmbeddedBroker, n: int, read_some: Callable[[], int], since: Start) -> Run:
    """Call ``read_some`` (one poll of a bare loop; it returns how many messages it handled) until ``n`` were read,
    timing this process's wall and CPU time and the broker's CPU time from ``since``."""
    seen = 0
    deadline = time.monotonic() + DRAIN_TIMEOUT
    while seen < n:
        if time.monotonic() > deadline:
            raise TimeoutError(f"read {seen} of {n} messages in {DRAIN_TIMEOUT:.0f}s")
        seen += read_some()
    run = finish(broker, since, seen)
    if seen != n:
        raise RuntimeError(f"read {seen} messages, produced {n}")
    return run


def drain(broker: EmbeddedBroker, n: int, on_batch: Callable[[str, int, list[Any]], None], topic: str = TOPIC,
          **settings: Any) -> Run:  # fmt: skip
    """Read the topic from the beginning until ``n`` messages were handed to ``on_batch``; consumer settings as in
    exporter/stream/ (manual assignment, no group: nothing to commit here), or ``settings``."""
    settings = {"max_poll_records": MAX_RECORDS, **FETCH_DEFAULTS, **settings}
    max_records = settings["max_poll_records"]
    since = start(broker)
    consumer = KafkaConsumer(bootstrap_servers=[broker.bootstrap_servers], group_id=None, enable_auto_commit=False,
                             auto_offset_reset="earliest", client_id="bench-ingest", **settings)

    def read_some() -> int:
        seen = 0
        for tp, records in consumer.poll(timeout_ms=500, max_records=max_records).items():
            on_batch(tp.topic, tp.partition, records)
            seen += len(records)
        return seen

    try:
        consumer.assign([TopicPartition(topic, p) for p in range(PARTITIONS)])
        consumer.seek_to_beginning()
        return _timed(broker, n, read_some, since)
    finally:
        consumer.close(autocommit=False)


def counted(daemon: Daemon) -> int:
    """Predictions counted in the daemon's monotonic totals (every event counts once per attribute)."""
    (store,) = (m.store for m in daemon.fleet.models.values())
    totals = store.layout.split(store.totals_copy())["gender"]
    return int(totals[:, PRED_POS].sum() + totals[:, PRED_NEG].sum())


def ceiling(broker: EmbeddedBroker, n: int, topic: str = TOPIC, **settings: Any) -> Run:
    def decode_only(topic: str, partition: int, records: list[Any]) -> None:
        for record in records:
            orjson.loads(record.value)

    return drain(broker, n, decode_only, topic, **settings)


def confluent_fetch() -> dict[str, Any]:
    """The daemon's fetch settings for confluent-kafka (client_confluent.FETCH_DEFAULTS); {} without it."""
    try:
        from exporter.stream.kafka.confluent import FETCH_DEFAULTS
    except ImportError:
        return {}
    return FETCH_DEFAULTS


def confluent_ceiling(broker: EmbeddedBroker, n: int) -> Run:
    """A bare confluent-kafka loop: ``consume(10000)`` and ``orjson.loads`` of each value, nothing else; with the
    daemon's fetch settings for confluent-kafka (client_confluent.FETCH_DEFAULTS), as a user who read them would."""
    import confluent_kafka as ck

    since = start(broker)
    consumer = ck.Consumer({"bootstrap.servers": broker.bootstrap_servers, "group.id": f"bench-{uuid.uuid4().hex[:8]}",
                            "enable.auto.commit": False, "auto.offset.reset": "earliest",
                            **confluent_fetch()})  # fmt: skip
    loads = orjson.loads

    def read_some() -> int:
        seen = 0
        for message in consumer.consume(CONFLUENT_BATCH, 0.5):
            if message.error() is None:
                loads(message.value())
                seen += 1
        return seen

    try:
        consumer.assign([ck.TopicPartition(TOPIC, p, ck.OFFSET_BEGINNING) for p in range(PARTITIONS)])
        return _timed(broker, n, read_some, since)
    finally:
        consumer.close()


def daemon_path(broker: EmbeddedBroker, n: int) -> Run:
    daemon = Daemon(config(broker.bootstrap_servers))

    def handle(topic: str, partition: int, records: list[Any]) -> None:
        daemon.health.consumed.inc(len(records))  # as KafkaSource._poll_once does
        daemon.ingest.handle(topic, partition, records)

    run = drain(broker, n, handle)
    if counted(daemon) != n:
        raise RuntimeError(f"the daemon counted {counted(daemon)} of {n} events")
    return run


@contextlib.contextmanager
def started_heap() -> Iterator[None]:
    """The garbage collector as a started daemon has it (``exporter.daemon.settle_heap``, which ``run_forever`` calls
    once started), for the run of a shipped path; as before afterwards, so that the other paths run as they did."""
    thresholds = gc.get_threshold()
    settle_heap()
    try:
        yield
    finally:
        gc.unfreeze()
        gc.set_threshold(*thresholds)


def shipped_source(broker: EmbeddedBroker, n: int, client_library: str = "kafka-python",
                   client: dict[str, Any] | None = None) -> Run:  # fmt: skip
    """The daemon's own source thread (manual assignment, a fresh group), with the collector as a started daemon
    has it (:func:`started_heap`); timed from start to the last count, so it includes connecting and the first
    metadata round trip."""
    daemon = Daemon(config(broker.bootstrap_servers, assignment="manual", group_id=f"bench-{uuid.uuid4().hex[:8]}",
                           client_library=client_library, client=client or {}))  # fmt: skip
    deadline = time.monotonic() + DRAIN_TIMEOUT
    with started_heap():
        since = start(broker)
        daemon.source.start()
        try:
            while counted(daemon) < n:
                if time.monotonic() > deadline or not daemon.source.alive:
                    raise TimeoutError(f"KafkaSource counted {counted(daemon)} of {n} events")
                time.sleep(0.02)
            run = finish(broker, since, n)
        finally:
            daemon.source.stop()
    if counted(daemon) != n:
        raise RuntimeError(f"KafkaSource counted {counted(daemon)} events, produced {n}")
    return run


MICRO = ("bare `orjson.loads` loop", "`EventDecoder.decode`", "`WindowStore.add` of the decoded batches",
         "`Daemon.handle` (decode + validate + count)",
         "before: the dict-walk decoder (tests/decode_oracle.py, the test oracle)")  # fmt: skip


def oracle_decoder(cfg: Config) -> Any:
    """The decoder this one replaced, kept in tests/ as the test oracle: measured beside it in the same run."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
    try:
        from decode_oracle import OracleDecoder
    finally:
        sys.path.pop(0)
    return OracleDecoder(cfg)


def micro(values: list[bytes]) -> dict[str, list[float]]:
    """CPU seconds per event of the steps of taking the same payloads in, without Kafka, interleaved rounds."""
    cfg = config("127.0.0.1:9")  # never contacted
    decoder = EventDecoder(cfg.model(), cfg.max_future_skew_seconds)
    before = oracle_decoder(cfg)
    daemon = Daemon(cfg)
    store = WindowStore(cfg.model(), cfg.windowing)
    records = [_Record(v, i) for i, v in enumerate(values)]
    batches = [(values[i : i + MICRO_BATCH], records[i : i + MICRO_BATCH]) for i in range(0, len(values), MICRO_BATCH)]
    decoded = [decoder.decode(raw, time.time()) for raw, _ in batches]

    def bare() -> None:
        loads = orjson.loads
        for raw, _ in batches:
            for value in raw:
                loads(value)

    def decode() -> None:
        now = time.time()
        for raw, _ in batches:
            decoder.decode(raw, now)

    def decode_before() -> None:
        now = time.time()
        for raw, _ in batches:
            before.decode(raw, now)

    def count() -> None:
        now = time.time()
        for b in decoded:
            store.add(b.timestamps, b.codes, b.predictions, b.outcomes, now)

    def handle() -> None:
        for _, recs in batches:
            daemon.ingest.handle(TOPIC, 0, recs)

    variants = dict(zip(MICRO, (bare, decode, count, handle, decode_before), strict=True))
    out: dict[str, list[float]] = {name: [] for name in variants}
    # The benchmark's own long-lived objects (every payload and record) would make each garbage collection
    # scan them, a cost the daemon does not have: take them out of the collector's sight while measuring.
    gc.collect()
    gc.freeze()
    try:
        for r in range(MICRO_ROUNDS):
            order = list(variants.items())
            for name, fn in order if r % 2 == 0 else reversed(order):
                start = time.process_time()
                fn()
                out[name].append((time.process_time() - start) / len(values))
        if counted(daemon) != MICRO_ROUNDS * len(values):
            raise RuntimeError("Daemon.handle did not count every event of the micro benchmark")
    finally:
        gc.unfreeze()
    return out


def run(quick: bool = False) -> Section:
    n = 50_000 if quick else 500_000
    rounds = 3 if quick else 5
    section = Section("Ingest: Kafka -> decode -> count")
    values = payloads(n)
    size = sum(map(len, values)) / n
    variants: dict[str, Callable[[EmbeddedBroker, int], Run]] = {
        "(a) bare kafka-python poll (the source's settings) + `orjson.loads`": ceiling,
        "(a') ceiling: bare kafka-python poll, large fetches + `orjson.loads`":
            lambda broker, n: ceiling(broker, n, **LARGE_FETCH),
        "(a'') ceiling: bare confluent-kafka `consume(10000)` + `orjson.loads`": confluent_ceiling,
        "(b) daemon ingest path: loop (a) + `Daemon.handle`": daemon_path,
        "(c) shipped `KafkaSource` thread + `Daemon.handle`": shipped_source,
        "(d) shipped source on confluent-kafka (`kafka.client_library`) + `Daemon.handle`":
            lambda broker, n: shipped_source(broker, n, "confluent-kafka"),
    }
    a, a_large, a_confluent, b, c, d = variants
    names = list(variants)
    runs: dict[str, list[Run]] = {name: [] for name in variants}
    errors: dict[str, str] = {}
    with EmbeddedBroker() as broker:
        broker.create_topic(TOPIC, PARTITIONS)
        produced = produce(broker.bootstrap_servers, values)
        ceiling(broker, n)  # warm-up: the broker's first read of a topic is slower than the next ones
        for r in range(rounds):
            order = list(variants.items())
            for name, fn in order if r % 2 == 0 else reversed(order):
                if name in errors:
                    continue
                try:
                    runs[name].append(fn(broker, n))
                except Exception as exc:  # (c), (d) run the shipped consumer thread: report it as failed, go on
                    if name not in (c, d):
                        raise
                    errors[name] = f"{type(exc).__name__}: {exc}"
    micro_values = values[: 20_000 if quick else 100_000]
    per_event = {name: min(v) for name, v in micro(micro_values).items()}

    def best_rate(name: str) -> float:
        return max(x.events / x.timing.wall for x in runs[name])

    def best_cpu(name: str) -> float:
        return min(x.timing.cpu / x.events * 1e6 for x in runs[name])

    def ratio(name: str, to: str) -> float:
        return best_rate(name) / best_rate(to) if name not in errors else float("nan")

    rows = []
    for name in names:
        if name in errors:
            rows.append((name, "n/a", "n/a", "n/a", "n/a", "n/a", "n/a", f"failed: {errors[name]}"))
            continue
        rates = [x.events / x.timing.wall for x in runs[name]]
        broker_cpu = median([x.broker_cpu / x.events * 1e6 for x in runs[name]])
        ceiling_of = a_confluent if name == d else a_large
        rows.append((name, fmt(best_rate(name)), fmt(median(rates)), fmt(best_cpu(name)), fmt(broker_cpu),
                     fmt(ratio(name, a)), fmt(ratio(name, ceiling_of)), ", ".join(fmt(x) for x in rates)))  # fmt: skip

    section.add(f"{n:,} events of {size:.0f} bytes on average (devtools.synthetic.events, distinct timestamps), "
                f"produced once to {PARTITIONS} partitions of the embedded Tansu broker in {produced.wall:.1f} s "
                f"({n / produced.wall:,.0f} events/s), then drained {rounds} times per path, interleaved, after one "
                f"warm-up drain. Consumer: kafka-python {package_version('kafka-python')}, manual assignment, "
                f"seek_to_beginning, max_poll_records={MAX_RECORDS:,}, {FETCH_DEFAULTS or 'its default fetch sizes'}, "
                f"poll(timeout_ms=500) as "
                f"in exporter/stream/; the large fetches of (a') are {LARGE_FETCH}; (a'') and (d) use the daemon's "
                f"confluent-kafka fetch settings {confluent_fetch()}. {crc32c_status()}. Every path is "
                "timed from the creation of its consumer (connecting and the first metadata round trip included, "
                "bare loops and shipped sources alike) to its last event. (c) and (d) run with the garbage "
                "collector as a started daemon sets it (`exporter.daemon.settle_heap`: start-up's heap frozen, young "
                "collections every 10,000 allocations), the other paths with Python's defaults. Every daemon run is "
                "checked to have "
                "counted every event (store totals). Best = the fastest round "
                "(noise on a shared machine only ever adds time); ratios and targets use the best rounds of both "
                "paths. CPU is this process's, all threads; the broker runs in its own process and its CPU is "
                "shown separately.")  # fmt: skip
    section.add(table(["path", "events/s (best)", "events/s (median)", "CPU s / 10^6 events (best)",
                       "broker CPU s / 10^6", "ratio to (a)", "ratio to its ceiling (a') or (a'')",
                       "every round, events/s"], rows))  # fmt: skip

    bare, dec, add, _, _ = (per_event[name] * 1e6 for name in MICRO)
    micro_rows = [(name, fmt(v * 1e6), fmt(1 / v), fmt(v * 1e6 / bare)) for name, v in per_event.items()]
    section.add(f"Without Kafka: the same payloads ({len(micro_values):,} events, batches of {MICRO_BATCH:,}), "
                f"CPU time per event, best of {MICRO_ROUNDS} interleaved rounds.")  # fmt: skip
    section.add(table(["decode path", "CPU µs / event", "events/s (one core)", "ratio to bare orjson"], micro_rows))

    ceiling_cpu = best_cpu(a)
    budget = [
        ("kafka-python: fetch, parse record batches, build ConsumerRecords", fmt(ceiling_cpu - bare)),
        ("`orjson.loads`", fmt(bare)),
        ("decoder work beyond `orjson.loads` (field access, validation, timestamp parse, encode)", fmt(dec - bare)),
        ("counting into buckets (`WindowStore.add`)", fmt(add)),
        (f"what the daemon may add to the ceiling's CPU at the {TARGET_RATIO} target",
         fmt(ceiling_cpu / TARGET_RATIO - ceiling_cpu)),
    ]  # fmt: skip
    section.add("Where an event's CPU goes, in µs (from the best rounds above; kafka-python's share is the "
                "ceiling's CPU per event minus the bare orjson loop):")  # fmt: skip
    section.add(table(["share", "CPU µs / event"], budget))
    decoder_ratio = dec / bare
    section.target(f"decoder <= {TARGET_DECODER} x the CPU of a bare `orjson.loads` loop", f"{decoder_ratio:.2f}",
                   decoder_ratio <= TARGET_DECODER)  # fmt: skip
    for name, to in ((b, a), (c, a_large), (d, a_confluent)):
        r = ratio(name, to)
        section.target(f"{name.split()[0]} >= {TARGET_RATIO} x {to.split()[0]}", f"{r:.2f}", r >= TARGET_RATIO)
    section.target(f"(b) >= {TARGET_RATE:,} events/s", f"{best_rate(b):,.0f} events/s", best_rate(b) >= TARGET_RATE)
    rate_d = best_rate(d) if d not in errors else float("nan")
    section.target(f"(d) confluent-kafka path >= {TARGET_CONFLUENT_RATE:,} events/s", f"{rate_d:,.0f} events/s",
                   rate_d >= TARGET_CONFLUENT_RATE)  # fmt: skip
    return section


if __name__ == "__main__":
    standalone(run)
