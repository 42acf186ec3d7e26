"""The Grafana dashboard's PromQL queries with its template variables filled in.

For checks that run the dashboard's queries against a real Prometheus:

    from dashboard_queries import panel_queries
    for title, expr in panel_queries({"model_id": "demo-model", "attribute": "gender", "window": "1h"}):
        ...  # GET /api/v1/query?query=expr
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

DASHBOARD_FILE = Path(__file__).resolve().parent.parent / "deploy" / "grafana" / "fairness.json"

# Values for the dashboard's variables and the Grafana built-ins its queries use. `instance` is a multi-value
# variable whose "All" is the regex `.*`; `dimension` repeats the per-comparison row, one value per repetition.
DEFAULT_VARIABLES: Mapping[str, str] = {
    "model_id": "hiring-screener-v2",
    "attribute": "gender",
    "window": "1h",
    "instance": ".*",
    "dimension": "male_vs_female",
    "__rate_interval": "1m",
    "__interval": "15s",
    "__range": "1h",
}

# $name, ${name} and ${name:format}; Grafana's built-ins start with two underscores.
VARIABLE = re.compile(r"\$\{(\w+)(?::\w+)?\}|\$(\w+)")


def load_dashboard(path: Path = DASHBOARD_FILE) -> dict[str, Any]:
    """The dashboard JSON as a dict."""
    dashboard = json.loads(path.read_text())
    assert isinstance(dashboard, dict)
    return dashboard


def iter_panels(dashboard: Mapping[str, Any]) -> Iterator[dict[str, Any]]:
    """Every panel that shows data, including those inside collapsed rows; rows themselves are skipped."""
    for panel in dashboard.get("panels", []):
        if panel.get("type") == "row":
            yield from panel.get("panels", [])
        else:
            yield panel


def substitute(expr: str, variables: Mapping[str, str]) -> str:
    """Replace every template variable in expr; a variable without a value raises KeyError naming it."""

    def value(match: re.Match[str]) -> str:
        name = match.group(1) or match.group(2)
        if name not in variables:
            raise KeyError(f"no value for dashboard variable ${name} in {expr!r}")
        return variables[name]

    return VARIABLE.sub(value, expr)


def panel_queries(
    variables: Mapping[str, str] | None = None, dashboard: Mapping[str, Any] | None = None
) -> list[tuple[str, str]]:
    """(panel title, expr) for every query target, variables substituted (DEFAULT_VARIABLES, overridden)."""
    values = {**DEFAULT_VARIABLES, **(variables or {})}
    board = load_dashboard() if dashboard is None else dashboard
    return [
        (panel["title"], substitute(target["expr"], values))
        for panel in iter_panels(board)
        for target in panel.get("targets", [])
        if target.get("expr")
    ]
