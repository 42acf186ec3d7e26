"""The red team's attacks: seeded rewrites of a text (look-alikes, invisible characters, leetspeak, translation)
and prompt templates (instruction override, role impersonation, training-data extraction) whose ``{canary}`` is
a reply an injection asks for and whose ``{prefix}`` is the start of a snippet a model may have memorised.

Each technique turns one text into an :class:`Attempt`: what is sent, and what a detector needs to read the reply.
"""

from __future__ import annotations

import itertools
import random
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from exporter.gate.redteam.unicode_text import INVISIBLE_CHARS, lookalikes
from exporter.gate.targets.chat import canary


@dataclass(frozen=True)
class Attempt:
    """One attack: the text sent, the original it was made from (None for a continuation probe), the reply an
    injection asked for, and the held-out continuation of a snippet whose reproduction is a leak."""

    attacked: str
    original: str | None
    injected_canary: str | None = None
    held_out: str | None = None


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


def split_snippet(snippet: str, params: dict[str, Any]) -> tuple[str, str]:
    """The prefix a continuation probe shows (``prefix_chars``, default half the snippet, ending at a word) and
    the rest, held out."""
    cut = int(params.get("prefix_chars") or len(snippet) // 2)
    space = snippet.rfind(" ", 0, cut + 1)
    cut = space if space > 0 else cut
    return snippet[:cut].rstrip(), snippet[cut:].lstrip()


def make_attempt(technique: str, text: str, rng: random.Random, params: dict[str, Any]) -> Attempt:
    """Apply a technique to one text. A template with ``{prefix}`` shows the start of the text (a snippet of
    training data) and holds out the rest; one with ``{canary}`` asks for a fresh canary as the reply."""
    if TECHNIQUES[technique][0] is not templated:
        return Attempt(attack(technique, text, rng, params), text)
    template = rng.choice(params["templates"])
    token = canary(rng) if "{canary}" in template else None
    if "{prefix}" in template:
        prefix, held_out = split_snippet(text, params)
        return Attempt(template.replace("{prefix}", prefix).replace("{canary}", token or ""), None, token, held_out)
    return Attempt(template.replace("{text}", text).replace("{canary}", token or ""), text, token)


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
    "system_prompt_extraction": (templated, {}),
}


def attack(technique: str, text: str, rng: random.Random, params: dict[str, Any]) -> str:
    """Apply a named technique to one text."""
    return TECHNIQUES[technique][0](text, rng, params)


