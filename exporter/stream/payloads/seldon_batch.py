"""A poll's Seldon protobuf records read as halves in a few C calls, with the values of
:func:`~exporter.stream.payloads.platforms.seldon_half` for each, or not at all (None: the caller reads them one by
one, and refuses what it refuses).

Reading a message's tensors through the protobuf runtime costs a Python step per field of every tensor (measured:
4.4 µs for a request's two tensors, three times the parse itself). Here the records are read together instead:

1. All records framed as one ``repeated ModelInferRequest`` (or Response) message, parsed by the very classes of
   :func:`~exporter.stream.payloads.oip.messages`: it fails exactly when one record would (then None). ptars alone
   cannot be trusted with that: it accepts what the runtime refuses (a packed float field of a length not a
   multiple of 4, a group closed by another field's end tag: tests/test_payload_batch.py).
2. The same records turned by ptars (Rust, the ``seldon-arrow`` extra; without it: None) into one Arrow record
   batch: ids, tensors (name, datatype, shape, typed contents) and raw contents as columns, read by Arrow's compute
   functions and numpy with no Python object per record until the halves are made. ptars reads what the runtime
   accepts as the runtime does (packed or not, a singular field's last value, a repeated message merged, unknown
   fields and wire types skipped: tested against it, fuzzed records included).

Only the usual poll is read here: at least :data:`FEWEST` records, each protobuf, the same number of tensors in
every record, raw contents in every record or in none, each tensor's contents exactly its shape's count, no tensor
of MLServer's ``pd_json`` (:data:`_PD_JSON`), no record refused; anything else is left to the record-by-record path
(None). Tensor shapes are checked once per distinct
(name, datatype, shape) by the rules of :func:`~exporter.stream.payloads.oip.proto_body`.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Collection, Sequence
from functools import cache, lru_cache
from typing import Any, Final

import numpy as np

from exporter.stream.payloads import polls
from exporter.stream.payloads.oip import _CONTENTS, DATATYPES, PD_JSON, BadPayload, _raw_values, _text, messages
from exporter.stream.payloads.platforms import SELDON_RESERVED, SELDON_TYPES, Half, headers_of_poll, seldon_model, texts
from exporter.stream.payloads.platforms import _text as _header_text

FEWEST: Final = 128
"""A poll of fewer records is read record by record: ptars and Arrow cost about half a millisecond per poll whatever
its size (measured: 630 µs for one record, 7.6 µs per record in polls of 128 against 10.9 for each record alone,
13.1 against 10.1 in polls of 64)."""
_PD_JSON: Final = PD_JSON.encode()
"""A poll whose records hold these bytes anywhere is read record by record: a tensor of MLServer's ``pd_json``
(elements JSON text, loaded one by one: rare, an object column holding other than strings) is read there alone.
Looked for in the poll's records joined, as the runtime certifies them: 0.5 ns per byte (a search per record
measured 0.2 µs each); a poll with no ``j`` byte at all (one memchr, 1 ns per record) is spared it."""
MOST_BYTES: Final = 1 << 30
"""A poll's records larger than this together are read record by record (a protobuf message holds under 2 GiB)."""
_MOST_COLUMNS: Final = 4096
"""A tensor of more columns than this (a shape claims them before any value is counted) is read record by
record."""
_MOST_DIMS: Final = 32
"""A tensor shape of more dimensions than this is read record by record (the shapes are compared as rows of a
matrix this wide)."""


@cache
def arrow() -> bool:
    """Whether ptars is installed (the ``seldon-arrow`` extra; without it each record is read alone)."""
    return importlib.util.find_spec("ptars") is not None


@cache
def _readers(response: bool) -> tuple[Any, Any]:
    """The batch message (``repeated ModelInferRequest items = 1``, or Response) that certifies a poll, and the
    ptars handler that reads the same framed bytes as ``repeated Read<kind> items = 1`` into one Arrow row whose
    ``items`` are the records with the fields read (id, ``tensors``, ``raw``; the others skipped as unknown: fewer
    columns to build, measured 40% less per poll): one message for ptars too, no list of records to walk (measured
    495 against 570-606 ns per record of two tensors)."""
    import ptars
    from google.protobuf import descriptor_pb2, message_factory

    pool = messages()[0].DESCRIPTOR.file.pool
    try:
        pool.FindMessageTypeByName("batch.Requests")
    except KeyError:
        fd = descriptor_pb2.FileDescriptorProto(name="fairness_exporter_batch.proto", package="batch",
                                                syntax="proto3",
                                                dependency=["fairness_exporter_oip.proto"])  # fmt: skip
        for kind in ("Request", "Response"):
            fd.message_type.add(name=f"{kind}s").field.add(name="items", number=1, label=3, type=11,
                                                           type_name=f".inference.ModelInfer{kind}")  # fmt: skip
            read = fd.message_type.add(name=f"Read{kind}")
            read.field.add(name="id", number=3, label=1, type=9)
            read.field.add(name="tensors", number=5, label=3, type=11, type_name=".batch.Tensor")
            read.field.add(name="raw", number=6 if kind == "Response" else 7, label=3, type=12)
            fd.message_type.add(name=f"Read{kind}s").field.add(name="items", number=1, label=3, type=11,
                                                               type_name=f".batch.Read{kind}")  # fmt: skip
        tensor = fd.message_type.add(name="Tensor")
        for name, number, scalar in (("name", 1, 9), ("datatype", 2, 9), ("shape", 3, 3)):
            tensor.field.add(name=name, number=number, label=3 if name == "shape" else 1, type=scalar)
        tensor.field.add(name="contents", number=5, label=1, type=11, type_name=".inference.InferTensorContents")
        pool.Add(fd)
    kind = "Response" if response else "Request"
    certify = message_factory.GetMessageClass(pool.FindMessageTypeByName(f"batch.{kind}s"))
    read = pool.FindMessageTypeByName(f"batch.Read{kind}s")
    return certify, ptars.HandlerPool([read.file]).get_for_message(read)


def arrow_batch(framed: bytes, response: bool) -> Any:
    """The records framed as one message (``polls.frame_records``) as an Arrow struct array, one element per
    record, of the fields ptars reads (:func:`_readers`)."""
    return _readers(response)[1].list_to_record_batch([framed]).column("items").flatten()


@lru_cache(maxsize=1024)
def _plan(name: str, datatype: str, dims: tuple[int, ...]) -> tuple[int, int, tuple[str, ...], str] | None:
    """A tensor's rows, values and column names by the rules of ``proto_body`` and ``_split`` (None: it would be
    refused, or is not read here), and the contents field its values are in."""
    if datatype not in DATATYPES or datatype == "FP16" or not dims or any(d < 0 for d in dims):
        return None
    width = 1
    for d in dims[1:]:
        width *= d
    if width > _MOST_COLUMNS or dims[0] * width > MOST_BYTES:
        return None  # its names are made only once its values are counted (and no poll holds more values than
        # bytes, nor an int64 array such a count): record by record
    names = (name,) if width == 1 else tuple(f"{name}-{i}" for i in range(width))
    return dims[0], dims[0] * width, names, _CONTENTS[datatype]


def halves(topic: str, records: Sequence[tuple[bytes | None, Any, bytes | None, int]], models: Collection[str],
           response: bool | None) -> list[Half] | None:  # fmt: skip
    """The poll's records of one Seldon topic (value, headers, key, Kafka timestamp in ms) as halves, each as
    ``seldon_half`` reads it; None when the poll is not the usual one (see the module), to be read record by
    record."""
    read = _read(topic, records, models, response)
    if read is None:
        return None
    model, response, pids, pipelines, rows, tables, metadata = read
    return [Half(f"{pipeline}.{pid}" if pipeline else pid, response, model, r[3] / 1000 if r[3] > 0 else None, n,
                 table, r[0], found, pid if pipeline else None)
            for pid, pipeline, r, n, table, found in zip(pids, pipelines, records, rows, tables, metadata, strict=True)]


def _read(topic: str, records: Sequence[tuple[bytes | None, Any, bytes | None, int]], models: Collection[str],
          response: bool | None) -> tuple[Any, ...] | None:  # fmt: skip
    """Model, direction, each record's id, pipeline, rows, columns and metadata; None when the poll is not read
    here."""
    model, by_name = seldon_model(topic)
    response = by_name if by_name is not None else response
    if response is None or model is None or model not in models or len(records) < FEWEST or not arrow():
        return None
    values: list[bytes] = [r[0] for r in records]  # type: ignore[misc]  # None: refused by the check below
    if not all(values) or any(v[:1] == b"\x00" for v in values) or sum(map(len, values)) > MOST_BYTES:
        return None  # an empty value, a schema-registry framing, or more than one message may hold
    headers, names = headers_of_poll([r[1] for r in records])
    kinds = set(map(_header_text, {h.get("seldon-infer-type") for h in headers}))
    if any(SELDON_TYPES.get(kind or "") for kind in kinds) or (not kinds <= SELDON_TYPES.keys() and any(
            v.lstrip()[:1] == b"{" for v in values)):  # fmt: skip
        return None  # JSON (or, without the header, maybe: the check looks at every record then)
    plain = response or names <= SELDON_RESERVED
    read = columns(values, response)
    if read is None:
        return None
    ids, rows, tables = read
    pids = [p or _header_text(r[2]) or own for p, r, own in zip(texts(h.get("x-request-id") for h in headers), records,
                                                                  ids, strict=True)]  # fmt: skip  # seldon_call's rule
    if not all(pids):
        return None  # refused (no id) record by record
    pipelines = texts(h.get("pipeline") for h in headers)
    metadata = [{} for _ in headers] if plain else [{
        k: _header_text(v) for k, v in h.items() if k not in SELDON_RESERVED} for h in headers]  # fmt: skip
    return model, response, pids, pipelines, rows, tables, metadata


def columns(values: list[bytes], response: bool, as_block: bool = False, framed: bytes | None = None) -> Read | None:
    """Each record's id, rows and columns (``as_block``: each column's Arrow lists), or None (not the usual poll, or
    not a block). ``framed``: the records framed as one message (``polls.frame_records``), if made already."""
    certify = _readers(response)[0]
    _, _, error = messages()
    if framed is None:
        framed = polls.frame_records(values)
    if b"j" in framed and _PD_JSON in framed:  # a memchr first: a poll with no j byte at all is spared the search
        return None  # a pd_json tensor (or those bytes anywhere): record by record
    try:
        certify.FromString(framed)
    except error:
        return None  # a record the runtime refuses: record by record, which says why
    try:
        batch = arrow_batch(framed, response)
    except Exception:  # ptars refusing or failing on records the runtime accepts (any error of a compiled
        return None  # reader: a poll it cannot read is never lost): record by record reads them alike
    n = len(values)
    if len(batch) != n:
        return None  # never seen: the runtime certified n records
    ids = batch.field("id") if as_block else [i or None for i in batch.field("id").to_pylist()]  # a block's: Arrow's
    tensors, raws = batch.field("tensors"), batch.field("raw")
    widths = tensors.value_lengths().to_numpy()
    width = int(widths[0])
    raw_widths = raws.value_lengths().to_numpy()
    if (widths != width).any() or (raw_widths.any() and (raw_widths != width).any()):
        return None  # records of different tensor counts, or raw contents in some (or not one per tensor)
    if not width:
        return (ids, np.zeros(n, dtype=np.int64), {}) if as_block else (ids, [0] * n, [{} for _ in range(n)])
    if as_block:
        return None if raw_widths.any() else _block_columns(tensors.flatten(), n, width, ids)
    return _tensor_columns(tensors.flatten(), raws.flatten() if raw_widths.any() else None, n, width, ids)


Read = tuple[Any, Any, Any]
"""Each record's id (None: none; a block's: an Arrow array, "" for none), rows (a list; a block's: a numpy array)
and columns (a dict per record, or a block's Arrow lists by name)."""


def _block_columns(found: Any, n: int, width: int, ids: Any) -> Read | None:
    """Each record's id and rows, and each tensor position's values as one Arrow list per record, by its name: when
    every record's tensor at a position is one column of one name and contents field (its shape may differ), the
    names differ, and every tensor's values are its shape's count (as :func:`_typed` checks); else None."""
    import pyarrow as pa
    import pyarrow.compute as pc

    plans = _plans(found, width)
    if plans is None:
        return None
    plan_of, which = plans
    at = which.reshape(n, width)
    kinds = [{(plan_of[p][2], plan_of[p][3]) for p in np.flatnonzero(np.bincount(at[:, k], minlength=len(plan_of)))}
             for k in range(width)]  # fmt: skip
    if any(len(kind) != 1 or len(next(iter(kind))[0]) != 1 for kind in kinds):
        return None
    names = [next(iter(kind))[0][0] for kind in kinds]
    if len(set(names)) != width:
        return None
    rows = np.array([p[0] for p in plan_of], dtype=np.int64)[at]
    if (rows != rows[:, :1]).any():
        return None  # unequal_rows: refused record by record
    counts = np.array([p[1] for p in plan_of], dtype=np.int64)[at]
    contents = found.field("contents")
    by_field = dict(zip([f.name for f in contents.type], contents.flatten(), strict=True))
    columns: dict[str, Any] = {}
    for k, (name, kind) in enumerate(zip(names, kinds, strict=True)):
        field = next(iter(kind))[1]
        chosen = by_field[field] if width == 1 else by_field[field].take(pa.array(np.arange(k, n * width, width)))
        if not np.array_equal(pc.fill_null(pc.list_value_length(chosen), 0).to_numpy(), counts[:, k]):
            return None  # shape_mismatch: refused record by record
        flat = chosen.flatten()
        if field == "bytes_contents":
            flat = flat.view(pa.string())
            try:
                flat.validate(full=True)  # each element UTF-8, as Python's strict decoder reads it
            except pa.ArrowInvalid:
                return None  # not_utf8: refused record by record
        offsets = pa.array(np.concatenate([[0], np.cumsum(counts[:, k])]), type=pa.int32())
        columns[name] = pa.ListArray.from_arrays(offsets, flat)
    return ids, rows[:, 0], columns


def _tensor_columns(found: Any, raws: Any, n: int, width: int, ids: list[str | None]) -> Read | None:
    """Each record's id, rows and columns from its ``width`` tensors (``found``, an Arrow struct array of the
    tensors record after record; ``raws``: their raw contents, or None)."""
    plans = _plans(found, width)
    if plans is None:
        return None
    plan_of, which = plans
    tensor_rows = np.array([p[0] for p in plan_of], dtype=np.int64)[which].reshape(n, width)
    if (tensor_rows != tensor_rows[:, :1]).any():
        return None  # unequal_rows: refused record by record
    tensor_plans = [plan_of[k] for k in which.tolist()]
    tensor_values: list[Any]
    try:
        if raws is not None:
            datatypes = found.field("datatype").to_pylist()
            tensor_values = list(map(_raw, raws.to_pylist(), datatypes, tensor_plans))
        else:
            tensor_values = _typed(found.field("contents"), plan_of, which, tensor_plans)
    except BadPayload:
        return None
    if None in tensor_values:
        return None
    rows = tensor_rows[:, 0].tolist()
    if all(len(p[2]) == 1 for p in plan_of):  # a record's dict from its tensors' (name, values), made in C
        names = [p[2][0] for p in tensor_plans]
        return ids, rows, list(map(dict, zip(*[zip(names[k::width], tensor_values[k::width], strict=True)
                                              for k in range(width)], strict=True)))  # fmt: skip
    tables: list[dict[str, Any]] = [{} for _ in ids]
    for k, (plan, values) in enumerate(zip(tensor_plans, tensor_values, strict=True)):
        named = plan[2]
        for i, column in enumerate(named):
            tables[k // width][column] = values if len(named) == 1 else values[i :: len(named)]
    return ids, rows, tables


def _plans(found: Any, width: int) -> tuple[list[Any], np.ndarray] | None:
    """The distinct tensors' plans (:func:`_plan`), and which is each tensor's (``width`` a record); None when one
    is not read here."""
    import pyarrow as pa

    name_at, name_of = polls.encoded(found.field("name"), width)
    datatype_at, datatype_of = polls.encoded(found.field("datatype"), width)
    shapes = found.field("shape")
    lengths = shapes.value_lengths().to_numpy()
    most = int(lengths.max())
    if most > _MOST_DIMS:
        return None
    key = np.zeros((len(found), 3 + most), dtype=np.int64)  # name, datatype, rank, dimensions
    key[:, 0] = name_at
    key[:, 1] = datatype_at
    key[:, 2] = lengths
    dims = shapes.flatten().to_numpy()
    if (lengths == most).all():  # every shape of one rank (the usual poll): its dimensions a row each
        key[:, 3:] = dims.reshape(len(found), most)
    else:
        starts = np.cumsum(lengths) - lengths
        key[np.repeat(np.arange(len(found)), lengths), np.arange(len(dims)) - np.repeat(starts, lengths) + 3] = dims
    rows = pa.FixedSizeBinaryArray.from_buffers(pa.binary(key.shape[1] * 8), len(key), [None, pa.py_buffer(key)])
    encoded = rows.dictionary_encode()  # one hash pass (np.unique's row sort measured 1.7 µs per record)
    distinct = np.frombuffer(encoded.dictionary.buffers()[1], dtype=np.int64).reshape(-1, key.shape[1])
    plan_of = [_plan(name_of[k[0]], datatype_of[k[1]], tuple(k[3 : 3 + k[2]])) for k in distinct.tolist()]
    if None in plan_of:
        return None
    return plan_of, encoded.indices.to_numpy()


def _raw(raw: bytes, datatype: str, plan: tuple[int, int, tuple[str, ...], str]) -> list[Any] | None:
    """A tensor's values from its raw contents, as ``proto_body`` reads them; None when they are not its shape's
    count."""
    values = _raw_values(raw, datatype)
    if len(values) != plan[1]:
        return None
    return _text(values) if datatype == "BYTES" else values


def _typed(contents: Any, plan_of: list[Any], which: np.ndarray, tensor_plans: list[Any]) -> list[Any]:
    """Each tensor's values from its typed contents (an Arrow struct array, null where a tensor has none), by its
    plan's field, as ``proto_body`` reads them; None for each tensor when one tensor's values are not exactly its
    shape's count."""
    import pyarrow as pa
    import pyarrow.compute as pc

    fields = np.array([p[3] for p in plan_of], dtype=object)[which]
    counts = np.array([p[1] for p in plan_of], dtype=np.int64)[which]
    by_field = dict(zip([f.name for f in contents.type], contents.flatten(), strict=True))
    out: list[Any] = [None] * len(tensor_plans)
    for field in set(fields.tolist()):
        mine = fields == field
        every = bool(mine.all())  # the usual poll: one field holds every tensor's values
        chosen = by_field[field] if every else by_field[field].filter(pa.array(mine))
        sizes = counts if every else counts[mine]
        if not np.array_equal(pc.fill_null(pc.list_value_length(chosen), 0).to_numpy(), sizes):
            return [None] * len(out)  # shape_mismatch: refused record by record
        flat = chosen.flatten()  # BYTES as text: each element decoded by Python's own strict UTF-8 decoder
        offsets = pa.array(np.concatenate([[0], np.cumsum(sizes)]), type=pa.int32())
        try:
            pieces = pa.ListArray.from_arrays(offsets, flat.view(pa.string()) if field == "bytes_contents" else
                                              flat).to_pylist()  # fmt: skip
        except (UnicodeDecodeError, pa.ArrowException):
            return [None] * len(out)  # not_utf8: refused record by record
        if every:
            return pieces
        for k, piece in zip(np.flatnonzero(mine).tolist(), pieces, strict=True):
            out[k] = piece
    return out
