"""The toolkit of config validation (collect every problem, convert values) and the sections the gate reads:
protected attributes, intersections and metrics. The daemon's sections are in :mod:`exporter.config_daemon`."""

from __future__ import annotations

import itertools
import os
import re
from collections.abc import Callable, Iterator
from typing import Any, Final

from exporter.config import SEVERITIES, MetricSpec
from exporter.core.attributes import INTERSECTION_SEP, OTHER_GROUP, Attribute
from exporter.core.metric_table import METRIC_NAMES

_ENV_REF = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")


class Errors:
    """Collects problems as ``field: message`` lines."""

    def __init__(self) -> None:
        self.lines: list[str] = []

    def add(self, path: str, message: str) -> None:
        self.lines.append(f"{path}: {message}")

    def check_keys(self, path: str, mapping: dict[str, Any], allowed: set[str]) -> None:
        for key in sorted(set(mapping) - allowed):
            self.add(f"{path}.{key}" if path else key, f"unknown key (accepted: {', '.join(sorted(allowed))})")

    def mappings(
        self, section: str, items: list[Any], allowed: set[str], what: str
    ) -> Iterator[tuple[str, dict[str, Any]]]:
        """(path, item) of each item of a list section that is a mapping with known keys; the others are errors."""
        for i, item in enumerate(items):
            path = f"{section}[{i}]"
            if not isinstance(item, dict):
                self.add(path, f"{item!r} is not a mapping{what}")
                continue
            self.check_keys(path, item, allowed)
            yield path, item


def expand_env(value: Any, errors: Errors, path: str = "") -> Any:
    """Replace ``${NAME}`` in every string with the environment variable NAME."""
    if isinstance(value, dict):
        return {k: expand_env(v, errors, f"{path}.{k}" if path else str(k)) for k, v in value.items()}
    if isinstance(value, list):
        return [expand_env(v, errors, f"{path}[{i}]") for i, v in enumerate(value)]
    if isinstance(value, str):

        def sub(m: re.Match[str]) -> str:
            if m.group(1) not in os.environ:
                errors.add(path, f"environment variable {m.group(1)} is not set")
                return ""
            return os.environ[m.group(1)]

        return _ENV_REF.sub(sub, value)
    return value


def get(
    raw: dict[str, Any], key: str, default: Any, errors: Errors, path: str, convert: Callable[[Any], Any]
) -> Any:
    """raw[key] converted, or default when absent; a conversion failure is recorded and gives default."""
    if key not in raw or raw[key] is None:
        return default
    try:
        return convert(raw[key])
    except (TypeError, ValueError) as exc:
        errors.add(f"{path}{key}", f"{raw[key]!r} is invalid: {exc}")
        return default


def positive_int(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError("expected a whole number >= 1")
    return value


def choice(*options: str) -> Callable[[Any], str]:
    def convert(value: Any) -> str:
        if value not in options:
            raise ValueError(f"expected one of {', '.join(options)}")
        return str(value)

    return convert


def text(value: Any) -> str:
    if not isinstance(value, str | int | float) or isinstance(value, bool) or not str(value).strip():
        raise ValueError("expected a non-empty string")
    return str(value)


def port(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= 65535:
        raise ValueError("expected a port number 0..65535")
    return value


def _parse_pairs(raw: Any, groups: list[str], path: str, errors: Errors) -> tuple[tuple[int, int], ...]:
    if raw is None or raw == "all":
        return tuple(itertools.combinations(range(len(groups)), 2))
    if not isinstance(raw, list):
        errors.add(path, f"{raw!r} is neither 'all' nor a list of [group_a, group_b] pairs")
        return ()
    pairs = []
    for i, pair in enumerate(raw):
        if not (isinstance(pair, list) and len(pair) == 2):
            errors.add(f"{path}[{i}]", f"{pair!r} is not a pair [group_a, group_b]")
            continue
        a, b = (str(g) for g in pair)
        for g in (a, b):
            if g not in groups:
                errors.add(f"{path}[{i}]", f"group {g!r} is not in groups {groups}")
        if a == b:
            errors.add(f"{path}[{i}]", f"compares {a!r} with itself")
        if a in groups and b in groups and a != b:
            pairs.append((groups.index(a), groups.index(b)))
    return tuple(pairs)


def parse_attributes(raw: Any, other: bool, errors: Errors) -> list[Attribute]:
    if not isinstance(raw, list) or not raw:
        errors.add("protected_attributes", "required: a non-empty list of {name, groups, pairwise_comparisons}")
        return []
    out: list[Attribute] = []
    for path, item in errors.mappings("protected_attributes", raw, {"name", "groups", "pairwise_comparisons", "column"},
                                      " with name and groups"):
        name = item.get("name")
        if not isinstance(name, str) or not name:
            errors.add(f"{path}.name", "required: the attribute's name")
            continue
        if any(a.name == name for a in out):
            errors.add(f"{path}.name", f"{name!r} is configured twice")
        groups_raw = item.get("groups")
        if not isinstance(groups_raw, list) or len(groups_raw) < 2:
            errors.add(f"{path}.groups", f"{groups_raw!r} is not a list of at least two groups")
            continue
        groups = [str(g) for g in groups_raw]
        if len(set(groups)) != len(groups):
            errors.add(f"{path}.groups", f"{groups} lists a group twice")
        if other and OTHER_GROUP in groups:
            errors.add(f"{path}.groups", f"{OTHER_GROUP!r} is reserved when unknown_values is 'other'")
        pairs = _parse_pairs(item.get("pairwise_comparisons"), groups, f"{path}.pairwise_comparisons", errors)
        column = str(item.get("column", name))
        out.append(Attribute(name, (column,), tuple([*groups, OTHER_GROUP] if other else groups), pairs))
    return out


def parse_intersections(raw: Any, base: list[Attribute], errors: Errors) -> list[Attribute]:
    if raw is None:
        return []
    if not isinstance(raw, list):
        errors.add("intersections", f"{raw!r} is not a list of attribute-name lists, e.g. [[gender, age_group]]")
        return []
    by_name = {a.name: a for a in base}
    out = []
    for i, names in enumerate(raw):
        path = f"intersections[{i}]"
        if not (isinstance(names, list) and len(names) >= 2 and all(isinstance(n, str) for n in names)):
            errors.add(path, f"{names!r} is not a list of two or more attribute names")
            continue
        unknown = [n for n in names if n not in by_name]
        if unknown:
            errors.add(path, f"{unknown} not among protected_attributes {sorted(by_name)}")
            continue
        parts = [by_name[n] for n in names]
        groups = tuple(INTERSECTION_SEP.join(combo) for combo in itertools.product(*(p.groups for p in parts)))
        configured = [
            i
            for i, combo in enumerate(itertools.product(*(p.groups for p in parts)))
            if OTHER_GROUP not in combo
        ]
        out.append(
            Attribute(
                name="_x_".join(names),
                columns=tuple(p.columns[0] for p in parts),
                groups=groups,
                pairs=tuple(itertools.combinations(configured, 2)),
                base_sizes=tuple(len(p.groups) for p in parts),
            )
        )
    return out


def parse_metrics(raw: Any, errors: Errors) -> list[MetricSpec]:
    if raw is None:
        return [
            MetricSpec("demographic_parity_difference", 0.05, "blocking"),
            MetricSpec("disparate_impact_ratio", 0.80, "blocking"),
        ]
    if not isinstance(raw, list):
        errors.add("metrics", f"{raw!r} is not a list of {{name, threshold, severity_on_fail}}")
        return []
    out = []
    for path, item in errors.mappings("metrics", raw, {"name", "threshold", "severity_on_fail", "max_interval_width"},
                                      ""):
        name, threshold = item.get("name"), item.get("threshold")
        severity = item.get("severity_on_fail", "blocking")
        ok = True
        if name not in METRIC_NAMES:
            errors.add(f"{path}.name", f"unknown metric {name!r} (accepted: {', '.join(METRIC_NAMES)})")
            ok = False
        if isinstance(threshold, bool) or not isinstance(threshold, int | float) or not 0 <= threshold <= 1:
            errors.add(f"{path}.threshold", f"{threshold!r} is not a number between 0 and 1")
            ok = False
        if severity not in SEVERITIES:
            errors.add(f"{path}.severity_on_fail", f"{severity!r} is not one of {', '.join(SEVERITIES)}")
            ok = False
        width = item.get("max_interval_width")
        if width is not None and (isinstance(width, bool) or not isinstance(width, int | float) or not 0 < width <= 1):
            errors.add(f"{path}.max_interval_width", f"{width!r} is not a number in (0, 1]")
            ok = False
        if ok and isinstance(name, str) and isinstance(threshold, int | float):
            out.append(MetricSpec(name, float(threshold), severity, None if width is None else float(width)))
    return out


def parse_decision(raw: dict[str, Any], errors: Errors) -> tuple[Any, Any]:
    """``decision`` and ``failure_policy.inconclusive``. What blocks is set per metric by severity_on_fail, so
    ``failure_policy.blocking_failures`` / ``warning_failures`` only accept the values that state it (the seed's
    form): a knob that would be ignored is refused instead."""
    decision = get(raw, "decision", "point_estimate", errors, "", choice("point_estimate", "evidence"))
    policy = section(raw, "failure_policy", errors, {"blocking_failures", "warning_failures", "inconclusive",
                                                           "report_destination"})
    get(policy, "blocking_failures", None, errors, "failure_policy.", choice("halt_deployment"))
    get(policy, "warning_failures", None, errors, "failure_policy.", choice("log_and_continue"))
    return decision, get(policy, "inconclusive", "fail", errors, "failure_policy.", choice("fail", "warn"))


def section(raw: dict[str, Any], key: str, errors: Errors, allowed: set[str]) -> dict[str, Any]:
    value = raw.get(key)
    if value is None:
        return {}
    if not isinstance(value, dict):
        errors.add(key, f"{value!r} is not a mapping")
        return {}
    errors.check_keys(key, value, allowed)
    return value


TOP_LEVEL: Final = {
    "model_id", "protected_attributes", "intersections", "metrics", "failure_policy", "decision", "min_samples",
    "unknown_values", "columns", "kafka", "events", "windows", "bucket", "allowed_lateness", "max_future_skew",
    "evaluation_interval", "label_horizon", "max_pending_labels", "listen", "checkpoint", "alerting",
    "model_version", "evaluation_dataset",
}  # fmt: skip
