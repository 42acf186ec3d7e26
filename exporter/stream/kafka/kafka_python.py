"""The kafka-python adapter of :class:`~exporter.stream.kafka.client.KafkaClient`: calls into the library, no policy."""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Collection, Mapping, Sequence
from typing import Any

from kafka import KafkaConsumer, TopicPartition
from kafka.consumer.subscription_state import AsyncConsumerRebalanceListener
from kafka.errors import Cancelled, KafkaConfigurationError, KafkaError
from kafka.structs import MemberState, OffsetAndMetadata

from exporter.config import KafkaConfig
from exporter.stream.kafka.client import FILL_SECONDS, CommitFailed, LogBounds, Offsets, Partition, Rebalance, Record

COMMIT_TIMEOUT_MS = 5000
TOPIC_IDS_TIMEOUT_MS = 2000
# kafka-python 3 backs off up to 30 s between reconnects; a monitor should notice a returning broker sooner. Its
# constructor waits for a broker up to bootstrap_timeout_ms (30 s): a SIGTERM then waited that long; the source
# retries a constructor that gave up, with its own backoff. session_timeout_ms: how long a member that died (a
# SIGKILL, an OOM kill) holds its partitions; kafka-python 3's default is 45 s (KIP-735), which a restarted direct
# replica waited out before it could read (~78 s to ready); 10 s as on confluent-kafka.
CLIENT_DEFAULTS: dict[str, Any] = {"reconnect_backoff_max_ms": 5000, "metadata_max_age_ms": 30_000,
                                   "bootstrap_timeout_ms": 3000, "session_timeout_ms": 10_000}  # fmt: skip
GROUP_ONLY = frozenset({"group_instance_id"})
"""kafka.client's settings that a consumer without a group refuses (the topic-id lookups' own, :meth:`topic_ids`)."""
FETCH_DEFAULTS: dict[str, Any] = {}
"""Fetch sizes beyond kafka-python's own defaults (fetch_max_bytes 50 MB, max_partition_fetch_bytes 1 MB), with
the source's max_poll_records of 20,000: none. Measured on the shipped source (300,000 events, 3 partitions,
interleaved rounds), 4 or 10 MB partition fetches and 5,000 or 10,000 records per poll were no faster beyond the
noise (docs/sre/performance.md): kafka-python's cost is parsing records in Python, not round trips. ``kafka.client``
overrides them."""



def _not_a_cancelled_refresh(record: logging.LogRecord) -> bool:
    """kafka-python logs at ERROR a metadata request that closing the consumer cancelled ("Metadata refresh: failed
    Cancelled"), on every shutdown or rebuild while one is in flight: no fault, so not logged. (A request a broker
    failed ends in another error, still logged.)"""
    return not (record.msg == "Metadata refresh: failed %s" and isinstance(record.args, tuple) and record.args
                and isinstance(record.args[0], Cancelled))  # fmt: skip


logging.getLogger("kafka.cluster").addFilter(_not_a_cancelled_refresh)

GROUP_UNSETTLED_SECONDS = 90.0
"""A subscribed consumer that has been without a settled group membership (no coordinator known, or a join or sync
not finished) for this long, fetching nothing while a broker answers, raises from :meth:`KafkaPythonClient.poll`,
so that the source rebuilds it. After a broker came back empty, kafka-python 3.0.12 was seen looping in coordinator
discovery for good (about one run in four of tests/test_stream_faults.py), and, more rarely, waiting for good on
the SyncGroup answer of its rejoin with the old member id (the state stays REBALANCING, no request ever times out;
about one full suite in five), and now and then a fresh consumer's first join never settles either (seen: still
REBALANCING after 300 s). A new consumer joins as a new member. A healthy rebalance on Tansu takes 20 s at
most, and the daemon's members poll continuously, so no healthy join waits this long for a slow member."""


def no_topic_creation(cluster: Any) -> None:
    """Make a kafka-python client's metadata requests never create a topic (a monitor never creates the topic it
    reads, nor its dead-letter topic). kafka-python 3.0.12 builds them from its ``ClusterMetadata``'s own config,
    which it makes without the client's ``allow_auto_create_topics`` (``kafka/net/manager.py``): that setting has
    no effect, and a consumer's request for a topic just deleted re-created it, with the broker's default partition
    count, within a second (seen in CI: a topic re-created with three partitions came back with four)."""
    cluster.config["allow_auto_create_topics"] = False


class GroupUnsettled(RuntimeError):
    """The consumer had no settled group membership for :data:`GROUP_UNSETTLED_SECONDS`."""


class _Listener(AsyncConsumerRebalanceListener):
    """kafka-python wants a subclass of its listener; this one forwards to the source's :class:`Rebalance`. It is
    the async kind, so that it can ask the group's committed offsets on the client's IO loop, where a blocking
    call would raise."""

    def __init__(self, client: KafkaPythonClient, rebalance: Rebalance) -> None:
        self.client = client
        self.consumer = client.consumer
        self.rebalance = rebalance

    async def on_partitions_revoked(self, revoked: list[TopicPartition]) -> None:
        self.client.rebalances += 1
        self.rebalance.revoked([(tp.topic, tp.partition) for tp in revoked])

    async def on_partitions_lost(self, lost: list[TopicPartition]) -> None:
        """The member was evicted: kafka-python drops these partitions' positions (one assigned again starts
        afresh), then this is a revocation to the source."""
        self.client.lost.update((tp.topic, tp.partition) for tp in lost)
        await self.on_partitions_revoked(lost)

    async def on_partitions_assigned(self, assigned: list[TopicPartition]) -> None:
        self.client.rebalances += 1
        committed: Offsets | None
        try:
            found = await self.consumer._coordinator.fetch_committed_offsets_async(list(assigned), COMMIT_TIMEOUT_MS)
            committed = {(tp.topic, tp.partition): meta.offset for tp, meta in found.items() if meta.offset >= 0}
        except KafkaError:
            committed = None
        starts = self.rebalance.assigned([(tp.topic, tp.partition) for tp in assigned], committed)
        self.client.placed.update(starts)
        for (topic, partition), offset in starts.items():
            self.consumer.seek(TopicPartition(topic, partition), offset)


class KafkaPythonClient:
    """A :class:`~exporter.stream.kafka.client.KafkaClient` on kafka-python; ``kafka.client`` names its settings."""

    def __init__(self, kafka: KafkaConfig, max_records: int) -> None:
        self.consumer = KafkaConsumer(
            bootstrap_servers=kafka.bootstrap_servers.split(","),
            group_id=kafka.group_id,
            enable_auto_commit=False,
            auto_offset_reset=kafka.auto_offset_reset,
            max_poll_records=max_records,
            client_id=f"fairness-exporter-{kafka.group_id}",
            **{**CLIENT_DEFAULTS, **FETCH_DEFAULTS, **kafka.client},
        )
        no_topic_creation(self.consumer._cluster)
        self.session_seconds = self.consumer.config["session_timeout_ms"] / 1000
        self._lookup_settings: dict[str, Any] = {
            "bootstrap_servers": kafka.bootstrap_servers.split(","), "group_id": None, "enable_auto_commit": False,
            "client_id": f"fairness-exporter-{kafka.group_id}-ids",
            **{k: v for k, v in {**CLIENT_DEFAULTS, **kafka.client}.items() if k not in GROUP_ONLY}}  # fmt: skip
        self._lookup: KafkaConsumer | None = None
        """The topic-id lookups' own consumer (:meth:`topic_ids`), made at the first one."""
        self._subscribed = False
        self.rebalances = 0
        """How many rebalance callbacks ran (a poll that saw one does not keep what an earlier poll returned)."""
        self.placed: set[Partition] = set()
        """The partitions the rebalance handler positioned (sought) since this set was last emptied."""
        self.lost: set[Partition] = set()
        """The partitions an eviction took since this set was last emptied (their positions dropped)."""
        self._unsettled_since: float | None = None  # time.monotonic() since when the membership is not settled

    def subscribe(self, topics: list[str], rebalance: Rebalance) -> None:
        self.consumer.subscribe(topics, listener=_Listener(self, rebalance))
        self._subscribed = True

    def assign(self, starts: Mapping[Partition, int | None]) -> None:
        self.consumer.assign([TopicPartition(t, p) for t, p in starts])
        for (topic, partition), offset in starts.items():
            if offset is not None:
                self.consumer.seek(TopicPartition(topic, partition), offset)

    def assignment(self) -> set[Partition]:
        return {(tp.topic, tp.partition) for tp in self.consumer.assignment()}

    def partitions(self, topic: str) -> list[int] | None:
        ids = self.consumer.partitions_for_topic(topic)
        return sorted(ids) if ids else []

    def poll(self, timeout: float, max_records: int) -> Mapping[Partition, Sequence[Record]]:
        """Up to ``max_records``: once some came, polls again for up to :data:`FILL_SECONDS` while fewer came, as
        librdkafka's ``consume`` fills its batch. kafka-python hands over what its last fetch responses held: behind,
        a poll of 20,000 was followed by one of the ~3,000 left of the same responses, and each poll pays the
        ingest's fixed cost per model (16 ms at 100 models). A rebalance during a later poll ran the source's
        handler before what the earlier polls returned was counted: those records are not kept but read again
        (:meth:`_unread`), and what the later poll fetched after the rebalance is the poll. An error a later poll
        raises with no rebalance (kafka-python raises one partition's fetch error at the poll after the one that
        returned the records before it) waits for the next poll: what the earlier polls returned is the batch, as
        before the fill, else a partition that always fails would keep the others from ever being counted."""
        batches = self.consumer.poll(timeout_ms=int(timeout * 1000), max_records=max_records)
        count = sum(map(len, batches.values()))
        deadline = time.monotonic() + FILL_SECONDS
        while 0 < count < max_records and (left := deadline - time.monotonic()) > 0:
            rebalances, self.placed, self.lost = self.rebalances, set(), set()
            try:
                more = self.consumer.poll(timeout_ms=max(1, int(left * 1000)), max_records=max_records - count)
            except KafkaError:
                if self.rebalances != rebalances:
                    raise  # the handler ran: what the earlier polls returned is read again by a new consumer
                break  # an error kafka-python deferred to its next poll (one partition's fetch): raised there again
            if self.rebalances != rebalances:
                batches = self._unread(batches, more)
                break
            for tp, records in more.items():
                batches[tp] = batches[tp] + records if tp in batches else records
            count += sum(map(len, more.values()))
        if self._subscribed:
            self._check_membership(bool(batches))
        return {(tp.topic, tp.partition): records for tp, records in batches.items()}

    def _unread(self, earlier: dict[TopicPartition, list[Any]], more: dict[TopicPartition, list[Any]]
                ) -> dict[TopicPartition, list[Any]]:  # fmt: skip
        """What a poll returns when a rebalance ran after earlier polls of its batch returned ``earlier``: those
        records, never counted, are read again. A partition the handler positioned starts where it said (``more``
        came from there); one it left out that this consumer keeps (kafka-python keeps a retained partition's
        position across a rebalance, past ``earlier``'s records) is sought back to ``earlier``'s first record, and
        what ``more`` read of it after them is dropped with them; one handed over, or lost by an eviction and
        assigned again (its position dropped: it starts at the group's committed offset, which another member may
        have moved meanwhile), starts where the group says."""
        assigned = self.consumer.assignment()
        back = {tp: records[0].offset for tp, records in earlier.items()
                if (key := (tp.topic, tp.partition)) not in self.placed and key not in self.lost and tp in assigned}
        for tp, offset in back.items():
            self.consumer.seek(tp, offset)
        return {tp: records for tp, records in more.items() if tp not in back}

    def _check_membership(self, fetched: bool) -> None:
        coordinator = self.consumer._coordinator
        unknown = coordinator.coordinator_unknown()  # asked once: it marks a disconnected coordinator dead
        if fetched or (not unknown and coordinator.state is MemberState.STABLE) or not self.connected():
            self._unsettled_since = None
            return
        now = time.monotonic()
        if self._unsettled_since is None:
            self._unsettled_since = now
        elif now - self._unsettled_since > GROUP_UNSETTLED_SECONDS:
            what = "no group coordinator found" if unknown else "the group join not done"
            raise GroupUnsettled(f"{what} for {GROUP_UNSETTLED_SECONDS:g} s while a broker answers; rebuilding the "
                                 "consumer")  # fmt: skip

    def pause(self, partitions: list[Partition]) -> None:
        self.consumer.pause(*(TopicPartition(*p) for p in partitions))

    def resume(self, partitions: list[Partition]) -> None:
        self.consumer.resume(*(TopicPartition(*p) for p in partitions))

    def seek(self, partition: Partition, offset: int) -> None:
        self.consumer.seek(TopicPartition(*partition), offset)

    def bounds(self, partition: Partition) -> LogBounds:
        # kafka-python keeps the high watermark of the last fetch response, not its log start offset
        return LogBounds(None, self.consumer.highwater(TopicPartition(*partition)))

    def topic_ids(self, topics: Collection[str]) -> dict[str, str | None] | None:
        """From a metadata request sent now, on a connection of its own (a consumer that fetches nothing): on the
        consumer's connection the request waited behind the fetch kafka-python sends ahead at each poll (a broker
        answers one connection's requests in order), 33 ms of every 20,000-record poll spent idle (a quarter of
        the shipped source's time on the embedded broker), against 1 ms alone. Sent after the poll returned, its
        answer is as new as the records fetched. A refresh already in flight was perhaps sent before the last
        records were fetched: it is awaited first, then another is sent. The lookup is made once, with the
        consumer's broker version, so that making it never waits for a broker: kafka-python's constructor starts
        its IO thread before its bootstrap, and a bootstrap that failed left the thread and its sockets behind, at
        every attempt while no broker answered."""
        try:
            if self._lookup is None:  # the consumer's broker version given: made without contacting a broker
                self._lookup = KafkaConsumer(**{"api_version": self.consumer.config["api_version"],
                                                **self._lookup_settings})  # fmt: skip
                no_topic_creation(self._lookup._cluster)
            lookup = self._lookup
            cluster, manager = lookup._cluster, lookup._manager
            cluster.set_topics(list(topics))

            async def refresh() -> None:
                if cluster.metadata_refresh_in_progress:
                    with contextlib.suppress(KafkaError):
                        await cluster.refresh_metadata()
                await cluster.refresh_metadata()

            lookup._net.run(manager.wait_for, manager.call_soon(refresh), TOPIC_IDS_TIMEOUT_MS)
        except KafkaConfigurationError:
            raise  # kafka.client's settings: the source counts and logs it, as the consumer's own
        except KafkaError:
            return None
        return {topic: None if (i := cluster.topic_id(topic)) is None else str(i) for topic in topics}

    def topic_names(self) -> set[str] | None:
        """From a metadata request for every topic, sent now."""
        cluster, manager = self.consumer._cluster, self.consumer._manager
        stash, cluster.need_all_topic_metadata = cluster.need_all_topic_metadata, True
        try:
            self.consumer._net.run(manager.wait_for, manager.call_soon(cluster.refresh_metadata), TOPIC_IDS_TIMEOUT_MS)
        except KafkaError:
            return None
        finally:
            cluster.need_all_topic_metadata = stash
        return set(cluster.topics())

    def connected(self) -> bool:
        client = self.consumer._client
        return any(client.connected(broker.node_id) for broker in client.cluster.brokers())

    def commit(self, offsets: Offsets, wait: bool) -> None:
        commit = {TopicPartition(t, p): OffsetAndMetadata(o, "", -1) for (t, p), o in offsets.items()}
        try:
            if wait:
                self.consumer.commit(commit, timeout_ms=COMMIT_TIMEOUT_MS)
            else:
                # kafka-python 3 runs rebalance callbacks on its IO thread, where a blocking commit raises
                self.consumer.commit_async(commit)
        except KafkaError as exc:
            raise CommitFailed(f"{type(exc).__name__}: {exc}") from exc

    def close(self) -> None:
        if self._lookup is not None:
            self._lookup.close(autocommit=False)
        self.consumer.close(autocommit=False)
