"""A DataFrame column of objects that are not all strings, as MLServer's ``PandasCodec`` sends it (BYTES with
``parameters.content_type: pd_json``, each element JSON text), read as the values MLServer's decoder gives back, in
every reader (exporter/stream/payloads/oip.py ``json_tensor`` / ``proto_body``, kserve_batch.py, seldon_batch.py);
an element that is no JSON is refused. The records are made by MLServer's own codecs (tests/platform_payloads.py
in .venv-platforms)."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import orjson
import pytest
from payload_logs import cloudevent, platform_records

from exporter.config import parse_config
from exporter.stream.payloads import kserve_batch, seldon_batch
from exporter.stream.payloads.oip import messages
from exporter.stream.payloads.payload import PairJoin, PayloadRows, Raw, read_halves

T = 1_800_000_000.0


@pytest.mark.parametrize(("form", "raw"), [("json", False), ("proto", False), ("proto", True)])
def test_an_object_column_mlserver_sends_as_pd_json_is_read_as_the_values_mlserver_decodes(
    tmp_path: Path, form: str, raw: bool,
) -> None:  # fmt: skip
    """MLServer's ``PandasCodec`` (mlserver/codecs/pandas.py ``_to_response_output``) sends an object column holding
    anything but strings (here one row's gender as a number, as ``read_csv`` makes a mixed column) as BYTES with
    ``parameters.content_type: pd_json``: each element JSON-encoded (``encode_to_json``), so ``female`` travels as
    ``"female"`` with its quotes; its own decoder (``_to_series``: ``decode_json_input_or_output``) loads each element
    back. Read so, in REST JSON and in protobuf (typed and raw contents), each row lands in its group, not every row
    in the unknown one."""
    call = {"model": "income", "namespace": "prod", "id": "r1", "pipeline": None, "partition": 0,
            "columns": {"gender": ["female", "male", 2], "age": [30, 40, 50]}, "scores": [0.2, 0.7, 0.9],
            "json": form == "json", "raw": raw}  # fmt: skip
    (in_topic, _, request), (out_topic, _, response) = platform_records("seldon", [call], tmp_path)
    halves = []
    for topic, (value, headers, key) in ((in_topic, request), (out_topic, response)):
        read = read_halves("seldon", topic, [(value, headers, key, int(T * 1000))], {"income"})
        assert read.rejected == []
        halves += read.halves
    assert halves[0].columns["gender"] == ["female", "male", 2]  # what PandasCodec.decode_request gives back
    config = parse_config({"model_id": "income", "events": {"format": "seldon", "prediction": "proba",
                                                            "score_threshold": 0.5},
                           "kafka": {"topic": in_topic},
                           "protected_attributes": [{"name": "gender", "groups": ["female", "male"]}]})  # fmt: skip
    pairs = PairJoin(600.0).add_all(halves, T, Counter())
    batch, refused = PayloadRows(config.models[0], 300.0).batch(pairs, T)
    assert refused == []
    assert batch.codes["gender"].tolist() == [0, 1, -1]  # female, male, a value outside the groups


def _mixed(n: int, form: str, raw: bool = False) -> list[dict[str, Any]]:
    """n calls whose gender column holds a number among its strings: MLServer sends it as pd_json."""
    return [{"model": "income", "namespace": "prod", "id": f"r{k}", "pipeline": None, "partition": 0,
             "columns": {"gender": ["female", "male", k], "age": [30, 40, 50 + k]}, "scores": [0.2, 0.7, 0.9],
             "json": form == "json", "raw": raw} for k in range(n)]  # fmt: skip


def _pd_json_request(elements: list[bytes], raw: bool) -> bytes:
    """A ModelInferRequest of one BYTES tensor of MLServer's pd_json holding these elements as they are."""
    request = messages()[0](model_name="income", id="r1")
    tensor = request.inputs.add(name="gender", datatype="BYTES", shape=[len(elements), 1])
    tensor.parameters["content_type"].string_param = "pd_json"
    if raw:
        request.raw_input_contents.append(b"".join(len(e).to_bytes(4, "little") + e for e in elements))
    else:
        tensor.contents.bytes_contents.extend(elements)
    return request.SerializeToString()  # type: ignore[no-any-return]


@pytest.mark.parametrize("element", [b"female", b"NaN", b"", b"\"a\" \"b\"", b"18446744073709551616000"])
@pytest.mark.parametrize("form", ["json", "proto", "raw"])
def test_a_pd_json_element_that_is_no_json_is_refused_not_guessed(tmp_path: Path, form: str, element: bytes) -> None:
    """An element of a pd_json tensor that MLServer's decoder could not load (text without its quotes, no value,
    two values), one of the constants Python's ``json`` reads but JSON has not (``NaN``), or an integer beyond what
    the exporter writes back as JSON: the record is refused as ``malformed_payload``, its element never counted as
    the text it is."""
    topic = "seldon.prod.model.income.inputs"
    if form == "json":
        ((_, _, (value, _, _)), _) = platform_records("seldon", _mixed(1, "json"), tmp_path)
        body = orjson.loads(value)
        body["inputs"][0]["data"][0] = element.decode()
        value = orjson.dumps(body)
    else:
        value = _pd_json_request([b'"male"', element], raw=form == "raw")
    read = read_halves("seldon", topic, [(value, [], b"r1", int(T * 1000))], {"income"})
    assert (read.halves, [reason for _, reason, _, _ in read.rejected]) == ([], ["malformed_payload"])


def test_a_pd_json_element_holding_a_list_or_an_object_is_one_cell(tmp_path: Path) -> None:
    """A pd_json element is one row's value whatever JSON it holds: a list is not spread over the tensor's rows."""
    value = _pd_json_request([b'["female", 1]', b'{"g": "male"}', b"null"], raw=False)
    read = read_halves("seldon", "seldon.prod.model.income.inputs", [(value, [], b"r1", -1)], {"income"})
    assert (read.halves[0].rows, read.halves[0].columns) == (3, {"gender": [["female", 1], {"g": "male"}, None]})


def test_a_kserve_poll_of_pd_json_bodies_is_read_in_one_pass_as_record_by_record(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    """MLServer's REST bodies logged by KServe (an InferenceService on the kserve-mlserver runtime): the one-pass
    reader decodes the pd_json column to the values the record-by-record path gives."""
    monkeypatch.setattr(kserve_batch, "_FEWEST", 1)
    records: list[Raw] = []
    for (_, _, (request, _, _)), (_, _, (response, _, _)), call in zip(
            *[iter(platform_records("seldon", _mixed(6, "json"), tmp_path))] * 2, _mixed(6, "json"),
            strict=True):  # fmt: skip
        for answer, body in ((False, request), (True, response)):
            assert body is not None
            records.append((*cloudevent("income", call["id"], answer, body, T), -1))
    taken = kserve_batch.halves(records, {"income"}, None)
    assert taken is not None
    monkeypatch.setattr(kserve_batch, "halves", lambda *_: None)
    alone = read_halves("kserve", "kserve-log", records, {"income"})
    assert repr(taken[0]) == repr(alone.halves) and alone.rejected == []
    assert [h.columns["gender"] for h in alone.halves if not h.response][2] == ["female", "male", 2]


def test_a_seldon_poll_of_pd_json_tensors_is_read_record_by_record_to_the_same_halves(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    """The one-pass protobuf reader leaves a poll holding a pd_json tensor to the record-by-record path, which
    decodes it; a poll without one it still takes."""
    monkeypatch.setattr(seldon_batch, "FEWEST", 1)
    topic = "seldon.prod.model.income.inputs"
    for raw in (False, True):
        records = [(value, headers, key, int(T * 1000)) for t, _, (value, headers, key)
                   in platform_records("seldon", _mixed(4, "proto", raw), tmp_path) if t == topic]  # fmt: skip
        assert seldon_batch.halves(topic, records, {"income"}, None) is None
        read = read_halves("seldon", topic, records, {"income"})
        assert [h.columns["gender"] for h in read.halves] == [["female", "male", k] for k in range(4)]
    plain = [(value, headers, key, -1) for t, _, (value, headers, key) in platform_records("seldon", [
        {**c, "columns": {"gender": ["female", "male", "x"]}} for c in _mixed(4, "proto")], tmp_path) if t == topic]
    assert seldon_batch.halves(topic, plain, {"income"}, None) is not None or not seldon_batch.arrow()
