"""A Seldon block whose halves are all new is held (exporter/stream/payloads/pairs.py ``PairJoin.held``) until a block
of their partners in the same order completes it, or anything else puts its halves among those waiting: whatever
comes between (blocks of other calls, the same calls again or in another order, the pending bound at its limit,
halves read one by one, refusals, expiries, a checkpoint and its restore, the pending count read), every poll counts
what the same records read as Halves count, with the same join state."""

from __future__ import annotations

import random
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from test_payload_blocks import Path_, _calls, _records, _spec, between_polls

from exporter.stream.payloads import seldon_batch
from exporter.stream.payloads.pairs import PairJoin
from exporter.stream.payloads.payload import Raw

INPUTS, OUTPUTS = "seldon.ns.model.m.inputs", "seldon.ns.model.m.outputs"
T0 = 1_800_000_000.0


@pytest.fixture(autouse=True)
def _small_polls_batched(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(seldon_batch, "FEWEST", 1)


def _batches(rng: random.Random, tmp_path: Path, n: int) -> list[tuple[list[Raw], list[Raw]]]:
    """n batches of calls: each batch's requests and its responses, in the same order (the platform's code run
    once for them all)."""
    calls = [_calls(rng, rng.randint(2, 9), rng.choice([1, 2, 3])) for _ in range(n)]
    records = _records([c for batch in calls for c in batch], tmp_path)
    return [tuple([r for c in batch for t, r in records[c["id"]] if t == topic]  # type: ignore[misc]
                  for topic in (INPUTS, OUTPUTS)) for batch in calls]  # fmt: skip


def _polls(rng: random.Random, batches: list[tuple[list[Raw], list[Raw]]]) -> list[list[tuple[str, list[Raw]]]]:
    """The batches as polls of many arrangements: a block and its partners in one poll either way round, several
    blocks before their partners, partners a poll later, shuffled, delivered twice, overlapping another batch."""
    polls: list[list[tuple[str, list[Raw]]]] = []
    later: list[tuple[str, list[Raw]]] = []
    k = 0
    while k < len(batches):
        (ins, outs), plan = batches[k], rng.choice(["pair", "reversed", "grouped", "split", "shuffled", "twice",
                                                    "overlap"])  # fmt: skip
        poll = later
        later = []
        if plan == "pair":
            poll += [(INPUTS, ins), (OUTPUTS, outs)]
        elif plan == "reversed":
            poll += [(OUTPUTS, outs), (INPUTS, ins)]
        elif plan == "grouped" and k + 1 < len(batches):
            (ins2, outs2), k = batches[k + 1], k + 1
            poll += [(INPUTS, ins), (INPUTS, ins2), (OUTPUTS, outs), (OUTPUTS, outs2)]
        elif plan == "split":
            poll += [(INPUTS, ins)]
            later = [(OUTPUTS, outs)]
        elif plan == "shuffled" and k + 1 < len(batches):  # two held, then a few partners of the second
            (ins2, outs2), k = batches[k + 1], k + 1
            cut = rng.randint(1, len(outs2) - 1)
            poll += [(INPUTS, ins), (INPUTS, ins2), (OUTPUTS, rng.sample(outs2[:cut], cut))]
            later = [(OUTPUTS, outs2[cut:]), (OUTPUTS, outs)]
        elif plan == "twice":
            poll += [(INPUTS, ins), (INPUTS, ins), (OUTPUTS, outs), (OUTPUTS, outs)]
        else:  # a block of half these calls' partners and half another batch's requests
            other = batches[rng.randrange(len(batches))][0]
            poll += [(INPUTS, ins), (OUTPUTS, outs[: len(outs) // 2]), (INPUTS, other[: len(other) // 2]),
                     (OUTPUTS, outs[len(outs) // 2 :])]  # fmt: skip
        polls.append(poll)
        k += 1
    if later:
        polls.append(later)
    return polls


@pytest.mark.parametrize("seed", range(8))
def test_blocks_held_for_their_partners_count_alike_in_every_arrangement(
        tmp_path: Path, seed: int, monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    rng = random.Random(seed)
    met = Counter[bool]()
    own_met = PairJoin._met

    def counted(self: PairJoin, *args: Any) -> Any:
        found = own_met(self, *args)
        met[found is not None] += 1
        return found

    monkeypatch.setattr(PairJoin, "_met", counted)
    spec = _spec(segments=seed % 2 == 0)
    paths = [Path_(True, spec), Path_(False, spec)]
    most = 10_000 if seed % 4 < 2 else 12  # the pending bound at its limit: blocks that do not fit, calls forgotten
    for p in paths:
        p.join = PairJoin(60.0, most)
    now = T0
    for poll in _polls(rng, _batches(rng, tmp_path, 14)):
        found = [p.poll(poll, now) for p in paths]
        assert found[0] == found[1]
        if rng.random() < 0.3:  # read: the held blocks put among those waiting, in the order they came
            assert len(paths[0].join.pending) == len(paths[1].join.pending)
            assert paths[0].state() == paths[1].state()
        if rng.random() < 0.15:  # a call refused between polls (its partner dropped with it)
            pair = rng.choice([b.pairs[0] for b, *_ in paths[0].join.held] or ["none"])
            for p in paths:
                p.join.refuse("m", pair, now, p.unmatched)
        now = between_polls(paths, rng, now + 1)
        for p in paths:
            p.join.max_pending = most
    now += 120
    assert paths[0].expire(now) == paths[1].expire(now)
    assert paths[0].state() == paths[1].state() and paths[0].unmatched == paths[1].unmatched
    assert met[True] > 0 and paths[0].used_blocks > 0


def test_a_held_block_and_its_partners_join_with_no_entry_made_per_half(tmp_path: Path) -> None:
    """The usual poll: requests held, their responses complete them: nothing waits, every call is done in the
    responses' order, and the batch is the Halves' batch."""
    ((ins, outs),) = _batches(random.Random(5), tmp_path, 1)
    spec = _spec(segments=False)
    path, halves = Path_(True, spec), Path_(False, spec)
    assert path.poll([(INPUTS, ins)], T0) == halves.poll([(INPUTS, ins)], T0)
    assert len(path.join.held) == 1 and not path.join._waiting and len(halves.join.pending) == len(ins)
    found = path.poll([(OUTPUTS, outs)], T0 + 1)
    assert found == halves.poll([(OUTPUTS, outs)], T0 + 1) and found["batches"]["m"]["ids"]
    assert not path.join.held and not path.join.pending and not found["unmatched"]
    pids = [dict(h)["x-request-id"].decode() for _, h, _, _ in outs]  # type: ignore[arg-type]
    assert list(path.join.done) == [("m", pid) for pid in pids] == list(halves.join.done)
    assert set(path.join.done.values()) == {(T0 + 1, False, "")}
