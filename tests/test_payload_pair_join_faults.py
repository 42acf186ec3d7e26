"""The direct path's join of a payload log's halves (exporter/stream/ingest.py ``Ingest.payloads`` and
``Ingest.expire`` over exporter/stream/payloads/payload.py ``PairJoin`` and ``read_halves``) where a call is not the
plain one: an id used again, another component's unreadable log of the call, a refused record identified by its
Kafka key. Driven through a real ``Ingest`` with records as KServe's logger and the KafkaSink write them
(tests/payload_logs.py ``cloudevent``), or as Seldon's gateways do."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import orjson
import pytest
from payload_logs import Record, cloudevent, seldon_request, seldon_response
from prometheus_client import CollectorRegistry

from exporter.config import parse_config
from exporter.health.counters import Health
from exporter.stream.ingest import Ingest
from exporter.stream.state.fleet import Fleet

T0 = 1_800_000_000.0
TOPIC = "kserve-log"


class Direct:
    """A direct daemon's ingest of one KServe payload topic, on a clock the test moves."""

    def __init__(self, events: dict[str, Any] | None = None, horizon: str = "60s") -> None:
        raw = {"kafka": {"bootstrap_servers": "127.0.0.1:1", "topic": TOPIC, "labels_topic": "labels",
                         "assignment": "manual"},
               "events": {"format": "kserve", "pair_horizon": horizon},
               "windows": ["1h"], "bucket": "1m", "evaluation_interval": "1s", "min_samples": 1,
               "models": [{"model_id": "loans", "events": {"prediction": "predictions", **(events or {})},
                           "protected_attributes": [{"name": "gender", "column": "sex",
                                                     "groups": ["male", "female"]}]}]}  # fmt: skip
        config = parse_config(raw)
        self.now = T0
        self.registry = CollectorRegistry()
        self.fleet = Fleet(config)
        self.ingest = Ingest(config, self.fleet, Health(self.registry), lambda: self.now)
        self.offset = 0

    def read(self, records: list[Record]) -> None:
        """One poll of these records (value, headers, key) from partition 0."""
        batch = []
        for value, headers, key in records:
            batch.append(SimpleNamespace(value=value, headers=headers, key=key, timestamp=-1, offset=self.offset))
            self.offset += 1
        self.ingest.payloads([((TOPIC, 0), batch)])

    def sample(self, name: str, **labels: str) -> float:
        return self.registry.get_sample_value(name, labels) or 0.0


def v1_call(pid: str, sex: str, y: int, at: float, component: str = "predictor") -> list[Record]:
    """A v1 call's request and response as KServe's logger puts them on Kafka through a KafkaSink."""
    return [with_component(cloudevent("loans", pid, False, orjson.dumps({"instances": [{"sex": sex}]}), at),
                           component),
            with_component(cloudevent("loans", pid, True, orjson.dumps({"predictions": [y]}), at), component)]


def with_component(record: Record, component: str) -> Record:
    """The record as the ``component`` of the InferenceService logs it (the logger's ``component`` extension)."""
    value, headers, key = record
    return value, [(k, component.encode() if k == "ce_component" else v) for k, v in headers], key


def test_a_call_id_used_again_after_the_horizon_is_a_new_call_on_the_direct_path() -> None:
    """A call joined at once leaves nothing waiting; the join remembers it for a horizon, so that a second delivery
    is a duplicate, and forgets it after: the same id past the horizon (a client that sets ``Ce-Id`` or Seldon's
    ``x-request-id`` itself, a nightly job keyed by customer) is a new call, counted. The scheduled expiry ages the
    calls done while no half waits, as the staged path's and the backtest's do."""
    daemon = Direct(horizon="60s")
    daemon.read(v1_call("customer-17", "female", 1, T0))
    assert daemon.sample("fairness_exporter_payload_pairs_joined_total") == 1
    daemon.now = T0 + 3600  # an hour later: sixty horizons
    daemon.ingest.expire()  # the scheduled expiry ran (nothing was pending)
    daemon.read(v1_call("customer-17", "male", 0, daemon.now))
    assert daemon.sample("fairness_exporter_payload_halves_unmatched_total", reason="duplicate_delivery") == 0
    assert daemon.sample("fairness_exporter_payload_pairs_joined_total") == 2
    assert len(daemon.fleet.pairs.done) == 1  # only the second call is remembered


def test_a_call_delivered_again_within_the_horizon_stays_a_duplicate_after_an_expiry() -> None:
    """The expiry forgets only what is a horizon old: a call delivered again 30 s later, an expiry having run
    between, is still the same call, its halves counted as duplicates and not a second time."""
    daemon = Direct(horizon="60s")
    daemon.read(v1_call("customer-17", "female", 1, T0))
    daemon.now = T0 + 30
    daemon.ingest.expire()
    daemon.read(v1_call("customer-17", "female", 1, T0))
    assert daemon.sample("fairness_exporter_payload_halves_unmatched_total", reason="duplicate_delivery") == 2
    assert daemon.sample("fairness_exporter_payload_pairs_joined_total") == 1


def test_an_unreadable_record_of_the_component_not_counted_is_ignored_and_keeps_the_counted_call() -> None:
    """``events.component: predictor``: the transformer's log of a call is another component's, ignored
    (``events_ignored_total{reason="other_component"}``) whatever its body. A transformer commonly takes a body no
    payload decoder reads (KServe's dataplane ``decode`` hands a non-JSON content type to the model as bytes: an
    image, a CSV), and logs it under the same ``Ce-Id`` as the predictor when the client sent one (the logger's
    ``getOrCreateID``): its record is neither refused nor dead-lettered, and the predictor's call under that id
    counts."""
    daemon = Direct(events={"component": "predictor"})
    pid = "8e2a1f0c-client-ce-id"
    image = with_component(cloudevent("loans", pid, False, b"\xff\xd8\xff\xe0 a JPEG the transformer decodes", T0),
                           "transformer")  # fmt: skip
    answer = with_component(cloudevent("loans", pid, True, orjson.dumps({"predictions": [1]}), T0), "transformer")
    daemon.read([image, *v1_call(pid, "female", 1, T0), answer])
    assert daemon.sample("fairness_exporter_events_rejected_total", reason="malformed_payload") == 0
    assert daemon.sample("fairness_exporter_events_ignored_total", reason="other_component") == 2
    assert daemon.sample("fairness_exporter_payload_halves_unmatched_total", reason="partner_refused") == 0
    assert daemon.sample("fairness_exporter_payload_pairs_joined_total") == 1


@pytest.mark.parametrize("structured", [False, True], ids=["binary", "structured"])
def test_an_unreadable_record_of_the_counted_component_is_still_refused_with_its_partner(structured: bool) -> None:
    """What the component rule must not ignore: the counted component's own record that cannot be read is refused
    (``malformed_payload``), dead-lettered, and its response dropped with it (``partner_refused``), in binary mode and
    in structured mode (where the component is read from the event)."""
    daemon = Direct(events={"component": "predictor"})
    bad = cloudevent("loans", "c9", False, b"{}", T0, structured=structured)
    daemon.read([bad, v1_call("c9", "female", 1, T0)[1]])
    assert daemon.sample("fairness_exporter_events_rejected_total", reason="malformed_payload") == 1
    assert daemon.sample("fairness_exporter_payload_halves_unmatched_total", reason="partner_refused") == 1
    assert daemon.sample("fairness_exporter_events_ignored_total", reason="other_component") == 0


def test_a_structured_record_of_the_component_not_counted_is_ignored_whatever_its_data() -> None:
    """Structured mode names the component inside the event: read from there before its ``data``, so another
    component's event whose data is unreadable is ignored as in binary mode."""
    daemon = Direct(events={"component": "predictor"})
    value, headers, key = cloudevent("loans", "c10", False, b"{}", T0, structured=True)
    event = orjson.loads(value)
    event.update(component="transformer", data="not JSON at all")
    daemon.read([(orjson.dumps(event), headers, key), *v1_call("c10", "female", 1, T0)])
    assert daemon.sample("fairness_exporter_events_rejected_total", reason="malformed_payload") == 0
    assert daemon.sample("fairness_exporter_events_ignored_total", reason="other_component") == 1
    assert daemon.sample("fairness_exporter_payload_pairs_joined_total") == 1


def test_a_refused_seldon_request_keyed_by_its_id_drops_its_response_with_it() -> None:
    """A Seldon record's call id is its ``x-request-id`` header, else its Kafka key: a request produced straight to
    the model's inputs topic keyed by its id, with no header, and its response, which the model gateway writes under
    the same key (scheduler/pkg/kafka/gateway/worker.go ``produce``: ``Key: job.msg.Key``). When the request is
    refused its call is refused by that id, so that the response is dropped with it (``partner_refused``), not left
    to wait a horizon and be rejected and dead-lettered a second time as ``response_without_request``."""
    raw = {"kafka": {"bootstrap_servers": "127.0.0.1:1", "topic": "seldon.prod.model.income.inputs",
                     "labels_topic": "labels", "assignment": "manual"},
           "events": {"format": "seldon", "pair_horizon": "60s"},
           "windows": ["1h"], "bucket": "1m", "evaluation_interval": "1s", "min_samples": 1,
           "models": [{"model_id": "income", "events": {"prediction": "proba", "score_threshold": 0.5},
                       "protected_attributes": [{"name": "gender", "groups": ["male", "female"]}]}]}  # fmt: skip
    config = parse_config(raw)
    registry, now = CollectorRegistry(), [T0]
    ingest = Ingest(config, Fleet(config), Health(registry), lambda: now[0])
    request = bytearray(seldon_request("r9", {"gender": ["female"]}))
    request[request.index(b"female")] = 0xFF  # a BYTES element that is not UTF-8: refused as not_utf8
    inputs, outputs = "seldon.prod.model.income.inputs", "seldon.prod.model.income.outputs"
    for offset, (topic, key, value) in enumerate([
            (inputs, b"r9", bytes(request)), (outputs, b"r9", seldon_response("income", "r9", "proba", [0.8])),
            (inputs, b"r10", seldon_request("r10", {"gender": ["male"]})),  # another call, keyed alike: kept
            (outputs, b"r10", seldon_response("income", "r10", "proba", [0.3]))]):  # fmt: skip
        record = SimpleNamespace(value=value, headers=[], key=key, timestamp=int(T0 * 1000), offset=offset)
        ingest.payloads([((topic, 0), [record])])
    now[0] += 120  # past the horizon
    ingest.expire()

    def sample(name: str, **labels: str) -> float:
        return registry.get_sample_value(name, labels) or 0.0

    assert sample("fairness_exporter_events_rejected_total", reason="not_utf8") == 1
    assert sample("fairness_exporter_payload_halves_unmatched_total", reason="partner_refused") == 1
    assert sample("fairness_exporter_events_rejected_total", reason="response_without_request") == 0
    assert sample("fairness_exporter_payload_pairs_joined_total") == 1


def test_a_payload_log_without_a_labels_topic_still_expires_the_halves_that_wait() -> None:
    """The expiry job is the only thing that gives up a payload half waiting for its partner (a failed call logs
    only its request) and forgets the calls done. ``Daemon.start`` scheduled it only with a labels topic or
    attribute sources, so a Seldon or KServe log without labels kept every unpaired half, and every call id, until
    ``max_pending_labels``: never counted as ``request_without_response``, and a call id used again after the
    horizon counted as a duplicate. It is scheduled whatever the config."""
    from exporter import daemon

    raw = {"kafka": {"bootstrap_servers": "127.0.0.1:1", "topic": "seldon.prod.model.income.inputs",
                     "assignment": "manual"},
           "events": {"format": "seldon", "pair_horizon": "1s"}, "listen": {"address": "127.0.0.1", "port": 0},
           "windows": ["1h"], "bucket": "1m", "evaluation_interval": "1s", "min_samples": 1,
           "models": [{"model_id": "income", "events": {"prediction": "proba", "score_threshold": 0.5},
                       "protected_attributes": [{"name": "gender", "groups": ["male", "female"]}]}]}  # fmt: skip
    registry, now = CollectorRegistry(), [T0]
    running = daemon.Daemon(parse_config(raw), registry=registry, clock=lambda: now[0])
    running.ingest.consume = lambda: None  # type: ignore[method-assign]  # no broker: the records are handed in
    record = SimpleNamespace(value=seldon_request("r1", {"gender": ["female"]}), headers=[("x-request-id", b"r1")],
                             key=None, timestamp=int(T0 * 1000), offset=0)  # fmt: skip
    running.ingest.payloads([(("seldon.prod.model.income.inputs", 0), [record])])
    assert len(running.fleet.pairs.pending) == 1
    running.start()
    try:
        jobs = {job.id for job in running.scheduler.get_jobs()}
    finally:
        running.stop()
    assert "expire" in jobs
    now[0] += 2  # past the horizon
    running.ingest.expire()  # what the job runs
    assert not running.fleet.pairs.pending
    assert registry.get_sample_value("fairness_exporter_payload_halves_unmatched_total",
                                     {"reason": "request_without_response"}) == 1
