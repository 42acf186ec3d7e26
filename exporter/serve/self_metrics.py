"""Collectors of the daemon's live state, read at each publication to the HTTP worker (its counters and gauges are
exporter/health/counters.py)."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping

from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from exporter.health.counters import Owned


class OwnershipCollector(Collector):
    """Which models this replica owns, each one's open detector step and window head, read at each publication; and
    the settings the stage alerts compare against."""

    def __init__(self, owned: Callable[[], list[Owned]], bucket_seconds: float) -> None:
        self.owned = owned
        self.bucket_seconds = bucket_seconds

    def collect(self) -> Iterator[GaugeMetricFamily]:
        owner = GaugeMetricFamily("fairness_exporter_model_owned",
                                  "1 on the replica that holds the model's partition of the counts topic (its "
                                  "windows, detectors and series), 0 on the others.",
                                  labels=["model_id", "topic", "partition"])  # fmt: skip
        step = GaugeMetricFamily("fairness_exporter_model_last_step_timestamp_seconds",
                                 "Start of the bucket of the model's open detector step, on its owner: the bucket "
                                 "of its newest event counted (the events' time).",
                                 labels=["model_id"])  # fmt: skip
        head = GaugeMetricFamily("fairness_exporter_model_head_timestamp_seconds",
                                 "Start of the newest bucket of the model's window, on its owner: advanced to the "
                                 "wall clock at every count and computation, it stops when its evaluation does.",
                                 labels=["model_id"])  # fmt: skip
        for model_id, topic, partition, owned, last_step, newest in self.owned():
            owner.add_metric([model_id, topic, str(partition)], float(owned))
            if owned and last_step is not None:
                step.add_metric([model_id], last_step)
            if owned and newest is not None:
                head.add_metric([model_id], newest)
        yield owner
        yield step
        yield head
        yield GaugeMetricFamily("fairness_exporter_bucket_seconds", "Width of the window buckets (one detector "
                                "step per bucket at most).", value=self.bucket_seconds)  # fmt: skip


class ConsumerCollector(Collector):
    """Consumer lag and broker reachability, read from the source at each publication to the HTTP worker (every
    0.5 s): a partition handed to another replica takes its lag series with it (as kafka_exporter does), rather
    than leaving a frozen gauge behind."""

    def __init__(self, lag: Callable[[], Mapping[tuple[str, int], int]], connected: Callable[[], bool]) -> None:
        self.lag = lag
        self.connected = connected

    def collect(self) -> Iterator[GaugeMetricFamily]:
        lag = GaugeMetricFamily("fairness_exporter_consumer_lag_messages",
                                "Messages between the partition's high watermark and the next offset to read, for "
                                "the partitions this replica holds.", labels=["topic", "partition"])  # fmt: skip
        for (topic, partition), n in sorted(self.lag().items()):
            lag.add_metric([topic, str(partition)], n)
        yield lag
        yield GaugeMetricFamily("fairness_exporter_kafka_connected",
                                "1 while a Kafka broker answers the consumer, else 0.", value=int(self.connected()))
