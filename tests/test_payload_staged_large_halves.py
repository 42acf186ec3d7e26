"""Review 28: a KServe payload log on the staged path against the direct path, on the same records.

A KServe request of a few hundred KB (a batch scored at once: 3,000 rows) is well under Kafka's default record limit
(1 MB) and far under the documented ``payload_too_large`` bound (64 MiB unzipped, docs/sre/payload-logs.md); the
direct path counts its rows. The staged path re-keys each half as JSON that holds both the decoded columns and the
raw bytes in base64, and refuses the half once that JSON passes ~895 KB: the call is rejected as
``payload_too_large`` and none of its rows is counted, so the staged numbers differ from the direct ones."""

from __future__ import annotations

import uuid

import numpy as np
import orjson
from payload_logs import cloudevent, gzipped
from test_payload_kserve import T0
from test_payload_staged import INPUT, PayloadRecord, counts_of, daemon, drain, live, payload_config

from exporter.devtools.embedded_broker import EmbeddedBroker

ROWS = 3_000


def _call(pid: str, gzip: bool, rows: int) -> list[PayloadRecord]:
    instances = [{"sex": "male" if i % 3 else "female", "income": 52_000.25 + i, "note": f"applicant {i:06d} " * 6}
                 for i in range(rows)]  # fmt: skip
    body = orjson.dumps({"instances": instances})
    assert len(gzipped(body) if gzip else body) < 1_000_000  # under Kafka's default message.max.bytes
    response = orjson.dumps({"predictions": [i % 2 for i in range(rows)]})
    request = cloudevent("loans-v1", pid, False, gzipped(body) if gzip else body, T0 - 60)
    answer = cloudevent("loans-v1", pid, True, response, T0 - 60)
    return [PayloadRecord(v, i, int(T0 * 1000), h, k) for i, (v, h, k) in enumerate((request, answer))]


def _both(kafka_broker: EmbeddedBroker, gzip: bool, rows: int = ROWS) -> None:
    bootstrap = kafka_broker.bootstrap_servers
    records = _call("batch-1", gzip, rows)
    staged = daemon(payload_config(bootstrap, f"r28-{uuid.uuid4().hex[:8]}", "staged"))
    stages = live(staged)
    stages.handle_poll({(INPUT, 0): records})
    positions = {t.name: dict.fromkeys(range(t.partitions), 0) for t in (stages.topics.join, stages.topics.counts)}
    drain(stages, bootstrap, positions)

    direct = daemon(payload_config(bootstrap, "unused", "direct"))
    direct.ingest.handle_poll({(INPUT, 0): records})

    theirs = counts_of(direct, "loans-v1")[1]
    assert theirs.sum() > 0  # the direct path counts the call's 3,000 rows
    too_large = staged.registry.get_sample_value("fairness_exporter_events_rejected_total",
                                                 {"reason": "payload_too_large"})  # fmt: skip
    assert not too_large, f"the staged path refused {too_large} half of a call the direct path counts"
    np.testing.assert_array_equal(counts_of(stages, "loans-v1")[1], theirs)


def test_a_400_kb_kserve_request_counts_on_the_staged_path_as_on_the_direct_path(
        kafka_broker: EmbeddedBroker) -> None:  # fmt: skip
    _both(kafka_broker, gzip=False)


def test_a_gzipped_kserve_request_of_60_kb_counts_on_the_staged_path_as_on_the_direct_path(
        kafka_broker: EmbeddedBroker) -> None:  # fmt: skip
    """Gzip makes it worse: the record on the topic is a few tens of KB, the re-keyed half is its unzipped columns."""
    _both(kafka_broker, gzip=True, rows=8_000)
