"""A poll of KServe CloudEvents read as two blocks (exporter/stream/payloads/kserve_batch.py ``_poll_blocks``: its
requests' and its responses' tensors as columns; pairs.py ``PollBlocks``, ``PairJoin.add_poll``) counts exactly
what its records read one by one count: the same halves in record order, the same pairs and unmatched counts, join
state, batches and dead letters, poll after poll, whatever order the halves arrive in. A poll a block cannot hold
(logged headers, two components, a response before its request, a call twice, tensors that differ) is read as
halves. Records made by the KServe SDK and the CloudEvents SDK (tests/payload_logs.py ``platform_records``)."""

from __future__ import annotations

import json
import random
import uuid
from collections import Counter
from typing import Any

import orjson
import pytest
from payload_logs import platform_records
from test_payload_blocks import between_polls

from exporter.config import parse_config
from exporter.stream.payloads import kserve_batch
from exporter.stream.payloads.pairs import BlockPairs, PollBlocks, join_units
from exporter.stream.payloads.payload import PairJoin, PayloadRows, Raw, payload_batches, read_halves

T0 = 1_796_000_000.0
T0_MS = 1_800_000_000_000


@pytest.fixture(autouse=True)
def _small_polls_batched(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(kserve_batch, "_FEWEST", 1)


def _calls(rng: random.Random, n: int, **variant: Any) -> list[dict[str, Any]]:
    out = []
    for k in range(n):
        rows = rng.randint(1, 3)
        out.append({"model": "credit", "topic": "kserve", "id": str(uuid.UUID(int=rng.getrandbits(128))),
                    "components": ["predictor"], "time": T0 + k * 0.25,
                    "columns": {"gender": [rng.choice(["male", "female", "ünknown"]) for _ in range(rows)],
                                "channel": [rng.choice(["web", "branch"]) for _ in range(rows)],
                                "age": [rng.randint(18, 90) for _ in range(rows)]},
                    "predictions": [rng.randint(0, 1) for _ in range(rows)], **variant})  # fmt: skip
    return out


@pytest.fixture(scope="module")
def sdk(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Calls of ``credit`` made by the KServe SDK: plain ones (logged by the predictor, no header logged), and
    calls a block cannot hold or that are refused: logged by a transformer too, with a logged header, of another
    model, with a prediction of 2 (invalid)."""
    rng = random.Random(3)
    calls = (_calls(rng, 90) + _calls(rng, 6, components=["transformer", "predictor"])
             + _calls(rng, 6, metadata={"X-Region": ["north"]}) + _calls(rng, 4, model="other")
             + [{**c, "predictions": [2] * len(c["predictions"])} for c in _calls(rng, 3)]
             + _calls(rng, 5, components=["transformer"]))  # fmt: skip
    placed = platform_records("kserve", calls, tmp_path_factory.mktemp("kserve-blocks"))
    records = [(value, headers, key, T0_MS + i) for i, (_, _, (value, headers, key)) in enumerate(placed)]
    return {"records": records, "plain": records[: 2 * 90]}


def _spec() -> PayloadRows:
    raw = {"model_id": "credit", "events": {"format": "kserve", "prediction": "predict"},
           "protected_attributes": [{"name": "gender", "groups": ["male", "female"]}], "segments": ["channel"]}
    return PayloadRows(parse_config(raw).models[0], 300.0)  # fmt: skip


def _alone(records: list[Raw], counted: dict[str, str] | None = None) -> Any:
    """``read_halves`` of each record read on its own (neither one pass nor blocks)."""
    saved = kserve_batch.halves
    kserve_batch.halves = lambda *_: None  # type: ignore[assignment]
    try:
        return read_halves("kserve", "kserve", records, {"credit"}, counted=counted)
    finally:
        kserve_batch.halves = saved


def _batch(batch: Any) -> dict[str, Any]:
    return {"timestamps": batch.timestamps.tolist(), "predictions": batch.predictions.tolist(),
            "scores": batch.scores.tolist(), "ids": batch.prediction_ids,
            "codes": {k: v.tolist() for k, v in batch.codes.items()}, "segments": batch.segments,
            "rejected": dict(batch.rejected)}  # fmt: skip


class Path_:
    """The daemon's direct path over one join (exporter/stream/ingest.py ``payloads``), with or without blocks."""

    def __init__(self, blocks: bool, counted: dict[str, str] | None) -> None:
        self.blocks, self.counted, self.rows, self.join = blocks, counted, _spec(), PairJoin(60.0, 10_000)
        self.unmatched: Counter[str] = Counter()
        self.polls = self.in_columns = 0

    def poll(self, records: list[Raw], now: float) -> dict[str, Any]:
        read = read_halves("kserve", "kserve", records, {"credit"}, counted=self.counted, blocks=self.blocks)
        self.polls += any(isinstance(b, PollBlocks) for b in read.blocks)
        for _, _, model, pid in read.rejected:
            if model is not None and pid is not None:
                self.join.refuse(model, pid, now, self.unmatched)
        pairs = join_units(self.join, read.blocks or [read.halves], now, self.unmatched)
        self.in_columns += sum(len(j) for js in pairs.values() for j in js if isinstance(j, BlockPairs))
        batches, letters = payload_batches(pairs, {"credit": self.rows}, now)
        return {"batches": {m: _batch(b) for m, b in batches.items()}, "letters": letters,
                "rejected": [(r[1], r[3]) for r in read.rejected], "ignored": dict(read.ignored),
                "unmatched": dict(self.unmatched)}  # fmt: skip

    def state(self) -> bytes:
        return bytes(self.join.state()["state"])


def test_a_poll_of_one_model_and_component_is_two_blocks_of_the_halves_each_record_reads(sdk: dict[str, Any]) -> None:
    records = sdk["plain"]
    found = kserve_batch.halves(records, {"credit"}, None, True)
    assert found is not None and isinstance(found[0], PollBlocks)
    poll = found[0]
    assert (len(poll.requests), len(poll.responses)) == (90, 90) and poll.requests.component == "predictor"
    alone = _alone(records)
    assert poll.halves() == alone.halves and repr(poll.halves()) == repr(alone.halves)  # the same types too
    (again,) = read_halves("kserve", "kserve", records, {"credit"}, blocks=True).blocks
    assert isinstance(again, PollBlocks) and again.halves() == alone.halves


def test_the_usual_poll_joins_in_columns(sdk: dict[str, Any]) -> None:
    """Each call's request then its response, in one poll: one run of calls joined between the poll's blocks, and
    the batch read from their columns (no Half made), equal to the Halves' batch."""
    (poll,) = read_halves("kserve", "kserve", sdk["plain"], {"credit"}, blocks=True).blocks
    join, counts = PairJoin(60.0), Counter[str]()
    joined = join_units(join, [poll], T0, counts)["credit"]
    assert [type(j) for j in joined] == [BlockPairs] and len(joined[0]) == 90
    spec = _spec()
    from_columns = spec.block_batch(joined, T0)  # type: ignore[arg-type]
    assert from_columns is not None
    from_halves, refused = spec.batch(joined[0].halves(), T0)  # type: ignore[union-attr]
    assert not refused and _batch(from_columns) == _batch(from_halves)
    assert not join.pending and len(join.done) == 90 and not counts
    assert set(join.done.values()) == {(T0, False, "predictor")}


def _body(record: Raw, edit: Any) -> Raw:
    value, headers, key, ms = record
    body = orjson.loads(value)  # type: ignore[arg-type]
    edit(body)
    return json.dumps(body).encode(), headers, key, ms  # ASCII: a lone surrogate escaped


def _header(record: Raw, name: str, text: bytes) -> Raw:
    value, headers, key, ms = record
    return value, [(k, text if k == name else v) for k, v in headers], key, ms  # type: ignore[union-attr]


def _tensor(edit: Any, at: int = 0) -> Any:
    return lambda body: edit(body["inputs"][at])


NO_BLOCK = {
    "a logged header": lambda r: [_header(r[0], "ce_metadata", b'{"X-Region": ["north"]}'), *r[1:]],
    "two components": lambda r: [*r[:-2], _header(r[-2], "ce_component", b"transformer"), r[-1]],
    "a response before its request": lambda r: [r[1], r[0], *r[2:]],
    "a request twice": lambda r: [r[0], *r],
    "a response twice": lambda r: [*r, r[1]],
    "a tensor missing": lambda r: [r[0], r[1], _body(r[2], lambda b: b["inputs"].pop()), *r[3:]],
    "tensors in another order": lambda r: [r[0], r[1], _body(r[2], lambda b: b["inputs"].reverse()), *r[3:]],
    "another datatype": lambda r: [r[0], r[1], _body(r[2], _tensor(lambda t: t.update(datatype="INT32"), 2)),
                                   *r[3:]],
    "a shape of two columns": lambda r: [_body(r[0], _tensor(lambda t: t.update(shape=[t["shape"][0], 2]))),
                                         *r[1:]],
    "a first dimension not the length": lambda r: [
        _body(r[0], _tensor(lambda t: t.update(shape=[t["shape"][0] + 1, 1]))), *r[1:]],
    "rows that differ between tensors": lambda r: [
        _body(r[0], _tensor(lambda t: t.update(data=[*t["data"], 1], shape=[len(t["data"]) + 1, 1]), 2)), *r[1:]],
    "pd_json": lambda r: [
        _body(r[0], _tensor(lambda t: t.update(parameters={"content_type": "pd_json"},
                                               data=[orjson.dumps(v).decode() for v in t["data"]]))), *r[1:]],
    "base64 text": lambda r: [_body(r[0], _tensor(lambda t: t.update(parameters={"content_type": "base64"}))),
                              *r[1:]],
    "integers among floats": lambda r: [
        _body(r[0], _tensor(lambda t: t.update(datatype="FP64", data=[1.5, *t["data"][1:]]), 2)), r[1],
        _body(r[2], _tensor(lambda t: t.update(datatype="FP64", data=[2.5] * len(t["data"])), 2)), *r[3:]],
    "nested values": lambda r: [_body(r[0], _tensor(lambda t: t.update(data=[[v] for v in t["data"]]))), *r[1:]],
    "a lone surrogate": lambda r: [_body(r[0], _tensor(lambda t: t.update(data=["\ud800"] * len(t["data"])))),
                                   *r[1:]],
    "a v1 body": lambda r: [(b'{"instances": [{"gender": "male"}]}', *r[0][1:]), *r[1:]],
}


@pytest.mark.parametrize("case", list(NO_BLOCK))
def test_a_poll_a_block_cannot_hold_is_read_as_halves_alike(sdk: dict[str, Any], case: str) -> None:
    records = NO_BLOCK[case](list(sdk["plain"][:12]))
    found = kserve_batch.halves(records, {"credit"}, None, True)
    assert found is None or not isinstance(found[0], PollBlocks), case
    read = read_halves("kserve", "kserve", records, {"credit"}, blocks=True)
    alone = _alone(records)
    assert not read.blocks and read.halves == alone.halves and read.rejected == alone.rejected
    assert repr(read.halves) == repr(alone.halves)


def test_what_a_block_holds_stays_a_block_when_only_its_values_vary(sdk: dict[str, Any]) -> None:
    """Text, integers, nulls among them and content types the reader takes as they are: still a block, of the
    halves each record reads."""
    records = list(sdk["plain"][:12])
    records[0] = _body(records[0], _tensor(lambda t: t.update(data=[None] * len(t["data"]))))
    records[2] = _body(records[2], _tensor(lambda t: t.update(data=[-(2**53)] * len(t["data"])), 2))
    poll = kserve_batch.halves(records, {"credit"}, None, True)
    assert poll is not None and isinstance(poll[0], PollBlocks)
    assert repr(poll[0].halves()) == repr(_alone(records).halves)


@pytest.mark.parametrize("seed", range(6))
def test_polls_in_any_order_count_alike_with_and_without_blocks(sdk: dict[str, Any], seed: int) -> None:
    rng = random.Random(seed)
    records = list(sdk["records"])
    records += rng.sample(records, 10)  # delivered twice
    broken = rng.randrange(len(records))
    value, headers, key, ms = records[broken]
    records[broken] = (value[:-3], headers, key, ms)  # type: ignore[index]  # cut short: refused
    mode = seed % 3
    if mode == 0:
        rng.shuffle(records)
    elif mode == 1:  # every response first
        records.sort(key=lambda r: b"response" not in dict(r[1])["ce_type"])  # type: ignore[arg-type]
    counted = {"credit": "predictor"} if seed % 2 else None
    paths = [Path_(True, counted), Path_(False, counted)]
    now, at = T0, 0
    while at < len(records):
        size = rng.randint(1, 60)
        chunk, at = records[at : at + size], at + size
        late = 400 if rng.random() < 0.1 else 0  # a poll read before the clock: future timestamps
        found = [p.poll(chunk, now - late) for p in paths]
        assert found[0] == found[1]
        now = between_polls(paths, rng, now)
    now += 120
    assert [h.raw for h in paths[0].join.expire(now, paths[0].unmatched)] == \
        [h.raw for h in paths[1].join.expire(now, paths[1].unmatched)]  # fmt: skip
    assert paths[0].state() == paths[1].state() and paths[0].unmatched == paths[1].unmatched
    assert paths[0].polls > 0 and paths[1].polls == paths[1].in_columns == 0
    if mode == 2:  # in record order: the polls of plain calls alone join in columns (responses first: as Halves)
        assert paths[0].in_columns > 20, paths[0].in_columns
