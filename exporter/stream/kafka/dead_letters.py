"""Forward rejected events to the dead-letter topic, with a ``reason`` header, through the configured client.

Sending never raises into the ingest: an event is counted (as rejected) exactly once whatever happens to its dead
letter. A dead letter that cannot be sent (too large for the producer, a producer that cannot be made, a delivery
that fails) is counted by reason in ``fairness_exporter_dead_letters_failed_total``, logged, and dropped.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from exporter.config import KafkaConfig
from exporter.serve.self_metrics import Health, RateLimitedLog

log = logging.getLogger(__name__)

RECORD_OVERHEAD_BYTES = 512
"""Room left for the record's key, header and batch framing under the producer's size limit."""
RETRY_PRODUCER_SECONDS = 60.0
# Each library's own name and default for the largest request (record batch) a producer sends.
SIZE_LIMIT = {"kafka-python": ("max_request_size", 1_048_576), "confluent-kafka": ("message.max.bytes", 1_000_000)}
PRODUCER_DEFAULTS: dict[str, dict[str, Any]] = {
    "kafka-python": {"max_block_ms": 1000, "request_timeout_ms": 10_000, "delivery_timeout_ms": 30_000},
    "confluent-kafka": {"message.timeout.ms": 30_000}}  # fmt: skip
"""A dead letter that cannot be delivered (its topic deleted, no broker) is counted as failed within 30 s, not
held for the libraries' 2 and 5 minutes, or for good (seen with kafka-python); kafka-python's send() waits at most
1 s for a topic's metadata, on the consumer thread (its default: 60 s per batch with a reject, after the topic was
deleted). ``kafka.client`` overrides them."""


class DeadLetters:
    """A producer for ``kafka.dead_letter_topic``, made (on first use) with the same client library and settings
    as the source."""

    def __init__(self, kafka: KafkaConfig, health: Health) -> None:
        assert kafka.dead_letter_topic is not None
        self.kafka = kafka
        self.topic = kafka.dead_letter_topic
        self.health = health
        name, default = SIZE_LIMIT[kafka.client_library]
        self.max_value_bytes = int(kafka.client.get(name, default)) - RECORD_OVERHEAD_BYTES
        self._producer: Any = None
        self._failed_at = -RETRY_PRODUCER_SECONDS
        self._log = RateLimitedLog(log)

    def _failed(self, reason: str, n: int, message: str, *args: object) -> None:
        self.health.dead_letter_failures.labels(reason).inc(n)
        self._log.warning(reason, "dropped %d dead letter(s): " + message, n, *args)

    def _make_producer(self) -> Any:
        if self.kafka.client_library == "confluent-kafka":
            from confluent_kafka import Producer

            # never the topic's creator: librdkafka's producers create a topic they do not find, by default
            return Producer({"bootstrap.servers": self.kafka.bootstrap_servers,
                             **PRODUCER_DEFAULTS["confluent-kafka"], **self.kafka.client,
                             "allow.auto.create.topics": False})  # fmt: skip
        from kafka import KafkaProducer

        from exporter.stream.kafka.kafka_python import no_topic_creation

        producer = KafkaProducer(bootstrap_servers=self.kafka.bootstrap_servers.split(","),
                                 **{**PRODUCER_DEFAULTS["kafka-python"], **self.kafka.client})  # fmt: skip
        no_topic_creation(producer._metadata)
        return producer

    def _ready(self) -> bool:
        if self._producer is None and time.monotonic() - self._failed_at >= RETRY_PRODUCER_SECONDS:
            try:
                self._producer = self._make_producer()
            except Exception as exc:
                self._failed_at = time.monotonic()
                self._failed("no_producer", 0, "cannot make the dead-letter producer (%s: %s); retrying in %.0fs",
                             type(exc).__name__, exc, RETRY_PRODUCER_SECONDS)  # fmt: skip
        return self._producer is not None

    def send(self, payloads: list[tuple[bytes | None, str]]) -> None:
        """Queue rejected messages (a tombstone as an empty value), each with its reject reason; never raises."""
        fitting = [(value or b"", reason) for value, reason in payloads if len(value or b"") <= self.max_value_bytes]
        if len(fitting) < len(payloads):
            self._failed("too_large", len(payloads) - len(fitting), "over the producer's size limit (%d bytes)",
                         self.max_value_bytes)  # fmt: skip
        if not fitting:
            return
        if not self._ready():
            self._failed("no_producer", len(fitting), "no dead-letter producer")
            return
        for i, (value, reason) in enumerate(fitting):
            try:
                self._produce(value, [("reason", reason.encode())])
            except Exception as exc:
                self._failed("send_failed", len(fitting) - i, "%s: %s", type(exc).__name__, exc)
                return

    def _produce(self, value: bytes, headers: list[tuple[str, bytes]]) -> None:
        if self.kafka.client_library == "confluent-kafka":
            self._producer.produce(self.topic, value=value, headers=headers, on_delivery=self._delivered)
            self._producer.poll(0)
        else:
            future = self._producer.send(self.topic, value=value, headers=headers)
            future.add_callback(lambda _: self.health.dead_lettered.inc())
            future.add_errback(lambda exc: self._failed("send_failed", 1, "%s", exc))

    def _delivered(self, error: object, _message: object) -> None:
        if error is None:
            self.health.dead_lettered.inc()
        else:
            self._failed("send_failed", 1, "%s", error)

    def serve(self) -> None:
        """Run the delivery callbacks confluent-kafka holds until asked (kafka-python runs its own): a scheduled job,
        so that a delivery or its failure is counted when it happens, not at the next batch with a reject."""
        if self._producer is not None and self.kafka.client_library == "confluent-kafka":
            self._producer.poll(0)

    def close(self) -> None:
        """Deliver what is queued (up to 5 s) and close."""
        if self._producer is None:
            return
        if self.kafka.client_library == "confluent-kafka":
            self._producer.flush(5)
        else:
            self._producer.close(timeout=5)
