"""The msgspec ``Struct`` of an event, built from the configured field paths: what the decoders parse batches with.

For one model: the general schema (any model id, any attribute value; an event it accepts is one the rules accept
as it is) and the strict one (this model's id, its group names only, whose strings come back as the schema's own
objects). For several models whose events share their field paths: the same two over all of them (any of their
ids; the union of their group names), where the prediction and the score are optional, since each model requires
its own (exporter/stream/decode/events.py checks what each needs).
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import Annotated, Any, Final, Literal

import msgspec

from exporter.config import EventFields, ModelSpec
from exporter.core.encoding import code_table

MAX_PREDICTION_ID_LENGTH: Final = 256
"""Longer ids (or ids that are neither strings nor integers) are rejected: every pending id is held in memory and
in the checkpoint until its ground truth arrives."""

# What the schema accepts of each field: only values that the rules accept as they are. Wider values (1.0 for 1,
# a timestamp JSON number beyond int64, an id integer beyond what orjson reads as an int) fail it and are walked.
Binary = Literal[0, 1] | bool  # true/false count as 1/0 (np.fromiter and OUTCOME read True as 1)
_Int = Annotated[int, msgspec.Meta(ge=-(2**63), le=2**63 - 1)]
"""An int64 (msgspec bounds no wider): any other integer is walked, where orjson reads it as the rules do (past 64
bits a float, beyond a float the body refused; msgspec would read each exactly)."""
_Id = Annotated[str, msgspec.Meta(max_length=MAX_PREDICTION_ID_LENGTH)] | _Int
_Score = Annotated[float, msgspec.Meta(ge=0.0, le=1.0)]
_Stamp = str | float


def paths_of(events: EventFields) -> tuple[str, ...]:
    """The field paths that decide a schema's shape: models with the same ones can share one."""
    return (events.model_id, events.prediction_id, events.timestamp, events.prediction, events.score, events.label,
            events.attributes)  # fmt: skip


def schema(models: Sequence[ModelSpec], strict: bool = False) -> tuple[type[msgspec.Struct], dict[str, str]] | None:
    """A ``Struct`` type for the models' paths (one set: see :func:`paths_of`), and the attribute path of each role
    (``model``, ``id``, ``ts``, ``pred``, ``score``, ``label``, ``attr:<column>``, ``side:<id column>``,
    ``seg:<column>`` for a segment column that is no attribute's or id's) in it; None when the paths overlap in a way
    a Struct cannot hold (a field that is both a value and an object, or an id column that is another model's
    attribute column), where every event is walked.
    ``strict``: only these models' events, and only their configured group names (or none) as attribute values."""
    f = models[0].events
    columns: dict[str, set[str]] = {}
    sides: set[str] = set()  # the id columns of side sources (attribute_sources): any id, joined later
    for model in models:
        for a in model.base_attributes:
            if a.proxy is None and a.source is None:
                columns.setdefault(a.columns[0], set()).update(code_table(a.groups, a.other)[0])
        sides.update(s.id for s in model.attribute_sources)
    if (strict and not all(columns.values())) or sides & columns.keys():
        return None
    # a proxy's surname and ZCTA: any text (a ZCTA may be a JSON integer), in the strict schema too
    free = {c for m in models for a in m.base_attributes if a.proxy for c in (a.proxy.surname, a.proxy.zcta)}
    one = models[0] if len(models) == 1 else None
    # roles a schema-valid event must carry: the timestamp; for one model, its prediction (or the score it derives
    # it from); for the strict schema, one of these models' ids
    required = {"ts"}
    if one is not None:
        required.add("pred" if one.events.score_threshold is None else "score")
    if strict:
        required.add("model")
    ids = tuple(m.model_id for m in models)
    roles: dict[str, tuple[Any, Any]] = {
        "model": (f.model_id, Literal[ids] if strict else str | None),
        "id": (f.prediction_id, _Id | None), "ts": (f.timestamp, _Stamp),
        "score": (f.score, _Score if "score" in required else _Score | None),
        "label": (f.label, Binary | None),
    }  # fmt: skip
    if any(m.events.score_threshold is None for m in models):
        roles["pred"] = (f.prediction, Binary if "pred" in required else Binary | None)
    for column, groups in columns.items():
        roles[f"attr:{column}"] = (f"{f.attributes}.{column}",
                                   Literal[tuple(sorted(groups))] | None if strict else str | None)
    for column in free - set(columns):
        roles[f"attr:{column}"] = (f"{f.attributes}.{column}", str | _Int | None)
    for column in sorted(sides - set(columns)):
        roles[f"side:{column}"] = (f"{f.attributes}.{column}", _Id | None)
    for column in sorted({c for m in models for c in m.counted_columns} - set(columns) - free - sides):
        roles[f"seg:{column}"] = (f"{f.attributes}.{column}", str | None)  # any text: a segment's
    tree: dict[str, Any] = {}
    for role, (path, _) in roles.items():
        *parents, leaf = path.split(".") if not role.startswith(("attr:", "side:", "seg:")) else \
            [*f.attributes.split("."), role.split(":", 1)[1]]  # fmt: skip
        node = tree
        for key in parents:
            child = node.setdefault(key, {})
            if not isinstance(child, dict):
                return None
            node = child
        if leaf in node:
            return None
        node[leaf] = role
    getters: dict[str, str] = {}
    counter = itertools.count()

    def build(node: dict[str, Any], prefix: str) -> tuple[type[msgspec.Struct], bool]:
        fields: list[tuple[str, Any] | tuple[str, Any, Any]] = []
        rename: dict[str, str] = {}
        has_required = False
        for key, child in node.items():
            name = f"f{next(counter)}"
            rename[name] = key
            if isinstance(child, dict):
                sub, sub_required = build(child, f"{prefix}{name}.")
                if sub_required:
                    fields.append((name, sub))
                    has_required = True
                else:  # missing: every value under it missing, as the walk reads it; null is walked
                    fields.append((name, sub, msgspec.field(default_factory=sub)))
            else:
                getters[child] = f"{prefix}{name}"
                kind = roles[child][1]
                if child in required:
                    fields.append((name, kind))
                    has_required = True
                else:
                    fields.append((name, kind, None))
        fields.sort(key=lambda x: len(x) == 3)  # required fields first
        # gc=False: the structs hold only strings, numbers and other such structs (no cycles), and thousands per batch
        # tracked by the collector cost more than their decoding
        return msgspec.defstruct(f"Event{next(counter)}", fields, rename=rename, gc=False), has_required

    struct, _ = build(tree, "")
    return struct, getters
