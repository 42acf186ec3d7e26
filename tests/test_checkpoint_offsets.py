"""A checkpoint whose stored offset no Kafka offset can be (beyond a signed 64-bit integer).

docs/faults.md refuses at start "A checkpoint that points where no record is": a negative offset stops the start in
one line, because it "made the consumer retry `Offset must be int >= 0` forever while `/healthz` answered 200". An
offset of 2**63 or more is just as impossible (Kafka offsets are int64); it passed the checkpoint's checks (found
by review 16), and the daemon then retried forever exactly as the negative one did.
"""

from __future__ import annotations

import time
from pathlib import Path

from broker_fixture import produce
from daemon_config import make_config
from daemon_fixture import kafka_config, payloads, probe, sample, scrape, synthetic_rows
from prometheus_client import CollectorRegistry

from exporter.daemon import Daemon
from exporter.stream.state.checkpoint import CheckpointError

INT64_MAX = 2**63 - 1


def test_a_checkpointed_offset_beyond_int64_is_refused_at_start_not_retried_forever(
    kafka_broker, topic: str, tmp_path: Path, client_library: str, daemons: list[Daemon]
) -> None:
    """Claim (docs/faults.md, start-up table): "A checkpoint that points where no record is: a stored offset or
    partition below 0 ..." is refused before the daemon reads an event, `FILE: unusable checkpoint (offsets: ...);
    move it away to start with an empty window`, exit 2; the rule: a monitor says ready only while it reads.

    A checkpoint whose offset for events[0] is 2**63 (one past the largest Kafka offset: a hand-edited or damaged
    file, a tool that wrote an unsigned or a sentinel value) passes `_check_meta` (it checks only `>= 0`). The daemon
    starts and the source rebuilds its consumer forever: kafka-python fails every fetch with `error: int too large
    to convert` (after 25 s: 0 of 30 events consumed on any partition, the two good ones included, 25 consumer
    errors, `/readyz` blaming the broker, "no Kafka broker answers"); confluent-kafka fails its assignment (0 of 30,
    `/readyz` "waiting for Kafka partitions"). `/healthz` answers 200 on both, so the pod is never restarted and
    nobody is told which file to move away: a production user sees a Kafka outage that is not one.
    """
    bootstrap = kafka_broker.bootstrap_servers
    config = make_config(**kafka_config(bootstrap, topic, client_library), checkpoint={"path": str(tmp_path)})
    for partition in range(3):
        produce(bootstrap, topic, payloads(synthetic_rows(10, seed=partition), time.time()), partition)
    writer = Daemon(config, registry=CollectorRegistry())  # a checkpoint as the daemon writes it, then damaged
    with writer.fleet.lock:
        writer.fleet.offsets = {(topic, 0): INT64_MAX + 1, (topic, 1): 0, (topic, 2): 0}
    writer.checkpointer.write()

    daemon = Daemon(config, registry=CollectorRegistry())
    try:
        daemon.start()
    except CheckpointError as exc:  # what the claim says: one line, before a single event is read
        assert "unusable checkpoint" in str(exc) and "move it away" in str(exc)
        return
    daemons.append(daemon)
    time.sleep(25)  # a manual assignment reads all three partitions within seconds on this broker
    samples = scrape(daemon.port)
    consumed = sample(samples, "fairness_exporter_events_consumed_total")
    errors = sample(samples, "fairness_exporter_consumer_errors_total")
    readyz, healthz = probe(daemon.port, "/readyz"), probe(daemon.port, "/healthz")
    raise AssertionError(f"a checkpointed offset of 2**63 was not refused at start: after 25 s, {consumed:.0f} of "
                         f"30 events consumed, {errors:.0f} consumer errors, /readyz {readyz}, /healthz {healthz}")
