"""One parse of a batch for every model whose events share their field paths, then each model's own columns.

A fleet's events are parsed once, by a schema over all its models (exporter/stream/decode/schema.py: any of their
ids, the union of their group names, the prediction and the score optional), in one call per run of lines it
accepts. The structs are grouped by model id, and each model's :class:`~exporter.stream.decode.events.EventDecoder`
builds its batch from its own structs with :meth:`~exporter.stream.decode.events.EventDecoder.batch`: the same rules and
columns as a daemon of that model alone, whose walk decides every event the schema refused. Events of no model of
ours are counted by reason, and values that are no JSON object at all are handed back as malformed.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from operator import attrgetter
from typing import Any

import msgspec
import numpy as np

from exporter.stream.decode.events import DecodedBatch, EventDecoder
from exporter.stream.decode.lines import Parser
from exporter.stream.decode.paths import lookup
from exporter.stream.decode.route import MALFORMED, ModelGroups, ignore_reason, model_of, take
from exporter.stream.decode.schema import paths_of, schema
from exporter.stream.decode.timestamps import epochs


class SharedDecoder:
    """Decodes batches for models whose events share their field paths (:func:`shareable`)."""

    def __init__(self, decoders: Mapping[str, EventDecoder]) -> None:
        self.decoders = dict(decoders)
        specs = [d.model for d in self.decoders.values()]
        general, strict = schema(specs), schema(specs, strict=True)
        assert general is not None, "shareable() checks that the paths fit one schema"
        self._get: dict[str, Callable[[Any], Any]] = {role: attrgetter(path) for role, path in general[1].items()}
        self._parser = Parser(msgspec.json.Decoder(general[0]), msgspec.json.Decoder(strict[0]) if strict else None)
        self._model_of = lookup(specs[0].events.model_id)
        self._ids = sorted(self.decoders)
        self._number = {m: i for i, m in enumerate(self._ids)}

    def decode(self, values: Sequence[bytes], now: float) -> tuple[dict[str, DecodedBatch], Counter[str],
                                                                    list[bytes | None]]:  # fmt: skip
        """Each model's batch, the events of no model of ours by reason, and the values that are no event."""
        slots = self._parser.slots(values)
        refused = self._parser.refused
        get_model = self._get["model"]
        ids = [get_model(event) if event is not None else model_of(raw, self._model_of)
               for event, raw in zip(slots, values, strict=True)] if refused else list(map(get_model, slots))
        groups = ModelGroups(ids, self._ids, self._number)
        # Every event's timestamp read at once, not once per model: when each one is valid (else each model reads
        # its own, as alone, and its walk says which reason).
        stamps = None if refused or not slots else epochs(list(map(self._get["ts"], slots)))
        whole = stamps if stamps.__class__ is np.ndarray else None
        batches: dict[str, DecodedBatch] = {}
        for model_id, order in groups.by_model.items():
            positions = order.tolist()
            mine, events = take(values, positions), take(slots, positions)
            if refused and None in events:
                at = [i for i, event in enumerate(events) if event is not None]
                walked = [i for i, event in enumerate(events) if event is None]
                structs = [events[i] for i in at]
            else:
                at, walked, structs = list(range(len(events))), [], events
            batch = self.decoders[model_id].batch(mine, structs, at, walked, Counter(), self._get, now, shared=True,
                                                  epoch_seconds=None if whole is None else whole[order])  # fmt: skip
            batch.positions = order[batch.positions]  # where its events were in the whole batch
            batches[model_id] = batch
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
