"""No input record can stall its partition: a unit of records whose handling raises is bounded.

One policy for the direct path's ingest (exporter/stream/ingest.py) and the staged path's entry stages
(exporter/stream/stages/replica.py): a unit (a poll's predictions, one labels partition's batch) that raises is
tried :data:`ATTEMPTS` times, then record by record; a record that fails alone too is skipped: dead-lettered with
reason ``unhandled``, counted in ``fairness_exporter_records_skipped_total`` (alert FairnessExporterRecordsSkipped),
logged at ERROR, and its partition reads on. A unit whose offsets were recorded (its handling done) before it raised
is not tried again: the direct path would count it twice. While a unit fails, :attr:`Bound.failing` says why
(``/readyz``).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from typing import Final

from exporter.health.counters import Health
from exporter.stream.kafka.client import Partition, Record
from exporter.stream.kafka.dead_letters import DeadLetters

log = logging.getLogger(__name__)
ATTEMPTS: Final = 3
"""Tries of a unit that raises before its records are tried one by one."""
RETRY_SECONDS: Final = 1.0
"""The wait before the second try (twice that before the third): a transient failure (memory) may pass."""
Parts = Sequence[tuple[Partition, Sequence[Record]]]


class Bound:
    """Handles units of records with the bound; where a partition's handling has got to is the caller's book
    (``position(partition)``: the next offset recorded, -1 none; ``advance(partition, offset)`` records one)."""

    def __init__(self, health: Health, dead_letters: DeadLetters | None, position: Callable[[Partition], int],
                 advance: Callable[[Partition, int], None],
                 passes: tuple[type[Exception], ...] = ()) -> None:  # fmt: skip
        """``passes``: failures that are not the unit's (an internal producer the broker does not answer): raised
        at once, for the caller to retry the unit as it retries the broker, never skipped."""
        self.health = health
        self.dead_letters = dead_letters
        self.position = position
        self.advance = advance
        self.passes = passes
        self.failing: str | None = None
        """Why the unit being handled failed, while it is retried (None otherwise): /readyz names it."""

    def __call__(self, parts: Parts, handle: Callable[[Parts], None]) -> None:
        """``handle(parts)``, tried :data:`ATTEMPTS` times, then record by record; a record that fails alone is
        skipped (:meth:`skip`). Never raises, but what ``passes``."""
        where = ", ".join(f"{t}[{p}] offsets {r[0].offset}..{r[-1].offset}" for (t, p), r in parts)
        for attempt in range(1, ATTEMPTS + 1):
            try:
                handle(parts)
            except self.passes:
                self.failing = None
                raise
            except Exception as exc:
                self.health.batch_failures.inc()
                self.failing = f"{where} cannot be counted ({type(exc).__name__}: {exc}); try {attempt} of " \
                               f"{ATTEMPTS}, then record by record"  # fmt: skip
                log.error("%s", self.failing, exc_info=attempt == 1)
                if self.done(parts):
                    break
                if attempt < ATTEMPTS:
                    time.sleep(RETRY_SECONDS * attempt)
                continue
            self.failing = None
            return
        try:
            if not self.done(parts):
                for partition, records in parts:
                    for record in records:
                        try:
                            handle([(partition, [record])])
                        except self.passes:
                            raise
                        except Exception as exc:
                            if not self.done([(partition, [record])]):
                                self.skip(partition, record, exc)
        finally:
            self.failing = None

    def done(self, parts: Parts) -> bool:
        """Whether every partition of the unit has its offset recorded past the unit's last record."""
        return all(self.position(partition) > records[-1].offset for partition, records in parts)

    def skip(self, partition: Partition, record: Record, exc: Exception) -> None:
        """Give up on one record that cannot be handled even alone: dead-letter it, count it, read on."""
        self.advance(partition, record.offset + 1)
        self.health.records_skipped.inc()
        log.error("%s[%d] offset %d skipped: it cannot be counted (%s: %s)%s", *partition, record.offset,
                  type(exc).__name__, exc, "; sent to the dead-letter topic" if self.dead_letters else "")  # fmt: skip
        if self.dead_letters is not None:
            self.dead_letters.send([(record.value, "unhandled")])
