"""A payload half too large for one internal record travels in pieces (exporter/stream/stages/halves.py) and is put
together again whole, through a snapshot and past pieces sent again."""

from __future__ import annotations

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
    assert first.add(records[0], np.ones(1, dtype=bool)) == []
    second = Pieces()  # another replica, restored from the first one's snapshot
    second.restore(first.state())
    assert second.add(records[1], np.ones(1, dtype=bool)) == []
    assert second.add(records[2], np.ones(1, dtype=bool)) == [text.decode()]
    assert not second.parts
