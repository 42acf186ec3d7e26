"""The counterfactual suite file: templates with slots, the protected attributes and the values that fill their slot,
the items, the decision extractor, the seed's metrics and the request settings. Every problem is listed at once
(a ConfigError, exit 2).

The keys the issue fixed (``model_id``, ``target: {url, model}``, ``template``, ``attributes[].slot / groups``,
``items`` or ``items_file``, ``decision: {pattern, positive}``, ``metrics``) mean what it says; the others are
additions beside them (docs/ml/counterfactual.md lists them all).
"""

from __future__ import annotations

import dataclasses
import hashlib
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final, Literal

from exporter.config import ConfigError
from exporter.config.sections_model import parse_metrics, parse_pairs
from exporter.config.toolkit import Errors
from exporter.config.types import SEVERITIES, MetricSpec
from exporter.gate.counterfactual.extract import Extractor, parse_extractor
from exporter.gate.counterfactual.names import name_list, read_text_file
from exporter.gate.suite import load_yaml_mapping
from exporter.gate.targets.chat import ChatSettings, parse_target

SLOT: Final = re.compile(r"\{([A-Za-z_][A-Za-z0-9_]*)\}")
"""A slot of a template: ``{name}``. Braces around anything else (a JSON example in the prompt) are left alone."""
ITEM_SLOT: Final = "item"
KEYS: Final = {"model_id", "model_version", "kind", "target", "system_prompt", "template", "templates", "attributes",
               "items", "items_file", "slot_defaults", "decision", "metrics", "min_samples", "alpha", "verdict",
               "unparsed", "requests"}  # fmt: skip
ATTRIBUTE_KEYS: Final = {"name", "slot", "groups", "names", "pairwise_comparisons"}
REQUEST_KEYS: Final = {"samples", "seed", "concurrency", "retries", "backoff_seconds", "max_calls"}
UNPARSED_KEYS: Final = {"max_share", "severity_on_fail"}
VERDICTS: Final = ("paired_evidence", "point_estimate")
MAX_SAMPLES: Final = 20


@dataclass(frozen=True)
class Requests:
    """How the prompts are sent: ``samples`` answers per prompt (the API's ``n``), the ``seed`` sent with each
    request (None: sent without one), at most ``concurrency`` requests at a time, ``retries`` per request after a 429,
    a 5xx or a timeout (waiting ``backoff_seconds`` doubled each time, or the server's Retry-After), and a budget of
    ``max_calls`` HTTP calls, retries included, checked before the first call."""

    samples: int = 1
    seed: int | None = 0
    concurrency: int = 4
    retries: int = 4
    backoff_seconds: float = 1.0
    max_calls: int = 5000


@dataclass(frozen=True)
class CfAttribute:
    """A protected attribute: per group, the slot values its requests use (item i takes the i-th, cycling)."""

    name: str
    groups: dict[str, tuple[dict[str, str], ...]]
    pairs: tuple[tuple[int, int], ...]

    @property
    def group_names(self) -> tuple[str, ...]:
        return tuple(self.groups)

    def filling(self, group: str, item_index: int) -> dict[str, str]:
        values = self.groups[group]
        return values[item_index % len(values)]


@dataclass(frozen=True)
class RunSettings:
    """What both kinds of suite share: the model, the target, how the requests are sent and how the verdict is
    reached."""

    source: str
    sha256: str
    model_id: str
    model_version: str | None
    target: ChatSettings | None
    system_prompt: str | None
    min_samples: int = 30
    alpha: float = 0.05
    verdict: Literal["paired_evidence", "point_estimate"] = "paired_evidence"
    max_unparsed_share: float = 0.05
    unparsed_severity: Literal["blocking", "warning"] = "blocking"
    requests: Requests = field(default_factory=Requests)


@dataclass(frozen=True)
class Suite:
    """A validated decision suite (``kind: decision``, the default)."""

    run: RunSettings
    templates: tuple[str, ...]
    attributes: tuple[CfAttribute, ...]
    items: tuple[str, ...]
    items_source: str
    slot_defaults: dict[str, str]
    decision: Extractor
    metrics: tuple[MetricSpec, ...]


def fill(template: str, values: dict[str, str]) -> str:
    """The template with each ``{slot}`` replaced by its value (slots without a value are left as written)."""
    return SLOT.sub(lambda m: values.get(m.group(1), m.group(0)), template)


def _attribute(path: str, item: dict[str, Any], base: Path, errors: Errors) -> CfAttribute | None:
    name, slot = item.get("name"), item.get("slot")
    if not isinstance(name, str) or not name:
        errors.add(f"{path}.name", "required: the attribute's name (e.g. gender)")
        return None
    if slot is not None and (not isinstance(slot, str) or not SLOT.fullmatch(f"{{{slot}}}")):
        errors.add(f"{path}.slot", f"{slot!r} is not a slot name such as name or pronoun")
        slot = None
    if ("groups" in item) == ("names" in item):
        errors.add(path, "give either groups: {group: [values]} or names: {list: ..., by: ...}")
        return None
    raw_groups = item["groups"] if "groups" in item else name_list(item["names"], slot, base, f"{path}.names",
                                                                     errors)  # fmt: skip
    if "names" in item and not raw_groups:  # name_list said why
        return None
    if not isinstance(raw_groups, dict) or len(raw_groups) < 2:
        errors.add(f"{path}.groups", f"{raw_groups!r} is not a mapping of at least two groups to their values")
        return None
    groups: dict[str, tuple[dict[str, str], ...]] = {}
    for group, values in raw_groups.items():
        where = f"{path}.groups.{group}"
        if not isinstance(values, list) or not values:
            errors.add(where, f"{values!r} is not a non-empty list of values")
            continue
        fillings = []
        for value in values:
            if isinstance(value, dict) and value and all(isinstance(v, str | int) for v in value.values()):
                fillings.append({str(k): str(v) for k, v in value.items()})
            elif isinstance(value, str | int) and not isinstance(value, bool) and slot is not None:
                fillings.append({slot: str(value)})
            else:
                errors.add(where, f"{value!r}: a value is text for the attribute's slot, or a mapping of slots "
                                  "to text (e.g. {name: Emily, pronoun: she})")  # fmt: skip
        groups[str(group)] = tuple(fillings)
    names = list(groups)
    pairs = parse_pairs(item.get("pairwise_comparisons"), names, f"{path}.pairwise_comparisons", errors)
    return CfAttribute(name, groups, pairs)


def _templates(raw: dict[str, Any], errors: Errors) -> tuple[str, ...]:
    if ("template" in raw) == ("templates" in raw):
        errors.add("template", "required: one template (template:) or a list of them (templates:)")
        return ()
    templates = [raw["template"]] if "template" in raw else raw["templates"]
    if not isinstance(templates, list) or not templates or not all(isinstance(t, str) for t in templates):
        errors.add("templates", "a non-empty list of texts with {item} and the attributes' slots")
        return ()
    for i, t in enumerate(templates):
        if ITEM_SLOT not in SLOT.findall(t):
            errors.add(f"templates[{i}]" if "templates" in raw else "template", "has no {item} slot for the item")
    return tuple(templates)


def _items(raw: dict[str, Any], base: Path, errors: Errors) -> tuple[tuple[str, ...], str]:
    if ("items" in raw) == ("items_file" in raw):
        errors.add("items", "required: a list of items (items:) or a file of one item per line (items_file:)")
        return (), ""
    if "items" in raw:
        items = raw["items"]
        if not isinstance(items, list) or not items or not all(isinstance(i, str) and i.strip() for i in items):
            errors.add("items", "a non-empty list of non-empty texts (resumes, applications, ...)")
            return (), ""
        return tuple(items), "inline"
    if not isinstance(raw["items_file"], str):
        errors.add("items_file", f"{raw['items_file']!r} is not a path (or shipped:resumes.txt)")
        return (), ""
    text = read_text_file(raw["items_file"], base, "items_file", errors)
    lines = tuple(line.strip() for line in (text or "").splitlines() if line.strip())
    if text is not None and not lines:
        errors.add("items_file", f"{raw['items_file']}: no item (one item per line)")
    return lines, raw["items_file"]


def number(raw: dict[str, Any], key: str, default: Any, kind: type, low: float, high: float, where: str,
           errors: Errors) -> Any:  # fmt: skip
    """``raw[key]`` (or ``default``) as ``kind`` within [low, high]; out of it, a problem naming ``where + key``."""
    value = raw.get(key, default)
    ok = isinstance(value, int | float) and not isinstance(value, bool) and low <= value <= high
    if kind is int:
        ok = ok and isinstance(value, int)
    if not ok:
        errors.add(f"{where}{key}", f"{value!r} is not a {'whole ' if kind is int else ''}number from {low} to {high}")
        return default
    return kind(value)


def severity_on_fail(raw: dict[str, Any], where: str, errors: Errors) -> Literal["blocking", "warning"]:
    """``raw["severity_on_fail"]``: blocking (the default) or warning, as a gate metric's."""
    severity = raw.get("severity_on_fail", "blocking")
    if severity not in SEVERITIES:
        errors.add(f"{where}severity_on_fail", f"{severity!r} is not {' or '.join(SEVERITIES)}")
    return "warning" if severity == "warning" else "blocking"


def _requests(raw: Any, errors: Errors) -> Requests:
    if raw is None:
        return Requests()
    if not isinstance(raw, dict):
        errors.add("requests", f"{raw!r} is not a mapping with {', '.join(sorted(REQUEST_KEYS))}")
        return Requests()
    errors.check_keys("requests", raw, REQUEST_KEYS)
    d = Requests()
    seed_given_none = "seed" in raw and raw["seed"] is None  # seed: null sends requests without a seed
    return Requests(samples=number(raw, "samples", d.samples, int, 1, MAX_SAMPLES, "requests.", errors),
                    seed=None if seed_given_none else number(raw, "seed", d.seed, int, 0, 2**63 - 1, "requests.",
                                                              errors),
                    concurrency=number(raw, "concurrency", d.concurrency, int, 1, 64, "requests.", errors),
                    retries=number(raw, "retries", d.retries, int, 0, 20, "requests.", errors),
                    backoff_seconds=number(raw, "backoff_seconds", d.backoff_seconds, float, 0, 600, "requests.",
                                            errors),
                    max_calls=number(raw, "max_calls", d.max_calls, int, 1, 10**9, "requests.", errors))  # fmt: skip


def _target(raw: Any, errors: Errors) -> tuple[ChatSettings | None, str | None]:
    """``target: {url, model}`` (``base_url`` is accepted too, as in the red team's target), and the system prompt
    it names, if any (no default: the counterfactual prompt is the template alone)."""
    if raw is None:
        return None, None
    if isinstance(raw, dict) and "url" in raw:
        if "base_url" in raw:
            errors.add("target.url", "give url or base_url, not both")
        raw = {("base_url" if k == "url" else k): v for k, v in raw.items()}
    problems: list[str] = []
    settings = parse_target(raw, problems)
    for p in problems:
        errors.add("", p.replace("target.base_url", "target.url"))
    return settings, raw.get("system_prompt") if isinstance(raw, dict) else None


def _check_slots(templates: tuple[str, ...], attributes: list[CfAttribute], defaults: dict[str, str],
                 errors: Errors) -> None:  # fmt: skip
    """Every slot of every template is filled in every request: by the attribute being varied, else by
    slot_defaults."""
    used = {s for t in templates for s in SLOT.findall(t)} - {ITEM_SLOT}
    for a in attributes:
        filled = {k for values in a.groups.values() for v in values for k in v}
        for i, t in enumerate(templates):  # its requests would be the same for every group: no swap at all
            if not filled & set(SLOT.findall(t)):
                errors.add(f"templates[{i}]" if len(templates) > 1 else "template", f"has none of the slots "
                           f"attribute {a.name} varies ({', '.join('{' + s + '}' for s in sorted(filled))}): its "
                           "requests would be the same for every group")  # fmt: skip
        for slot in sorted(filled - used):
            errors.add(f"attributes ({a.name})", f"fills slot {{{slot}}}, which no template has")
        per_value = [set(v) for values in a.groups.values() for v in values]
        missing = sorted(s for s in used if s not in defaults and not all(s in v for v in per_value))
        if missing:
            errors.add(f"attributes ({a.name})", f"leaves slot(s) {', '.join('{' + s + '}' for s in missing)} of the "
                       "template empty: give every value of its groups those slots, or set slot_defaults")  # fmt: skip


def run_settings(raw: dict[str, Any], path: Path, errors: Errors, target: str | None,
                 model: str | None) -> RunSettings:  # fmt: skip
    """The keys both kinds of suite share (model, target, requests, verdict, unparsed answers), validated."""
    model_id = raw.get("model_id")
    if not isinstance(model_id, str) or not model_id:
        errors.add("model_id", "required, a non-empty string")
    settings, system_prompt = _target(raw.get("target"), errors)
    settings = override_target(settings, target, model, errors)
    if raw.get("system_prompt") is not None:
        if not isinstance(raw["system_prompt"], str):
            errors.add("system_prompt", f"{raw['system_prompt']!r} is not text")
        system_prompt = str(raw["system_prompt"])
    unparsed = raw.get("unparsed") or {}
    if not isinstance(unparsed, dict):
        errors.add("unparsed", f"{unparsed!r} is not a mapping with max_share, severity_on_fail")
        unparsed = {}
    errors.check_keys("unparsed", unparsed, UNPARSED_KEYS)
    severity = severity_on_fail(unparsed, "unparsed.", errors)
    verdict = raw.get("verdict", "paired_evidence")
    if verdict not in VERDICTS:
        errors.add("verdict", f"{verdict!r} is not one of {', '.join(VERDICTS)}")
    return RunSettings(
        source=str(path), sha256=hashlib.sha256(path.read_bytes()).hexdigest(), model_id=str(model_id),
        model_version=None if raw.get("model_version") is None else str(raw["model_version"]),
        target=settings, system_prompt=system_prompt,
        min_samples=number(raw, "min_samples", 30, int, 1, 1_000_000, "", errors),
        alpha=number(raw, "alpha", 0.05, float, 1e-6, 0.5, "", errors), verdict=verdict,
        max_unparsed_share=number(unparsed, "max_share", 0.05, float, 0, 1, "unparsed.", errors),
        unparsed_severity=severity, requests=_requests(raw.get("requests"), errors))  # fmt: skip


def suite_kind(path: str | Path) -> str:
    """The ``kind:`` of a suite file: ``decision`` (the default) or ``ambiguous``."""
    return str(load_yaml_mapping(path).get("kind", "decision"))


def load_suite(path: str | Path, target: str | None = None, model: str | None = None) -> Suite:
    """Read and validate a decision suite; ``target`` / ``model`` (the command line's) replace the file's."""
    path = Path(path)
    raw = load_yaml_mapping(path)
    errors = Errors()
    errors.check_keys("", raw, KEYS)
    if raw.get("kind", "decision") != "decision":
        errors.add("kind", f"{raw['kind']!r} is not decision or ambiguous")
    run = run_settings(raw, path, errors, target, model)
    base = path.parent
    templates = _templates(raw, errors)
    attributes_raw = raw.get("attributes")
    attributes: list[CfAttribute] = []
    if not isinstance(attributes_raw, list) or not attributes_raw:
        errors.add("attributes", "required: a list of {name, slot, groups}")
    else:
        for p, item in errors.mappings("attributes", attributes_raw, ATTRIBUTE_KEYS, " with name, slot, groups"):
            a = _attribute(p, item, base, errors)
            if a is not None and any(b.name == a.name for b in attributes):
                errors.add(f"{p}.name", f"{a.name!r} is configured twice")
            elif a is not None:
                attributes.append(a)
    defaults = raw.get("slot_defaults") or {}
    if not isinstance(defaults, dict) or not all(isinstance(v, str | int) for v in defaults.values()):
        errors.add("slot_defaults", f"{defaults!r} is not a mapping of slot to text")
        defaults = {}
    defaults = {str(k): str(v) for k, v in defaults.items()}
    _check_slots(templates, attributes, defaults, errors)
    items, items_source = _items(raw, base, errors)
    extractor = parse_extractor(raw.get("decision"), errors)
    metrics = parse_metrics(raw.get("metrics"), errors.within(""))
    if errors.lines:
        raise ConfigError(f"{path}: " + "; ".join(errors.lines))
    return Suite(run=run, templates=templates, attributes=tuple(attributes), items=items, items_source=items_source,
                 slot_defaults=defaults, decision=extractor, metrics=tuple(metrics))  # fmt: skip


def override_target(settings: ChatSettings | None, target: str | None, model: str | None,
                    errors: Errors) -> ChatSettings | None:  # fmt: skip
    """The file's target with the command line's ``--target URL`` / ``--model NAME`` over it; none at all is an
    error naming both."""
    if target is None and model is None:
        if settings is None:
            errors.add("target", "required: target: {url, model} in the suite, or --target URL --model NAME")
        return settings
    raw: dict[str, Any] = {} if settings is None else dataclasses.asdict(settings)
    raw.update({k: v for k, v in (("base_url", target), ("model", model)) if v is not None})
    problems: list[str] = []
    out = parse_target(raw, problems)
    for p in problems:
        errors.add("", p.replace("target.base_url", "--target").replace("target.model", "--model"))
    return out
