"""The staged path's evaluation: a :class:`CountsTask` per ``.counts`` partition that this replica holds.

It counts the records of its partition into the window stores of the models it owns, with the direct path's
``WindowStore.add`` and ``add_joined``, skipping rows whose source position it already applied
(exporter/stream/stages/tasks.py ``Task.fresh``); with ``attribute_sources`` it first joins their side records by id
(stages/sides.py).
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from exporter.config import layout
from exporter.health.counters import Health, StageHealth
from exporter.stream.decode.events import DecodedBatch
from exporter.stream.kafka.client import Partition
from exporter.stream.stages.records import (
    Kind,
    Record,
    codes_columns,
    codes_layout,
    joined_scores,
    origins,
    rows_at,
    with_side_ids,
)
from exporter.stream.stages.tasks import Out, Task
from exporter.stream.state.attribute_join import AttributeJoin
from exporter.stream.state.fleet import Fleet

log = logging.getLogger(__name__)


class CountsTask(Task):
    """The evaluation of the models of one ``.counts`` partition: their window stores live in the fleet, taken
    when this task goes live and released when it is revoked."""

    stage = "counts"

    def __init__(self, partition: Partition, start: int, stage_health: StageHealth, health: Health, fleet: Fleet,
                 models: Callable[[], list[str]], clock: Callable[[], float],
                 sides: AttributeJoin | None = None) -> None:  # fmt: skip
        super().__init__(partition, start, stage_health)
        self.fleet = fleet
        self.health = health
        self.models = models
        """The configured models of this partition."""
        self.clock = clock
        self.attributes = AttributeJoin(fleet.config, sides) if sides else None
        """With ``attribute_sources``: the direct path's join over this replica's side tables (``sides``), the
        predictions waiting for their records this task's own (in its snapshot)."""
        self.side_outcomes: Counter[tuple[str, str]] = Counter()
        """What became of the ids looked up since the stages last counted them (exporter/health/side.py)."""
        self.forward: Callable[[Partition, str, DecodedBatch], None] | None = None
        """Sends a model's joined predictions on to wait for their labels (stages/sides.py, as the task goes live)."""
        self._restored: tuple[dict[str, Any], dict[str, np.ndarray]] = ({"models": {}}, {})

    def apply(self, record: Record, offset: int) -> list[Out]:
        """Count a PREDICTIONS or JOINED record in its model's window store."""
        model = str(record.meta.get("model"))
        monitored = self.fleet.models.get(model)
        if monitored is None or codes_layout(monitored.spec) != record.meta.get("layout"):
            # a model this replica does not monitor as configured (a reload reaches the replicas one at a time)
            self.health.ignored.labels("unconfigured_model").inc(len(record))
            return []
        keep = self.fresh(record, (model,))
        if not keep.any():
            return []
        a = rows_at(record.arrays, keep, len(keep))
        codes = codes_columns(monitored.spec, a["codes"])
        store = monitored.store
        if record.kind is Kind.PREDICTIONS:
            batch = DecodedBatch(a["timestamp"], a["prediction"].astype(np.int64), a["outcome"].astype(np.int64),
                                 [None] * len(a["timestamp"]), codes, scores=a["score"])  # fmt: skip
            if self.attributes is not None and monitored.spec.sourced():
                ids = [text for text, k in zip(record.ids, keep.tolist(), strict=True) if k]
                batch = self.attributes.resolve(monitored.spec, with_side_ids(monitored.spec, batch, ids, origins(
                    record, keep)), self.side_outcomes)  # fmt: skip
            self.count({model: batch})
        elif record.kind is Kind.JOINED:
            bins, scores = joined_scores(monitored.spec, store, a)  # its prediction's, for the score counts
            outside = store.add_joined(a["timestamp"], codes, a["outcome"].astype(np.int64), bins, scores=scores)
            self.health.outcomes_joined.inc(len(a["position"]) - outside)
            self.health.count_outcomes({"prediction_outside_window": outside} if outside else {})
        self.dirty = True
        return []

    def count(self, batches: Mapping[str, DecodedBatch]) -> None:
        """Count models' predictions whose attributes are known (those released by the join too, in their own
        event-time buckets)."""
        late = 0
        for model, batch in batches.items():
            if (monitored := self.fleet.models.get(model)) is not None and len(batch):
                late += monitored.store.add(batch.timestamps, batch.codes, batch.predictions, batch.outcomes,
                                            self.clock(), scores=batch.scores)  # fmt: skip
                self.dirty = True
                if self.forward is not None:
                    self.forward(self.partition, model, batch)
        if late:
            self.health.late.inc(late)

    def state(self) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
        models, arrays = {}, self.hwm_arrays()
        if self.attributes is not None:
            arrays.update({f"side.{k}": v for k, v in self.attributes.held_state().items()})
        windowing = self.fleet.config.windowing
        with self.fleet.lock:
            for i, model in enumerate(self.models()):
                monitored = self.fleet.models.get(model)
                if monitored is None:
                    continue
                models[model] = {"layout": layout(monitored.spec, windowing), "prefix": f"m{i}."}
                arrays.update({f"m{i}.{k}": v for k, v in monitored.store.state().items()})
        return {"models": models}, arrays

    def restore(self, meta: dict[str, Any], arrays: dict[str, np.ndarray]) -> None:
        """Restore the hwm marks; the models' arrays are taken by :meth:`take` (with the fleet's current specs)."""
        self.restore_hwm(arrays)
        if self.attributes is not None:
            self.attributes.restore({k[len("side."):]: v for k, v in arrays.items() if k.startswith("side.")})
        self._restored = (meta, arrays)

    def take(self) -> None:
        """Go live: the fleet keeps this partition's models from now, restored from the snapshot where it holds
        them under the same layout, else empty."""
        (meta, arrays), self._restored = self._restored, ({"models": {}}, {})
        specs = {m.model_id: m for m in self.fleet.config.models}
        windowing = self.fleet.config.windowing
        states: dict[str, dict[str, np.ndarray] | None] = {}
        for model in self.models():
            written = meta["models"].get(model)
            if written is not None and written["layout"] == layout(specs[model], windowing):
                prefix = written["prefix"]
                states[model] = {k[len(prefix):]: v for k, v in arrays.items() if k.startswith(prefix)}
            else:
                if written is not None:
                    log.warning("model %s was snapshotted under another layout: it starts afresh", model)
                states[model] = None
        self.fleet.take(states)
