"""A poll's Seldon protobuf records read as halves in a few C calls, with the values of
:func:`~exporter.stream.decode.platforms.seldon_half` for each, or not at all (None: the caller reads them one by
one, and refuses what it refuses).

Reading a message's tensors through the protobuf runtime costs a Python step per field of every tensor (measured:
4.4 µs for a request's two tensors, three times the parse itself). Here the records are parsed together instead:

1. All records framed as one ``repeated ModelInferRequest`` (or Response) message, parsed by the very classes of
   :func:`~exporter.stream.decode.oip.messages`: it fails exactly when one record would (then None).
2. The same bytes parsed by a *flat* view of the same fields (every field repeated, the records merged into one
   message, a separator record between two): each record's id, tensors (as bytes) and raw contents, all records'
   in one list each, the separators telling whose is whose.
3. The tensors, joined with a separator tensor, parsed by a flat view of the tensor: all names, datatypes, shapes
   (packed bytes) and contents (BYTES elements, packed numbers as bytes) in one list each.

Only the usual poll is read here: each record protobuf, each tensor with exactly one name, datatype and shape,
the same number of tensors in every record, raw contents in every record or in none, each tensor's contents
exactly its shape's count, no record refused; anything else is left to the record-by-record path (None). Tensor
shapes are checked once per distinct (name, datatype, shape) by the rules of
:func:`~exporter.stream.decode.oip.proto_body`.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Sequence
from functools import cache, lru_cache
from itertools import accumulate, chain, repeat
from operator import itemgetter
from typing import Any, Final

import numpy as np

from exporter.stream.decode.oip import _CONTENTS, _SCALAR, DATATYPES, BadPayload, _raw_values, _text, messages
from exporter.stream.decode.platforms import SELDON_RESERVED, SELDON_TYPES, Half, headers_of, seldon_model
from exporter.stream.decode.platforms import _text as _header_text

_SEP: Final = "\x00fairness-exporter:separator"
"""The value of every field of a separator record or tensor (a real one equal to it only sends the poll to the
record-by-record path: the separators are counted)."""
_SEP_BYTES: Final = _SEP.encode()
_FIELDS: Final = {name: number for number, name in enumerate(
    ("bool_contents", "int_contents", "int64_contents", "uint_contents", "uint64_contents", "fp32_contents",
     "fp64_contents", "bytes_contents"), start=1)}  # fmt: skip
"""``InferTensorContents``' fields by name: their numbers."""
_FIXED: Final = {"fp32_contents": "<f4", "fp64_contents": "<f8"}
"""Packed fields of fixed width: read by numpy from their bytes (the same float the runtime gives)."""
_MOST_BYTES: Final = 1 << 30
"""A poll's records larger than this together are read record by record (a protobuf message holds under 2 GiB)."""
_MOST_COLUMNS: Final = 4096
"""A tensor of more columns than this (a shape claims them before any value is counted) is read record by
record."""
_HIGH: Final = bytes(range(128, 256))
"""Varint continuation bytes: a packed varint field has as many values as bytes outside these."""


def _key(number: int, wire: int) -> bytes:
    return _varint(number << 3 | wire)


def _varint(n: int) -> bytes:
    out = bytearray()
    while n >= 0x80:
        out.append(n & 0x7F | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


@lru_cache(maxsize=4096)
def _framed(number: int, size: int) -> bytes:
    """The key and length that put ``size`` bytes into length-delimited field ``number``."""
    return _key(number, 2) + _varint(size)


def _field(number: int, data: bytes) -> bytes:
    return _framed(number, len(data)) + data


@cache
def _flat() -> dict[str, Any]:
    """The message classes: the batches of real messages, and the flat views (the fields read, all repeated)."""
    from google.protobuf import descriptor_pb2, message_factory

    request, _, _ = messages()
    pool = request.DESCRIPTOR.file.pool
    fd = descriptor_pb2.FileDescriptorProto(name="fairness_exporter_flat.proto", package="flat", syntax="proto3",
                                            dependency=["fairness_exporter_oip.proto"])  # fmt: skip

    def message(name: str, fields: Sequence[tuple[str, int, str, int]]) -> None:
        m = fd.message_type.add(name=name)
        for fname, number, ftype, label in fields:
            f = m.field.add(name=fname, number=number, label=label)
            if ftype in _SCALAR:
                f.type = _SCALAR[ftype]
            else:
                f.type, f.type_name = 11, ftype

    message("Requests", [("items", 1, ".inference.ModelInferRequest", 3)])
    message("Responses", [("items", 1, ".inference.ModelInferResponse", 3)])
    message("Call", [("id", 3, "string", 3), ("tensors", 5, "bytes", 3), ("raw_outputs", 6, "bytes", 3),
                     ("raw_inputs", 7, "bytes", 3)])  # fmt: skip
    message("Calls", [("items", 1, ".flat.Call", 1)])  # one message: every record's fields merged into its lists
    message("Contents", [(name, number, "bytes", 3) for name, number in _FIELDS.items()])
    message("Tensor", [("name", 1, "string", 3), ("datatype", 2, "string", 3), ("shape", 3, "bytes", 3),
                       ("contents", 5, "bytes", 3)])  # fmt: skip
    pool.Add(fd)
    found = {name: message_factory.GetMessageClass(pool.FindMessageTypeByName(f"flat.{name}"))
             for name in ("Requests", "Responses", "Calls", "Tensor", "Contents")}  # fmt: skip
    found["Typed"] = message_factory.GetMessageClass(pool.FindMessageTypeByName("inference.InferTensorContents"))
    return found


_TENSOR_SEP: Final = _field(1, _SEP_BYTES)
"""The separator record's tensor (a valid tensor: only its name)."""


@cache
def _separators(response: bool) -> tuple[bytes, bytes]:
    """The separator record (framed as an item of the batch) and the separator tensor: every field read holds
    :data:`_SEP` once (each a valid message of its type)."""
    record = _field(3, _SEP_BYTES) + _field(5, _TENSOR_SEP) + _field(6 if response else 7, _SEP_BYTES)
    flat_tensor = b"".join(_field(number, _SEP_BYTES) for number in (1, 2, 3, 5))
    return _field(1, record), flat_tensor


def _each(values: list[Any], sep: Any, n: int, per: int) -> list[Any] | None:
    """The values of ``n`` groups of exactly ``per`` values each, every group followed by ``sep``; None if the
    list is not laid out so."""
    if len(values) != n * (per + 1) or values.count(sep) != n or values[per :: per + 1].count(sep) != n:
        return None
    if per == 1:
        return values[0::2]
    del values[per :: per + 1]
    return values


def _laid_out(values: list[Any], sep: Any, counts: list[int]) -> list[Any] | None:
    """The values of groups of ``counts`` values each, every group followed by ``sep``; None if the list is not
    laid out so."""
    ends = list(accumulate(c + 1 for c in counts))
    if not ends or len(values) != ends[-1] or values.count(sep) != len(counts):
        return None
    marks = itemgetter(*(e - 1 for e in ends))(values)
    if (marks.count(sep) if len(counts) > 1 else int(marks == sep)) != len(counts):
        return None
    if len(values) == len(counts):
        return []
    return np.delete(np.array(values, dtype=object), np.asarray(ends) - 1).tolist()


@lru_cache(maxsize=1024)
def _plan(name: str, datatype: str, shape: bytes) -> tuple[int, int, tuple[str, ...], str] | None:
    """A tensor's rows, values and column names by the rules of ``proto_body`` and ``_split`` (None: it would be
    refused, or is not read here), and the contents field its values are in."""
    if datatype not in DATATYPES or datatype == "FP16":
        return None
    dims, at = [], 0
    while at < len(shape):  # packed int64 varints
        value = shift = 0
        while True:
            byte = shape[at]
            at += 1
            value |= (byte & 0x7F) << shift
            shift += 7
            if byte < 0x80:
                break
        dims.append(value - (1 << 64) if value >= 1 << 63 else value)
    if not dims or any(d < 0 for d in dims):
        return None
    width = 1
    for d in dims[1:]:
        width *= d
    if width > _MOST_COLUMNS:
        return None  # its names are made only once its values are counted: record by record
    names = (name,) if width == 1 else tuple(f"{name}-{i}" for i in range(width))
    return dims[0], dims[0] * width, names, _CONTENTS[datatype]


def halves(topic: str, records: Sequence[tuple[bytes | None, Any, bytes | None, int]], models: Collection[str],
           response: bool | None) -> list[Half] | None:  # fmt: skip
    """The poll's records of one Seldon topic (value, headers, key, Kafka timestamp in ms) as halves, each as
    ``seldon_half`` reads it; None when the poll is not the usual one (see the module), to be read record by
    record."""
    model, by_name = seldon_model(topic)
    response = by_name if by_name is not None else response
    if response is None or model is None or model not in models or not records:
        return None
    values: list[bytes] = [r[0] for r in records]  # type: ignore[misc]  # None: refused by the check below
    if not all(values) or any(v[:1] == b"\x00" for v in values) or sum(map(len, values)) > _MOST_BYTES:
        return None  # an empty value, a schema-registry framing, or more than one message may hold
    headers = list(map(headers_of, (r[1] for r in records)))
    kinds = set(map(_header_text, {h.get("seldon-infer-type") for h in headers}))
    if any(SELDON_TYPES.get(kind or "") for kind in kinds) or (not kinds <= SELDON_TYPES.keys() and any(
            v.lstrip()[:1] == b"{" for v in values)):  # fmt: skip
        return None  # JSON (or, without the header, maybe: the check looks at every record then)
    columns = _columns(values, response)
    if columns is None:
        return None
    ids, rows, tables = columns
    pids = [p or _header_text(r[2]) or own for p, r, own in zip(_texts(h.get("x-request-id") for h in headers), records,
                                                                  ids, strict=True)]  # fmt: skip
    if not all(pids):
        return None  # refused (no id) record by record
    pipelines = _texts(h.get("pipeline") for h in headers)
    metadata = [{} if response or h.keys() <= SELDON_RESERVED else {
        k: _header_text(v) for k, v in h.items() if k not in SELDON_RESERVED} for h in headers]  # fmt: skip
    return [Half(f"{pipeline}.{pid}" if pipeline else pid, response, model, r[3] / 1000 if r[3] > 0 else None, n,
                 table, r[0], found, pid if pipeline else None)
            for pid, pipeline, r, n, table, found in zip(pids, pipelines, records, rows, tables, metadata, strict=True)]


def _texts(values: Iterable[bytes | None]) -> list[str | None]:
    """Header values as text, as ``platforms._text`` reads each (one not UTF-8: None)."""
    found = list(values)
    try:
        return [v if v is None else v.decode() for v in found]
    except UnicodeDecodeError:
        return list(map(_header_text, found))


def _columns(values: list[bytes], response: bool) -> Read | None:
    """Each record's id, rows and columns, or None (not the usual poll)."""
    flat = _flat()
    item, tensor_sep = _separators(response)
    blob = b"".join(chain.from_iterable(zip(map(_framed, repeat(1), map(len, values)), values, repeat(item))))
    _, _, error = messages()
    try:
        flat["Responses" if response else "Requests"].FromString(blob)  # every record as its real message
        call = flat["Calls"].FromString(blob).items
    except error:
        return None
    n = len(values)
    listed = list(call.tensors)
    width = listed.index(_TENSOR_SEP)
    tensors = _each(listed, _TENSOR_SEP, n, width)
    listed = list(call.id)
    ids = _each(listed, _SEP, n, 1) if listed.count(_SEP) != len(listed) else [None] * n
    listed = list(call.raw_outputs if response else call.raw_inputs)
    raws = [] if listed.count(_SEP_BYTES) == len(listed) == n else _each(listed, _SEP_BYTES, n, width)
    if tensors is None or ids is None or raws is None:
        return None
    return _tensor_columns(tensors, tensor_sep, width, raws, [i or None for i in ids])


Read = tuple[list[str | None], list[int], list[dict[str, Any]]]
"""Each record's id (None: none), rows and columns."""


def _tensor_columns(tensors: list[bytes], sep: bytes, width: int, raws: list[bytes],
                    ids: list[str | None]) -> Read | None:  # fmt: skip
    """Each record's id, rows and columns from its ``width`` tensors (in ``tensors``, record after record)."""
    from google.protobuf.unknown_fields import UnknownFieldSet

    n, nt = len(ids), len(tensors)
    if not nt:
        return ids, [0] * n, [{} for _ in ids]
    found = _flat()["Tensor"].FromString(sep.join(tensors) + sep)
    if any(f.field_number == 3 for f in UnknownFieldSet(found)):
        return None  # a shape also sent unpacked: the flat view would miss its other dimensions
    names = _each(list(found.name), _SEP, nt, 1)
    datatypes = _each(list(found.datatype), _SEP, nt, 1)
    shapes = _each(list(found.shape), _SEP_BYTES, nt, 1)
    if names is None or datatypes is None or shapes is None:
        return None
    plans: list[Any] = list(map(_plan, names, datatypes, shapes))
    if None in plans:
        return None
    tensor_rows = [p[0] for p in plans]
    rows = tensor_rows[::width]
    if tensor_rows.count(rows[0]) != nt and any(tensor_rows[r * width : (r + 1) * width].count(rows[r]) != width
                                                for r in range(n)):  # fmt: skip
        return None  # unequal_rows: refused record by record
    contents = None if raws else _each(list(found.contents), _SEP_BYTES, nt, 1)
    tensor_values: list[Any]
    try:
        if raws:
            tensor_values = list(map(_raw, raws, datatypes, plans))
        elif contents is not None:
            tensor_values = _typed(contents, plans)
        else:
            return None
    except BadPayload:
        return None
    if None in tensor_values:
        return None
    if all(len(p[2]) == 1 for p in plans):
        cells = list(zip([p[2][0] for p in plans], tensor_values, strict=True))
        return ids, rows, [dict(cells[i : i + width]) for i in range(0, nt, width)]
    tables: list[dict[str, Any]] = [{} for _ in ids]
    for k, (plan, values) in enumerate(zip(plans, tensor_values, strict=True)):
        named = plan[2]
        for i, column in enumerate(named):
            tables[k // width][column] = values if len(named) == 1 else values[i :: len(named)]
    return ids, rows, tables


def _raw(raw: bytes, datatype: str, plan: tuple[int, int, tuple[str, ...], str]) -> list[Any] | None:
    """A tensor's values from its raw contents, as ``proto_body`` reads them; None when they are not its shape's
    count."""
    values = _raw_values(raw, datatype)
    if len(values) != plan[1]:
        return None
    return _text(values) if datatype == "BYTES" else values


def _typed(contents: list[bytes], plans: list[Any]) -> list[Any]:
    """Each tensor's values from its typed contents (bytes), by its plan's field, as ``proto_body`` reads them; None
    for a tensor whose values are not exactly its shape's count, or lie in another layout."""
    from google.protobuf.unknown_fields import UnknownFieldSet

    flat = _flat()
    out: list[Any] = [None] * len(plans)
    for field in {p[3] for p in plans}:
        number = _FIELDS[field]
        counts = [p[1] if p[3] == field else 0 for p in plans]
        sep = _field(number, _SEP_BYTES)
        parsed = flat["Contents"].FromString(sep.join(contents) + sep)
        if any(f.field_number == number for f in UnknownFieldSet(parsed)):
            return out  # packed and unpacked values mixed: the flat view would miss some
        listed = list(getattr(parsed, field))
        if field == "bytes_contents":
            found = _laid_out(listed, _SEP_BYTES, counts)
            everything = _text(found) if found else found
        else:
            blobs = _laid_out(listed, _SEP_BYTES, [min(c, 1) for c in counts])
            everything = _numbers(blobs, field, number, [c for c in counts if c]) if blobs else blobs
        if everything is None:
            return out
        mine = [k for k, p in enumerate(plans) if p[3] == field]
        sizes = [counts[k] for k in mine]
        size = sizes[0]
        if size and sizes.count(size) == len(sizes):
            pieces = [everything[at : at + size] for at in range(0, size * len(sizes), size)]
        else:
            pieces = [everything[end - c : end] for end, c in zip(accumulate(sizes), sizes, strict=True)]
        for k, piece in zip(mine, pieces, strict=True):
            out[k] = piece
    return out


def _numbers(blobs: list[bytes], field: str, number: int, counts: list[int]) -> list[Any] | None:
    """The values of packed numbers (one blob per tensor), as the runtime reads them; None when a blob does not
    hold its tensor's count."""
    if field in _FIXED:
        size = np.dtype(_FIXED[field]).itemsize
        if list(map(len, blobs)) != [c * size for c in counts]:
            return None
        return np.frombuffer(b"".join(blobs), dtype=_FIXED[field]).tolist()
    if [len(b.translate(None, _HIGH)) for b in blobs] != counts:
        return None
    typed = _flat()["Typed"].FromString(b"".join(map(_field, repeat(number), blobs)))
    return list(getattr(typed, field))
