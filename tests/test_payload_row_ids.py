"""A payload batch's rows' prediction ids are made when first read (exporter/stream/payloads/ids.py): the same ids
as the list they were (``<call>:<row>`` in a call of several rows, the call's id alone in a call of one), read
any way a consumer reads them, and not made by a daemon that reads none (no label or side join)."""

from __future__ import annotations

import pytest

from exporter.stream.payloads.ids import RowIds


@pytest.mark.parametrize(("rows", "want"), [
    ([2, 2], ["a:0", "a:1", "b:0", "b:1"]),
    ([1, 3], ["a", "b:0", "b:1", "b:2"]),
    ([1, 1], ["a", "b"]),
])  # fmt: skip
def test_row_ids_are_the_calls_ids_with_each_rows_suffix_read_any_way(rows: list[int], want: list[str]) -> None:
    ids = RowIds(["a", "b"], rows, len(want))
    assert len(ids) == len(want) and ids._made is None  # a length asks for no id
    assert ids == want and want == ids and list(ids) == want and ids != want[:-1]
    assert [ids[k] for k in range(len(want))] == want and ids[-1] == want[-1] and ids[1:3] == want[1:3]
    assert list(zip(ids, range(len(want)), strict=True)) == list(zip(want, range(len(want)), strict=True))
    assert ids == RowIds(["a", "b"], rows, len(want)) and repr(ids) == repr(want)
    with pytest.raises(TypeError):
        hash(ids)  # a list's: unhashable


def test_a_daemon_without_a_join_never_makes_them() -> None:
    from exporter.config import parse_config
    from exporter.stream.payloads.payload import PayloadRows
    from exporter.stream.payloads.platforms import Half

    model = parse_config({"model_id": "credit", "events": {"format": "kserve", "prediction": "predict"},
                          "protected_attributes": [{"name": "gender", "groups": ["male", "female"]}]}).models[0]
    rows = PayloadRows(model, 300.0)
    request = Half("c1", False, "credit", 1.0, 2, {"gender": ["male", "female"]}, b"", {}, None)
    response = Half("c1", True, "credit", 1.0, 2, {"predict": [1, 0]}, b"", {}, None)
    batch, refused = rows.batch([(request, response)], 10.0)
    assert not refused and batch.codes["gender"].tolist() == [0, 1]
    assert isinstance(batch.prediction_ids, RowIds) and batch.prediction_ids._made is None
    assert batch.prediction_ids == ["c1:0", "c1:1"]
