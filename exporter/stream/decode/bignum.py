"""An event that holds a number beyond a float (``1e400``, ``-1E+999``, a 400-digit integer) read as the msgspec
schemas read it, on the paths that parse with orjson.

Such a body is valid JSON (RFC 8259 sets no range), and the two parsers the decoders use disagree on it: msgspec
skips a field its schema does not read without converting it, while orjson refuses the whole body. An event's fate
then hung on which parser took it, and that hangs on the schema: the fleet's shared schema and a model's own refuse
different events (a prediction a scored model does not read, a segment that is another model's side id), so the
fleet and the model decoding alone disagreed (docs/contract.md). The rule is now the schemas' everywhere: such a
number in a field the daemon reads (at the field or anywhere inside its value) makes the event ``malformed_json``;
anywhere else it is never read. orjson stays the parser: only a body it refuses for that reason is parsed again,
each such number replaced by a marker string, so that everything else orjson refuses is still refused; the cost
falls on those bodies only (one pass of a regular expression over the body, a Python step per string and number in
it, and a second parse).

The numbers are found by one scan of the body's strings and numbers, in the order JSON's grammar reads them: a
string (escapes included) is stepped over whole, so no digit inside one is ever taken for a number. A valid body
stays valid with its numbers replaced, and an invalid one invalid, except where a number stood as an object's key
(never JSON): a marker found as a key refuses the body.
"""

from __future__ import annotations

import math
import re
import secrets
from collections.abc import Sequence
from itertools import chain
from typing import Any, Final

import orjson

from exporter.config import ModelSpec
from exporter.core.encoding import proxy_columns
from exporter.stream.decode.paths import lookup

OVERFLOW: Final = "number is infinity when parsed as double"
"""orjson's message for a number beyond a float (a float literal or an integer past the float range)."""
_TOKENS: Final = re.compile(r'"(?:[^"\\]|\\.)*+(?:"|\\?\Z)|-?[0-9]+(?:\.[0-9]+)?(?:[eE][+-]?[0-9]+)?', re.DOTALL)
"""A JSON string, stepped over (an unclosed one runs to the end: no restart inside it, so the scan stays linear in
the body), or a number (a run of digits whole, leading zeros and all)."""


class _Big:
    """Where a number beyond a float was (only in fields never read)."""

    def __repr__(self) -> str:
        return "BIG"


BIG: Final = _Big()
_MARKER: Final = f"\x00fairness-exporter:big:{secrets.token_hex(16)}"
"""What such a number is parsed as, then made :data:`BIG` (random: no body carries it but by a 2^-128 chance)."""
_LITERAL: Final = orjson.dumps(_MARKER).decode()
"""The marker as JSON (its control character escaped)."""


class Reader:
    """``orjson.loads`` of an event, raising ``orjson.JSONDecodeError`` as it does, except for a body it refuses only
    for numbers beyond a float that lie in no field read. ``fields``: each field read (its keys, and whether its
    whole value is read or only the steps through it); with ``model`` (the model id's keys, read of every event),
    they are read only of the events of model ``own``."""

    def __init__(self, fields: Sequence[tuple[Sequence[str], bool]], model: Sequence[str] | None = None,
                 own: str | None = None) -> None:  # fmt: skip
        self.fields = [(list(keys), whole) for keys, whole in fields]
        self.model = None if model is None else list(model)
        self.own = own
        self.model_id = lookup(".".join(model or ()))
        """The model id of an event this reader read (paths.lookup of ``model``)."""

    def __call__(self, raw: bytes | None) -> Any:
        try:
            return orjson.loads(raw)  # type: ignore[arg-type]  # a tombstone (None) raises TypeError
        except orjson.JSONDecodeError as exc:
            event = rescued(exc)
            if self.model is None or _at(event, self.model, True, exc) == self.own:
                for keys, whole in self.fields:
                    _at(event, keys, whole, exc)
            return event


def event_reader(model: ModelSpec) -> Reader:
    """The reader of ``model``'s events (exporter/stream/decode/events.py ``_walk``): the fields it reads besides the
    model id are the id, timestamp, score and label (and the prediction, unless a score is read instead), the
    attributes object (only stepped through) and each of its columns read (attributes, proxies' surname and ZCTA,
    side ids, segments and strata), as its schema reads them (exporter/stream/decode/schema.py)."""
    f = model.events
    attributes = f.attributes.split(".")
    columns = [*(a.columns[0] for a in model.base_attributes if a.proxy is None and a.source is None),
               *chain.from_iterable(proxy_columns(model.base_attributes)),
               *(s.id for s in model.attribute_sources), *model.counted_columns]  # fmt: skip
    paths = [f.prediction_id, f.timestamp, f.score, f.label, *([f.prediction] if f.score_threshold is None else [])]
    fields = [*((p.split("."), True) for p in paths), (attributes, False), *(([*attributes, c], True) for c in columns)]
    return Reader(fields, f.model_id.split("."), model.model_id)


def rescued(exc: orjson.JSONDecodeError) -> Any:
    """The body orjson refused with ``exc``, each number beyond a float made :data:`BIG`; ``exc`` raised again when
    anything else is wrong with it."""
    if exc.msg != OVERFLOW or not exc.doc:
        raise exc
    try:
        return _marked(orjson.loads(_TOKENS.sub(_replaced, exc.doc)), exc)
    except orjson.JSONDecodeError:
        raise exc from None


def _replaced(token: re.Match[str]) -> str:
    found = token.group()
    return _LITERAL if found[0] != '"' and math.isinf(float(found)) else found


def _marked(event: Any, exc: orjson.JSONDecodeError) -> Any:
    """The parsed body with each marker made :data:`BIG` (no recursion: orjson nests 1024 deep); ``exc`` raised
    for a marker found as a key."""
    if event == _MARKER:
        return BIG
    stack = [event]
    while stack:
        node = stack.pop()
        if node.__class__ is dict:
            if _MARKER in node:
                raise exc  # a number as an object's key: no JSON
            items: Any = node.items()
        elif node.__class__ is list:
            items = enumerate(node)
        else:
            continue
        for key, value in items:
            if value.__class__ is str:
                if value == _MARKER:
                    node[key] = BIG  # a value replaced, never a key added: the iteration stands
            elif value.__class__ is dict or value.__class__ is list:
                stack.append(value)
    return event


def _at(event: Any, path: list[str], whole: bool, exc: orjson.JSONDecodeError) -> Any:
    """The value at ``path`` (None where a step is missing or no object, as paths.lookup reads it); ``exc`` raised
    where a step, the value, or (``whole``) anything inside it is such a number."""
    for key in path:
        if event is BIG:
            raise exc
        event = event.get(key) if event.__class__ is dict else None
    if event is BIG or (whole and _holds(event)):
        raise exc
    return event


def _holds(value: Any) -> bool:
    stack = [value]
    while stack:
        node = stack.pop()
        if node is BIG:
            return True
        if node.__class__ is dict:
            stack.extend(node.values())
        elif node.__class__ is list:
            stack.extend(node)
    return False
