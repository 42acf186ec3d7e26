"""KServe payload-log records whose event or body is not the plain one (exporter/stream/decode/platforms.py
``kserve_event`` / ``kserve_half``, exporter/stream/decode/oip.py ``json_body``), read through ``read_halves`` as
the daemon reads a poll: each read as KServe means it, or refused under a reason, never raised."""

from __future__ import annotations

import base64
from typing import Any

import orjson
import pytest

from exporter.stream.decode.payload import read_halves

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

