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

# Values for the dashboard's variables and the Grafana built-ins its queries use. `namespace`, `instance` and `models`
# (the fleet row's models) are multi-value variables whose "All" is the regex `.*` (which also matches a series
# without the label: a plain Prometheus's); `dimension` repeats the per-comparison row, one value per repetition.
DEFAULT_VARIABLES: Mapping[str, str] = {
    "namespace": ".*",
    "model_id": "hiring-screener-v2",
    "models": ".*",
    "attribute": "gender",
    "window": "1h",
    "instance": ".*",
    "dimension": "male_vs_female",
    "__rate_interval": "1m",
    "__interval": "15s",
    "__range": "1h",
}

# $name, ${name} and ${name:format}; Grafana's built-ins start with two underscores. `$1` (label_replace's
# reference to a regex group) names no variable, and Grafana leaves it as it is.
VARIABLE = re.compile(r"\$\{([A-Za-z_]\w*)(?::\w+)?\}|\$([A-Za-z_]\w*)")


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


def fleet_panels(dashboard: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The panels of the fleet row: those between the first row, which is the fleet's, and the next row.

    Its queries cover the models the `models` variable selects (`model_id=~"$models"`), every attribute."""
    panels = list(dashboard["panels"])
    assert panels[0]["type"] == "row" and panels[0]["title"].startswith("Fleet"), panels[0]["title"]
    end = next(i for i, panel in enumerate(panels[1:], 1) if panel["type"] == "row")
    return panels[1:end]
