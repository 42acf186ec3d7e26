"""What a staged task does with an internal record it cannot apply: it never drops it in silence.

Its rows were written and validated by our own entry stage, so a record that cannot be applied is a defect (or a
resource exhausted), not a bad event: skipping it would lose every event it holds (up to 900 KB of rows, a
model's traffic of a poll), and a task's state after a failed apply is not known to be whole (its high-water marks
moved), so neither skipping nor trying again in place is exact. So the failure is raised
:data:`~exporter.stream.bounded.ATTEMPTS` - 1 times: the stages abandon the poll (every task is restored from its
last snapshot, which reads the record again; receivers skip what was sent twice), the source rebuilds its
consumer. On the last try the task stops: its partition is read but not applied and nothing of it is committed
past its last snapshot, ``fairness_exporter_stage_tasks_stopped`` counts it, a counts task's models leave this
replica (FairnessExporterModelUnowned), and the replica is not ready, naming it, until a restart or another
replica takes the partition.
"""

from __future__ import annotations

import logging

from exporter.health.counters import Health, StageHealth
from exporter.stream.bounded import ATTEMPTS
from exporter.stream.kafka.client import Partition

log = logging.getLogger(__name__)


class TaskFailures:
    """The tasks of one replica that failed to apply a record: tried again, or stopped."""

    def __init__(self, health: Health, stage_health: StageHealth) -> None:
        self.health = health
        self.stage_health = stage_health
        self.tried: dict[Partition, tuple[int, int, str]] = {}
        """Tasks tried again from their snapshot: (offset, tries, why)."""
        self.stopped: dict[Partition, tuple[str, str]] = {}
        """Tasks stopped on a record they could not apply: (stage, why)."""

    @property
    def failing(self) -> str | None:
        """Why a task does not apply what it reads (a stopped one first), for /readyz."""
        return next((why for _, why in self.stopped.values()), None) or \
            next((why for _, _, why in self.tried.values()), None)  # fmt: skip

    def failed(self, partition: Partition, stage: str, offset: int, exc: Exception, models: str | None) -> bool:
        """Count a failure to apply the record at ``offset``; True: stop the task now (the last try), else the
        caller raises. ``models``: a counts partition's, for the reason (None: a join partition)."""
        held = f"the models {models}" if models is not None else "the labels and payload halves whose ids fall on it"
        self.health.batch_failures.inc()
        failed, tries, _ = self.tried.get(partition, (offset, 0, ""))
        tries = tries + 1 if failed == offset else 1
        why = f"{partition[0]}[{partition[1]}] offset {offset} cannot be applied by its {stage} task " \
              f"({type(exc).__name__}: {exc})"  # fmt: skip
        if tries < ATTEMPTS:
            self.tried[partition] = (offset, tries, f"{why}; try {tries} of {ATTEMPTS}, each from the task's last "
                                     "snapshot, then the task stops")  # fmt: skip
            log.error("%s", self.tried[partition][2], exc_info=tries == 1)
            return False
        self.tried.pop(partition, None)
        self.stopped[partition] = (stage, f"{why} in {ATTEMPTS} tries: the task is stopped, {held} are not counted "
                                          "until a restart or another replica takes the partition")  # fmt: skip
        log.error("%s", self.stopped[partition][1])
        self._count()
        return True

    def applied(self, partition: Partition, offset: int) -> None:
        """The task applied the record at ``offset``: a failure before it has passed."""
        tried = self.tried.get(partition)
        if tried is not None and offset >= tried[0]:
            del self.tried[partition]

    def forget(self, partition: Partition) -> None:
        """Revoked: another replica tries it."""
        self.tried.pop(partition, None)
        if self.stopped.pop(partition, None) is not None:
            self._count()

    def _count(self) -> None:
        stages = [stage for stage, _ in self.stopped.values()]
        for stage in ("join", "counts"):
            self.stage_health.stopped.labels(stage).set(stages.count(stage))
