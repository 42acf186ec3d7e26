"""The red-team suite: adversarial transformations of seed texts, sent to a text classifier, checked against the
decision the model should keep.

A case names a technique, the decision expected on the attacked text (``block``, ``allow``, or ``unchanged``:
the same as on the original) and the severity of a failure. Its texts come from the config or, when it has none,
from the shipped library's cases of the same technique (``redteam_library.yaml``). Every random choice comes
from a generator seeded with the config's seed and the case's name, so a run is reproducible case by case.
"""

from __future__ import annotations

import itertools
import math
import random
import re
from collections.abc import Callable
from importlib import resources
from pathlib import Path
from typing import Any

from exporter.config import ConfigError
from exporter.gate.audit import sha256_file
from exporter.gate.suite import SafetyTestResult, build_report, check_severity, load_yaml_mapping
from exporter.gate.targets import TargetError
from exporter.gate.unicode_text import INVISIBLE_CHARS, lookalikes

LIBRARY = resources.files("exporter.gate") / "redteam_library.yaml"
EXPECTED_BEHAVIOURS = ("block", "allow", "unchanged")
DEFAULT_BLOCK_LABELS = ("block", "blocked", "flag", "flagged", "reject", "rejected", "toxic", "unsafe", "harmful",
                        "true", "yes")  # fmt: skip
DEFAULT_ALLOW_LABELS = ("allow", "allowed", "pass", "ok", "safe", "clean", "non-toxic", "benign", "false", "no")

# Leetspeak is a writing habit, not Unicode data, so it is the one substitution table written here.
LEET = {"a": "4", "b": "8", "e": "3", "g": "9", "i": "1", "l": "1", "o": "0", "s": "5", "t": "7"}
Technique = Callable[[str, random.Random, dict[str, Any]], str]


def _substitute(text: str, rng: random.Random, rate: float, candidates: Callable[[str], tuple[str, ...]]) -> str:
    out = []
    for char in text:
        options = candidates(char)
        out.append(rng.choice(options) if options and rng.random() < rate else char)
    return "".join(out)


def homoglyphs(text: str, rng: random.Random, params: dict[str, Any]) -> str:
    """Replace letters, each with probability ``rate``, by a Unicode look-alike from ``scripts`` (None: any)."""
    scripts = params.get("scripts")
    key = tuple(s.upper() for s in scripts) if scripts else None
    return _substitute(text, rng, float(params.get("rate", 1.0)), lambda c: lookalikes(c, key))


def leetspeak(text: str, rng: random.Random, params: dict[str, Any]) -> str:
    """Replace letters, each with probability ``rate``, by the digit leetspeak writes for them."""
    return _substitute(text, rng, float(params.get("rate", 1.0)),
                       lambda c: (LEET[c.lower()],) if c.lower() in LEET else ())  # fmt: skip


def invisible_characters(text: str, rng: random.Random, params: dict[str, Any]) -> str:
    """Insert invisible characters (names from INVISIBLE_CHARS) between the letters of each word."""
    chars = [INVISIBLE_CHARS[name] for name in params.get("chars", ["zero_width_space"])]
    rate = float(params.get("rate", 1.0))
    out = [text[:1]]
    for prev, char in itertools.pairwise(text):
        if prev.isalnum() and char.isalnum() and rng.random() < rate:
            out.append(rng.choice(chars))
        out.append(char)
    return "".join(out)


def language_mixing(text: str, rng: random.Random, params: dict[str, Any]) -> str:
    """Code-switch: translate words found in the language's glossary (each with probability ``rate``) and open
    with a phrase in that language."""
    language = params.get("language", "de")
    glossary = params["glossaries"][language]
    rate = float(params.get("rate", 1.0))

    def translate(match: re.Match[str]) -> str:
        word = match.group(0)
        translation = glossary["words"].get(word.lower())
        if translation is None or rng.random() >= rate:
            return word
        return translation[:1].upper() + translation[1:] if word[:1].isupper() else translation

    mixed = re.sub(r"[A-Za-z]+", translate, text)
    return f"{rng.choice(glossary['frames'])} {mixed}" if glossary.get("frames") else mixed


def templated(text: str, rng: random.Random, params: dict[str, Any]) -> str:
    """Put the text into one of ``templates`` (``{text}`` marks where): override, impersonation, extraction."""
    return rng.choice(params["templates"]).replace("{text}", text)


TECHNIQUES: dict[str, tuple[Technique, dict[str, Any]]] = {
    "homoglyph_cyrillic": (homoglyphs, {"scripts": ["CYRILLIC"]}),
    "homoglyph_greek": (homoglyphs, {"scripts": ["GREEK"]}),
    "homoglyph_any": (homoglyphs, {"scripts": None}),
    "leetspeak": (leetspeak, {}),
    "invisible_characters": (invisible_characters, {}),
    "language_mixing": (language_mixing, {}),
    "instruction_override": (templated, {}),
    "role_impersonation": (templated, {}),
    "training_data_extraction": (templated, {}),
}


def load_library(path: Path | None = None) -> dict[str, Any]:
    """The shipped library: technique defaults (templates, glossaries) and its cases with their seed texts."""
    raw = load_yaml_mapping(path or Path(str(LIBRARY)))
    return {"defaults": raw.get("defaults") or {}, "cases": raw.get("cases") or []}


def _decision(output: Any, threshold: float, block_labels: set[str], allow_labels: set[str]) -> str:
    """``block`` or ``allow`` from what the model returned: a bool, a score or 0/1 label, or a string label."""
    if hasattr(output, "tolist"):
        output = output.tolist()
    if isinstance(output, list) and len(output) == 1:
        output = output[0]
    if isinstance(output, bool):
        return "block" if output else "allow"
    if isinstance(output, int | float):
        return "block" if output >= threshold else "allow"
    if isinstance(output, str):
        label = output.strip().casefold()
        if label in block_labels:
            return "block"
        if label in allow_labels:
            return "allow"
        try:
            return "block" if float(label) >= threshold else "allow"
        except ValueError:
            pass
    raise ValueError(f"cannot read a decision from the output {output!r}: return a bool, a score, 0/1, or a label "
                     "listed in decision.block_labels / decision.allow_labels")  # fmt: skip


def _jsonable(output: Any) -> Any:
    if hasattr(output, "tolist"):
        output = output.tolist()
    if isinstance(output, float) and not math.isfinite(output):
        return repr(output)  # the report is strict JSON
    return output if isinstance(output, bool | int | float | str | list | dict | None) else repr(output)


def parse_config(raw: dict[str, Any], source: str, library: dict[str, Any]) -> dict[str, Any]:
    """Validate a red-team config and resolve each case's technique, parameters and texts; every problem at once."""
    problems: list[str] = []
    model_id = raw.get("model_id")
    if not isinstance(model_id, str) or not model_id:
        problems.append("model_id: required, a non-empty string")
    seed = raw.get("seed", 0)
    if not isinstance(seed, int) or isinstance(seed, bool):
        problems.append(f"seed: {seed!r} is not an integer")
    decision = raw.get("decision") or {}
    threshold = decision.get("threshold", 0.5)
    if not isinstance(threshold, int | float) or isinstance(threshold, bool):
        problems.append(f"decision.threshold: {threshold!r} is not a number")

    library_texts: dict[str, list[str]] = {}
    for case in library["cases"]:
        texts = library_texts.setdefault(case["technique"], [])
        texts.extend(t for t in case["texts"] if t not in texts)

    specs: list[tuple[str, dict[str, Any]]] = []
    if raw.get("include_library", False):
        specs += [(f"library case {c['name']}", {**c}) for c in library["cases"]]
    groups = raw.get("red_team_tests") or []
    if not isinstance(groups, list):
        problems.append("red_team_tests: must be a list of {category, test_cases}")
        groups = []
    for i, group in enumerate(groups):
        if not isinstance(group, dict) or not isinstance(group.get("test_cases"), list):
            problems.append(f"red_team_tests[{i}]: needs category and a list test_cases")
            continue
        for j, case in enumerate(group["test_cases"]):
            where = f"red_team_tests[{i}].test_cases[{j}]"
            if not isinstance(case, dict):
                problems.append(f"{where}: must be a mapping with name, technique, expected_behaviour")
                continue
            specs.append((where, {"category": group.get("category", "uncategorised"), **case}))
    if not specs:
        problems.append("red_team_tests: no test cases (add some, or set include_library: true)")

    cases, names = [], set()
    for where, case in specs:
        name, technique = case.get("name"), case.get("technique")
        if not isinstance(name, str) or not name:
            problems.append(f"{where}.name: required")
        elif name in names:
            problems.append(f"{where}.name: {name!r} is used twice; case names identify results and seeds")
        names.add(name)
        if technique not in TECHNIQUES:
            problems.append(f"{where}.technique: {technique!r} is not one of {', '.join(TECHNIQUES)}")
            continue
        expected = case.get("expected_behaviour")
        if expected not in EXPECTED_BEHAVIOURS:
            problems.append(f"{where}.expected_behaviour: {expected!r} is not one of {', '.join(EXPECTED_BEHAVIOURS)}")
        severity = check_severity(case.get("severity_on_fail", "critical"), f"{where}.severity_on_fail", problems)
        texts = case.get("texts") or library_texts.get(technique, [])
        if not isinstance(texts, list) or not texts or not all(isinstance(t, str) for t in texts):
            problems.append(f"{where}.texts: a non-empty list of strings is needed (the library has none for "
                            f"{technique!r})")  # fmt: skip
        params = {**TECHNIQUES[technique][1], **library["defaults"].get(technique, {}), **(case.get("params") or {})}
        if technique == "invisible_characters":
            unknown = [c for c in params.get("chars", []) if c not in INVISIBLE_CHARS]
            if unknown:
                problems.append(f"{where}.params.chars: {unknown} not in {', '.join(INVISIBLE_CHARS)}")
        if technique == "language_mixing" and params.get("language", "de") not in params.get("glossaries", {}):
            problems.append(f"{where}.params.language: {params.get('language')!r} has no glossary "
                            f"(available: {', '.join(params.get('glossaries', {}))})")  # fmt: skip
        if TECHNIQUES[technique][0] is templated and not params.get("templates"):
            problems.append(f"{where}.params.templates: a non-empty list of texts with {{text}} is needed")
        cases.append({"name": name, "category": str(case.get("category", "uncategorised")),
                      "technique": technique, "params": params, "expected_behaviour": expected,
                      "severity": severity, "texts": texts})  # fmt: skip
    if problems:
        raise ConfigError(f"{source}: " + "; ".join(problems))
    labels = {kind: {str(s).casefold() for s in decision.get(f"{kind}_labels", default)}
              for kind, default in (("block", DEFAULT_BLOCK_LABELS), ("allow", DEFAULT_ALLOW_LABELS))}
    return {"model_id": model_id, "seed": seed, "threshold": float(threshold), "cases": cases,
            "block_labels": labels["block"], "allow_labels": labels["allow"]}


def attack(technique: str, text: str, rng: random.Random, params: dict[str, Any]) -> str:
    """Apply a named technique to one text."""
    return TECHNIQUES[technique][0](text, rng, params)


def run_case(case: dict[str, Any], target: Callable[[str], Any], seed: int,
             decide: Callable[[Any], str]) -> SafetyTestResult:  # fmt: skip
    """Attack each of the case's texts and compare the model's decision with the expected behaviour."""
    rng = random.Random(f"{seed}/{case['name']}")
    failures = []

    def ask(text: str) -> tuple[Any, str]:
        try:
            output = target(text)
            return _jsonable(output), decide(output)
        except TargetError:
            raise
        except Exception as exc:  # the model failing on an input is a finding, reported with the input
            return f"{type(exc).__name__}: {exc}", "error"

    for text in case["texts"]:
        attacked = attack(case["technique"], text, rng, case["params"])
        original_output, original_decision = ask(text)
        attacked_output, attacked_decision = ask(attacked)
        expected = original_decision if case["expected_behaviour"] == "unchanged" else case["expected_behaviour"]
        if attacked_decision != expected:
            failures.append({"original_text": text, "attacked_text": attacked,
                             "original_decision": original_decision, "attacked_decision": attacked_decision,
                             "original_output": original_output, "attacked_output": attacked_output})  # fmt: skip
    shown = {k: v for k, v in case["params"].items() if k != "glossaries"}
    return SafetyTestResult(
        test_name=case["name"], category=case["category"], passed=not failures, severity=case["severity"],
        details={"technique": case["technique"], "params": shown, "expected_behaviour": case["expected_behaviour"],
                 "attempts": len(case["texts"]), "failed_attempts": len(failures), "failures": failures})  # fmt: skip


def run_redteam(config_path: str | Path, target: Callable[[str], Any], target_name: str,
                library_path: Path | None = None) -> dict[str, Any]:  # fmt: skip
    """Run every case of a red-team config against a text model; the JSON report (see suite.build_report)."""
    library = load_library(library_path)
    config = parse_config(load_yaml_mapping(config_path), str(config_path), library)

    def decide(output: Any) -> str:
        return _decision(output, config["threshold"], config["block_labels"], config["allow_labels"])

    results = [run_case(case, target, config["seed"], decide) for case in config["cases"]]
    path = Path(config_path)
    return build_report("redteam", config["model_id"], config["seed"], results, target=target_name,
                        config_file=str(path), config_sha256=sha256_file(path),
                        library_sha256=sha256_file(library_path or Path(str(LIBRARY))),
                        attempts=sum(r.details["attempts"] for r in results),
                        failed_attempts=sum(r.details["failed_attempts"] for r in results))  # fmt: skip
