"""The red-team config: the seed's ``red-team-config.yaml`` as written (free-text techniques and expected
behaviours, its ``reporting`` block) and this project's additions beside it (``seed``, ``include_library``,
``decision``, ``target``, ``model_version``, ``max_attack_success_rate`` (also per case), ``baseline_detection``,
per-case ``texts`` and ``params``). Every problem is listed at once.
"""

from __future__ import annotations

import itertools
import math
from importlib import resources
from pathlib import Path
from typing import Any, Final

from exporter.config import ConfigError
from exporter.config.toolkit import unknown_keys
from exporter.gate.redteam.outcomes import (
    DEFAULT_MIN_LEAK_CHARS,
    EXPECTED_BEHAVIOURS,
    OUTCOMES,
    SEED_CASE_TECHNIQUES,
    outcome_of,
)
from exporter.gate.redteam.techniques import TECHNIQUES, split_snippet, templated
from exporter.gate.redteam.unicode_text import INVISIBLE_CHARS
from exporter.gate.suite import check_severity, load_yaml_mapping
from exporter.gate.targets.chat import ChatSettings, parse_target

LIBRARY = resources.files("exporter.gate.redteam") / "library.yaml"
KEYS: Final = {"model_id", "model_version", "seed", "include_library", "decision", "red_team_tests", "reporting",
               "target", "max_attack_success_rate", "baseline_detection"}  # fmt: skip
BASELINE_KEYS: Final = {"severity_on_fail"}
DECISION_KEYS: Final = {"threshold", "block_labels", "review_labels", "allow_labels"}
BASELINE_SEVERITY: Final = "high"
REPORTING_KEYS: Final = {"format", "destination", "notify_on_critical"}
GROUP_KEYS: Final = {"category", "description", "test_cases"}
CASE_KEYS: Final = {"name", "technique", "description", "expected_behaviour", "severity_on_fail", "texts", "params",
                    "max_attack_success_rate", "category"}  # fmt: skip
DEFAULT_BLOCK_LABELS = ("block", "blocked", "flag", "flagged", "reject", "rejected", "toxic", "unsafe", "harmful",
                        "true", "yes")  # fmt: skip
DEFAULT_ALLOW_LABELS = ("allow", "allowed", "pass", "ok", "safe", "clean", "non-toxic", "benign", "false", "no")
DEFAULT_REVIEW_LABELS = ("review", "needs_review", "escalate", "hold")


def load_library(path: Path | None = None) -> dict[str, Any]:
    """The shipped library: technique defaults (templates, glossaries) for classifiers and for chat models, and
    its cases with their seed texts (a case with ``target: chat`` attacks chat models)."""
    raw = load_yaml_mapping(path or Path(str(LIBRARY)))
    return {"defaults": raw.get("defaults") or {}, "chat_defaults": raw.get("chat_defaults") or {},
            "cases": raw.get("cases") or []}  # fmt: skip


def library_cases(library: dict[str, Any], kind: str) -> list[dict[str, Any]]:
    """The library's cases for a kind of target: ``chat`` or ``classifier``."""
    return [c for c in library["cases"] if c.get("target", "classifier") == kind]


def _texts_by_technique(library: dict[str, Any], kind: str) -> dict[str, list[str]]:
    """Each technique's seed texts, from the library's cases for this kind of target first, then any."""
    def collect(cases: list[dict[str, Any]]) -> dict[str, list[str]]:
        out: dict[str, list[str]] = {}
        for case in cases:
            texts = out.setdefault(case["technique"], [])
            texts.extend(t for t in case["texts"] if t not in texts)
        return out

    return collect(library["cases"]) | collect(library_cases(library, kind))


def parse_reporting(raw: Any, problems: list[str]) -> dict[str, Any]:
    """The seed's ``reporting`` block: ``format`` (json), ``destination`` (a folder or URL), ``notify_on_critical``."""
    if raw is None:
        return {"format": "json", "destination": None, "notify_on_critical": []}
    if not isinstance(raw, dict):
        problems.append(f"reporting: {raw!r} is not a mapping with format, destination, notify_on_critical")
        return {"format": "json", "destination": None, "notify_on_critical": []}
    problems.extend(unknown_keys(raw, REPORTING_KEYS, "reporting."))
    if raw.get("format", "json") != "json":
        problems.append(f"reporting.format: {raw['format']!r} is not json (the only report format)")
    destination = raw.get("destination")
    if destination is not None and not (isinstance(destination, str) and destination):
        problems.append(f"reporting.destination: {destination!r} is not a folder or URL")
    notify = raw.get("notify_on_critical") or []
    if not (isinstance(notify, list) and all(isinstance(a, str) and "@" in a for a in notify)):
        problems.append(f"reporting.notify_on_critical: {notify!r} is not a list of e-mail addresses")
        notify = []
    return {"format": "json", "destination": destination, "notify_on_critical": notify}


def _specs(raw: dict[str, Any], library: dict[str, Any], kind: str, problems: list[str]) -> list[tuple[str, dict]]:
    specs: list[tuple[str, dict[str, Any]]] = []
    if raw.get("include_library", False):
        specs += [(f"library case {c['name']}", {**c}) for c in library_cases(library, kind)]
    groups = raw.get("red_team_tests") or []
    if not isinstance(groups, list):
        problems.append("red_team_tests: must be a list of {category, test_cases}")
        groups = []
    for i, group in enumerate(groups):
        if not isinstance(group, dict) or not isinstance(group.get("test_cases"), list):
            problems.append(f"red_team_tests[{i}]: needs category and a list test_cases")
            continue
        problems.extend(unknown_keys(group, GROUP_KEYS, f"red_team_tests[{i}]."))
        for j, case in enumerate(group["test_cases"]):
            where = f"red_team_tests[{i}].test_cases[{j}]"
            if not isinstance(case, dict):
                problems.append(f"{where}: must be a mapping with name, technique, expected_behaviour")
                continue
            problems.extend(unknown_keys(case, CASE_KEYS, f"{where}."))  # a misspelt severity_on_fail was ignored
            specs.append((where, {"category": group.get("category", "uncategorised"), **case}))
    if not specs:
        problems.append("red_team_tests: no test cases (add some, or set include_library: true)")
    return specs


def _technique(case: dict[str, Any], where: str, problems: list[str]) -> tuple[str | None, str | None, dict]:
    """(generator, the seed's free-text technique or None, the generator's parameters for the seed's case)."""
    technique, name = case.get("technique"), case.get("name")
    if technique in TECHNIQUES:
        return technique, None, {}
    if isinstance(technique, str) and technique.strip() and name in SEED_CASE_TECHNIQUES:
        generator, params = SEED_CASE_TECHNIQUES[name]
        return generator, technique, params
    problems.append(f"{where}.technique: {technique!r} is not one of {', '.join(TECHNIQUES)}; a technique in prose "
                    f"needs a case name that picks the generator ({', '.join(SEED_CASE_TECHNIQUES)})")  # fmt: skip
    return None, None, {}


def _param_types(params: dict[str, Any], where: str) -> list[str]:
    """The problems of the parameters' types and ranges, before anything reads them."""
    out = []
    rate = params.get("rate", 1.0)
    if isinstance(rate, bool) or not isinstance(rate, int | float) or not 0 < rate <= 1:  # NaN is refused too
        out.append(f"{where}.params.rate: {rate!r} is not a share in (0, 1]: the share of letters (words) the attack "
                   "rewrites; at 0 it rewrites nothing and the attempt measures nothing")  # fmt: skip
    for key in ("min_leak_chars", "prefix_chars"):
        value = params.get(key)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
            out.append(f"{where}.params.{key}: {value!r} is not a positive whole number of characters")
    for key in ("templates", "chars", "scripts"):
        value = params.get(key)
        if value is not None and not (isinstance(value, list) and all(isinstance(v, str) and v for v in value)):
            out.append(f"{where}.params.{key}: {value!r} is not a list of strings")
    if not isinstance(params.get("language", "de"), str):
        out.append(f"{where}.params.language: {params['language']!r} is not a language code such as de")
    return out


def _check_params(technique: str, params: dict[str, Any], texts: list[str], where: str, problems: list[str]) -> None:
    wrong = _param_types(params, where)
    if wrong:
        problems.extend(wrong)
        return
    if technique == "invisible_characters":
        unknown = [c for c in params.get("chars", []) if c not in INVISIBLE_CHARS]
        if unknown:
            problems.append(f"{where}.params.chars: {unknown} not in {', '.join(INVISIBLE_CHARS)}")
    if technique == "language_mixing" and params.get("language", "de") not in params.get("glossaries", {}):
        problems.append(f"{where}.params.language: {params.get('language')!r} has no glossary "
                        f"(available: {', '.join(params.get('glossaries', {}))})")  # fmt: skip
    if TECHNIQUES[technique][0] is templated and not params.get("templates"):
        problems.append(f"{where}.params.templates: a non-empty list of texts with {{text}} is needed")
    if any("{prefix}" in t for t in params.get("templates", [])):
        for text in texts:
            held_out = split_snippet(text, params)[1]
            if len(held_out) < params["min_leak_chars"]:
                problems.append(f"{where}.texts: the snippet {text[:40]!r}... holds back {len(held_out)} characters, "
                                f"fewer than min_leak_chars ({params['min_leak_chars']}): no leak could be seen")


def _tolerance(value: Any, where: str, default: float, problems: list[str]) -> float:
    """A ``max_attack_success_rate``: the share of measured attempts an attack may win and the case still pass."""
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value <= 1:
        problems.append(f"{where}max_attack_success_rate: {value!r} is not a share from 0 to 1 (default 0: no "
                        "evasion passes)")  # fmt: skip
        return default
    return float(value)


def _baseline(raw: Any, problems: list[str]) -> dict[str, Any]:
    """The ``baseline_detection`` block: the severity of the check that the plain texts themselves get the
    expected decision; None (not set): the most severe of the cases whose plain texts were missed, so that a
    critical case of the seed's config ("Model still detects harmful content") blocks on harmful texts the model
    never detected, attacked or not."""
    if raw is None:
        return {"severity": None}
    if not isinstance(raw, dict):
        problems.append(f"baseline_detection: {raw!r} is not a mapping with severity_on_fail")
        return {"severity": None}
    problems.extend(unknown_keys(raw, BASELINE_KEYS, "baseline_detection."))
    if "severity_on_fail" not in raw:
        return {"severity": None}
    return {"severity": check_severity(raw["severity_on_fail"], "baseline_detection.severity_on_fail", problems)}


def parse_decision(raw: Any, problems: list[str]) -> tuple[float, dict[str, set[str]]]:
    """The ``decision`` section: the score ``threshold`` at which a classifier's score blocks (default 0.5, finite)
    and the labels read as each decision (lists of strings). A label in two of the lists the config gives is a
    problem; a label the config gives one decision is taken out of the other decisions' defaults."""
    defaults = {"block": DEFAULT_BLOCK_LABELS, "review": DEFAULT_REVIEW_LABELS, "allow": DEFAULT_ALLOW_LABELS}
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        problems.append(f"decision: {raw!r} is not a mapping with {', '.join(sorted(DECISION_KEYS))}")
        raw = {}
    problems.extend(unknown_keys(raw, DECISION_KEYS, "decision."))
    threshold = raw.get("threshold", 0.5)
    if isinstance(threshold, bool) or not isinstance(threshold, int | float) or not math.isfinite(threshold):
        problems.append(f"decision.threshold: {threshold!r} is not a finite number (the score at which a "
                        "classifier's output blocks; default 0.5)")  # fmt: skip
        threshold = 0.5
    labels: dict[str, set[str]] = {}
    for kind, default in defaults.items():
        given = raw.get(f"{kind}_labels", list(default))
        if not (isinstance(given, list) and all(isinstance(x, str) and x.strip() for x in given)):
            problems.append(f"decision.{kind}_labels: {given!r} is not a list of labels, such as [{default[0]}]")
            given = list(default)
        labels[kind] = {x.strip().casefold() for x in given}
    given = [kind for kind in defaults if f"{kind}_labels" in raw]
    for a, b in itertools.combinations(given, 2):
        if both := sorted(labels[a] & labels[b]):
            problems.append(f"decision: {both} in both {a}_labels and {b}_labels: a label means one decision")
    for kind in set(defaults) - set(given):  # a label the config gives one decision leaves the other defaults
        labels[kind] -= set().union(*(labels[k] for k in given))
    return float(threshold), labels


def parse_config(raw: dict[str, Any], source: str, library: dict[str, Any], kind: str = "classifier") -> dict:
    """Validate a red-team config for a kind of target (``classifier`` or ``chat``) and resolve each case's
    generator, parameters, expected outcome and texts; a ConfigError lists every problem."""
    problems = unknown_keys(raw, KEYS, "")
    model_id = raw.get("model_id")
    if not isinstance(model_id, str) or not model_id:
        problems.append("model_id: required, a non-empty string")
    seed = raw.get("seed", 0)
    if not isinstance(seed, int) or isinstance(seed, bool):
        problems.append(f"seed: {seed!r} is not an integer")
    threshold, labels = parse_decision(raw.get("decision"), problems)
    reporting = parse_reporting(raw.get("reporting"), problems)
    tolerance = _tolerance(raw.get("max_attack_success_rate"), "", 0.0, problems)
    baseline = _baseline(raw.get("baseline_detection"), problems)

    defaults = library["chat_defaults"] if kind == "chat" else library["defaults"]
    library_texts = _texts_by_technique(library, kind)
    cases, names = [], set()
    for where, case in _specs(raw, library, kind, problems):
        name = case.get("name")
        if not isinstance(name, str) or not name:
            problems.append(f"{where}.name: required")
        elif name in names:
            problems.append(f"{where}.name: {name!r} is used twice; case names identify results and seeds")
        names.add(name)
        technique, description, seed_params = _technique(case, where, problems)
        expected = case.get("expected_behaviour")
        outcome = outcome_of(expected)
        if outcome is None:
            problems.append(f"{where} (case {name!r}).expected_behaviour: {expected!r} matches no row of the "
                            f"table ({'; '.join(f'{p!r}' for p, _ in EXPECTED_BEHAVIOURS)}) and is none of "
                            f"{', '.join(OUTCOMES)}")  # fmt: skip
        severity = check_severity(case.get("severity_on_fail", "critical"), f"{where}.severity_on_fail", problems)
        if technique is None:
            continue
        texts = case.get("texts") or library_texts.get(technique, [])
        if not isinstance(texts, list) or not texts or not all(isinstance(t, str) for t in texts):
            problems.append(f"{where}.texts: a non-empty list of strings is needed (the library has none for "
                            f"{technique!r})")  # fmt: skip
            texts = []
        own = case.get("params") or {}
        if not isinstance(own, dict):
            problems.append(f"{where}.params: {own!r} is not a mapping of the technique's parameters, such as "
                            "{rate: 0.5}")  # fmt: skip
            continue
        params = {**TECHNIQUES[technique][1], **library["defaults"].get(technique, {}),
                  **defaults.get(technique, {}), **seed_params, **own}  # fmt: skip
        params.setdefault("min_leak_chars", DEFAULT_MIN_LEAK_CHARS)
        _check_params(technique, params, texts, where, problems)
        cases.append({"name": name, "category": str(case.get("category", "uncategorised")), "technique": technique,
                      "technique_description": description, "params": params, "expected_behaviour": expected,
                      "outcome": outcome, "severity": severity, "texts": texts,
                      "max_attack_success_rate": _tolerance(case.get("max_attack_success_rate"), f"{where}.",
                                                            tolerance, problems)})  # fmt: skip
    if problems:
        raise ConfigError(f"{source}: " + "; ".join(problems))
    version = raw.get("model_version")
    return {"model_id": model_id, "model_version": None if version is None else str(version), "seed": seed,
            "threshold": threshold, "cases": cases, "labels": labels, "reporting": reporting,
            "baseline_detection": baseline}  # fmt: skip


def chat_settings(raw: dict[str, Any], source: str) -> ChatSettings | None:
    """The config's ``target:`` section, validated on its own: it decides the kind of target before the cases."""
    if raw.get("target") is None:
        return None
    problems: list[str] = []
    settings = parse_target(raw["target"], problems)
    if problems:
        raise ConfigError(f"{source}: " + "; ".join(problems))
    return settings
