"""A poll's KServe binary-mode CloudEvents read as halves with a typed JSON decoder, with the values of
:func:`~exporter.stream.payloads.platforms.kserve_half` for each, or not at all (None: the caller reads them one by
one, and refuses what it refuses).

``orjson.loads`` makes a Python object of every key and value of a body, most of which a half never reads
(parameters, content types, the response's model name). msgspec decodes a body into typed structs of the fields
read (tensors: name, shape, datatype, data, parameters) and skips the others: 1.7 against 3.4 µs for the bench's
request and response, measured. msgspec refuses more than orjson (a wrong type, nesting past 1000
levels: then None), and accepts three things orjson does not read alike, each certified away first:

- a skipped field is not checked for UTF-8: every body of the poll must be UTF-8 (checked at once, the bodies
  joined by a newline, so that no sequence can straddle two of them; a gzip body, whose magic is not UTF-8, goes
  with them);
- an integer beyond 64 bits is exact in msgspec and a float in orjson: a poll with a run of 19 digits anywhere in
  its bodies is left to the record-by-record path;
- a number beyond a float (``1e400``) in a skipped field is not checked: orjson refuses the body. It needs an
  exponent of 3 digits or a run of 19 (1.8e308 at most): a poll with a number of such an exponent is left to the
  record-by-record path too.

The CloudEvent attributes are read column by column over the poll's headers, the times by
:func:`~exporter.stream.decode.timestamps.epochs`, each tensor by :func:`~exporter.stream.payloads.oip.json_tensor`
(the one rule of JSON tensors). Records of other models, and of a component the model does not count (its
``ce_component`` header), are ignored first, whatever their body, as record by record. Only the usual poll is read
here: at least :data:`_FEWEST` records, binary mode, neither gzip nor another content encoding, every record a
request or a response of a named InferenceService with an id, each body's tensors read without refusal; anything
else is left to the record-by-record path.
"""

from __future__ import annotations

import importlib.util
import re
from collections import Counter
from collections.abc import Collection, Mapping, Sequence
from functools import cache, lru_cache
from itertools import compress, repeat
from operator import gt, not_
from typing import Any, Final, Literal

import msgspec
import numpy as np

from exporter.stream.decode.route import ignore_reason
from exporter.stream.decode.timestamps import epoch, epochs
from exporter.stream.payloads.oip import DATATYPES, PD_JSON, BadPayload, Columns, json_tensor
from exporter.stream.payloads.pairs import HalfBlock, PollBlocks
from exporter.stream.payloads.platforms import (
    REQUEST_TYPE,
    RESPONSE_TYPE,
    STRUCTURED,
    Half,
    _metadata,
    _says_gzip,
    texts,
)
from exporter.stream.payloads.platforms import _text as _header_text
from exporter.stream.payloads.polls import header_table

_FEWEST: Final = 16
"""A poll of fewer records is read record by record: the columns cost about 35 µs per poll whatever its size (a
few numpy calls). Measured per record, one pass against each record alone: 13.2 against 8.2 µs in polls of 4, even
at 8, 6.2 against 7.8 at 16, 4.5 against 7.8 at 64."""
_KEPT: Final = {b"0123456789": b"9" * 10, b".eE+-": b".ee+-", b":,[{ \t\n\r": b",,,,,,,,"}
_NUMBERS: Final = bytes.maketrans(b"".join(_KEPT) + bytes(c for c in range(256) if bytes([c]) not in b"".join(_KEPT)),
                                  b"".join(_KEPT.values()) + b" " * (256 - sum(map(len, _KEPT))))  # fmt: skip
"""What numbers are made of, the rest as spaces: every digit as 9, an exponent's mark as ``e``, and each byte a
JSON value may follow (``:``, ``,``, ``[``, ``{``, whitespace) as ``,``. Runs found by substring searches (a regular
expression over all of a poll's bodies took 2.5 µs per record)."""
_LONG: Final = b"9" * 19
"""An integer msgspec and orjson may read apart (beyond 64 bits: exact against a float) has at least 19 digits."""
_EXPONENT: Final = (b"e999", b"e+999")
_BIG: Final = re.compile(rb",-?[9.]+e\+?999")
"""A number that may be beyond a float (a positive exponent of 3 digits or more), as :data:`_NUMBERS` writes it:
looked for only where a substring search found such an exponent (a hex id such as ``5e812`` has one, but inside a
string, after no ``,``)."""


class _Parameters(msgspec.Struct, gc=False):
    content_type: Any = None


class _Tensor(msgspec.Struct, gc=False):
    name: str
    shape: list[int]
    datatype: str
    data: list[Any]
    parameters: _Parameters | None = None  # not an object: msgspec refuses, read record by record


class _Body(msgspec.Struct, gc=False):
    """A body's tensors: never tracked by the collector (``gc=False``: a struct of these fields holds no cycle), so
    a poll's decoded bodies add no objects to its passes but their lists (measured: 2.98 against 3.33 µs per record
    for the decode alone)."""

    inputs: list[_Tensor] | msgspec.UnsetType = msgspec.UNSET
    outputs: list[_Tensor] | msgspec.UnsetType = msgspec.UNSET


_DECODE: Final = msgspec.json.Decoder(_Body).decode

Read = tuple[list[Half], list[int], Counter[str]]
"""The halves, where each one's record was among the records read, and the records ignored by reason."""
Blocks = tuple[PollBlocks, Counter[str]]
"""The halves as the poll's two blocks, and the records ignored by reason."""


def halves(records: Sequence[tuple[bytes | None, Any, bytes | None, int]], models: Collection[str],
           counted: Mapping[str, str] | None, blocks: bool = False) -> Read | Blocks | None:  # fmt: skip
    """The poll's KServe records (value, headers, key, Kafka timestamp in ms) as ``read_halves`` reads them one by
    one: the halves, where each was, the records ignored; None when the poll is not the usual one (see the module),
    to be read record by record. ``blocks``: the same halves as two blocks (:func:`_poll_blocks`) where they can
    be."""
    if len(records) < _FEWEST:
        return None
    column = header_table([r[1] for r in records], _READ)[0]
    n = len(records)
    models_of = _distinct_texts(column["ce_inferenceservicename"])
    if None in models_of:
        return None  # structured mode, or no model named: record by record
    ignored: Counter[str] = Counter()
    components = [c or "" for c in _distinct_texts(column["ce_component"])]
    at = [i for i, model in enumerate(models_of) if model in models]
    if len(at) < n:
        ignored.update(ignore_reason(m) for m in models_of if m not in models)
    content_types = column["content-type"]
    if any(map(_structured, {content_types[i] for i in at})):
        return None  # structured mode: the event in the value names the model and component
    if counted:  # another component's log of a model that counts one: ignored, whatever its body
        mine = [i for i in at if not components[i] or counted.get(models_of[i] or "", components[i]) == components[i]]
        ignored["other_component"] += len(at) - len(mine)
        at = mine
    if len(at) < n:
        records, models_of, components, n = ([records[i] for i in at], [models_of[i] for i in at],
                                             [components[i] for i in at], len(at))  # fmt: skip
        column = {name: [values[i] for i in at] for name, values in column.items()}
        if not n:
            return [], [], +ignored
    encodings = zip(column["content-type"], column["content-encoding"], column["ce_contentencoding"], strict=True)
    for content_type, encoding, attribute in set(encodings):
        if _says_gzip(_header_text(content_type), _header_text(encoding) or _header_text(attribute)):
            return None  # a body said to be gzip
    kinds = column["ce_type"]  # compared as bytes: a value that is not UTF-8 is neither type
    pids = texts(column["ce_id"])
    if not set(kinds) <= _TYPES or not all(pids):
        return None  # refused record by record
    values = [r[0] for r in records]
    if not all(values):
        return None
    joined = b"\n".join(values)  # type: ignore[arg-type]  # all bytes: checked above
    if not joined.isascii():
        try:
            joined.decode()
        except UnicodeDecodeError:
            return None
    numbers = joined.translate(_NUMBERS)
    if _LONG in numbers or (any(e in numbers for e in _EXPONENT) and _BIG.search(numbers)):
        return None
    responses = list(map(_RESPONSE.__eq__, kinds))
    stamps, logged = texts(column["ce_time"]), column["ce_metadata"]
    if blocks and _arrow() and len(set(models_of)) == 1 and len(set(components)) == 1 and set(logged) <= _NO_METADATA:
        stamped = epochs(stamps) if None not in stamps else None  # every time valid: an array, no Kafka time read
        when = stamped if isinstance(stamped, np.ndarray) else np.array(_times(stamps, [r[3] for r in records]),
                                                                      dtype=np.float64)  # fmt: skip
        poll = _poll_blocks(values, responses, pids, when, models_of[0], components[0])  # type: ignore[arg-type]
        if poll is not None:
            return poll, +ignored
    read = _columns(values, responses)  # type: ignore[arg-type]  # all bytes: checked above
    if read is None:
        return None
    rows, tables = read
    times = _times(stamps, [r[3] for r in records])
    if set(logged) <= _NO_METADATA:  # the usual record: nothing logged (``{}``), read without a parse
        metadata: list[dict[str, Any]] = [{} for _ in logged]
    else:
        try:
            metadata = [{} if response else _metadata(text)
                        for response, text in zip(responses, texts(logged), strict=True)]  # fmt: skip
        except BadPayload:
            return None
    found = list(map(Half, pids, responses, models_of, times, rows, tables, values, metadata, repeat(None, n),
                     components))  # fmt: skip
    return found, at, +ignored


_READ: Final = ("ce_inferenceservicename", "content-type", "content-encoding", "ce_contentencoding", "ce_type",
                "ce_id", "ce_time", "ce_metadata", "ce_component")  # fmt: skip
"""The headers a half is read from."""
_TYPES: Final = frozenset({REQUEST_TYPE.encode(), RESPONSE_TYPE.encode()})
_RESPONSE: Final = RESPONSE_TYPE.encode()
_NO_METADATA: Final = frozenset({None, b"", b"{}"})
"""``metadata`` values that log no header (``_metadata`` reads each as ``{}``)."""


def _structured(content_type: bytes | None) -> bool:
    """Whether a record is a structured-mode CloudEvent, by its ``content-type`` (as ``kserve_event`` tells it)."""
    kind = _header_text(content_type)
    return kind is not None and kind.startswith(STRUCTURED)


def _distinct_texts(values: list[bytes | None]) -> list[str | None]:
    """Header values of few distinct values (a model's name, a component) as :func:`texts` reads them, each distinct
    value decoded once."""
    found = {v: _header_text(v) for v in set(values)}
    return list(map(found.__getitem__, values))


def _columns(values: list[bytes], responses: list[bool]) -> tuple[list[int], list[Columns]] | None:
    """Each body's rows and columns, as ``json_body`` reads them; None when one would be refused or is not v2. Each
    body is decoded and dropped in turn: a poll's structs alive together cost the collector more than they saved
    (measured with the collector on: 14.5 against 15.6 µs per record for the whole path, 9.8 against 12.4 off)."""
    rows, tables = [], []
    try:
        for value, response in zip(values, responses, strict=True):
            body = _DECODE(value)
            tensors = body.outputs if response else body.inputs
            if tensors is msgspec.UNSET:
                return None  # a v1 body, or none: record by record
            out: Columns = {}
            found: int | None = None
            for tensor in tensors:
                if tensor.datatype not in DATATYPES:
                    return None
                k = json_tensor(tensor.name, tensor.shape, tensor.data, tensor.datatype,
                                None if tensor.parameters is None else tensor.parameters.content_type, out)
                if found is not None and k != found:
                    return None
                found = k
            rows.append(found or 0)
            tables.append(out)
    except (BadPayload, msgspec.DecodeError, RecursionError):
        return None
    return rows, tables


def _poll_blocks(values: list[bytes], responses: list[bool], pids: list[str], when: np.ndarray, model: str,
                 component: str) -> PollBlocks | None:  # fmt: skip
    """The poll's requests and responses as two blocks (their halves' values as :func:`_columns` reads them), when
    no call is twice in one direction, no response comes before its poll's request and each direction's columns
    can be blocks (:func:`_block_columns`); else None."""
    asks = list(map(not_, responses))
    at = [list(compress(range(len(values)), asks)), list(compress(range(len(values)), responses))]
    calls = [list(compress(pids, asks)), list(compress(pids, responses))]
    first = dict(zip(calls[0], at[0], strict=True))
    if len(first) < len(calls[0]) or len(set(calls[1])) < len(calls[1]) or \
            any(map(gt, map(first.get, calls[1], repeat(-1)), at[1])):  # fmt: skip
        return None
    kinds = np.fromiter(responses, dtype=bool, count=len(responses))
    sides = []
    for response, chosen, pairs in zip((False, True), (asks, responses), calls, strict=True):
        mine = list(compress(values, chosen))
        read = _block_columns(mine, response)
        if read is None:
            return None
        sides.append(HalfBlock(model, response, pairs, None, when[kinds if response else ~kinds],
                               np.array(read[0], dtype=np.int64), read[1], mine, component))  # fmt: skip
    return PollBlocks(sides[0], sides[1], responses)


def _block_columns(values: list[bytes], response: bool) -> tuple[list[int], dict[str, Any]] | None:
    """Each body's rows, and its tensors as Arrow list arrays (one list per body), when every body has the first
    one's tensors (:func:`_typed`: the same names, datatypes, shapes' form and parameters, in the same order, each
    one column of flat values that :func:`~exporter.stream.payloads.oip.json_tensor` takes as they are) of one type
    Arrow gives back as the decoder made it (text, integers, floats or booleans, nulls among them), each tensor's
    first dimension its length and every tensor of a body of as many rows; else None. The values of each tensor
    are gathered in one list as the bodies are decoded, each body dropped in turn (:func:`_columns`)."""
    import pyarrow as pa

    if not values:
        return [], {}
    try:
        first = _DECODE(values[0])
        signature = _signature(first.outputs if response else first.inputs)
        if signature is None:
            return None
        decode = _typed(signature, response)
        flats: list[list[Any]] = [[] for _ in signature]
        lengths: list[list[int]] = [[] for _ in signature]
        firsts: list[list[int]] = [[] for _ in signature]
        for value in values:
            for tensor, flat, length, rows in zip(decode(value).tensors, flats, lengths, firsts):  # noqa: B905
                data = tensor.data
                flat += data
                length.append(len(data))
                rows.append(tensor.shape[0])
    except (msgspec.DecodeError, RecursionError):
        return None
    if any(length != lengths[0] for length in lengths) or firsts != lengths:
        return None  # a tensor's first dimension not its length, or tensors of a body of unequal rows
    columns = {}
    for (name, *_), flat, length in zip(signature, flats, lengths, strict=True):
        try:
            array = pa.array(flat)
        except (pa.ArrowException, ValueError, TypeError, OverflowError):  # UnicodeEncodeError: a ValueError
            return None
        if array.type not in _arrow() or (array.type == pa.float64() and not set(map(type, flat)) <= _FLOATS):
            return None  # nested values, or integers or booleans among floats (Arrow would make them floats)
        offsets = np.zeros(len(length) + 1, dtype=np.int64)
        np.cumsum(length, out=offsets[1:])
        columns[name] = pa.LargeListArray.from_arrays(pa.array(offsets), array)
    return lengths[0], columns


Signature = tuple[tuple[str, str, int, bool, Any], ...]
"""Each tensor's name, datatype, shape's length, whether it has parameters, and their content type."""


def _signature(tensors: list[_Tensor] | msgspec.UnsetType) -> Signature | None:
    """The first body's tensors as :func:`_typed` takes them; None where no block is read: no tensor, a name twice,
    a datatype or content type ``json_tensor`` does not take as they are, a shape of other than one column, a
    content type msgspec cannot require (not text, an integer or null)."""
    if tensors is msgspec.UNSET or not tensors or len({t.name for t in tensors}) < len(tensors):
        return None
    found = []
    for t in tensors:
        content = None if t.parameters is None else t.parameters.content_type
        if (t.datatype not in DATATYPES or content == PD_JSON or (content == "base64" and t.datatype == "BYTES")
                or content.__class__ not in _LITERAL or not 1 <= len(t.shape) <= 2):  # fmt: skip
            return None
        found.append((t.name, t.datatype, len(t.shape), t.parameters is not None, content))
    return tuple(found)


_LITERAL: Final = frozenset({str, int, type(None)})


@lru_cache(maxsize=256)
def _typed(signature: Signature, response: bool) -> Any:
    """A decoder of the bodies whose tensors (``outputs`` of a response, else ``inputs``, as ``tensors``) are the
    signature's, else msgspec refuses the body: the names, datatypes and content types as literals, the shape
    ``[n]`` or ``[n, 1]`` as a tuple, so that every check but the lengths is msgspec's, with no Python step per
    tensor (2.7 against 1.8 µs per record, measured)."""
    tensors = []
    for k, (name, datatype, dims, has_parameters, content) in enumerate(signature):
        parameters: Any = None
        if has_parameters:
            parameters = msgspec.defstruct(f"Parameters{k}", [("content_type", Literal[content], None)], gc=False)
        tensors.append(msgspec.defstruct(f"Tensor{k}", [
            ("name", Literal[name]), ("datatype", Literal[datatype]),
            ("shape", tuple[int] if dims == 1 else tuple[int, Literal[1]]), ("data", list[Any]),
            ("parameters", parameters, None)], gc=False))  # fmt: skip
    field = "outputs" if response else "inputs"
    body = msgspec.defstruct("Body", [("tensors", tuple[tuple(tensors)])], rename={"tensors": field},  # type: ignore[misc]
                             gc=False)  # fmt: skip
    return msgspec.json.Decoder(body).decode


_FLOATS: Final = frozenset({float, type(None)})


@cache
def _arrow() -> frozenset[Any]:
    """The Arrow types a block's values may have; none when pyarrow is not installed (the ``gate`` or
    ``seldon-arrow`` extra, in the full image): then no poll is made blocks."""
    if importlib.util.find_spec("pyarrow") is None:
        return frozenset()
    import pyarrow as pa

    return frozenset({pa.string(), pa.int64(), pa.float64(), pa.bool_(), pa.null()})


def _times(stamps: list[str | None], record_ms: list[int]) -> list[float | None]:
    """Each half's time: its CloudEvent's ``time``, else the record's Kafka timestamp, as ``kserve_half`` reads it."""
    if None not in stamps:
        found = epochs(stamps)
        whens = found if isinstance(found, list) else found.tolist()
    else:
        whens = [None if t is None else epoch(t) for t in stamps]
    return [
        when if when is not None else (ms / 1000 if ms > 0 else None) for when, ms in zip(whens, record_ms, strict=True)
    ]
