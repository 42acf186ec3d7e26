"""Join protected attributes kept apart (``attribute_sources:``) to the predictions, by the id they carry.

Each side source is a table (exporter/core/side_table.py: the latest record per id wins, a tombstone deletes),
filled from its compacted topic. A prediction whose records are all there counts at once; one that names an id
whose record is not there yet waits, as a prediction waits for its label (the same :class:`ReadClock`: it waits
until the side topic has been read ``horizon`` past its event time, so a lagging daemon does not give up early),
and counts when its record arrives, in the bucket of its own event time. One still without its record then counts
with that source's attributes in their unknown category; every outcome is counted by source and reason
(:data:`JOIN_OUTCOMES`). A record counts for the predictions that arrive after it (a correction never rewrites what
was counted). Values never leave this module except as codes: no log line, dead letter or error message holds one.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

import numpy as np
import orjson

from exporter.config import Config, ModelSpec
from exporter.core.encoding import attribute_codes, code_table
from exporter.core.side_table import SideTable, id_hashes
from exporter.stream.decode.events import DecodedBatch
from exporter.stream.state.label_join import ReadClock, _pack_ids, _unpack_ids

JOIN_OUTCOMES: Final = ("joined", "joined_after_wait", "never_joined", "missing_id", "pending_state_full")
"""What became of each prediction's id for one source: its record was there; it arrived within the horizon; it never
did (the attributes count as unknown); the prediction carried no id (unknown at once); the waiting room was full
(unknown at once)."""
SIDE_REJECTS: Final = ("not_json_object", "missing_key", "table_full", "too_many_values")
"""Side records not taken into a table: a value that is no JSON object (dead-lettered), a record without a key, a
new id past ``max_records``, and a value past the per-field vocabulary (that field reads as missing)."""

Held = tuple[float, int, int, float, Any, str, tuple[int, ...], tuple[tuple[str, int], ...]]
"""A prediction waiting for side records: event time, prediction, inline outcome, score (NaN: none), prediction id,
model, every base attribute's code (those of a source it waits for: -1), and the (source, id hash) it waits for."""


@dataclass
class SideRecords:
    """One partition's side records as the table takes them: keys (ids) and values (None: a tombstone), what was
    refused by reason, and the dead letters of the refused (a pointer to the record, never its value)."""

    keys: list[str] = field(default_factory=list)
    values: list[dict[str, Any] | None] = field(default_factory=list)
    times: list[float] = field(default_factory=list)
    """Each record's Kafka timestamp in seconds (0: none), from which it is in force."""
    rejected: Counter[str] = field(default_factory=Counter)
    letters: list[tuple[bytes | None, str]] = field(default_factory=list)

    @classmethod
    def read(cls, name: str, topic: str, partition: int,
             records: Sequence[tuple[bytes | None, Any, bytes | None, int]], offsets: Sequence[int]) -> SideRecords:
        """``records``: (value, headers, key, timestamp) of each record, at ``offsets``."""
        out = cls()
        for i, (raw, _, key, stamp) in enumerate(records):
            reason, value = None, None
            if key is None:
                reason = "missing_key"
            elif raw is not None:
                try:
                    value = orjson.loads(raw)
                except orjson.JSONDecodeError:
                    reason = "not_json_object"
                if not isinstance(value, dict):
                    reason = "not_json_object"
            if reason is not None:
                out.rejected[reason] += 1
                out.letters.append((orjson.dumps({"attribute_source": name, "topic": topic, "partition": partition,
                                                  "offset": offsets[i]}), f"side_{reason}"))  # fmt: skip
                continue
            out.keys.append(key.decode("utf-8", "replace"))  # type: ignore[union-attr]  # checked above
            out.values.append(value)
            out.times.append(stamp / 1000 if stamp and stamp > 0 else 0.0)
        return out


class AttributeJoin:
    """Every side source's table, and the predictions waiting for their records, bounded in count and age."""

    def __init__(self, config: Config, shared: AttributeJoin | None = None) -> None:
        """``shared``: a join whose tables and read clocks this one uses, its waiting predictions its own (the
        staged path: one table per replica, the waiting predictions of each counts task apart)."""
        self.sources = config.attribute_sources
        self.fields = config.attribute_fields
        self.tables: dict[str, SideTable] = shared.tables if shared is not None else \
            {name: SideTable(self.fields[name], s.max_records) for name, s in self.sources.items()}  # fmt: skip
        self.clocks: dict[str, ReadClock] = shared.clocks if shared is not None else \
            {name: ReadClock(s.horizon_seconds) for name, s in self.sources.items()}  # fmt: skip
        self.max_pending = config.max_pending_labels
        self.keep_seconds = config.windowing.longest_seconds + config.windowing.allowed_lateness_seconds
        """How long a version a correction replaced is kept: a prediction older than that is late anyway."""
        self.held: dict[int, Held] = {}
        self.waiting: dict[tuple[str, int], list[int]] = {}
        self._next = 0

    def __bool__(self) -> bool:
        return bool(self.sources)

    # --- predictions ------------------------------------------------------------------------------------------

    def resolve(self, spec: ModelSpec, batch: DecodedBatch, outcomes: Counter[tuple[str, str]],
                wait: bool = True) -> DecodedBatch:  # fmt: skip
        """The events of a model's batch that can count now (their records found, or no id): their attributes
        filled in; the others are held until their records arrive or the horizon passes (``wait``), else count at
        once as never joined (a table read whole beforehand: ``backtest``)."""
        sourced = spec.sourced()
        if not sourced:
            return batch
        n = len(batch)
        base = {a.columns[0]: batch.codes[a.name].copy() for a in spec.base_attributes}
        waits: dict[int, list[tuple[str, int]]] = {}
        for name, attributes in sourced.items():
            ids = batch.side_ids[name]
            if None in ids:
                at = np.array([i for i, v in enumerate(ids) if v is not None], dtype=np.int64)
                named: list[str | int] = [ids[i] for i in at.tolist()]
            else:
                at, named = np.arange(n), ids  # type: ignore[assignment]  # no None
            outcomes[(name, "missing_id")] += n - len(at)
            hashes = id_hashes(named)
            horizon = self.sources[name].horizon_seconds
            found, codes, beyond = self.tables[name].get(hashes, batch.timestamps[at], horizon)
            outcomes[(name, "joined")] += int(found.sum())
            outcomes[(name, "never_joined")] += int(beyond.sum())  # its records all came after the horizon
            self._fill(name, attributes, base, at[found], codes[found])
            waiting = ~found & ~beyond
            if not wait:
                outcomes[(name, "never_joined")] += int(waiting.sum())
            elif waiting.any():
                for i, h in zip(at[waiting].tolist(), hashes[waiting].tolist(), strict=True):
                    waits.setdefault(i, []).append((name, h))
        held = np.zeros(n, dtype=bool)
        if waits:
            held[list(waits)] = True
            for i in sorted(waits):
                if len(self.held) >= self.max_pending:
                    for name, _ in waits[i]:
                        outcomes[(name, "pending_state_full")] += 1
                    held[i] = False
                    continue
                row = self._next
                self._next += 1
                score = float(batch.scores[i]) if len(batch.scores) else math.nan
                self.held[row] = (float(batch.timestamps[i]), int(batch.predictions[i]), int(batch.outcomes[i]),
                                  score, batch.prediction_ids[i], spec.model_id,
                                  tuple(int(base[a.columns[0]][i]) for a in spec.base_attributes), tuple(waits[i]))
                for awaited in waits[i]:
                    self.waiting.setdefault(awaited, []).append(row)
        return _batch(spec, batch, ~held, base)

    def _fill(self, name: str, attributes: Iterable[Any], base: dict[str, np.ndarray], rows: np.ndarray,
              codes: np.ndarray) -> None:  # fmt: skip
        table = self.tables[name]
        for a in attributes:
            lut = table.lut(a.columns[0], a.groups, a.other)
            base[a.columns[0]][rows] = lut[codes[:, table.fields.index(a.columns[0])]]

    # --- side records -----------------------------------------------------------------------------------------

    def records(self, name: str, read: SideRecords, rejected: Counter[str],
                waited: Callable[[tuple[str, int]], bool] | None = None) -> list[tuple[str, int]]:  # fmt: skip
        """Take a batch of one source's records in order (None: a tombstone); the (source, hash) now held that
        predictions wait for (``waited``: whether one is waited for, by default in this join)."""
        table, problems = self.tables[name], dict[str, int]()
        waited = waited or self.waiting.__contains__
        hashes = id_hashes(read.keys).tolist()
        arrived = []
        for h, value, time in zip(hashes, read.values, read.times, strict=True):
            if not table.put(h, None if value is None else table.encode(value, problems), time):
                rejected["table_full"] += 1
            elif value is not None and waited((name, h)):
                arrived.append((name, h))
        rejected.update(problems)
        return arrived

    def release(self, arrived: Iterable[tuple[str, int]], specs: Mapping[str, ModelSpec],
                outcomes: Counter[tuple[str, str]]) -> dict[str, DecodedBatch]:  # fmt: skip
        """The held predictions whose last awaited record just arrived, per model (their attributes filled in)."""
        ready: list[int] = []
        for wait in arrived:
            for row in self.waiting.pop(wait, []):
                held = self.held.get(row)
                if held is None:
                    continue
                found = self.tables[wait[0]].get(np.array([wait[1]], dtype=np.uint64), np.array([held[0]]),
                                                 self.sources[wait[0]].horizon_seconds)[0][0]  # fmt: skip
                outcomes[(wait[0], "joined_after_wait" if found else "never_joined")] += 1
                if not any(row in self.waiting.get(w, ()) for w in self.held[row][7]):
                    ready.append(row)
        return self._emit(ready, specs)

    def expire(self, now: float, specs: Mapping[str, ModelSpec],
               outcomes: Counter[tuple[str, str]]) -> dict[str, DecodedBatch]:  # fmt: skip
        """The held predictions whose records would have been read by now: they count, the attributes of the
        sources that never answered in their unknown category."""
        cutoffs = {}
        for name, clock in self.clocks.items():
            clock.start_restored(now)
            cutoffs[name] = clock.labels_clock(now) - clock.horizon
            self.tables[name].forget_before(now - self.keep_seconds)
        done = []
        for row, held in self.held.items():
            still = [w for w in held[7] if row in self.waiting.get(w, ())]
            if all(held[0] < cutoffs[name] for name, _ in still):
                for wait in still:  # these sources' attributes count in their unknown category
                    outcomes[(wait[0], "never_joined")] += 1
                    rows = self.waiting[wait]
                    rows.remove(row)
                    if not rows:
                        del self.waiting[wait]
                done.append(row)
        return self._emit(done, specs)

    def _emit(self, rows: list[int], specs: Mapping[str, ModelSpec]) -> dict[str, DecodedBatch]:
        by_model: dict[str, list[Held]] = {}
        for row in rows:
            held = self.held.pop(row)
            if held[5] in specs:  # a model a reload removed (or reset) is gone: its predictions with it
                by_model.setdefault(held[5], []).append(held)
        out = {}
        for model_id, mine in by_model.items():
            spec = specs[model_id]
            scores = np.array([h[3] for h in mine], dtype=np.float64)
            base = {a.columns[0]: np.array([h[6][k] for h in mine], dtype=np.int64)
                    for k, a in enumerate(spec.base_attributes)}  # fmt: skip
            for name, attributes in spec.sourced().items():
                waited = [(k, dict(h[7]).get(name)) for k, h in enumerate(mine)]
                # the held codes were filled for the sources found at arrival; the awaited ones are looked up now
                late = [(k, h) for k, h in waited if h is not None]
                if late:
                    found, codes, _ = self.tables[name].get(np.array([h for _, h in late], dtype=np.uint64),
                                                            np.array([mine[k][0] for k, _ in late]),
                                                            self.sources[name].horizon_seconds)  # fmt: skip
                    self._fill(name, attributes, base, np.array([k for k, _ in late])[found], codes[found])
            batch = DecodedBatch(timestamps=np.array([h[0] for h in mine], dtype=np.float64),
                                 predictions=np.array([h[1] for h in mine], dtype=np.int64),
                                 outcomes=np.array([h[2] for h in mine], dtype=np.int64),
                                 prediction_ids=[h[4] for h in mine], codes={},
                                 scores=scores if not np.isnan(scores).all() else np.zeros(0))  # fmt: skip
            out[model_id] = _batch(spec, batch, np.ones(len(mine), dtype=bool), base)
        return out

    # --- checkpoint -------------------------------------------------------------------------------------------

    def state(self, now: float) -> dict[str, np.ndarray]:
        """Arrays for a checkpoint: each source's table and clock (by its name and fields, so that a config that
        reads other fields reads the topic again), and the held predictions."""
        out: dict[str, np.ndarray] = {}
        for k, (name, table) in enumerate(self.tables.items()):
            out.update({f"t{k}.{key}": v for key, v in table.state().items()})
            out.update(_pack_ids(f"t{k}.fields", [name, *table.fields]))
            out[f"t{k}.clock"] = np.array([self.clocks[name].labels_clock(now)], dtype=np.float64)
        return {**out, **self.held_state()}

    def held_state(self) -> dict[str, np.ndarray]:
        """The held predictions alone (a staged counts task's snapshot: its replica's table is not in it)."""
        rows = list(self.held.items())
        waits = [(i, name, h, row in self.waiting.get((name, h), ())) for i, (row, held) in enumerate(rows)
                 for name, h in held[7]]  # fmt: skip
        return {
            "held_ts": np.array([h[0] for _, h in rows], dtype=np.float64),
            "held_pred": np.array([h[1] for _, h in rows], dtype=np.int64),
            "held_outcome": np.array([h[2] for _, h in rows], dtype=np.int64),
            "held_score": np.array([h[3] for _, h in rows], dtype=np.float64),
            "held_has_id": np.array([h[4] is not None for _, h in rows], dtype=bool),
            **_pack_ids("held_pid", ["" if h[4] is None else str(h[4]) for _, h in rows]),
            **_pack_ids("held_model", [h[5] for _, h in rows]),
            "held_width": np.array([len(h[6]) for _, h in rows], dtype=np.int64),
            "held_codes": np.array([c for _, h in rows for c in h[6]], dtype=np.int64),
            "wait_row": np.array([w[0] for w in waits], dtype=np.int64),
            **_pack_ids("wait_source", [w[1] for w in waits]),
            "wait_hash": np.array([w[2] for w in waits], dtype=np.uint64),
            "wait_open": np.array([w[3] for w in waits], dtype=bool),
        }  # fmt: skip

    def restore(self, state: Mapping[str, np.ndarray]) -> tuple[list[str], int]:
        """Load what :meth:`state` produced: the names of the sources whose table was kept (a source whose fields
        changed, or that is new, starts empty: its topic is read again from its start, and the predictions that
        wait for it wait on), and how many held predictions waited for a source no longer configured (dropped)."""
        kept = []
        k = 0
        while f"t{k}.keys" in state:
            name, *fields = _unpack_ids(f"t{k}.fields", state)  # type: ignore[arg-type]
            table = self.tables.get(name)
            if table is not None and tuple(fields) == table.fields:
                table.restore({key[len(f"t{k}."):]: v for key, v in state.items() if key.startswith(f"t{k}.")})
                self.clocks[name].restored_clock = (float(state[f"t{k}.clock"][0]), None)
                kept.append(name)
            k += 1
        if "held_ts" not in state:
            return kept, 0
        pids = _unpack_ids("held_pid", state)  # type: ignore[arg-type]
        models = _unpack_ids("held_model", state)  # type: ignore[arg-type]
        flat, at = state["held_codes"].tolist(), 0
        rows: list[Held] = []
        for i, width in enumerate(state["held_width"].tolist()):
            rows.append((float(state["held_ts"][i]), int(state["held_pred"][i]), int(state["held_outcome"][i]),
                         float(state["held_score"][i]), pids[i] if state["held_has_id"][i] else None, models[i],
                         tuple(flat[at:at + width]), ()))  # fmt: skip
            at += width
        waits: dict[int, list[tuple[str, int, bool]]] = {}
        sources = _unpack_ids("wait_source", state)  # type: ignore[arg-type]
        for row, name, h, still in zip(state["wait_row"].tolist(), sources, state["wait_hash"].tolist(),
                                       state["wait_open"].tolist(), strict=True):  # fmt: skip
            waits.setdefault(row, []).append((name, int(h), bool(still)))
        self.held, self.waiting = {}, {}
        for i, held in enumerate(rows):
            if i not in waits or not all(name in self.tables for name, _, _ in waits[i]):
                continue
            self.held[i] = (*held[:7], tuple((name, h) for name, h, _ in waits[i]))
            for name, h, still in waits[i]:
                if still:
                    self.waiting.setdefault((name, h), []).append(i)
        self._next = len(rows)
        return kept, len(rows) - len(self.held)

    def forget_models(self, keep: Collection[str]) -> int:
        """Drop the held predictions of models no longer kept as they were; how many."""
        gone = [row for row, held in self.held.items() if held[5] not in keep]
        for row in gone:
            for wait in self.held.pop(row)[7]:
                if row in self.waiting.get(wait, ()):
                    self.waiting[wait].remove(row)
                    if not self.waiting[wait]:
                        del self.waiting[wait]
        return len(gone)


def _batch(spec: ModelSpec, batch: DecodedBatch, keep: np.ndarray, base: dict[str, np.ndarray]) -> DecodedBatch:
    """The kept events of a batch, every attribute's codes from the (filled-in) base codes. A sourced attribute
    still at -1 has no record to count by (no id, none within the horizon, no room to wait): its unknown category,
    which ``unknown_values: other`` makes the bounded ``other`` group, as a value outside the groups is there and
    as the gate counts such a row."""
    whole = bool(keep.all())  # the usual batch: every record was there
    base = dict(base) if whole else {column: codes[keep] for column, codes in base.items()}
    for a in spec.base_attributes:
        if a.source is not None and a.other:  # the code of a value outside the groups, as code_table gives it
            base[a.columns[0]] = np.where(base[a.columns[0]] < 0, code_table(a.groups, a.other)[1], base[a.columns[0]])
    return DecodedBatch(
        timestamps=batch.timestamps[keep], predictions=batch.predictions[keep], outcomes=batch.outcomes[keep],
        prediction_ids=batch.prediction_ids if whole else [pid for pid, k in zip(batch.prediction_ids,
                                                                                  keep.tolist(), strict=True) if k],
        codes={a.name: attribute_codes(a, base) for a in spec.attributes},
        scores=batch.scores[keep] if len(batch.scores) else batch.scores,
    )  # fmt: skip
