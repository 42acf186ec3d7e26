"""An event that holds a number beyond a float (``1e400``, ``-1E+999``, a 400-digit integer) read as the msgspec
schemas read it, on the paths that parse with orjson.

Such a body is valid JSON (RFC 8259 sets no range), and the two parsers the decoders use disagree on it: msgspec
skips a field its schema does not read without converting it, while orjson refuses the whole body. An event's fate
then hung on which parser took it, and that hangs on the schema: the fleet's shared schema and a model's own refuse
different events (a prediction a scored model does not read, a segment that is another model's side id), so the
fleet and the model decoding alone disagreed (docs/contract.md). The rule is now the schemas' everywhere: such a
number in a field the daemon reads (at the field or anywhere inside its value) makes the event ``malformed_json``;
anywhere else it is never read. orjson stays the parser: only a body it refuses for that reason alone is parsed
again, each such number replaced by a marker (at orjson's own error position), so that everything else orjson
refuses is still refused; the cost falls on those bodies only.
"""

from __future__ import annotations

import re
import secrets
from collections.abc import Sequence
from itertools import chain
from typing import Any, Final

import orjson

from exporter.config import ModelSpec
from exporter.core.encoding import proxy_columns

OVERFLOW: Final = "number is infinity when parsed as double"
"""orjson's message for a number beyond a float (a float literal or an integer past the float range)."""
MOST: Final = 64
"""A body of more such numbers than this stays refused: each costs a parse of the body."""
_NUMBER: Final = re.compile(r"-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?(?:[eE][+-]?[0-9]+)?")


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
    """The body orjson refused with ``exc``, each number beyond a float made :data:`BIG`; ``exc`` (or the error
    the body raises without those numbers) raised again when anything else is wrong with it."""
    text, error = exc.doc, exc
    for _ in range(MOST):
        found = _NUMBER.match(text, error.pos) if error.msg == OVERFLOW and text else None
        if found is None:
            raise error
        text = f"{text[:error.pos]}{_LITERAL}{text[found.end():]}"
        try:
            return _marked(orjson.loads(text))
        except orjson.JSONDecodeError as again:
            error = again
    raise error


def _marked(event: Any) -> Any:
    """The parsed body with each marker made :data:`BIG` (no recursion: orjson nests 1024 deep)."""
    if event == _MARKER:
        return BIG
    stack = [event]
    while stack:
        node = stack.pop()
        items = node.items() if node.__class__ is dict else enumerate(node) if node.__class__ is list else ()
        for key, value in items:
            if value.__class__ is str:
                if value == _MARKER:
                    node[key] = BIG
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
