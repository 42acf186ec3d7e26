"""Unicode look-alikes and invisible characters, for the red-team attacks and for hardening a text model.

Look-alikes come from Unicode's confusables data (UTS #39 ``confusables.txt``) as shipped by the
``confusable-homoglyphs`` package, and scripts from Unicode's ``Scripts.txt`` through the same package: no
hand-made map. Install with ``pip install 'fairness-exporter[safety]'``.
"""

from __future__ import annotations

import unicodedata
from collections.abc import Callable
from functools import cache

# Characters that render as nothing, by the names the red-team configs use. All are Unicode format characters
# (general category Cf), which is what strip_invisible removes.
INVISIBLE_CHARS = {
    "zero_width_space": "\u200b",
    "zero_width_non_joiner": "\u200c",
    "zero_width_joiner": "\u200d",
    "word_joiner": "\u2060",
    "zero_width_no_break_space": "\ufeff",
    "soft_hyphen": "\u00ad",
    "invisible_separator": "\u2063",
    "left_to_right_mark": "\u200e",
}


def _data() -> tuple[dict[str, list[dict[str, str]]], Callable[[str], str]]:
    try:
        from confusable_homoglyphs import categories, confusables
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise ImportError("homoglyph attacks need Unicode's confusables data: "
                          "pip install 'fairness-exporter[safety]'") from exc  # fmt: skip
    return confusables.confusables_data, categories.alias


@cache
def lookalikes(char: str, scripts: tuple[str, ...] | None = None) -> tuple[str, ...]:
    """Single characters that Unicode lists as confusable with ``char``, from ``scripts`` (e.g. ``("CYRILLIC",)``)
    or, when None, from any script other than ASCII. Sorted, so a seeded choice among them is reproducible.

    >>> [f"U+{ord(c):04X}" for c in lookalikes("a", ("CYRILLIC",))]
    ['U+0430']
    """
    data, alias = _data()
    found = {entry["c"] for entry in data.get(char, ()) if len(entry["c"]) == 1 and not entry["c"].isascii()}
    if scripts is not None:
        found = {c for c in found if alias(c) in scripts}
    return tuple(sorted(found))


@cache
def _ascii_prototype(char: str) -> str:
    data, _ = _data()
    for entry in data.get(char, ()):
        if len(entry["c"]) == 1 and entry["c"].isascii() and entry["c"].isalnum():
            return entry["c"]
    return char


def strip_invisible(text: str) -> str:
    """Remove Unicode format characters (category Cf): zero-width spaces and joiners, BOM, soft hyphen, bidi marks."""
    return "".join(c for c in text if unicodedata.category(c) != "Cf")


def fold_confusables(text: str) -> str:
    """Replace each non-ASCII character that Unicode lists as confusable with an ASCII letter or digit by it.

    Meant for models that read Latin-script text: it also folds genuine Cyrillic or Greek words.
    """
    return "".join(c if c.isascii() else _ascii_prototype(c) for c in text)


def normalise_text(text: str) -> str:
    """The hardening a Latin-script text model can put in front of itself: strip invisible characters, fold
    look-alikes to ASCII, NFKC (compatibility forms such as ligatures), and fold what NFKC produced.

    Folding comes before NFKC because NFKC turns some confusables into something else: GREEK YPOGEGRAMMENI
    (U+037A, a look-alike of ``i``) becomes a space and a combining mark.
    """
    return fold_confusables(unicodedata.normalize("NFKC", fold_confusables(strip_invisible(text))))
