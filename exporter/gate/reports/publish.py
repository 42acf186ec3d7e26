"""Filing reports where the team keeps them: the audit gate's ``failure_policy.report_destination`` and the red
team's ``reporting.destination``, local folders or URLs (:mod:`exporter.gate.storage`)."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from exporter.gate import storage


def publish(command: str, field: str, destination: str, report: dict[str, Any], text: str,
            files: Sequence[tuple[str, Path]] = ()) -> bool:  # fmt: skip
    """Copy the JSON report, and each ``(suffix, local file)`` written beside it (HTML, LL144 CSV), to
    ``destination`` as ``<model id>_<UTC time>.<suffix>``. False, after one line on stderr naming the destination,
    when a file cannot be written there; the local files and the audit-log record are already written then."""
    stem = storage.report_name(report["model_id"], report["timestamp"], "json").removesuffix(".json")
    written = []
    try:
        for suffix, content in [("json", (text + "\n").encode()), *((s, p.read_bytes()) for s, p in files)]:
            location = storage.join(destination, f"{stem}.{suffix}")
            storage.write_bytes(location, content)
            written.append(location)
    except OSError as exc:  # StorageError, or a local file that vanished
        print(f"fairness-exporter {command}: {field} {destination}: the report was not filed: {exc}", file=sys.stderr)
        return False
    print(f"fairness-exporter {command}: report filed at {', '.join(written)}", file=sys.stderr)
    return True
