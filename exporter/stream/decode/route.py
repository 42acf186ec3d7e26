"""Route a batch of raw prediction events to the models they belong to, reading only each event's model id.

The topic is read once for every model; each model's decoder (exporter/stream/decode/events.py) then sees only its own
events, so its strict schema (this model's id, its group names) fits whole batches again. Routing reads one field
with msgspec, skipping the rest of the event, in one call for the usual batch of newline-free values. An event
that spoils the batch's single pass (malformed JSON, a tombstone) costs one more pass of its own: malformed
ones are rejected here (the decoder's reason), the others routed. Events of no configured model are counted by
reason, never kept: their ids reach no label, so cardinality stays bounded.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import repeat
from operator import attrgetter, itemgetter
from typing import Any, Final

import msgspec
import numpy as np

from exporter.stream.decode.bignum import Reader

UNCONFIGURED: Final = "unconfigured_model"
"""The event names a model this daemon does not monitor."""
NO_MODEL_ID: Final = "missing_model_id"
"""The event has no model id (or one that is not a string): no model could be told it is theirs."""
IGNORE_REASONS: Final = (UNCONFIGURED, NO_MODEL_ID)


def ignore_reason(model_id: object) -> str:
    """Why an event whose model id is not one of ours is ignored."""
    return UNCONFIGURED if model_id.__class__ is str else NO_MODEL_ID


def _id_struct(path: str) -> type[msgspec.Struct]:
    """A Struct holding only the value at a dotted path (missing anywhere: None); any JSON type, so that no value
    of the id refuses the batch (one that is not a string is no configured model's)."""
    *parents, leaf = path.split(".")
    node: Any = msgspec.defstruct("ModelId", [("value", Any, None)], rename={"value": leaf}, gc=False)
    for depth, key in enumerate(reversed(parents)):
        node = msgspec.defstruct(f"Level{depth}", [("child", node, msgspec.field(default_factory=node))],
                                 rename={"child": key}, gc=False)  # fmt: skip
    return node


@dataclass
class Routed:
    """A batch split by model: each model's values in input order, and what belonged to none."""

    by_model: dict[str, list[bytes]] = field(default_factory=dict)
    positions: dict[str, np.ndarray] = field(default_factory=dict)
    """Where each model's values were in the batch (the staged path tells each event's source offset by it)."""
    ignored: Counter[str] = field(default_factory=Counter)
    """Events of no configured model, by reason (:data:`IGNORE_REASONS`)."""
    malformed: list[bytes | None] = field(default_factory=list)
    """Values that are not a JSON event at all: rejected as ``malformed_json``."""


class Router:
    """Splits batches of raw events by their model id among ``model_ids``."""

    def __init__(self, model_id_path: str, model_ids: Collection[str]) -> None:
        self.models = frozenset(model_ids)
        self._ids = sorted(self.models)
        self._number = {m: i for i, m in enumerate(self._ids)}
        """Each model id's number (``dict.get`` of anything else: -1; nothing of the traffic is ever kept)."""
        self._decoder = msgspec.json.Decoder(_id_struct(model_id_path))
        self._value = attrgetter("child." * model_id_path.count(".") + "value")
        self._read = Reader((), model_id_path.split("."))

    def route(self, values: Sequence[bytes | None]) -> Routed:
        """Each configured model's events, the count of the others by reason, and the malformed values."""
        ids: list[Any] | None = None
        try:
            joined: bytes | None = b"\n".join(values)  # type: ignore[arg-type]  # a tombstone raises TypeError
        except TypeError:
            joined = None
        if joined is not None and joined.count(b"\n") == len(values) - 1:
            try:
                structs = self._decoder.decode_lines(joined)
                if len(structs) == len(values):  # a blank value would be skipped as an empty line
                    ids = list(map(self._value, structs))
            except Exception:  # a refused value, or one nested too deep (RecursionError): each read alone
                ids = None
        routed = Routed()
        if ids is None:
            ids = [self._one(raw, routed) for raw in values]
        elif not set(map(type, ids)) <= _TEXT:  # an id no text: read as the rules read it (a number beyond a float
            ids = [self._rule(raw, found, routed) for raw, found in zip(values, ids, strict=True)]  # is malformed)
        groups = ModelGroups(ids, self._ids, self._number)
        for model_id, positions in groups.by_model.items():
            routed.by_model[model_id] = take(values, positions.tolist())
            routed.positions[model_id] = positions
        # not one of ours: counted by reason (a malformed event is counted by the caller)
        routed.ignored.update(ignore_reason(groups.ids[i]) for i in groups.others if groups.ids[i] is not MALFORMED)
        return routed

    def _one(self, raw: bytes | None, routed: Routed) -> Any:
        """The model id of one event read alone (:data:`MALFORMED` when it is not a JSON object). JSON of another
        shape than the path's (``{"meta": 5}`` for ``meta.model``) is read as the decoder reads it: no id."""
        try:
            found = self._value(self._decoder.decode(raw))  # type: ignore[arg-type]  # a tombstone: TypeError
        except msgspec.ValidationError:  # another shape than the path's (a DecodeError too): the rules read it
            found = MALFORMED  # no text: read by the rules below
        except (msgspec.DecodeError, TypeError):
            routed.malformed.append(raw)
            return MALFORMED
        except Exception:  # one nested past msgspec's depth (RecursionError): the rules read it
            found = MALFORMED
        return self._rule(raw, found, routed)

    def _rule(self, raw: bytes | None, found: Any, routed: Routed) -> Any:
        """The id msgspec read, as the rules read it where it is no text: msgspec reads a 400-digit integer (in an
        array or object too) exactly, where orjson and the rules find a number beyond a float (malformed)."""
        if found.__class__ is str or found is None:
            return found
        found = model_of(raw, self._read)
        if found is MALFORMED:
            routed.malformed.append(raw)
        return found


_TEXT: Final = frozenset({str, type(None)})
MALFORMED: Final = object()
"""The model id of a value that is not a JSON object (malformed, a tombstone): rejected as malformed_json."""


def model_of(raw: bytes | None, read: Reader) -> Any:
    """The model id of one raw event as the decoders' rules read it (``read``: the
    :class:`~exporter.stream.decode.bignum.Reader` of the id's path), or :data:`MALFORMED` when the value is no JSON
    object."""
    try:
        event = read(raw)
    except Exception:  # JSONDecodeError (nested past 1024 levels too), TypeError, or anything else: not an event
        return MALFORMED
    return read.model_id(event) if event.__class__ is dict else MALFORMED


class ModelGroups:
    """The events of a batch grouped by model: each configured model's positions in input order (models in the
    order given, those without events left out), and the positions of the events of no model of ours."""

    def __init__(self, ids: list[Any], models: Sequence[str], number: Mapping[str, int]) -> None:
        try:
            index = np.fromiter(map(number.get, ids, repeat(-1)), np.int64, len(ids))
        except TypeError:  # an id that is a JSON array or object: nobody's
            ids = [m if m.__class__ is str or m is MALFORMED else None for m in ids]
            index = np.fromiter(map(number.get, ids, repeat(-1)), np.int64, len(ids))
        self.ids = ids
        """Each event's model id as read (an array or object id made None: nobody's)."""
        order = np.argsort(index, kind="stable")
        bounds = np.searchsorted(index[order], np.arange(-1, len(models) + 1)).tolist()
        self.by_model: dict[str, np.ndarray] = {
            model_id: order[bounds[k + 1]:bounds[k + 2]] for k, model_id in enumerate(models)
            if bounds[k + 2] > bounds[k + 1]}  # fmt: skip
        self.others: list[int] = order[: bounds[1]].tolist()


def take(items: Sequence[Any], positions: list[int]) -> list[Any]:
    """The items at these positions, in their order (at least one position)."""
    pick = itemgetter(*positions)
    return [pick(items)] if len(positions) == 1 else list(pick(items))
