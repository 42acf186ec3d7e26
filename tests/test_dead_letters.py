"""Dead letters on the real broker: the producer takes the producer's settings of ``kafka.client`` only, and one
that cannot be made stops the start in one line, rather than dropping every dead letter later."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import orjson
import pytest
import yaml
from broker_fixture import consume_all, produce
from daemon_config import event, make_config
from daemon_fixture import GROUP_CLIENT, consumed, kafka_config, sample, scrape, wait_for

from exporter.daemon import Daemon
from exporter.devtools.embedded_broker import EmbeddedBroker

EXIT_BAD_INPUT = 2


def test_dead_letters_arrive_when_kafka_client_holds_consumer_only_settings(
    kafka_broker: EmbeddedBroker, topic: str, running: Callable[..., Daemon], client_library: str
) -> None:
    """Before (kafka-python): KafkaProducer refused session_timeout_ms ("Unrecognized configs"), so every dead letter
    was dropped, with a WARNING every 60 s that read "dropped 0 dead letter(s)"."""
    now = time.time()
    bad = [b"{broken", orjson.dumps(event(prediction=7, ts=now))]
    produce(kafka_broker.bootstrap_servers, topic, [orjson.dumps(event(ts=now)), *bad])
    kafka_broker.create_topic(f"{topic}-dlq")  # the daemon never creates it
    settings = kafka_config(kafka_broker.bootstrap_servers, topic, client_library)["kafka"]
    daemon = running(kafka_broker.bootstrap_servers, topic, kafka={
        **settings, "client": GROUP_CLIENT[client_library], "dead_letter_topic": f"{topic}-dlq"})  # fmt: skip
    wait_for(lambda: consumed(daemon.port) == 3, what="3 events consumed")
    dead = consume_all(kafka_broker.bootstrap_servers, f"{topic}-dlq", 2)
    assert sorted((dict(r.headers)["reason"], r.value) for r in dead) == [
        (b"invalid_prediction", bad[1]), (b"malformed_json", b"{broken")]
    wait_for(lambda: sample(scrape(daemon.port), "fairness_exporter_events_dead_lettered_total") == 2,
             what="both deliveries counted")  # fmt: skip
    page = scrape(daemon.port)
    assert [sample(page, "fairness_exporter_dead_letters_failed_total", reason=r)
            for r in ("too_large", "no_producer", "send_failed")] == [0, 0, 0]  # fmt: skip


REFUSED = {
    "kafka-python": ({"api_version": "bogus"}, "(ValueError: invalid literal for int() with base 10: 'bogus')"),
    "confluent-kafka": ({"enable.idempotence": True, "acks": 1},
                        "`acks` must be set to `all` when `enable.idempotence` is true"),
}  # fmt: skip
"""Settings the consumer's checks accept and the library's producer refuses as it is made."""


def test_a_dead_letter_producer_that_cannot_be_made_stops_the_start_in_one_line(
    tmp_path: Path, client_library: str
) -> None:
    """Before: the daemon ran, and every dead letter was dropped (counted under no_producer). No broker is needed:
    neither library asks one before it refuses these."""
    client, expected = REFUSED[client_library]
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump({
        "model_id": "m1", "protected_attributes": [{"name": "gender", "groups": ["male", "female"]}],
        "kafka": {"bootstrap_servers": "127.0.0.1:1", "client_library": client_library, "client": client,
                  "dead_letter_topic": "dlq"},
        "listen": {"address": "127.0.0.1", "port": 0}}))  # fmt: skip
    result = subprocess.run([sys.executable, "-m", "exporter.cli", "serve", "--config", str(config)],
                            capture_output=True, text=True, timeout=60)  # fmt: skip
    assert result.returncode == EXIT_BAD_INPUT, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in result.stderr, result.stderr
    assert lines[0].startswith(f"fairness-exporter serve: {config}: kafka.client: the dead-letter producer of "
                               "kafka.dead_letter_topic cannot be made with these settings (")  # fmt: skip
    assert expected in lines[0]


def test_no_broker_at_start_is_no_refusal_and_drops_nothing_in_silence(
    client_library: str, caplog: pytest.LogCaptureFixture
) -> None:
    """The case the refusal must not take: a broker that does not answer yet. The daemon starts; kafka-python's
    producer (which asks a broker as it is made) is made again later, and the log says so without "dropped 0"."""
    settings = kafka_config("127.0.0.1:1", "events", client_library)
    settings["kafka"]["dead_letter_topic"] = "dlq"
    daemon = Daemon(make_config(**settings, listen={"address": "127.0.0.1", "port": 0}))
    try:
        daemon.start()
        assert daemon.healthy() == (True, "consumer and scheduler running")
        if client_library == "kafka-python":  # no producer yet: a dead letter now is dropped, counted and said
            assert daemon.ingest.dead_letters is not None
            daemon.ingest.dead_letters.send([(b"{broken", "malformed_json")])
            assert daemon.registry.get_sample_value("fairness_exporter_dead_letters_failed_total",
                                                    {"reason": "no_producer"}) == 1  # fmt: skip
    finally:
        daemon.stop()
    lines = [r.getMessage() for r in caplog.records if r.name == "exporter.stream.kafka.dead_letters"]
    assert lines == ([] if client_library == "confluent-kafka" else [
        "the dead-letter producer cannot reach a broker yet (KafkaTimeoutError: KafkaTimeoutError: Unable to bootstrap "
        "from ['127.0.0.1:1']); it is made again at a dead letter 60s from now",
        "dropped 1 dead letter(s): no dead-letter producer (it could not be made: see above)"])
