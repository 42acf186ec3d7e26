"""One Kafka record of a serving platform's payload log as one half of a prediction: its id, whether it is the
request or the response, its model, its time and its rows of named columns (exporter/stream/payloads/oip.py).

- **KServe** (``logger:`` on an InferenceService, through a Knative KafkaSink): a CloudEvent per request and per
  response sharing ``ce-id``, ``type`` ``org.kubeflow.serving.inference.request`` / ``.response``, the model in the
  ``inferenceservicename`` extension, the logged request headers as JSON in ``metadata``. Binary content mode (the
  KafkaSink's default): the body is the value, the attributes are ``ce_*`` headers, with ``content-type``.
  Structured mode: the value is the whole event as JSON (``content-type: application/cloudevents+json``), the body
  in ``data`` or ``data_base64``. A gzipped body is unzipped.
- **Seldon Core v2**: ``seldon.<namespace>.model.<name>.inputs`` / ``.outputs`` topics of protobuf
  ``ModelInferRequest`` / ``ModelInferResponse``, or JSON. The topic says request or response (as Seldon's own
  ``seldon pipeline inspect`` reads it): the model gateway copies the request record's headers, its
  ``seldon-infer-type`` included, onto the response it writes (scheduler/pkg/kafka/gateway/worker.go), so that
  header says only protobuf or JSON; a record without it is JSON when it starts with ``{`` (the gateway's "general
  case": it tries protobuf, then JSON). The call's id is the ``x-request-id`` header (else the record key, else the
  message's ``id``); the ``pipeline`` header names the pipeline it came through (the pipeline gateway keys records
  ``<partition>.<pipeline>.<id>`` since 2.10, ``<pipeline>.<id>`` before): the same id through two pipelines is two
  calls of the model. The request record's other headers are columns too.

A record that cannot be read raises :class:`~exporter.stream.payloads.oip.BadPayload` with its reason.
"""

from __future__ import annotations

import base64
import gzip
import json
import zlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

import orjson

from exporter.stream.decode.timestamps import epoch
from exporter.stream.payloads.oip import DATATYPES, BadPayload, Columns, _raw_values, json_body, proto_body
from exporter.stream.payloads.oip import _text as _bytes_text

MAX_BODY_BYTES: Final = 64 * 1024 * 1024
"""An unzipped body larger than this is refused (``payload_too_large``): a small gzip must not fill the memory."""
REQUEST_TYPE: Final = "org.kubeflow.serving.inference.request"
RESPONSE_TYPE: Final = "org.kubeflow.serving.inference.response"
STRUCTURED: Final = "application/cloudevents+json"
"""The ``content-type`` of a structured-mode CloudEvent record (the whole event as JSON)."""
SELDON_TYPES: Final = {"proto/InferModelRequest": False, "proto/InferModelResponse": False,
                       "json/inferModelRequest": True, "json/inferModelResponse": True}  # fmt: skip
"""Seldon's ``seldon-infer-type`` header: whether the body is JSON (on an ``.outputs`` record it is the request's
header, copied: it never says the record is a response)."""
SELDON_RESERVED: Final = frozenset({"x-request-id", "seldon-infer-type", "traceparent", "tracestate",
                                    "seldon-pipeline-errors", "pipeline", "x-pipeline-version"})  # fmt: skip
"""Seldon record headers that are plumbing, never columns."""

_OPTIONAL_TEXT: Final = frozenset({str, type(None)})
"""The types of a CloudEvent attribute that is text, or absent."""
_NAMES: Final = ("type", "id", "inferenceservicename", "time", "metadata", "contentencoding", "component")
"""The CloudEvent attributes a payload half is read from."""
_HEADERS: Final = tuple(f"ce_{name}" for name in _NAMES)
"""Their headers in binary content mode."""
Headers = dict[str, bytes]
"""A record's headers, names lower-cased (the last value of a repeated name)."""


@dataclass(slots=True)
class Half:
    """A request or a response of one call, as rows of named columns."""

    pair: str
    """What a request and its response meet by: the call's id (KServe's ``ce-id``, Seldon's ``x-request-id``, as
    ``<pipeline>.<id>`` when the record names its pipeline: :attr:`call`)."""
    response: bool
    model: str | None
    time: float | None
    """The event time in epoch seconds (the CloudEvent's ``time``, else the record's Kafka timestamp)."""
    rows: int
    columns: Columns
    raw: bytes | None = None
    """The record's value, for a dead letter."""
    metadata: dict[str, Any] = field(default_factory=dict)
    """Columns of one value for every row: the logged request headers (KServe) or record headers (Seldon)."""
    call: str | None = None
    """The call's own id when ``pair`` also names the pipeline it came through (Seldon): the rows' prediction id,
    which delayed labels name."""
    component: str = ""
    """The InferenceService component that logged it (KServe's ``component``): a transformer and its predictor
    logging one call under one ``ce-id`` are one call, whose halves meet within one component."""

    @property
    def id(self) -> str:
        """The id the rows carry: the call's, without its pipeline."""
        return self.call or self.pair


def half_json(half: Half) -> list[Any]:
    """A half as plain JSON values (its columns are already): for a checkpoint, or the staged path's re-keying."""
    raw = None if half.raw is None else base64.b64encode(half.raw).decode()
    return [half.model, half.pair, half.response, half.time, half.rows, half.columns, half.metadata, raw, half.call,
            half.component]  # fmt: skip


def half_of(found: list[Any]) -> Half:
    """The half :func:`half_json` wrote (one written before pipelines and components has neither)."""
    model, pair, response, time, rows, columns, metadata, raw, *route = found
    return Half(pair, response, model, time, rows, columns, None if raw is None else base64.b64decode(raw), metadata,
                *route)  # fmt: skip


def headers_of(raw: Sequence[tuple[str, bytes | None]] | None) -> Headers:
    """Kafka record headers as a dict of lower-cased names (the usual record's are lower-case already: taken as
    they are)."""
    if not raw:
        return {}
    found = dict(raw)
    if all(map(str.islower, found)):
        return found  # type: ignore[return-value]  # a None value reads as a missing header
    return {k.lower(): v or b"" for k, v in raw}


def headers_of_poll(raws: Sequence[Sequence[tuple[str, bytes | None]] | None]) -> tuple[list[Headers], set[str]]:
    """Each record's headers as :func:`headers_of` reads them, and all their names: the names of the whole poll
    checked lower-case at once (0.5 against 1.1 µs per record of a KafkaSink's 11 headers)."""
    found: list[Headers] = [dict(raw) if raw else {} for raw in raws]  # type: ignore[arg-type]  # a None value: missing
    names: set[str] = set().union(*found)
    if all(map(str.islower, names)):
        return found, names
    lowered = list(map(headers_of, raws))
    return lowered, set().union(*lowered)


def _text(value: bytes | None) -> str | None:
    try:
        return value.decode() if value is not None else None
    except UnicodeDecodeError:
        return None


def texts(values: Iterable[bytes | None]) -> list[str | None]:
    """Header values as text, as :func:`_text` reads each (one not UTF-8: None), decoded in one pass."""
    found = list(values)
    try:  # no None among them (the usual poll): 0.04 against 0.07 µs each
        return list(map(bytes.decode, found))  # type: ignore[arg-type]
    except (TypeError, UnicodeDecodeError):  # an absent header (None), or a value no UTF-8 reads
        try:
            return [v if v is None else v.decode() for v in found]
        except UnicodeDecodeError:
            return list(map(_text, found))


def _unzip(body: bytes, says_gzip: bool) -> bytes:
    """The body, unzipped when it is gzip (by its magic bytes); one that says it is gzip but is not is refused."""
    if body[:2] != b"\x1f\x8b":
        if says_gzip:
            raise BadPayload("not_gzip")
        return body
    try:
        out = zlib.decompressobj(wbits=31)
        data = out.decompress(body, MAX_BODY_BYTES)
    except (zlib.error, gzip.BadGzipFile) as exc:
        raise BadPayload("not_gzip") from exc
    if out.unconsumed_tail:
        raise BadPayload("payload_too_large")
    return data


def _says_gzip(content_type: str | None, encoding: str | None) -> bool:
    return (encoding or "").strip().lower() == "gzip" or "gzip" in (content_type or "").lower()


def _parsed(data: bytes | str) -> Any:
    """A payload's JSON, or the payload refused as ``malformed_payload``."""
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError as exc:
        raise BadPayload("malformed_payload") from exc


def _json_or_binary(data: bytes) -> Any:
    """A body's JSON; or the Open Inference Protocol's binary tensor data extension (the KServe SDK's default for
    numpy data; the logger logs the body as sent, without its ``Inference-Header-Content-Length`` header), whose
    JSON header ends before the body does (its bytes may even all be JSON blanks) and has tensors of no ``data``
    whose ``parameters`` give a ``binary_data_size``: each takes that many of the following bytes, in order, as its
    raw contents (BYTES as text, as protobuf's). Bytes no tensor takes, or too few, are ``malformed_payload``."""
    try:
        body = orjson.loads(data)
    except orjson.JSONDecodeError:
        body = None
    if body is not None and not _binary(body):
        return body  # JSON (``null`` is refused as ever, below or by the body's reader)
    try:  # Latin-1: one character per byte, so the header's end is its length in bytes
        end = _HEADER.raw_decode(data.decode("latin-1"))[1]
    except ValueError as exc:
        raise BadPayload("malformed_payload") from exc
    body, at = _parsed(data[:end]), end
    tensors = _binary(body)
    for tensor in tensors:
        size, datatype = tensor["parameters"]["binary_data_size"], tensor.get("datatype")
        if size.__class__ is not int or not 0 <= size <= len(data) - at or datatype not in DATATYPES:
            raise BadPayload("malformed_payload")
        values = _raw_values(data[at : at + size], datatype)
        tensor["data"] = _bytes_text(values) if datatype == "BYTES" else values  # refused as not_utf8 where not text
        at += size
    if not tensors or at != len(data):
        raise BadPayload("malformed_payload")  # no tensor's bytes, or bytes no tensor takes
    return body


def _binary(body: Any) -> list[dict[str, Any]]:
    """The tensors of a parsed body whose bytes follow its JSON: no ``data`` (or null), a ``binary_data_size``."""
    found = [body.get(key) for key in ("inputs", "outputs")] if body.__class__ is dict else []
    return [t for tensors in found if tensors.__class__ is list for t in tensors if t.__class__ is dict and
            t.get("data") is None and t.get("parameters").__class__ is dict and "binary_data_size" in t["parameters"]]


_HEADER: Final = json.JSONDecoder()


def _json_object(data: bytes | str) -> dict[str, Any]:
    """A payload's JSON object (a CloudEvent, KServe's metadata), or the payload refused as ``malformed_payload``."""
    found = _parsed(data)
    if found.__class__ is not dict:
        raise BadPayload("malformed_payload")
    return found


def _attributes(headers: Headers) -> dict[str, str | None]:
    """A binary-mode CloudEvent's attributes from its ``ce_*`` headers (one not UTF-8 reads as missing)."""
    found = list(map(headers.get, _HEADERS))
    try:
        return dict(zip(_NAMES, [v if v is None else v.decode() for v in found], strict=True))
    except UnicodeDecodeError:
        return dict(zip(_NAMES, map(_text, found), strict=True))


def _metadata(text: str | None) -> dict[str, Any]:
    """KServe's ``metadata`` extension, the logged request headers ``{"Name": ["value", ...]}``: each header a
    column under its lower-cased name, its first value."""
    if not text or text == "{}":
        return {}
    found = _json_object(text)
    return {k.lower(): (v[0] if v else None) if v.__class__ is list else v for k, v in found.items()}


def _body_columns(body: Any, response: bool) -> tuple[int, Columns]:
    columns: Columns = {}
    rows, _ = json_body(body, response, columns)
    return rows, columns


def seldon_call(headers: Headers, key: bytes | None) -> str | None:
    """A Seldon record's call id by its headers and key: ``x-request-id``, else the record key (the model gateway
    writes a response under its request's key: scheduler/pkg/kafka/gateway/worker.go); None: neither says (the
    message's own ``id`` may)."""
    return _text(headers.get("x-request-id")) or _text(key) or None


def pair_of(format: str, headers: Headers, key: bytes | None) -> str | None:
    """The pair id of a record from its headers and key alone, as its half would carry it (None: they do not say):
    the partner of a record refused is dropped by it."""
    if format == "kserve":
        return _text(headers.get("ce_id")) or None
    pid, pipeline = seldon_call(headers, key), _text(headers.get("pipeline"))
    return None if not pid else f"{pipeline}.{pid}" if pipeline else pid


def kserve_model(headers: Headers) -> str | None:
    """The InferenceService of a binary-mode record, from its headers alone (None: structured, or none)."""
    return _text(headers.get("ce_inferenceservicename"))


@dataclass(slots=True)
class CloudEvent:
    """A KServe CloudEvent before its body is read: its attributes, and its body (the record's value, a structured
    event's ``data`` or, when ``base64``, its ``data_base64``) with the content type and encoding it is said to
    have."""

    attributes: dict[str, Any]
    body: Any
    content_type: Any
    encoding: Any
    base64: bool = False

    @property
    def model(self) -> str | None:
        model = self.attributes.get("inferenceservicename")
        return model if model.__class__ is str else None

    @property
    def component(self) -> str:
        component = self.attributes.get("component")
        return component if component.__class__ is str else ""

    @property
    def id(self) -> str | None:
        pid = self.attributes.get("id")
        return pid if pid.__class__ is str and pid else None


def kserve_event(value: bytes | None, headers: Headers) -> CloudEvent:
    """A KServe payload-logger record's CloudEvent (binary or structured mode), its body unread: the model and
    component it names decide whether the body is read at all."""
    content_type = _text(headers.get("content-type"))
    if content_type is None or not content_type.startswith(STRUCTURED):
        attributes = _attributes(headers)  # binary mode: the attributes are ce_* headers, the value the body
        encoding = _text(headers.get("content-encoding")) or attributes.get("contentencoding")
        return CloudEvent(attributes, value, content_type, encoding)
    if not value:
        raise BadPayload("malformed_payload")
    event = _json_object(value)
    encoded = "data_base64" in event
    return CloudEvent(event, event["data_base64"] if encoded else event.get("data"), event.get("datacontenttype"),
                      event.get("contentencoding"), encoded)  # fmt: skip


def kserve_half(value: bytes | None, headers: Headers, record_ms: int, event: CloudEvent | None = None) -> Half:
    """One KServe payload-logger CloudEvent, as the KafkaSink wrote it (binary or structured mode); ``event``: its
    :func:`kserve_event`, read already."""
    if not value:
        raise BadPayload("malformed_payload")
    if event is None:
        event = kserve_event(value, headers)
    get, data_type, encoding = event.attributes.get, event.content_type, event.encoding
    kind, pid, body = get("type"), event.id, event.body
    if (kind not in (REQUEST_TYPE, RESPONSE_TYPE) or pid is None or data_type.__class__ not in _OPTIONAL_TEXT
            or encoding.__class__ not in _OPTIONAL_TEXT):  # a structured event's attributes may be any JSON value
        raise BadPayload("malformed_payload")
    response = kind == RESPONSE_TYPE
    if event.base64:
        try:
            body = base64.b64decode(body, validate=True)
        except (ValueError, TypeError) as exc:
            raise BadPayload("malformed_payload") from exc
    elif body.__class__ is str:
        body = body.encode()
    if body.__class__ is bytes:
        body = _json_or_binary(_unzip(body, _says_gzip(data_type, encoding)))
    rows, columns = _body_columns(body, response)
    when = epoch(get("time")) if get("time") is not None else None
    return Half(pid, response, event.model,
                when if when is not None else (record_ms / 1000 if record_ms > 0 else None), rows, columns,
                value, _metadata(get("metadata")) if not response else {}, None, event.component)  # fmt: skip


def seldon_model(topic: str) -> tuple[str | None, bool | None]:
    """The model and direction of a Seldon topic ``[prefix]seldon.<ns>.model.<name>.inputs|outputs``."""
    parts = topic.split(".")
    if len(parts) >= 5 and parts[-3] == "model" and parts[-1] in ("inputs", "outputs"):
        return parts[-2], parts[-1] == "outputs"
    return None, None


def seldon_half(value: bytes | None, headers: Headers, key: bytes | None, topic: str, record_ms: int,
                response: bool | None = None) -> Half:  # fmt: skip
    """One record of a Seldon model's inputs or outputs topic, as its gateway wrote it; ``response``: the direction
    of a topic whose name does not say it (``kafka.response_topic``)."""
    model, by_name = seldon_model(topic)
    response = by_name if by_name is not None else response
    if response is None or not value:
        raise BadPayload("malformed_payload")
    kind = _text(headers.get("seldon-infer-type"))
    as_json = SELDON_TYPES[kind] if kind in SELDON_TYPES else value.lstrip()[:1] == b"{"
    pid = seldon_call(headers, key)
    columns: Columns = {}
    rows, own = json_body(_parsed(value), response, columns) if as_json else proto_body(value, response, columns)[:2]
    pid = pid or own
    if not pid:
        raise BadPayload("malformed_payload")
    pipeline = _text(headers.get("pipeline"))
    metadata = {k: _text(v) for k, v in headers.items() if k not in SELDON_RESERVED} if not response else {}
    return Half(f"{pipeline}.{pid}" if pipeline else pid, response, model,
                record_ms / 1000 if record_ms > 0 else None, rows, columns, value, metadata,
                pid if pipeline else None)  # fmt: skip

