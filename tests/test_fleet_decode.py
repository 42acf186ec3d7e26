"""A fleet's shared parse reads each field once for the whole batch and splits it among the models by index arrays
(exporter/stream/decode/fleet.py): each model's batch must still be, column for column, what its own decoder gives
for the same values alone, whatever the batch mixes (events lacking the field one model needs, refused events,
other models', malformed values)."""

from __future__ import annotations

from collections import Counter
from typing import Any

import numpy as np
import orjson
import pytest

from exporter.config import parse_config
from exporter.stream.decode.events import DecodedBatch, EventDecoder
from exporter.stream.decode.fleet import SharedDecoder
from exporter.stream.state.fleet import Fleet

NOW = 1_800_000_000.0
CONFIG = parse_config({
    "windows": ["1h"], "bucket": "1m", "listen": {"address": "127.0.0.1", "port": 0},
    "models": [
        {"model_id": "hiring", "segments": ["channel"],
         "protected_attributes": [{"name": "gender", "groups": ["male", "female"]},
                                  {"name": "age", "groups": ["young", "old"]}]},
        {"model_id": "credit", "events": {"score_threshold": 0.5},
         "protected_attributes": [{"name": "gender", "groups": ["female", "male", "other"]},
                                  {"name": "region", "groups": ["north", "south"]}]},
        {"model_id": "moderation", "protected_attributes": [{"name": "language", "groups": ["en", "es"]}]},
    ]}, "test")  # fmt: skip


def event(model: str | None, n: int, **change: Any) -> bytes:
    """One event of ``model`` (its prediction and score both present), with ``change`` applied (None: dropped)."""
    body: dict[str, Any] = {"model_id": model, "prediction_id": f"{model}-{n}", "timestamp": NOW - 60 + n,
                            "prediction": n % 2, "score": (n % 10) / 10, "label": [None, 0, 1][n % 3],
                            "attributes": {"gender": ["male", "female", "other", "x"][n % 4],
                                           "age": ["young", "old"][n % 2], "region": ["north", "south"][n % 2],
                                           "language": ["en", "es", "fr"][n % 3], "channel": f"c{n % 3}"}}  # fmt: skip
    body.update(change)
    return orjson.dumps({k: v for k, v in body.items() if v is not None})


def batch(refused: bool) -> list[bytes | None]:
    """Every model's events, some lacking the prediction or the score (which only one of them needs), with
    future or unreadable timestamps, unknown group values, no attributes; another model's and one without a model
    id; with ``refused``, values the shared schema refuses too (malformed, a tombstone, a prediction of 1.0)."""
    values: list[bytes | None] = []
    for n in range(30):
        for model in ("hiring", "credit", "moderation"):
            change: dict[str, Any] = {}
            if n % 7 == 1:
                change["prediction"] = None  # missing_field for hiring and moderation, nothing for credit
            if n % 5 == 2:
                change["score"] = None  # missing_field for credit only
            if n % 11 == 3 or n == 8:  # n = 8 lacks its prediction too: future_timestamp comes first
                change["timestamp"] = NOW + 3600.0
            if n % 13 == 4:
                change["timestamp"] = "yesterday"  # invalid_timestamp
            if n % 9 == 5:
                change["attributes"] = None  # every attribute unknown
            if refused and n % 8 == 6:
                change["prediction"] = "1"  # invalid_prediction for hiring and moderation; credit reads its score
            values.append(event(model, n, **change))
        if n % 10 == 0:
            values += [event("not-ours", n), event(None, n)]
    if refused:
        values[5:5] = [b'{"model_id": "hiring", ', None, b"[1, 2]"]
    return values


def columns(b: DecodedBatch) -> dict[str, Any]:
    return {"timestamps": b.timestamps.tolist(), "predictions": b.predictions.tolist(), "scores": b.scores.tolist(),
            "outcomes": b.outcomes.tolist(), "ids": b.prediction_ids, "positions": b.positions.tolist(),
            "codes": {k: v.tolist() for k, v in b.codes.items()}, "segments": b.segments,
            "rejected_payloads": sorted(b.rejected_payloads, key=repr)}  # fmt: skip


@pytest.mark.parametrize("refused", [False, True], ids=["schema-valid", "with-refused-values"])
def test_each_models_share_of_a_shared_parse_equals_its_own_decoder_on_the_same_values(refused: bool) -> None:
    fleet = Fleet(CONFIG, keep_rejected=True)
    assert isinstance(fleet.readers[1], SharedDecoder)
    values = batch(refused)
    for _ in range(2):  # the same decoders again: nothing read for one batch leaks into the next
        _, batches, ignored, malformed = fleet.decode(values, NOW)  # type: ignore[arg-type]
        assert ignored == Counter(unconfigured_model=3, missing_model_id=3)
        assert len(malformed) == (3 if refused else 0)
        for spec in CONFIG.models:
            alone = EventDecoder(spec, CONFIG.max_future_skew_seconds, keep_rejected=True).decode(values, NOW)  # type: ignore[arg-type]
            got = batches[spec.model_id]
            assert got.rejected + Counter(malformed_json=len(malformed)) == alone.rejected
            malformed_letters = [(v, "malformed_json") for v in malformed]
            assert columns(got) | {"rejected_payloads": sorted(got.rejected_payloads + malformed_letters, key=repr)} \
                == columns(alone)  # fmt: skip
            assert len(got) + sum(got.rejected.values()) == 30  # each of its 30 events a row or a rejection


def test_a_shared_parse_splits_the_fields_each_model_lacks_by_its_own_rules() -> None:
    """The numbers themselves, for the batch with refused values: what each model counted and rejected."""
    _, batches, _, _ = Fleet(CONFIG).decode(batch(refused=True), NOW)  # type: ignore[arg-type]
    hiring, credit, moderation = batches["hiring"], batches["credit"], batches["moderation"]
    # future: n = 3, 8, 14, 25; unreadable: n = 4, 17; the rest by each model's own field
    assert credit.rejected == Counter(future_timestamp=4, invalid_timestamp=2, missing_field=5)  # 2, 7, 12, 22, 27
    assert hiring.rejected == Counter(future_timestamp=4, invalid_timestamp=2, missing_field=3,  # n = 1, 15, 29
                                      invalid_prediction=2)  # n = 6, 22 (14 is future)
    assert moderation.rejected == hiring.rejected
    assert credit.predictions.tolist() == (credit.scores >= 0.5).astype(np.int64).tolist()
    rows = {model: dict(zip(b.prediction_ids, b.codes["gender"].tolist(), strict=True)) for model, b in batches.items()
            if model != "moderation"}  # fmt: skip
    # male, no attributes, female, "other" (not hiring's group; credit's group "other", the value, under
    # unknown_values: reject), "x" (no group of either: unknown)
    assert [rows["hiring"][f"hiring-{n}"] for n in (0, 5, 9, 10, 11)] == [0, -1, 1, -1, -1]
    assert [rows["credit"][f"credit-{n}"] for n in (0, 5, 9, 10, 11)] == [1, -1, 0, 2, -1]
    channels = dict(zip(hiring.prediction_ids, hiring.segments["channel"], strict=True))
    assert [channels[f"hiring-{n}"] for n in (0, 5, 9, 10)] == ["c0", None, "c0", "c1"]
