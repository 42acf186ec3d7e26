"""Validate one model's part of the config: its protected attributes, intersections, metrics, decision rule,
columns, event field paths and alerting budget, into a :class:`~exporter.config.types.ModelSpec`.

The same parser reads a single-model file's top level, each entry of ``models:`` and each file of ``models_dir``;
errors name the model (``models[1] (credit-scorer-v4).metrics[0].threshold: ...``).
"""

from __future__ import annotations

import itertools
from typing import Any, Final

from exporter.config import sections_stream as stream
from exporter.config.sections_intersections import parse_intersections
from exporter.config.sections_sources import attach, parse_sources
from exporter.config.toolkit import Errors, choice, get, section, text
from exporter.config.types import SEVERITIES, EstimationSpec, EventFields, MetricSpec, ModelSpec, parse_duration
from exporter.core import bisg
from exporter.core.attributes import OTHER_GROUP, Attribute, Proxy
from exporter.core.conditional import CONDITIONAL_METRICS
from exporter.core.conditional import metric as any_metric
from exporter.core.explain import DEFAULT_SEGMENT_CAP
from exporter.core.metric_table import METRIC_NAMES
from exporter.core.multiplicity import MULTIPLICITY

MODEL_KEYS: Final = frozenset({
    "model_id", "protected_attributes", "intersections", "metrics", "failure_policy", "decision", "min_samples",
    "unknown_values", "columns", "events", "alerting", "model_version", "evaluation_dataset",
    "estimation", "attribute_sources", "multiplicity",
    "segments", "segment_values", "strata", "baseline_offset",
})  # fmt: skip
"""Keys of one model; at the top level of a file with ``models:``, each is the default of every model."""
MERGED_SECTIONS: Final = frozenset({"events", "alerting", "failure_policy", "columns"})
"""Mapping sections a model merges key by key over the top-level default (every other key replaces it)."""


def parse_model(raw: dict[str, Any], errors: Errors, source: str) -> ModelSpec | None:
    """One model's keys (already merged over the defaults); None when its model_id is unusable."""
    model_id = raw.get("model_id")
    if not isinstance(model_id, str) or not model_id.strip():
        errors.add("model_id", f"{model_id!r} is not a non-empty string")
        model_id = None
    unknown_values = get(raw, "unknown_values", "reject", errors, "", choice("reject", "other"))
    base = parse_attributes(raw.get("protected_attributes"), unknown_values == "other", errors)
    base, sources = attach(base, raw.get("protected_attributes"), parse_sources(raw.get("attribute_sources"), errors),
                           errors)  # fmt: skip
    attributes = base + parse_intersections(raw.get("intersections"), base, errors)
    metrics = parse_metrics(raw.get("metrics"), errors)
    decision, inconclusive = parse_decision(raw, errors)
    columns = section(raw, "columns", errors, {"prediction", "label", "score", "timestamp"})
    events = stream.parse_events(section(raw, "events", errors, set(EventFields.__dataclass_fields__)), errors)
    for m in (m for m in metrics if any_metric(m.name).scores):
        if events.score_threshold is None:
            errors.add("metrics", f"{m.name} compares the model's scores: set events.score_threshold (the score "
                                  "field, and the threshold that makes its predictions)")  # fmt: skip
        if any(a.proxy for a in base):
            errors.add("metrics", f"{m.name} not with a proxy attribute: the score histograms are kept per known "
                                  "group, and a proxy gives none")  # fmt: skip
    alerting = stream.parse_alerting(section(raw, "alerting", errors, set(stream.ALERTING_KEYS)),
                                     errors)  # fmt: skip
    min_samples = get(raw, "min_samples", 30, errors, "", _sample_floor)
    version = get(raw, "model_version", None, errors, "", text)
    estimation = parse_estimation(raw, events, errors)
    if estimation is not None and any(a.proxy for a in base):
        errors.add("estimation", "not with a proxy attribute: the calibration is per group, and a proxy gives none")
    segments, segment_values, strata = parse_segments(raw, errors)
    check_conditional(metrics, strata, errors)
    check_counted(base, segments, strata, errors)
    if model_id is None:
        return None
    spec = ModelSpec(
        model_id=model_id,
        base_attributes=tuple(base),
        attributes=tuple(attributes),
        metrics=tuple(metrics),
        min_samples=min_samples,
        decision=decision,
        inconclusive=inconclusive,
        unknown_values=unknown_values,
        prediction_column=str(columns.get("prediction", "prediction")),
        label_column=str(columns.get("label", "label")),
        score_column=str(columns["score"]) if columns.get("score") is not None else None,
        timestamp_column=str(columns.get("timestamp", "timestamp")),
        events=events,
        alerting=alerting,
        model_version=version,
        evaluation_dataset=get(raw, "evaluation_dataset", None, errors, "", text),
        estimation=estimation,
        report_destination=get(raw.get("failure_policy") or {}, "report_destination", None, errors,
                               "failure_policy.", text),
        source=source,
        attribute_sources=sources,
        multiplicity=get(raw, "multiplicity", "holm", errors, "", choice(*MULTIPLICITY)),
        segments=segments,
        segment_values=segment_values,
        strata=strata,
        baseline_offset=get(raw, "baseline_offset", None, errors, "", parse_duration),
    )
    if (at := spec.added_score_bound) is not None:
        errors.note("events.score_threshold", f"{spec.score_buckets[at]:g} added to the score bins' bounds, now "
                                              f"{list(spec.score_buckets)}: the estimation calibrates predicted "
                                              "negatives and positives apart; the score histograms show the added "
                                              "bound, AUC and ECE merge it back "
                                              "(docs/auditor/estimated.md)")  # fmt: skip
    return spec


MAX_MIN_SAMPLES: Final = 1_000_000
"""min_samples at most a million: a floor no group of a window reaches evaluates nothing, and a check that
evaluated nothing must not look like one that passed (1e9 was accepted)."""


def _sample_floor(value: Any) -> int:
    if isinstance(value, float) and value.is_integer():
        value = int(value)  # 1000.0 (YAML reads 1.0e+3 as a float, and 1e3 as text)
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_MIN_SAMPLES:
        raise ValueError(f"expected a whole number from 1 to {MAX_MIN_SAMPLES:,}")
    return value


def parse_pairs(raw: Any, groups: list[str], path: str, errors: Errors) -> tuple[tuple[int, int], ...]:
    """``pairwise_comparisons``: ``all`` (or absent), or a non-empty list of [group_a, group_b] pairs of ``groups``
    (the gate's config and the counterfactual suite alike)."""
    if raw is None or raw == "all":
        return tuple(itertools.combinations(range(len(groups)), 2))
    if not isinstance(raw, list):
        errors.add(path, f"{raw!r} is neither 'all' nor a list of [group_a, group_b] pairs")
        return ()
    if not raw:  # an attribute of no comparison would pass having compared nothing
        errors.add(path, "[] compares nothing: list [group_a, group_b] pairs, or 'all'")
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


def _reference_pairs(item: dict[str, Any], groups: list[str], path: str, errors: Errors) -> tuple[tuple[int, int], ...]:
    """``reference_group: g`` (Aequitas' usage): each other group compared with g, as ``[group, g]``."""
    reference = str(item["reference_group"])
    if "pairwise_comparisons" in item:
        errors.add(f"{path}.reference_group", "set either reference_group (each group against it) or "
                                              "pairwise_comparisons, not both")  # fmt: skip
    if reference not in groups:
        errors.add(f"{path}.reference_group", f"{reference!r} is not in groups {groups}")
        return ()
    r = groups.index(reference)
    return tuple((g, r) for g in range(len(groups)) if g != r)


def parse_attributes(raw: Any, other: bool, errors: Errors) -> list[Attribute]:
    if not isinstance(raw, list) or not raw:
        errors.add("protected_attributes", "required: a non-empty list of {name, groups, pairwise_comparisons}")
        return []
    out: list[Attribute] = []
    keys = {"name", "groups", "pairwise_comparisons", "reference_group", "column", "source", "proxy"}
    for path, item in errors.mappings("protected_attributes", raw, keys, " with name and groups"):
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
        if item.get("reference_group") is None:
            pairs = parse_pairs(item.get("pairwise_comparisons"), groups, f"{path}.pairwise_comparisons", errors)
        else:
            pairs = _reference_pairs(item, groups, path, errors)
        column = str(item.get("column", name))
        proxy = _parse_proxy(item, path, groups, errors)
        if proxy is not None:  # the mass of the categories not configured counts in no group: no `other` group
            out.append(Attribute(name, (column,), tuple(groups), pairs, proxy=proxy))
            continue
        out.append(Attribute(name, (column,), tuple([*groups, OTHER_GROUP] if other else groups), pairs, other=other,
                             catch_alls=frozenset({OTHER_GROUP} if other else ())))  # fmt: skip
    return out


def _parse_proxy(item: dict[str, Any], path: str, groups: list[str], errors: Errors) -> Proxy | None:
    """``proxy: {method: bisg, surname: COLUMN, zcta: COLUMN}``: the attribute inferred from those columns, its
    groups some of the method's categories (docs/auditor/proxy.md)."""
    if item.get("proxy") is None:
        return None
    within = errors.within(f"{path}.")
    spec = section(item, "proxy", within, {"method", "surname", "zcta"})
    method = get(spec, "method", None, within, "proxy.", choice(*bisg.METHODS))
    columns = [get(spec, key, None, within, "proxy.", text) for key in ("surname", "zcta")]
    for key in ("method", "surname", "zcta"):
        if isinstance(item["proxy"], dict) and key not in spec:
            within.add(f"proxy.{key}", "required: " + ("bisg" if key == "method" else "the column that holds it"))
    if "column" in item:
        errors.add(f"{path}.column", "a proxy attribute is inferred, not read from a column: remove column or proxy")
    try:  # read here (once per process), so every command refuses them at start, not at the first row
        bisg.tables()
    except ImportError as exc:
        within.add("proxy", str(exc))
    except (OSError, ValueError) as exc:
        within.add("proxy", f"the Census tables of method bisg cannot be read: {exc}")
    outside = [g for g in groups if g not in bisg.CATEGORIES]
    if outside:
        errors.add(f"{path}.groups", f"{outside} are not BISG categories (accepted: {', '.join(bisg.CATEGORIES)})")
    if method is None or None in columns:
        return None
    return Proxy(str(method), str(columns[0]), str(columns[1]))


IGNORED_MAX_INTERVAL_WIDTH: Final = (
    "ignored: no value is hidden for being imprecise any more; every comparison meeting min_samples is reported "
    "with its 95% interval and evidence (decision: evidence lets the interval decide). Remove the key.")


def parse_metrics(raw: Any, errors: Errors) -> list[MetricSpec]:
    if raw is None:
        return [
            MetricSpec("demographic_parity_difference", 0.05, "blocking"),
            MetricSpec("disparate_impact_ratio", 0.80, "blocking"),
        ]
    if not isinstance(raw, list):
        errors.add("metrics", f"{raw!r} is not a list of {{name, threshold, severity_on_fail}}")
        return []
    if not raw:  # a gate of no check would pass having evaluated nothing
        errors.add("metrics", "[] evaluates nothing: list the metrics, or leave the key out for the defaults "
                              "(demographic_parity_difference and disparate_impact_ratio)")  # fmt: skip
    out = []
    for path, item in errors.mappings("metrics", raw, {"name", "threshold", "severity_on_fail", "max_interval_width"},
                                      ""):
        name, threshold = item.get("name"), item.get("threshold")
        severity = item.get("severity_on_fail", "blocking")
        ok = True
        if name not in METRIC_NAMES and name not in CONDITIONAL_METRICS:
            errors.add(f"{path}.name", f"unknown metric {name!r} (accepted: "
                                       f"{', '.join([*METRIC_NAMES, *CONDITIONAL_METRICS])})")  # fmt: skip
            ok = False
        if isinstance(threshold, bool) or not isinstance(threshold, int | float) or not 0 <= threshold <= 1:
            errors.add(f"{path}.threshold", f"{threshold!r} is not a number between 0 and 1")
            ok = False
        if severity not in SEVERITIES:
            errors.add(f"{path}.severity_on_fail", f"{severity!r} is not one of {', '.join(SEVERITIES)}")
            ok = False
        if "max_interval_width" in item:
            errors.note(f"{path}.max_interval_width", IGNORED_MAX_INTERVAL_WIDTH)
        if ok and isinstance(name, str) and isinstance(threshold, int | float):
            out.append(MetricSpec(name, float(threshold), severity))
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


def parse_estimation(raw: dict[str, Any], events: EventFields, errors: Errors) -> EstimationSpec | None:
    """``estimation: {reference: PATH_OR_URL}``: only for a model that emits scores (the estimate calibrates them)."""
    if raw.get("estimation") is None:
        return None
    spec = section(raw, "estimation", errors, {"reference"})
    reference = get(spec, "reference", None, errors, "estimation.", text)
    if "reference" not in spec:
        errors.add("estimation.reference", "required: a labelled file (score, label, attributes) or its URL")
    if events.score_threshold is None:
        errors.add("estimation", "needs events.score_threshold: estimates calibrate the model's scores, and a model "
                                 "without scores has none")  # fmt: skip
    return EstimationSpec(reference) if reference is not None else None


def parse_segments(raw: dict[str, Any], errors: Errors) -> tuple[tuple[str, ...], int, tuple[str, ...]]:
    """``segments: [channel, region]`` (columns whose values explain a gap's change), ``segment_values`` (the values
    kept per column, the rest counted as ``other``) and ``strata: [income_band]`` (the columns conditional parity is
    conditioned on, their combined values capped alike)."""
    out = []
    for key in ("segments", "strata"):
        value = raw.get(key)
        columns: list[str] = []
        if value is not None and not (isinstance(value, list) and all(isinstance(c, str) and c for c in value)):
            errors.add(key, f"{value!r} is not a list of column names")
        elif value is not None:
            columns = list(dict.fromkeys(value))
        out.append(tuple(columns))
    cap = get(raw, "segment_values", DEFAULT_SEGMENT_CAP, errors, "", _segment_cap)
    return out[0], cap, out[1]


MAX_SEGMENT_VALUES: Final = 1000
"""A cap on values per segment column: a column of ids would otherwise make the daemon's state as large as them."""


def _segment_cap(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_SEGMENT_VALUES:
        raise ValueError(f"expected a whole number from 1 to {MAX_SEGMENT_VALUES}")
    return value


def check_conditional(metrics: list[MetricSpec], strata: tuple[str, ...], errors: Errors) -> None:
    """A conditional metric needs ``strata:``."""
    for spec in metrics:
        if spec.name in CONDITIONAL_METRICS and not strata:
            errors.add("strata", f"required by {spec.name}: the columns it is conditioned on, e.g. "
                                 "strata: [income_band]")  # fmt: skip


def check_counted(base: list[Attribute], segments: tuple[str, ...], strata: tuple[str, ...], errors: Errors) -> None:
    """Segments and strata are counted per known group of every attribute: a proxy attribute (a posterior, no group)
    and an attribute joined by id (its group known only after the join) have none there."""
    for key, columns in (("segments", segments), ("strata", strata)):
        for a in (a for a in base if columns and (a.proxy is not None or a.source is not None)):
            why = "a proxy attribute has no group per row" if a.proxy is not None else "its group is joined by id"
            errors.add(key, f"not with attribute {a.name!r}: {why}, and {key} are counted per group")
