"""Read a decision from a model's answer: a regex whose first group names the outcome, or a field of the JSON the
prompt asked for. An answer it cannot read is ``None`` (counted as unparsed), never a decision.

``decision: {pattern: '^\\W*(yes|no)\\b', positive: yes}``: the first group of the first match (the whole match
when the pattern has no group), compared without case with ``positive`` (one value or a list). With ``negative``
given, only its values are negative decisions and any other match is unparsed; without it every other match is
negative (an unquoted ``yes``, which YAML reads as true, stands for yes, true and on; ``no`` for no, false and
off). ``decision: {json_field: decision, positive: invite}``: the answer's first JSON object (a fenced
```json block or bare, with any text around it: a second object or a note in braces after it is not read), the
dotted field read from it. ``ignore_case`` (default true) applies to the pattern too.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any, Final

from exporter.config.toolkit import Errors

KEYS: Final = {"pattern", "json_field", "positive", "negative", "ignore_case"}
_DECODER: Final = json.JSONDecoder()


def _first_object(answer: str) -> Any:
    """The first JSON object of the text: decoded from its first ``{`` that starts one (a brace in prose before it
    is skipped), up to where that object ends; None when no ``{`` starts one."""
    start = answer.find("{")
    while start >= 0:
        try:
            return _DECODER.raw_decode(answer, start)[0]
        except ValueError:
            start = answer.find("{", start + 1)
    return None


@dataclass(frozen=True)
class Extractor:
    """A validated decision extractor."""

    positive: frozenset[str]
    negative: frozenset[str] | None = None
    pattern: re.Pattern[str] | None = None
    json_field: tuple[str, ...] | None = None

    def outcome(self, answer: str) -> str | None:
        """The outcome the answer states (case-folded text), or None when it states none this extractor reads."""
        if self.pattern is not None:
            match = self.pattern.search(answer)
            if match is None:
                return None
            said = match.group(1) if self.pattern.groups else match.group(0)
            return None if said is None else said.strip().casefold()
        assert self.json_field is not None
        value = _first_object(answer)
        for key in self.json_field:
            if not isinstance(value, dict) or key not in value:
                return None
            value = value[key]
        if isinstance(value, bool):
            return "true" if value else "false"
        return str(value).strip().casefold() if isinstance(value, str | int | float) else None

    def decide(self, answer: str) -> bool | None:
        """True (positive), False (negative) or None (unparsed)."""
        outcome = self.outcome(answer)
        if outcome is None:
            return None
        if outcome in self.positive:
            return True
        if self.negative is None or outcome in self.negative:
            return False
        return None


YAML_BOOLEANS: Final = {True: ("true", "yes", "on"), False: ("false", "no", "off")}
"""What YAML reads as true or false when unquoted: ``positive: yes`` arrives as True, and means any of them (a
JSON field's true, or the text a pattern captured)."""


def _values(raw: Any, where: str, errors: Errors) -> frozenset[str] | None:
    values = raw if isinstance(raw, list) else [raw]
    if not values or not all(isinstance(v, str | int | bool) for v in values):
        errors.add(where, f"{raw!r} is not an outcome or a list of outcomes (e.g. yes)")
        return None
    return frozenset(o for v in values for o in (YAML_BOOLEANS[v] if isinstance(v, bool) else
                                                 (str(v).strip().casefold(),)))  # fmt: skip


def parse_extractor(raw: Any, errors: Errors) -> Extractor:
    """Validate ``decision:``; every problem is added to ``errors``."""
    fallback = Extractor(frozenset({"yes"}), pattern=re.compile(r"x"))
    if not isinstance(raw, dict):
        errors.add("decision", "required: {pattern: REGEX, positive: VALUE} or {json_field: FIELD, positive: VALUE}")
        return fallback
    errors.check_keys("decision", raw, KEYS)
    if ("pattern" in raw) == ("json_field" in raw):
        errors.add("decision", "give either pattern (a regex) or json_field (a dotted field of a JSON answer)")
        return fallback
    positive = _values(raw.get("positive"), "decision.positive", errors)
    negative = _values(raw["negative"], "decision.negative", errors) if "negative" in raw else None
    if positive and negative and positive & negative:
        errors.add("decision.negative", f"{sorted(positive & negative)} is also positive")
    ignore_case = raw.get("ignore_case", True)
    if not isinstance(ignore_case, bool):
        errors.add("decision.ignore_case", f"{ignore_case!r} is not true or false")
        ignore_case = True
    if "pattern" in raw:
        try:
            pattern = re.compile(str(raw["pattern"]), re.IGNORECASE if ignore_case else 0)
        except re.error as exc:
            errors.add("decision.pattern", f"{raw['pattern']!r} is not a regular expression: {exc}")
            return fallback
        return Extractor(positive or frozenset(), negative, pattern=pattern)
    field = raw["json_field"]
    if not isinstance(field, str) or not field or "" in field.split("."):
        errors.add("decision.json_field", f"{field!r} is not a dotted field name such as decision or result.invite")
        return fallback
    return Extractor(positive or frozenset(), negative, json_field=tuple(field.split(".")))
