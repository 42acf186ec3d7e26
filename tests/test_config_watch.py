"""The daemon's watch of its config's files (``--config.watch-interval``), its scheduled checks made by hand: a file
caught half written is reloaded once whole, without a refusal; a file that stays invalid is refused once per version;
a reload asked for (SIGHUP, POST /-/reload) does not wait for a check."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client import CollectorRegistry

from exporter.config import Config, ConfigError, load_config
from exporter.daemon import Daemon

GENDER = {"name": "gender", "groups": ["male", "female"]}


def raw(models: list[str]) -> dict[str, Any]:
    return {"kafka": {"bootstrap_servers": "127.0.0.1:1", "topic": "predictions"},
            "listen": {"address": "127.0.0.1", "port": 0}, "windows": ["1h"], "protected_attributes": [GENDER],
            "models": [{"model_id": m} for m in models]}  # fmt: skip


class Watched:
    """A daemon (not started: no broker, no port) of the config at ``path``, counting the loads of its reloads."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.loads = 0
        path.write_text(yaml.safe_dump(raw(["a"])))
        self.daemon = Daemon(load_config(path), registry=CollectorRegistry(), loader=self.load)
        self.daemon.watch.mark()  # what start() does before it schedules the checks

    def load(self) -> Config:
        self.loads += 1
        return load_config(self.path)

    def checks(self, n: int) -> None:
        for _ in range(n):
            self.daemon.watch.check()

    def health(self) -> tuple[float | None, float | None]:
        """(reload failures, whether the last reload succeeded)."""
        get = self.daemon.registry.get_sample_value
        return (get("fairness_exporter_config_reload_failures_total"),
                get("fairness_exporter_config_last_reload_successful"))  # fmt: skip


@pytest.fixture
def watched(tmp_path: Path) -> Watched:
    return Watched(tmp_path / "config.yaml")


def test_a_config_caught_half_written_is_reloaded_once_whole_without_a_refusal(watched: Watched) -> None:
    """Before: the check that caught the file half written reloaded it, refused it (a reload failure, and
    last_reload_successful 0 until the next check) and then reloaded it whole."""
    whole = yaml.safe_dump(raw(["a", "b"]))
    watched.path.write_text(whole[: len(whole) // 2])  # an editor saving in place, caught by a check
    with pytest.raises(ConfigError):
        load_config(watched.path)  # the version the check saw would be refused
    watched.checks(1)
    watched.path.write_text(whole)  # whole before the next check
    watched.checks(1)
    assert (watched.loads, watched.daemon.config.model_ids) == (0, ("a",))  # changed since the last check: waits
    watched.checks(3)  # unchanged for one check: reloaded, once
    assert (watched.loads, watched.daemon.config.model_ids) == (1, ("a", "b"))
    assert watched.health() == (0, 1)


def test_an_invalid_config_left_in_place_is_refused_once_per_version(watched: Watched) -> None:
    running = watched.daemon.config
    watched.path.write_text("models: [{model_id: broken}]\n")
    watched.checks(6)
    assert (watched.loads, watched.health()) == (1, (1, 0))  # refused once, not at every check
    assert watched.daemon.config is running
    watched.path.write_text("models: [{model_id: broken, protected_attributes: 7}]\n")  # another bad version
    watched.checks(6)
    assert (watched.loads, watched.health()) == (2, (2, 0))
    watched.path.write_text(yaml.safe_dump(raw(["a", "b"])))
    watched.checks(2)
    assert (watched.loads, watched.health(), watched.daemon.config.model_ids) == (3, (2, 1), ("a", "b"))


def test_a_reload_asked_for_applies_at_once_and_the_checks_do_not_reload_it_again(watched: Watched) -> None:
    """SIGHUP and POST /-/reload call reload(): no check is waited for, even with a change a check has seen."""
    watched.path.write_text(yaml.safe_dump(raw(["a", "b"])))
    watched.checks(1)  # seen, not yet reloaded
    assert watched.daemon.reload()[0]
    assert (watched.loads, watched.daemon.config.model_ids) == (1, ("a", "b"))
    watched.checks(3)
    assert (watched.loads, watched.health()) == (1, (0, 1))


def test_a_rewrite_that_keeps_the_size_and_the_times_is_reloaded(watched: Watched) -> None:
    """A copy that sets the old times (``cp -p``, ``rsync -t``), or a rewrite within the file system's time
    granularity, of the same size: before, the watch compared times, size and inode only, and never reloaded it."""
    before = watched.path.stat()
    text = watched.path.read_text()
    same_size = text.replace("model_id: a", "model_id: b")
    assert len(same_size) == len(text) and same_size != text
    with watched.path.open("r+") as f:  # in place: the same inode
        f.write(same_size)
    os.utime(watched.path, ns=(before.st_atime_ns, before.st_mtime_ns))
    after = watched.path.stat()
    assert (after.st_size, after.st_mtime_ns, after.st_ino) == (before.st_size, before.st_mtime_ns, before.st_ino)
    watched.checks(2)
    assert (watched.loads, watched.daemon.config.model_ids) == (1, ("b",))
    assert watched.health() == (0, 1)
