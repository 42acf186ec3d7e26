"""Open Inference Protocol (KServe v2) tensors, and KServe v1 bodies, as named columns of rows.

A request's or response's tensors become columns: a tensor of shape ``[N]`` or ``[N, 1]`` is one column under its
name, column ``i`` of an ``[N, k]`` tensor is ``<name>-<i>`` (higher ranks: the trailing dimensions flattened), as
TrustyAI names them. MLServer's pandas codec sends one ``[N, 1]`` tensor per DataFrame column (strings as BYTES),
so a DataFrame's columns come back under their own names. A v1 body's instances (records by their keys, lists as
``instances-<i>``; under ``instances``, or under a request's ``inputs`` that are no tensors, as KServe's v1 servers
take them) and predictions (``predictions``, or ``predictions-<i>`` / record keys) follow the same rule.
Tensors arrive as JSON (data nested or flat, row-major) or as protobuf (typed ``contents`` or ``raw_*_contents``);
the protobuf messages are built at run time from the ``.proto``'s fields (:func:`messages`), with no generated
module to keep in step with the protobuf runtime. Every defect raises :class:`BadPayload` with its reason.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from functools import cache
from itertools import chain
from typing import Any, Final

import numpy as np
import orjson

Columns = dict[str, list[Any]]
"""Column name -> one value per row."""

DATATYPES: Final = {
    "BOOL": "?", "UINT8": "<u1", "UINT16": "<u2", "UINT32": "<u4", "UINT64": "<u8", "INT8": "<i1", "INT16": "<i2",
    "INT32": "<i4", "INT64": "<i8", "FP16": "<f2", "FP32": "<f4", "FP64": "<f8", "BYTES": None,
}  # fmt: skip
"""The protocol's datatypes, with the little-endian numpy type of their raw contents (BYTES: length-prefixed)."""
_CONTENTS: Final = {
    "BOOL": "bool_contents", "UINT8": "uint_contents", "UINT16": "uint_contents", "UINT32": "uint_contents",
    "UINT64": "uint64_contents", "INT8": "int_contents", "INT16": "int_contents", "INT32": "int_contents",
    "INT64": "int64_contents", "FP32": "fp32_contents", "FP64": "fp64_contents", "BYTES": "bytes_contents",
}  # fmt: skip
"""Which typed field of ``InferTensorContents`` holds a datatype's values (FP16 has none: raw contents only)."""

PAYLOAD_REASONS: Final = (
    "malformed_payload", "not_gzip", "unknown_datatype", "shape_mismatch", "unequal_rows", "base64_bytes",
    "not_utf8", "payload_too_large",
)  # fmt: skip
"""Why a payload half is refused as a whole (counted under ``fairness_exporter_events_rejected``, dead-lettered)."""


class BadPayload(Exception):
    """A payload that cannot become rows; ``reason`` is one of :data:`PAYLOAD_REASONS` (or a decoder rule's)."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def _flat(data: Any) -> list[Any]:
    """Row-major values of nested lists (the JSON form may nest them by the shape, or not)."""
    while data and data[0].__class__ is list:
        if any(row.__class__ is not list for row in data):
            raise BadPayload("shape_mismatch")  # rows of unequal depth
        data = list(chain.from_iterable(data))
    return data


MOST_EMPTY_COLUMNS: Final = 4096
"""A tensor of no rows names at most this many columns (each an empty list): a shape such as ``[0, 10**12]``
holds no value, so nothing but this bounds the columns it would name."""


def _split(name: str, values: Sequence[Any], shape: Sequence[int], out: Columns) -> int:
    """Put a tensor's row-major values into ``out`` as columns; its number of rows."""
    if not shape:
        raise BadPayload("shape_mismatch")
    for d in shape:
        if d.__class__ is not int or d < 0:
            raise BadPayload("shape_mismatch")
    rows, width = shape[0], 1
    for d in shape[1:]:
        width *= d
    if rows * width != len(values) or (not rows and width > MOST_EMPTY_COLUMNS):
        raise BadPayload("shape_mismatch")  # the columns of a tensor of no rows, bounded by no value: bounded here
    if width == 1:
        out[name] = values if values.__class__ is list else list(values)
    else:
        for i in range(width):
            out[f"{name}-{i}"] = list(values[i::width])
    return rows


def _text(values: list[Any]) -> list[Any]:
    """BYTES elements as text (protobuf gives bytes; JSON gives strings already). Bytes without a NUL are decoded
    in one call, joined by NULs and split again: a NUL is one byte in UTF-8 and ends no sequence, so the joined
    text is valid exactly when every element is."""
    try:
        joined = b"\x00".join(values)
    except TypeError:
        joined = None  # not all bytes: each element on its own
    try:
        if joined is not None and joined.count(b"\x00") == len(values) - 1:
            return joined.decode().split("\x00")
        return [v.decode() if v.__class__ is bytes else v for v in values]
    except UnicodeDecodeError as exc:
        raise BadPayload("not_utf8") from exc


def _content_type(parameters: Any) -> Any:
    return parameters.get("content_type") if parameters.__class__ is dict else None


def json_tensors(tensors: Any, out: Columns) -> int | None:
    """The v2 JSON ``inputs``/``outputs`` list as columns in ``out``; the rows (every tensor must agree), None for
    no tensor."""
    if tensors.__class__ is not list:
        raise BadPayload("malformed_payload")
    rows: int | None = None
    for tensor in tensors:
        if tensor.__class__ is not dict:
            raise BadPayload("malformed_payload")
        get = tensor.get
        name, shape, datatype, data = get("name"), get("shape"), get("datatype"), get("data")
        if name.__class__ is not str or shape.__class__ is not list or data.__class__ is not list:
            raise BadPayload("malformed_payload")
        if datatype.__class__ is not str or datatype not in DATATYPES:  # a list or an object: no datatype either
            raise BadPayload("unknown_datatype")
        n = json_tensor(name, shape, data, datatype, _content_type(get("parameters")), out)
        if rows is not None and n != rows:
            raise BadPayload("unequal_rows")
        rows = n
    return rows


def json_tensor(name: str, shape: list[Any], data: list[Any], datatype: str, content_type: Any, out: Columns) -> int:
    """One JSON tensor (its name a string, its shape and data lists, its datatype one of :data:`DATATYPES`;
    ``content_type``: its ``parameters.content_type``, MLServer's codec of its elements) as columns in ``out``; its
    rows."""
    if content_type is not None:
        if content_type == "base64" and datatype == "BYTES":
            raise BadPayload("base64_bytes")  # MLServer's base64 codec: binary, never an attribute's text
        if content_type == PD_JSON:
            return _split(name, json_elements(_flat(data)), shape, out)
    first = shape[0] if shape else None
    if (first.__class__ is int and first == len(data) and (not data or data[0].__class__ is not list) and (
            len(shape) == 1 or (len(shape) == 2 and shape[1].__class__ is int and shape[1] == 1))):  # fmt: skip
        out[name] = data  # one column of flat values, as _split reads it
        return first
    return _split(name, _flat(data), shape, out)


PD_JSON: Final = "pd_json"
"""The content type MLServer's ``PandasCodec`` gives a DataFrame column of objects that are not all strings: BYTES,
each element JSON text (mlserver/codecs/pandas.py ``_to_response_output``: ``encode_to_json`` of each)."""


_PD_JSON_BYTES: Final = PD_JSON.encode()


def json_elements(values: list[Any]) -> list[Any]:
    """The elements of a :data:`PD_JSON` tensor as MLServer's decoder reads them: each loaded by ``json.loads``
    (mlserver/codecs/json.py ``decode_json_input_or_output``). One that is no JSON text (``NaN`` and ``Infinity``
    neither: MLServer's encoder refuses them), or whose value could not be written back as JSON (an integer beyond
    64 bits, a lone surrogate: the join's checkpoints and the staged path's records hold the values as JSON), is
    refused as ``malformed_payload``, never guessed."""
    try:
        found = [json.loads(v, parse_constant=_no_constant) for v in values]
        orjson.dumps(found)
    except (ValueError, TypeError, RecursionError) as exc:  # orjson.JSONEncodeError is a TypeError
        raise BadPayload("malformed_payload") from exc
    return found


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is no JSON value")


def v1_columns(items: Any, name: str, out: Columns) -> int:
    """KServe v1 ``instances`` / ``predictions`` as columns: records by their keys, lists as ``<name>-<i>``,
    scalars as ``<name>``; the rows."""
    if items.__class__ is not list:
        raise BadPayload("malformed_payload")
    if not items:
        return 0
    first = items[0]
    if first.__class__ is dict:
        keys = list(first)
        if any(item.__class__ is not dict or len(item) != len(keys) for item in items):
            raise BadPayload("unequal_rows")
        try:
            for key in keys:
                out[key] = [item[key] for item in items]
        except KeyError as exc:
            raise BadPayload("unequal_rows") from exc
    elif first.__class__ is list:
        width = len(first)
        if any(item.__class__ is not list or len(item) != width for item in items):
            raise BadPayload("unequal_rows")
        if width == 1:
            out[name] = [item[0] for item in items]
        for i in range(width if width > 1 else 0):
            out[f"{name}-{i}"] = [item[i] for item in items]
    else:
        out[name] = items
    for column in out.values():
        if not set(map(type, column)).isdisjoint(_CONTAINERS) and _deeper(column, MOST_CELL_DEPTH):
            raise BadPayload("malformed_payload")
    return len(items)


_CONTAINERS: Final = frozenset({list, dict})
MOST_CELL_DEPTH: Final = 200
"""The deepest nesting of lists and objects a v1 cell may hold. A half is stored as JSON (the checkpoint, the staged
path's re-keying) by orjson, which writes at most 255 levels though it reads 1024: a cell deeper than this, with the
levels around it, could be read and never written, and would fail every checkpoint while it waited."""


def _deeper(value: Any, levels: int) -> bool:
    """Whether ``value`` nests lists and objects more than ``levels`` deep."""
    if value.__class__ is dict:
        value = list(value.values())
    elif value.__class__ is not list:
        return False
    return levels <= 0 or any(_deeper(v, levels - 1) for v in value)


_TENSOR: Final = frozenset({"name", "shape", "datatype", "data"})
"""The fields every v2 JSON tensor has (KServe's ``RequestInput`` requires each)."""


def json_body(body: Any, response: bool, out: Columns) -> tuple[int, str | None]:
    """A v1 or v2 JSON body (a parsed object) as columns in ``out``: (rows, the body's own ``id`` if any). A
    request's ``inputs`` are v2 tensors unless they are v1 rows: KServe's v1 servers take a request's instances under
    ``inputs`` as well (``get_predict_input``), read here as ``instances``, when the first is no tensor object."""
    if body.__class__ is not dict:
        raise BadPayload("malformed_payload")
    key = "outputs" if response else "inputs"
    if key in body:
        found = body[key]
        if not response and found and found.__class__ is list and (
                found[0].__class__ is not dict or not found[0].keys() >= _TENSOR):  # fmt: skip
            return v1_columns(found, "instances", out), None
        rows = json_tensors(found, out)
        pid = body.get("id")
        return rows or 0, pid if pid.__class__ is str else None
    key = "predictions" if response else "instances"
    if key in body:
        return v1_columns(body[key], key, out), None
    raise BadPayload("malformed_payload")


# --- protobuf -------------------------------------------------------------------------------------------------

_SCALAR: Final = {"string": 9, "int64": 3, "bool": 8, "bytes": 12, "int32": 5, "uint32": 13, "uint64": 4,
                  "float": 2, "double": 1}  # fmt: skip
"""FieldDescriptorProto type numbers of the scalar types the messages use."""


@cache
def messages() -> tuple[Any, Any, type[Exception]]:
    """The ``inference.ModelInferRequest`` and ``ModelInferResponse`` message classes of grpc_predict_v2.proto (the
    fields this decoder reads, by their numbers; other fields are skipped as unknown), built once at run time, and
    the error of a message that does not parse. protobuf is the ``seldon`` extra: imported only here."""
    from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
    from google.protobuf.message import DecodeError

    fd = descriptor_pb2.FileDescriptorProto(name="fairness_exporter_oip.proto", package="inference",
                                            syntax="proto3")  # fmt: skip

    def message(parent: Any, name: str, fields: Sequence[tuple[str, int, str, bool]]) -> Any:
        m = parent.add(name=name)
        for fname, number, ftype, repeated in fields:
            f = m.field.add(name=fname, number=number, label=3 if repeated else 1)
            if ftype in _SCALAR:
                f.type = _SCALAR[ftype]
            else:
                f.type, f.type_name = 11, ftype
        return m

    def parameters(parent: Any) -> None:
        entry = message(parent.nested_type, "ParametersEntry", [("key", 1, "string", False),
                                                                ("value", 2, ".inference.InferParameter", False)])
        entry.options.map_entry = True
        parent.field.add(name="parameters", number=4, label=3, type=11,
                         type_name=f".{fd.package}.{parent.name}.ParametersEntry")  # fmt: skip

    param = message(fd.message_type, "InferParameter", [("bool_param", 1, "bool", False), (
        "int64_param", 2, "int64", False), ("string_param", 3, "string", False), ("double_param", 4, "double", False),
        ("uint64_param", 5, "uint64", False)])  # fmt: skip
    param.oneof_decl.add(name="parameter_choice")
    for f in param.field:
        f.oneof_index = 0
    message(fd.message_type, "InferTensorContents", [
        ("bool_contents", 1, "bool", True), ("int_contents", 2, "int32", True), ("int64_contents", 3, "int64", True),
        ("uint_contents", 4, "uint32", True), ("uint64_contents", 5, "uint64", True),
        ("fp32_contents", 6, "float", True), ("fp64_contents", 7, "double", True),
        ("bytes_contents", 8, "bytes", True)])  # fmt: skip
    for top, tensor, tensors, raw in (("ModelInferRequest", "InferInputTensor", "inputs", "raw_input_contents"),
                                      ("ModelInferResponse", "InferOutputTensor", "outputs", "raw_output_contents")):
        m = message(fd.message_type, top, [("model_name", 1, "string", False), ("model_version", 2, "string", False),
                                           ("id", 3, "string", False)])  # fmt: skip
        parameters(m)
        t = message(m.nested_type, tensor, [("name", 1, "string", False), ("datatype", 2, "string", False),
                                            ("shape", 3, "int64", True),
                                            ("contents", 5, ".inference.InferTensorContents", False)])  # fmt: skip
        parameters(t)
        t.field[-1].type_name = f".inference.{top}.{tensor}.ParametersEntry"
        m.field.add(name=tensors, number=5, label=3, type=11, type_name=f".inference.{top}.{tensor}")
        m.field.add(name=raw, number=7 if top == "ModelInferRequest" else 6, label=3, type=12)
    pool = descriptor_pool.DescriptorPool()
    pool.Add(fd)
    return (message_factory.GetMessageClass(pool.FindMessageTypeByName("inference.ModelInferRequest")),
            message_factory.GetMessageClass(pool.FindMessageTypeByName("inference.ModelInferResponse")), DecodeError)


def _raw_values(raw: bytes, datatype: str) -> list[Any]:
    """A tensor's ``raw_*_contents``: little-endian numbers, or BYTES as 4-byte little-endian lengths + bytes."""
    dtype = DATATYPES[datatype]
    if dtype is not None:
        if len(raw) % np.dtype(dtype).itemsize:
            raise BadPayload("shape_mismatch")
        return np.frombuffer(raw, dtype=dtype).tolist()
    values, at = [], 0
    while at < len(raw):
        if at + 4 > len(raw):
            raise BadPayload("shape_mismatch")
        size = int.from_bytes(raw[at : at + 4], "little")
        values.append(raw[at + 4 : at + 4 + size])
        at += 4 + size
    if at != len(raw):
        raise BadPayload("shape_mismatch")
    return values


def proto_body(value: bytes, response: bool, out: Columns) -> tuple[int, str | None, str]:
    """A protobuf ModelInferRequest/Response as columns in ``out``: (rows, the message's ``id``, its model name).
    A schema-registry framing (magic byte 0, schema id, message indexes) is skipped: no message of either type
    starts with a 0 byte. BYTES arrive as bytes here (MLServer's base64 codec needs no text form on gRPC): what is
    not UTF-8 is refused as ``not_utf8``."""
    if value[:1] == b"\x00":
        value = _unframed(value)
    request, reply, error = messages()
    try:
        message = (reply if response else request).FromString(value)
    except error as exc:
        raise BadPayload("malformed_payload") from exc
    tensors = message.outputs if response else message.inputs
    raws = message.raw_output_contents if response else message.raw_input_contents
    if raws and len(raws) != len(tensors):
        raise BadPayload("malformed_payload")
    rows: int | None = None
    coded = value.find(_PD_JSON_BYTES) >= 0  # no tensor says pd_json unless its bytes are in the message
    for k, tensor in enumerate(tensors):
        datatype = tensor.datatype
        if datatype not in DATATYPES:
            raise BadPayload("unknown_datatype")
        if raws:
            values = _raw_values(raws[k], datatype)
        elif datatype == "FP16":
            raise BadPayload("shape_mismatch")  # FP16 has no typed contents: raw only
        else:
            values = list(getattr(tensor.contents, _CONTENTS[datatype]))  # one C call, no Python step per value
        if datatype == "BYTES":
            values = _text(values)
        if coded and "content_type" in tensor.parameters and tensor.parameters["content_type"].string_param == PD_JSON:
            values = json_elements(values)
        n = _split(tensor.name, values, list(tensor.shape), out)
        if rows is not None and n != rows:
            raise BadPayload("unequal_rows")
        rows = n
    return rows or 0, message.id or None, message.model_name


def _unframed(value: bytes) -> bytes:
    """The message after a Confluent schema-registry prefix: magic 0, a 4-byte schema id, then the message-index
    array (a zig-zag varint count, then that many varints; a lone 0 for the first message)."""
    at = 5

    def varint() -> int:
        nonlocal at
        shift = result = 0
        while True:
            if at >= len(value):
                raise BadPayload("malformed_payload")
            byte = value[at]
            at += 1
            result |= (byte & 0x7F) << shift
            if byte < 0x80:
                return result
            shift += 7

    count = varint()
    count = (count >> 1) ^ -(count & 1)
    for _ in range(max(count, 0)):
        varint()
    return value[at:]
