"""Forward rejected events to the dead-letter topic, with a ``reason`` header, through the configured client."""

from __future__ import annotations

from exporter.config import KafkaConfig


class DeadLetters:
    """A producer for ``kafka.dead_letter_topic``, made with the same client library (and settings) as the source."""

    def __init__(self, kafka: KafkaConfig) -> None:
        assert kafka.dead_letter_topic is not None
        self.topic = kafka.dead_letter_topic
        if kafka.client_library == "confluent-kafka":
            from confluent_kafka import Producer

            self._confluent = Producer({"bootstrap.servers": kafka.bootstrap_servers, **kafka.client})
            self._kafka = None
        else:
            from kafka import KafkaProducer

            self._confluent = None
            self._kafka = KafkaProducer(bootstrap_servers=kafka.bootstrap_servers.split(","), **kafka.client)

    def send(self, value: bytes | None, reason: str) -> None:
        """Queue one rejected message (an empty value for a tombstone)."""
        headers = [("reason", reason.encode())]
        if self._confluent is not None:
            self._confluent.produce(self.topic, value=value or b"", headers=headers)
            self._confluent.poll(0)
        else:
            assert self._kafka is not None
            self._kafka.send(self.topic, value=value or b"", headers=headers)

    def close(self) -> None:
        """Deliver what is queued (up to 5 s) and close."""
        if self._confluent is not None:
            self._confluent.flush(5)
        elif self._kafka is not None:
            self._kafka.close(timeout=5)
