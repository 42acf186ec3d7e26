"""What the Kafka source needs of a client library, as one Protocol, and the types it speaks in.

Two thin adapters implement it by calling their library and nothing more: :mod:`exporter.stream.kafka.kafka_python`
(kafka-python) and :mod:`exporter.stream.kafka.confluent` (confluent-kafka). Every policy (where to start, what to
commit, when a log was reset, what a rebalance does) lives once, in :class:`exporter.stream.kafka.source.KafkaSource`,
which learns what was counted from one :class:`OffsetsBook`.
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Collection, Mapping, Sequence
from typing import NamedTuple, Protocol

import numpy as np

Partition = tuple[str, int]
"""(topic, partition)."""
Offsets = dict[Partition, int]
"""Next offset to read, per partition."""
FILL_SECONDS = 0.05
"""How long a poll that has records goes on waiting for more, up to the records asked (:meth:`KafkaClient.poll`)."""


class Record(Protocol):
    """One Kafka message as the ingest reads it."""

    @property
    def value(self) -> bytes | None: ...

    @property
    def offset(self) -> int: ...


class SimpleRecord(NamedTuple):
    """A :class:`Record` built by hand (the confluent adapter, tests, benchmarks)."""

    value: bytes | None
    offset: int
    timestamp: int = -1
    """The record's Kafka timestamp in milliseconds (CreateTime or LogAppendTime); -1: none."""


class Batch(Sequence[Record]):
    """One partition's records as a client hands them over: a sequence of records that also gives its values and
    the offset after its last record directly, without a record object per message (which costs a client whose
    library has none, such as confluent-kafka, more than the decoding of the message)."""

    __slots__ = ()

    @abstractmethod
    def values(self) -> list[bytes | None]:
        """Every record's value, in offset order."""

    @abstractmethod
    def next_offset(self) -> int:
        """The offset after the last record."""

    @abstractmethod
    def newest_timestamp_ms(self) -> int:
        """The newest record timestamp in milliseconds; -1 or 0 when the records carry none."""


def values_and_next(records: Sequence[Record]) -> tuple[list[bytes | None], int]:
    """A non-empty batch's values and the offset after its last record: from a :class:`Batch` directly, else
    record by record (kafka-python's ConsumerRecords, tests, benchmarks)."""
    if isinstance(records, Batch):
        return records.values(), records.next_offset()
    return [r.value for r in records], records[-1].offset + 1


def newest_timestamp(records: Sequence[Record]) -> float | None:
    """The newest Kafka timestamp of a batch's records, in seconds; None when they carry none (kafka-python's
    records and :class:`SimpleRecord` have ``timestamp`` in milliseconds, -1 for none)."""
    if isinstance(records, Batch):
        ms = records.newest_timestamp_ms()
    else:
        ms = max((getattr(r, "timestamp", -1) for r in records), default=-1)
    return ms / 1000 if ms > 0 else None


def offsets_of(records: Sequence[Record], next_offset: int) -> np.ndarray:
    """Every record's offset in a non-empty batch (the usual one is contiguous: then no record is read)."""
    first = records[0].offset
    if next_offset - first == len(records):
        return np.arange(first, next_offset, dtype=np.int64)
    return np.fromiter((r.offset for r in records), np.int64, len(records))


class LogBounds(NamedTuple):
    """A partition's log as the last fetch response described it; None where the client does not know."""

    start: int | None
    """The log start offset: the first offset the broker still holds."""
    end: int | None
    """The high watermark: the offset the next produced record will get."""


class Rebalance(Protocol):
    """What a consumer group's rebalance asks of the source. The contract, for both client libraries:

    - ``revoked(partitions)`` runs *before* the partitions go to another member, on a thread where the client may
      still commit without waiting. The source makes what it counted durable (a checkpoint, if configured),
      commits exactly that without waiting. On the staged path it forgets the partitions' offsets, so no later
      commit or checkpoint of this replica carries them (a stale offset would rewind their new owner, who would
      then count events twice). A direct replica keeps them: it counts only while it holds every partition, so
      one it gets back resumes where it stopped, and only partitions held are ever committed. A client closing
      down does not call it: a rebuilt consumer resumes from its offsets.
    - ``assigned(partitions, committed)`` runs *after* the group assigned them and *before* any of them is
      fetched, with the group's committed offsets of those partitions (fetched by the adapter; None when that
      failed). It returns where to start each one: after the last record this process counted, else the
      checkpoint's offset (the staged path: the committed offset, or 0 for an internal topic without one); a
      partition it leaves out starts at the group's committed offset (``auto_offset_reset`` if none).
    """

    def revoked(self, partitions: list[Partition]) -> None: ...

    def assigned(self, partitions: list[Partition], committed: Offsets | None) -> Offsets: ...


class CommitFailed(Exception):
    """An offset commit the client could not complete; the source counts it and retries later."""


class KafkaClient(Protocol):
    """One consumer of one library. Not thread-safe: the source calls it from its own thread only (and the
    client calls :class:`Rebalance` from the thread its library uses)."""

    session_seconds: float
    """The group session timeout: how long a member that stopped heartbeating (killed) keeps its partitions."""

    def subscribe(self, topics: list[str], rebalance: Rebalance) -> None:
        """Join the consumer group for these topics."""

    def assign(self, starts: Mapping[Partition, int | None]) -> None:
        """Read exactly these partitions (manual assignment), each from its offset (None: the committed one)."""

    def assignment(self) -> set[Partition]:
        """The partitions held right now."""

    def partitions(self, topic: str) -> list[int] | None:
        """The topic's partition ids ([] if it does not exist); None while no broker answers."""

    def poll(self, timeout: float, max_records: int) -> Mapping[Partition, Sequence[Record]]:
        """The next records, per partition, in offset order; waits up to ``timeout`` seconds for some, and once some
        came, up to :data:`FILL_SECONDS` more for ``max_records`` in all."""

    def pause(self, partitions: list[Partition]) -> None:
        """Fetch nothing more of these held partitions (they stay assigned) until :meth:`resume`, or until a new
        assignment, which starts unpaused."""

    def resume(self, partitions: list[Partition]) -> None:
        """Fetch these held partitions again."""

    def seek(self, partition: Partition, offset: int) -> None:
        """Read the partition from this offset on. A new log (a re-created topic, a broker back empty) is read from
        offset 0, its first offset, not from a ListOffsets query, whose answer some brokers (Tansu) get wrong right
        after such a reset; a log whose start has since moved past 0 answers the fetch with OffsetOutOfRange, and
        the client's ``auto_offset_reset`` takes over."""

    def bounds(self, partition: Partition) -> LogBounds:
        """The partition's log start offset and high watermark from the last fetch response (no request)."""

    def topic_ids(self, topics: Collection[str]) -> dict[str, str | None] | None:
        """Each topic's id (it changes when the topic is re-created, or a broker lost its data), asked of the
        cluster now, never from a cache: the answer is newer than every record already fetched. None for a topic
        that does not exist now, or on a broker without topic ids (before Kafka 2.8); None in all when no broker
        answered in time."""

    def topic_names(self) -> set[str] | None:
        """Every topic the cluster has now (None while no broker answers)."""

    def connected(self) -> bool:
        """Whether any broker answers."""

    def commit(self, offsets: Offsets, wait: bool) -> None:
        """Commit these offsets; ``wait=False`` only sends them. Raises :class:`CommitFailed`."""

    def close(self) -> None:
        """Leave the group (without committing) and release the connections."""


class OffsetsBook(Protocol):
    """What the source needs to know of offsets, from the one object that keeps them (the checkpointer)."""

    topic_ids: dict[str, str]
    """The id of each topic the counted offsets belong to; the source keeps it current."""

    def counted(self) -> Offsets:
        """The next offset after the records counted, per partition: where to resume."""

    def committable(self) -> Offsets:
        """What may be committed to Kafka: the offsets a durable checkpoint covers (or, without checkpoints, the
        counted ones)."""

    def flush(self) -> None:
        """Make what is counted durable now (a checkpoint), so that :meth:`committable` covers it."""

    def forget(self, partitions: list[Partition]) -> None:
        """These partitions were handed over: no later commit or checkpoint may carry their offsets."""

    def restart(self, topic: str, topic_id: str | None, partitions: list[Partition]) -> None:
        """These partitions of the topic start again at offset 0 of a new log named ``topic_id`` (None: the broker
        has no topic ids); a new id also forgets every other offset of the topic. Done under the lock a checkpoint
        copies the offsets and ids with, so that no checkpoint or commit pairs an old offset with the new log."""

    def resume_at(self, partition: Partition, offset: int) -> None:
        """Reading goes on from ``offset`` of the partition's log, the log its offsets were counted in (its end,
        which lies before the offset counted: a broker lost the log's tail); what was counted stays counted."""

    def starts(self, partitions: list[Partition], committed: Offsets | None) -> Offsets:
        """Where newly assigned partitions start, given the group's committed offsets (None: not known); one left
        out starts at its committed offset (``auto_offset_reset`` if none)."""

