"""Payload-log records exactly as the platforms write them, for the payload tests.

:func:`platform_records` has the platforms' own code make them: MLServer's codecs and protobuf converters, the
KServe SDK and the CloudEvents SDK, run by tests/platform_payloads.py in .venv-platforms (``make test-deps``), as a
subprocess, since they cannot be installed beside this project (both pin protobuf < 7, KServe pandas < 3, while
the project's environment has protobuf 7 and pandas 3; and the two register the same protobuf messages). The
builders below write the same formats by hand, from the platforms' source, for the cases those tests need one
record at a time (bad payloads, gzip, structured mode, dumps): MLServer's
``PandasCodec.encode_request`` (mlserver/codecs/pandas.py: one ``[N, 1]`` input per column, strings as BYTES with
``content_type: str``, the request's ``content_type: pd``) and ``NumpyCodec`` outputs; KServe's payload logger
(pkg/logger/worker.go: ``ce-id`` shared by request and response, ``type`` ``org.kubeflow.serving.inference.request``
/ ``.response``, extensions inferenceservicename, namespace, component, endpoint, metadata); Knative's KafkaSink
(the CloudEvents Kafka binding: binary mode ``ce_*`` headers with ``content-type``, structured mode
``application/cloudevents+json``); Seldon's Kafka gateway (scheduler/pkg/kafka/gateway: protobuf
``ModelInferRequest``/``Response``, key and ``x-request-id`` the request id, headers carried to the outputs).
"""

from __future__ import annotations

import base64
import gzip
import json
import subprocess
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Final

import numpy as np
import orjson
from kafka import KafkaProducer
from tooling import missing

from exporter.stream.payloads.oip import messages

REQUEST = "org.kubeflow.serving.inference.request"
RESPONSE = "org.kubeflow.serving.inference.response"
Record = tuple[bytes | None, list[tuple[str, bytes]], bytes | None]
"""value, headers, key."""


def iso(ts: float) -> str:
    """RFC 3339 with nanoseconds, as Go's CloudEvents SDK writes ``time``."""
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%dT%H:%M:%S.%f") + "000Z"


def pandas_request(columns: dict[str, list[Any]]) -> dict[str, Any]:
    """MLServer's PandasCodec.encode_request of a DataFrame with these columns."""
    inputs = []
    for name, values in columns.items():
        if isinstance(values[0], str):
            inputs.append({"name": name, "shape": [len(values), 1], "datatype": "BYTES",
                           "parameters": {"content_type": "str"}, "data": values})  # fmt: skip
        else:
            datatype = "FP64" if isinstance(values[0], float) else "INT64"
            inputs.append({"name": name, "shape": [len(values), 1], "datatype": datatype, "data": values})
    return {"parameters": {"content_type": "pd"}, "inputs": inputs}


def numpy_response(model: str, pid: str, name: str, values: list[int], datatype: str = "INT64") -> dict[str, Any]:
    """MLServer's response of a NumpyCodec output (an sklearn predict)."""
    return {"model_name": model, "id": pid, "parameters": {},
            "outputs": [{"name": name, "shape": [len(values), 1], "datatype": datatype,
                         "parameters": {"content_type": "np"}, "data": values}]}  # fmt: skip


def cloudevent(model: str, pid: str, response: bool, body: bytes, ts: float, *, structured: bool = False,
               metadata: dict[str, list[str]] | None = None, key: bytes | None = None,
               extra_headers: Sequence[tuple[str, bytes]] = ()) -> Record:  # fmt: skip
    """One KServe logger event as the KafkaSink writes it (binary mode unless ``structured``)."""
    attributes = {"specversion": "1.0", "id": pid, "source": f"http://localhost:9081/{model}",
                  "type": RESPONSE if response else REQUEST, "time": iso(ts), "inferenceservicename": model,
                  "namespace": "fraud", "component": "predictor", "endpoint": "",
                  "metadata": orjson.dumps(metadata or {}).decode()}  # fmt: skip
    if structured:
        event: dict[str, Any] = {**attributes, "datacontenttype": "application/json"}
        if body[:2] == b"\x1f\x8b":
            event["data_base64"] = base64.b64encode(body).decode()
        else:
            event["data"] = orjson.loads(body)
        return orjson.dumps(event), [("content-type", b"application/cloudevents+json"), *extra_headers], key
    headers = [(f"ce_{k}", v.encode()) for k, v in attributes.items()]
    return body, [*headers, ("content-type", b"application/json"), *extra_headers], key


def gzipped(body: bytes) -> bytes:
    return gzip.compress(body)


def seldon_request(pid: str, columns: dict[str, list[Any]], raw: bool = False) -> bytes:
    """A ModelInferRequest as Seldon's gateway puts it on ``.inputs``: one [N, 1] tensor per column, typed
    contents or ``raw_input_contents``."""
    request_type, _, _ = messages()
    request = request_type(model_name="", id=pid)
    for name, values in columns.items():
        text = isinstance(values[0], str)
        tensor = request.inputs.add(name=name, datatype="BYTES" if text else "INT64", shape=[len(values), 1])
        if raw:
            request.raw_input_contents.append(b"".join(len(v.encode()).to_bytes(4, "little") + v.encode()
                                                       for v in values) if text else
                                              np.asarray(values, dtype="<i8").tobytes())  # fmt: skip
        elif text:
            tensor.contents.bytes_contents.extend(v.encode() for v in values)
        else:
            tensor.contents.int64_contents.extend(values)
    return request.SerializeToString()  # type: ignore[no-any-return]


def seldon_response(model: str, pid: str, name: str, values: list[float]) -> bytes:
    """A ModelInferResponse on ``.outputs`` with FP32 scores (typed contents)."""
    _, response_type, _ = messages()
    response = response_type(model_name=model, model_version="1", id=pid)
    tensor = response.outputs.add(name=name, datatype="FP32", shape=[len(values), 1])
    tensor.contents.fp32_contents.extend(values)
    return response.SerializeToString()  # type: ignore[no-any-return]


def send(bootstrap: str, topic: str, records: Sequence[Record], partition: Sequence[int | None] | None = None) -> None:
    """Produce records (value, headers, key) in order, each to its partition (None: by key, as the KafkaSink's
    and the gateway's producers do)."""
    producer = KafkaProducer(bootstrap_servers=bootstrap, linger_ms=5, enable_idempotence=False,
                             reconnect_backoff_max_ms=1000)  # fmt: skip
    try:
        for i, (value, headers, key) in enumerate(records):
            producer.send(topic, value=value, key=key, headers=headers,
                          partition=partition[i] if partition is not None else None)  # fmt: skip
        producer.flush(timeout=30)
    finally:
        producer.close(timeout=5)


PLATFORMS_PYTHON = Path(__file__).resolve().parent.parent / ".venv-platforms" / "bin" / "python"
"""Where ``make test-deps`` installs MLServer and the KServe SDK (Makefile ``PLATFORMS_VENV``)."""
Placed = tuple[str, int | None, Record]
"""A record with its topic and partition (None: by key, as the producer chooses)."""


def platform_records(platform: str, calls: list[dict[str, Any]], workdir: Path) -> list[Placed]:
    """The records of these calls as the platform's own code makes them (tests/platform_payloads.py, in
    .venv-platforms); ``platform``: seldon or kserve."""
    if not PLATFORMS_PYTHON.is_file():
        missing("MLServer and the KServe SDK are not installed (`make test-deps` puts them in .venv-platforms)")
    spec, out = workdir / f"{platform}-calls.json", workdir / f"{platform}-records.jsonl"
    spec.write_text(json.dumps(calls))
    script = Path(__file__).with_name("platform_payloads.py")
    done = subprocess.run([str(PLATFORMS_PYTHON), str(script), platform, str(spec), str(out)], capture_output=True,
                          text=True, timeout=300, check=False)  # fmt: skip
    assert done.returncode == 0, done.stderr

    def unb64(text: str | None) -> bytes | None:
        return None if text is None else base64.b64decode(text)

    placed = []
    for line in out.read_text().splitlines():
        r = json.loads(line)
        headers = [(k, unb64(v) or b"") for k, v in r["headers"]]
        placed.append((r["topic"], r["partition"], (unb64(r["value"]), headers, unb64(r["key"]))))
    return placed


KSERVE_RECORD: Final = r"""
import base64
from cloudevents.http import CloudEvent
from cloudevents.kafka import to_binary


def record(pid, kind, payload):
    event = CloudEvent({"id": pid, "type": f"org.kubeflow.serving.inference.{kind}",
                        "time": "2026-12-01T12:00:00Z", "source": "http://localhost:9081/predictor",
                        "datacontenttype": "application/json", "inferenceservicename": "credit",
                        "namespace": "credit", "component": "predictor", "endpoint": "default",
                        "metadata": "{}"}, payload)
    m = to_binary(event, data_marshaller=lambda d: d)
    return {"value": base64.b64encode(m.value).decode(),
            "headers": [[k, base64.b64encode(v).decode()] for k, v in m.headers.items()]}
"""
"""A function for a script of :func:`platform_script`: a KServe logger event of ``credit``'s predictor as the
CloudEvents SDK's Kafka binding writes it, its value and headers base64-encoded."""


def platform_script(script: str, workdir: Path) -> Any:
    """What a script run with the platforms' own code (.venv-platforms: the KServe SDK, MLServer) prints as JSON on
    its last line."""
    if not PLATFORMS_PYTHON.is_file():
        missing("the KServe SDK is not installed (`make test-deps` puts it in .venv-platforms)")
    path = workdir / "make.py"
    path.write_text(script)
    done = subprocess.run([str(PLATFORMS_PYTHON), str(path)], capture_output=True, text=True, timeout=300,
                          check=False)  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def send_placed(bootstrap: str, records: Sequence[Placed]) -> None:
    """Produce records, each to its topic and partition, in order."""
    producer = KafkaProducer(bootstrap_servers=bootstrap, linger_ms=5, enable_idempotence=False,
                             reconnect_backoff_max_ms=1000)  # fmt: skip
    try:
        for topic, partition, (value, headers, key) in records:
            producer.send(topic, value=value, key=key, headers=headers, partition=partition)
        producer.flush(timeout=30)
    finally:
        producer.close(timeout=5)
