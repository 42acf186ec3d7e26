"""One parse of a batch for every model whose events share their field paths, then each model's own columns.

A fleet's events are parsed once, by a schema over all its models (exporter/stream/decode/schema.py: any of their
ids, the union of their group names, the prediction and the score optional), in one call per run of lines it
accepts. The structs are grouped by model id, each field is read once for the whole batch
(:class:`~exporter.stream.decode.events.Columns`), and each model's :class:`~exporter.stream.decode.events.EventDecoder`
builds its batch from its own rows of those columns, taken by index array, with
:meth:`~exporter.stream.decode.events.EventDecoder.batch`: the same rules and columns as a daemon of that model alone,
whose walk decides every event the schema refused. So a poll's cost per model is a few array operations, not a pass
over its events per field. Events of no model of ours are counted by reason, and values that are no JSON object at
all are handed back as malformed.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from operator import attrgetter
from typing import Any

import msgspec
import numpy as np

from exporter.stream.decode.bignum import Reader
from exporter.stream.decode.events import Columns, DecodedBatch, EventDecoder
from exporter.stream.decode.lines import Parser
from exporter.stream.decode.route import MALFORMED, ModelGroups, ignore_reason, model_of
from exporter.stream.decode.schema import paths_of, schema


class SharedDecoder:
    """Decodes batches for models whose events share their field paths (:func:`shareable`)."""

    def __init__(self, decoders: Mapping[str, EventDecoder]) -> None:
        self.decoders = dict(decoders)
        specs = [d.model for d in self.decoders.values()]
        general, strict = schema(specs), schema(specs, strict=True)
        assert general is not None, "shareable() checks that the paths fit one schema"
        self._get: dict[str, Callable[[Any], Any]] = {role: attrgetter(path) for role, path in general[1].items()}
        self._parser = Parser(msgspec.json.Decoder(general[0]), msgspec.json.Decoder(strict[0]) if strict else None)
        self._read = Reader((), specs[0].events.model_id.split("."))
        self._ids = sorted(self.decoders)
        self._number = {m: i for i, m in enumerate(self._ids)}

    def decode(self, values: Sequence[bytes], now: float) -> tuple[dict[str, DecodedBatch], Counter[str],
                                                                    list[bytes | None]]:  # fmt: skip
        """Each model's batch, the events of no model of ours by reason, and the values that are no event."""
        slots = self._parser.slots(values)
        refused = self._parser.refused
        get_model = self._get["model"]
        ids = [get_model(event) if event is not None else model_of(raw, self._read)
               for event, raw in zip(slots, values, strict=True)] if refused else list(map(get_model, slots))
        groups = ModelGroups(ids, self._ids, self._number)
        structs, rows_of = slots, None
        if refused:  # each accepted event's row among the structs, for the models' rows
            accepted = np.fromiter((event is not None for event in slots), bool, len(slots))
            structs, rows_of = [event for event in slots if event is not None], np.cumsum(accepted) - 1
        columns = Columns(structs, self._get)  # every role read once, for all the models
        batches: dict[str, DecodedBatch] = {}
        for model_id, order in groups.by_model.items():
            if rows_of is not None:
                ok = accepted[order]
                at, walked, rows = order[ok], order[~ok].tolist(), rows_of[order[ok]]
            else:
                at, walked, rows = order, [], order
            batches[model_id] = self.decoders[model_id].batch(values, columns, rows, at, walked, Counter(), now,
                                                              shared=True)  # fmt: skip
        ignored: Counter[str] = Counter()
        malformed: list[bytes | None] = []
        for i in groups.others:
            if groups.ids[i] is MALFORMED:
                malformed.append(values[i])
            else:
                ignored[ignore_reason(groups.ids[i])] += 1
        return batches, ignored, malformed


def shareable(decoders: Mapping[str, EventDecoder]) -> bool:
    """Whether these models' events can be parsed by one schema: the same field paths, that fit one Struct."""
    specs = [d.model for d in decoders.values()]
    return len(specs) > 1 and len({paths_of(s.events) for s in specs}) == 1 and schema(specs) is not None
