"""Two small models to try the safety and red-team suites on (see docs/ml/safety-redteam.md).

Run from this directory: ``MODULE:OBJECT`` is imported from the working directory.
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
from sklearn.compose import ColumnTransformer
from sklearn.impute import SimpleImputer
from sklearn.linear_model import LogisticRegression
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import StandardScaler

from exporter.gate.redteam.unicode_text import normalise_text

_X = np.loadtxt(Path(__file__).with_name("credit-inputs.csv"), delimiter=",", skiprows=1)
_y = (0.08 * (_X[:, 0] - 50) - 4 * (_X[:, 1] - 0.5) > 0).astype(int)
# income, debt_ratio, years_employed, gender: the model never sees gender (column 3); missing values get the median
credit_model = make_pipeline(
    SimpleImputer(strategy="median"),
    ColumnTransformer([("scaled", StandardScaler(), [0, 1, 2])], remainder="drop"),
    LogisticRegression(),
).fit(_X, _y)

BLOCKLIST = {"idiot", "stupid", "loser", "moron", "kill", "hurt", "destroy", "die", "hates", "creep", "freak",
             "password", "prize", "beat", "money", "disgusting"}  # fmt: skip


def keyword_moderator(text: str) -> bool:
    """True (block) when the text contains a blocklisted word."""
    return any(word in BLOCKLIST for word in re.findall(r"\w+", text.lower()))


def hardened_moderator(text: str) -> bool:
    """The same blocklist after stripping invisible characters and folding Unicode look-alikes."""
    return keyword_moderator(normalise_text(text))
