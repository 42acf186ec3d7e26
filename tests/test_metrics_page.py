"""The whole /metrics page for a fixed input, compared with tests/golden/metrics.txt (as pve-exporter does).

Only what must vary is masked: the version, and values that are wall-clock times or durations. The text of every
line (names, labels, their order, HELP and TYPE) must be exact; values are compared to a relative 1e-9, because
numpy's vectorised log/exp round differently on different CPUs (a detector statistic differs in its last two
digits), which is no change of the page. After an intended change to the page, regenerate the file with
`UPDATE_GOLDEN=1 pytest tests/test_metrics_page.py` and review the diff like code.
"""

from __future__ import annotations

import math
import os
import re
from pathlib import Path

import orjson
from daemon_config import event, make_config
from prometheus_client import CollectorRegistry

from exporter.daemon import Daemon
from exporter.stream.kafka.client import SimpleRecord

GOLDEN = Path(__file__).parent / "golden" / "metrics.txt"
T0 = 1_800_000_000.0
# the build's version, counters' creation times, wall-clock timestamps and durations
VARYING = re.compile(r"^(fairness_exporter_build_info\{.*|\S*(_created|_timestamp_seconds|_duration_seconds)(\{.*\})?)"
                     r" .*$")  # fmt: skip


RELATIVE = 1e-9
METRICS = [{"name": name, "threshold": threshold} for name, threshold in (
    ("demographic_parity_difference", 0.05), ("disparate_impact_ratio", 0.8),
    # the error-rate ratios and NPV of issue 41
    ("negative_predictive_value_difference", 0.05), ("false_positive_rate_ratio", 0.8),
    ("false_negative_rate_ratio", 0.8), ("true_negative_rate_ratio", 0.8), ("negative_predictive_value_ratio", 0.8),
    ("false_discovery_rate_ratio", 0.8), ("false_omission_rate_ratio", 0.8),
    # the score metrics of issue 41 (the events carry scores, each on its prediction's side of the threshold)
    ("auc_difference", 0.05), ("calibration_difference", 0.05))]  # fmt: skip


def masked(page: str) -> str:
    return "\n".join(VARYING.sub(r"\1 <varies>", line) for line in page.splitlines()) + "\n"


def fixed_page() -> str:
    """40 men (30 predicted positive, 20 of them labelled) and 40 women (10 positive) a minute or two before the
    clock, a man of the clock's minute, a few bad events."""
    daemon = Daemon(make_config(model_version="2026.01.3", metrics=METRICS, events={"score_threshold": 0.5}),
                    registry=CollectorRegistry(), clock=lambda: T0)  # fmt: skip
    events = [event("male", "young" if i % 2 else "old", prediction=int(i < 30), ts=T0 - 60,
                    label=(i % 2) if i < 20 else None, prediction_id=f"m{i}") for i in range(40)]
    events += [event("female", "young" if i % 3 else "old", prediction=int(i < 10), ts=T0 - 120,
                     label=1 if i < 15 else None, prediction_id=f"f{i}") for i in range(40)]  # fmt: skip
    # one man of the clock's minute: the stream leaves the minute of the others, the detectors' one step
    events.append(event("male", "old", prediction=0, ts=T0, prediction_id="m40"))
    for i, e in enumerate(events):  # a score of 0.6..0.9 for a positive prediction, 0.1..0.4 for a negative one
        e["score"] = 0.1 * (i % 4) + (0.6 if e.pop("prediction") else 0.1)
    bad = {k: v for k, v in event().items() if k != "prediction"} | {"score": "1"}  # text: an invalid score
    values = [orjson.dumps(e) for e in events] + [b"{oops", orjson.dumps(bad)]
    daemon.ingest.handle("predictions", 0, [SimpleRecord(v, i) for i, v in enumerate(values)])
    daemon.computer.compute()
    return masked(daemon.metrics_page())


def differences(page: str, golden: str) -> list[str]:
    """Lines whose text differs, or whose value differs from the golden one by more than RELATIVE."""
    got, want = page.splitlines(), golden.splitlines()
    out = [f"{len(got)} lines, the golden page has {len(want)}"] if len(got) != len(want) else []
    for line, expected in zip(got, want, strict=False):
        if line == expected:
            continue
        series, _, value = line.rpartition(" ")
        golden_series, _, golden_value = expected.rpartition(" ")
        try:
            close = math.isclose(float(value), float(golden_value), rel_tol=RELATIVE)
        except ValueError:
            close = False
        if line.startswith("#") or series != golden_series or not close:
            out.append(f"got {line!r}, golden {expected!r}")
    return out


def test_the_metrics_page_for_a_fixed_input_is_the_golden_file() -> None:
    page = fixed_page()
    if os.environ.get("UPDATE_GOLDEN"):
        GOLDEN.parent.mkdir(exist_ok=True)
        GOLDEN.write_text(page)
    found = differences(page, GOLDEN.read_text())
    assert not found, "\n".join(found[:20])


def test_the_comparison_holds_text_exactly_and_values_to_a_relative_1e_9() -> None:
    golden = 'a{x="1 2"} 3.6063113598969565\n# HELP a b\nc 0.0\n'
    assert not differences(golden.replace("565", "547"), golden)  # another CPU's last digits
    assert differences(golden.replace("3.606", "3.607"), golden)  # a real change of a value
    assert differences(golden.replace('x="1 2"', 'x="1 3"'), golden)  # a label
    assert differences(golden.replace("# HELP a b", "# HELP a c"), golden)  # HELP text
    assert differences(golden.replace("c 0.0", "c 1e-300"), golden)  # zero stays zero
    assert differences(golden + "d 1\n", golden)
