"""A number beyond a float (exporter/stream/decode/bignum.py) on every path that reads an event: the staged router,
a proxy's columns, a body of many such numbers, and the oracle's own parse (tests/decode_oracle.py). Found by a
review of 6d484cc; each test failed there."""

from __future__ import annotations

from typing import Any

import orjson
from daemon_config import decoder_of, make_config
from decode_oracle import OracleDecoder
from test_decode_oracle import same

from exporter.config import Config, parse_config
from exporter.core.bisg import CATEGORIES
from exporter.stream.decode.bignum import BIG, rescued
from exporter.stream.decode.events import DecodedBatch, EventDecoder
from exporter.stream.decode.fleet import SharedDecoder
from exporter.stream.decode.outcomes import decode_outcomes
from exporter.stream.decode.route import Router
from exporter.stream.state.fleet import Fleet

NOW = 1_800_000_000.0
BASE = {"windows": ["10m", "1h"], "bucket": "1m", "allowed_lateness": "5m",
        "listen": {"address": "127.0.0.1", "port": 0}}  # fmt: skip
HIRING = {"model_id": "hiring", "protected_attributes": [{"name": "gender", "groups": ["male", "female"]}]}
CREDIT = {"model_id": "credit", "events": {"score_threshold": 0.5},
          "protected_attributes": [{"name": "gender", "groups": ["male", "female"]}]}  # fmt: skip
BIG_INT = b"9" * 400
"""A 400-digit integer: beyond a float (orjson refuses the body), but an exact int to msgspec's ``int`` and ``Any``."""


def fleet_config(*models: dict[str, Any]) -> Config:
    return parse_config({**BASE, "models": list(models)}, "bignum")


def alone(cfg: Config, model_id: str, values: list[bytes]) -> DecodedBatch:
    spec = next(m for m in cfg.models if m.model_id == model_id)
    return EventDecoder(spec, cfg.max_future_skew_seconds, keep_rejected=True).decode(values, NOW)


def test_staged_router_reads_a_400_digit_integer_model_id_as_no_model_id_where_every_decoder_says_malformed() -> None:
    """A fleet whose models' paths differ is split by route.Router, which reads the model id with msgspec into
    ``Any``: msgspec decodes a 400-digit integer (or one inside a list or an object) as an exact Python int, which
    made the event ignored as ``missing_model_id``. An id that is no text is now read as the rules read it:
    ``malformed_json``, as the model decoding alone, a shared-schema fleet and the oracle say."""
    other = {"model_id": "other", "events": {"prediction": "out"},
             "protected_attributes": [{"name": "gender", "groups": ["male", "female"]}]}  # fmt: skip
    routed = fleet_config(HIRING, other)
    shared = fleet_config(HIRING, CREDIT)
    for body in (b'{"model_id":%b,"timestamp":1799999990,"prediction":1}' % BIG_INT,
                 b'{"model_id":[%b],"timestamp":1799999990,"prediction":1}' % BIG_INT,
                 b'{"model_id":{"a":%b},"timestamp":1799999990,"prediction":1}' % BIG_INT):  # fmt: skip
        assert dict(alone(routed, "hiring", [body]).rejected) == {"malformed_json": 1}
        assert dict(OracleDecoder(make_config()).decode([body], NOW).rejected) == {"malformed_json": 1}
        fleet = Fleet(shared, keep_rejected=True)
        assert isinstance(fleet.readers[1], SharedDecoder)
        _, _, ignored, malformed = fleet.decode([body], NOW)
        assert (dict(ignored), malformed) == ({}, [body])
        fleet = Fleet(routed, keep_rejected=True)
        assert isinstance(fleet.readers[1], Router)
        _, batches, ignored, malformed = fleet.decode([body], NOW)
        assert (batches, dict(ignored), malformed) == ({}, {}, [body]), body[:20]


PROXY = {"name": "race", "groups": list(CATEGORIES), "proxy": {"method": "bisg", "surname": "last_name", "zcta": "zip"}}


def test_a_400_digit_integer_in_a_proxy_column_is_malformed_by_the_schema_and_the_walk_alike() -> None:
    """A proxy's surname and ZCTA columns were typed ``str | int | None`` in the schema, and msgspec decodes a
    400-digit integer into ``int`` exactly: the event was counted when the schema took it (prediction ``1``) and
    malformed when the walk did (``1.0``). The schema's integer is now an int64: any other is walked."""
    config = make_config(protected_attributes=[{"name": "gender", "groups": ["male", "female"]}, PROXY])
    for column in (b"zip", b"last_name"):
        reasons = []
        for prediction in (b"1.0", b"1"):
            body = (b'{"model_id":"m1","timestamp":1800000000,"prediction":%b,"attributes":{"gender":"male",'
                    b'"last_name":"Smith","zip":"60601","%b":%b}}' % (prediction, column, BIG_INT))  # fmt: skip
            got = decoder_of(config, keep_rejected=True).decode([body], NOW)
            reasons.append((len(got), dict(got.rejected)))
        assert reasons == [(0, {"malformed_json": 1})] * 2, column


def test_a_400_digit_integer_zcta_is_malformed_alone_and_in_the_fleet() -> None:
    """The same seen from a fleet: ``z`` is one model's proxy ZCTA and another's exact attribute, so the shared
    schema reads it as ``str | None`` and refuses the integer (walked: malformed_json), and the model's own schema
    refuses it as no int64 (walked alike)."""
    zone = {"name": "zone", "column": "z", "groups": ["60601", "10001"]}
    race = {"name": "race", "groups": list(CATEGORIES), "proxy": {"method": "bisg", "surname": "s", "zcta": "z"}}
    hiring = {"model_id": "hiring", "protected_attributes": [{"name": "gender", "groups": ["male", "female"]}, zone]}
    people = {"model_id": "people", "protected_attributes": [race]}
    cfg = fleet_config(hiring, people)
    body = b'{"model_id":"people","timestamp":1799999990,"prediction":1,"attributes":{"s":"Smith","z":%b}}' % BIG_INT
    want = alone(cfg, "people", [body])
    fleet = Fleet(cfg, keep_rejected=True)
    assert isinstance(fleet.readers[1], SharedDecoder)
    _, batches, _, _ = fleet.decode([body], NOW)
    got = batches["people"]
    assert (len(got), dict(got.rejected)) == (len(want), dict(want.rejected)) == (0, {"malformed_json": 1})


def test_any_number_of_numbers_beyond_a_float_unread_count_on_every_path() -> None:
    """The rescue once gave up after 64 such numbers (one parse each), while msgspec skips any number of them
    unread: the cap, not the rule, decided. They are now all found in one scan of the body."""
    many = b"[" + b",".join([b"1e400", b"-1E+999", b"9" * 400] * 700) + b"]"
    body = b'{"model_id":"m1","timestamp":1800000000,"prediction":1.0,"attributes":{"gender":"male"},"x":%b}' % many
    same(make_config(), [body])
    assert len(decoder_of(make_config()).decode([body], NOW)) == 1  # 1.0: walked (the schema reads 0 or 1)


def test_many_numbers_beyond_a_float_unread_count_alike_in_the_fleet_and_alone() -> None:
    """The same seen from a fleet: a scored model's event with a prediction it does not read (``1.0``) and 2,100
    unread numbers beyond a float counts alone (its schema skips both) and in a fleet with a prediction-reading
    model (the shared schema refuses ``1.0``: routed by route.model_of, then walked)."""
    many = b"[" + b",".join([b"1e400", b"-1E+999", b"9" * 400] * 700) + b"]"
    cfg = fleet_config(HIRING, CREDIT)
    body = (b'{"model_id":"credit","timestamp":1799999990,"score":0.7,"prediction":1.0,"attributes":{"gender":"male"},'
            b'"x":%b}' % many)  # fmt: skip
    assert (len(alone(cfg, "credit", [body])), dict(alone(cfg, "credit", [body]).rejected)) == (1, {})
    _, batches, _, malformed = Fleet(cfg, keep_rejected=True).decode([body], NOW)
    assert (len(batches.get("credit", [])), malformed) == (1, [])


def test_a_lone_surrogate_escape_after_a_number_beyond_a_float_is_malformed_in_the_oracle_too() -> None:
    """The oracle's tolerant parse (decode_oracle._tolerant) is Python's json, which accepts a lone surrogate escape
    (``"\\ud800"``) that orjson and msgspec refuse: it now refuses what orjson would."""
    body = b'{"model_id":"m1","timestamp":1800000000,"prediction":1,"x":1e400,"y":"\\ud800"}'
    assert dict(decoder_of(make_config()).decode([body], NOW).rejected) == {"malformed_json": 1}
    same(make_config(), [body])


def test_nesting_orjson_reads_after_a_number_beyond_a_float_counts_in_the_oracle_too() -> None:
    """Python's json raised RecursionError below orjson's depth of 1024: the oracle now reads as deep as orjson and
    no deeper (1023 levels under the event's own object: counted; 1024: malformed on both sides)."""
    for depth, rows in ((1023, 1), (1024, 0)):
        nested = b"[" * depth + b"]" * depth
        body = b'{"model_id":"m1","timestamp":1800000000,"prediction":1,"x":1e400,"n":%b}' % nested
        assert len(decoder_of(make_config()).decode([body], NOW)) == rows
        same(make_config(), [body])


def test_the_scan_steps_over_strings_and_refuses_a_number_as_a_key() -> None:
    """Digits inside a string (escaped quotes and backslashes, non-ASCII before them) are never taken for a number;
    a number where a key must be is no JSON, marker or not; an unclosed string after such a number is refused."""
    def parsed(body: bytes) -> object:
        try:
            return orjson.loads(body)
        except orjson.JSONDecodeError as exc:
            try:
                return rescued(exc)
            except orjson.JSONDecodeError:
                return "refused"

    assert parsed('{"a\\"1e400":[1e400,-2.5E+999,"x\\\\",3,"é\\"1e400"]}'.encode()) == {
        'a"1e400': [BIG, BIG, "x\\", 3, 'é"1e400']}  # fmt: skip
    assert parsed(b'{"a":-0e999,"b":1e-400,"c":1%b,"d":1%b}' % (b"0" * 308, b"0" * 309)) == {
        "a": -0.0, "b": 0.0, "c": 1e308, "d": BIG}  # fmt: skip
    for body in (b'{1e400:1}', b'{"a":1e400,"b":"\\ud800"}', b'{"a":1e400,"b":NaN}', b'{"a":1e400,}',
                 b'{"a":1e400.5}', b'{"x":1e400,"y":"' + b'\\"' * 1000, b'{"x":1e400,"y":"\\'):
        assert parsed(body) == "refused", body


def test_a_label_event_reads_a_number_beyond_a_float_as_an_event_does() -> None:
    """The labels topic's events by the same rule: such a number unread is skipped (the label counts, as the same
    label inline in an event does), in the id or the label it makes the label event invalid."""
    values = [b'{"prediction_id":"p1","label":1,"x":1e400}', b'{"prediction_id":"p2","label":1e400}',
              b'{"prediction_id":[1e400],"label":1}', b'{"prediction_id":"p3","label":true,"y":[%b]}' % BIG_INT,
              b'{"prediction_id":"p4","label":0,"x":1e400,"z":NaN}']  # fmt: skip
    got = decode_outcomes(values, "prediction_id", "label")
    assert (got.prediction_ids, got.outcomes, got.invalid, got.positions) == (["p1", "p3"], [1, 1], 3, [0, 3])
    inline = b'{"model_id":"m1","timestamp":1800000000,"prediction":1,"prediction_id":"p1","label":1,"x":1e400}'
    assert decoder_of(make_config()).decode([inline], NOW).outcomes.tolist() == [1]
