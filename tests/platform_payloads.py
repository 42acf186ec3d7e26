"""Payload-log records made by the platforms' own code, run in .venv-platforms (Makefile) as a subprocess of the
payload tests (tests/payload_logs.py ``platform_records``): MLServer and the KServe SDK pin protobuf and pandas
below the project's, and both register ``inference.*`` protobuf messages, so each runs alone.

``python tests/platform_payloads.py seldon|kserve CALLS.json OUT.jsonl`` reads the calls to make (a JSON list) and
writes one record per line: ``{"topic", "partition", "key", "value", "headers": [[name, value], ...]}``, the bytes
base64-encoded.

- **seldon** (MLServer 1.7): each call's request is ``PandasCodec.encode_request`` of a DataFrame, its response an
  ``InferenceResponse`` of ``NumpyCodec.encode_output`` scores, as protobuf (``ModelInferRequestConverter`` /
  ``ModelInferResponseConverter``, typed or raw contents) or as MLServer's REST JSON. They are written as Seldon's
  gateways write them: the request on ``seldon.<ns>.model.<name>.inputs`` keyed ``<partition>.<pipeline>.<id>``
  (the pipeline gateway since 2.10) with ``x-request-id``, ``pipeline`` and, when asked, ``seldon-infer-type``; the
  response on ``.outputs``, same partition and key, with the request record's headers copied
  (scheduler/pkg/kafka/gateway/worker.go ``produce``).
- **kserve** (KServe SDK 0.16): v2 bodies from ``InferRequest`` / ``InferResponse`` ``to_rest()``, each logged as
  KServe's logger makes its CloudEvent (pkg/logger/worker.go: ``ce-id``, type, time, inferenceservicename,
  namespace, component, endpoint, metadata) and put in a Kafka record by the CloudEvents SDK's Kafka binding
  (binary mode, the KafkaSink's default).
"""

from __future__ import annotations

import base64
import json
import sys
from datetime import UTC, datetime
from typing import Any


def _b64(data: bytes | None) -> str | None:
    return None if data is None else base64.b64encode(data).decode()


def _record(topic: str, partition: int | None, key: bytes | None, value: bytes,
            headers: list[tuple[str, bytes]]) -> dict[str, Any]:  # fmt: skip
    return {"topic": topic, "partition": partition, "key": _b64(key), "value": _b64(value),
            "headers": [[k, _b64(v)] for k, v in headers]}  # fmt: skip


def seldon(calls: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each call: model, namespace, id, pipeline (None: written straight to the inputs topic, keyed by the id),
    partition, columns, scores, headers (x-...), json (REST JSON, else protobuf), typed_header (send
    seldon-infer-type), raw (raw contents)."""
    import numpy as np
    import pandas as pd
    from mlserver.codecs import NumpyCodec, PandasCodec
    from mlserver.grpc.converters import ModelInferRequestConverter, ModelInferResponseConverter
    from mlserver.types import InferenceResponse

    out = []
    for call in calls:
        model, pid, pipeline, partition = call["model"], call["id"], call.get("pipeline"), call["partition"]
        request = PandasCodec.encode_request(pd.DataFrame(call["columns"]))
        request.id = pid
        scores = NumpyCodec.encode_output("proba", np.asarray(call["scores"], dtype=np.float32))
        response = InferenceResponse(model_name=model, model_version="1", id=pid, outputs=[scores])
        if call["json"]:
            body_in, body_out = request.model_dump_json(exclude_none=True), response.model_dump_json(exclude_none=True)
            kind = b"json/inferModelRequest"
            values = body_in.encode(), body_out.encode()
        else:
            raw = call.get("raw", False)
            values = (ModelInferRequestConverter.from_types(request, model_name=model, use_raw=raw).SerializeToString(),
                      ModelInferResponseConverter.from_types(response, use_raw=raw).SerializeToString())  # fmt: skip
            kind = b"proto/InferModelRequest"
        headers = [(k, v.encode()) for k, v in call.get("headers", {}).items()]
        if call.get("typed_header", True):
            headers.append(("seldon-infer-type", kind))
        if pipeline is not None:  # the pipeline gateway: kafkamanager.go infer
            headers += [("pipeline", pipeline.encode()), ("x-request-id", pid.encode())]
            key = f"{partition}.{pipeline}.{pid}".encode()
        else:
            headers.append(("x-request-id", pid.encode()))
            key = pid.encode()
        stem = f"seldon.{call['namespace']}.model.{model}"
        out.append(_record(f"{stem}.inputs", partition, key, values[0], headers))
        out.append(_record(f"{stem}.outputs", partition, key, values[1], list(headers)))  # the request's headers
    return out


def kserve(calls: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each call: model (the InferenceService), topic, id, components (each logs the call: its request and
    response; under ``component_ids`` [its name] when given, as a stock transformer, which does not forward
    ``Ce-Id``, makes its predictor log), columns (name -> values, one [N, 1] tensor each), predictions, metadata
    (logged headers), time."""
    from cloudevents.http import CloudEvent
    from cloudevents.kafka import to_binary
    from kserve import InferInput, InferOutput, InferRequest, InferResponse

    out = []
    for call in calls:
        model, pid, n = call["model"], call["id"], len(call["predictions"])
        inputs = [InferInput(name, [n, 1], "BYTES" if isinstance(values[0], str) else "INT64", data=values)
                  for name, values in call["columns"].items()]  # fmt: skip
        request, _ = InferRequest(model, inputs, request_id=pid).to_rest()
        output = InferOutput("predict", [n], "INT64", data=call["predictions"])
        response, _ = InferResponse(pid, model, [output]).to_rest()
        when = datetime.fromtimestamp(call["time"], UTC)
        for component in call["components"]:
            for kind, body in (("request", request), ("response", response)):
                logged_id = call.get("component_ids", {}).get(component, pid)
                event = CloudEvent({
                    "id": logged_id, "type": f"org.kubeflow.serving.inference.{kind}", "time": when.isoformat(),
                    "source": f"http://localhost:9081/{component}", "datacontenttype": "application/json",
                    "recordedtime": when.isoformat(), "inferenceservicename": model, "namespace": "credit",
                    "component": component, "endpoint": "default",
                    "metadata": json.dumps(call.get("metadata", {}))}, json.dumps(body).encode())  # fmt: skip
                message = to_binary(event, data_marshaller=lambda data: data)
                out.append(_record(call["topic"], None, message.key, message.value, list(message.headers.items())))
    return out


def main() -> None:
    platform, calls, target = sys.argv[1:]
    with open(calls) as f:
        found = json.load(f)
    records = seldon(found) if platform == "seldon" else kserve(found)
    with open(target, "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in records)


if __name__ == "__main__":
    main()
