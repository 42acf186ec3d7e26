"""Forward rejected events to the dead-letter topic, with a ``reason`` header, through the configured client.

The producer takes the producer's keys of ``kafka.client`` only (the staged path's producer's rule,
:func:`~exporter.stream.kafka.internal_producer.producer_config`), and is made when the daemon starts: settings it
refuses stop the start in one line (exit 2), rather than every dead letter being dropped later; only a broker that
does not answer yet (kafka-python's producer asks one at once) leaves it to be made at a later dead letter.

Sending never raises into the ingest: an event is counted (as rejected) exactly once whatever happens to its dead
letter. A dead letter that cannot be sent (too large for the producer, no producer while no broker answers, a
delivery that fails) is counted by reason in ``fairness_exporter_dead_letters_failed_total``, logged, and dropped.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from exporter.config import ConfigError, KafkaConfig
from exporter.health.counters import Health
from exporter.health.logs import RateLimitedLog
from exporter.stream.kafka.internal_producer import producer_config

log = logging.getLogger(__name__)

RECORD_OVERHEAD_BYTES = 512
"""Room left for the record's key, header and batch framing under the producer's size limit."""
RETRY_PRODUCER_SECONDS = 60.0
# Each library's own name and default for the largest request (record batch) a producer sends.
SIZE_LIMIT = {"kafka-python": ("max_request_size", 1_048_576), "confluent-kafka": ("message.max.bytes", 1_000_000)}
PRODUCER_DEFAULTS: dict[str, dict[str, Any]] = {
    "kafka-python": {"max_block_ms": 1000, "request_timeout_ms": 10_000, "delivery_timeout_ms": 30_000,
                     "bootstrap_timeout_ms": 5000},
    "confluent-kafka": {"message.timeout.ms": 30_000}}  # fmt: skip
"""A dead letter that cannot be delivered (its topic deleted, no broker) is counted as failed within 30 s, not
held for the libraries' 2 and 5 minutes, or for good (seen with kafka-python); kafka-python's send() waits at most
1 s for a topic's metadata, on the consumer thread (its default: 60 s per batch with a reject, after the topic was
deleted), and its producer waits at most 5 s for a broker when it is made (its default: 30 s). ``kafka.client``
overrides them."""


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
        library = self.kafka.client_library
        if library == "confluent-kafka":
            from confluent_kafka import Producer

            # never the topic's creator: librdkafka's producers create a topic they do not find, by default
            return Producer(producer_config(self.kafka, PRODUCER_DEFAULTS[library],
                                            {"allow.auto.create.topics": False}))  # fmt: skip
        from kafka import KafkaProducer

        from exporter.stream.kafka.kafka_python import no_topic_creation

        producer = KafkaProducer(**producer_config(self.kafka, PRODUCER_DEFAULTS[library], {}))
        no_topic_creation(producer._metadata)
        return producer

    def _unreachable(self, exc: Exception) -> bool:
        """The producer could not be made because no broker answered (kafka-python asks one as it is made;
        librdkafka's never does): not its settings' fault."""
        if self.kafka.client_library == "confluent-kafka":
            return False
        from kafka.errors import KafkaConnectionError, RetriableError

        return isinstance(exc, RetriableError | KafkaConnectionError)  # "Unable to bootstrap" is a KafkaTimeoutError

    def start(self, source: str) -> None:
        """Make the producer (the daemon's start): settings it refuses are a ConfigError naming ``kafka.client`` in
        the config file ``source``; a broker that does not answer yet leaves it to the next dead letter."""
        try:
            self._producer = self._make_producer()
        except Exception as exc:
            if not self._unreachable(exc):
                raise ConfigError(f"{source}: kafka.client: the dead-letter producer of kafka.dead_letter_topic "
                                  f"cannot be made with these settings ({type(exc).__name__}: {exc})") from exc
            self._failed_at = time.monotonic()
            self._log.warning("no_producer", "the dead-letter producer cannot reach a broker yet (%s: %s); it is "
                              "made again at a dead letter %.0fs from now", type(exc).__name__, exc,
                              RETRY_PRODUCER_SECONDS)  # fmt: skip

    def _ready(self) -> bool:
        if self._producer is None and time.monotonic() - self._failed_at >= RETRY_PRODUCER_SECONDS:
            try:
                self._producer = self._make_producer()
            except Exception as exc:
                self._failed_at = time.monotonic()
                self._log.warning("no_producer", "cannot make the dead-letter producer (%s: %s); trying again at a "
                                  "dead letter %.0fs from now", type(exc).__name__, exc,
                                  RETRY_PRODUCER_SECONDS)  # fmt: skip
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
            self._failed("no_producer", len(fitting), "no dead-letter producer (it could not be made: see above)")
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
