"""Batches parsed as lines: the same structs as one value at a time, in one msgspec call per run of accepted
lines, so a refused event costs a call more and not the whole batch's fall to one call per event."""

from __future__ import annotations

import json
from typing import Any

import msgspec
from hypothesis import given
from hypothesis import strategies as st

from exporter.stream.decode.lines import MAX_REFUSED, MAX_REFUSED_SHARE, RUN, decode_lines, decode_one, joined_lines


class Event(msgspec.Struct):
    a: int
    b: str | None = None


values = st.lists(
    st.sampled_from([b'{"a":1}', b'{"a":2,"b":"x"}', b'{"a":"1"}', b"[1]", b'{"a":1', b"nope", b'{"a":3}x',
                     b'{"a":1,"b":"\xff"}', b'{"a":1,"c":"\xe9t\xc3\xa9"}', b'{"a":1,"b":"\xc3\xa9"}', b"{}"])
    | st.integers(-5, 5).map(lambda i: json.dumps({"a": i}).encode()),
    min_size=1, max_size=30)  # fmt: skip


class Counting:
    """A decoder that counts its batch calls."""

    def __init__(self) -> None:
        self.decoder = msgspec.json.Decoder(Event)
        self.calls = 0

    def decode_lines(self, buffer: bytes) -> list[Any]:
        self.calls += 1
        return self.decoder.decode_lines(buffer)

    def decode(self, buffer: bytes) -> Any:  # one value (past the cap): not a batch call
        return self.decoder.decode(buffer)


@given(values)
def test_lines_give_the_structs_of_one_value_at_a_time(batch: list[bytes]) -> None:
    joined = joined_lines(batch)
    assert joined is not None
    counting = Counting()
    got = decode_lines(counting, joined, len(batch))  # type: ignore[arg-type]
    one = [decode_one(counting.decoder, v) for v in batch]
    refused = sum(s is None for s in one)
    if got is None:  # an unclosed object ran on into the next line: the caller goes value by value
        assert any(v.count(b"{") > v.count(b"}") for v in batch)
        return
    assert got == one
    cap = MAX_REFUSED + len(batch) * MAX_REFUSED_SHARE
    assert len(batch) <= RUN  # so what follows a refusal fits in one run: the failed call, its prefix, the next run
    assert counting.calls <= 1 + 3 * min(refused, cap + 1)


def test_a_batch_that_cannot_be_lines_is_none() -> None:
    assert joined_lines([b'{"a":1}', None]) is None  # a tombstone
    assert joined_lines([b'{"a":1}', b""]) is None  # an empty value: a blank line would be skipped
    decoder = msgspec.json.Decoder(Event)
    for newline_inside in ([b'{"a":\n1}'], [b'{"a":1}', b'{"a":\n1}'], [b'{"a":"\xc3\xa9",\n"b":null}']):
        joined = joined_lines(newline_inside)
        assert joined is not None and decode_lines(decoder, joined, len(newline_inside)) is None
    assert joined_lines([b'{"a":1}', b'{"a":2}']) == b'{"a":1}\n{"a":2}'


def test_past_a_few_percent_of_refusals_the_rest_is_decoded_value_by_value_and_nothing_is_lost() -> None:
    good, bad = b'{"a":1,"b":"\xc3\xa9"}', b'{"a":"1"}'  # non-ASCII: the line bounds are known from the start
    batch = [bad if i % 3 == 0 else good for i in range(300)]  # 100 refusals: far past the cap
    joined = joined_lines(batch)
    assert joined is not None
    got = decode_lines(msgspec.json.Decoder(Event), joined, len(batch))
    assert got == [None if v == bad else Event(1, "é") for v in batch]
