"""backtest over a dump of a KServe payload log's topic (kcat -C -J lines): the same rows as the daemon counts, the
same refusals, by the same code (exporter/stream/decode/payload.py)."""

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
