"""A poll of KServe CloudEvents is read in one pass (exporter/stream/payloads/kserve_batch.py: msgspec's typed decoder,
the attributes column by column) into exactly what reading each record alone gives: the same halves, refusals,
records ignored and positions; a poll it does not certify is read record by record. The oracle is
``read_halves`` with the one-pass reader switched off."""

from __future__ import annotations

import random
import uuid
from collections.abc import Collection, Mapping
from pathlib import Path

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from payload_logs import cloudevent, gzipped, numpy_response, pandas_request, platform_records

from exporter.stream.decode.route import UNCONFIGURED
from exporter.stream.payloads import kserve_batch
from exporter.stream.payloads.payload import Halves, Raw, read_halves
from exporter.stream.payloads.platforms import headers_of_poll
from exporter.stream.payloads.polls import header_table

T0 = 1_796_000_000.0


@pytest.fixture(autouse=True)
def _small_polls_batched(monkeypatch: pytest.MonkeyPatch) -> None:
    """The batch reads polls of any size the same: small ones here (the module reads them one by one)."""
    monkeypatch.setattr(kserve_batch, "_FEWEST", 1)


def _alone(records: list[Raw], models: Collection[str], counted: Mapping[str, str] | None = None) -> Halves:
    """``read_halves`` of each record read on its own (the record-by-record path)."""
    saved = kserve_batch.halves
    kserve_batch.halves = lambda *_: None  # type: ignore[assignment]
    try:
        return read_halves("kserve", "kserve", records, models, counted=counted)
    finally:
        kserve_batch.halves = saved


def _same(records: list[Raw], models: Collection[str], counted: Mapping[str, str] | None = None) -> bool:
    """Whether the one-pass reader took the poll; either way ``read_halves`` equals the record-by-record read."""
    taken = kserve_batch.halves(records, models, counted) is not None
    fast, alone = read_halves("kserve", "kserve", records, models, counted=counted), _alone(records, models, counted)
    assert fast == alone
    # and of the same types (1 == 1.0, but not in its repr); the ignored counts as a dict: a Counter's repr orders
    # tied counts as they were first counted, which the two paths do in different orders
    assert repr(fast.halves) == repr(alone.halves) and dict(fast.ignored) == dict(alone.ignored)
    assert repr((fast.rejected, fast.at, fast.rejected_at)) == repr((alone.rejected, alone.at, alone.rejected_at))
    return taken


def _sdk_polls(tmp_path: Path) -> list[Raw]:
    rng = random.Random(7)
    calls = []
    for k in range(40):
        n = rng.randint(1, 5)
        calls.append({"model": ("credit", "loans", "other")[k % 3], "topic": "kserve", "id": str(uuid.uuid4()),
                      "components": [["predictor"], ["transformer", "predictor"]][k % 2], "time": T0 + k * 0.37,
                      "columns": {"gender": [rng.choice(["male", "female", "ünknown"]) for _ in range(n)],
                                  "age": [rng.randint(-(2**40), 2**40) for _ in range(n)]},
                      "predictions": [rng.randint(0, 1) for _ in range(n)],
                      "metadata": {"X-Region": [rng.choice(["north", "south"])]} if k % 4 else {}})  # fmt: skip
    return [(value, headers, key, 1_800_000_000_000 + i)
            for i, (_, _, (value, headers, key)) in enumerate(platform_records("kserve", calls, tmp_path))]


def test_a_poll_made_by_the_kserve_sdk_is_read_in_one_pass_as_each_record_alone(tmp_path: Path) -> None:
    records = _sdk_polls(tmp_path)
    for models, counted in (({"credit"}, None), ({"credit", "loans"}, None), ({"credit", "loans", "other"}, None),
                            ({"credit", "loans"}, {"credit": "transformer"}), ({"nobody"}, None)):  # fmt: skip
        fast = kserve_batch.halves(records, models, counted)
        assert fast is not None
        alone = _alone(records, models, counted)
        assert (fast[0], fast[1], fast[2]) == (alone.halves, alone.at, alone.ignored)
        assert repr(fast[0]) == repr(alone.halves)
        assert not alone.rejected
        assert _same(records, models, counted)
    assert len(_alone(records, {"credit"}).halves) == 2 * 14 + 2 * 7  # one or two components log each call


def _mlserver_poll(rng: random.Random, n: int) -> list[Raw]:
    out: list[Raw] = []
    for i in range(n):
        pid, rows = f"call-{rng.getrandbits(40)}", rng.randint(1, 4)
        body = pandas_request({"gender": [rng.choice(["male", "female"]) for _ in range(rows)],
                               "income": [rng.random() * 1e5 for _ in range(rows)]})  # fmt: skip
        answer = numpy_response("credit", pid, "predict", [rng.randint(0, 1) for _ in range(rows)])
        for response, payload in ((False, body), (True, answer)):
            value, headers, key = cloudevent("credit", pid, response, orjson.dumps(payload), T0 + i * 0.001,
                                             metadata={"X-Region": ["north"]})  # fmt: skip
            out.append((value, headers, key, 1_800_000_000_000 + i))
    return out


_BODY_DEFECTS: list[bytes] = [
    b'{"inputs":[{"name":"gender","shape":[1,1],"datatype":"BYTES","data":["male"]}],"x":"\xff"}',  # skipped, not UTF-8
    b'{"inputs":[{"name":"n","shape":[1],"datatype":"INT64","data":[18446744073709551616]}]}',  # beyond 64 bits
    b'{"inputs":[{"name":"n","shape":[1],"datatype":"INT64","data":[-9223372036854775809]}]}',
    b'{"inputs":[{"name":"n","shape":[1],"datatype":"FP64","data":[0.10000000000000000555]}]}',  # 19 digits, exact
    b'{"inputs":[{"name":"n","shape":[1.0],"datatype":"FP64","data":[1]}]}',
    b'{"inputs":[{"name":"n","shape":[2],"datatype":"FP64","data":[[1],[2]]}]}',
    b'{"inputs":[{"name":"n","shape":[1,2],"datatype":"FP64","data":[1,2]}]}',
    b'{"inputs":[{"name":"n","shape":[2,1],"datatype":"FP64","data":[[1],[2]]}]}',
    b'{"inputs":[{"name":"g","shape":[1],"datatype":"BYTES","parameters":{"content_type":"base64"},"data":["eA=="]}]}',
    b'{"inputs":[{"name":"g","shape":[1],"datatype":"BYTES","parameters":["x"],"data":["x"]}]}',
    b'{"inputs":[{"name":"g","shape":[1],"datatype":"BYTES","parameters":null,"data":["x"]}]}',
    b'{"inputs":[{"name":"g","shape":[1],"datatype":"STRING","data":["x"]}]}',
    b'{"inputs":[{"name":"g","shape":[1],"datatype":["BYTES"],"data":["x"]}]}',
    b'{"inputs":[{"name":"a","shape":[1],"datatype":"FP64","data":[1]},{"name":"b","shape":[2],"datatype":"FP64",'
    b'"data":[1,2]}]}',
    b'{"inputs":[{"name":"a","shape":[1],"datatype":"FP64","data":[1]},{"name":"a","shape":[1],"datatype":"FP64",'
    b'"data":[2]}]}',
    b'{"inputs":[],"inputs":[{"name":"a","shape":[1],"datatype":"FP64","data":[{"k":1,"k":2}]}]}',
    b'{"inputs":null}', b'{"inputs":[]}', b'{"instances":[{"sex":"male"}]}', b'{"predictions":[1]}', b"[]", b"1",
    b'{"outputs":[{"name":"predict","shape":[1],"datatype":"INT64","data":[1]}]}',
    b'{"inputs":[{"name":"\xc3\xa9","shape":[1],"datatype":"BYTES","data":["\xe2\x82\xac\\ud83d\\ude00"]}]}',
    b'{"inputs":[{"name":"n","shape":[1],"datatype":"FP64","data":[NaN]}]}', b'{"inputs":[]} x', b'{"inputs":[]}\n ',
    b'{"inputs":[{"name":"n","shape":[1],"datatype":"FP64","data":[' + b"[" * 1010 + b"]" * 1010 + b"]}]}",
    b'{"inputs":[{"name":"n","shape":[1],"datatype":"FP64","data":["\\ud800"]}]}', b"\xef\xbb\xbf{}", b"",
    b'{"inp\\u0075ts":[{"name":"a","shape":[4],"datatype":"FP64","data":[1.5e-400,-1e-400,4.9e-324,1E+2]}]}',
    b'{"inputs":[{"name":"a","shape":[2],"datatype":"FP64","data":[-1e309,1]}]}', b'\t{"inputs" : [ ] }\r\n',
    b'{"inputs":[{"name":"a","shape":[1],"datatype":"BYTES","data":["\\u0000\\/"],"name":"b"}],"inputs":5}',
    # MLServer's pd_json: each element JSON text, loaded (or the body refused) alike
    b'{"inputs":[{"name":"g","shape":[3,1],"datatype":"BYTES","parameters":{"content_type":"pd_json"},'
    b'"data":["\\"male\\"","2","[1,{\\"a\\":null}]"]}]}',
    b'{"inputs":[{"name":"g","shape":[2,1],"datatype":"BYTES","parameters":{"content_type":"pd_json"},'
    b'"data":[["\\"male\\""],["1.5"]]}]}',
    b'{"inputs":[{"name":"g","shape":[1],"datatype":"BYTES","parameters":{"content_type":"pd_json"},"data":["male"]}]}',
    b'{"inputs":[{"name":"g","shape":[1],"datatype":"BYTES","parameters":{"content_type":"pd_json"},"data":[2]}]}',
    b'{"inputs":[{"name":"g","shape":[1],"datatype":"BYTES","parameters":{"content_type":"pd_json"},"data":["NaN"]}]}',
    b'{"inputs":[{"name":"g","shape":[1],"datatype":"INT64","parameters":{"content_type":"pd_json"},"data":[1]}]}',
    # numbers beyond a float in fields msgspec skips (orjson refuses the body)
    b'{"inputs":[{"name":"g","shape":[1],"datatype":"BYTES","data":["male"],"parameters":{"threshold":1e400}}]}',
    b'{"p":1e309,"inputs":[{"name":"g","shape":[1],"datatype":"BYTES","data":["male"]}]}',
    b'{"inputs":[{"name":"g","shape":[1],"datatype":"BYTES","data":["male"],"z":-1E+400}]}',
    b'{"inputs":[{"name":"g","shape":[1],"datatype":"BYTES","data":["male"]}],"q":[[{"a":[1.8e308]}]]}',
    b'{"inputs":[{"name":"g","shape":[1],"datatype":"BYTES","data":["male"]}],"q":123456789012345678e300}',
    b'{"inputs":[{"name":"g","shape":[1],"datatype":"BYTES","data":["male"]}],"q":[1,\n2e0400]}',
]


def _mutated(rng: random.Random, record: Raw) -> Raw:
    value, headers, key, ms = record
    assert value is not None and headers is not None
    headers = list(headers)
    kind = rng.randrange(12)
    if kind == 0:
        value = rng.choice(_BODY_DEFECTS)
    elif kind == 1:  # a byte flipped, cut short, a piece doubled
        at = rng.randrange(len(value))
        value = rng.choice([value[:at] + bytes([rng.randrange(256)]) + value[at + 1 :], value[:at],
                            value[:at] + value[at // 2 :]])  # fmt: skip
    elif kind == 2:
        value = gzipped(value)
    elif kind == 3:  # an attribute changed, dropped, not UTF-8, upper-case
        at = rng.randrange(len(headers))
        name, old = headers[at]
        headers[at] = rng.choice([(name, b""), (name, b"\xff"), (name.upper(), old), (name, old + b"x"),
                                  (name, b"org.kubeflow.serving.inference.response"),
                                  (name, b"2026-12-02T04:18:34+05:30"), (name, b"not a time"), (name, b"{"),
                                  (name, b'{"A": ["1"], "b": "c"}')])  # fmt: skip
        if rng.random() < 0.3:
            del headers[at]
    elif kind == 4:
        headers.append(rng.choice([("content-encoding", b"gzip"), ("content-type", b"application/cloudevents+json"),
                                   ("ce_contentencoding", b"identity"), ("content-type", b"text/plain; gzip")]))
    elif kind == 5:
        ms = rng.choice([-1, 0, 5])
    return value, headers, key, ms


def test_fuzzed_polls_read_in_one_pass_or_record_by_record_are_read_alike() -> None:
    rng = random.Random(11)
    taken = [0, 0]
    for _ in range(160):
        records = _mlserver_poll(rng, rng.randint(1, 12))
        if rng.random() < 0.8:
            records = [_mutated(rng, r) if rng.random() < 0.15 else r for r in records]
        if rng.random() < 0.2:
            records += [(*cloudevent("other", "x", False, b"\xff", T0), 5)]  # ignored, never read
        taken[_same(records, rng.choice([{"credit"}, {"credit", "other"}]),
                    rng.choice([None, {"credit": "predictor"}, {"credit": "transformer"}]))] += 1  # fmt: skip
    assert min(taken) > 20, taken  # both paths taken often


@pytest.mark.parametrize("body", _BODY_DEFECTS)
def test_each_defect_in_a_poll_reads_as_the_record_alone(body: bytes) -> None:
    records = _mlserver_poll(random.Random(5), 3)
    records[2] = (body, *records[2][1:])
    _same(records, {"credit"})


def test_a_usual_poll_in_the_bench_layout_is_taken() -> None:
    records = _mlserver_poll(random.Random(6), 20)
    assert _same(records, {"credit"})
    halves = read_halves("kserve", "kserve", records, {"credit"}).halves
    assert len(halves) == 40 and halves[0].time == T0 and halves[0].metadata == {"x-region": "north"}


def test_another_components_unreadable_records_leave_the_poll_to_the_one_pass_reader() -> None:
    """A transformer's records (a JPEG request, its answer) in a poll of a model that counts its predictor: ignored
    by their ``ce_component`` header before any body is read, in one pass as record by record."""
    records = _mlserver_poll(random.Random(12), 4)
    for response, body in ((False, b"\xff\xd8\xff\xe0 a JPEG"), (True, b'{"predictions": [1]}')):
        value, headers, key = cloudevent("credit", "call-t", response, body, T0)
        records.append((value, [(k, b"transformer" if k == "ce_component" else v) for k, v in headers], key, 5))
    assert _same(records, {"credit"}, {"credit": "predictor"})
    assert read_halves("kserve", "kserve", records, {"credit"}, counted={"credit": "predictor"}).ignored == {
        "other_component": 2}  # fmt: skip


def test_a_poll_with_nothing_of_the_models_counted_is_all_ignored() -> None:
    records = _mlserver_poll(random.Random(8), 3)
    assert kserve_batch.halves(records, {"else"}, None) == ([], [], {UNCONFIGURED: 6})
    assert _same(records, {"else"})


def test_a_small_poll_is_read_record_by_record(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(kserve_batch, "_FEWEST", 16)
    records = _mlserver_poll(random.Random(9), 7)
    assert kserve_batch.halves(records, {"credit"}, None) is None
    assert kserve_batch.halves(_mlserver_poll(random.Random(9), 8), {"credit"}, None) is not None
    _same(records, {"credit"})



def test_hex_ids_and_small_exponents_keep_a_poll_in_one_pass() -> None:
    """The check for numbers beyond a float falls back only on a number: an exponent-like run inside a string (a
    hex id such as ``5e812``, as in a v2 response's id) or a number of a small or negative exponent is read in one
    pass, the same as each record alone."""
    records = _mlserver_poll(random.Random(10), 20)
    odd = b'{"id":"a5e8123","x":"5e812","y":[1e-400,1e99,2.5E+30],"inputs":[{"name":"gender","shape":[1],' \
          b'"datatype":"BYTES","data":["male"]}]}'  # fmt: skip
    records[0] = (odd, *records[0][1:])
    assert _same(records, {"credit"})


_NAMES = ["ce_id", "ce_type", "CE_ID", "content-type", "x", "1", "ce_time"]
_VALUES = st.one_of(st.none(), st.binary(max_size=3))


@given(st.lists(st.one_of(st.none(), st.lists(st.tuples(st.sampled_from(_NAMES), _VALUES), max_size=5)), min_size=1,
                max_size=6),
       st.lists(st.sampled_from(["ce_id", "ce_type", "content-type", "x", "ce_time"]), unique=True, max_size=5),
       st.lists(st.lists(_VALUES, min_size=5, max_size=5), min_size=1, max_size=6), st.booleans(),
       st.booleans())  # fmt: skip
@settings(max_examples=400, deadline=None)
def test_header_columns_read_each_header_as_its_records_dict_does(raws: list, layout: list[str],
                                                                  values: list[list], usual: bool,
                                                                  reordered: bool) -> None:  # fmt: skip
    """By position when every record has the same names in the same order (``usual``: records of one ``layout``,
    perhaps one more from ``raws``, or the last with its names in another order), else through each record's dict:
    the same values either way."""
    if usual:
        raws = [list(zip(layout, row, strict=False)) for row in values] + raws[:1] * (len(values) % 2)
        if reordered and len(raws) > 1 and raws[-1]:
            raws[-1] = list(zip(layout[::-1], [v for _, v in raws[-1]], strict=False))
    dicts, names = headers_of_poll(raws)
    wanted = [*_NAMES, "ce_id", "absent"]
    found, found_names = header_table(raws, wanted)
    assert found == {name: [d.get(name) for d in dicts] for name in wanted}
    assert found_names == names
