"""The staged path's record formats, snapshot chunks, partitioning and config, without a broker."""

from __future__ import annotations

import logging
import re
from typing import Any

import numpy as np
import orjson
import pytest

from exporter.config import ConfigError, parse_config
from exporter.stream.kafka import internal_topics
from exporter.stream.stages.records import MAX_RECORD_BYTES, Kind, RecordError, decode, encode, encode_rows
from exporter.stream.stages.snapshots import Restoring, chunks, pack, unpack

BASE: dict[str, Any] = {"model_id": "m1", "protected_attributes": [{"name": "gender", "groups": ["male", "female"]}]}


def table(n: int, seed: int = 0) -> tuple[dict[str, np.ndarray], list[str]]:
    rng = np.random.default_rng(seed)
    return ({"source": rng.integers(0, 3, n).astype(np.int32), "position": np.arange(n, dtype=np.int64) * 3,
             "timestamp": rng.uniform(0, 1e9, n), "prediction": rng.integers(0, 2, n).astype(np.int8),
             "codes": rng.integers(-1, 4, (n, 3)).astype(np.int32), "score": np.zeros(0)},
            [f"pred-{i}-{'x' * int(rng.integers(0, 40))}" for i in range(n)])  # fmt: skip


def test_a_row_table_round_trips_with_its_ids_and_meta() -> None:
    rows, ids = table(50)
    sources = [["t", 0, "id-1"], ["t", 1, "id-1"], ["t", 2, ""]]
    (value,) = encode_rows(Kind.PENDING, {"model": "m1", "sources": sources}, rows, ids)
    record = decode(value)
    assert record.kind is Kind.PENDING and record.sources == [("t", 0, "id-1"), ("t", 1, "id-1"), ("t", 2, "")]
    assert record.ids == ids and len(record) == 50
    for name, array in rows.items():
        np.testing.assert_array_equal(record.arrays[name], array)
        assert record.arrays[name].dtype == array.dtype


def test_a_table_over_the_size_limit_is_cut_into_records_under_it_in_row_order() -> None:
    rows, ids = table(40_000)
    values = encode_rows(Kind.PENDING, {"model": "m1", "sources": []}, rows, ids)
    assert len(values) > 1 and max(map(len, values)) <= MAX_RECORD_BYTES
    records = [decode(v) for v in values]
    assert [pid for r in records for pid in r.ids] == ids
    np.testing.assert_array_equal(np.concatenate([r.arrays["position"] for r in records]), rows["position"])
    np.testing.assert_array_equal(np.concatenate([r.arrays["codes"] for r in records]), rows["codes"])
    assert all(len(r.arrays["score"]) == 0 for r in records)  # an array of no rows goes whole into each


@pytest.mark.parametrize(("value", "why"), [
    (b"{\"model_id\": \"m1\"}", "no FXI prefix"),
    (b"FXI\x02\x01\x00\x00\x00\x00", "internal record format 2, this daemon reads 1"),
    (encode(Kind.LABELS, {}, {"position": np.arange(3)})[:-5], "corrupt"),
    (None, "too short"),
])  # fmt: skip
def test_what_is_no_record_of_this_version_is_refused_with_the_reason(value: bytes | None, why: str) -> None:
    with pytest.raises(RecordError, match=re.escape(why)):
        decode(value)


def test_a_snapshot_in_chunks_is_whole_only_with_every_chunk_of_one_id_and_the_committed_covers() -> None:
    state = {"counts": np.arange(100_000, dtype=np.int64) % 7, "head": np.array(12)}
    data = pack({"models": {"m1": {"prefix": "m0."}}}, state)
    parts = [decode(v) for v in chunks("counts", 3, 1000, data, limit=len(data) // 3 + 1)]
    other = [decode(v) for v in chunks("counts", 3, 1000, data, limit=len(data) // 2 + 1)]  # another writer
    later = decode(chunks("counts", 3, 1200, data)[0])  # a later snapshot, never committed
    assert len(parts) == 3 and {p.meta["chunks"] for p in parts} == {3}
    restoring = Restoring(1000)
    assert restoring.offer(later) is None
    assert [restoring.offer(p) for p in (parts[2], other[0], parts[0])] == [None, None, None]
    whole = restoring.offer(parts[1])
    assert whole == data
    meta, arrays = unpack(whole)
    assert meta["models"] == {"m1": {"prefix": "m0."}}
    np.testing.assert_array_equal(arrays["counts"], state["counts"])


def test_models_keep_their_counts_partition_across_releases() -> None:
    """Kafka's default partitioning of the model id as a key (murmur2, as the Java client and librdkafka's
    murmur2 partitioner place it): a change here would move every model's state on an upgrade."""
    assert [internal_topics.model_partition(m, 12) for m in ("hiring", "credit", "moderation", "m1")] == [8, 10, 1, 8]
    ids = internal_topics.id_partitions([f"p{i}" for i in range(12_000)], 12)
    assert np.bincount(ids, minlength=12).min() > 800  # ids spread over every join partition


def test_the_staged_keys_are_read_with_their_defaults() -> None:
    config = parse_config({**BASE, "kafka": {"group_id": "fx", "stages": "staged", "internal_topics": {
        "counts": {"partitions": 24, "retention": "2d"}, "join": {"name": "fx-labels-join"}}},
        "checkpoint": {"interval": "10s"}, "label_horizon": "3d"})  # fmt: skip
    topics = internal_topics.wanted(config)
    assert (topics.join.name, topics.join.partitions, topics.join.retention_seconds) == ("fx-labels-join", 12,
                                                                                          4 * 86400)
    assert (topics.counts.name, topics.counts.partitions, topics.counts.retention_seconds) == ("fx.counts", 24,
                                                                                               2 * 86400)
    assert config.checkpoint_interval_seconds == 10 and config.checkpoint_path is None
    assert parse_config(BASE).kafka.stages == "direct"


@pytest.mark.parametrize(("raw", "line"), [
    ({"kafka": {"stages": "sharded"}}, "kafka.stages: 'sharded' is not one of direct, staged"),
    ({"kafka": {"stages": "staged", "assignment": "manual"}}, "kafka.assignment: manual reads every partition"),
    ({"kafka": {"stages": "staged"}, "checkpoint": {"path": "/var/lib/fx"}},
     "checkpoint.path: kafka.stages: staged keeps its state in its internal topics"),
    ({"kafka": {"internal_topics": {"counts": {"partitions": 0}}}},
     "kafka.internal_topics.counts.partitions: 0 is invalid"),
    ({"kafka": {"internal_topics": {"join": {"name": "a b"}}}}, "kafka.internal_topics.join.name: 'a b' is not"),
    ({"kafka": {"internal_topics": {"join": {"name": "predictions"}}}}, "the internal topics must differ"),
    ({"kafka": {"internal_topics": {"joins": {}}}}, "kafka.internal_topics.joins: unknown key"),
    ({"alerting": {"max_unjoined_share": 1.5}}, "alerting.max_unjoined_share: 1.5 is invalid"),
])  # fmt: skip
def test_a_bad_staged_key_is_one_line_naming_it(raw: dict[str, Any], line: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(line)):
        parse_config({**BASE, **raw})


def test_alerting_replicas_is_accepted_with_a_deprecation_warning_and_ignored(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.WARNING):
        config = parse_config({**BASE, "alerting": {"replicas": 4, "false_pages_per_day": 0.02}})
    assert "alerting.replicas is deprecated and ignored" in caplog.text
    assert config.model().alerting.false_pages_per_day == 0.02
    assert not hasattr(config.model().alerting, "replicas")


def test_every_model_of_a_fleet_must_share_the_label_join_level() -> None:
    with pytest.raises(ConfigError, match=re.escape("alerting.max_unjoined_share: every model must have the same")):
        parse_config({"models": [{**BASE, "alerting": {"max_unjoined_share": 0.3}}, {**BASE, "model_id": "m2"}]})


@pytest.mark.parametrize("split", ["one model", "shared parse", "router"])
def test_each_decoded_event_knows_its_position_in_the_whole_batch(split: str) -> None:
    """The staged ingest tells each event's source offset by its position: for one model, for models parsed at
    once (exporter/stream/decode/fleet.py), and for models routed by id."""
    from exporter.stream.decode.fleet import SharedDecoder
    from exporter.stream.decode.route import Router
    from exporter.stream.state.fleet import Fleet

    second = {**BASE, "model_id": "m2", **({"events": {"attributes": "who"}} if split == "router" else {})}
    config = parse_config(BASE if split == "one model" else {"models": [BASE, second]})
    fleet = Fleet(config)
    assert isinstance(fleet.readers[1], {"one model": type(None), "shared parse": SharedDecoder,
                                         "router": Router}[split])  # fmt: skip
    rng = np.random.default_rng(5)
    events = []
    for i in range(300):
        model = "m1" if split == "one model" or rng.random() < 0.5 else "m2"
        where = "who" if model == "m2" and split == "router" else "attributes"
        events.append({"model_id": model, "prediction_id": f"p{i}", "timestamp": 1_800_000_000.0,
                       "prediction": int(rng.integers(0, 2)), where: {"gender": "male"}})
    values = [orjson.dumps(e) for e in events]
    values[7] = b"{broken"  # one malformed value shifts nothing
    values[11] = orjson.dumps({**events[11], "prediction": 7})  # nor does a rejected one
    _, batches, _, _ = fleet.decode(values, 1_800_000_100.0)
    assert sum(map(len, batches.values())) == 298
    for batch in batches.values():
        assert [events[i]["prediction_id"] for i in batch.positions.tolist()] == batch.prediction_ids
