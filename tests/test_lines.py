"""Batches parsed as lines: the same structs as one value at a time, in one msgspec call per run of accepted
lines, so a refused event costs a call more and not the whole batch's fall to one call per event."""

from __future__ import annotations

import json
from typing import Any

import msgspec
from hypothesis import given
from hypothesis import strategies as st

from exporter.stream.lines import decode_lines, decode_one, joined_lines


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


@given(values)
def test_lines_give_the_structs_of_one_value_at_a_time(batch: list[bytes]) -> None:
    joined = joined_lines(batch)
    assert joined is not None
    counting = Counting()
    got = decode_lines(counting, joined, len(batch))  # type: ignore[arg-type]
    one = [decode_one(counting.decoder, v) for v in batch]
    if got is None:  # an unclosed object ran on into the next line: the caller goes value by value
        assert any(v.count(b"{") > v.count(b"}") for v in batch)
        return
    assert got == one
    refused = sum(s is None for s in one)
    assert counting.calls <= 1 + 2 * refused  # a run of accepted lines in one call, and one more per refusal


def test_a_batch_that_cannot_be_lines_is_none() -> None:
    assert joined_lines([b'{"a":1}', None]) is None  # a tombstone
    assert joined_lines([b'{"a":1}', b""]) is None  # an empty value: a blank line would be skipped
    decoder = msgspec.json.Decoder(Event)
    for newline_inside in ([b'{"a":\n1}'], [b'{"a":1}', b'{"a":\n1}'], [b'{"a":"\xc3\xa9",\n"b":null}']):
        joined = joined_lines(newline_inside)
        assert joined is not None and decode_lines(decoder, joined, len(newline_inside)) is None
    assert joined_lines([b'{"a":1}', b'{"a":2}']) == b'{"a":1}\n{"a":2}'
