"""The calls a payload log's pair join remembers as done (exporter/stream/payloads/pairs.py ``PairJoin.done``): at
most ``max_pending`` of them, the oldest forgotten first, a refused call made the newest, those done a horizon ago
forgotten by ``expire``; and what remembering them does: the same id again is a duplicate, then a new call once
forgotten."""

from __future__ import annotations

from collections import Counter

from exporter.stream.payloads.pairs import PairJoin
from exporter.stream.payloads.platforms import Half


def _half(pair: str, response: bool) -> Half:
    return Half(pair, response, "m", 1.0, 1, {"x": [1]})


def _call(join: PairJoin, pair: str, now: float, counts: Counter[str]) -> int:
    """Both halves of a call; how many calls they completed."""
    return len(join.add_all([_half(pair, False), _half(pair, True)], now, counts))


def test_the_oldest_calls_are_forgotten_past_the_bound_and_a_refused_one_is_the_newest() -> None:
    join, counts = PairJoin(60.0, max_pending=3), Counter[str]()
    for k, pair in enumerate("abc"):
        assert _call(join, pair, 10.0 + k, counts) == 1
    join.refuse("m", "a", 13.0, counts)  # done already: now refused, and the newest
    assert list(join.done) == [("m", "b"), ("m", "c"), ("m", "a")]
    assert join.done[("m", "a")] == (13.0, True, "")
    assert _call(join, "d", 14.0, counts) == 1  # b, the oldest, is forgotten
    assert list(join.done) == [("m", "c"), ("m", "a"), ("m", "d")]
    assert _call(join, "c", 15.0, counts) == 0  # still remembered: both halves are duplicates
    assert counts["duplicate_delivery"] == 2
    assert _call(join, "b", 15.0, counts) == 1  # forgotten: a new call


def test_expiry_forgets_the_calls_done_a_horizon_ago_and_keeps_the_rest_in_order() -> None:
    join, counts = PairJoin(60.0), Counter[str]()
    for k, pair in enumerate("abcdef"):
        _call(join, pair, 100.0 + 10 * k, counts)
    join.refuse("m", "b", 175.0, counts)
    join.expire(100.0 + 60 + 25, counts)  # the cutoff is 125: a (100) and c (120) go, b was made the newest
    assert list(join.done) == [("m", "d"), ("m", "e"), ("m", "f"), ("m", "b")]
    join.expire(1_000.0, counts)
    assert join.done == {}
    assert _call(join, "a", 1_000.0, counts) == 1


def test_a_block_of_calls_past_the_bound_forgets_as_many_of_the_oldest_in_one_pass() -> None:
    join, counts = PairJoin(60.0, max_pending=1_000), Counter[str]()
    for k in range(5_000):
        _call(join, f"c{k}", float(k), counts)
    assert len(join.done) == 1_000
    assert next(iter(join.done)) == ("m", "c4000")
    assert list(join.done)[-1] == ("m", "c4999")
