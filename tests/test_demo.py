"""`fairness-exporter demo`, the README's main job: broker, drifting traffic and daemon from one command; with
`--stack` also Prometheus, Alertmanager and a webhook sink printing the page."""

from __future__ import annotations

import os
import re
import shutil
import signal
import struct
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path
from typing import IO

import pytest
from prometheus_client.parser import text_string_to_metric_families
from prometheus_fixture import alertmanager_binary, wait_until
from tooling import require_binary

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


class Output(threading.Thread):
    """Collects a process's output lines as they come, so a test can wait for one while the process runs."""

    def __init__(self, stream: IO[str]) -> None:
        super().__init__(name="demo-output", daemon=True)
        self.stream = stream
        self.lines: list[str] = []

    def run(self) -> None:
        for line in self.stream:
            self.lines.append(line)

    def text(self) -> str:
        return "".join(self.lines)

    def find(self, pattern: str) -> re.Match[str] | None:
        return re.search(pattern, self.text())


def screenshot(url: str, path: Path, profile: Path) -> None:
    """A 1400x900 PNG of `url` from headless Chromium, with none of its background network traffic."""
    subprocess.run([require_binary("chromium"), "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
                    "--no-first-run", "--disable-background-networking", "--disable-component-update",
                    "--disable-sync", f"--user-data-dir={profile}", f"--screenshot={path}", "--window-size=1400,900",
                    "--virtual-time-budget=5000", url],
                   capture_output=True, check=True, timeout=120)  # fmt: skip


def alive(pid: int, name: str) -> bool:
    try:
        return name in Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
    except OSError:
        return False


@pytest.mark.prometheus
def test_demo_stack_pages_on_the_drift_and_stops_everything(tmp_path: Path) -> None:
    """demo --stack: the drift goes pending, firing, then the page is printed; Ctrl-C leaves no process behind."""
    require_binary("prometheus")
    alertmanager_binary()
    port = free_port()
    command = [sys.executable, "-m", "exporter.cli", "demo", "--stack", "--port", str(port), "--rate", "400",
               "--drift-after", "8"]  # fmt: skip
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    assert proc.stdout is not None
    output = Output(proc.stdout)
    output.start()
    try:
        page = wait_until(lambda: proc.poll() is None and output.find(r"PAGE to fairness-page \(firing"), 180,
                          "the drift page printed by the demo")  # fmt: skip
        alerts_url = output.find(r"alerts: +(http://\S+/alerts)\n")
        assert alerts_url, output.text()
        screenshot(alerts_url[1], tmp_path / "alerts.png", tmp_path / "chromium")
    finally:
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=60)
        output.join(10)
    text = output.text()
    assert proc.returncode == 0, text[-3000:]
    assert f"http://127.0.0.1:{port}/metrics" in text
    assert "every `for:` shortened to 20s" in text
    assert re.search(r"the gap: +http://\S+/graph\?g0\.expr=model_disparate_impact_ratio", text)
    paged = text[page.start():]
    # the first alert of the page went pending (it stays so for the 20 s `for:`) before the page, and was seen firing
    # (the paging alerts come from change detectors, which have no window: the label is there only for the seed's)
    first = re.search(r"\[firing\] (\w+) severity=critical model_id=(\S+) attribute=\S+ dimension=(\S+)"
                      r"(?: window=(\S+))?", paged)  # fmt: skip
    assert first, paged
    window = f",window={first[4]}" if first[4] else ""
    alert = f"{first[1]}{{model_id={first[2]},dimension={first[3]}{window}}}"
    assert 0 <= text.find(f"alert pending  {alert}") < page.start(), text[-3000:]
    assert f"alert firing   {alert}" in text, text[-3000:]
    assert "dimension=male_vs_female" in paged and "runbook: https://" in paged
    started = re.findall(r"(prometheus|alertmanager): +http://\S+ \(pid (\d+)\)", text)
    servers = {int(pid): name for name, pid in started}
    assert set(servers.values()) == {"prometheus", "alertmanager"}, text[:3000]
    assert [name for pid, name in servers.items() if alive(pid, name)] == []
    broker_port = re.search(r"broker at 127\.0\.0\.1:(\d+)", text)
    assert broker_port
    leftovers = subprocess.run(["pgrep", "-f", f"tcp://127.0.0.1:{broker_port[1]}"], capture_output=True, text=True)
    assert leftovers.stdout == "", "the demo left its broker running"
    png = (tmp_path / "alerts.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    assert struct.unpack(">II", png[16:24]) == (1400, 900)
    if os.environ.get("FAIRNESS_SCREENSHOT_DIR"):  # how docs/img/demo-stack-alerts.png is refreshed
        shutil.copy(tmp_path / "alerts.png", Path(os.environ["FAIRNESS_SCREENSHOT_DIR"]) / "demo-stack-alerts.png")
