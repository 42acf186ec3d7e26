"""The fleet's shared decoding against each model's own where their columns cross roles (a segment that is another
model's attribute or side id, a proxy's ZCTA another's exact attribute), and the window's add with late events
against the same events added one by one: pinned by a review of the fleet's one-pass decoding (0b8345e). Beside
them, the disagreement that review found: a number beyond a float in a field nobody reads, where the shared schema
and a model's own judge the event differently (exporter/stream/decode/bignum.py)."""

from __future__ import annotations

from typing import Any

import numpy as np
import orjson

from exporter.config import Config, parse_config
from exporter.stream.decode.events import DecodedBatch, EventDecoder
from exporter.stream.decode.fleet import SharedDecoder
from exporter.stream.state.fleet import Fleet
from exporter.stream.state.window import WindowStore

NOW = 1_800_000_000.0
BASE = {"windows": ["10m", "1h"], "bucket": "1m", "allowed_lateness": "5m",
        "listen": {"address": "127.0.0.1", "port": 0}}  # fmt: skip


def config(*models: dict[str, Any]) -> Config:
    return parse_config({**BASE, "models": list(models)}, "review7")


def alone(cfg: Config, model_id: str, values: list[bytes | None]) -> DecodedBatch:
    spec = next(m for m in cfg.models if m.model_id == model_id)
    return EventDecoder(spec, cfg.max_future_skew_seconds, keep_rejected=True).decode(values, NOW)  # type: ignore[arg-type]


HIRING = {"model_id": "hiring", "protected_attributes": [{"name": "gender", "groups": ["male", "female"]}]}
CREDIT = {"model_id": "credit", "events": {"score_threshold": 0.5},
          "protected_attributes": [{"name": "gender", "groups": ["male", "female"]}]}  # fmt: skip


def test_a_number_beyond_a_float_unread_counts_alike_in_the_fleet_and_alone() -> None:
    """(a) A scored model's event that also carries a prediction it does not read (1.0: the shared schema of a fleet
    with a prediction-reading model refuses it, so the fleet routes it by orjson) and an unread ``1e400``. (b) A
    segment that is another model's side id (the shared schema reads ``12`` as an id, the model's own refuses it, so
    alone it is walked), and an unread 400-digit integer. Both counted, the same row, fleet or alone: before, (a)
    was malformed_json in the fleet only and (b) alone only. (c) The same number in a field read: malformed both
    ways."""
    people = {"model_id": "people", "attribute_sources": {"applicants": {"topic": "side", "id": "applicant_id"}},
              "protected_attributes": [{"name": "sex", "groups": ["m", "f"], "source": "applicants"}]}
    moderation = {"model_id": "moderation", "segments": ["applicant_id"],
                  "protected_attributes": [{"name": "language", "groups": ["en", "es"]}]}  # fmt: skip
    cases = [
        (config(HIRING, CREDIT), "credit", b'{"model_id":"credit","timestamp":1799999990,"score":0.7,"prediction":1.0,'
                                           b'"attributes":{"gender":"male"},"x":1e400}', 1),
        (config(people, moderation), "moderation", b'{"model_id":"moderation","timestamp":1799999990,"prediction":1,'
                                                    b'"attributes":{"language":"en","applicant_id":12},"x":'
                                                    + b"9" * 400 + b"}", 1),
        (config(HIRING, CREDIT), "credit", b'{"model_id":"credit","timestamp":1799999990,"score":0.7,"prediction":1.0,'
                                           b'"attributes":{"gender":-1E+999}}', 0),
        (config(people, moderation), "moderation", b'{"model_id":"moderation","timestamp":1799999990,"prediction":1,'
                                                    b'"attributes":{"language":"en","applicant_id":[1e400]}}', 0),
    ]  # fmt: skip
    for cfg, model_id, value, rows in cases:
        want = alone(cfg, model_id, [value])
        assert (len(want), dict(want.rejected)) == (rows, {} if rows else {"malformed_json": 1})
        fleet = Fleet(cfg, keep_rejected=True)
        assert isinstance(fleet.readers[1], SharedDecoder)
        _, batches, _, malformed = fleet.decode([value], NOW)
        got = batches.get(model_id)
        found = (0, 0) if got is None else (len(got), got.rejected["malformed_json"])
        assert (found[0], found[1] + len(malformed)) == (rows, 1 - rows)
        if rows:
            assert got is not None and got.timestamps.tolist() == want.timestamps.tolist() == [1799999990.0]
            assert got.predictions.tolist() == want.predictions.tolist() == [1]
            assert {k: v.tolist() for k, v in got.codes.items()} == {k: v.tolist() for k, v in want.codes.items()}
            assert got.segments == want.segments


def test_fleet_columns_equal_each_models_own_including_side_ids_scores_proxies_and_segments() -> None:
    """Models whose columns cross roles in the shared schema (a segment that is another's attribute or side id, a
    proxy ZCTA that is another's exact attribute): every column of each model's share, side ids and scores
    included, equals its own decoder's."""
    cfg = config(
        {"model_id": "hiring", "segments": ["channel", "region"],
         "protected_attributes": [{"name": "gender", "groups": ["male", "female"]},
                                  {"name": "zone", "column": "z", "groups": ["60601", "10001"]}]},
        {"model_id": "credit", "events": {"score_threshold": 0.5}, "segments": ["applicant_id"],
         "protected_attributes": [{"name": "gender", "groups": ["female", "male", "other"]},
                                  {"name": "region", "groups": ["north", "south"]}]},
        {"model_id": "people", "attribute_sources": {"applicants": {"topic": "side", "id": "applicant_id"}},
         "protected_attributes": [{"name": "sex", "groups": ["m", "f"], "source": "applicants"},
                                  {"name": "race", "groups": ["white", "black"],
                                   "proxy": {"method": "bisg", "surname": "s", "zcta": "z"}}]},
    )  # fmt: skip
    rng = np.random.default_rng(7)
    values: list[bytes | None] = []
    for n in range(120):
        body = {"model_id": ["hiring", "credit", "people", "other"][n % 4], "prediction_id": f"p{n}",
                "timestamp": NOW - 600 + n if n % 17 else NOW + 900, "label": [None, 0, 1][n % 3],
                "attributes": {"gender": ["male", "female", "other", None][n % 4], "z": ["60601", 60601, None][n % 3],
                               "region": ["north", "south", 3][n % 3], "channel": f"c{n % 2}",
                               "applicant_id": ["a1", 12, None, "b" * 300][n % 4],
                               "s": ["Smith", "Garcia", None][n % 3]}}  # fmt: skip
        if n % 5:
            body["prediction"] = int(rng.integers(0, 2)) if n % 11 else 1.0
        if n % 7:
            body["score"] = float(rng.choice([0.1, 0.5, 0.9]))
        values.append(orjson.dumps(body))
    values[9:9] = [None, b"{", b"[1]"]
    fleet = Fleet(cfg, keep_rejected=True)
    assert isinstance(fleet.readers[1], SharedDecoder)
    _, batches, _, malformed = fleet.decode(values, NOW)  # type: ignore[arg-type]
    for spec in cfg.models:
        want, got = alone(cfg, spec.model_id, values), batches[spec.model_id]
        assert got.timestamps.tolist() == want.timestamps.tolist()
        assert got.predictions.tolist() == want.predictions.tolist()
        assert got.outcomes.tolist() == want.outcomes.tolist()
        assert got.scores.tolist() == want.scores.tolist()
        assert got.prediction_ids == want.prediction_ids
        assert got.positions.tolist() == want.positions.tolist()
        assert {k: v.tolist() for k, v in got.codes.items()} == {k: v.tolist() for k, v in want.codes.items()}
        assert got.segments == want.segments and got.side_ids == want.side_ids
        assert dict(got.rejected) | {"malformed_json": got.rejected["malformed_json"] + len(malformed)} == \
            dict(want.rejected) | {"malformed_json": want.rejected["malformed_json"]}  # fmt: skip
        assert len(got) > 0


def test_window_add_with_late_events_counts_what_on_time_events_one_by_one_count() -> None:
    """The add masks only when an event is late: a batch mixing late and on-time events (scores, the estimation
    and calibration counts, segments) leaves every array as the on-time events added one at a time."""
    metrics = [{"name": "calibration_difference", "threshold": 0.1}, {"name": "auc_difference", "threshold": 0.1}]
    attributes = [{"name": "gender", "groups": ["female", "male"]}, {"name": "region", "groups": ["n", "s", "e"]}]
    spec = parse_config({**BASE, "models": [{
        "model_id": "credit", "events": {"score_threshold": 0.5}, "segments": ["channel"], "metrics": metrics,
        "protected_attributes": attributes}]}, "r").models[0]  # fmt: skip
    windowing = parse_config({**BASE, "models": [HIRING]}, "r").windowing
    rng = np.random.default_rng(3)
    n = 200
    ts = NOW - rng.random(n) * 9000  # about a third older than the ring (1h + 5m)
    codes = {"gender": rng.integers(-1, 2, n), "region": rng.integers(-1, 3, n)}
    scores = rng.choice([0.0, 0.3, 0.5, 0.8, 1.0], n)
    predictions, outcomes = (scores >= 0.5).astype(np.int64), rng.choice([-1, 0, 1], n)
    whole, single = WindowStore(spec, windowing), WindowStore(spec, windowing)
    channels = [("a", "b", None)[k] for k in rng.integers(0, 3, n).tolist()]
    late = whole.add(ts, codes, predictions, outcomes, NOW, scores=scores,
                     segment_codes=whole.segments.codes({"channel": channels}))  # fmt: skip
    assert 0 < late < n
    counted = 0
    for k in range(n):
        one = slice(k, k + 1)
        counted += single.add(
            ts[one],
            {a: c[one] for a, c in codes.items()},
            predictions[one],
            outcomes[one],
            NOW,
            scores=scores[one],
            segment_codes=single.segments.codes({"channel": channels[k : k + 1]}),
        )
    assert counted == late
    a, b = whole.state(), single.state()
    assert a.keys() == b.keys()
    for key in a:
        assert np.allclose(a[key], b[key], rtol=0, atol=1e-9, equal_nan=True) if a[key].dtype.kind == "f" \
            else np.array_equal(a[key], b[key]), key  # fmt: skip


def _verdicts(decoded: tuple[Any, dict[str, DecodedBatch], Any, list[Any]]) -> set[str]:
    _, batches, ignored, malformed = decoded
    counted = {f"counted by {m}" for m, b in batches.items() if len(b.timestamps)}
    rejected = {r for b in batches.values() for r in b.rejected} | ({"malformed_json"} if malformed else set())
    return counted | set(ignored) | rejected


def test_a_dotted_model_id_of_another_shape_is_judged_alike_routed_shared_and_alone() -> None:
    """A model id path ``meta.model`` and an event whose ``meta`` is no object (``5``, ``[1]``): each model alone and
    the shared decoder ignore it as missing_model_id; the Router (models whose other paths differ) rejected it as
    malformed_json, msgspec's ValidationError being a DecodeError. Each event alone, every path the same verdict."""
    body = b'"timestamp":1799999990,"prediction":1,"out":{"p":1},"attributes":{"gender":"male"}'
    events = [b'{"meta":5,' + body + b"}", b'{"meta":[1],' + body + b"}", b'{"meta":null,' + body + b"}",
              b'{"meta":{"model":7},' + body + b"}", b'{"meta":{"model":"z"},' + body + b"}", b"[1]", b"5", b"{x",
              b'{"meta":{"model":"a"},' + body + b"}"]  # fmt: skip
    gender = [{"name": "gender", "groups": ["male", "female"]}]
    a = {"model_id": "a", "events": {"model_id": "meta.model"}, "protected_attributes": gender}
    routed = config(a, {"model_id": "b", "events": {"model_id": "meta.model", "prediction": "out.p"},
                        "protected_attributes": gender})  # fmt: skip
    shared = config(a, {"model_id": "b", "events": {"model_id": "meta.model"}, "protected_attributes": gender})
    for cfg, split in ((routed, "Router"), (shared, "SharedDecoder")):
        fleet = Fleet(cfg, keep_rejected=True)
        assert type(fleet.readers[1]).__name__ == split
        for event in events:
            alone_a = alone(cfg, "a", [event])
            expected = {"counted by a"} if len(alone_a.timestamps) else set(alone_a.ignored) | set(alone_a.rejected)
            assert _verdicts(fleet.decode([event], NOW)) == expected, (split, event)
    assert [_verdicts(Fleet(routed, keep_rejected=True).decode([e], NOW)) for e in events[:2]] == \
        [{"missing_model_id"}] * 2  # fmt: skip
