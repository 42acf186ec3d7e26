"""The whole /metrics page for a fixed input, compared with tests/golden/metrics.txt (as pve-exporter does).

Only what must vary is masked: the version, and values that are wall-clock times or durations. After an intended
change to the page, regenerate the file with `UPDATE_GOLDEN=1 pytest tests/test_metrics_page.py` and review the
diff like code.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import orjson
from daemon_config import event, make_config
from prometheus_client import CollectorRegistry

from exporter.daemon import Daemon
from exporter.stream.client import SimpleRecord

GOLDEN = Path(__file__).parent / "golden" / "metrics.txt"
T0 = 1_800_000_000.0
# the build's version, counters' creation times, wall-clock timestamps and durations
VARYING = re.compile(r"^(fairness_exporter_build_info\{.*|\S*(_created|_timestamp_seconds|_duration_seconds)(\{.*\})?)"
                     r" .*$")  # fmt: skip


def masked(page: str) -> str:
    return "\n".join(VARYING.sub(r"\1 <varies>", line) for line in page.splitlines()) + "\n"


def fixed_page() -> str:
    """40 men (30 predicted positive, 20 of them labelled) and 40 women (10 positive), a few bad events."""
    daemon = Daemon(make_config(), registry=CollectorRegistry(), clock=lambda: T0)
    events = [event("male", "young" if i % 2 else "old", prediction=int(i < 30), ts=T0 - 60,
                    label=(i % 2) if i < 20 else None, prediction_id=f"m{i}") for i in range(40)]
    events += [event("female", "young" if i % 3 else "old", prediction=int(i < 10), ts=T0 - 120,
                     label=1 if i < 15 else None, prediction_id=f"f{i}") for i in range(40)]  # fmt: skip
    values = [orjson.dumps(e) for e in events] + [b"{oops", orjson.dumps(event(prediction="1"))]
    daemon.ingest.handle("predictions", 0, [SimpleRecord(v, i) for i, v in enumerate(values)])
    daemon.computer.compute()
    return masked(daemon.metrics_page())


def test_the_metrics_page_for_a_fixed_input_is_the_golden_file() -> None:
    page = fixed_page()
    if os.environ.get("UPDATE_GOLDEN"):
        GOLDEN.parent.mkdir(exist_ok=True)
        GOLDEN.write_text(page)
    assert page == GOLDEN.read_text()
