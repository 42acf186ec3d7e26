"""`fairness-exporter demo`, the README's main job: broker, drifting traffic and daemon from one command."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families

from exporter.devtools.embedded_broker import free_port

pytestmark = pytest.mark.kafka


def disparate_impact(port: int) -> float | None:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
            text = response.read().decode()
    except OSError:
        return None
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == "model_disparate_impact_ratio" and s.labels["dimension"] == "male_vs_female" \
                    and s.labels["window"] == "5m":  # fmt: skip
                return s.value
    return None


def test_demo_drifts_into_disparate_impact_and_stops_cleanly() -> None:
    port = free_port()
    command = [sys.executable, "-m", "exporter.cli", "demo", "--port", str(port), "--rate", "400", "--drift-after", "8"]
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    seen: list[float] = []
    try:
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            value = disparate_impact(port)
            if value is not None:
                seen.append(value)
                if value < 0.8:
                    break
            time.sleep(1)
    finally:
        proc.send_signal(signal.SIGINT)
        output, _ = proc.communicate(timeout=30)
    assert seen and seen[0] > 0.8, (seen, output[-2000:])  # fair before the drift
    assert seen[-1] < 0.8, (seen, output[-2000:])  # below the four-fifths rule after it
    assert proc.returncode == 0, output[-2000:]
    assert f"http://127.0.0.1:{port}/metrics" in output
    broker = next(line for line in output.splitlines() if "broker at" in line)
    broker_port = broker.split("broker at 127.0.0.1:")[1].split(",")[0]
    leftovers = subprocess.run(["pgrep", "-f", f"tcp://127.0.0.1:{broker_port}"], capture_output=True, text=True)
    assert leftovers.stdout == "", "the demo left its broker running"
