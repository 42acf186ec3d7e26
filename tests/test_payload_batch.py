"""A poll of Seldon records made by MLServer is read in one pass (exporter/stream/payloads/seldon_batch.py) into
exactly the halves each record gives read alone; a poll it does not certify (JSON, a broken record) is read record
by record, with the same refusals. A batch of joined pairs counts and refuses each
pair as a batch of that pair alone would."""

from __future__ import annotations

import random
import uuid
from collections import Counter, defaultdict
from itertools import chain
from pathlib import Path
from typing import Any

import pytest
from payload_logs import platform_records

from exporter.config import parse_config
from exporter.stream.payloads import seldon_batch
from exporter.stream.payloads.oip import BadPayload, messages
from exporter.stream.payloads.payload import PairJoin, PayloadRows, Raw, read_halves
from exporter.stream.payloads.platforms import Half, headers_of, headers_of_poll, seldon_half


@pytest.fixture(autouse=True)
def _small_polls_batched(monkeypatch: pytest.MonkeyPatch) -> None:
    """The batch reads polls of any size the same: small ones here (the module reads them one by one for speed)."""
    monkeypatch.setattr(seldon_batch, "FEWEST", 1)


def _one_by_one(topic: str, records: list[Raw]) -> list[Any]:
    out: list[Any] = []
    for value, headers, key, ms in records:
        try:
            out.append(seldon_half(value, headers_of(headers), key, topic, ms))
        except BadPayload as exc:
            out.append(exc.reason)
    return out


def _polls(calls: list[dict[str, Any]], tmp_path: Path) -> dict[str, list[Raw]]:
    polls: dict[str, list[Raw]] = defaultdict(list)
    for i, (topic, _, (value, headers, key)) in enumerate(platform_records("seldon", calls, tmp_path)):
        polls[topic].append((value, headers, key, 1_800_000_000_000 + i))
    return polls


def _calls(rng: random.Random, model: str, n: int, rows: int, **variant: Any) -> list[dict[str, Any]]:
    return [{"model": model, "namespace": "ns", "id": str(uuid.UUID(int=rng.getrandbits(128))), "partition": 0,
             "pipeline": (None, "scoring")[k % 2], "json": False, "raw": False,
             "columns": {"gender": [rng.choice(["male", "female", "ünknown"]) for _ in range(rows)],
                         "age": [rng.randint(-(2**40), 2**40) for _ in range(rows)]},
             "headers": {"x-region": rng.choice(["north", "south"])},
             "scores": [rng.random() for _ in range(rows)], **variant} for k in range(n)]  # fmt: skip


def test_a_usual_poll_is_read_in_one_pass_into_the_halves_of_each_record_read_alone(tmp_path: Path) -> None:
    rng = random.Random(3)
    calls = (_calls(rng, "typed", 40, 3) + _calls(rng, "raw", 40, 2, raw=True) + _calls(rng, "one", 30, 1)
             + _calls(rng, "bare", 20, 4, typed_header=False) + _calls(rng, "sizes", 10, 2) + _calls(rng, "sizes", 5, 7)
             + _calls(rng, "sizes", 5, 1) + _calls(rng, "raw_sizes", 5, 3, raw=True)
             + _calls(rng, "raw_sizes", 5, 1, raw=True))  # fmt: skip
    polls = _polls(calls, tmp_path)
    assert len(polls) == 12
    for topic, records in polls.items():
        model = topic.split(".")[-2]
        fast = seldon_batch.halves(topic, records, {model}, None)
        assert fast is not None, topic  # each of these polls is the usual one
        alone = _one_by_one(topic, records)
        assert fast == alone
        assert read_halves("seldon", topic, records, {model}).halves == alone
        assert all(h.rows == len(h.columns["gender" if "inputs" in topic else "proba"]) for h in fast)


def test_a_poll_it_does_not_certify_is_read_record_by_record_with_the_same_refusals(tmp_path: Path) -> None:
    rng = random.Random(4)
    polls = _polls(_calls(rng, "m", 12, 2) + _calls(rng, "m", 2, 2, json=True), tmp_path)
    requests = polls["seldon.ns.model.m.inputs"]
    broken = requests[:12]
    broken[4] = (broken[4][0][:-3], *broken[4][1:])  # cut short: malformed_payload
    broken[7] = (broken[7][0].replace(b"male", b"ma\xffe", 1), *broken[7][1:])  # not UTF-8
    broken[9] = (None, *broken[9][1:])
    for poll in (broken, requests):  # requests: with two JSON records
        assert seldon_batch.halves("seldon.ns.model.m.inputs", poll, {"m"}, None) is None
        read = read_halves("seldon", "seldon.ns.model.m.inputs", poll, {"m"})
        alone = _one_by_one("seldon.ns.model.m.inputs", poll)
        assert read.halves == [h for h in alone if not isinstance(h, str)]
        assert [reason for _, reason, _, _ in read.rejected] == [h for h in alone if isinstance(h, str)]
    assert [h for h in _one_by_one("seldon.ns.model.m.inputs", broken) if isinstance(h, str)] == [
        "malformed_payload", "not_utf8", "malformed_payload"]


def test_a_batch_of_pairs_counts_and_refuses_each_pair_as_a_batch_of_that_pair_alone() -> None:
    """The rules are checked over the whole batch at once, and pair by pair only when one fails somewhere."""
    attributes = [{"name": "gender", "groups": ["male", "female"]}]
    scored = parse_config({"model_id": "m", "events": {"format": "kserve", "prediction": "p", "score_threshold": 0.5},
                           "protected_attributes": attributes}).models[0]  # fmt: skip
    labelled = parse_config({"model_id": "m", "events": {"format": "kserve", "prediction": "p"},
                             "protected_attributes": attributes}).models[0]  # fmt: skip
    t = 1_800_000_000.0

    def pair(k: int, values: list[Any], time: float | None = t, column: str = "p") -> tuple[Half, Half]:
        rows = len(values)
        request = Half(f"c{k}", False, "m", time, rows, {"gender": ["male", "female", "x"][:rows]})
        return request, Half(f"c{k}", True, "m", time, rows, {column: values})

    cases = ((scored, [[0.25, 1.0], [0.0], [1, 0.5, 0.75]], [[float("nan")], [1.5], [True], ["0.3"], [0.5, -0.1]]),
             (labelled, [[0, 1], [1.0], [True, False, 1], [-0.0]], [[2], ["1"], [0.5, 1], [None], [[1]], [{"a": 1}],
                                                                   [float("nan")], [b"\x01"]]))  # fmt: skip
    for model, good, bad in cases:
        pairs = [pair(k, v) for k, v in enumerate(good + bad)]
        pairs += [pair(90, [0.5], time=None), pair(91, [0.5], time=t + 3600), pair(92, [0.5], column="other")]
        request, response = pair(93, [1, 0])
        pairs.append((request, Half("c93", True, "m", t, 1, {"p": [1]})))  # unequal rows
        request, response = pair(94, [1.0], column="other")
        pairs.append((Half("c94", False, "m", t, 1, {"gender": ["male"], "p": [1.0]}), response))  # in the request
        rng = random.Random(len(pairs))
        for trial in range(20):
            chosen = rng.sample(pairs, k=rng.randint(1, len(pairs))) if trial else pairs
            rows = PayloadRows(model, 300.0)
            batch, refused = rows.batch(chosen, t)
            alone = [rows.batch([p], t) for p in chosen]
            assert [(h.pair, reason) for h, reason in refused] == [(h.pair, reason) for _, r in alone
                                                                    for h, reason in r]  # fmt: skip
            assert batch.prediction_ids == [i for b, _ in alone for i in b.prediction_ids]
            assert batch.predictions.tolist() == [p for b, _ in alone for p in b.predictions.tolist()]
            assert batch.codes["gender"].tolist() == [c for b, _ in alone for c in b.codes["gender"].tolist()]
            assert len(batch.predictions) == len(batch.timestamps) == len(batch.prediction_ids)
        batch, refused = PayloadRows(model, 300.0).batch(pairs, t)
        assert [reason for _, reason in refused] == [
            "invalid_score" if model is scored else "invalid_prediction"] * len(bad) + [
            "missing_field", "future_timestamp", "missing_field", "unequal_rows"]  # fmt: skip
        assert batch.predictions.tolist() == [int(v >= 0.5) for v in chain.from_iterable(good)] + [1]
        assert batch.prediction_ids[:6] == ["c0:0", "c0:1", "c1", "c2:0", "c2:1", "c2:2"]


def test_a_shape_claiming_a_trillion_columns_is_refused_record_by_record_without_naming_them() -> None:
    request_type, _, _ = messages()
    request = request_type(id="a")
    request.inputs.add(name="x", datatype="FP32", shape=[1, 10**12]).contents.fp32_contents.extend([0.5])
    value = request.SerializeToString()
    poll: list[Raw] = [(value, [("x-request-id", f"r{i}".encode())], None, 1000) for i in range(3)]
    assert seldon_batch.halves("seldon.ns.model.m.inputs", poll, {"m"}, None) is None
    read = read_halves("seldon", "seldon.ns.model.m.inputs", poll, {"m"})
    assert [reason for _, reason, _, _ in read.rejected] == ["shape_mismatch"] * 3


def _key(number: int, wire: int) -> bytes:
    return _varint(number << 3 | wire)


def _varint(n: int) -> bytes:
    out = bytearray()
    while n >= 0x80:
        out.append(n & 0x7F | 0x80)
        n >>= 7
    return bytes([*out, n])


def _field(number: int, data: bytes) -> bytes:
    return _key(number, 2) + _varint(len(data)) + data


def _read_alike(topic: str, poll: list[Raw], batched: bool) -> None:
    """The poll read by read_halves gives each record's half or refusal read alone; read in one pass or not."""
    model = topic.split(".")[-2]
    assert (seldon_batch.halves(topic, poll, {model}, None) is not None) == batched
    read = read_halves("seldon", topic, poll, {model})
    alone = _one_by_one(topic, poll)
    assert read.halves == [h for h in alone if not isinstance(h, str)]
    assert [reason for _, reason, _, _ in read.rejected] == [h for h in alone if isinstance(h, str)]


_GENDER = _field(1, b"gender") + _field(2, b"BYTES")
_AGE = _field(1, b"age") + _field(2, b"INT64") + _field(3, _varint(2) + _varint(1))
_AGE_VALUES = _field(3, _varint(40) + _varint((1 << 64) - 7))  # 40, -7


@pytest.mark.parametrize("tensors", [
    # shape sent unpacked, and half packed half not; int64 contents unpacked, and in two packed runs
    [_GENDER + _key(3, 0) + _varint(2) + _key(3, 0) + _varint(1) + _field(5, _field(8, b"male") + _field(8, b"x")),
     _AGE + _field(5, _key(3, 0) + _varint(40) + _key(3, 0) + _varint((1 << 64) - 7))],
    [_GENDER + _field(3, _varint(2)) + _key(3, 0) + _varint(1) + _field(5, _field(8, b"m") + _field(8, b"f")),
     _AGE + _field(5, _field(3, _varint(40)) + _field(3, _varint((1 << 64) - 7)))],
    # a singular field sent twice (the last one stands), contents sent in two parts (merged), unknown fields and a
    # known field of another wire type (skipped), a group
    [_field(1, b"old") + _GENDER + _field(3, _varint(2) + _varint(1)) + _field(5, _field(8, b"a"))
     + _field(5, _field(8, b"b")) + _field(9, b"unknown") + _key(6, 0) + _varint(3),
     _AGE + _field(5, _key(8, 0) + _varint(1) + _AGE_VALUES) + _key(99, 3) + _key(1, 0) + _varint(1) + _key(99, 4)],
    # a float field of the wrong wire type inside contents, a packed bool sent as varints beyond 1
    [_GENDER + _field(3, _varint(2) + _varint(1))
     + _field(5, _key(6, 0) + _varint(1) + _field(8, "ü".encode()) + _field(8, b"")),
     _field(1, b"ok") + _field(2, b"BOOL") + _field(3, _varint(2)) + _field(5, _field(1, _varint(5) + _varint(0)))],
])  # fmt: skip
def test_every_wire_layout_the_runtime_reads_is_read_in_one_pass_into_the_same_values(tensors: list[bytes]) -> None:
    """ptars reads as the protobuf runtime does whatever layout a valid record has."""
    poll: list[Raw] = [(_field(3, f"c{i}".encode()) + b"".join(_field(5, t) for t in tensors),
                        [("x-request-id", f"r{i}".encode())], None, 1000 + i) for i in range(3)]  # fmt: skip
    _read_alike("seldon.ns.model.m.inputs", poll, True)


_MALE = _GENDER + _field(3, _varint(1)) + _field(5, _field(8, b"male"))
"""A tensor of one row: a record of it alone is the usual poll's."""


@pytest.mark.parametrize("broken", [
    _field(5, _MALE + _field(5, _field(6, b"\x00\x00\x80"))),  # a packed float cut short (ptars reads it)
    _field(5, _MALE) + _key(99, 3) + _key(1, 0) + _varint(1) + _key(98, 4),  # a group closed by another's end (too)
    _field(5, _MALE) + _field(3, b"\xff\xfe"),  # an id not UTF-8
    _field(5, _MALE + _field(4, _field(1, b"k") + _field(2, _field(3, b"\xc3")))),  # a parameter not UTF-8
    _field(5, _MALE) + _key(0, 0) + _varint(1),  # field 0
])  # fmt: skip
def test_a_record_the_runtime_refuses_sends_the_poll_record_by_record_even_where_ptars_reads_it(broken: bytes) -> None:
    good = _field(3, b"c") + _field(5, _MALE)
    poll: list[Raw] = [(v, [("x-request-id", f"r{i}".encode())], None, 1000)
                       for i, v in enumerate([good, broken, good])]  # fmt: skip
    _read_alike("seldon.ns.model.m.inputs", poll[::2], True)
    _read_alike("seldon.ns.model.m.inputs", poll, False)
    assert [reason for _, reason, _, _ in read_halves("seldon", "seldon.ns.model.m.inputs", poll, {"m"}).rejected] == [
        "malformed_payload"]  # fmt: skip


def test_fuzzed_records_in_a_poll_read_as_each_record_alone(tmp_path: Path) -> None:
    """MLServer-made records, each poll with some bytes flipped, cut, doubled or dropped in one record: read as
    each record alone (in one pass where every record still reads, else record by record)."""
    rng = random.Random(5)
    polls = _polls(_calls(rng, "typed", 6, 3) + _calls(rng, "raw", 6, 2, raw=True), tmp_path)
    batched = 0
    for trial in range(160):
        topic = sorted(polls)[trial % len(polls)]
        poll = list(polls[topic])
        k = rng.randrange(len(poll))
        value = bytearray(poll[k][0])  # type: ignore[arg-type]
        for _ in range(rng.randint(1, 3)):
            if not value:
                break
            at = rng.randrange(len(value))
            kind = rng.randrange(4)
            if kind == 0:
                value[at] = rng.randrange(256)
            elif kind == 1:
                del value[at:]
            elif kind == 2:
                value[at:at] = value[at : at + rng.randint(1, 8)]
            else:
                del value[at : at + rng.randint(1, 4)]
        poll[k] = (bytes(value) or b"\x01", *poll[k][1:])
        model = topic.split(".")[-2]
        batched += seldon_batch.halves(topic, poll, {model}, None) is not None
        read = read_halves("seldon", topic, poll, {model})
        alone = _one_by_one(topic, poll)
        assert read.halves == [h for h in alone if not isinstance(h, str)], trial
        assert [reason for _, reason, _, _ in read.rejected] == [h for h in alone if isinstance(h, str)], trial
    assert 0 < batched < 160  # both paths taken


@pytest.mark.parametrize("headers", [
    [[("x-request-id", b"a"), ("x-region", b"north")], [("X-Request-Id", b"b"), ("X-Region", None)], None],
    [[("x-request-id", b"a"), ("x-request-id", b"b"), ("x-region", None)], [], [("pipeline", b"\xff")]],
])  # fmt: skip
def test_a_polls_headers_read_at_once_are_each_records_read_alone(headers: list[Any]) -> None:
    """Names lower-cased (all of a poll's checked at once), the last of a repeated name, a None value."""
    value = _field(3, b"own") + _field(5, _MALE)
    _read_alike("seldon.ns.model.m.inputs", [(value, h, b"key", 1000) for h in headers], True)
    assert headers_of_poll(headers)[0] == [headers_of(h) for h in headers]


def test_without_ptars_a_poll_is_read_record_by_record_to_the_same_halves(monkeypatch: pytest.MonkeyPatch) -> None:
    """The daemon image has no seldon-arrow extra: its polls take the record-by-record path, to the same values."""
    poll: list[Raw] = [(_field(3, f"c{i}".encode()) + _field(5, _MALE), [("x-request-id", f"r{i}".encode())], None,
                        1000) for i in range(3)]  # fmt: skip
    with_arrow = read_halves("seldon", "seldon.ns.model.m.inputs", poll, {"m"})
    monkeypatch.setattr(seldon_batch, "arrow", lambda: False)
    assert seldon_batch.halves("seldon.ns.model.m.inputs", poll, {"m"}, None) is None
    assert read_halves("seldon", "seldon.ns.model.m.inputs", poll, {"m"}) == with_arrow


def test_a_poll_too_small_to_pay_for_the_batch_is_read_record_by_record(monkeypatch: pytest.MonkeyPatch) -> None:
    poll: list[Raw] = [(_field(3, f"c{i}".encode()) + _field(5, _MALE), [("x-request-id", f"r{i}".encode())], None,
                        1000) for i in range(3)]  # fmt: skip
    batched = read_halves("seldon", "seldon.ns.model.m.inputs", poll, {"m"})
    monkeypatch.setattr(seldon_batch, "FEWEST", 4)
    assert seldon_batch.halves("seldon.ns.model.m.inputs", poll, {"m"}, None) is None
    assert read_halves("seldon", "seldon.ns.model.m.inputs", poll, {"m"}) == batched
    assert seldon_batch.halves("seldon.ns.model.m.inputs", poll * 2, {"m"}, None) is not None


def test_joining_a_polls_halves_at_once_finds_the_pairs_and_counts_of_adding_each_in_turn() -> None:
    """Duplicates, another component's halves, a refused call's partner and a full join, in random orders."""
    rng, seen = random.Random(6), Counter[str]()
    for trial in range(30):
        halves = [Half(f"c{rng.randrange(12)}", rng.random() < 0.5, rng.choice(["m", "n"]), 1.0, 1, {},
                       component=rng.choice(["", "", "transformer"])) for _ in range(60)]  # fmt: skip
        one, each = PairJoin(60.0, max_pending=8 + trial % 10), PairJoin(60.0, max_pending=8 + trial % 10)
        one_counts, each_counts = Counter[str](), Counter[str]()
        for join, counts in ((one, one_counts), (each, each_counts)):
            join.refuse("m", "c3", 0.0, counts)
        found = [pair for h in halves if (pair := each.add(h, 1.0, each_counts)) is not None]
        assert one.add_all(halves, 1.0, one_counts) == found
        assert one_counts == each_counts and one.pending == each.pending and one.done == each.done
        assert found, trial
        seen += one_counts
    assert seen.keys() == {"duplicate_delivery", "other_component", "partner_refused", "pending_state_full"}
