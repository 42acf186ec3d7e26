"""backtest over a dump of a KServe payload log's topic (kcat -C -J lines): the same rows as the daemon counts, the
same refusals, by the same code (exporter/stream/payloads/payload.py)."""

from __future__ import annotations

import base64
import random
from pathlib import Path

import orjson
from test_payload_kserve import Truth, config, traffic

from exporter.backtest.replay import backtest
from exporter.config import parse_config


def test_backtest_of_a_topic_dump_counts_the_daemons_rows_and_refusals(tmp_path: Path) -> None:
    truth = Truth()
    records = traffic(random.Random(7), truth)
    dump = tmp_path / "kserve-topic.jsonl"
    with dump.open("wb") as f:
        for offset, (value, headers, key) in enumerate(records):
            flat = [part for name, v in headers for part in (name, v.decode())]
            line = {"topic": "kserve", "partition": 0, "offset": offset, "ts": 1_800_000_000_000 + offset,
                    "headers": flat, "key": None if key is None else key.hex()}  # fmt: skip
            if value is not None and value[:2] != b"\x1f\x8b":
                line["payload"] = value.decode()
            else:
                line["payload_base64"] = base64.b64encode(value or b"").decode()
            f.write(orjson.dumps(line) + b"\n")
    raw = config("localhost:9092", "kserve", "labels")
    report = backtest(parse_config(raw), [dump])
    by_model = {r["model_id"]: r for r in report["models"]}
    for model in ("credit-v2", "loans-v1"):
        rows = sum(n for (m, a, _, _), n in truth.counts.items() if m == model and a == "gender")
        assert by_model[model]["events"] == rows
    assert report["ignored"] == 1
    assert report["rejected_reasons"] == {"not_gzip": 1, "unequal_rows": 1, "base64_bytes": 1, "unknown_datatype": 1}


def test_a_null_header_value_in_a_dump_is_no_header_as_the_daemon_reads_it(tmp_path: Path) -> None:
    """kcat -J writes a header whose value is null as ``null``; the daemon's client hands it over as None, which
    reads as no header (exporter/stream/payloads/platforms.py ``headers_of``), so a Seldon record's call id falls to
    its key. backtest read the null as the text ``None``: every such call had the id ``None``, the second request
    a duplicate of the first, and half the calls were never counted."""
    from payload_logs import seldon_request, seldon_response

    dump = tmp_path / "seldon.jsonl"
    with dump.open("wb") as f:
        for offset, (topic, pid, value) in enumerate([
                ("seldon.prod.model.income.inputs", "c1", seldon_request("c1", {"gender": ["female", "male"]})),
                ("seldon.prod.model.income.inputs", "c2", seldon_request("c2", {"gender": ["male"]})),
                ("seldon.prod.model.income.outputs", "c1", seldon_response("income", "c1", "proba", [0.8, 0.2])),
                ("seldon.prod.model.income.outputs", "c2", seldon_response("income", "c2", "proba", [0.6]))]):
            f.write(orjson.dumps({"topic": topic, "partition": 0, "offset": offset, "ts": 1_800_000_000_000 + offset,
                                  "headers": ["x-request-id", None], "key": pid,
                                  "payload_base64": base64.b64encode(value).decode()}) + b"\n")  # fmt: skip
    raw = {"kafka": {"bootstrap_servers": "127.0.0.1:1", "topic": "seldon.prod.model.income.inputs"},
           "events": {"format": "seldon"}, "windows": ["1h"], "bucket": "1m",
           "models": [{"model_id": "income", "events": {"prediction": "proba", "score_threshold": 0.5},
                       "protected_attributes": [{"name": "gender", "groups": ["male", "female"]}]}]}  # fmt: skip
    report = backtest(parse_config(raw), [dump])
    assert report["events"] == 3 and report["rejected"] == 0, report
