"""KServe payload-log records whose event or body is not the plain one (exporter/stream/payloads/platforms.py
``kserve_event`` / ``kserve_half``, exporter/stream/payloads/oip.py ``json_body``), read through ``read_halves`` as
the daemon reads a poll: each read as KServe means it, or refused under a reason, never raised."""

from __future__ import annotations

import base64
import json
from typing import Any

import orjson
import pytest
from payload_logs import cloudevent

from exporter.stream.payloads.payload import read_halves

T = 1_800_000_000.0
REQUEST = "org.kubeflow.serving.inference.request"
BODY = orjson.dumps({"inputs": [{"name": "sex", "shape": [1], "datatype": "BYTES", "data": ["female"]}]})


def structured(**attributes: Any) -> tuple[bytes, list[tuple[str, bytes]], None, int]:
    """A structured-mode record of KServe's request event with these attributes set (or replaced)."""
    event = {"specversion": "1.0", "id": "call-1", "source": "http://localhost:9081/loans", "type": REQUEST,
             "time": "2027-01-15T08:00:00.123456789Z", "inferenceservicename": "loans", "namespace": "credit",
             "component": "predictor", "endpoint": "", "metadata": "{}", **attributes}  # fmt: skip
    return orjson.dumps(event), [("content-type", b"application/cloudevents+json")], None, 5000


@pytest.mark.parametrize("attributes", [
    {"datacontenttype": 5, "data_base64": base64.b64encode(BODY).decode()},
    {"datacontenttype": "application/json", "contentencoding": 7, "data_base64": base64.b64encode(BODY).decode()},
], ids=["datacontenttype-number", "contentencoding-number"])  # fmt: skip
def test_a_structured_event_whose_content_attributes_are_no_strings_is_refused_not_raised(
    attributes: dict[str, Any],
) -> None:  # fmt: skip
    """A structured event's attributes are any JSON values: a ``datacontenttype`` or ``contentencoding`` that is no
    string is a malformed CloudEvent, refused as ``malformed_payload`` as a bad ``metadata`` or ``id`` is, not an
    error out of the reader (which would fail the poll and skip the record as poison, its partner never dropped)."""
    value, headers, key, ms = structured(**attributes)
    read = read_halves("kserve", "kserve-log", [(value, headers, key, ms)], {"loans"})
    assert read.halves == []
    assert [reason for _, reason, _, _ in read.rejected] == ["malformed_payload"]


@pytest.mark.parametrize("name", ["type", "id", "time", "inferenceservicename", "metadata", "component",
                                  "datacontenttype", "contentencoding", "data", "data_base64"])  # fmt: skip
def test_a_structured_event_attribute_of_any_json_type_is_read_or_refused(name: str) -> None:
    """Each attribute a half is read from, replaced by each kind of JSON value: the record is read, ignored or
    refused under a reason, and nothing raises out of ``read_halves``."""
    for replaced in (5, 1.5, None, True, [], {}, ["x"], {"a": 1}, "", "x", "gzip"):
        attributes = {"data_base64": base64.b64encode(BODY).decode(), "datacontenttype": "application/json",
                      name: replaced}  # fmt: skip
        read = read_halves("kserve", "kserve-log", [structured(**attributes)], {"loans"},
                           counted={"loans": "predictor"})  # fmt: skip
        assert len(read.halves) + len(read.rejected) + sum(read.ignored.values()) == 1, (name, replaced)


def test_a_kserve_v1_request_under_inputs_is_read_as_its_instances() -> None:
    """KServe's v1 protocol takes a request's rows under ``inputs`` as well as ``instances`` (the KServe SDK's
    ``get_predict_input``, kserve/utils/utils.py: ``instances = payload["inputs"] if "inputs" in payload else
    payload["instances"]``, used by the sklearn, xgboost and lightgbm servers), and answers ``{"predictions": ...}``.
    Rows that are no v2 tensors (no name, shape, datatype and data) are read as the instances they are."""
    records = [cloudevent("loans", "call-2", False, orjson.dumps({"inputs": [{"sex": "female", "age": 41},
                                                                            {"sex": "male", "age": 29}]}), T),
               cloudevent("loans", "call-2", True, orjson.dumps({"predictions": [1, 0]}), T)]  # fmt: skip
    read = read_halves("kserve", "kserve-log", [(v, h, k, -1) for v, h, k in records], {"loans"})
    assert [reason for _, reason, _, _ in read.rejected] == []
    request, response = read.halves
    assert (request.rows, request.columns) == (2, {"sex": ["female", "male"], "age": [41, 29]})
    assert (response.rows, response.columns) == (2, {"predictions": [1, 0]})


@pytest.mark.parametrize("rows", [[{"sex": "female", "age": 41}, {"sex": "male", "age": 29}], [["female", 41]],
                                  ["female", "male"]], ids=["records", "lists", "scalars"])  # fmt: skip
def test_v1_rows_under_inputs_are_the_columns_they_are_under_instances(rows: list) -> None:
    """Whichever key a client puts its rows under, KServe reads the same instances: the columns are the same too
    (a list instance's ``instances-<i>``), so that one config reads both."""
    columns = []
    for key in ("inputs", "instances"):
        read = read_halves("kserve", "kserve-log", [(*cloudevent("loans", "c", False, orjson.dumps({key: rows}), T),
                                                     -1)], {"loans"})  # fmt: skip
        columns.append(read.halves[0].columns)
    assert columns[0] == columns[1]


@pytest.mark.parametrize(("inputs", "reason"), [
    (5, "malformed_payload"), ({"sex": "female"}, "malformed_payload"),
    ([{"sex": "female"}, {"age": 41}], "unequal_rows"), ([["female"], "male"], "unequal_rows"),
    ([{"name": "sex", "shape": [1], "datatype": "STRING", "data": ["female"]}], "unknown_datatype"),
    ([{"name": "sex", "shape": [2], "datatype": "BYTES", "data": ["female"]}], "shape_mismatch"),
    ([{"name": "sex", "shape": [1], "datatype": "BYTES", "data": ["female"]}, {"sex": "male"}], "malformed_payload"),
], ids=["number", "object", "v1-unequal-records", "v1-unequal-lists", "v2-datatype", "v2-shape",
        "v2-then-v1"])  # fmt: skip
def test_inputs_that_are_neither_v1_rows_nor_v2_tensors_are_refused(inputs: Any, reason: str) -> None:
    """What the v1 reading must not take: ``inputs`` that are no rows, v1 rows that disagree, and v2 tensors (the
    first a tensor object) that break a tensor rule are refused under their reason, as before."""
    body = orjson.dumps({"inputs": inputs})
    read = read_halves("kserve", "kserve-log", [(*cloudevent("loans", "c", False, body, T), -1)], {"loans"})
    assert (read.halves, [r for _, r, _, _ in read.rejected]) == ([], [reason])


def test_a_v1_cell_nested_deeper_than_a_half_can_be_stored_is_refused_and_the_join_state_stays_writable() -> None:
    """orjson reads 1024 levels of lists and objects but writes 255: a v1 cell 300 lists deep was read, and then
    every checkpoint of the join (``PairJoin.state``) and the staged path's re-keying (``half_json``) raised while
    the half waited. Refused as ``malformed_payload`` instead; a cell of 150 levels is read and stored."""
    from collections import Counter

    from exporter.stream.payloads.payload import PairJoin, half_json, half_of

    def deep(levels: int) -> Any:
        cell: Any = "female"
        for _ in range(levels):
            cell = [cell]
        return cell

    def request(cell: Any, call: str) -> tuple[bytes, list[tuple[str, bytes]], None, int]:
        value, headers, key, ms = structured(id=call, datacontenttype="application/json", data="")
        event = {**orjson.loads(value), "data": {"instances": [{"sex": cell, "income": 1.0}]}}
        return json.dumps(event).encode(), headers, key, ms  # orjson cannot write it: the stdlib can

    read = read_halves("kserve", "kserve-log", [request(deep(300), "deep"), request(deep(150), "nested")],
                       {"loans"})  # fmt: skip
    assert [(reason, call) for _, reason, _, call in read.rejected] == [("malformed_payload", "deep")]
    [half] = read.halves
    assert half.pair == "nested" and half.columns["sex"] == [deep(150)]
    join = PairJoin(600.0)
    assert join.add(half, T, Counter()) is None  # waits for its response
    restored = PairJoin(600.0)
    restored.restore(join.state())
    [(waiting, _)] = restored.pending.values()
    assert waiting.columns["sex"] == [deep(150)]
    assert half_of(orjson.loads(orjson.dumps(half_json(half)))).columns == half.columns
