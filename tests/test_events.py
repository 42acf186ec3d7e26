"""The event decoder: every valid event becomes a row, every invalid one is counted under its reason."""

from __future__ import annotations

import orjson
import pytest
from daemon_config import decoder_of, event, make_config
from hypothesis import given, settings
from hypothesis import strategies as st

from exporter.stream.decode.events import REJECT_REASONS

NOW = 1_800_000_000.0


def decode(*events: object, **config: object):
    raw = [e if isinstance(e, bytes) else orjson.dumps(e) for e in events]
    return decoder_of(make_config(**config), keep_rejected=True).decode(raw, NOW)


def test_valid_events_become_columns_with_codes_per_attribute() -> None:
    batch = decode(event("male", "old", 1, label=1), event("female", "young", 0),
                   event("female", "old", 1, ts="2027-01-15T07:00:00Z"))  # fmt: skip
    assert len(batch) == 3 and not batch.rejected and not batch.ignored
    assert batch.predictions.tolist() == [1, 0, 1]
    assert batch.outcomes.tolist() == [1, -1, -1]
    assert batch.codes["gender"].tolist() == [0, 1, 1]
    assert batch.codes["age"].tolist() == [1, 0, 1]
    assert batch.timestamps.tolist() == [NOW, NOW, NOW - 3600]  # NOW is 2027-01-15T08:00:00Z


def test_timestamps_accept_iso_8601_and_epoch_seconds() -> None:
    same = ["2027-01-15T08:00:00Z", "2027-01-15T09:00:00+01:00", "2027-01-15T08:00:00", int(NOW), NOW]
    batch = decode(*(event(ts=t) for t in same))  # the naive one means UTC
    assert batch.timestamps.tolist() == [NOW] * 5
    batch = decode(event(ts=True), event(ts="soon"), event(ts=[NOW]), event(ts=None))
    assert dict(batch.rejected) == {"invalid_timestamp": 3, "missing_field": 1}


def test_booleans_count_as_1_and_0_on_both_decoder_paths() -> None:
    """Serving code often emits booleans; the gate counts a boolean column as 1/0, so the daemon does too: on the
    schema's fast paths (a clean batch; a batch with a defect beside them) and on the walk (an event the schema
    refuses for another field: a float 1.0)."""
    events = [event(prediction=True, label=False), event(prediction=False, label=True), event(prediction=1, label=1)]
    for extra in ([], [b"{oops"]):
        batch = decode(*events, *extra)
        assert batch.predictions.tolist() == [1, 0, 1] and batch.outcomes.tolist() == [0, 1, 1]
        assert dict(batch.rejected) == ({"malformed_json": 1} if extra else {})
    batch = decode(event(prediction=1.0, label=True), event(prediction=False, label=0.0))
    assert batch.predictions.tolist() == [1, 0] and batch.outcomes.tolist() == [1, 0] and not batch.rejected
    batch = decode(event(score=True), event(score=0.7), events={"score_threshold": 0.5})
    assert dict(batch.rejected) == {"invalid_score": 1}  # a score is a number, never a boolean


def test_attribute_values_are_read_as_the_gate_reads_its_cells() -> None:
    """A whole float is the integer's group (1.0 is "1"), a boolean is "True", and a missing value is the unknown
    category even when a group is called "None" (the gate's blank cell)."""
    config = {"protected_attributes": [{"name": "gender", "groups": ["1", "2", "None"]},
                                       {"name": "age", "groups": ["True", "False"]}]}  # fmt: skip
    values = [event(1.0, True), event(2, False), event(None, None), event("None", "True"), event(1.5, 1)]
    for extra in ([], [b"{oops"]):
        batch = decode(*values, *extra, **config)
        assert batch.codes["gender"].tolist() == [0, 1, -1, 2, -1]
        assert batch.codes["age"].tolist() == [0, 1, -1, 0, -1]


@pytest.mark.parametrize(
    ("payload", "reason"),
    [
        (b"{not json", "malformed_json"),
        (b"[1, 2]", "malformed_json"),
        (event(prediction=2), "invalid_prediction"),
        (event(prediction="1"), "invalid_prediction"),
        (event(prediction=[1]), "invalid_prediction"),
        (event(label="0"), "invalid_label"),
        (event(prediction_id="p" * 257), "invalid_prediction_id"),
        (event(prediction_id={"id": 1}), "invalid_prediction_id"),
        (event(label=3), "invalid_label"),
        (event(score=1.5), "invalid_score"),
        (event(ts="yesterday"), "invalid_timestamp"),
        (event(ts=NOW + 3600), "future_timestamp"),
        ({"model_id": "m1", "timestamp": NOW, "prediction": 1, "attributes": "male"}, "missing_field"),
        ({"model_id": "m1", "timestamp": NOW, "attributes": {"gender": "male", "age": "old"}}, "missing_field"),
    ],
)
def test_each_kind_of_bad_event_is_rejected_under_its_reason(payload: object, reason: str) -> None:
    batch = decode(payload, event())
    assert dict(batch.rejected) == {reason: 1}
    assert len(batch) == 1  # the valid event beside it is kept
    assert [r for _, r in batch.rejected_payloads] == [reason]


def test_other_models_are_ignored_not_rejected() -> None:
    batch = decode(event(model_id="m2"), event())
    assert (batch.ignored, len(batch), sum(batch.rejected.values())) == ({"unconfigured_model": 1}, 1, 0)


def test_unknown_or_missing_values_leave_only_that_attribute_as_the_gate_does() -> None:
    no_gender = event()
    del no_gender["attributes"]["gender"]
    no_attributes = {k: v for k, v in event().items() if k != "attributes"}
    batch = decode(event(gender="robot"), no_gender, no_attributes, event(gender="female"))
    assert not batch.rejected and len(batch) == 4  # no defect of the event: all four count overall
    assert batch.codes["gender"].tolist() == [-1, -1, -1, 1]  # -1: gender's unknown category
    assert batch.codes["age"].tolist() == [0, 0, -1, 0]  # age still counts the first two


def test_unknown_values_map_to_other_when_configured() -> None:
    batch = decode(event(gender="robot"), event(gender="female"), unknown_values="other")
    assert batch.codes["gender"].tolist() == [2, 1]  # groups: male, female, other


def test_score_threshold_derives_the_prediction() -> None:
    batch = decode(event(prediction=None, score=0.7), event(prediction=None, score=0.2),
                   events={"score_threshold": 0.5})  # fmt: skip
    assert batch.predictions.tolist() == [1, 0]
    assert batch.scores.tolist() == [0.7, 0.2]  # for the score histograms


def test_custom_field_paths() -> None:
    custom = {"model": {"name": "m1"}, "ts": NOW, "out": {"decision": 1}, "who": {"gender": "male", "age": "old"}}
    batch = decode(custom, events={"model_id": "model.name", "timestamp": "ts", "prediction": "out.decision",
                                   "attributes": "who"})  # fmt: skip
    assert len(batch) == 1 and batch.codes["age"].tolist() == [1]


def test_intersections_get_combined_codes() -> None:
    batch = decode(event("female", "old"), event("male", "young"), intersections=[["gender", "age"]])
    # gender_x_age groups: male:young, male:old, female:young, female:old
    assert batch.codes["gender_x_age"].tolist() == [3, 0]


@settings(max_examples=300, deadline=None)
@given(st.lists(st.binary(max_size=300), max_size=20))
def test_arbitrary_bytes_never_raise_and_every_message_is_accounted_for(payloads: list[bytes]) -> None:
    batch = decoder_of(make_config(), keep_rejected=True).decode(payloads, NOW)
    assert len(batch) + batch.ignored.total() + sum(batch.rejected.values()) == len(payloads)
    assert set(batch.rejected) <= set(REJECT_REASONS)


json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**63), 2**63 - 1) | st.floats(allow_nan=False) | st.text(max_size=10),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
    max_leaves=10,
)


@settings(max_examples=300, deadline=None)
@given(st.fixed_dictionaries({
    "model_id": st.sampled_from(["m1", "m2"]) | json_values, "timestamp": json_values | st.just(NOW),
    "prediction": st.sampled_from([0, 1]) | json_values, "label": st.sampled_from([0, 1, None]) | json_values,
    "attributes": st.fixed_dictionaries({"gender": st.sampled_from(["male", "female"]) | json_values,
                                         "age": st.sampled_from(["young", "old"])}) | json_values,
}))  # fmt: skip
def test_arbitrary_json_events_are_accepted_only_when_valid(payload: dict) -> None:
    batch = decoder_of(make_config()).decode([orjson.dumps(payload)], NOW)
    assert len(batch) + batch.ignored.total() + sum(batch.rejected.values()) == 1
    if len(batch):
        assert payload["model_id"] == "m1" and payload["prediction"] in (0, 1)
        assert not isinstance(payload["prediction"], str) and not isinstance(payload["label"], str)
        assert batch.predictions[0] == int(payload["prediction"])  # a boolean counts as 1/0
        gender = payload["attributes"].get("gender") if isinstance(payload["attributes"], dict) else None
        expected = {"male": 0, "female": 1}.get(gender) if isinstance(gender, str) else -1
        assert batch.codes["gender"][0] == (-1 if expected is None else expected) and batch.outcomes[0] in (-1, 0, 1)
