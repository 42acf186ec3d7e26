"""Payload records as rows, one behaviour each: tensor naming, the wire forms (structured, gzip, raw contents, a
schema-registry prefix), every bad payload refused under its reason, and the pair join's bounds and counts."""

from __future__ import annotations

import gzip
from collections import Counter
from types import SimpleNamespace

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from payload_logs import cloudevent, numpy_response, pandas_request, seldon_request, seldon_response

from exporter.config import parse_config
from exporter.stream.payloads.oip import BadPayload, json_body, proto_body
from exporter.stream.payloads.payload import PairJoin, PayloadRows, read_halves
from exporter.stream.payloads.platforms import Half, headers_of, kserve_half, seldon_half

T = 1_800_000_000.0


def half(record: tuple, ms: int = -1) -> Half:
    value, headers, _ = record
    return kserve_half(value, headers_of(headers), ms)


def test_a_2d_tensor_is_one_column_per_index_and_a_column_tensor_keeps_its_name() -> None:
    out: dict = {}
    rows, pid = json_body({"id": "r1", "inputs": [
        {"name": "x", "shape": [2, 3], "datatype": "FP32", "data": [[1, 2, 3], [4, 5, 6]]},
        {"name": "gender", "shape": [2, 1], "datatype": "BYTES", "data": ["male", "female"]}]}, False, out)
    assert (rows, pid) == (2, "r1")
    assert out == {"x-0": [1, 4], "x-1": [2, 5], "x-2": [3, 6], "gender": ["male", "female"]}


def test_v1_records_and_lists_and_predictions() -> None:
    out: dict = {}
    assert json_body({"instances": [{"sex": "f", "a": 1}, {"sex": "m", "a": 2}]}, False, out)[0] == 2
    assert out == {"sex": ["f", "m"], "a": [1, 2]}
    out = {}
    json_body({"instances": [[1, 2], [3, 4]]}, False, out)
    assert out == {"instances-0": [1, 3], "instances-1": [2, 4]}
    out = {}
    json_body({"predictions": [1, 0]}, True, out)
    assert out == {"predictions": [1, 0]}


def test_structured_mode_binary_mode_and_gzip_read_the_same_half() -> None:
    body = orjson.dumps(pandas_request({"gender": ["male", "female"], "age": [30, 40]}))
    forms = [cloudevent("m", "id1", False, body, T), cloudevent("m", "id1", False, body, T, structured=True),
             cloudevent("m", "id1", False, gzip.compress(body), T),
             cloudevent("m", "id1", False, gzip.compress(body), T, structured=True)]  # fmt: skip
    halves = [half(f) for f in forms]
    assert {(h.pair, h.response, h.model, h.time, h.rows) for h in halves} == {("id1", False, "m", T, 2)}
    assert all(h.columns == {"gender": ["male", "female"], "age": [30, 40]} for h in halves)


@pytest.mark.parametrize(("body", "headers", "reason"), [
    (b'{"instances": [{"a": 1}]}', [("content-encoding", b"gzip")], "not_gzip"),
    (b"\x1f\x8b not really gzip", [], "not_gzip"),
    (b"{not json", [], "malformed_payload"),
    (orjson.dumps({"inputs": [{"name": "a", "shape": [2], "datatype": "INT64", "data": [1, 2]},
                              {"name": "b", "shape": [3], "datatype": "INT64", "data": [1, 2, 3]}]}), [],
     "unequal_rows"),
    (orjson.dumps({"inputs": [{"name": "a", "shape": [2, 2], "datatype": "INT64", "data": [1, 2, 3]}]}), [],
     "shape_mismatch"),
    (orjson.dumps({"inputs": [{"name": "a", "shape": [1], "datatype": "BYTES", "data": ["bWFsZQ=="],
                               "parameters": {"content_type": "base64"}}]}), [], "base64_bytes"),
    (orjson.dumps({"inputs": [{"name": "a", "shape": [1], "datatype": "STRING", "data": ["x"]}]}), [],
     "unknown_datatype"),
    (orjson.dumps({"inputs": [{"name": "a", "shape": [1], "datatype": ["INT64"], "data": [1]}]}), [],
     "unknown_datatype"),  # once a TypeError (unhashable) out of the decoder
    (orjson.dumps({"instances": [{"a": 1}, {"b": 2}]}), [], "unequal_rows"),
])  # fmt: skip
def test_a_bad_payload_is_refused_under_its_reason(body: bytes, headers: list, reason: str) -> None:
    with pytest.raises(BadPayload) as refused:
        half(cloudevent("m", "id", False, body, T, extra_headers=headers))
    assert refused.value.reason == reason


def test_seldon_raw_and_typed_contents_and_a_schema_registry_prefix() -> None:
    typed = seldon_request("r", {"gender": ["male", "female"], "age": [1, 2]})
    raw = seldon_request("r", {"gender": ["male", "female"], "age": [1, 2]}, raw=True)
    framed = b"\x00\x00\x00\x00\x07\x00" + raw  # magic, schema id 7, message index [0]
    for body in (typed, raw, framed):
        out: dict = {}
        assert proto_body(body, False, out)[:2] == (2, "r")
        assert out == {"gender": ["male", "female"], "age": [1, 2]}
    topic = "seldon.prod.model.income.outputs"
    got = seldon_half(seldon_response("income", "r", "proba", [0.25, 0.75]), {"x-request-id": b"r"}, None, topic, 5000)
    assert (got.pair, got.response, got.model, got.time, got.columns) == ("r", True, "income", 5.0,
                                                                          {"proba": [0.25, 0.75]})  # fmt: skip


def test_the_pair_join_counts_duplicates_refused_partners_and_what_expires() -> None:
    join, counts = PairJoin(horizon=60.0), Counter[str]()
    request = Half("a", False, "m", T, 1, {"g": ["x"]})
    response = Half("a", True, "m", T, 1, {"p": [1]})
    assert join.add(response, 0.0, counts) is None  # the response first: it waits
    assert join.add(response, 1.0, counts) is None
    assert join.add(request, 2.0, counts) == (request, response)
    assert join.add(request, 3.0, counts) is None
    assert counts == {"duplicate_delivery": 2}
    join.refuse("m", "b", 4.0, counts)
    assert join.add(Half("b", True, "m", T, 1, {}), 5.0, counts) is None
    assert counts["partner_refused"] == 1
    join.add(Half("c", False, "m", T, 1, {}), 10.0, counts)  # a failed call: only its request
    orphan = Half("d", True, "m", T, 1, {})
    join.add(orphan, 10.0, counts)
    assert join.expire(69.0, counts) == [] and len(join.pending) == 2
    assert join.expire(71.0, counts) == [orphan]
    assert counts["request_without_response"] == 1 and not join.pending and not join.done


def test_rows_take_the_attribute_column_the_prediction_column_and_the_batch_ids() -> None:
    config = parse_config({"model_id": "m", "events": {"format": "kserve", "prediction": "predict"},
                           "protected_attributes": [{"name": "gender", "groups": ["male", "female"]},
                                                    {"name": "region", "column": "x-region",
                                                     "groups": ["north", "south"]}]})  # fmt: skip
    body = orjson.dumps(pandas_request({"gender": ["male", "female", "other"]}))
    answer = orjson.dumps(numpy_response("m", "r", "predict", [1, 0, 1]))
    request = half(cloudevent("m", "r", False, body, T, metadata={"X-Region": ["south"]}))
    response = half(cloudevent("m", "r", True, answer, T))
    batch, refused = PayloadRows(config.models[0], 300.0).batch([(request, response)], T)
    assert refused == []
    assert batch.prediction_ids == ["r:0", "r:1", "r:2"]
    assert batch.predictions.tolist() == [1, 0, 1]
    assert batch.codes["gender"].tolist() == [0, 1, -1]  # a value outside the groups: unknown, still counted
    assert batch.codes["region"].tolist() == [1, 1, 1]
    wrong = half(cloudevent("m", "r", True, orjson.dumps(numpy_response("m", "r", "predict", [1, 2, 0])), T))
    batch, refused = PayloadRows(config.models[0], 300.0).batch([(request, wrong)], T)
    assert len(batch) == 0 and [reason for _, reason in refused] == ["invalid_prediction"]


def test_records_of_unconfigured_models_are_ignored_and_bad_ones_refused_with_their_call() -> None:
    good = cloudevent("m", "a", False, b'{"instances": [[1]]}', T)
    other = cloudevent("n", "b", False, b'{"instances": [[1]]}', T)
    bad = cloudevent("m", "c", False, b"{oops", T)
    read = read_halves("kserve", "t", [(v, h, k, -1) for v, h, k in (good, other, bad)], {"m"})
    assert [h.pair for h in read.halves] == ["a"]
    assert read.ignored == {"unconfigured_model": 1}
    assert [(reason, model, pid) for _, reason, model, pid in read.rejected] == [("malformed_payload", "m", "c")]


def test_a_payload_format_refuses_the_paths_it_has_no_use_for_and_a_seldon_topic_of_another_name() -> None:
    with pytest.raises(Exception, match=r"events.attributes: not read with events.format kserve"):
        parse_config({"model_id": "m", "events": {"format": "kserve", "attributes": "a"},
                      "protected_attributes": [{"name": "g", "groups": ["a", "b"]}]})  # fmt: skip
    with pytest.raises(Exception, match=r"seldon.<namespace>.model.<name>.inputs"):
        parse_config({"model_id": "m", "events": {"format": "seldon"}, "kafka": {"topic": "predictions"},
                      "protected_attributes": [{"name": "g", "groups": ["a", "b"]}]})  # fmt: skip


json_values = st.recursive(st.none() | st.booleans() | st.integers(-3, 5) | st.floats() | st.text(max_size=4),
                           lambda inner: st.lists(inner, max_size=4) | st.dictionaries(
                               st.sampled_from(["inputs", "outputs", "instances", "predictions", "name", "shape",
                                                "datatype", "data", "parameters", "content_type", "id"]), inner,
                               max_size=5), max_leaves=25)  # fmt: skip


@settings(max_examples=300, deadline=None)
@given(body=json_values, response=st.booleans(), structured=st.booleans())
def test_any_json_body_is_a_half_or_refused_with_a_reason_never_an_exception(body: object, response: bool,
                                                                               structured: bool) -> None:  # fmt: skip
    try:
        got = half(cloudevent("m", "id", response, orjson.dumps(body), T, structured=structured))
    except BadPayload as refused:
        assert refused.reason
    else:
        assert all(len(column) == got.rows for column in got.columns.values())


def test_a_seldon_json_record_says_so_in_its_infer_type_header() -> None:
    body = orjson.dumps({"id": "r", "outputs": [{"name": "proba", "shape": [1], "datatype": "FP64", "data": [0.5]}]})
    got = seldon_half(body, {"seldon-infer-type": b"json/inferModelResponse", "x-request-id": b"r"}, None,
                      "seldon.prod.model.income.outputs", 1000)  # fmt: skip
    assert (got.pair, got.response, got.columns) == ("r", True, {"proba": [0.5]})


def test_a_seldon_outputs_record_is_a_response_whatever_the_copied_request_header_says() -> None:
    """The model gateway copies the request record's headers onto the response (worker.go produce): the topic says
    request or response, the header only protobuf or JSON; JSON with no header is read on either topic."""
    outputs, inputs = "seldon.prod.model.income.outputs", "seldon.prod.model.income.inputs"
    proto = seldon_half(seldon_response("income", "r", "proba", [0.25]), {"x-request-id": b"r", "seldon-infer-type":
                        b"proto/InferModelRequest"}, None, outputs, 1000)  # fmt: skip
    assert (proto.response, proto.columns) == (True, {"proba": [0.25]})
    body = orjson.dumps({"id": "r", "outputs": [{"name": "proba", "shape": [1], "datatype": "FP64", "data": [0.5]}]})
    for headers in ({"seldon-infer-type": b"json/inferModelRequest"}, {}):
        got = seldon_half(body, {"x-request-id": b"r", **headers}, None, outputs, 1000)
        assert (got.response, got.columns) == (True, {"proba": [0.5]})
    request = orjson.dumps(pandas_request({"gender": ["male"]}))
    got = seldon_half(b"  " + request, {}, b"k1", inputs, 1000)  # no header, no x-request-id: the key is the id
    assert (got.pair, got.response, got.columns) == ("k1", False, {"gender": ["male"]})
    custom = seldon_half(body, {"x-request-id": b"r"}, None, "my-responses", 1000, response=True)
    assert custom.response and seldon_half(request, {}, b"k", "my-requests", 1000, response=False).response is False


def test_one_id_through_two_seldon_pipelines_is_two_calls_and_its_rows_keep_the_request_id() -> None:
    topic = "seldon.prod.model.income.inputs"
    body = seldon_request("r", {"gender": ["male"], "age": [1]})
    halves = [seldon_half(body, {"x-request-id": b"r", "pipeline": p}, f"0.{p.decode()}.r".encode(), topic, 1000)
              for p in (b"scoring", b"audit")]  # fmt: skip
    assert [(h.pair, h.id) for h in halves] == [("scoring.r", "r"), ("audit.r", "r")]
    join, counts = PairJoin(horizon=60.0), Counter[str]()
    for h in halves:
        assert join.add(h, 0.0, counts) is None
    assert counts == {} and len(join.pending) == 2


def test_a_call_two_kserve_components_log_meets_within_the_first_one_and_counts_once() -> None:
    join, counts = PairJoin(horizon=60.0), Counter[str]()

    def logged(component: str, response: bool) -> Half:
        return Half("a", response, "m", T, 1, {}, component=component)

    assert join.add(logged("transformer", False), 0.0, counts) is None
    assert join.add(logged("predictor", False), 0.0, counts) is None
    assert join.add(logged("predictor", True), 0.0, counts) is None  # not the transformer's request's partner
    pair = join.add(logged("transformer", True), 0.0, counts)
    assert pair is not None and {h.component for h in pair} == {"transformer"}
    assert join.add(logged("transformer", True), 0.0, counts) is None
    assert counts == {"other_component": 2, "duplicate_delivery": 1}
    restored = PairJoin(horizon=60.0)
    restored.restore(join.state())
    assert restored.add(logged("predictor", True), 1.0, counts) is None and counts["other_component"] == 3


def test_a_response_alone_past_the_horizon_is_rejected_and_a_lone_request_counted_unanswered() -> None:
    from prometheus_client import CollectorRegistry

    from exporter.daemon import Daemon

    now = [T]
    config = parse_config({"model_id": "m", "events": {"format": "kserve", "prediction": "predictions",
                                                       "pair_horizon": "1m"},
                           "protected_attributes": [{"name": "g", "groups": ["a", "b"]}],
                           "kafka": {"assignment": "manual"}})  # fmt: skip
    daemon = Daemon(config, registry=CollectorRegistry(), clock=lambda: now[0])  # never started: no I/O
    lone = [cloudevent("m", "r1", True, b'{"predictions": [1]}', T), cloudevent("m", "r2", False,
                                                                              b'{"instances": [{"g": "a"}]}', T)]
    daemon.ingest.handle("predictions", 0, [SimpleNamespace(value=v, headers=h, key=k, offset=i, timestamp=-1)
                                            for i, (v, h, k) in enumerate(lone)])  # fmt: skip
    now[0] += 61
    daemon.ingest.expire()
    value = daemon.registry.get_sample_value
    assert value("fairness_exporter_events_rejected_total", {"reason": "response_without_request"}) == 1
    assert value("fairness_exporter_payload_halves_unmatched_total", {"reason": "request_without_response"}) == 1
    assert value("fairness_exporter_payload_pairs_joined_total") == 0
