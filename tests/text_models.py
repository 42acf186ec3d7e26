"""Small real text moderators for the red-team tests: TF-IDF + logistic regression trained on a shipped corpus
(tests/data/moderation_corpus.csv), naive and behind the library's Unicode hardening."""

from __future__ import annotations

import csv
from functools import cache
from pathlib import Path

from sklearn.feature_extraction.text import TfidfVectorizer
from sklearn.linear_model import LogisticRegression
from sklearn.pipeline import make_pipeline

from exporter.gate.redteam.unicode_text import normalise_text

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
