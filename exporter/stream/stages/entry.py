"""The staged path's entry stages: input records become internal records, by the direct path's code.

The **ingest** stage (an input partition) decodes a poll's records with the fleet's decoders (``Fleet.decode``, the
direct path's one decode of every partition's records) and reports its rejects as the
direct path does (``Ingest.report``); each model's rows go, as one PREDICTIONS record (or several, under the size
limit), to the model's counts partition, and its unlabelled predictions with an id, as PENDING records, to the join
partition of each id. The **labels** stage (a labels partition) sends each decoded label (``decode_outcomes``) to
the join partition of its id. A payload log's records (``events.format`` kserve or seldon) go, each as a HALVES
row (as PIECES rows when a record cannot hold it: stages/halves.py), to the join partition of their call id, where
request and response meet. Every row carries its source
partition and offset, and each labels record the newest Kafka timestamp of the labels it came from; a join
partition that none of a poll's labels went to gets that timestamp alone, at most every ``LABELS_CLOCK_EVERY``
seconds, so that every join task's labels' clock follows how late labels are read as the direct path's one clock
does.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from itertools import groupby

import numpy as np

from exporter.stream.bounded import Parts
from exporter.stream.decode.outcomes import decode_outcomes
from exporter.stream.ingest import Ingest
from exporter.stream.kafka.client import Offsets, Partition, newest_timestamp, offsets_of, values_and_next
from exporter.stream.kafka.internal_producer import InternalProducer
from exporter.stream.kafka.internal_topics import InternalTopics
from exporter.stream.payloads.payload import REFUSED_ROWS, components, read_halves, records_of
from exporter.stream.payloads.platforms import Half
from exporter.stream.stages.halves import MAX_HALF_BYTES, piece_rows, rekeyed
from exporter.stream.stages.records import (
    Kind,
    codes_layout,
    codes_matrix,
    encode,
    encode_rows,
    pending_rows,
    rows_at,
    side_ids,
)

LABELS_CLOCK_EVERY = 5.0
"""Seconds between the labels' timestamps sent alone to a join partition that no label of a poll went to."""

_NO_LABELS: dict[str, np.ndarray] = {
    "source": np.zeros(0, np.int32), "position": np.zeros(0, np.int64), "outcome": np.zeros(0, np.int8),
    "id_bytes": np.zeros(0, np.uint8), "id_lengths": np.zeros(0, np.int32),
}  # fmt: skip


class EntryStages:
    """The ingest and labels stages of one replica (called under the stages' lock)."""

    def __init__(self, ingest: Ingest, producer: InternalProducer, topics: Callable[[], InternalTopics],
                 logs: dict[str, str]) -> None:  # fmt: skip
        self.ingest = ingest
        self.producer = producer
        self.topics = topics
        """The internal topics as the broker has them (known once the source prepared them)."""
        self.logs = logs
        """Each topic's id, as the source keeps it current (it names the log a source position is in)."""
        self._clock_sent: dict[tuple[Partition, int], float] = {}
        """When each join partition last had a labels partition's timestamp (with its labels or alone)."""

    def predictions(self, parts: Parts, produced: Offsets) -> None:
        """Decode every input partition's records at once and send each model's rows on; the next offsets go to
        ``produced`` before the rejects are reported (a failure there is not tried again: they would count twice)."""
        if self.ingest.fleet.events.format != "json":
            self.halves(parts, produced)
            return
        values: list[bytes | None] = []
        sources, offsets, ends = [], [], {}
        for i, (partition, records) in enumerate(parts):
            part_values, ends[partition] = values_and_next(records)
            values += part_values
            sources.append(np.full(len(part_values), i, dtype=np.int32))
            offsets.append(offsets_of(records, ends[partition]))
        source, position = np.concatenate(sources), np.concatenate(offsets)
        meta_sources = [[*p, self.logs.get(p[0], "")] for p, _ in parts]
        ingest = self.ingest
        decoders, decoded, ignored, malformed = ingest.fleet.decode(values, ingest.clock())  # type: ignore[arg-type]
        for model_id, batch in decoded.items():
            if not len(batch):
                continue
            spec = decoders[model_id].model
            at = batch.positions
            rows = {"source": source[at], "position": position[at], "timestamp": batch.timestamps,
                    "prediction": batch.predictions.astype(np.int8), "outcome": batch.outcomes.astype(np.int8),
                    "codes": codes_matrix(spec, batch.codes), "score": batch.scores}  # fmt: skip
            meta = {"model": model_id, "layout": codes_layout(spec), "sources": meta_sources}
            topic, counts = self.topics().counts_of(model_id)
            for value in encode_rows(Kind.PREDICTIONS, meta, rows, side_ids(spec, batch)):
                self.producer.send(topic, counts, value, model_id.encode())
            if ingest.kafka.labels_topic and not spec.sourced():  # else its counts task sends them, joined
                waiting = np.flatnonzero((batch.outcomes < 0) & np.fromiter(
                    (pid is not None for pid in batch.prediction_ids), bool, len(batch)))  # fmt: skip
                self._to_join(Kind.PENDING, meta, pending_rows(rows, waiting),
                              [str(batch.prediction_ids[i]) for i in waiting.tolist()])  # fmt: skip
        produced.update(ends)
        ingest.report(decoded, ignored, malformed, 0, ", ".join(f"{t}[{p}]" for t, p in ends))

    def halves(self, parts: Parts, produced: Offsets) -> None:
        """A payload log's records (``events.format`` kserve or seldon): each read as a half of a call and sent, as
        one HALVES row (PIECES rows when it is larger than a record holds: stages/halves.py), to the join partition
        of its call id, where its partner meets it; a refused one is counted and dead-lettered here, and its call id
        sent on as refused, so that the partner is dropped."""
        fleet = self.ingest.fleet
        form = fleet.events.format
        ends: Offsets = {}
        rows: list[tuple[int, int, str, bytes]] = []
        letters: list[tuple[bytes | None, str]] = []
        ignored: Counter[str] = Counter()
        for i, (partition, records) in enumerate(parts):
            ends[partition] = values_and_next(records)[1]
            offsets = offsets_of(records, ends[partition]).tolist()
            read = read_halves(form, partition[0], records_of(records), fleet.decoders,
                               self.ingest.kafka.response_topic, components(fleet.config.models))
            ignored.update(read.ignored)
            for k, half in zip(read.at, read.halves, strict=True):
                rows.append((i, offsets[k], half.pair, rekeyed(half)))
            for (value, reason, model, pid), k in zip(read.rejected, read.rejected_at, strict=True):
                letters.append((value, reason))
                if model is not None and pid is not None:
                    rows.append((i, offsets[k], pid, rekeyed(Half(pid, False, model, None, REFUSED_ROWS, {}))))
        rows.sort()
        if rows:
            topics = self.topics()
            where = topics.join_of([r[2] for r in rows])
            meta = {"sources": [[*p, self.logs.get(p[0], "")] for p, _ in parts]}
            for q in np.unique(where).tolist():
                # in log order: the join task meets a call's halves in the order the direct path reads them (the
                # first half's component is the one counted), so a run of halves and a half in pieces are not swapped
                mine = [rows[k] for k in np.flatnonzero(where == q).tolist()]
                for large, run in groupby(mine, key=lambda r: len(r[3]) > MAX_HALF_BYTES):
                    at = list(run)
                    if large:  # too large for one record: in pieces, put together by the join task
                        values = encode_rows(Kind.PIECES, meta, *piece_rows([(r[0], r[1], r[3]) for r in at]))
                    else:
                        table: dict[str, np.ndarray] = {"source": np.array([r[0] for r in at], dtype=np.int32),
                                 "position": np.array([r[1] for r in at], dtype=np.int64)}  # fmt: skip
                        values = encode_rows(Kind.HALVES, meta, table, [r[3].decode() for r in at])
                    for value in values:
                        self.producer.send(topics.join.name, q, value)
        produced.update(ends)
        self.ingest.report({}, ignored, [], 0, ", ".join(f"{t}[{p}]" for t, p in ends), letters)

    def labels(self, parts: Parts, produced: Offsets) -> None:
        """Send each decoded label of one labels partition to the join partition of its prediction id; the next
        offset goes to ``produced``."""
        ((partition, records),) = parts
        values, end = values_and_next(records)
        fleet = self.ingest.fleet
        decoded = decode_outcomes(values, fleet.events.prediction_id, fleet.events.label)
        if decoded.invalid:
            self.ingest.health.count_outcomes({"invalid_label_event": decoded.invalid})
        at = np.asarray(decoded.positions, dtype=np.int64)
        rows = {"source": np.zeros(len(at), dtype=np.int32), "position": offsets_of(records, end)[at],
                "outcome": np.asarray(decoded.outcomes, dtype=np.int8)}  # fmt: skip
        meta: dict[str, object] = {"sources": [[*partition, self.logs.get(partition[0], "")]]}
        newest = newest_timestamp(records)
        if newest is not None:  # the join tasks hold their labels' clock back by how late labels are read
            meta["label_time"] = newest
        written = self._to_join(Kind.LABELS, meta, rows, decoded.prediction_ids)
        if newest is not None:
            self._send_label_time(partition, meta, written)
        produced[partition] = end

    def _send_label_time(self, partition: Partition, meta: dict[str, object], written: list[int]) -> None:
        """The labels' timestamp alone to each join partition that has had none of this labels partition's for
        :data:`LABELS_CLOCK_EVERY` seconds (``written``: those its labels just went to)."""
        now = self.ingest.clock()
        for q in written:
            self._clock_sent[(partition, q)] = now
        topics = self.topics()
        for q in range(topics.join.partitions):
            if now - self._clock_sent.get((partition, q), -LABELS_CLOCK_EVERY) >= LABELS_CLOCK_EVERY:
                self.producer.send(topics.join.name, q, encode(Kind.LABELS, meta, _NO_LABELS))
                self._clock_sent[(partition, q)] = now

    def _to_join(self, kind: Kind, meta: dict[str, object], rows: dict[str, np.ndarray], ids: list[str]) -> list[int]:
        """Rows keyed by prediction id, each to its join partition (in row order within each); the partitions."""
        if not ids:
            return []
        topics = self.topics()
        where = topics.join_of(ids)
        partitions: list[int] = np.unique(where).tolist()
        for q in partitions:
            mine = np.flatnonzero(where == q)
            for value in encode_rows(kind, meta, rows_at(rows, mine, len(ids)), [ids[i] for i in mine.tolist()]):
                self.producer.send(topics.join.name, q, value)
        return partitions
