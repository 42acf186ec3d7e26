"""A client's batch hands over its values and next offset directly: the ingest counts it exactly as the same
records handed over one by one."""

from __future__ import annotations

import importlib.util

import orjson
from daemon_config import event, make_config
from prometheus_client import CollectorRegistry
from tooling import missing

from exporter.daemon import Daemon
from exporter.stream.kafka.client import SimpleRecord, newest_timestamp, values_and_next

T0 = 1_800_000_000.0


def test_a_confluent_batch_is_counted_as_its_records() -> None:
    if importlib.util.find_spec("confluent_kafka") is None:
        missing("confluent-kafka is not installed (pip install 'fairness-exporter[confluent]')")
    import confluent_kafka as ck

    from exporter.stream.kafka.confluent import _Batch

    values = [orjson.dumps(event("male" if i % 3 else "female", ts=T0 - 60 * i, prediction=i % 2,
                                 label=i % 2 if i % 4 == 0 else None)) for i in range(30)]  # fmt: skip
    values += [b"{oops", None, orjson.dumps(event(prediction=2))]
    first = 1000
    stamps = [int(T0 * 1000) - 7 * ((i * 5) % 11) for i in range(len(values))]  # CreateTime: not in offset order
    batch = _Batch([ck.Message(topic="predictions", partition=0, offset=first + i, value=v,  # type: ignore[call-arg]
                               timestamp=(1, ms)) for i, (v, ms) in enumerate(zip(values, stamps, strict=True))])
    records = [SimpleRecord(v, first + i, ms) for i, (v, ms) in enumerate(zip(values, stamps, strict=True))]
    assert values_and_next(batch) == values_and_next(records) == (values, first + len(values))
    assert newest_timestamp(batch) == newest_timestamp(records) == max(stamps) / 1000
    assert newest_timestamp([SimpleRecord(v, i) for i, v in enumerate(values)]) is None  # no timestamps: none
    assert [tuple(r) for r in batch] == [tuple(r) for r in records] and len(batch) == len(records)

    daemons = [Daemon(make_config(), registry=CollectorRegistry(), clock=lambda: T0) for _ in range(2)]
    for daemon, given in zip(daemons, (batch, records), strict=True):
        daemon.ingest.handle("predictions", 0, given)
    (a, b) = daemons
    ta, tb = (d.fleet.models["m1"].store.totals_copy() for d in (a, b))
    assert (ta == tb).all() and ta.sum() > 0
    assert a.fleet.offsets_copy() == b.fleet.offsets_copy() == {("predictions", 0): first + len(values)}
    rejected = [{s.labels["reason"]: s.value for s in m.samples if s.name.endswith("_total")}
                for m in (a.health.rejected.collect()[0], b.health.rejected.collect()[0])]  # fmt: skip
    assert rejected[0] == rejected[1] and rejected[0]["malformed_json"] == 2 and rejected[0]["invalid_prediction"] == 1


def test_a_poll_is_split_by_partition_in_consumed_order() -> None:
    """The one-topic, no-error fast split and the message-by-message one give the same batches. (A message with an
    error cannot be built in Python: its error() leaves an exception set; that path is the message-by-message one.)"""
    if importlib.util.find_spec("confluent_kafka") is None:
        missing("confluent-kafka is not installed (pip install 'fairness-exporter[confluent]')")
    import confluent_kafka as ck

    from exporter.stream.kafka.confluent import _by_partition

    def message(topic: str, partition: int, offset: int) -> ck.Message:
        # error=None: without it, error() of a message built in Python leaves an exception set
        return ck.Message(topic=topic, partition=partition, offset=offset, value=b"%d" % offset,
                          error=None)  # type: ignore[call-arg]

    def split(messages: list[ck.Message]) -> tuple[dict[tuple[str, int], list[int]], list[int]]:
        heard: list[int] = []
        batches = _by_partition(messages, lambda e: heard.append(e.code()))
        return {k: [m.offset() for m in v] for k, v in batches.items()}, heard

    parts = [0, 0, 2, 1, 1, 0, 2, 2, 0]
    one_topic = [message("p", p, i) for i, p in enumerate(parts)]
    want = {("p", 0): [0, 1, 5, 8], ("p", 2): [2, 6, 7], ("p", 1): [3, 4]}
    assert split(one_topic) == (want, []) and list(split(one_topic)[0]) == list(want)
    two_topics = [*one_topic, message("labels", 0, 9), message("p", 1, 10)]
    assert split(two_topics) == ({**want, ("p", 1): [3, 4, 10], ("labels", 0): [9]}, [])
    assert split([]) == ({}, [])
