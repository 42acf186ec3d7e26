"""The Seldon block path over every kind of tensor and join order: a poll read as one block of Arrow columns counts what
the same records read as Halves count, for prediction and attribute tensors of every numeric and BYTES type, proxies'
columns, side ids, segments, ``unknown_values: other`` and intersections, tensors of rows that differ per record or
of no rows, and over the join's harder orders (responses completing requests of several blocks, duplicates, the
pending bound at its limit, expiry, refusals and restores between polls), both through the join directly and through
the daemon's ``Ingest.payloads``. Arrow's UTF-8 validation (the block's BYTES check) refuses exactly what Python's
strict decoder refuses."""

from __future__ import annotations

import random
from collections import Counter
from types import SimpleNamespace
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
from prometheus_client import CollectorRegistry

from exporter.config import parse_config
from exporter.health.counters import Health
from exporter.stream.ingest import Ingest
from exporter.stream.payloads import payload, seldon_batch
from exporter.stream.payloads.oip import messages
from exporter.stream.payloads.pairs import BlockPairs, join_units
from exporter.stream.payloads.payload import PairJoin, PayloadRows, Raw, payload_batches, read_halves
from exporter.stream.state.fleet import Fleet

INPUTS, OUTPUTS = "seldon.ns.model.m.inputs", "seldon.ns.model.m.outputs"
T0_MS = 1_800_000_000_000
FIELD = {"BOOL": "bool_contents", "INT8": "int_contents", "INT32": "int_contents", "INT64": "int64_contents",
         "UINT8": "uint_contents", "UINT64": "uint64_contents", "FP32": "fp32_contents", "FP64": "fp64_contents",
         "BYTES": "bytes_contents"}  # fmt: skip
Tensor = tuple[str, str, list[int], list[Any]]


@pytest.fixture(autouse=True)
def _small_polls_batched(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(seldon_batch, "FEWEST", 1)


def _record(pid: str | None, tensors: list[Tensor], response: bool, ms: int = T0_MS, key: bytes | None = None,
            own: str = "", headers: list[tuple[str, bytes]] | None = None) -> Raw:  # fmt: skip
    message = messages()[1 if response else 0](model_name="m", id=own)
    for name, datatype, shape, values in tensors:
        tensor = (message.outputs if response else message.inputs).add(name=name, datatype=datatype, shape=shape)
        getattr(tensor.contents, FIELD[datatype]).extend(v.encode() if datatype == "BYTES" else v for v in values)
    said = [("x-request-id", pid.encode())] if pid is not None else []
    return (message.SerializeToString(), [*said, ("seldon-infer-type", b"proto/InferModelRequest"), *(headers or [])],
            key if key is not None else (pid or "").encode(), ms)  # fmt: skip


def _rows(**overrides: Any) -> PayloadRows:
    raw = {"model_id": "m", "kafka": {"topic": INPUTS},
           "events": {"format": "seldon", "prediction": "proba", "score_threshold": 0.5},
           "protected_attributes": [{"name": "gender", "groups": ["male", "female"]}], **overrides}  # fmt: skip
    return PayloadRows(parse_config(raw).models[0], 300.0)


def _batch(b: Any) -> dict[str, Any]:
    return {"timestamps": b.timestamps.tolist(), "predictions": b.predictions.tolist(), "scores": b.scores.tolist(),
            "ids": b.prediction_ids, "codes": {k: v.tolist() for k, v in b.codes.items()}, "segments": b.segments,
            "side_ids": b.side_ids, "rejected": dict(b.rejected)}  # fmt: skip


class Path_:
    def __init__(self, blocks: bool, rows: PayloadRows, most: int = 10_000, horizon: float = 60.0) -> None:
        self.blocks, self.rows, self.join, self.unmatched = blocks, rows, PairJoin(horizon, most), Counter[str]()
        self.block_pairs = self.block_batches = 0
        self.most, self.horizon = most, horizon

    def poll(self, parts: list[tuple[str, list[Raw]]], now: float) -> Any:
        units: list[Any] = []
        rejected = []
        for topic, records in parts:
            read = read_halves("seldon", topic, records, {"m"}, blocks=self.blocks)
            units += read.blocks or [read.halves]
            rejected += read.rejected
        for _, _, model, pid in rejected:
            if model is not None and pid is not None:
                self.join.refuse(model, pid, now, self.unmatched)
        pairs = join_units(self.join, units, now, self.unmatched)
        for joined in pairs.values():
            self.block_pairs += sum(j.__class__ is BlockPairs for j in joined)
            if joined and all(j.__class__ is BlockPairs for j in joined):
                self.block_batches += self.rows.block_batch(joined, now) is not None  # type: ignore[arg-type]
        batches, letters = payload_batches(pairs, {"m": self.rows}, now)
        return {m: _batch(b) for m, b in batches.items()}, letters, [r[1] for r in rejected], dict(self.unmatched)

    def op(self, op: tuple[Any, ...]) -> Any:
        if op[0] == "poll":
            return self.poll(op[1], op[2])
        if op[0] == "expire":
            return [h.raw for h in self.join.expire(op[1], self.unmatched)]
        if op[0] == "refuse":
            self.join.refuse("m", op[1], op[2], self.unmatched)
            return dict(self.unmatched)
        state = bytes(self.join.state()["state"])
        self.join = PairJoin(self.horizon, self.most)
        self.join.restore({"state": np.frombuffer(state, dtype=np.uint8)})
        return state


def _alike(rows: PayloadRows, ops: list[tuple[Any, ...]], **kw: Any) -> Path_:
    paths = [Path_(True, rows, **kw), Path_(False, rows, **kw)]
    for op in [*ops, ("state",)]:
        assert paths[0].op(op) == paths[1].op(op), op[0]
    return paths[0]


GENDER: Tensor = ("gender", "BYTES", [2, 1], ["male", "female"])
SCORES: Tensor = ("proba", "FP32", [2, 1], [0.25, 0.75])
CASES: dict[str, tuple[dict[str, Any], list[Tensor], list[Tensor]]] = {
    "bool predictions": ({"events": {"prediction": "proba"}}, [GENDER], [("proba", "BOOL", [2, 1], [True, False])]),
    "int8 predictions": ({"events": {"prediction": "proba"}}, [GENDER], [("proba", "INT8", [2, 1], [1, 0])]),
    "uint64 predictions": ({"events": {"prediction": "proba"}}, [GENDER], [("proba", "UINT64", [2], [1, 2**64 - 1])]),
    "fp64 predictions": ({"events": {"prediction": "proba"}}, [GENDER], [("proba", "FP64", [2, 1], [1.0, -0.0])]),
    "fp64 nan prediction": ({"events": {"prediction": "proba"}}, [GENDER], [("proba", "FP64", [2], [1.0, np.nan])]),
    "bytes predictions": ({"events": {"prediction": "proba"}}, [GENDER], [("proba", "BYTES", [2, 1], ["1", "0"])]),
    "bool scores": ({}, [GENDER], [("proba", "BOOL", [2, 1], [True, False])]),
    "int64 scores": ({}, [GENDER], [("proba", "INT64", [2, 1], [1, 0])]),
    "prediction in the request too": ({}, [GENDER, ("proba", "FP32", [2], [0.1, 0.1])], [SCORES]),
    "bool attribute": ({"protected_attributes": [{"name": "gender", "groups": ["True", "False"]}]},
                       [("gender", "BOOL", [2, 1], [True, False])], [SCORES]),
    "float attribute": ({"protected_attributes": [{"name": "gender", "groups": ["1", "2.5"]}]},
                        [("gender", "FP64", [2, 1], [1.0, 2.5])], [SCORES]),
    "attribute in the response": ({}, [("x", "INT64", [2, 1], [1, 2])], [SCORES, GENDER]),
    "other": ({"unknown_values": "other"}, [("gender", "BYTES", [2, 1], ["male", "x"])], [SCORES]),
    "intersection": ({"protected_attributes": [{"name": "gender", "groups": ["male", "female"]},
                                               {"name": "age", "groups": ["young", "old"]}],
                      "intersections": [["gender", "age"]]},
                     [GENDER, ("age", "BYTES", [2, 1], ["old", "x"])], [SCORES]),
    "segments": ({"segments": ["channel", "missing"]}, [GENDER, ("channel", "INT32", [2, 1], [1, 2])], [SCORES]),
    "side ids": ({"protected_attributes": [{"name": "gender", "groups": ["male", "female"]},
                                           {"name": "g2", "groups": ["a", "b"], "source": "people"}],
                  "attribute_sources": {"people": {"topic": "t", "id": "person", "horizon": "1m"}}},
                 [GENDER, ("person", "FP64", [2, 1], [1.0, 2.5])], [SCORES]),
    "bisg": ({"protected_attributes": [{"name": "gender", "groups": ["male", "female"]},
                                       {"name": "race", "groups": ["white", "black"],
                                        "proxy": {"method": "bisg", "surname": "last", "zcta": "zip"}}]},
             [GENDER, ("last", "BYTES", [2, 1], ["SMITH", "garcia"]), ("zip", "INT64", [2, 1], [10001, 94110])],
             [SCORES]),
    "shapes differ per record": ({}, [("gender", "BYTES", [2], ["male", "female"])], [("proba", "FP32", [2, 1, 1],
                                                                                        [0.2, 0.9])]),
}  # fmt: skip


@pytest.mark.parametrize("case", list(CASES))
def test_tensor_types_and_model_shapes_count_alike(case: str) -> None:
    overrides, request, response = CASES[case]
    events = {"format": "seldon", "prediction": "proba", "score_threshold": 0.5, **overrides.pop("events", {})}
    rows = _rows(events=events, **overrides)
    requests = [_record(f"c{k}", request, False) for k in range(4)]
    responses = [_record(f"c{k}", response, True) for k in range(4)]
    now = T0_MS / 1000
    for order in ((INPUTS, requests), (OUTPUTS, responses)), ((OUTPUTS, responses), (INPUTS, requests)):
        path = _alike(rows, [("poll", [order[0]], now), ("poll", [order[1]], now)])
        assert path.block_pairs == 1


def test_rows_that_differ_per_record_and_calls_of_no_rows_count_alike() -> None:
    requests = [_record(f"c{k}", [("gender", "BYTES", [k % 3, 1], ["male"] * (k % 3))], False) for k in range(6)]
    responses = [_record(f"c{k}", [("proba", "FP32", [k % 3], [0.7] * (k % 3))], True) for k in range(6)]
    now = T0_MS / 1000
    _alike(_rows(), [("poll", [(INPUTS, requests)], now), ("poll", [(OUTPUTS, responses)], now)])
    _alike(_rows(), [("poll", [(INPUTS, requests[1:3])], now), ("poll", [(OUTPUTS, responses[1:3])], now)])


def _calls(rng: random.Random, n: int) -> list[list[tuple[str, Raw]]]:
    out = []
    for _ in range(n):
        pid, rows = f"id{rng.randrange(10**9)}", rng.choice([1, 2, 3])
        headers = [("pipeline", b"scoring")] if rng.random() < 0.2 else []
        by_key = rng.random() < 0.15
        request = [("gender", "BYTES", [rows, 1], [rng.choice(["male", "female", "x"]) for _ in range(rows)])]
        response = [("proba", "FP32", [rows, 1], [rng.choice([0.1, 0.7, 1.0]) for _ in range(rows)])]
        ms = T0_MS + rng.randrange(100_000)
        out.append([(INPUTS, _record(None if by_key else pid, request, False, ms, pid.encode(), headers=headers)),
                    (OUTPUTS, _record(None if by_key else pid, response, True, ms + 5, pid.encode(), headers=headers))])
    return out


@pytest.mark.parametrize("seed", range(4))
def test_runs_across_blocks_duplicates_the_bound_expiry_refusals_and_restores_count_alike(seed: int) -> None:
    rng = random.Random(seed)
    calls = _calls(rng, 60)
    first, second = (0, 1) if seed % 2 else (1, 0)
    firsts, seconds = [c[first] for c in calls], [c[second] for c in calls]
    most = (15, 40, 60, 10_000)[seed]
    ops: list[tuple[Any, ...]] = []
    now, at = T0_MS / 1000, 0
    while at < len(firsts):
        size = rng.randint(3, 20)
        ops.append(("poll", [(firsts[at][0], [r for _, r in firsts[at : at + size]])], now))
        at += size
    rng.shuffle(seconds) if seed > 1 else None
    at = 0
    while at < len(seconds):
        size = rng.randint(3, 30)
        ops.append(("poll", [(seconds[at][0], [r for _, r in seconds[at : at + size]])], now))
        at += size
        if rng.random() < 0.3:
            now += 25
            ops.append(("expire", now))
        if rng.random() < 0.2:
            ops.append(("state",))
        if rng.random() < 0.2:
            ops.append(("refuse", rng.choice(calls)[0][1][2].decode(), now))  # type: ignore[union-attr]
    for topic, records in ((INPUTS, firsts), (OUTPUTS, seconds)):  # delivered again
        again = [r for t, r in rng.sample(records, 6) if t == topic]
        if again:
            ops.append(("poll", [(topic, again)], now))
    ops += [("expire", now + 200)]
    path = _alike(_rows(segments=["gender"]), ops, most=most)
    assert path.block_pairs > 0 or most < 40  # a bound of 15 sends most polls to the Halves: compared all the same


def test_arrow_utf8_validation_refuses_what_pythons_strict_decoder_refuses() -> None:
    found = [bytes([a, b, *tail]) for a in range(0x80, 0x100) for b in range(0x80, 0xC0)
             for tail in ((), (0x80,), (0x80, 0x80))]  # fmt: skip
    rng = random.Random(0)
    found += [bytes(rng.randrange(256) for _ in range(rng.randint(1, 6))) for _ in range(20_000)]
    found += [b"\xed\xa0\x80", b"\xed\xbf\xbf", b"\xef\xbf\xbe", b"a\x00b"]

    def python(v: bytes) -> bool:
        try:
            v.decode()
        except UnicodeDecodeError:
            return False
        return True

    def arrow(v: bytes) -> bool:
        try:
            pa.array([v], pa.binary()).view(pa.string()).validate(full=True)
        except pa.ArrowInvalid:
            return False
        return True

    assert [v for v in found if python(v) != arrow(v)] == []


def _ingest(blocks: bool, monkeypatch: pytest.MonkeyPatch, polls: list[tuple[str, list[Raw]]]) -> Any:
    with monkeypatch.context() as m:
        if not blocks:
            m.setattr(payload, "read_block", lambda *_: None)
        raw = {"kafka": {"bootstrap_servers": "127.0.0.1:1", "topic": INPUTS, "labels_topic": "labels",
                         "assignment": "manual"},
               "events": {"format": "seldon", "pair_horizon": "60s"}, "windows": ["1h"], "bucket": "1m",
               "evaluation_interval": "1s", "min_samples": 1,
               "models": [{"model_id": "m", "events": {"prediction": "proba", "score_threshold": 0.5},
                           "segments": ["channel"],
                           "protected_attributes": [{"name": "gender", "groups": ["male", "female"]}]}]}  # fmt: skip
        config = parse_config(raw)
        registry, fleet = CollectorRegistry(), Fleet(config)
        ingest = Ingest(config, fleet, Health(registry), lambda: T0_MS / 1000 + 1)
        for offset, (topic, records) in enumerate(polls):
            batch = [SimpleNamespace(value=v, headers=h, key=k, timestamp=ms, offset=100 * offset + i)
                     for i, (v, h, k, ms) in enumerate(records)]  # fmt: skip
            ingest.payloads([((topic, 0), batch)])
        wall = ("_created", "start_timestamp_seconds")  # the wall clock's, not the records'
        samples = sorted((s.name, tuple(sorted(s.labels.items())), s.value) for metric in registry.collect()
                         for s in metric.samples if not s.name.endswith(wall))  # fmt: skip
        return samples, bytes(fleet.pairs.state()["state"]), sorted(fleet.joins.pending)


def test_the_daemons_ingest_counts_alike_with_and_without_blocks(monkeypatch: pytest.MonkeyPatch) -> None:
    rng = random.Random(7)
    calls = [[(t, (v, h, k, ms)) for t, (v, h, k, ms) in c] for c in _calls(rng, 40)]
    requests = [c[0][1] for c in calls]
    responses = [c[1][1] for c in calls]
    extra = _record("lone", [("gender", "BYTES", [1, 1], ["male"])], False)
    polls = [(INPUTS, requests[:25]), (INPUTS, [*requests[25:], extra]), (OUTPUTS, responses[5:]),
             (OUTPUTS, responses[:5] + responses[:3])]  # fmt: skip
    assert _ingest(True, monkeypatch, polls) == _ingest(False, monkeypatch, polls)
