"""Model files as a training run leaves them: scikit-learn trained on the breast-cancer data scikit-learn ships
(569 rows, 30 features), saved with skops and joblib and converted to ONNX with skl2onnx, plus test inputs."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import joblib
import numpy as np
import pandas as pd
import skops.io
from skl2onnx import to_onnx
from sklearn.datasets import load_breast_cancer
from sklearn.impute import SimpleImputer
from sklearn.linear_model import LogisticRegression
from sklearn.model_selection import train_test_split
from sklearn.pipeline import Pipeline, make_pipeline
from sklearn.preprocessing import StandardScaler

FEATURES = 30


@dataclass(frozen=True)
class ModelFiles:
    folder: Path
    pipeline: Pipeline
    X_test: np.ndarray
    inputs_csv: Path
    skops: Path
    joblib: Path
    onnx: Path


def train() -> tuple[Pipeline, np.ndarray]:
    """Median imputation (so NaN gets a finite output, as the seed asks), scaling, logistic regression."""
    data = load_breast_cancer()
    X_train, X_test, y_train, _ = train_test_split(data.data, data.target, test_size=120, random_state=0)
    model = make_pipeline(SimpleImputer(strategy="median"), StandardScaler(), LogisticRegression(max_iter=1000))
    return model.fit(X_train, y_train), X_test


def write(folder: Path) -> ModelFiles:
    model, X_test = train()
    folder.mkdir(parents=True, exist_ok=True)
    inputs = folder / "inputs.csv"
    pd.DataFrame(X_test, columns=load_breast_cancer().feature_names).to_csv(inputs, index=False)
    skops.io.dump(model, folder / "model.skops")
    joblib.dump(model, folder / "model.joblib")
    onnx = to_onnx(model, X_test[:1].astype(np.float32), options={"zipmap": False}, target_opset=17)
    (folder / "model.onnx").write_bytes(onnx.SerializeToString())
    return ModelFiles(folder, model, X_test, inputs, folder / "model.skops", folder / "model.joblib",
                      folder / "model.onnx")
