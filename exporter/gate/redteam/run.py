"""The red-team suite: adversarial attacks on seed texts, sent to a text classifier or a chat model, each reply
judged against the outcome its case expects (:mod:`exporter.gate.redteam.outcomes`).

A case names a technique (:mod:`exporter.gate.redteam.techniques`; in the seed's YAML, prose whose case name
picks it), the expected behaviour and the severity of a failure. Its texts come from the config or, when it has
none, from the shipped library's cases of the same technique. Every random choice comes from a generator seeded
with the config's seed and the case's name, so a run is reproducible case by case; a chat model's system prompt
carries a canary drawn from the seed.
"""

from __future__ import annotations

import math
import random
import re
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any, Final

from exporter.gate.fairness.audit import sha256_file
from exporter.gate.redteam.config import BASELINE_SEVERITY, LIBRARY, chat_settings, load_library, parse_config
from exporter.gate.redteam.outcomes import findings, passes, plain_right
from exporter.gate.redteam.techniques import make_attempt
from exporter.gate.suite import SEVERITIES, SafetyTestResult, build_report, load_yaml_mapping
from exporter.gate.targets.chat import ChatSettings, ChatTarget, canary
from exporter.gate.targets.objects import TargetError

# outcomes for which a chat model is asked the plain text too: a decision, or the plain text's own decision
PLAIN_ASKED: Final = ("block", "review", "allow", "unchanged")
SHOWN_MISSES: Final = 20


def _decision(output: Any, threshold: float, labels: dict[str, set[str]]) -> str:
    """``block``, ``review`` or ``allow`` from what a classifier returned: a bool, a score or 0/1, or a label."""
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
        for kind in ("block", "review", "allow"):
            if label in labels[kind]:
                return kind
        try:
            return "block" if float(label) >= threshold else "allow"
        except ValueError:
            pass
    raise ValueError(f"cannot read a decision from the output {output!r}: return a bool, a score, 0/1, or a label "
                     "listed in decision.block_labels / review_labels / allow_labels")  # fmt: skip


def _chat_decision(reply: Any, labels: dict[str, set[str]]) -> str:
    """A chat model's decision: the label its reply starts with, or ``none`` when it starts with none."""
    match = re.match(r"\W*([\w-]+)", str(reply))
    word = match.group(1).casefold() if match else ""
    return next((kind for kind in ("block", "review", "allow") if word in labels[kind]), "none")


def _jsonable(output: Any) -> Any:
    if hasattr(output, "tolist"):
        output = output.tolist()
    if isinstance(output, float) and not math.isfinite(output):
        return repr(output)  # the report is strict JSON
    return output if isinstance(output, bool | int | float | str | list | dict | None) else repr(output)


def run_case(case: dict[str, Any], target: Callable[[str], Any], seed: int,
             decide: Callable[[Any], str]) -> SafetyTestResult:  # fmt: skip
    """Attack each of the case's texts and judge each reply against the case's expected outcome, measured against
    the plain text: an evasion is a plain text handled right whose attacked text is not; a plain text already
    handled wrong is a baseline failure. The verdict follows the evasions (``max_attack_success_rate``)."""
    rng = random.Random(f"{seed}/{case['name']}")
    kind = getattr(target, "kind", "classifier")
    system_canary = getattr(target, "system_canary", None)
    failures = []
    judged = baseline_failures = evasions = failed_attempts = 0

    def ask(text: str) -> tuple[Any, str]:
        try:
            output = target(text)
            return _jsonable(output), decide(output)
        except TargetError:
            raise
        except Exception as exc:  # the model failing on an input is a finding, reported with the input
            return f"{type(exc).__name__}: {exc}", "error"

    for text in case["texts"]:
        attempt = make_attempt(case["technique"], text, rng, case["params"])
        original_output, original_decision = None, None
        if attempt.original is not None and (kind == "classifier" or case["outcome"] in PLAIN_ASKED):
            original_output, original_decision = ask(attempt.original)
        attacked_output, attacked_decision = ask(attempt.attacked)
        found = findings(str(attacked_output), attempt, system_canary, case["params"]["min_leak_chars"])
        held = passes(case["outcome"], kind, original_decision, attacked_decision, found)
        plain = plain_right(case["outcome"], original_decision)
        judged += plain is not None
        baseline_failures += plain is False
        evaded = plain is not False and not held
        evasions += evaded
        failed_attempts += not held
        if evaded or plain is False:
            failures.append({"finding": "evasion" if evaded else "baseline_failure", "original_text": attempt.original,
                             "attacked_text": attempt.attacked, "original_decision": original_decision,
                             "attacked_decision": attacked_decision, "original_output": original_output,
                             "attacked_output": attacked_output, **{k: v for k, v in found.items() if v}})  # fmt: skip
    attempts = len(case["texts"])
    measured = attempts - baseline_failures
    rate = evasions / measured if measured else None
    tolerance = case["max_attack_success_rate"]
    if rate is None:
        summary = f"all {attempts} plain texts already got the wrong outcome: no attempt measures the attack"
    else:
        summary = (f"{evasions} evasion(s) in {measured} attempt(s) whose plain text was handled right (attack "
                   f"success rate {rate:.4g}, tolerated {tolerance:.4g})")  # fmt: skip
    if baseline_failures:
        summary += f"; {baseline_failures} of {judged} plain texts already wrong (baseline failures)"
    shown = {k: v for k, v in case["params"].items() if k != "glossaries"}
    return SafetyTestResult(
        test_name=case["name"], category=case["category"], severity=case["severity"],
        passed=rate is not None and rate <= tolerance,
        details=summary,
        evidence={"technique": case["technique"], "technique_description": case["technique_description"],
                  "params": shown, "expected_behaviour": case["expected_behaviour"], "outcome": case["outcome"],
                  "attempts": attempts, "plain_texts_judged": judged, "baseline_failures": baseline_failures,
                  "evasions": evasions, "attack_success_rate": None if rate is None else round(rate, 6),
                  "max_attack_success_rate": tolerance, "failed_attempts": failed_attempts,
                  "failures": failures})  # fmt: skip


def baseline_check(results: list[SafetyTestResult], severity: str | None) -> SafetyTestResult | None:
    """``baseline_detection``: the plain texts whose expected outcome is a decision get it, before any attack.
    None when no case has such a plain text (nothing to judge). ``severity`` None: the most severe of the cases
    with a baseline failure (a critical case's missed texts block, as its expected behaviour is not met)."""
    judged = sum(r.evidence["plain_texts_judged"] for r in results)
    if not judged:
        return None
    by_test = {r.test_name: r.evidence["baseline_failures"] for r in results if r.evidence["baseline_failures"]}
    missed: dict[str, dict[str, Any]] = {}
    for r in results:
        for f in r.evidence["failures"]:
            if f["finding"] == "baseline_failure":
                missed.setdefault(f["original_text"], {"text": f["original_text"], "expected": r.evidence["outcome"],
                                                       "decision": f["original_decision"]})  # fmt: skip
    failed = sum(by_test.values())
    if severity is None:
        missed_in = [r.severity for r in results if r.evidence["baseline_failures"]]
        severity = min(missed_in, key=SEVERITIES.index) if missed_in else BASELINE_SEVERITY
    return SafetyTestResult(
        test_name="baseline_detection", category="baseline", passed=failed == 0, severity=severity,
        details=f"{failed} of {judged} attempts started from a plain text that already got the wrong outcome "
                f"({len(missed)} distinct texts missed)" if failed else
                f"the plain texts of all {judged} attempts handled right",
        evidence={"plain_texts_judged": judged, "baseline_failures": failed, "by_test": by_test,
                  "distinct_texts_missed": len(missed), "missed": list(missed.values())[:SHOWN_MISSES]})  # fmt: skip


def run_redteam(config_path: str | Path, target: Callable[[str], Any] | str | None = None,
                target_name: str | None = None, *, chat_model: str | None = None, model_version: str | None = None,
                library_path: Path | None = None) -> dict[str, Any]:  # fmt: skip
    """Run every case of a red-team config against a text model; the JSON report (see suite.build_report).

    ``target`` is a callable from text to the model's output, or None for the config's ``target:`` chat model;
    with ``chat_model`` it is the base URL of an OpenAI-compatible endpoint serving that model.
    """
    raw = load_yaml_mapping(config_path)
    settings = chat_settings(raw, str(config_path))
    seed = raw.get("seed", 0) if isinstance(raw.get("seed", 0), int) else 0
    if chat_model is not None:
        base = settings or ChatSettings(base_url=str(target), model=chat_model)
        settings = replace(base, base_url=str(target), model=chat_model)
    if chat_model is not None or (target is None and settings is not None):
        assert settings is not None
        target = ChatTarget(settings, canary(random.Random(f"{seed}/system-canary")))
        target_name = target.name
    if not callable(target):
        raise TargetError(f"{config_path}: no target: pass --target, or give the config a target section")
    library = load_library(library_path)
    kind = getattr(target, "kind", "classifier")
    config = parse_config(raw, str(config_path), library, kind)

    def decide(output: Any) -> str:
        return _chat_decision(output, config["labels"]) if kind == "chat" else \
            _decision(output, config["threshold"], config["labels"])  # fmt: skip

    results = [run_case(case, target, config["seed"], decide) for case in config["cases"]]
    baseline = baseline_check(results, config["baseline_detection"]["severity"])
    attacks = results
    if baseline is not None:
        results = [*results, baseline]
    path = Path(config_path)
    return build_report("redteam", config["model_id"], config["seed"], results,
                        model_version=model_version or config["model_version"]
                        or getattr(target, "file_sha256", None), target=target_name,
                        target_kind=kind, config_file=str(path), config_sha256=sha256_file(path),
                        library_sha256=sha256_file(library_path or Path(str(LIBRARY))),
                        attempts=sum(r.evidence["attempts"] for r in attacks),
                        failed_attempts=sum(r.evidence["failed_attempts"] for r in attacks),
                        baseline_failures=sum(r.evidence["baseline_failures"] for r in attacks),
                        evasions=sum(r.evidence["evasions"] for r in attacks),
                        reporting=config["reporting"])  # fmt: skip
