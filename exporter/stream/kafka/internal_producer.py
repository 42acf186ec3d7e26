"""The staged path's producer of internal records, through the configured client library.

Each record goes to an explicit partition (computed by exporter/stream/kafka/internal_topics.py). One request in
flight per connection and no idempotent producer (kafka-python 3's dies for good on a broker restart): a
partition's records reach the broker in the order they were sent, which the receivers' high-water marks rely on.
:meth:`InternalProducer.flush` returns once every record sent before it is acknowledged, or raises: a stage
commits an input offset only after that.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from exporter.config import KafkaConfig

log = logging.getLogger(__name__)

FLUSH_SECONDS = 30.0
LINGER_MS = 5
SETTINGS = {
    "kafka-python": {"enable_idempotence": False, "max_in_flight_requests_per_connection": 1, "acks": "all",
                     "linger_ms": LINGER_MS},
    "confluent-kafka": {"enable.idempotence": False, "max.in.flight": 1, "acks": "all", "linger.ms": LINGER_MS},
}  # fmt: skip
"""What ordering and durability need, in each library's names (they override ``kafka.client``)."""


def producer_config(kafka: KafkaConfig, defaults: Mapping[str, Any], settings: Mapping[str, Any]) -> dict[str, Any]:
    """A producer's keywords (kafka-python) or properties (confluent-kafka): ``kafka.client`` over ``defaults`` and
    under ``settings``. ``kafka.client`` is the consumer's, so only the producer's own keys are taken from it:
    kafka-python's KafkaProducer refuses a consumer-only key (``session_timeout_ms``: "Unrecognized configs");
    librdkafka ignores consumer properties in a producer, with one warning each on the log given here."""
    if kafka.client_library == "confluent-kafka":
        return {"bootstrap.servers": kafka.bootstrap_servers, **defaults, **kafka.client, **settings,
                "logger": log.getChild("librdkafka")}  # fmt: skip
    from kafka import KafkaProducer

    known = {k: v for k, v in kafka.client.items() if k in KafkaProducer.DEFAULT_CONFIG}
    return {"bootstrap_servers": kafka.bootstrap_servers.split(","), **defaults, **known, **settings}


class ProduceFailed(RuntimeError):
    """Internal records that the broker did not acknowledge: the source rebuilds its client and the stages
    produce them again from the last committed offsets."""


class InternalProducer:
    """Sends internal records. Not thread-safe: the stages send and flush under their one lock, so that a flush
    answers for exactly the records its caller sent."""

    def __init__(self, kafka: KafkaConfig) -> None:
        self.kafka = kafka
        self._producer: Any = None
        self._pending: list[Any] = []  # kafka-python futures since the last flush
        self._errors: list[str] = []  # confluent-kafka delivery errors since the last flush

    def _make(self) -> Any:
        kafka = self.kafka
        if kafka.client_library == "confluent-kafka":
            from confluent_kafka import Producer

            return Producer(producer_config(kafka, {}, SETTINGS["confluent-kafka"]))
        from kafka import KafkaProducer

        return KafkaProducer(**producer_config(kafka, {}, {"client_id": f"fairness-exporter-{kafka.group_id}",
                                                           **SETTINGS["kafka-python"]}))  # fmt: skip

    def send(self, topic: str, partition: int, value: bytes, key: bytes | None = None) -> None:
        """Queue one record for an explicit partition; ProduceFailed if the client refuses it (no broker answers
        its metadata request, its buffer stays full): the producer's failure, never the input's."""
        try:
            self._send(topic, partition, value, key)
        except ProduceFailed:
            raise
        except Exception as exc:
            raise ProduceFailed(f"an internal record for {topic}[{partition}] could not be queued "
                                f"({type(exc).__name__}: {exc})") from exc  # fmt: skip

    def _send(self, topic: str, partition: int, value: bytes, key: bytes | None) -> None:
        if self._producer is None:
            self._producer = self._make()
        producer = self._producer
        if self.kafka.client_library == "confluent-kafka":
            while True:
                try:
                    producer.produce(topic, value=value, key=key, partition=partition, on_delivery=self._delivered)
                    break
                except BufferError:  # librdkafka's queue is full: deliver some first
                    producer.poll(0.1)
            producer.poll(0)
        else:
            self._pending.append(producer.send(topic, value=value, key=key, partition=partition))

    def _delivered(self, error: object, _message: object) -> None:
        if error is not None:
            self._errors.append(str(error))

    def flush(self) -> None:
        """Wait until everything sent so far is acknowledged; ProduceFailed if any record was not."""
        producer, pending, self._pending = self._producer, self._pending, []
        if producer is None:
            return
        if self.kafka.client_library == "confluent-kafka":
            left = producer.flush(FLUSH_SECONDS)
            errors, self._errors = self._errors, []
            if left:
                errors.append(f"{left} record(s) not delivered within {FLUSH_SECONDS:g} s")
        else:
            try:
                producer.flush(timeout=FLUSH_SECONDS)
            except Exception as exc:  # kafka-python: KafkaTimeoutError
                raise ProduceFailed(f"internal records not acknowledged within {FLUSH_SECONDS:g} s: {exc}") from exc
            errors = [str(f.exception) for f in pending if not f.is_done or f.failed()]
        if errors:
            raise ProduceFailed(f"{len(errors)} internal record(s) not acknowledged: {errors[0]}")

    def close(self) -> None:
        """Deliver what is queued (up to 5 s) and close."""
        producer, self._producer = self._producer, None
        if producer is None:
            return
        if self.kafka.client_library == "confluent-kafka":
            producer.flush(5)
        else:
            producer.close(timeout=5)
