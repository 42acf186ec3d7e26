"""Attributes joined by id from a side source (attribute_sources): the daemon's join, in memory (the same paths
run against the real broker in test_attribute_join_kafka.py)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import orjson
import pytest
from daemon_config import make_config
from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families
from side_traffic import ATTRIBUTES, SOURCE, Scenario, scenario

from exporter.config import ConfigError
from exporter.daemon import Daemon

T0 = 1_800_000_000.0


@dataclass
class Rec:
    value: bytes | None
    offset: int
    key: bytes | None = None
    timestamp: int = -1


class Clock:
    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> float:
        return self.now


def daemon(tmp_path: Path | None = None, **overrides: object) -> Daemon:
    config = make_config(protected_attributes=ATTRIBUTES, attribute_sources=SOURCE,
                         checkpoint={"path": str(tmp_path)} if tmp_path else None, **overrides)  # fmt: skip
    d = Daemon(config, registry=CollectorRegistry(), clock=Clock())
    d.checkpointer.restore()
    return d


def side(d: Daemon, records: list[tuple[str, dict | None, float]], start: int) -> int:
    d.clock.now += 1  # type: ignore[attr-defined]
    batch = [Rec(None if v is None else orjson.dumps(v), start + i, k.encode(), int(t * 1000))
             for i, (k, v, t) in enumerate(records)]  # fmt: skip
    if batch:
        d.ingest.handle_poll({("applicant-demographics", 0): batch})
    return start + len(batch)


def events(d: Daemon, payloads: list[dict], start: int = 0) -> None:
    d.ingest.handle_poll({("predictions", 0): [Rec(orjson.dumps(p), start + i) for i, p in enumerate(payloads)]})


def samples(d: Daemon) -> dict[tuple[str, str, str], float]:
    d.computer.compute()
    out = {}
    for family in text_string_to_metric_families(d.metrics_page()):
        for s in family.samples:
            if s.labels.get("window") == "1h" and s.name in ("model_subgroup_samples", "model_positive_prediction_rate",
                                                             "model_subgroup_unknown_samples"):  # fmt: skip
                out[(s.name, s.labels.get("attribute", ""), s.labels.get("subgroup", ""))] = s.value
    return out


def counter(d: Daemon, name: str, **labels: str) -> float:
    return d.registry.get_sample_value(name, labels) or 0.0


def assert_truth(d: Daemon, s: Scenario) -> None:
    got = samples(d)
    for (attribute, group), (n, positives) in s.truth.items():
        assert got[("model_subgroup_samples", attribute, group)] == n, (attribute, group)
        assert got[("model_positive_prediction_rate", attribute, group)] == pytest.approx(positives / n, abs=1e-12)
    for attribute in ("gender", "race"):
        assert got[("model_subgroup_unknown_samples", attribute, "")] == s.never
        overall = got[("model_positive_prediction_rate", attribute, "overall")]
        assert overall == pytest.approx(s.positives / len(s.predictions), abs=1e-12)


def run(d: Daemon, s: Scenario) -> None:
    offset = side(d, s.before, 0)
    events(d, s.predictions)
    side(d, s.after, offset)
    d.clock.now += 120  # type: ignore[attr-defined]  # past the horizon (1m): the never-joined count as unknown
    d.ingest.expire()


def test_subgroup_counts_equal_the_truth_whenever_the_record_arrives() -> None:
    d = daemon()
    s = scenario(400, T0 - 30)
    run(d, s)
    assert_truth(d, s)
    joined = counter(d, "fairness_exporter_attribute_joins_total", source="applicants", outcome="joined")
    waited = counter(d, "fairness_exporter_attribute_joins_total", source="applicants", outcome="joined_after_wait")
    never = counter(d, "fairness_exporter_attribute_joins_total", source="applicants", outcome="never_joined")
    assert (joined + waited + never, never) == (400, s.never)
    assert waited > 40 and joined > 280
    assert counter(d, "fairness_exporter_predictions_waiting_for_attributes") == 0


def test_a_prediction_waits_until_its_record_arrives() -> None:
    d = daemon()
    events(d, [{"model_id": "m1", "prediction_id": "p", "timestamp": T0 - 30, "prediction": 1,
                "attributes": {"applicant_id": 17}}])  # fmt: skip
    assert samples(d)[("model_subgroup_samples", "gender", "overall")] == 0
    assert counter(d, "fairness_exporter_predictions_waiting_for_attributes") == 1
    side(d, [("17", {"gender": "female", "race": "asian"}, T0)], 0)  # a numeric id is its text
    got = samples(d)
    assert got[("model_subgroup_samples", "gender", "female")] == 1
    assert got[("model_subgroup_samples", "race", "asian")] == 1


def test_a_checkpoint_restores_the_table_and_the_waiting_predictions(tmp_path: Path) -> None:
    s = scenario(200, T0 - 30)
    d = daemon(tmp_path)
    offset = side(d, s.before, 0)
    events(d, s.predictions)
    d.checkpointer.write()
    again = daemon(tmp_path)  # a restart: the table is not read again, the waiting predictions still wait
    assert again.fleet.offsets[("applicant-demographics", 0)] == offset
    assert len(again.fleet.attributes.tables["applicants"]) == len(d.fleet.attributes.tables["applicants"])
    assert len(again.fleet.attributes.held) == len(d.fleet.attributes.held) > 0
    side(again, s.after, offset)
    again.clock.now += 120  # type: ignore[attr-defined]
    again.ingest.expire()
    assert_truth(again, s)


def test_a_side_record_that_is_no_json_object_is_counted_and_its_values_stay_out_of_the_dead_letter() -> None:
    d = daemon()
    d.ingest.handle_poll({("applicant-demographics", 0): [Rec(b'["female"]', 5, b"A1"), Rec(b"{nope", 6, b"A2"),
                                                          Rec(b'{"gender": "male"}', 7, None)]})  # fmt: skip
    assert counter(d, "fairness_exporter_side_records_rejected_total", source="applicants",
                   reason="not_json_object") == 2  # fmt: skip
    assert counter(d, "fairness_exporter_side_records_rejected_total", source="applicants", reason="missing_key") == 1
    assert d.fleet.offsets[("applicant-demographics", 0)] == 8


@pytest.mark.parametrize(("overrides", "line"), [
    ({"protected_attributes": [{"name": "gender", "groups": ["m", "f"], "source": "people"}]},
     "protected_attributes[0].source: 'people' is not among attribute_sources ['applicants']"),
    ({"attribute_sources": {"applicants": {"topic": "t"}}}, "attribute_sources.applicants.id: required"),
    ({"attribute_sources": {"applicants": {"id": "applicant_id"}}}, "attribute_sources.applicants: needs a topic"),
    ({"attribute_sources": {"applicants": {"id": "applicant_id", "topic": "predictions"}}},
     "attribute_sources.applicants.topic: 'predictions' is already read as events or labels"),
    # a pattern of events topics that matches the side topic would count its records as predictions too
    ({"kafka": {"topic": None, "topic_pattern": "applicant-*"}},
     "attribute_sources.applicants.topic: 'applicant-demographics' is already read as events or labels"),
    ({"protected_attributes": [{"name": "race", "groups": ["white", "black"], "source": "applicants",
                                "proxy": {"method": "bisg", "surname": "s", "zcta": "z"}}]},
     "protected_attributes[0].source: a proxy attribute is inferred, not joined by id: remove source or proxy"),
])  # fmt: skip
def test_a_bad_source_is_refused_in_one_line(overrides: dict, line: str) -> None:
    raw = {"protected_attributes": ATTRIBUTES, "attribute_sources": SOURCE, **overrides}
    with pytest.raises(ConfigError, match="(?s)" + line.replace("[", r"\[").replace("]", r"\]")):
        make_config(**raw)


def test_the_daemon_refuses_a_source_without_a_topic() -> None:
    config = make_config(protected_attributes=ATTRIBUTES, attribute_sources={"applicants": {
        "path": "demographics.parquet", "id": "applicant_id"}})  # fmt: skip
    with pytest.raises(ConfigError, match=r"attribute_sources.applicants.topic: required by the daemon"):
        Daemon(config, registry=CollectorRegistry())


def test_a_correction_applies_to_predictions_made_after_it_whatever_the_reading_order() -> None:
    d = daemon()
    side(d, [("A", {"gender": "male", "race": "white"}, T0 - 100),
             ("A", {"gender": "female", "race": "white"}, T0 - 50),
             ("B", {"gender": "male", "race": "white"}, T0 + 200)], 0)  # B's record came long after its prediction
    # read after the correction, as a restart replays them: the earlier one met the first record
    events(d, [{"model_id": "m1", "prediction_id": f"p{i}", "timestamp": t, "prediction": 1,
                "attributes": {"applicant_id": aid}} for i, (aid, t) in enumerate([("A", T0 - 80), ("A", T0 - 20),
                                                                                    ("B", T0 - 30)])])  # fmt: skip
    got = samples(d)
    assert got[("model_subgroup_samples", "gender", "male")] == 1
    assert got[("model_subgroup_samples", "gender", "female")] == 1
    assert got[("model_subgroup_unknown_samples", "gender", "")] == 1  # B: beyond the horizon (1m), never joined
    assert counter(d, "fairness_exporter_attribute_joins_total", source="applicants", outcome="never_joined") == 1


def test_a_reload_that_reads_other_fields_of_a_source_is_refused_and_one_that_does_not_is_applied() -> None:
    d = daemon()
    wider = make_config(protected_attributes=[*ATTRIBUTES, {"name": "age", "groups": ["young", "old"],
                                                            "source": "applicants"}], attribute_sources=SOURCE)
    d.loader = lambda: wider
    applied, why = d.reload()
    assert not applied and "the fields read from attribute_sources changed" in why
    d.loader = lambda: make_config(protected_attributes=ATTRIBUTES, attribute_sources=SOURCE, min_samples=7)
    assert d.reload()[0]


def test_a_side_record_that_is_no_json_object_is_dead_lettered_as_a_pointer_without_its_value() -> None:
    d = daemon()
    sent: list[tuple[bytes | None, str]] = []
    d.ingest.dead_letters = type("Letters", (), {"send": lambda self, letters: sent.extend(letters)})()
    d.ingest.handle_poll({("applicant-demographics", 1): [Rec(b'["female", "black"]', 41, b"A1")]})
    assert [(orjson.loads(v), reason) for v, reason in sent] == [
        ({"attribute_source": "applicants", "topic": "applicant-demographics", "partition": 1, "offset": 41},
         "side_not_json_object")]  # fmt: skip


def test_a_prediction_without_an_id_counts_at_once_as_unknown() -> None:
    d = daemon()
    events(d, [{"model_id": "m1", "prediction_id": "p", "timestamp": T0 - 30, "prediction": 1, "attributes": {}}])
    assert samples(d)[("model_subgroup_unknown_samples", "gender", "")] == 1
    assert counter(d, "fairness_exporter_attribute_joins_total", source="applicants", outcome="missing_id") == 1


def test_a_checkpoint_whose_table_holds_other_fields_reads_the_side_topic_again(tmp_path: Path) -> None:
    d = daemon(tmp_path)
    side(d, [("A", {"gender": "male", "race": "white"}, T0 - 100)], 0)
    events(d, [{"model_id": "m1", "prediction_id": "p", "timestamp": T0 - 30, "prediction": 1,
                "attributes": {"applicant_id": "B"}}])  # fmt: skip
    d.checkpointer.write()
    narrower = make_config(protected_attributes=ATTRIBUTES[:1], attribute_sources=SOURCE,
                           checkpoint={"path": str(tmp_path)})  # fmt: skip
    again = Daemon(narrower, registry=CollectorRegistry(), clock=Clock())
    again.checkpointer.restore()
    assert ("applicant-demographics", 0) not in again.fleet.offsets  # read again from its start
    assert ("predictions", 0) in again.fleet.offsets
    assert len(again.fleet.attributes.tables["applicants"]) == 0
    # the model's attributes changed too: it starts afresh, and the prediction that waited is given up, counted
    assert not again.fleet.attributes.held
    assert counter(again, "fairness_exporter_labels_dropped_total", reason="model_reconfigured") == 1


def test_events_the_schema_refuses_and_the_walk_accepts_keep_their_ids_in_order() -> None:
    d = daemon()
    side(d, [("A", {"gender": "male", "race": "white"}, T0 - 100), ("B", {"gender": "female", "race": "black"},
             T0 - 100), ("C", {"gender": "female", "race": "asian"}, T0 - 100)], 0)  # fmt: skip
    events(d, [{"model_id": "m1", "prediction_id": f"p{aid}", "timestamp": T0 - 30, "prediction": prediction,
                "attributes": {"applicant_id": aid}}
               for aid, prediction in (("A", 1), ("B", 1.0), ("C", 0))])  # B: 1.0, walked  # fmt: skip
    got = samples(d)
    assert got[("model_positive_prediction_rate", "gender", "female")] == 0.5  # B (1) and C (0)
    assert got[("model_positive_prediction_rate", "race", "black")] == 1.0
    assert got[("model_subgroup_samples", "race", "asian")] == 1
