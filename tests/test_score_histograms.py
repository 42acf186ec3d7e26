"""Per-subgroup score histograms for a model that emits scores: exact bucket counts, sums and counts on /metrics,
windowed like the counts, checkpointed, and part of the layout a checkpoint must match."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import orjson
import pytest
from daemon_config import event, make_config
from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families

from exporter.config import ConfigError, layout
from exporter.daemon import Daemon

T0 = 1_800_000_000.0
BUCKETS = [0.25, 0.5, 0.75]
# (gender, age, score): male scores 0.1, 0.25 (on a bound: le is inclusive), 0.6, 0.9; female 0.3, 0.5, 0.5;
# one event with no gender (gender's unknown category: only in gender's "overall").
ROWS = [("male", "young", 0.1), ("male", "old", 0.25), ("male", "young", 0.6), ("male", "old", 0.9),
        ("female", "young", 0.3), ("female", "old", 0.5), ("female", "old", 0.5), ("robot", "young", 1.0)]


class Clock:
    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> float:
        return self.now


class Record:
    def __init__(self, value: bytes, offset: int) -> None:
        self.value, self.offset = value, offset


def scored(rows: list[tuple[str, str, float]], ts: float = T0 - 60) -> list[Record]:
    events = [event(g, a, ts=ts, score=s, prediction=None, prediction_id=f"p{i}") for i, (g, a, s) in enumerate(rows)]
    return [Record(orjson.dumps(e), i) for i, e in enumerate(events)]


@pytest.fixture
def make_daemon() -> Callable[..., Daemon]:
    def make(**overrides: object) -> Daemon:
        config = make_config(events={"score_threshold": 0.5, "score_buckets": BUCKETS}, **overrides)
        daemon = Daemon(config, registry=CollectorRegistry(), clock=Clock())
        daemon.checkpointer.restore()
        return daemon

    return make


def histogram(daemon: Daemon, attribute: str, subgroup: str, window: str = "1h") -> dict[str, float]:
    """The model_prediction_score samples of one subgroup, keyed by le (and _sum, _count), from the page."""
    daemon.computer.compute()
    out = {}
    for family in text_string_to_metric_families(daemon.metrics_page()):
        for s in family.samples:
            labels = dict(s.labels)
            if not s.name.startswith("model_prediction_score") or labels.get("subgroup") != subgroup:
                continue
            if labels["attribute"] == attribute and labels["window"] == window and labels["model_id"] == "m1":
                out[labels.get("le", s.name.removeprefix("model_prediction_score"))] = s.value
    return out


def test_a_fixed_batch_gives_exact_buckets_sums_and_counts(make_daemon) -> None:
    d = make_daemon()
    d.ingest.handle("predictions", 0, scored(ROWS))
    assert histogram(d, "gender", "male") == {"0.25": 2, "0.5": 2, "0.75": 3, "+Inf": 4, "_sum": 1.85, "_count": 4}
    assert histogram(d, "gender", "female") == {"0.25": 0, "0.5": 3, "0.75": 3, "+Inf": 3, "_sum": 1.3,
                                                "_count": 3}  # fmt: skip
    # overall: every prediction, the one outside gender's groups too
    assert histogram(d, "gender", "overall") == {"0.25": 2, "0.5": 5, "0.75": 6, "+Inf": 8,
                                                 "_sum": pytest.approx(4.15), "_count": 8}  # fmt: skip
    assert histogram(d, "age", "old") == {"0.25": 1, "0.5": 3, "0.75": 3, "+Inf": 4, "_sum": 2.15, "_count": 4}
    # the counts agree with the window's samples
    assert histogram(d, "gender", "male", "24h")["_count"] == 4


def test_histograms_slide_with_the_window(make_daemon) -> None:
    d = make_daemon()
    d.ingest.handle("predictions", 0, scored(ROWS[:4], ts=T0 - 2 * 3600))  # in 24h, not in 1h
    d.ingest.handle("predictions", 0, scored(ROWS[4:5]))
    assert histogram(d, "gender", "male", "1h")["_count"] == 0
    assert histogram(d, "gender", "male", "24h")["_count"] == 4
    assert histogram(d, "gender", "female", "1h") == {"0.25": 0, "0.5": 1, "0.75": 1, "+Inf": 1, "_sum": 0.3,
                                                      "_count": 1}  # fmt: skip


def test_histograms_survive_a_checkpoint_and_their_bounds_are_part_of_the_layout(make_daemon, tmp_path: Path,
                                                                                 caplog) -> None:  # fmt: skip
    cp = {"path": str(tmp_path / "state")}
    d1 = make_daemon(checkpoint=cp)
    d1.ingest.handle("predictions", 0, scored(ROWS))
    d1.checkpointer.write()
    d2 = make_daemon(checkpoint=cp)
    assert histogram(d2, "gender", "male") == histogram(d1, "gender", "male")
    other = Daemon(make_config(checkpoint=cp, events={"score_threshold": 0.5, "score_buckets": [0.5]}),
                   registry=CollectorRegistry(), clock=Clock())
    other.checkpointer.restore()
    assert "m1 (score_buckets: was" in caplog.text and "their previous state is kept in" in caplog.text
    assert histogram(other, "gender", "male")["_count"] == 0


def test_no_scores_no_histograms_and_bad_buckets_are_refused() -> None:
    d = Daemon(make_config(), registry=CollectorRegistry(), clock=Clock())
    d.computer.compute()
    assert "model_prediction_score" not in d.metrics_page()
    assert "score_buckets" not in layout(make_config().model(), make_config().windowing)
    with pytest.raises(ConfigError, match=r"events.score_buckets: \[0.5, 0.2\] is not a list of increasing"):
        make_config(events={"score_threshold": 0.5, "score_buckets": [0.5, 0.2]})
    with pytest.raises(ConfigError, match=r"events\.score_buckets: needs events\.score_threshold"):
        make_config(events={"score_buckets": [0.5]})
