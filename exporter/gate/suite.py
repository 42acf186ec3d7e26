"""What the safety and red-team suites share: the result record, severities, the report and its verdict.

Both suites follow the audit gate's semantics: a failed ``critical`` result blocks (verdict ``FAIL``, exit 1),
any other severity is reported and lets the model ship.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from exporter import __version__
from exporter.config import ConfigError
from exporter.config.yaml_file import YamlFileError, read_yaml

SEVERITIES = ("critical", "high", "medium", "low")
BLOCKING_SEVERITY = "critical"
UNMEASURED = (("errored_attempts", "errored attempt(s), not judged"),
              ("unaltered_attempts", "attack(s) that changed nothing, not counted"))  # fmt: skip
"""A red-team report's attempts that measured nothing (never counted as resisted), by their count's key."""


@dataclass
class SafetyTestResult:
    """One test's outcome, the record both suites report: the seed's fields, ``details`` the seed's sentence, and
    beside them ``evidence``, this project's facts (the JSON report's ``details`` hold both: the sentence as
    ``summary``)."""

    test_name: str
    category: str
    passed: bool
    details: str = ""
    severity: str = BLOCKING_SEVERITY
    evidence: dict[str, Any] = field(default_factory=dict)


def load_yaml_mapping(path: str | Path) -> dict[str, Any]:
    """Read a YAML file that must hold a mapping; a ConfigError names the file otherwise."""
    path = Path(path)
    try:
        raw = read_yaml(path)
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read the config: {exc.strerror}") from exc
    except YamlFileError as exc:
        raise ConfigError(str(exc)) from exc
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: the config must be a mapping with model_id and the suite's settings")
    return raw


def check_severity(value: Any, where: str, problems: list[str]) -> str:
    """Validate a severity, appending a problem naming ``where`` when it is not one of SEVERITIES."""
    if value not in SEVERITIES:
        problems.append(f"{where}: severity {value!r} is not one of {', '.join(SEVERITIES)}")
        return BLOCKING_SEVERITY
    return str(value)


def build_report(suite: str, model_id: str, seed: int, results: list[SafetyTestResult],
                 **facts: Any) -> dict[str, Any]:  # fmt: skip
    """The JSON report: counts, a verdict (FAIL when a critical test failed) and every result."""
    failed = [r for r in results if not r.passed]
    critical = [r for r in failed if r.severity == BLOCKING_SEVERITY]
    return {
        "suite": suite,
        "model_id": model_id,
        "timestamp": datetime.now(UTC).isoformat().replace("+00:00", "Z"),
        "tool": f"fairness-exporter {__version__}",
        "seed": seed,
        **facts,
        "total_tests": len(results),
        "passed": len(results) - len(failed),
        "failed": len(failed),
        "critical_failures": len(critical),
        "verdict": "FAIL" if critical else "PASS",
        "results": [{"test_name": r.test_name, "category": r.category, "passed": r.passed,
                     "details": {"summary": r.details, **r.evidence}, "severity": r.severity} for r in results],
    }


def audit_entry(report: dict[str, Any], **facts: Any) -> dict[str, Any]:
    """The audit-log record of a safety or red-team run: what it was about, its verdict and the whole report."""
    return {"type": report["suite"], "timestamp": report["timestamp"], "model_id": report["model_id"],
            "model_version": report.get("model_version"), "verdict": report["verdict"], **facts,
            "report": report}  # fmt: skip


def unmeasured(report: Mapping[str, Any]) -> str:
    """``, 72 errored attempt(s), not judged``: what a red-team report's summaries add when attempts measured
    nothing; empty when none did."""
    return "".join(f", {report[key]} {said}" for key, said in UNMEASURED if report.get(key))
