"""The Seldon batch reader's buffer-level shortcuts (exporter/stream/payloads/seldon_batch.py) against the plain
reading they stand for: strings told apart by comparing an Arrow array's buffers with its first record's repeated
(``_encoded``) against Arrow's dictionary encoding, and the records framed in one message (``frame_records``)
against each record's frame and bytes joined."""

from __future__ import annotations

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from exporter.stream.payloads import polls

_TEXT = st.text(alphabet=st.sampled_from("ab\u00e9\u4e2d"), max_size=3)


def _decoded(strings: pa.Array, width: int) -> tuple[list[str], bool]:
    codes, dictionary = polls.encoded(strings, width)
    return [dictionary[c] for c in codes.tolist()], len(dictionary) == width and codes[:width].tolist() == list(
        range(width))  # fmt: skip


@given(st.lists(_TEXT, min_size=1, max_size=4), st.integers(1, 6), st.integers(0, 2),
       st.one_of(st.none(), st.tuples(st.integers(0, 30), _TEXT)))  # fmt: skip
@settings(max_examples=400, deadline=None)
def test_each_string_is_read_back_whether_the_records_repeat_the_first_or_not(
    first: list[str], n: int, skip: int, changed: tuple[int, str] | None
) -> None:
    """Records repeating the first record's strings (perhaps one string changed: another text, length or both), in
    an array sliced past ``skip`` strings as a struct's child is: every code names its own string."""
    strings = [*(["zz"] * skip), *(first * n)]
    if changed is not None:
        at, text = changed
        strings[skip + at % (len(strings) - skip)] = text
    array = pa.array(strings, pa.string()).slice(skip)
    found, _ = _decoded(array, len(first))
    assert found == strings[skip:]


@pytest.mark.parametrize("width", [1, 2, 3])
def test_repeated_records_are_told_by_position(width: int) -> None:
    names = ["gender", "region", ""][:width]
    found, by_position = _decoded(pa.array(names * 500, pa.string()), width)
    assert found == names * 500
    assert by_position


def test_a_record_that_differs_in_one_byte_is_encoded_by_arrow() -> None:
    strings = ["gender", "region"] * 300
    strings[401] = "regiom"  # the same lengths, so the same offsets: only the bytes tell it
    found, by_position = _decoded(pa.array(strings, pa.string()), 2)
    assert found == strings
    assert not by_position  # three distinct strings


@given(st.lists(st.integers(0, 20_000), min_size=1, max_size=40).map(lambda sizes: [b"\x08" * s for s in sizes]))
@settings(max_examples=60, deadline=None)
def test_the_framed_records_are_each_records_frame_and_bytes(values: list[bytes]) -> None:
    expected = b"".join(polls.frame(len(v)) + v for v in values)
    assert polls.frame_records(values) == expected
    sizes = list(map(len, values))
    assert polls.frame_records(values, sizes, max(sizes)) == expected
