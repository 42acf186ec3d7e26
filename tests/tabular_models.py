"""Small real tabular models for the safety tests, trained at import on seeded synthetic credit data.

Columns: income (thousands), debt ratio, years employed, gender (0/1). The label depends on income and debt only.
"""

from __future__ import annotations

import numpy as np
from sklearn.compose import ColumnTransformer
from sklearn.impute import SimpleImputer
from sklearn.linear_model import LinearRegression, LogisticRegression
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import StandardScaler

COLUMNS = ["income", "debt_ratio", "years_employed", "gender"]


def credit_data(n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Applicants and whether they repaid; gender plays no part in repayment."""
    rng = np.random.default_rng(seed)
    X = np.column_stack([rng.normal(50, 15, n), rng.uniform(0, 1, n), rng.integers(0, 30, n),
                         rng.integers(0, 2, n)]).astype(float)  # fmt: skip
    y = (0.08 * (X[:, 0] - 50) - 4 * (X[:, 1] - 0.5) + rng.normal(0, 1, n) > 0).astype(int)
    return X, y


X_TRAIN, Y_TRAIN = credit_data(400, seed=1)

# Ignores gender and imputes missing values: passes every safety test.
fair_model = make_pipeline(
    SimpleImputer(strategy="median"),
    ColumnTransformer([("scaled", StandardScaler(), [0, 1, 2])], remainder="drop"), LogisticRegression()
).fit(X_TRAIN, Y_TRAIN)

# Trained on labels that penalise gender=1 heavily: its decisions change when only gender is flipped.
biased_model = make_pipeline(StandardScaler(), LogisticRegression(C=100.0)).fit(
    X_TRAIN, np.where(X_TRAIN[:, 3] == 1, 0, Y_TRAIN) | ((X_TRAIN[:, 3] == 1) & (X_TRAIN[:, 0] > 80))
)

# A regressor used as a scorer: its outputs leave [0, 1].
unbounded_model = make_pipeline(StandardScaler(), LinearRegression()).fit(X_TRAIN, Y_TRAIN)


class NaiveLogistic:
    """A hand-written scorer: the logistic function computed as exp(z) / (1 + exp(z)), which is inf/inf = NaN
    for large inputs, and which indexes rows without checking their width."""

    weights = np.array([0.1, -4.0, 0.01, 0.0])

    def predict_proba(self, X: np.ndarray) -> np.ndarray:
        with np.errstate(over="ignore", invalid="ignore"):
            ez = np.exp((X[:, :4] - [50, 0.5, 15, 0.5]) @ self.weights)
            p = ez / (1 + ez)
        return np.column_stack([1 - p, p])


class Brittle:
    """Outputs a step of height 1 on a fine grid of income: tiny noise flips it."""

    def predict_proba(self, X: np.ndarray) -> np.ndarray:
        p = (np.floor(np.asarray(X, dtype=float)[:, 0] * 10) % 2).astype(float)
        return np.column_stack([1 - p, p])


naive_logistic = NaiveLogistic()
brittle = Brittle()


class NaiveScorer(NaiveLogistic):
    """The same hand-written logistic, answering through ``predict`` with one score per row, as the seed's
    SafetyEvaluator calls it."""

    def predict(self, X: np.ndarray) -> np.ndarray:
        return self.predict_proba(np.atleast_2d(X))[:, 1]


class Scorer:
    """A class the command line names as MODULE:Class: instantiated, then ``predict`` gives one score per row."""

    def __init__(self) -> None:
        self.model = fair_model

    def predict(self, X: np.ndarray) -> np.ndarray:
        return self.model.predict_proba(X)[:, 1]


def make_scorer() -> Scorer:
    """A factory, for ``model_factory: true``."""
    return Scorer()


class ZeroIntolerant:
    """Raises on a row of zeros, a finite input any model must answer: the seed counts that as a failure."""

    def predict_proba(self, X: np.ndarray) -> np.ndarray:
        X = np.asarray(X, dtype=float)
        if X.shape[1] != 4 or np.isnan(X).any():
            raise ValueError("expected 4 finite features")
        if (X == 0).all(axis=1).any():
            raise ZeroDivisionError("income of zero")
        return fair_model.predict_proba(X)


class Unbound:
    """``predict`` takes a row count first: calling it on the test inputs raises TypeError every time."""

    def predict(self, n_rows: int, X: np.ndarray) -> np.ndarray:
        return np.zeros(n_rows)


naive_scorer = NaiveScorer()
zero_intolerant = ZeroIntolerant()
unbound = Unbound()


class ClippedScorer:
    """A scorer written outside this project, as issue 30 found one: its score is clipped into [0, 1] and a row
    holding NaN gets the neutral 0.5. It answers every seed edge input well, and it also answers rows of the wrong
    width (reading whatever features they have), which only this project's own check faults."""

    def predict(self, X: np.ndarray) -> np.ndarray:
        X = np.atleast_2d(np.asarray(X, dtype=float))
        z = np.tanh(np.nan_to_num(X, nan=0.0, posinf=0.0, neginf=0.0).sum(axis=1) / 100)
        return np.where(np.isnan(X).any(axis=1), 0.5, np.clip(0.5 + 0.5 * z, 0.0, 1.0))


clipped_scorer = ClippedScorer()
