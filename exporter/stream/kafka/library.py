"""The adapter of the configured client library (``kafka.client_library``), imported only when a source connects,
so that a daemon loads one library, not both."""

from __future__ import annotations

from collections.abc import Callable

from exporter.config import KafkaConfig
from exporter.stream.kafka.client import KafkaClient


def make_client(kafka: KafkaConfig, on_error: Callable[[str, str], None], max_records: int) -> KafkaClient:
    """The adapter of the configured client library (``max_records``: the most one poll returns)."""
    if kafka.client_library == "confluent-kafka":
        from exporter.stream.kafka.confluent import ConfluentClient

        return ConfluentClient(kafka, on_error)
    from exporter.stream.kafka.kafka_python import KafkaPythonClient

    return KafkaPythonClient(kafka, max_records)
