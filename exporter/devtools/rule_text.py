"""What every generated alert shares: the templates of its labels and value, its numbers, its runbook link, its
shape (exporter/devtools/rules.py and stage_rules.py build the alerts from these)."""

from __future__ import annotations

from typing import Any

RUNBOOK_URL = "https://github.com/fairness-exporter/fairness-exporter/blob/main/rules/RUNBOOK.md"
VALUE_3F = '{{ printf "%.3f" $value }}'
VALUE_0F = '{{ printf "%.0f" $value }}'


def label(name: str) -> str:
    """The alert template that renders one label of the alerting series."""
    return "{{ $labels." + name + " }}"


def fmt(number: float) -> str:
    """A threshold as written in PromQL and in annotations: 0.8, 0.05, 300."""
    return f"{number:g}"


def alert(name: str, expr: str, for_: str, severity: str, summary: str, description: str) -> dict[str, Any]:
    """One alerting rule with a runbook anchor named after the alert."""
    return {
        "alert": name,
        "expr": expr,
        "for": for_,
        "labels": {"severity": severity},
        "annotations": {"summary": summary, "description": description,
                        "runbook_url": f"{RUNBOOK_URL}#{name.lower()}"},
    }  # fmt: skip
