"""Poison events (issue 31 items 1 and 7): no value, and no batch, can stall a partition.

A value nested 10^5 deep made msgspec raise RecursionError, which failed the whole batch: the source read it
again every second, forever, and /readyz blamed the broker. Now one value's failure is its own rejection; a batch
that raises anyway is tried 3 times, then record by record, and a record that fails alone is skipped, counted and
dead-lettered. A timestamp no datetime can name (-1e300) is refused before the window's int64 cast.
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Callable

import numpy as np
import orjson
import pytest
from broker_fixture import produce
from daemon_config import event, make_config
from daemon_fixture import consumed, payloads, sample, scrape, synthetic_rows, wait_for
from prometheus_client import CollectorRegistry
from test_labels_and_checkpoint import T0, Clock, Record, records, value

from exporter.daemon import Daemon
from exporter.devtools.embedded_broker import EmbeddedBroker
from exporter.stream import bounded
from exporter.stream.decode import events as decode_events
from exporter.stream.state.fleet import Fleet
from exporter.stream.state.window import WindowStore

DEPTH = 100_000
GOOD = orjson.dumps(event(ts=T0 - 60))


def deep(where: str) -> bytes:
    """An event with a value nested DEPTH levels deep at ``where`` (the whole value, an unknown field, the model
    id, an attribute, the timestamp)."""
    nested = b"[" * DEPTH + b"]" * DEPTH
    if where == "value":
        return nested
    if where == "unknown field":
        return b'{"extra":' + nested + b"," + GOOD[1:]
    if where == "attribute":
        return GOOD[:-1].replace(b'"attributes":', b'"old":') + b',"attributes":{"gender":' + nested + b"}}"
    key = {"model id": b'"model_id":', "timestamp": b'"timestamp":'}[where]
    return GOOD[:-1].replace(key, b'"old":') + b"," + key + nested + b"}"


ATTRIBUTES = [{"name": "gender", "groups": ["male", "female"]}]
FLEETS = {
    "one model": {},
    "models sharing their paths": {"model_id": None, "models": [
        {"model_id": "m1"}, {"model_id": "m2", "protected_attributes": ATTRIBUTES}]},
    "models routed by id": {"model_id": None, "models": [
        {"model_id": "m1"}, {"model_id": "m2", "protected_attributes": ATTRIBUTES, "events": {"prediction": "p"}}]},
}  # fmt: skip


@pytest.mark.parametrize("fleet", FLEETS)
@pytest.mark.parametrize("where", ["value", "unknown field", "model id", "attribute", "timestamp"])
def test_a_value_nested_too_deep_is_rejected_alone_and_its_neighbours_are_counted(fleet: str, where: str) -> None:
    """Before: RecursionError out of msgspec, for the whole batch (with a value nested under an unknown field, an
    object anywhere, or the router's model id)."""
    decoder = Fleet(make_config(**FLEETS[fleet]))
    for batch in ([deep(where)], [GOOD] * 5 + [deep(where)] + [GOOD] * 5, [GOOD, deep(where), b"{oops", GOOD]):
        _, decoded, ignored, malformed = decoder.decode(batch, T0)
        good = batch.count(GOOD)
        assert (len(decoded["m1"]) if "m1" in decoded else 0) == good
        # one model's decoder rejects what it cannot parse; a fleet's router hands it back as malformed
        rejected = sum(b.rejected["malformed_json"] for b in decoded.values()) + len(malformed)
        assert rejected == len(batch) - good and not ignored


def test_a_value_the_rules_raise_on_is_rejected_as_undecodable_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    """Whatever else one value can make the decoder raise is that value's rejection: a fault injected into the
    rules for one attribute value."""
    real = decode_events.value_text

    def fails_on_7(v: object) -> str:
        if v == 7:
            raise ValueError("injected")
        return real(v)

    monkeypatch.setattr(decode_events, "value_text", fails_on_7)
    poison = orjson.dumps(event(gender=7, ts=T0 - 60))  # type: ignore[arg-type]  # a number: walked by the rules
    batch = Fleet(make_config()).decode([GOOD, poison, GOOD], T0)[1]["m1"]
    assert len(batch) == 2 and dict(batch.rejected) == {"undecodable": 1}


@pytest.mark.parametrize("stamp", [b"-1e300", b"1e300", b"-9.3e18", b"-1e17", b"1e12", b"-1e12", b"253402300800",
                                   b"253402300800.0"])  # fmt: skip
def test_a_timestamp_no_datetime_can_name_is_invalid_before_any_arithmetic(stamp: bytes) -> None:
    """Before: -1e300 reached the window's int64 cast (RuntimeWarning: invalid value encountered in cast) and
    -1e17 was counted as late. Numbers are valid within the years 1..9999, as ISO 8601 strings are."""
    config = make_config()
    raw = GOOD.replace(str(T0 - 60).encode(), stamp)
    store = WindowStore(config.model(), config.windowing)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for batch in ([raw], [GOOD, raw], [GOOD, raw, b"{oops"]):
            decoded = Fleet(config).decode(batch, T0)[1]["m1"]
            assert decoded.rejected["invalid_timestamp"] == 1 and len(decoded) == batch.count(GOOD)
            assert store.add(decoded.timestamps, decoded.codes, decoded.predictions, decoded.outcomes, T0) == 0
    edges = Fleet(config).decode([GOOD.replace(str(T0 - 60).encode(), s) for s in (b"-62135596800", b"0")], T0)
    assert not edges[1]["m1"].rejected  # the first second of year 1 is valid, and late
    last = Fleet(config).decode([GOOD.replace(str(T0 - 60).encode(), b"253402300799.99997")], T0)
    assert dict(last[1]["m1"].rejected) == {"future_timestamp": 1}  # the last second of year 9999 is a time


@pytest.fixture
def no_wait(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(bounded, "RETRY_SECONDS", 0.0)


def test_a_batch_that_raises_is_tried_three_times_then_record_by_record(no_wait: None,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """A fault no value names (injected into the window for events of one timestamp): the batch fails three times,
    its records are then counted one by one and the one that fails alone is skipped, so later batches of the
    partition are counted; the daemon is not ready while the batch fails, and says why."""
    daemon = Daemon(make_config(), registry=CollectorRegistry(), clock=Clock())
    daemon.source.assigned_once.set()
    daemon.source.broker_up = True
    daemon.computer.compute()
    add, seen = WindowStore.add, []

    def add_failing_on_poison(store: WindowStore, timestamps: np.ndarray, *args: object, **kwargs: object) -> int:
        if (timestamps == T0 - 30).any():
            seen.append(daemon.ready())
            raise MemoryError("injected")
        return add(store, timestamps, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(WindowStore, "add", add_failing_on_poison)
    batch = [*[event(ts=T0 - 60, prediction_id=f"a{i}") for i in range(4)], event(ts=T0 - 30),
             *[event(ts=T0 - 60, prediction_id=f"b{i}") for i in range(5)]]  # fmt: skip
    daemon.ingest.handle("predictions", 0, records(batch, start=100))
    daemon.ingest.handle("predictions", 0, records([event(ts=T0 - 60, prediction_id="c")], start=110))
    assert len(seen) == 3 + 1  # three tries of the batch, then the poison record alone
    assert seen[0] == (True, "serving computed metrics")  # the first try, before it failed
    assert seen[1] == (False, "predictions[0] offsets 100..109 cannot be counted (MemoryError: injected); try 1 of "
                              "3, then record by record")  # fmt: skip
    assert daemon.ready() == (True, "serving computed metrics")
    assert value(daemon, "fairness_exporter_batch_failures_total") == 3
    assert value(daemon, "fairness_exporter_records_skipped_total") == 1
    assert value(daemon, "model_subgroup_samples", attribute="gender", window="1h", subgroup="overall") == 10
    assert daemon.fleet.offsets == {("predictions", 0): 111}


def test_a_batch_that_raises_after_it_was_counted_is_not_counted_twice(no_wait: None,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    daemon = Daemon(make_config(), registry=CollectorRegistry(), clock=Clock())
    monkeypatch.setattr(daemon.ingest, "report", lambda *_: (_ for _ in ()).throw(RuntimeError("injected")))
    daemon.ingest.handle("predictions", 0, [Record(GOOD, 7)])
    assert value(daemon, "fairness_exporter_batch_failures_total") == 1  # not tried again
    assert value(daemon, "model_subgroup_samples", attribute="gender", window="1h", subgroup="overall") == 1
    assert value(daemon, "fairness_exporter_records_skipped_total") == 0


def test_a_poison_event_on_the_real_broker_is_rejected_and_the_events_after_it_are_counted(
    kafka_broker: EmbeddedBroker, topic: str, running: Callable[..., Daemon]
) -> None:
    """Before: the batch with the event nested 10^5 deep failed forever; no later event of the partition was
    counted, consumed_total rose by the re-read batch every second and /readyz said "no Kafka broker answers"."""
    daemon = running(kafka_broker.bootstrap_servers, topic)
    produce(kafka_broker.bootstrap_servers, topic, [deep("unknown field")], partition=0)
    produce(kafka_broker.bootstrap_servers, topic, payloads(synthetic_rows(50, seed=31), time.time()), partition=0)
    wait_for(lambda: consumed(daemon.port) >= 51, what="the poison event and the 50 after it")
    daemon.computer.compute()
    s = scrape(daemon.port)
    assert sample(s, "model_subgroup_samples", model_id="m1", attribute="gender", window="1h",
                  subgroup="overall") == 50  # fmt: skip
    assert sample(s, "fairness_exporter_events_consumed_total") == 51  # read once
    assert sample(s, "fairness_exporter_events_rejected_total", reason="malformed_json") == 1
    assert sample(s, "fairness_exporter_consumer_errors_total") == 0
    assert sample(s, "fairness_exporter_batch_failures_total") == 0
    assert daemon.ready() == (True, "serving computed metrics")
