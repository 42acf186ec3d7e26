"""A payload half too large for one internal record travels in pieces (exporter/stream/stages/halves.py) and is put
together again whole, through a snapshot and past pieces sent again."""

from __future__ import annotations

from collections import Counter

import numpy as np

from exporter.stream.stages.halves import PIECE_BITS, Pieces, piece_rows, pieces_of
from exporter.stream.stages.records import Kind, decode, encode_rows


def test_pieces_never_cut_a_character_and_join_to_the_text() -> None:
    text = ("é€𝄞a" * 1000).encode()
    pieces = pieces_of(text, 7)
    assert "".join(pieces) == text.decode() and all(len(p.encode()) <= 7 for p in pieces)


def test_a_half_in_pieces_is_whole_once_its_last_piece_is_in_even_across_a_snapshot() -> None:
    text = ('["m","call-1",false,null,3,{"x":["' + "y" * 2_500_000 + '"]},{},null]').encode()
    table, texts = piece_rows([(0, 41, text)])
    assert table["position"].tolist() == [(41 << PIECE_BITS) + j for j in range(len(texts))] and len(texts) == 3
    meta = {"sources": [["payloads", 0, "log"]]}
    records = [decode(v) for v in encode_rows(Kind.PIECES, meta, table, texts)]
    assert len(records) == 3  # one piece a record, each under the record limit
    first = Pieces()
    assert first.add(records[0], np.ones(1, dtype=bool), 0.0, 10, Counter()) == []
    second = Pieces()  # another replica, restored from the first one's snapshot
    second.restore(first.state(), 5.0)
    assert second.add(records[1], np.ones(1, dtype=bool), 1.0, 10, Counter()) == []
    assert second.add(records[2], np.ones(1, dtype=bool), 2.0, 10, Counter()) == [text.decode()]
    assert not second.parts


def _first_pieces(offsets: list[int]) -> list:
    """The first PIECES record of a half at each source offset (the rest never sent)."""
    out = []
    for offset in offsets:
        table, texts = piece_rows([(0, offset, b'["m","c",false,null,1,{"x":["' + b"y" * 2_000_000 + b'"]},{},null]')])
        out.append(decode(encode_rows(Kind.PIECES, {"sources": [["payloads", 0, "log"]]}, table, texts)[0]))
    return out


def test_halves_in_part_beyond_the_bound_give_up_the_oldest_counted_as_pending_state_full() -> None:
    pieces, unmatched = Pieces(), Counter[str]()
    for t, record in enumerate(_first_pieces([1, 2, 3])):
        assert pieces.add(record, np.ones(1, dtype=bool), float(t), 2, unmatched) == []
    assert [k[-1] for k in pieces.parts] == ["2", "3"] and unmatched == Counter(pending_state_full=1)


def test_the_time_of_a_half_in_part_survives_a_snapshot_and_expiry_gives_it_up_after_the_horizon() -> None:
    pieces, unmatched = Pieces(), Counter[str]()
    pieces.add(_first_pieces([1])[0], np.ones(1, dtype=bool), 100.0, 10, unmatched)
    restored = Pieces()
    restored.restore(pieces.state(), 150.0)
    restored.expire(159.0, 60.0, unmatched)
    assert restored.parts and not unmatched  # 59 s after its first piece: waits on
    restored.expire(161.0, 60.0, unmatched)
    assert not restored.parts and not restored.since and unmatched == Counter(pieces_missing=1)
