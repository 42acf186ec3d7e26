"""deploy/grafana/fairness.json: valid by Grafana's own published schema, templated, and querying only the metrics
docs/contract.md defines."""

from __future__ import annotations

import copy
import json
import re
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml
from dashboard_queries import DEFAULT_VARIABLES, fleet_panels, iter_panels, load_dashboard, panel_queries, substitute
from promql_selectors import selectors
from tooling import missing, require_binary

from exporter.core.metric_table import METRICS

ROOT = Path(__file__).resolve().parent.parent
CONTRACT = ROOT / "docs" / "contract.md"
SCHEMA_TOOLS = ROOT / "tools" / "grafana-schema"  # @grafana/schema and tsc, pinned; `make test-deps` installs them
TS_ERROR = re.compile(r"^check\.ts\((\d+),\d+\): error (TS\d+: .*)$")
DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}
METRIC_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
PROMQL_WORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "bool", "and", "or", "unless",
                "offset", "atan2", "inf", "nan"}  # fmt: skip


def contract_metric_names(text: str) -> set[str]:
    """Backticked metric names of the contract's "Metrics on /metrics" bullets.

    A bullet names its metrics before its em dash ("- `a`, `b{label}` — what they mean"); `_lower`/`_upper`
    after the dash add those suffixes to the bullet's metrics.
    """
    section = text.split("## Metrics on /metrics", 1)[1].split("\n## ", 1)[0]
    names: set[str] = set()
    for line in section.splitlines():
        if not line.startswith("- "):
            continue
        head, _, tail = line.partition(" — ")
        bullet = {token.split("{")[0] for token in re.findall(r"`([^`]+)`", head)}
        bullet = {name for name in bullet if METRIC_NAME.fullmatch(name)}
        suffixes = [s for s in ("_lower", "_upper") if f"`{s}`" in tail]
        names |= bullet | {name + suffix for name in bullet for suffix in suffixes}
    return names


CONTRACT_METRICS = contract_metric_names(CONTRACT.read_text())
NAME_REGEX = re.compile(r'__name__=~"((?:[^"\\]|\\.)*)"')


def metric_names(expr: str) -> set[str]:
    """The metric names a PromQL expression selects: identifiers but functions, keywords and labels, and every
    metric of the contract that a `{__name__=~"..."}` selector's regex matches (anchored, as PromQL's are)."""
    names = {name for regex in NAME_REGEX.findall(expr) for name in CONTRACT_METRICS if re.fullmatch(regex, name)}
    text = re.sub(r"\"(?:[^\"\\]|\\.)*\"|'(?:[^'\\]|\\.)*'|`[^`]*`", '""', expr)
    text = re.sub(r"\{[^}]*\}|\[[^\]]*\]", " ", text)
    text = re.sub(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", text)
    for match in re.finditer(r"(?<![\w:.])[a-zA-Z_:][a-zA-Z0-9_:]*", text):
        is_call = text[match.end() :].lstrip().startswith("(")
        if not is_call and match.group().lower() not in PROMQL_WORDS:
            names.add(match.group())
    return names


@pytest.fixture(scope="module")
def dashboard() -> dict[str, Any]:
    return load_dashboard()


@pytest.fixture(scope="module")
def contract_metrics() -> set[str]:
    return CONTRACT_METRICS


def variable(dashboard: dict[str, Any], name: str) -> dict[str, Any]:
    (found,) = [v for v in dashboard["templating"]["list"] if v["name"] == name]
    return found


def panel(dashboard: dict[str, Any], title: str) -> dict[str, Any]:
    (found,) = [p for p in iter_panels(dashboard) if p["title"] == title]
    return found


def test_contract_parser_finds_the_metrics_and_interval_bounds(contract_metrics: set[str]) -> None:
    assert {
        "model_positive_prediction_rate",
        "model_positive_prediction_rate_upper",
        "model_disparate_impact_ratio_lower",
        "fairness_labelled_predictions_total",
        "fairness_exporter_labels_expired_total",
        "fairness_exporter_consumer_lag_messages",
        "up",
    } <= contract_metrics
    not_metrics = {"model_id", "malformed_json", "model_comparison_insufficient_samples_lower"}
    assert not not_metrics & contract_metrics


def test_metric_names_skips_functions_labels_and_durations() -> None:
    expr = 'sum by (reason) (rate(fairness_exporter_events_rejected_total{m="a"}[5m])) / on() vector(1e3)'
    assert metric_names(expr) == {"fairness_exporter_events_rejected_total"}
    assert metric_names('label_replace({__name__=~"model_(disparate_impact)_ratio_(lower|upper)", x="y"}, '
                        '"metric", "$1", "__name__", "model_(.+)")') == {
        "model_disparate_impact_ratio_lower", "model_disparate_impact_ratio_upper"}
    assert metric_names("time() - fairness_exporter_last_computation_timestamp_seconds") == {
        "fairness_exporter_last_computation_timestamp_seconds"
    }


def test_dashboard_has_identity_and_schema(dashboard: dict[str, Any]) -> None:
    assert dashboard["uid"] == "fairness-exporter"
    assert dashboard["title"]
    assert isinstance(dashboard["schemaVersion"], int)


def test_datasource_is_a_variable_used_by_every_query(dashboard: dict[str, Any]) -> None:
    datasource = variable(dashboard, "datasource")
    assert (datasource["type"], datasource["query"]) == ("datasource", "prometheus")
    for each in iter_panels(dashboard):
        assert each["datasource"] == DATASOURCE, each["title"]
        assert all(target["datasource"] == DATASOURCE for target in each["targets"]), each["title"]


@pytest.mark.parametrize("name", ["model_id", "attribute", "window"])
def test_selection_variables_are_label_values_of_selection_rate(dashboard: dict[str, Any], name: str) -> None:
    templated = variable(dashboard, name)
    assert templated["type"] == "query"
    assert templated["datasource"] == DATASOURCE
    assert re.fullmatch(rf"label_values\(model_positive_prediction_rate(\{{[^}}]*\}})?, {name}\)",
                        templated["query"]["query"])  # fmt: skip


def test_every_panel_has_a_target_with_an_expr(dashboard: dict[str, Any]) -> None:
    panels = list(iter_panels(dashboard))
    assert len(panels) >= 12
    for each in panels:
        assert any(target.get("expr", "").strip() for target in each.get("targets", [])), each["title"]


def test_panel_ids_are_unique_and_the_grid_does_not_overlap(dashboard: dict[str, Any]) -> None:
    cells: dict[tuple[int, int], str] = {}
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids))
    for each in dashboard["panels"]:
        grid = each["gridPos"]
        assert grid["x"] + grid["w"] <= 24, each["title"]
        for x in range(grid["x"], grid["x"] + grid["w"]):
            for y in range(grid["y"], grid["y"] + grid["h"]):
                assert (x, y) not in cells, f"{each['title']} overlaps {cells[(x, y)]}"
                cells[(x, y)] = each["title"]


def test_every_expr_metric_is_in_the_contract(dashboard: dict[str, Any], contract_metrics: set[str]) -> None:
    selectors = [
        (f"variable {v['name']}", re.fullmatch(r"label_values\((.*), \w+\)", v["query"]["query"]).group(1))
        for v in dashboard["templating"]["list"]
        if v["type"] == "query"
    ]
    used = {}
    for title, expr in panel_queries() + selectors:
        names = metric_names(expr)
        assert names, f"{title}: no metric in {expr!r}"
        used.update(dict.fromkeys(names, title))
    unknown = {name: title for name, title in used.items() if name not in contract_metrics}
    assert not unknown, f"metrics not in docs/contract.md: {unknown}"


NAMESPACE_FILTER = 'namespace=~"$namespace"'


def test_every_selector_of_every_query_filters_on_the_selected_namespaces(dashboard: dict[str, Any]) -> None:
    """One release of the chart per team: a team's panels must not add up, or mix in, another namespace's models
    of the same name. The variables that list models, attributes, windows, replicas and comparisons too."""
    queries = [(each["title"], target["expr"]) for each in iter_panels(dashboard) for target in each["targets"]]
    listed = [v for v in dashboard["templating"]["list"] if v["type"] == "query" and v["name"] != "namespace"]
    queries += [(f"${v['name']}", re.sub(r"^label_values\((.*), \w+\)$", r"\1", v["query"]["query"]))
                for v in listed]  # label_values(<selector>, <label>)
    found = [(title, name, matchers) for title, expr in queries for name, matchers in selectors(expr)]
    assert {title for title, _, _ in found} == {title for title, _ in queries}, "a query without a selector found"
    unfiltered = sorted({(title, name) for title, name, matchers in found
                         if matchers.get("namespace") != "=~$namespace"})  # fmt: skip
    assert not unfiltered, f"selectors without {NAMESPACE_FILTER}: {unfiltered}"


def test_the_namespace_variable_lists_the_exporters_namespaces_and_all_of_them_by_default(
        dashboard: dict[str, Any]) -> None:  # fmt: skip
    """"All" is `.*`, which PromQL also matches against a series without a namespace label: a plain Prometheus
    (no Kubernetes, no namespace label) sees every panel as before. The staged-snapshot panel's promtool test below
    runs with it on such series."""
    namespace = variable(dashboard, "namespace")
    assert namespace["query"]["query"] == 'label_values(up{job="fairness-exporter"}, namespace)'
    assert (namespace["multi"], namespace["includeAll"], namespace["allValue"]) == (True, True, ".*")
    assert "current" not in namespace, "Grafana selects the first option, All, when none is saved"
    assert DEFAULT_VARIABLES["namespace"] == ".*"


def test_queries_filter_on_the_selected_model_attribute_and_window(dashboard: dict[str, Any]) -> None:
    """The fleet row's queries cover the models selected in `models`, every attribute, in the selected window; the
    other rows' follow the one selected model and attribute."""
    fleet = {p["id"] for p in fleet_panels(dashboard)}
    for each in iter_panels(dashboard):
        for target in each["targets"]:
            expr = target["expr"]
            windowed = re.findall(r"\bmodel_\w+\{[^}]*\}|\{__name__=~\"model_[^}]*\}", expr)
            if each["id"] in fleet:
                assert 'model_id="$model_id"' not in expr and "$attribute" not in expr, each["title"]
                selectors = re.findall(r"\{[^}]*\}", expr)
                assert selectors and all('model_id=~"$models"' in sel for sel in selectors), (each["title"], expr)
                assert all('window="$window"' in sel for sel in windowed), (each["title"], expr)
            elif windowed:
                for name in ("model_id", "attribute", "window"):
                    assert f'{name}="${name}"' in expr, (each["title"], expr)


@pytest.mark.parametrize(
    ("title", "metric", "threshold"),
    # every metric of the metric table has its panel, titled after it, with its default threshold as a line
    [(name.replace("_", " ").capitalize(), m.prometheus_name, m.default_threshold) for name, m in METRICS.items()],
)
def test_gap_panels_draw_their_threshold_line(
    dashboard: dict[str, Any], title: str, metric: str, threshold: float
) -> None:
    gap = panel(dashboard, title)
    defaults = gap["fieldConfig"]["defaults"]
    assert threshold in [step["value"] for step in defaults["thresholds"]["steps"]]
    assert defaults["custom"]["thresholdsStyle"]["mode"] in {"line", "dashed", "line+area", "dashed+area"}
    assert {metric, f"{metric}_lower", f"{metric}_upper"} <= set().union(
        *(metric_names(t["expr"]) for t in gap["targets"])
    )


def test_dashboard_covers_fairness_samples_and_daemon_health(dashboard: dict[str, Any]) -> None:
    used = set().union(*(metric_names(expr) for _, expr in panel_queries()))
    assert {
        "model_positive_prediction_rate",
        "model_true_positive_rate",
        "model_false_positive_rate",
        "model_subgroup_samples",
        "model_subgroup_labelled_samples",
        "model_subgroup_unknown_samples",
        "model_labelled_fraction",
        "model_comparison_insufficient_samples",
        "model_comparison_evidence",
        "fairness_exporter_events_consumed_total",
        "fairness_exporter_events_rejected_total",
        "fairness_exporter_events_late_total",
        "fairness_exporter_consumer_lag_messages",
        "fairness_exporter_last_computation_timestamp_seconds",
        "fairness_exporter_computation_duration_seconds",
        "fairness_exporter_kafka_connected",
        "fairness_exporter_partition_resets_total",
        "fairness_exporter_checkpoint_failures_total",
        "fairness_exporter_state_snapshot_failures_total",
        "fairness_exporter_last_state_snapshot_timestamp_seconds",
        "fairness_exporter_state_snapshot_interval_seconds",
        "fairness_exporter_dead_letters_failed_total",
        "fairness_exporter_labels_dropped_total",
        "fairness_detector_statistic",
        "fairness_detector_alarm",
        "fairness_subgroup_detector_statistic",
        "fairness_subgroup_detector_alarm",
        "fairness_detector_alarm_level",
    } <= used


def evidence_mapping(panel: dict[str, Any], ref: str) -> dict[str, str]:
    """The texts a panel shows for query `ref`'s values: its defaults' mapping, or (a table) its column's."""
    mappings = panel["fieldConfig"]["defaults"].get("mappings")
    if panel["type"] == "table":
        (column,) = [o for o in panel["fieldConfig"]["overrides"] if o["matcher"]["options"] == f"Value #{ref}"]
        mappings = next(q["value"] for q in column["properties"] if q["id"] == "mappings")
    (mapping,) = mappings
    return {k: v["text"] for k, v in mapping["options"].items()}


def test_the_evidence_of_every_comparison_is_drawn_as_pass_inconclusive_or_fail(dashboard: dict[str, Any]) -> None:
    """model_comparison_evidence has a label per state; the panels that show the state fold the states into 0/1/2
    and name them (the fleet's counts of failing comparisons read the fail state alone)."""
    folded = [(p, t) for p in iter_panels(dashboard) for t in p["targets"] if 'evidence="fail"} * 2' in t["expr"]]
    assert {p["title"] for p, _ in folded} == {"Evidence per comparison", "Evidence: $dimension",
                                               "Fleet: each model's worst comparison per metric",
                                               "Fleet: worst evidence per model"}  # fmt: skip
    for each, target in folded:
        assert each["type"] in {"state-timeline", "table"}
        assert evidence_mapping(each, target["refId"]) == {"0": "pass", "1": "inconclusive", "2": "fail"}
        assert 'evidence="inconclusive"}' in target["expr"] and "sum without (evidence)" in target["expr"]
    for each in iter_panels(dashboard):
        for target in each["targets"]:
            if "model_comparison_evidence" in metric_names(target["expr"]) and target not in [t for _, t in folded]:
                assert re.findall(r'model_comparison_evidence\{[^}]*\}', target["expr"]) and all(
                    'evidence="fail"' in sel for sel in re.findall(r'model_comparison_evidence\{[^}]*\}',
                                                                   target["expr"])), each["title"]


def test_every_comparison_has_a_row_with_each_metric_in_its_shaded_95_band(dashboard: dict[str, Any]) -> None:
    """Grafana fills between two series only by a fixed series name, so the band is drawn in a row repeated per
    comparison (the `dimension` variable), where each panel has one value, one lower and one upper series."""
    variable_ = variable(dashboard, "dimension")
    assert variable_["multi"] and variable_["includeAll"]
    assert variable_["query"]["query"] == ('label_values(model_comparison_evidence{namespace=~"$namespace", '
                                       'model_id="$model_id", attribute="$attribute", window="$window"}, '
                                       "dimension)")  # fmt: skip
    (row,) = [p for p in dashboard["panels"] if p.get("repeat") == "dimension"]
    assert row["type"] == "row" and "$dimension" in row["title"]
    bands = {t["expr"].split("{")[0]: p for p in row["panels"] for t in p["targets"] if p["type"] == "timeseries"}
    assert set(bands) >= {m.prometheus_name for m in METRICS.values()}
    for metric in METRICS.values():
        band = bands[metric.prometheus_name]
        legends = {t["expr"].split("{")[0]: t["legendFormat"] for t in band["targets"]}
        assert legends == {metric.prometheus_name: "value", f"{metric.prometheus_name}_lower": "95% lower",
                           f"{metric.prometheus_name}_upper": "95% upper"}  # fmt: skip
        assert all('dimension="$dimension"' in t["expr"] for t in band["targets"])
        fills = {o["matcher"]["options"]: {q["id"]: q["value"] for q in o["properties"]}
                 for o in band["fieldConfig"]["overrides"]}  # fmt: skip
        assert fills["95% upper"]["custom.fillBelowTo"] == "95% lower" and fills["95% upper"]["custom.fillOpacity"] > 0
        steps = [s["value"] for s in band["fieldConfig"]["defaults"]["thresholds"]["steps"]]
        assert metric.default_threshold in steps and band["fieldConfig"]["defaults"]["custom"]["thresholdsStyle"]


def test_detector_statistics_are_drawn_against_the_alarm_level(dashboard: dict[str, Any]) -> None:
    """The paging evidence is readable: each statistic panel also draws the level its detectors alarm at, and the
    detectors follow the selected model and attribute (they have no window)."""
    for title in ("Pair detector statistic vs alarm level", "Subgroup detector statistic vs alarm level"):
        names = [metric_names(t["expr"]) for t in panel(dashboard, title)["targets"]]
        assert {"fairness_detector_alarm_level"} in names, title
    fleet = {p["id"] for p in fleet_panels(dashboard)}
    for each in iter_panels(dashboard):
        for target in each["targets"]:
            if each["id"] not in fleet and re.search(r"\bfairness_(?:subgroup_)?detector_(?:statistic|alarm)\{",
                                                     target["expr"]):  # fmt: skip
                assert 'model_id="$model_id"' in target["expr"] and 'attribute="$attribute"' in target["expr"]


SNAPSHOTS = "Staged snapshots: seconds since the last whole round, and failed rounds"
SNAPSHOT_ALERT = "FairnessExporterStateSnapshotFailing"


def _alert_expr(name: str) -> str:
    from exporter.devtools import rules

    (expr,) = [r["expr"] for g in rules.rule_file()["groups"] for r in g["rules"] if r.get("alert") == name]
    return str(expr)


def test_the_staged_snapshot_panel_draws_the_age_against_the_threshold_the_alert_computes(
        dashboard: dict[str, Any]) -> None:  # fmt: skip
    """The age and the threshold are the alert's own expressions (the rule generator's text), filtered on the
    instances selected; the age keeps only staged replicas (those exporting the snapshot interval), as the alert's
    comparison does, so a direct replica's start is not drawn as an ever older snapshot."""
    from exporter.devtools import rule_text as rules

    age, threshold, failures = (t["expr"] for t in panel(dashboard, SNAPSHOTS)["targets"])
    alert = _alert_expr(SNAPSHOT_ALERT)
    filters = f'{{{NAMESPACE_FILTER}, instance=~"$instance"}}'
    unfiltered = {e: e.replace(filters, "") for e in (age, threshold, failures)}
    left, right = alert.replace(f"{{{rules.SCOPE}}}", "").split("\n  > on (job, instance) group_left ()\n  ")
    own, staged = unfiltered[age].split("\nand on (job, instance) ")
    assert (own, staged) == (left, "fairness_exporter_state_snapshot_interval_seconds")
    assert f"({unfiltered[threshold]})" == right
    assert metric_names(failures) == {"fairness_exporter_state_snapshot_failures_total"}
    assert panel(dashboard, SNAPSHOTS)["fieldConfig"]["overrides"][0]["matcher"]["options"] == "/ alert threshold$/"


def test_the_staged_snapshot_panel_on_the_series_the_alert_fires_on(dashboard: dict[str, Any], tmp_path: Path) -> None:
    """promtool evaluates the panel's queries on the input series of the alert's own unit test
    (rules/tests/stages.test.yaml): at 22m, when the alert fires for a, a's age is 720 s against its threshold of
    360 s, its rounds failing at 2 a minute; b, whose rounds failed for 4 minutes and succeed again, is 0 s old
    and fails none; c, a direct replica, has no series in any of the three queries."""
    promtool = require_binary("promtool")
    tests = yaml.safe_load((ROOT / "rules" / "tests" / "stages.test.yaml").read_text())["tests"]
    (fires,) = [t for t in tests if t["name"].startswith(f"{SNAPSHOT_ALERT} fires")]
    firing = {k: v for k, v in fires["alert_rule_test"][1].items() if k != "exp_alerts"}
    assert firing == {"alertname": SNAPSHOT_ALERT, "eval_time": "22m"}
    age, threshold, failures = (substitute(t["expr"], {**DEFAULT_VARIABLES, "__rate_interval": "2m"})
                                for t in panel(dashboard, SNAPSHOTS)["targets"])  # fmt: skip
    staged = [{"labels": f'{{job="fairness-exporter", instance="{i}:9108"}}', "value": v} for i, v in
              (("a", 720), ("b", 0))]  # fmt: skip
    expected = [{"expr": age, "eval_time": "22m", "exp_samples": staged},
                {"expr": threshold, "eval_time": "22m", "exp_samples": [dict(s, value=360) for s in staged]},
                {"expr": failures, "eval_time": "22m", "exp_samples": [
                    {"labels": '{instance="a:9108"}', "value": 2 / 60}, {"labels": '{instance="b:9108"}', "value": 0}]}]
    test = {"rule_files": [], "evaluation_interval": "1m",
            "tests": [{"interval": fires["interval"], "input_series": fires["input_series"],
                       "promql_expr_test": expected}]}  # fmt: skip
    (tmp_path / "panel.test.yaml").write_text(yaml.safe_dump(test))
    result = subprocess.run([promtool, "test", "rules", "panel.test.yaml"], cwd=tmp_path, capture_output=True,
                            text=True, timeout=120, check=False)  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr


def test_panel_queries_substitute_every_variable() -> None:
    queries = panel_queries({"model_id": "credit-v1", "window": "24h"})
    assert not any(re.search(r"\$(?!\d)", expr) for _, expr in queries)  # $1: label_replace's, no variable
    assert any('model_id="credit-v1"' in expr and 'window="24h"' in expr for _, expr in queries)
    with pytest.raises(KeyError, match="unknown_var"):
        substitute('up{x="$unknown_var"}', DEFAULT_VARIABLES)


def test_every_expr_is_valid_promql(tmp_path: Path) -> None:
    promtool = require_binary("promtool")
    rules = [{"record": f"dashboard:query_{i}", "expr": expr} for i, (_, expr) in enumerate(panel_queries())]
    rule_file = tmp_path / "dashboard-queries.rules.yaml"
    rule_file.write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": rules}]}))
    result = subprocess.run([promtool, "check", "rules", str(rule_file)], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_gate_docs_and_the_contract_list_every_metric_of_the_table(contract_metrics: set[str]) -> None:
    gate_docs = (ROOT / "docs" / "ml" / "gate.md").read_text()
    for name, metric in METRICS.items():
        assert {metric.prometheus_name, f"{metric.prometheus_name}_lower", f"{metric.prometheus_name}_upper"} <= \
            contract_metrics, name  # fmt: skip
        assert f"| `{name}` |" in gate_docs, name


def test_the_fleet_row_comes_first_and_its_models_are_a_multi_value_variable(dashboard: dict[str, Any]) -> None:
    assert dashboard["panels"][0]["title"].startswith("Fleet")
    models = variable(dashboard, "models")
    assert models["type"] == "query" and models["datasource"] == DATASOURCE
    assert models["query"]["query"] == f"label_values(fairness_model_info{{{NAMESPACE_FILTER}}}, model_id)"
    assert models["multi"] and models["includeAll"] and models["allValue"] == ".*"


def test_the_fleet_shows_each_models_worst_gap_with_its_interval_threshold_and_evidence(
    dashboard: dict[str, Any],
) -> None:
    worst = panel(dashboard, "Fleet: each model's worst comparison per metric")
    used = set().union(*(metric_names(t["expr"]) for t in worst["targets"]))
    for metric in METRICS.values():  # every metric of the table, as the per-model rows show them
        assert {metric.prometheus_name, f"{metric.prometheus_name}_lower", f"{metric.prometheus_name}_upper"} <= used
    assert {"model_comparison_evidence", "fairness_threshold"} <= used
    # every query keeps the comparison's labels (and the threshold adds its severity), so the table joins them
    (first, *others) = [t["expr"] for t in worst["targets"]]
    assert all(first in expr for expr in others)
    names = {o["matcher"]["options"]: {q["id"]: q["value"] for q in o["properties"]}.get("displayName")
             for o in worst["fieldConfig"]["overrides"]}  # fmt: skip
    assert {names[f"Value #{t['refId']}"] for t in worst["targets"]} == {"worst value", "95% lower", "95% upper",
                                                                         "evidence", "threshold"}  # fmt: skip


def test_the_fleet_shows_detectors_in_alarm_traffic_labels_and_versions(dashboard: dict[str, Any]) -> None:
    used = set().union(*(metric_names(t["expr"]) for p in fleet_panels(dashboard) for t in p["targets"]))
    assert {"fairness_detector_alarm", "fairness_subgroup_detector_alarm", "model_subgroup_samples",
            "model_subgroup_labelled_samples", "fairness_model_info"} <= used  # fmt: skip


def test_a_model_in_a_fleet_table_opens_its_own_rows(dashboard: dict[str, Any]) -> None:
    tables = [p for p in fleet_panels(dashboard) if p["type"] == "table"]
    assert len(tables) == 3
    for table in tables:
        (column,) = [o for o in table["fieldConfig"]["overrides"] if o["matcher"]["options"] == "model_id"]
        (link,) = next(q["value"] for q in column["properties"] if q["id"] == "links")
        assert link["url"].startswith(f"/d/{dashboard['uid']}/") and "var-model_id=${__value.raw}" in link["url"]


@pytest.fixture(scope="module")
def tsc() -> list[str]:
    """node and the TypeScript compiler installed beside @grafana/schema by `make test-deps`."""
    node = require_binary("node")
    compiler = SCHEMA_TOOLS / "node_modules" / "typescript" / "bin" / "tsc"
    if not (compiler.is_file() and (SCHEMA_TOOLS / "node_modules" / "@grafana" / "schema").is_dir()):
        missing(f"@grafana/schema and typescript are not installed in {SCHEMA_TOOLS.relative_to(ROOT)} (npm ci)")
    return [node, str(compiler)]


def panel_of(dashboard: dict[str, Any], kind: str) -> dict[str, Any]:
    return next(p for p in iter_panels(dashboard) if p["type"] == kind)


MUTATIONS: dict[str, Callable[[dict[str, Any]], None]] = {
    "a key no panel has": lambda d: panel_of(d, "timeseries").update(tpye="timeseries"),
    "a legend display mode Grafana lacks": lambda d: panel_of(d, "timeseries")["options"]["legend"].update(
        displayMode="lsit"),
    "a cursor sync out of range": lambda d: d.update(graphTooltip=7),
    "a draw style Grafana lacks": lambda d: panel_of(d, "timeseries")["fieldConfig"]["defaults"].setdefault(
        "custom", {}).update(drawStyle="lines"),
    "a variable without a name": lambda d: d["templating"]["list"][0].pop("name"),
    "a threshold mode Grafana lacks": lambda d: panel_of(d, "stat")["fieldConfig"]["defaults"]["thresholds"].update(
        mode="relative"),
}  # fmt: skip
"""Edits the schema refuses: the check must fail on each (a check that cannot fail proves nothing)."""


def test_the_dashboard_is_valid_by_grafanas_published_schema(dashboard: dict[str, Any], tsc: list[str],
                                                             tmp_path: Path) -> None:  # fmt: skip
    """The dashboard as an object literal of Grafana's own types (@grafana/schema's Dashboard, each panel's options
    and custom field config its plugin's; tools/grafana-schema/dashboard.ts), compiled with `tsc --strict`: no error
    on the shipped file, and at least one on each of the edits of MUTATIONS, each in its own constant."""
    (tmp_path / "node_modules").symlink_to(SCHEMA_TOOLS / "node_modules")
    (tmp_path / "dashboard.ts").write_text((SCHEMA_TOOLS / "dashboard.ts").read_text())
    lines = ['import type { FairnessDashboard } from "./dashboard";']
    spans: dict[str, range] = {}
    for name, mutate in {"the shipped dashboard": None, **MUTATIONS}.items():
        edited = copy.deepcopy(dashboard)
        if mutate is not None:
            mutate(edited)
        body = f"export const case{len(spans)}: FairnessDashboard = {json.dumps(edited, indent=2)};".splitlines()
        spans[name] = range(len(lines) + 1, len(lines) + len(body) + 1)
        lines += body
    (tmp_path / "check.ts").write_text("\n".join(lines) + "\n")
    done = subprocess.run([*tsc, "--noEmit", "--strict", "--target", "es2022", "--module", "esnext",
                           "--moduleResolution", "bundler", "--skipLibCheck", "check.ts"],
                          cwd=tmp_path, capture_output=True, text=True, check=False)  # fmt: skip
    errors: dict[str, list[str]] = {name: [] for name in spans}
    for line in done.stdout.splitlines():
        match = TS_ERROR.match(line)
        if match:
            (name,) = [n for n, span in spans.items() if int(match.group(1)) in span]
            errors[name].append(match.group(2))
    assert not errors.pop("the shipped dashboard"), done.stdout
    assert all(errors.values()), {name: found for name, found in errors.items() if not found}
    assert done.returncode == 2 and not done.stderr
