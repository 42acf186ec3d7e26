"""A Seldon poll read as one block (exporter/stream/payloads/seldon_block.py ``read_block``, ``PairJoin.add_block``,
``PayloadRows.block_batch``) counts exactly what the same records read as Halves count: the same halves, the same
pairs and unmatched counts, the same join state, the same batches (every array, every id) and dead letters, poll
after poll, whatever the order the halves arrive in: requests first or responses first, a call split across polls,
deliveries twice, refused records, invalid scores, future times, expiry and a checkpoint between polls. Records made
by MLServer's own codecs (tests/payload_logs.py)."""

from __future__ import annotations

import random
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from payload_logs import platform_records

from exporter.config import parse_config
from exporter.stream.payloads import seldon_batch
from exporter.stream.payloads.oip import messages
from exporter.stream.payloads.pairs import BlockPairs, HalfBlock, join_units
from exporter.stream.payloads.payload import PairJoin, PayloadRows, Raw, payload_batches, read_halves
from exporter.stream.payloads.seldon_block import read_block

T0_MS = 1_800_000_000_000


@pytest.fixture(autouse=True)
def _small_polls_batched(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(seldon_batch, "FEWEST", 1)


def _calls(rng: random.Random, n: int, rows: int, **variant: Any) -> list[dict[str, Any]]:
    return [{"model": "m", "namespace": "ns", "id": str(uuid.UUID(int=rng.getrandbits(128))), "partition": 0,
             "pipeline": None, "json": False, "raw": False,
             "columns": {"gender": [rng.choice(["male", "female", "ünknown"]) for _ in range(rows)],
                         "channel": [rng.choice(["web", "branch"]) for _ in range(rows)]},
             "headers": {}, "scores": [rng.random() for _ in range(rows)], **variant} for _ in range(n)]  # fmt: skip


def _records(calls: list[dict[str, Any]], tmp_path: Path) -> dict[str, list[Raw]]:
    """Each call's request and response record, by call id."""
    out: dict[str, list[Raw]] = {}
    for i, (topic, _, (value, headers, key)) in enumerate(platform_records("seldon", calls, tmp_path)):
        pid = dict(headers).get("x-request-id", b"").decode() or key.decode()  # type: ignore[union-attr]
        out.setdefault(pid, []).append((topic, (value, headers, key, T0_MS + 7 * i)))  # type: ignore[arg-type]
    return out  # type: ignore[return-value]


def _spec(segments: bool) -> PayloadRows:
    raw = {"model_id": "m", "kafka": {"topic": "seldon.ns.model.m.inputs"},
           "events": {"format": "seldon", "prediction": "proba", "score_threshold": 0.5},
           "protected_attributes": [{"name": "gender", "groups": ["male", "female"]}],
           **({"segments": ["channel"]} if segments else {})}  # fmt: skip
    return PayloadRows(parse_config(raw).models[0], 300.0)


def _batch(batch: Any) -> dict[str, Any]:
    return {"timestamps": batch.timestamps.tolist(), "predictions": batch.predictions.tolist(),
            "scores": batch.scores.tolist(), "outcomes": batch.outcomes.tolist(), "ids": batch.prediction_ids,
            "codes": {k: v.tolist() for k, v in batch.codes.items()}, "segments": batch.segments,
            "side_ids": batch.side_ids, "rejected": dict(batch.rejected)}  # fmt: skip


class Path_:
    """The daemon's direct path over one join (exporter/stream/ingest.py ``payloads``), with or without blocks."""

    def __init__(self, blocks: bool, rows: PayloadRows) -> None:
        self.blocks, self.rows, self.join = blocks, rows, PairJoin(60.0, 10_000)
        self.unmatched: Counter[str] = Counter()
        self.used_blocks = 0

    def poll(self, parts: list[tuple[str, list[Raw]]], now: float) -> dict[str, Any]:
        units: list[Any] = []
        rejected = []
        for topic, records in parts:
            read = read_halves("seldon", topic, records, {"m"}, blocks=self.blocks)
            units += read.blocks or [read.halves]
            self.used_blocks += len(read.blocks)
            rejected += read.rejected
        for _, _, model, pid in rejected:
            if model is not None and pid is not None:
                self.join.refuse(model, pid, now, self.unmatched)
        pairs = join_units(self.join, units, now, self.unmatched)
        batches, letters = payload_batches(pairs, {"m": self.rows}, now)
        return {"batches": {m: _batch(b) for m, b in batches.items()}, "letters": letters,
                "rejected": [(r[1], r[3]) for r in rejected], "unmatched": dict(self.unmatched)}  # fmt: skip

    def expire(self, now: float) -> list[Any]:
        return [h.raw for h in self.join.expire(now, self.unmatched)]

    def state(self) -> bytes:
        return bytes(self.join.state()["state"])


def test_a_block_holds_the_halves_the_poll_reads_as_halves(tmp_path: Path) -> None:
    rng = random.Random(1)
    calls = (_calls(rng, 20, 3) + _calls(rng, 10, 1) + _calls(rng, 10, 5)
             + [{**c, "pipeline": "scoring"} for c in _calls(rng, 6, 2)])  # fmt: skip
    by_topic: dict[str, list[Raw]] = {}
    for records in _records(calls, tmp_path).values():
        for topic, record in records:
            by_topic.setdefault(topic, []).append(record)  # type: ignore[arg-type]
    assert len(by_topic) == 2
    for topic, records in by_topic.items():
        block = read_block(topic, records, {"m"}, None)
        assert block is not None, topic
        assert [block.half(i) for i in range(len(block))] == seldon_batch.halves(topic, records, {"m"}, None)
    requests = by_topic["seldon.ns.model.m.inputs"]
    with_headers = [(v, [*h, ("x-region", b"north")], k, ms) for v, h, k, ms in requests]
    assert read_block("seldon.ns.model.m.inputs", with_headers, {"m"}, None) is None  # a request's own headers
    assert seldon_batch.halves("seldon.ns.model.m.inputs", with_headers, {"m"}, None) is not None
    raw = _records(_calls(rng, 4, 2, raw=True), tmp_path)
    raw_requests = [r for records in raw.values() for t, r in records if t.endswith("inputs")]
    assert read_block("seldon.ns.model.m.inputs", raw_requests, {"m"}, None) is None  # raw contents: as halves


def _json_first(records: list[Raw], blank: bytes) -> list[Raw]:
    return [(blank + b'{"id": "x"}' if k == 3 else v, h, key, ms) for k, (v, h, key, ms) in enumerate(records)]


def test_a_body_whose_first_byte_past_blanks_is_a_brace_is_no_block(tmp_path: Path) -> None:
    """Without a ``seldon-infer-type`` header a body may be JSON: as ``bytes.lstrip()[:1] == b"{"`` says, for any
    run of blanks before the brace; a protobuf body starting with blank bytes (field 1's key is ``\\n``) is not."""
    rng = random.Random(2)
    records = [r for rs in _records(_calls(rng, 6, 2), tmp_path).values() for t, r in rs if t.endswith("inputs")]
    bare = [(v, [(k, x) for k, x in h if k != "seldon-infer-type"], key, ms) for v, h, key, ms in records]
    assert read_block("seldon.ns.model.m.inputs", bare, {"m"}, None) is not None
    for blank in (b"", b" ", b"\n\t \r\x0b\x0c"):
        assert read_block("seldon.ns.model.m.inputs", _json_first(bare, blank), {"m"}, None) is None, blank
    request_type = messages()[0]
    named = [(request_type(model_name="m", id=f"c{k}").SerializeToString(), h, key, ms)
             for k, (_, h, key, ms) in enumerate(bare)]  # fmt: skip
    assert named[0][0][:1] == b"\n"  # a blank byte first, then the name's length
    assert read_block("seldon.ns.model.m.inputs", named, {"m"}, None) is not None


@pytest.mark.parametrize("seed", range(6))
def test_polls_in_any_order_count_alike_as_blocks_and_as_halves(tmp_path: Path, seed: int) -> None:
    rng = random.Random(seed)
    calls = _calls(rng, 60, rng.choice([1, 2, 3]))
    calls[5]["scores"] = [1.5] * len(calls[5]["scores"])  # invalid_score: refused with its partner
    calls[6]["pipeline"] = "scoring"
    records = _records(calls, tmp_path)
    halves = [(topic, r) for pid in records for topic, r in records[pid]]
    halves += rng.sample(halves, 8)  # delivered twice
    broken = next(i for i, (t, _) in enumerate(halves) if t.endswith("inputs"))
    topic, (value, headers, key, ms) = halves[broken]
    halves[broken] = (topic, (value[:-2], headers, key, ms))  # cut short: refused, its response dropped
    mode = seed % 3
    if mode == 0:
        rng.shuffle(halves)
    elif mode == 1:  # every response first
        halves.sort(key=lambda h: h[0].endswith("inputs"))
    spec = _spec(segments=seed % 2 == 0)
    paths = [Path_(True, spec), Path_(False, spec)]
    now = T0_MS / 1000
    at = 0
    while at < len(halves):
        size = rng.randint(1, 40)
        chunk = halves[at : at + size]
        at += size
        parts: dict[str, list[Raw]] = {}
        for topic, record in chunk:
            parts.setdefault(topic, []).append(record)
        late = now + (400 if rng.random() < 0.1 else 0)  # a poll read before the clock: future timestamps
        found = [p.poll(list(parts.items()), now - (late - now)) for p in paths]
        assert found[0] == found[1]
        now = between_polls(paths, rng, now)
    now += 120
    assert paths[0].expire(now) == paths[1].expire(now)
    assert paths[0].state() == paths[1].state() and paths[0].unmatched == paths[1].unmatched
    assert paths[0].used_blocks > 0 and paths[1].used_blocks == 0


def between_polls(paths: list[Any], rng: random.Random, now: float) -> float:
    """Now and then an expiry 30 s on, and a checkpoint restored, alike on every path (each with ``join``,
    ``unmatched`` and ``state()``); the clock after them."""
    if rng.random() < 0.2:
        now += 30
        expired = [[h.raw for h in p.join.expire(now, p.unmatched)] for p in paths]
        assert expired[0] == expired[1]
    if rng.random() < 0.2:  # a checkpoint and a restore between polls
        state = paths[0].state()
        assert state == paths[1].state()
        for p in paths:
            p.join = PairJoin(60.0, 10_000)
            p.join.restore({"state": np.frombuffer(state, dtype=np.uint8)})
    return now


def test_the_usual_polls_join_in_columns(tmp_path: Path) -> None:
    """Requests in one poll, their responses in the next: one run of calls joined between the two blocks, and the
    batch read from their columns (no Half made), equal to the Halves' batch."""
    rng = random.Random(9)
    records = _records(_calls(rng, 30, 2), tmp_path)
    inputs = [r for rs in records.values() for t, r in rs if t.endswith("inputs")]
    outputs = [r for rs in records.values() for t, r in rs if t.endswith("outputs")]
    join, counts = PairJoin(60.0), Counter[str]()
    units = [read_halves("seldon", "seldon.ns.model.m.inputs", inputs, {"m"}, blocks=True).blocks[0],
             read_halves("seldon", "seldon.ns.model.m.outputs", outputs, {"m"}, blocks=True).blocks[0]]
    assert all(isinstance(u, HalfBlock) for u in units)
    joined = join_units(join, units, T0_MS / 1000, counts)
    assert [type(j) for j in joined["m"]] == [BlockPairs] and len(joined["m"][0]) == 30
    spec = _spec(segments=True)
    block_batch = spec.block_batch(joined["m"], T0_MS / 1000)  # type: ignore[arg-type]
    assert block_batch is not None
    halves_batch, refused = spec.batch(joined["m"][0].halves(), T0_MS / 1000)  # type: ignore[union-attr]
    assert not refused and _batch(block_batch) == _batch(halves_batch)
    assert not join.pending and len(join.done) == 30 and not counts


def test_a_rule_broken_anywhere_in_the_run_reads_the_calls_as_halves_with_their_refusals(tmp_path: Path) -> None:
    """A future time, an invalid score, a response with fewer rows: the columns' batch steps aside (None) and the
    Halves' batch refuses exactly the calls that break a rule, with their dead letters."""
    rng = random.Random(10)
    calls = _calls(rng, 12, 2)
    calls[3]["scores"] = [0.2, 1.5]
    records = _records(calls, tmp_path)
    inputs = [r for rs in records.values() for t, r in rs if t.endswith("inputs")]
    outputs = [r for rs in records.values() for t, r in rs if t.endswith("outputs")]
    spec, now = _spec(segments=False), T0_MS / 1000

    def joined() -> list[Any]:
        units = [read_block("seldon.ns.model.m.inputs", inputs, {"m"}, None),
                 read_block("seldon.ns.model.m.outputs", outputs, {"m"}, None)]
        return join_units(PairJoin(60.0), units, now, Counter())["m"]  # type: ignore[arg-type]

    found = joined()
    assert [type(j) for j in found] == [BlockPairs]
    assert spec.block_batch(found, now) is None  # the score 1.5
    batches, letters = payload_batches({"m": found}, {"m": spec}, now)
    assert batches["m"].rejected == Counter({"invalid_score": 1}) and len(letters) == 2
    assert len(batches["m"].predictions) == 22
    calls[3]["scores"] = [0.2, 0.9]
    records = _records(calls, tmp_path)
    inputs = [r for rs in records.values() for t, r in rs if t.endswith("inputs")]
    outputs = [r for rs in records.values() for t, r in rs if t.endswith("outputs")]
    found = joined()
    assert spec.block_batch(found, now) is not None
    assert spec.block_batch(found, now - 400) is None  # every request 400 s ahead of the clock (skew 300 s)
    batches, letters = payload_batches({"m": found}, {"m": spec}, now - 400)
    assert batches["m"].rejected == Counter({"future_timestamp": 12}) and len(letters) == 24


def test_a_request_with_no_kafka_timestamp_is_refused_alike(tmp_path: Path) -> None:
    """A record with no timestamp (-1): its call has no time, ``missing_field``, in the columns' batch too."""
    rng = random.Random(12)
    records = _records(_calls(rng, 8, 2), tmp_path)
    inputs = [r for rs in records.values() for t, r in rs if t.endswith("inputs")]
    inputs[2] = (*inputs[2][:3], -1)
    outputs = [r for rs in records.values() for t, r in rs if t.endswith("outputs")]
    spec, now = _spec(segments=False), T0_MS / 1000
    units = [read_block("seldon.ns.model.m.inputs", inputs, {"m"}, None),
             read_block("seldon.ns.model.m.outputs", outputs, {"m"}, None)]
    assert units[0] is not None and units[0].half(2).time is None
    found = join_units(PairJoin(60.0), units, now, Counter())["m"]  # type: ignore[arg-type]
    assert spec.block_batch(found, now) is None  # type: ignore[arg-type]
    batches, letters = payload_batches({"m": found}, {"m": spec}, now)
    assert batches["m"].rejected == Counter({"missing_field": 1}) and len(letters) == 2
    assert not np.isnan(batches["m"].timestamps).any() and len(batches["m"].timestamps) == 14
