"""How a staged task goes live (exporter/stream/stages/replica.py): from the whole snapshot covering its committed
offset, or empty when its partition holds none, then the records it buffered while it looked."""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Protocol

from exporter.health.counters import StageHealth
from exporter.stream.kafka.client import Partition
from exporter.stream.stages.counts import CountsTask
from exporter.stream.stages.records import Record
from exporter.stream.stages.sides import SideStage
from exporter.stream.stages.snapshots import unpack
from exporter.stream.stages.tasks import Task

log = logging.getLogger("exporter.stream.stages.replica")


class Stages(Protocol):
    """What going live reads of :class:`exporter.stream.stages.replica.Stages` (which imports this module)."""

    stage_health: StageHealth
    tasks: dict[Partition, Task]
    live_counts: set[int]
    sides: SideStage | None
    lag: Callable[[], Mapping[Partition, int]]

    def _apply(self, task: Task, record: Record, offset: int) -> bool: ...


def restored(stages: Stages, task: Task, whole: bytes | None) -> None:
    """Go live from a whole snapshot (None: none is to be found, start empty), then apply what was buffered."""
    restoring = task.restoring
    assert restoring is not None
    result = "restored"
    if whole is not None:
        try:
            task.restore(*unpack(whole))
        except (ValueError, KeyError) as exc:
            log.error("%s[%d]: the snapshot covering offset %d cannot be read (%s): starting empty",
                      *task.partition, restoring.covers, exc)  # fmt: skip
            result = "missing"
    else:
        log.error("%s[%d]: no whole snapshot covering the committed offset %d in the log (retention?), %d "
                  "chunk(s) seen: its state starts empty", *task.partition, restoring.covers,
                  restoring.chunks_seen)  # fmt: skip
        result = "missing"
    stages.stage_health.restores.labels(task.stage, result).inc()
    task.restoring = None
    task.covered = restoring.covers
    go_live(stages, task)
    for offset, record in restoring.buffered:
        if not stages._apply(task, record, offset):
            return


def go_live(stages: Stages, task: Task) -> None:
    """A counts task's models are this replica's from now: counted, computed and exported here."""
    if isinstance(task, CountsTask):
        stages.live_counts.add(task.partition[1])
        task.take()
        if stages.sides is not None:
            stages.sides.live_now(task)


def give_up_caught_up(stages: Stages, lag: Mapping[Partition, int] | None = None) -> None:
    """A restoring task that has read its whole partition without a whole snapshot starts empty."""
    lag = stages.lag() if lag is None else lag
    for partition, task in list(stages.tasks.items()):
        if task.restoring is not None and lag.get(partition) == 0:
            restored(stages, task, None)
