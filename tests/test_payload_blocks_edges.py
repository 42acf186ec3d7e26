"""Where a Seldon poll read as one block of Arrow columns (exporter/stream/payloads/seldon_block.py ``read_block``,
``PairJoin.add_block``; exporter/stream/payloads/payload.py ``PayloadRows.block_batch``) must still count what the same
records read as Halves count (``read_halves`` without blocks, ``PairJoin.add_all``, ``PayloadRows.batch``), at the
edges a review found (each test failed on the block path as it first landed): a Kafka timestamp past 2^53 ms (the
block divided a float: its time differed in the last bit), and a configured group no UTF-8 text can be (Arrow's
lookup raised, the poll's calls never counted). Records are ModelInferRequest/Response messages of the project's own
protobuf classes (exporter.stream.payloads.oip.messages), as Seldon's gateway writes them; polls of any size are read
together (``seldon_batch.FEWEST`` 1, as tests/test_payload_blocks.py does)."""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest

from exporter.config import parse_config
from exporter.stream.payloads import seldon_batch
from exporter.stream.payloads.oip import messages
from exporter.stream.payloads.pairs import HalfBlock, join_units
from exporter.stream.payloads.payload import PairJoin, PayloadRows, Raw, payload_batches, read_halves
from exporter.stream.payloads.seldon_block import read_block

INPUTS, OUTPUTS = "seldon.ns.model.m.inputs", "seldon.ns.model.m.outputs"
T0_MS = 1_800_000_000_000


@pytest.fixture(autouse=True)
def _small_polls_batched(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(seldon_batch, "FEWEST", 1)


def _request(pid: str, gender: str, ms: int = T0_MS) -> Raw:
    request_type, _, _ = messages()
    message = request_type(model_name="m", id=pid)
    tensor = message.inputs.add(name="gender", datatype="BYTES", shape=[1, 1])
    tensor.contents.bytes_contents.append(gender.encode())
    return (message.SerializeToString(), [("x-request-id", pid.encode()),
                                          ("seldon-infer-type", b"proto/InferModelRequest")], pid.encode(), ms)


def _response(pid: str, score: float, ms: int = T0_MS) -> Raw:
    _, response_type, _ = messages()
    message = response_type(model_name="m", model_version="1", id=pid)
    message.outputs.add(name="proba", datatype="FP32", shape=[1, 1]).contents.fp32_contents.append(score)
    return (message.SerializeToString(), [("x-request-id", pid.encode()),
                                          ("seldon-infer-type", b"proto/InferModelRequest")], pid.encode(), ms)


def _rows(groups: list[str]) -> PayloadRows:
    raw = {"model_id": "m", "kafka": {"topic": INPUTS},
           "events": {"format": "seldon", "prediction": "proba", "score_threshold": 0.5},
           "protected_attributes": [{"name": "gender", "groups": groups}]}  # fmt: skip
    return PayloadRows(parse_config(raw).models[0], 300.0)


def _poll(blocks: bool, join: PairJoin, polls: list[tuple[str, list[Raw]]], rows: PayloadRows,
          now: float) -> dict[str, Any]:  # fmt: skip
    """The direct path (exporter/stream/ingest.py ``payloads``) over these polls, one after another."""
    unmatched: Counter[str] = Counter()
    out: dict[str, Any] = {}
    for topic, records in polls:
        read = read_halves("seldon", topic, records, {"m"}, blocks=blocks)
        assert bool(read.blocks) == blocks
        pairs = join_units(join, read.blocks or [read.halves], now, unmatched)
        batches, letters = payload_batches(pairs, {"m": rows}, now)
        for model, b in batches.items():
            out.setdefault(model, []).append({"predictions": b.predictions.tolist(), "codes": {
                k: v.tolist() for k, v in b.codes.items()}, "ids": b.prediction_ids, "rejected": dict(b.rejected)})
        out.setdefault("letters", []).extend(letters)
    out["unmatched"] = dict(unmatched)
    return out


def test_a_kafka_timestamp_past_2_53_ms_is_another_time_in_a_block_than_in_its_half() -> None:
    """A Kafka timestamp is an int64 of milliseconds; the Half path reads its time as ``record_ms / 1000`` (Python's
    int division, rounded once), the block as ``np.float64(ms) / 1000`` (the int rounded to a double first, then the
    quotient: rounded twice). Past 2**53 ms the two differ: for 10**16 + 1 ms the Halves say 10000000000000.002 s and
    the block 10000000000000.0, so the waiting half, and the checkpoint ``state()`` that writes it, differ between
    the two paths (a CreateTime a producer set; brokers before Kafka 4 accept any). Expected: the same time,
    ``HalfBlock.half(i) == seldon_batch.halves(...)[i]`` and the same ``state()`` bytes (read_block: take the times
    as Python divides them, or step aside to the Halves when a timestamp is past 2**53)."""
    records = [_request(f"c{k}", "male", ms=10**16 + 1) for k in range(3)]
    block = read_block(INPUTS, records, {"m"}, None)
    assert isinstance(block, HalfBlock)
    halves = seldon_batch.halves(INPUTS, records, {"m"}, None)
    assert halves is not None and halves[0].time == (10**16 + 1) / 1000 == 10000000000000.002
    states = []
    for blocks in (True, False):
        join = PairJoin(60.0)
        _poll(blocks, join, [(INPUTS, records)], _rows(["male", "female"]), T0_MS / 1000)
        states.append(bytes(join.state()["state"]))
    assert block.half(0).time == halves[0].time, (block.half(0).time, halves[0].time)
    assert states[0] == states[1]


def test_a_group_name_arrow_cannot_encode_makes_the_block_batch_raise_where_the_halves_count_it() -> None:
    """The config takes a group written with a YAML/JSON escape such as ``"\\ud800x"`` (a lone surrogate: a Python str
    that UTF-8 cannot encode). The Halves' batch looks cells up in the group table with ``dict.get`` and counts the
    calls (the cell ``male`` coded 0). The block's ``_codes`` builds Arrow's value set from the table's keys,
    ``pa.array(list(table), type=pa.string())``, which raises UnicodeEncodeError: ``payload_batches`` raises out of
    ``Ingest.payloads``, for every poll of that model read as blocks, whatever its cells.
    Expected: the same batch as the Halves (``_codes``: fall back to the list lookup when the table cannot be an Arrow
    array; or the config refuses a group that is not encodable text, for every path alike)."""
    rows = _rows(["male", "\ud800x"])
    polls = [(INPUTS, [_request(f"c{k}", "male") for k in range(3)]),
             (OUTPUTS, [_response(f"c{k}", 0.75) for k in range(3)])]
    by_halves = _poll(False, PairJoin(60.0), polls, rows, T0_MS / 1000)
    assert by_halves["m"][0]["codes"] == {"gender": [0, 0, 0]} and by_halves["m"][0]["predictions"] == [1, 1, 1]
    by_blocks = _poll(True, PairJoin(60.0), polls, rows, T0_MS / 1000)
    assert by_blocks == by_halves
