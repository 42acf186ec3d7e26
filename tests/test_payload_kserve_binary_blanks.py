"""Found by review 31: the binary tensor data extension (exporter/stream/payloads/platforms.py ``_json_or_binary``)
against the KServe SDK's own decoder (``InferRequest.from_bytes`` / ``InferResponse.from_bytes``, in .venv-platforms).

When every byte after the JSON header is JSON whitespace (a UINT8/INT8 tensor of 9, 10, 13 or 32; an INT16 of 8224;
an FP32 whose bytes are 0x20202020, ...), ``orjson.loads`` of the whole body succeeds (trailing whitespace is
allowed), so the body is taken as plain JSON and its ``binary_data_size`` tensors are never given their bytes: a
response is refused as ``malformed_payload``, and a request (whose first tensor then has no ``data``) is read as v1
``instances``, its tensors' own keys becoming columns (``name``, ``shape``, ``datatype``, ``parameters``). The SDK
reads both as the values sent."""

from __future__ import annotations

import base64
from typing import Any

import pytest
from payload_logs import KSERVE_RECORD, platform_script

from exporter.stream.payloads.payload import Raw, read_halves

SCRIPT = KSERVE_RECORD + r"""
import base64, json
import numpy as np
from cloudevents.http import CloudEvent
from cloudevents.kafka import to_binary
from kserve import InferInput, InferOutput, InferRequest, InferResponse



def values(tensors):
    return {t.name: t.as_numpy().reshape(-1).tolist() for t in tensors}


out = []
cases = [("age-32", "UINT8", 32), ("age-10", "INT8", 10), ("code-8224", "INT16", 8224)]
for pid, datatype, value in cases:
    x = InferInput("age", [1, 1], datatype)
    x.set_data_from_numpy(np.array([[value]], dtype=np.dtype(datatype.lower())), binary_data=True)
    body, length = InferRequest("credit", [x], request_id=pid).to_rest()
    assert isinstance(body, bytes) and len(body) > length
    sdk = values(InferRequest.from_bytes(body, length, "credit").inputs)
    out.append({**record(pid, "request", body), "sdk": sdk, "response": False})
    o = InferOutput("predict", [1, 1], datatype)
    o.set_data_from_numpy(np.array([[value]], dtype=np.dtype(datatype.lower())), binary_data=True)
    body, length = InferResponse(pid, "credit", [o], use_binary_outputs=True).to_rest()
    assert isinstance(body, bytes) and len(body) > length
    sdk = values(InferResponse.from_bytes(body, length).outputs)
    out.append({**record(pid, "response", body), "sdk": sdk, "response": True})
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def made(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    return platform_script(SCRIPT, tmp_path_factory.mktemp("blanks"))  # type: ignore[no-any-return]


def _raw(r: dict[str, Any]) -> Raw:
    return (base64.b64decode(r["value"]), [(k, base64.b64decode(v)) for k, v in r["headers"]], None,
            1_796_000_000_000)  # fmt: skip


@pytest.mark.parametrize("at", range(6), ids=[f"{c}-{d}" for c in ("age-32", "age-10", "code-8224")
                                              for d in ("request", "response")])  # fmt: skip
def test_a_binary_body_whose_bytes_are_json_whitespace_is_read_as_the_sdk_reads_it(made: list[dict[str, Any]],
                                                                                   at: int) -> None:  # fmt: skip
    r = made[at]
    value = base64.b64decode(r["value"])
    assert b'"binary_data_size"' in value and value[value.rindex(b"}") + 1 :].strip() == b""  # whitespace only
    read = read_halves("kserve", "kserve", [_raw(r)], {"credit"})
    assert [(x[1], x[3]) for x in read.rejected] == []
    (half,) = read.halves
    assert (half.response, half.rows, half.columns) == (r["response"], 1, r["sdk"])
