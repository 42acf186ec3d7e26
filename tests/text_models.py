"""Small real text moderators for the red-team tests: TF-IDF + logistic regression trained on a shipped corpus
(tests/data/moderation_corpus.csv), naive and behind the library's Unicode hardening; and a keyword blocklist, bare
and behind NFKC with format characters removed."""

from __future__ import annotations

import csv
import re
import unicodedata
from functools import cache
from pathlib import Path

from sklearn.feature_extraction.text import TfidfVectorizer
from sklearn.linear_model import LogisticRegression
from sklearn.pipeline import make_pipeline

from exporter.gate.redteam.unicode_text import normalise_text, strip_invisible

CORPUS = Path(__file__).parent / "data" / "moderation_corpus.csv"


@cache
def _pipeline():
    with CORPUS.open(newline="", encoding="utf-8") as f:
        rows = list(csv.DictReader(f))
    model = make_pipeline(TfidfVectorizer(ngram_range=(1, 1)), LogisticRegression(C=20.0, max_iter=1000))
    return model.fit([r["text"] for r in rows], [int(r["label"]) for r in rows])


@cache
def naive(text: str) -> float:
    """Probability that the text is harmful, read as it arrives."""
    return float(_pipeline().predict_proba([text])[0, 1])


def hardened(text: str) -> float:
    """The same model after stripping invisible characters, NFKC and folding Unicode look-alikes to ASCII."""
    return naive(normalise_text(text))


def label(text: str) -> str:
    """The naive model answering with string labels, as many serving stacks do."""
    return "toxic" if naive(text) >= 0.5 else "ok"


# A keyword moderator as a team writes it on its first day: a short blocklist matched word by word. It misses
# most of the library's harmful texts before any attack, which is what tells baseline failures from evasions.
KEYWORDS = frozenset({"idiot", "kill", "hurt", "password", "moron", "loser"})


def keyword_moderator(text: str) -> bool:
    """True (block) when a word of the text is on the blocklist."""
    return bool(KEYWORDS & set(re.findall(r"\w+", text.casefold())))


def nfkc_keyword_moderator(text: str) -> bool:
    """The same blocklist behind NFKC and the removal of Unicode format characters (category Cf, every zero-width
    character): the hardening issue 30 tried, which folds compatibility forms but not look-alikes of other
    scripts."""
    return keyword_moderator(strip_invisible(unicodedata.normalize("NFKC", text)))
