"""The msgspec decoder against today's dict-walk decoder (tests/decode_oracle.py) on generated corpora: the same
rows in the same order, the same rejection reasons, the same dead letters, on every input."""

from __future__ import annotations

import json
from collections import Counter
from datetime import datetime

import numpy as np
from daemon_config import decoder_of, make_config
from decode_oracle import OracleDecoder
from hypothesis import example, given, settings
from hypothesis import strategies as st

from exporter.config import Config
from exporter.stream.decode.events import EventDecoder
from exporter.stream.decode.fleet import SharedDecoder
from exporter.stream.decode.route import Router
from exporter.stream.state.fleet import Fleet

NOW = 1_800_000_000.0

BEYOND = "\x01beyond\x01"
"""Written by :func:`dumps` as a number beyond a float: valid JSON that orjson refuses and msgspec skips unread."""
LITERALS = ["1e400", "-1E+999", "9" * 400, "1.5e309", "-" + "7" * 5000]
scalars = (st.none() | st.booleans() | st.integers(-(2**65), 2**65) | st.floats(allow_nan=False, allow_infinity=False)
           | st.text(max_size=10) | st.just(BEYOND))  # fmt: skip
json_values = st.recursive(scalars, lambda inner: st.lists(inner, max_size=3)
                           | st.dictionaries(st.text(max_size=8), inner, max_size=3), max_leaves=8)  # fmt: skip
stamps = (st.floats(NOW - 7200, NOW + 7200) | st.integers(int(NOW) - 7200, int(NOW) + 7200)
          | st.datetimes().map(lambda d: d.isoformat()) | st.datetimes().map(lambda d: d.isoformat(sep=" ") + "Z")
          | st.sampled_from(["2027-01-15T08:00:00Z", "2027-01-15t08:00:00z", "2027-01-15T08:00:00.9999999Z",
                             "2027-01-15", "20270115T080000Z", "2027-01-15T08:00:00+0100", "2027-01-15T08:00Z",
                             "2027-01-15T08:00:00,5Z", "2027-01-15T08"])
          # the edges of years 1 and 9999 as numbers: the last microsecond of 9999 rounds up to year 10000
          | st.sampled_from([253402300800, 253402300800.0, 253402300799, 253402300799.99997, -62135596800,
                             -62135596800.00002, -62135596801])
          | json_values)  # fmt: skip
binary = st.sampled_from([0, 1, 0.0, 1.0, True, False, None, "1", 2, -0.0])
ids = (st.text(max_size=300) | st.integers(-(2**64), 2**64) | st.sampled_from(["p" * 256, "p" * 257, "é" * 256])
       | json_values)  # fmt: skip
groups = st.sampled_from(["male", "female", "young", "old", "None", "1", 1, None, "robot"]) | json_values


attributes = st.fixed_dictionaries({}, optional={"gender": groups, "age": groups, "other": json_values})


def events() -> st.SearchStrategy[dict[str, object]]:
    return st.fixed_dictionaries({}, optional={
        "model_id": st.sampled_from(["m1", "m1", "m2"]) | json_values, "prediction_id": ids, "timestamp": stamps,
        "prediction": binary | json_values,
        "score": st.floats(-0.5, 1.5) | binary | json_values, "label": binary | json_values,
        "attributes": attributes | json_values, "extra": json_values,
    })  # fmt: skip


def dumps(value: object) -> bytes:
    """JSON of any generated value (integers beyond 64 bits too, which orjson cannot write; :data:`BEYOND` as
    numbers beyond a float, in turn each of :data:`LITERALS`)."""
    parts = json.dumps(value, ensure_ascii=False).split(json.dumps(BEYOND))
    return "".join(part + (LITERALS[k % len(LITERALS)] if k < len(parts) - 1 else "")
                   for k, part in enumerate(parts)).encode()  # fmt: skip


def same(config: Config, values: list[bytes | None], decoder: EventDecoder | None = None) -> None:
    got = (decoder or decoder_of(config, keep_rejected=True)).decode(values, NOW)  # type: ignore[arg-type]
    want = OracleDecoder(config, keep_rejected=True).decode(values, NOW)  # type: ignore[arg-type]
    assert (got.rejected, got.ignored, got.rejected_payloads) == (want.rejected, want.ignored, want.rejected_payloads)
    assert got.timestamps.tolist() == want.timestamps.tolist()
    assert got.predictions.tolist() == want.predictions.tolist() and got.predictions.dtype == np.int64
    assert got.outcomes.tolist() == want.outcomes.tolist()
    assert got.prediction_ids == want.prediction_ids
    assert [type(i) for i in got.prediction_ids] == [type(i) for i in want.prediction_ids]
    assert got.codes.keys() == want.codes.keys()
    for name in got.codes:
        assert got.codes[name].tolist() == want.codes[name].tolist(), name
    threshold = config.model().events.score_threshold
    if threshold is None:
        assert len(got.scores) == 0
    else:  # the scores of the accepted events, which the oracle did not keep: each one decides its prediction
        assert len(got.scores) == len(got) and (got.predictions == (got.scores >= threshold)).all()


mixed = st.lists(events().map(dumps) | st.binary(max_size=60) | st.none()
                 | events().map(lambda e: dumps(e)[:-3]), max_size=25)  # fmt: skip


@settings(max_examples=400, deadline=None)
@given(mixed)
@example([b'{"model_id": "m1", "timestamp": -62135596801}'])  # a second before year 1 and no prediction: one reason
def test_default_paths(values: list[bytes | None]) -> None:
    same(make_config(), values)


@settings(max_examples=200, deadline=None)
@given(mixed)
def test_score_threshold_and_other_group_and_intersection(values: list[bytes | None]) -> None:
    same(make_config(events={"score_threshold": 0.5}, unknown_values="other", intersections=[["gender", "age"]]),
         values)


def nest(event: dict[str, object]) -> dict[str, object]:
    """The same event with its fields under nested paths (see the config below)."""
    out: dict[str, object] = {"meta": {}, "out": {}}
    for key, value in event.items():
        if key in ("model_id", "timestamp"):
            out["meta"][key] = value  # type: ignore[index]
        elif key in ("prediction", "score"):
            out["out"][key] = value  # type: ignore[index]
        else:
            out[key] = value
    return out


NESTED = {"model_id": "meta.model_id", "timestamp": "meta.timestamp", "prediction": "out.prediction",
          "score": "out.score", "attributes": "who.attrs"}  # fmt: skip


@settings(max_examples=300, deadline=None)
@given(st.lists(events().map(nest) | json_values | events(), max_size=20))
def test_nested_paths(values: list[object]) -> None:
    for event in values:
        if isinstance(event, dict) and "attributes" in event:
            event["who"] = event.get("who") if isinstance(event.get("who"), dict) else {"attrs": event["attributes"]}
    same(make_config(events=NESTED), [dumps(v) for v in values])


def test_examples_with_extra_fields_and_duplicate_keys() -> None:
    values = [
        b'{"model_id":"m1","timestamp":1800000000,"prediction":1,"attributes":{"gender":"male","gender":"female"}}',
        b'{"model_id":"m2","model_id":"m1","timestamp":1800000000,"prediction":1}',
        b'{"model_id":"m1","timestamp":1800000000,"prediction":1,"x":[1,{"y":"\\u00e9"}],"attributes":null}',
        b'{"model_id":"m1","timestamp":"2027-01-15T08:00:00.9999999Z","prediction":1,"prediction_id":9223372036854775808}',
        b'{"model_id":"m1","timestamp":1800000000,"prediction":1,"prediction_id":18446744073709551616}',
        b'{"model_id":"m1","timestamp":1800000000,"prediction":1,"x":"\xff"}',
    ]
    same(make_config(), values)  # type: ignore[arg-type]


def test_a_number_beyond_a_float_is_malformed_only_in_a_field_read() -> None:
    """orjson refuses a number beyond the float range anywhere in an event; msgspec skips a field its schema does not
    read without converting it. Such an event (valid JSON: RFC 8259 sets no range) counts whichever parser takes it
    (a field the schema reads refused for another reason sends it to the walk); in a field the rules read, at any
    depth, it is malformed_json. The oracle reads it with Python's json, the decoder with orjson's error position."""
    config = make_config()
    unread = [b'{"model_id":"m1","timestamp":1800000000,"prediction":1,"x":1e400}',
              b'{"model_id":"m1","timestamp":1800000000,"prediction":1.0,"x":[{"y":-1E+999}],"attributes":{"z":1e999}}',
              b'{"model_id":"m1","timestamp":1800000000,"prediction":1,"attributes":{"gender":5},"x":%b}' % (b"9"*400,),
              b'{"model_id":"m2","timestamp":1e400,"prediction":1}']  # another model's: its fields are not m1's
    read = [b'{"model_id":"m1","timestamp":1e400,"prediction":1}',
            b'{"model_id":"m1","timestamp":1800000000,"prediction":[1e400],"x":2}',
            b'{"model_id":"m1","timestamp":1800000000,"prediction":1,"attributes":{"gender":{"a":[1e400]}}}',
            b'{"model_id":"m1","timestamp":1800000000,"prediction":1,"attributes":1e400}',
            b'{"model_id":1e400,"timestamp":1800000000,"prediction":1}',
            b'{"model_id":"m1","timestamp":1800000000,"prediction":1,"label":1e400,"x":1e400}',
            b'{"model_id":"m1","timestamp":1800000000,"prediction":1,"x":1e400,"y":NaN}']  # fmt: skip
    got = decoder_of(config, keep_rejected=True).decode(unread + read, NOW)  # type: ignore[arg-type]
    assert len(got) == 3 and dict(got.rejected) == {"malformed_json": len(read)} and dict(got.ignored) == {
        "unconfigured_model": 1}  # fmt: skip
    assert got.codes["gender"].tolist() == [-1, -1, -1]
    same(config, unread + read)  # type: ignore[arg-type]


# Mostly clean batches, as a topic of one model carries: the decoder's fast paths (the strict schema, timestamps of
# one ISO layout computed with numpy) take them whole, and a defect anywhere sends the batch the general way.
layouts = st.sampled_from(["%Y-%m-%dT%H:%M:%S.%fZ", "%Y-%m-%dT%H:%M:%SZ", "%Y-%m-%dT%H:%M:%S.%f+05:30",
                           "%Y-%m-%dT%H:%M:%S-08:00", "%Y-%m-%dT%H:%M:%S.%f", "%Y-%m-%dT%H:%M:%S"])  # fmt: skip
clean_attributes = st.fixed_dictionaries({}, optional={"gender": st.sampled_from(["male", "female", None]),
                                                       "age": st.sampled_from(["young", "old"])})  # fmt: skip


@st.composite
def clean_batches(draw: st.DrawFn) -> list[bytes | None]:
    layout = draw(layouts)
    n = draw(st.integers(1, 12))
    stamp = st.datetimes(datetime(1990, 1, 1), datetime(2030, 1, 1)).map(lambda d: d.strftime(layout))
    values: list[bytes | None] = [dumps({
        "model_id": "m1", "timestamp": draw(stamp), "prediction": draw(st.sampled_from([0, 1])),
        "label": draw(st.sampled_from([None, 0, 1])), "prediction_id": draw(st.text(max_size=5) | st.integers()),
        "attributes": draw(clean_attributes), "note": draw(st.text(max_size=4)),
    }) for _ in range(n)]  # fmt: skip
    defect = draw(st.sampled_from(["none", "none", "model", "group", "utf8", "stamp", "number", "future"]))
    at = draw(st.integers(0, n - 1))
    event = json.loads(values[at])  # type: ignore[arg-type]
    if defect == "model":
        event["model_id"] = "m2"
    elif defect == "group":
        event["attributes"] = {"gender": "robot"}
    elif defect == "stamp":
        event["timestamp"] = event["timestamp"].replace("T", " ")[:-1] + "x"
    elif defect == "number":
        event["timestamp"] = NOW - 5
    elif defect == "future":
        event["timestamp"] = "2099-01-01T00:00:00Z"
    values[at] = dumps(event) if defect != "utf8" else dumps(event)[:-1] + b',"x":"\xff\xfe"}'
    return values


@settings(max_examples=300, deadline=None)
@given(st.lists(clean_batches(), min_size=1, max_size=4))
def test_clean_batches_one_decoder_after_another(batches: list[list[bytes | None]]) -> None:
    """One decoder over several batches (it remembers which schema refused a batch), each against the oracle."""
    config = make_config()
    decoder = decoder_of(config, keep_rejected=True)
    for values in batches:
        same(config, values, decoder)


FLEET = {"models": [{"model_id": "m1"},  # the shared config's gender and age
                    {"model_id": "m2", "protected_attributes": [{"name": "gender", "groups": ["male", "female"]}],
                     "events": {"score_threshold": 0.5}}]}  # fmt: skip


ROUTED = {"models": [{"model_id": "m1", "events": NESTED},  # one id path; the others differ: routed by the id alone
                     {"model_id": "m2", "protected_attributes": [{"name": "gender", "groups": ["male", "female"]}],
                      "events": {**NESTED, "score": "out.s2", "score_threshold": 0.5}}]}  # fmt: skip


def fleet_agrees(fleet_config: dict[str, object], split: type, values: list[bytes | None]) -> None:
    """Each model's rows, reasons and dead letters in the fleet are those of the oracle for that model alone; what
    is nobody's is counted once."""
    fleet = Fleet(make_config(model_id=None, **fleet_config), keep_rejected=True)
    assert isinstance(fleet.readers[1], split)
    _, batches, ignored, malformed = fleet.decode(values, NOW)  # type: ignore[arg-type]
    accounted = len(malformed) + sum(ignored.values())
    for model_id in ("m1", "m2"):
        alone = make_config(model_id=None, models=[m for m in fleet_config["models"]  # type: ignore[attr-defined]
                                                   if m["model_id"] == model_id])  # fmt: skip
        want = OracleDecoder(alone, keep_rejected=True).decode(values, NOW)  # type: ignore[arg-type]
        got = batches[model_id] if model_id in batches else decoder_of(alone).decode([], NOW)
        assert got.rejected + Counter(malformed_json=len(malformed)) == want.rejected
        assert sorted(got.rejected_payloads + [(v or b"", "malformed_json") for v in malformed]) == \
            sorted((v or b"", r) for v, r in want.rejected_payloads)  # fmt: skip
        assert (got.timestamps.tolist(), got.predictions.tolist(), got.outcomes.tolist(), got.prediction_ids) == \
            (want.timestamps.tolist(), want.predictions.tolist(), want.outcomes.tolist(), want.prediction_ids)
        assert {k: v.tolist() for k, v in got.codes.items()} == {k: v.tolist() for k, v in want.codes.items()}
        accounted += len(got) + sum(got.rejected.values())
    assert accounted == len(values)  # every value a row, a rejection, malformed or nobody's: exactly once


@given(st.lists(events().map(dumps) | st.binary(max_size=60) | st.none(), max_size=25))
def test_a_fleets_shared_parse_gives_each_model_what_its_own_decoder_gives(values: list[bytes | None]) -> None:
    """One parse for models that share their paths (one of them deriving predictions from scores)."""
    fleet_agrees(FLEET, SharedDecoder, values)


@settings(max_examples=200, deadline=None)
@given(st.lists(events().map(nest).map(dumps) | events().map(lambda e: {**nest(e), "meta": e.get("model_id")})
                .map(dumps) | json_values.map(dumps) | st.binary(max_size=60) | st.none(), max_size=25))
def test_a_fleet_routed_by_a_nested_model_id_gives_each_model_what_its_own_decoder_gives(
        values: list[bytes | None]) -> None:  # fmt: skip
    """Models whose other paths differ, routed by the nested model id alone (exporter/stream/decode/route.py),
    ``meta`` an object or any other JSON value (a review found ``{"meta": 5}`` malformed when routed, ignored
    alone)."""
    fleet_agrees(ROUTED, Router, values)
