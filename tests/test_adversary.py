"""What else breaks (issue 24 item 6), each case as docs/faults.md lists it: config files in the encodings editors
save, a dead-letter topic deleted while the daemon runs, a checkpoint volume that fills up, and wall-clock jumps.
(A topic whose partition count changes: tests/test_log_resets.py.)"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from broker_fixture import produce
from daemon_config import make_config
from daemon_fixture import consumed, kafka_config, payloads, sample, scrape, synthetic_rows, wait_for
from prometheus_client import CollectorRegistry
from test_labels_and_checkpoint import predictions, records, value
from tooling import tmpfs

from exporter.cli import main
from exporter.config import ConfigError, load_config
from exporter.daemon import Daemon
from exporter.devtools.embedded_broker import EmbeddedBroker
from exporter.stream.state.clock import TRUST_SECONDS, SteadyClock

CONFIG = ('model_id: m1\r\nprotected_attributes:\r\n  - name: region\r\n    groups: ["Zürich", "Genève"]\r\n'
          'kafka: {bootstrap_servers: "127.0.0.1:1", topic: t}\r\n')  # fmt: skip


@pytest.mark.parametrize("encoding", ["utf-8", "utf-8-sig", "utf-16", "utf-32", "utf-8 LF"])
def test_a_config_saved_with_a_byte_order_mark_crlf_or_in_utf_16_reads_as_in_utf_8(
    tmp_path: Path, encoding: str
) -> None:
    """Before: UTF-16 and UTF-32 (Windows editors' "Unicode") stopped the daemon with a UnicodeDecodeError
    traceback."""
    path = tmp_path / "config.yaml"
    text = CONFIG.replace("\r\n", "\n") if encoding == "utf-8 LF" else CONFIG
    path.write_bytes(text.encode(encoding.split()[0]))
    (model,) = load_config(path).models
    assert model.attributes[0].groups == ("Zürich", "Genève")


def test_a_latin_1_config_is_refused_in_one_line_naming_the_byte_and_its_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Before: a UnicodeDecodeError traceback. Not guessed: read as anything else, "Zürich" would be a group no
    event carries."""
    path = tmp_path / "config.yaml"
    path.write_bytes(CONFIG.encode("latin-1"))
    with pytest.raises(ConfigError, match=r"not UTF-8: byte 0xfc at line 4 \(Latin-1 and Windows-1252 are not "
                                          r"guessed\); save the file as UTF-8"):  # fmt: skip
        load_config(path)
    log = tmp_path / "audit-log.jsonl"  # the gate logs the refused run too: not in the working directory
    assert main(["audit", str(path), str(tmp_path / "predictions.csv"), "--audit-log", str(log)]) == 2
    assert capsys.readouterr().err.strip().count("\n") == 0
    path.write_bytes(CONFIG.encode("utf-16-le"))  # no byte-order mark
    with pytest.raises(ConfigError, match="it looks like UTF-16 without a byte-order mark"):
        load_config(path)


def dead_letters(port: int) -> tuple[float, float]:
    """(dead letters delivered, dead letters counted as failed)."""
    s = scrape(port)
    failed = sum(sample(s, "fairness_exporter_dead_letters_failed_total", reason=r) or 0
                 for r in ("too_large", "no_producer", "send_failed"))  # fmt: skip
    return sample(s, "fairness_exporter_events_dead_lettered_total") or 0, failed


def rejects_then_events(broker: EmbeddedBroker, topic: str, rounds: int, daemon: Daemon, seed: int) -> None:
    """Batches of one malformed event and five valid ones; the stream must read on after each."""
    for i in range(rounds):
        before = consumed(daemon.port)
        produce(broker.bootstrap_servers, topic, [b"{not json", *payloads(synthetic_rows(5, seed=seed + i),
                                                                          time.time())], 0)  # fmt: skip
        wait_for(lambda before=before: consumed(daemon.port) >= before + 6, timeout=30,
                 what="the stream read on while dead letters cannot be sent")  # fmt: skip


def test_a_dead_letter_topic_deleted_while_the_daemon_runs_counts_each_dead_letter_once(
    kafka_broker: EmbeddedBroker, topic: str, running: Callable[..., Daemon], client_library: str
) -> None:
    """Each rejected event is counted once as dead-lettered or as failed, and none holds up the stream. Before:
    confluent-kafka counted a delivery only when the next reject was sent (its callbacks ran in produce calls), so
    the last one was never counted. (Tansu acknowledges records sent to a deleted topic: here they count as
    dead-lettered; a Kafka broker refuses them, and they count as failed within 30 s.)"""
    dead = f"{topic}-dlq"
    kafka_broker.create_topic(dead, partitions=1)
    daemon = running(kafka_broker.bootstrap_servers, topic, kafka={
        **kafka_config(kafka_broker.bootstrap_servers, topic, client_library)["kafka"], "dead_letter_topic": dead})
    rejects_then_events(kafka_broker, topic, 1, daemon, seed=1)
    wait_for(lambda: dead_letters(daemon.port) == (1, 0), what="the first dead letter delivered and counted")
    kafka_broker.delete_topic(dead)
    rejects_then_events(kafka_broker, topic, 3, daemon, seed=2)
    wait_for(lambda: sum(dead_letters(daemon.port)) == 4, timeout=60, what="each dead letter counted once")
    assert sample(scrape(daemon.port), "fairness_exporter_events_rejected_total", reason="malformed_json") == 4


@pytest.fixture
def small_volume(tmp_path: Path) -> Iterator[Path]:
    """A 64 KiB tmpfs (a checkpoint of the test config takes more), unmounted afterwards."""
    with tmpfs(tmp_path, "64k") as mountpoint:
        yield mountpoint


def test_a_checkpoint_volume_that_fills_up_keeps_the_last_checkpoint_and_commits_nothing_newer(
    small_volume: Path,
) -> None:
    """ENOSPC on a real file system: counted, no temp file left, the offsets stay at the last durable checkpoint;
    once the volume has room again, the next checkpoint covers everything counted."""
    daemon = Daemon(make_config(checkpoint={"path": str(small_volume)}), registry=CollectorRegistry())
    daemon.ingest.handle("predictions", 0, records(predictions(1, 2, "male", "a")))
    daemon.checkpointer.flush()  # does not fit in 64 KiB
    assert value(daemon, "fairness_exporter_checkpoint_failures_total") == 1
    assert list(small_volume.iterdir()) == []  # the partial temp file was removed: the volume is free again
    assert daemon.checkpointer.committable() == {}
    subprocess.run(["mount", "-o", "remount,size=8m", str(small_volume)], check=True)  # room again
    daemon.ingest.handle("predictions", 0, records(predictions(1, 2, "male", "b"), start=2))
    daemon.checkpointer.flush()
    assert value(daemon, "fairness_exporter_checkpoint_failures_total") == 1
    assert daemon.checkpointer.committable() == {("predictions", 0): 4}
    assert [p.name for p in small_volume.iterdir()] == ["fleet.checkpoint.npz"]


class Clocks:
    """A wall clock and a steady one, moved by hand."""

    def __init__(self) -> None:
        self.wall, self.steady = 1_800_000_000.0, 5_000.0

    def advance(self, seconds: float) -> None:
        self.wall += seconds
        self.steady += seconds


def test_the_steady_clock_follows_the_wall_clock_but_for_its_jumps_unless_they_last() -> None:
    t, jumps = Clocks(), []
    clock = SteadyClock(jumps.append, wall=lambda: t.wall, steady=lambda: t.steady)
    t.advance(5)
    t.wall += 0.5  # a small adjustment is followed
    assert clock() == t.wall
    t.wall -= 3600  # stepped back an hour
    assert clock() == t.wall + 3600
    t.advance(60)
    assert clock() == t.wall + 3600 and jumps == [-3600]
    t.wall += 3600  # set right again
    assert clock() == t.wall
    t.wall += 86_400  # a day ahead, and it stays there: a correction after TRUST_SECONDS
    assert clock() == t.wall - 86_400
    t.advance(TRUST_SECONDS - 1)
    assert clock() == t.wall - 86_400
    t.advance(1)
    assert clock() == t.wall and jumps == [-3600, 86_400]


@pytest.mark.parametrize("step", [-3600, 2 * 86_400], ids=["an hour back", "two days ahead"])
def test_events_of_now_are_counted_when_the_wall_clock_jumps(monkeypatch: pytest.MonkeyPatch, step: int) -> None:
    """Before: stepped back an hour, every event was rejected as from the future; stepped two days ahead, every
    event was late (and the windows emptied)."""
    daemon = Daemon(make_config(), registry=CollectorRegistry())  # the daemon's own clock
    now = time.time()
    monkeypatch.setattr(time, "time", lambda: now + step)
    events = [{**e, "timestamp": now} for e in predictions(3, 10, "male", "p")]
    daemon.ingest.handle("predictions", 0, records(events))
    assert value(daemon, "fairness_exporter_events_rejected_total", reason="future_timestamp") == 0
    assert value(daemon, "fairness_exporter_events_late_total") == 0
    assert value(daemon, "model_subgroup_samples", attribute="gender", subgroup="overall", window="1h") == 10
    assert value(daemon, "fairness_exporter_clock_jumps_total") == 1
