"""A KServe v2 body in the Open Inference Protocol's binary tensor data extension (a JSON header whose tensors say
``binary_data_size``, then their raw bytes in order): what the KServe SDK's ``InferInput.set_data_from_numpy`` and
``InferOutput.set_data_from_numpy`` send by default, logged by KServe's logger as it came and put in Kafka by the
CloudEvents SDK's Kafka binding (exporter/stream/payloads/platforms.py ``_json_or_binary``). Found by review 30: such
a request was refused as ``malformed_payload`` and its call never counted."""

from __future__ import annotations

import base64
from collections import Counter
from typing import Any

import pytest
from payload_logs import KSERVE_RECORD, platform_script

from exporter.config import parse_config
from exporter.stream.payloads.pairs import join_units
from exporter.stream.payloads.payload import PairJoin, PayloadRows, Raw, payload_batches, read_halves

SCRIPT = KSERVE_RECORD + r'''
import base64, json, sys
import numpy as np
from cloudevents.http import CloudEvent
from cloudevents.kafka import to_binary
from kserve import InferInput, InferOutput, InferRequest, InferResponse


def body(made):
    found, _ = made.to_rest()
    return found if isinstance(found, bytes) else json.dumps(found).encode()


def call(pid, genders, ages, scores, binary_in, binary_out, datatype):
    g = InferInput("gender", [len(genders), 1], "BYTES")
    g.set_data_from_numpy(np.array([[v] for v in genders], dtype=object), binary_data=binary_in)
    a = InferInput("age", [len(ages), 1], "INT64")
    a.set_data_from_numpy(np.array([[v] for v in ages], dtype=np.int64), binary_data=binary_in)
    o = InferOutput("proba", [len(scores)], datatype)
    o.set_data_from_numpy(np.array(scores, dtype=np.float16 if datatype == "FP16" else np.float32),
                          binary_data=binary_out)
    return body(InferRequest("credit", [g, a], request_id=pid)), body(InferResponse(
        pid, "credit", [o], use_binary_outputs=binary_out))  # as a server answering binary_data_output


out = []
calls = [("call-1", ["male", "female", "female", "male"], [30, 41, 52, 23], [0.75, 0.25, 0.5, 0.875], True, False,
          "FP32"),
         ("call-2", ["female", "ünknown"], [19, 64], [0.125, 0.625], False, True, "FP32"),
         ("call-3", ["male", "female", "male"], [44, 35, 28], [0.9375, 0.0625, 0.5], True, True, "FP16")]
for pid, *rest in calls:
    for kind, payload in zip(("request", "response"), call(pid, *rest)):
        out.append(record(pid, kind, payload))
print(json.dumps(out))
'''


@pytest.fixture(scope="module")
def records(tmp_path_factory: pytest.TempPathFactory) -> list[Raw]:
    made = platform_script(SCRIPT, tmp_path_factory.mktemp("binary"))
    return [(base64.b64decode(r["value"]), [(k, base64.b64decode(v)) for k, v in r["headers"]], None,
             1_796_000_000_000) for r in made]  # fmt: skip


def test_the_sdks_binary_bodies_are_binary(records: list[Raw]) -> None:
    """The SDK's own output: a JSON header that ends before the body does (the records under test are what the
    extension says)."""
    binary = [r[0] for r in records if b'"binary_data_size"' in r[0]]  # type: ignore[operator]
    assert len(binary) == 4  # call 1's request, call 2's response, call 3's both


def test_binary_tensors_are_read_as_their_json_twins(records: list[Raw]) -> None:
    read = read_halves("kserve", "kserve", records, {"credit"})
    assert not read.rejected
    halves = {(h.pair, h.response): h for h in read.halves}
    assert halves["call-1", False].columns == {"gender": ["male", "female", "female", "male"], "age": [30, 41, 52, 23]}
    assert halves["call-2", False].columns == {"gender": ["female", "ünknown"], "age": [19, 64]}
    assert halves["call-3", False].rows == 3 and halves["call-3", False].columns["age"] == [44, 35, 28]
    assert halves["call-1", True].columns == {"proba": [0.75, 0.25, 0.5, 0.875]}
    assert halves["call-2", True].columns == {"proba": [0.125, 0.625]}  # FP32, binary: the same floats
    assert halves["call-3", True].columns == {"proba": [0.9375, 0.0625, 0.5]}  # FP16: only the extension sends it


def test_binary_calls_are_counted(records: list[Raw]) -> None:
    spec = PayloadRows(parse_config({"model_id": "credit", "events": {"format": "kserve", "prediction": "proba",
                                                                      "score_threshold": 0.5},
                                     "protected_attributes": [{"name": "gender", "groups": ["male", "female"]}]}
                                    ).models[0], 300.0)  # fmt: skip
    read = read_halves("kserve", "kserve", records, {"credit"})
    now = 1_796_126_400.0  # the events' time
    pairs = join_units(PairJoin(60.0), [read.halves], now, Counter())
    batches, letters = payload_batches(pairs, {"credit": spec}, now)
    batch = batches["credit"]
    assert not letters and not batch.rejected
    assert batch.predictions.tolist() == [1, 0, 1, 1, 0, 1, 1, 0, 1]
    assert batch.codes["gender"].tolist() == [0, 1, 1, 0, 1, -1, 0, 1, 0]  # ünknown: no group (-1)


def _tampered(records: list[Raw], edit: Any) -> list[Raw]:
    value, headers, key, ms = records[0]
    return [(edit(value), headers, key, ms), *records[1:]]


@pytest.mark.parametrize(("edit", "reason"), [
    (lambda v: v[:-1], "malformed_payload"),  # a tensor's bytes cut short
    (lambda v: v + b"\x00", "malformed_payload"),  # bytes no tensor takes
    (lambda v: v.replace(b"female", b"fem\xffle", 1), "not_utf8"),  # a BYTES element that is no text
    (lambda v: v.replace(b'"binary_data_size":', b'"binary_data_sizes":', 1), "malformed_payload"),  # no size
    (lambda v: v.replace(b"}]}", b"}],}", 1), "malformed_payload"),  # the header no JSON
])  # fmt: skip
def test_a_binary_body_that_breaks_the_extension_is_refused(records: list[Raw], edit: Any, reason: str) -> None:
    assert b'"binary_data_size"' in records[0][0]  # type: ignore[operator]  # call 1's request
    read = read_halves("kserve", "kserve", _tampered(records, edit), {"credit"})
    assert [(r[1], r[3]) for r in read.rejected] == [(reason, "call-1")]


def test_a_zero_row_binary_tensor_with_null_data_is_read_as_none(records: list[Raw]) -> None:
    """The SDK writes a tensor of no rows as ``"data": null`` with ``binary_data_size: 0`` (review 31): no bytes to
    take, no rows, not refused."""
    _, headers, key, ms = records[0]
    body = (b'{"id":"call-1","model_name":"credit","inputs":[{"name":"age","shape":[0,1],"datatype":"INT64",'
            b'"data":null,"parameters":{"binary_data_size":0}}]}')  # fmt: skip
    read = read_halves("kserve", "kserve", [(body, headers, key, ms)], {"credit"})
    assert not read.rejected and read.halves[0].rows == 0 and read.halves[0].columns == {"age": []}
