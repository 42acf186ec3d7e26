"""A subscribed replica of the direct path (``kafka.stages: direct``) holds every partition of its topics, or counts
nothing: the direct path counts only what its replica reads.

One whose first assignment lacks some (another member of its group holds them) counts nothing and waits one
session timeout and :data:`GHOST_REJOIN_SECONDS` for them: a member that died without leaving the group (its own
predecessor, SIGKILLed or OOM-killed and restarted at once) holds its partitions until its session times out, then
the group hands them over. If they do not come, the other member is alive: it refuses before it counts a record
(``refusal``, then the daemon exits 2). One that loses some later (a rebalance long after start) pauses every
partition it holds and counts nothing (``shared`` says why: /readyz, ``fairness_exporter_partitions_shared``) until
it holds them all again, and then resumes each one where *it* stopped, so its window is never a part of the
traffic, whatever another member counted meanwhile. With static membership (``group_instance_id`` /
``group.instance.id`` in ``kafka.client``, as the Helm chart sets from the pod name) a restarted replica takes its
predecessor's member id and partitions at once, with no wait.
"""

from __future__ import annotations

import logging
import threading
import time

from exporter.health.counters import Health
from exporter.stream.kafka.client import KafkaClient, Partition

log = logging.getLogger(__name__)

GHOST_REJOIN_SECONDS = 30.0
"""How long after a dead member's session timeout the group may take to evict it and hand its partitions over
(Tansu notices it at the next heartbeat of another member, then holds each JoinGroup and SyncGroup up to 3 s)."""


class WholeReplica:
    """The judgement of a subscribed direct replica's assignments, on the source's thread."""

    def __init__(self, group_id: str, topics: list[str], health: Health, assigned_once: threading.Event) -> None:
        self.group_id = group_id
        self.topics = topics
        self.health = health
        self.assigned_once = assigned_once
        self.refusal: str | None = None
        self.shared: str | None = None
        """While another member of the group holds some of the topics' partitions: why counting is paused."""
        self.pending = False
        """An assignment to judge (set by each assignment; judged after the poll)."""
        self._whole_once = False
        self._deadline: float | None = None
        """Until when (time.monotonic()) a replica that never held every partition waits for them."""

    def due(self) -> bool:
        """Whether to judge after this poll: an assignment came, or the wait for a dead member is over."""
        return self.pending or (self._deadline is not None and time.monotonic() >= self._deadline)

    def judge(self, client: KafkaClient) -> None:
        """After an assignment: count on if it holds every partition of its topics; else wait for a dead member's,
        then refuse if it never held them all (it is the newcomer), or pause everything it holds until it does."""
        self.pending = False
        held, every = client.assignment(), set[Partition]()
        for topic in self.topics:
            ids = client.partitions(topic)  # [] for a topic that does not exist (now): it has no partition to miss
            if ids is None:  # no broker answers: judged after the next poll
                self.pending = True
                return
            every.update((topic, p) for p in ids)
        if not held and not every:  # nothing known yet
            self.pending = True
            return
        missing = every - held
        if not missing:
            if self.shared is not None:
                log.warning("this replica holds every partition of %s again: counting resumes where it stopped",
                            ", ".join(self.topics))  # fmt: skip
                client.resume(sorted(held))
            self.shared, self._whole_once, self._deadline = None, True, None
            self.health.partitions_shared.set(0)
            self.assigned_once.set()
            return
        why = (f"another member of consumer group {self.group_id!r} holds {len(missing)} of the {len(every)} "
               f"partitions of {', '.join(self.topics)}")  # fmt: skip
        if not self._whole_once and not self._wait(client, held, why):
            self.refusal = (f"kafka.group_id: {why}: kafka.stages: direct counts what one replica reads, so every "
                            "model would be split between the replicas; use kafka.stages: staged to run several")
            return
        if self._whole_once:
            client.pause(sorted(held))
            if self.shared is None:
                log.error("%s: counting is paused, so that no window holds a part of the traffic, until this replica "
                          "holds them all again (run one replica of kafka.stages: direct, or use kafka.stages: "
                          "staged)", why)  # fmt: skip
            self.shared = why
            self.health.partitions_shared.set(1)

    def _wait(self, client: KafkaClient, held: set[Partition], why: str) -> bool:
        """A replica that never held every partition: whether to wait (counting nothing) for a member that may be
        dead to time out, rather than refuse now."""
        now = time.monotonic()
        if self._deadline is None:
            self._deadline = now + client.session_seconds + GHOST_REJOIN_SECONDS
            log.warning("%s: waiting up to %.0f s for them (a member that died without leaving the group, such as "
                        "this replica's own predecessor, holds them until its session times out) before refusing",
                        why, self._deadline - now)  # fmt: skip
        if now >= self._deadline:
            return False
        client.pause(sorted(held))
        self.shared = f"{why}; waiting {self._deadline - now:.0f} s more for them before refusing"
        self.health.partitions_shared.set(1)
        return True
