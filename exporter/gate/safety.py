"""The safety suite: output bounds, stability under small input noise, behaviour on null and edge inputs and,
optionally, counterfactual consistency on a protected attribute, for any model with ``predict``.

The model is a scikit-learn estimator or pipeline, a plain object with ``predict`` (and ``predict_proba``, which
is used for outputs when present), or a callable from a 2-D array to outputs. Inputs are float arrays of shape
(rows, feature_count). Every random draw comes from ``numpy.random.default_rng(seed)``, so a run is reproducible.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from exporter.config import ConfigError
from exporter.gate.audit import read_predictions, sha256_file
from exporter.gate.suite import (
    BLOCKING_SEVERITY,
    SafetyTestResult,
    build_report,
    check_severity,
    load_yaml_mapping,
)

CATEGORIES = {"output_bounds": "validity", "perturbation_stability": "robustness",
              "null_and_edge_inputs": "robustness", "counterfactual_consistency": "fairness"}
TESTS = tuple(CATEGORIES)
# A model that refuses a malformed input with one of these exceptions rejects it cleanly; any other exception
# is a crash. scikit-learn raises ValueError for NaN, infinite and wrong-width inputs.
CLEAN_REJECTIONS = (ValueError, TypeError)
SHOWN_ROWS = 10


class SafetyEvaluator:
    """Run the safety tests against one model; each ``test_*`` method returns a SafetyTestResult."""

    def __init__(self, model: Any, *, feature_count: int, valid_output_range: tuple[float, float] = (0.0, 1.0),
                 seed: int = 0, noise_std: float = 0.01, noise_scale: str = "feature_std",
                 max_output_change: float = 0.1, max_unstable_share: float = 0.05,
                 severities: dict[str, str] | None = None) -> None:  # fmt: skip
        self.model = model
        self.feature_count = feature_count
        self.low, self.high = valid_output_range
        self.seed = seed
        self.noise_std, self.noise_scale = noise_std, noise_scale
        self.max_output_change, self.max_unstable_share = max_output_change, max_unstable_share
        self.severities = {name: BLOCKING_SEVERITY for name in TESTS} | (severities or {})

    def outputs(self, X: np.ndarray) -> np.ndarray:
        """The model's outputs as a float array of shape (rows, outputs): ``predict_proba`` when it has one."""
        if hasattr(self.model, "predict_proba"):
            raw = self.model.predict_proba(X)
        elif hasattr(self.model, "predict"):
            raw = self.model.predict(X)
        else:
            raw = self.model(X)
        out = np.asarray(raw, dtype=float)
        return out.reshape(len(out), -1)

    def decisions(self, X: np.ndarray, threshold: float = 0.5) -> np.ndarray:
        """The model's decisions: the labels ``predict`` returns; a score (a non-integral float, or any output of
        a model without ``predict``) becomes a decision at ``threshold``."""
        if hasattr(self.model, "predict"):
            labels = np.asarray(self.model.predict(X)).reshape(len(X), -1)[:, 0]
            if not (labels.dtype.kind == "f" and np.any(labels != np.round(labels))):
                return labels
            return labels >= threshold
        return self.outputs(X)[:, -1] >= threshold

    def guarded(self, name: str, test: Any, *args: Any) -> SafetyTestResult:
        """Run one test; a model that raises on the configured inputs fails it, with the error as the detail."""
        try:
            return test(*args)
        except Exception as exc:  # the model's code failing on valid inputs is the finding, not a crash of ours
            return self._result(name, False, {"error": f"{type(exc).__name__}: {exc}"})

    def _result(self, name: str, passed: bool, details: dict[str, Any]) -> SafetyTestResult:
        return SafetyTestResult(name, CATEGORIES[name], bool(passed), details, self.severities[name])

    def test_output_boundaries(self, X: np.ndarray) -> SafetyTestResult:
        """Every output on the test inputs is finite and within the valid range."""
        out = self.outputs(X)
        bad = ~np.isfinite(out) | (out < self.low) | (out > self.high)
        rows = np.flatnonzero(bad.any(axis=1))
        return self._result("output_bounds", rows.size == 0, {
            "valid_output_range": [self.low, self.high], "rows": len(X), "outputs_per_row": out.shape[1],
            "min_output": _float(np.nanmin(out)) if out.size else None,
            "max_output": _float(np.nanmax(out)) if out.size else None,
            "rows_out_of_range": int(rows.size), "first_rows_out_of_range": rows[:SHOWN_ROWS].tolist()})  # fmt: skip

    def test_input_perturbation_stability(self, X: np.ndarray) -> SafetyTestResult:
        """Add Gaussian noise to every feature and count the rows whose outputs move by more than allowed;
        fails when that share reaches ``max_unstable_share``."""
        rng = np.random.default_rng(self.seed)
        scale = X.std(axis=0) if self.noise_scale == "feature_std" else np.ones(X.shape[1])
        noisy = X + rng.normal(0.0, 1.0, size=X.shape) * self.noise_std * scale
        change = np.abs(self.outputs(noisy) - self.outputs(X)).max(axis=1)
        unstable = np.flatnonzero(~(change <= self.max_output_change))  # NaN counts as unstable
        share = unstable.size / len(X)
        return self._result("perturbation_stability", share < self.max_unstable_share, {
            "noise_std": self.noise_std, "noise_scale": self.noise_scale,
            "max_output_change": self.max_output_change, "max_unstable_share": self.max_unstable_share,
            "rows": len(X), "unstable_rows": int(unstable.size), "unstable_share": round(share, 6),
            "largest_change": _float(np.nanmax(change)) if change.size else None,
            "first_unstable_rows": unstable[:SHOWN_ROWS].tolist()})  # fmt: skip

    def edge_inputs(self) -> dict[str, np.ndarray]:
        """The null and edge inputs, one row each."""
        f = self.feature_count
        return {"all_zeros": np.zeros((1, f)), "all_ones": np.ones((1, f)), "all_1e6": np.full((1, f), 1e6),
                "all_minus_1e6": np.full((1, f), -1e6), "all_nan": np.full((1, f), np.nan),
                "empty_row": np.empty((1, 0)), "wrong_width_row": np.zeros((1, f + 1))}  # fmt: skip

    def test_null_and_edge_inputs(self) -> SafetyTestResult:
        """Each edge input either gets one finite output row or a clean rejection (ValueError / TypeError)."""
        outcomes: dict[str, str] = {}
        for name, row in self.edge_inputs().items():
            try:
                out = self.outputs(row)
            except CLEAN_REJECTIONS as exc:
                outcomes[name] = f"rejected: {type(exc).__name__}"
            except Exception as exc:  # the model's own code failing on the input is the finding
                outcomes[name] = f"crashed: {type(exc).__name__}: {exc}"
            else:
                if len(out) != 1:
                    outcomes[name] = f"failed: {len(out)} output rows for 1 input row"
                elif not np.isfinite(out).all():
                    outcomes[name] = f"failed: non-finite output {out[0].tolist()}"
                else:
                    outcomes[name] = "ok"
        failed = [name for name, outcome in outcomes.items() if not outcome.startswith(("ok", "rejected"))]
        return self._result("null_and_edge_inputs", not failed, {"inputs": outcomes, "failed_inputs": failed})

    def test_counterfactual_consistency(self, X: np.ndarray, feature: int, values: Sequence[float],
                                        max_changed_share: float = 0.0,
                                        decision_threshold: float = 0.5) -> SafetyTestResult:  # fmt: skip
        """Swap a protected attribute's two values (column ``feature``) and count the rows whose decision changes;
        fails when that share exceeds ``max_changed_share``."""
        a, b = values
        column = X[:, feature]
        eligible = np.isin(column, [a, b])
        flipped = X.copy()
        flipped[:, feature] = np.where(column == a, b, np.where(column == b, a, column))
        before, after = self.decisions(X, decision_threshold), self.decisions(flipped, decision_threshold)
        changed = np.flatnonzero(eligible & (after != before))
        n = int(eligible.sum())
        share = changed.size / n if n else 0.0
        return self._result("counterfactual_consistency", share <= max_changed_share, {
            "feature": feature, "values": [a, b], "rows_flipped": n, "decisions_changed": int(changed.size),
            "changed_share": round(share, 6), "max_changed_share": max_changed_share,
            "first_changed_rows": changed[:SHOWN_ROWS].tolist()})  # fmt: skip


def _float(x: Any) -> float | None:
    x = float(x)
    return x if np.isfinite(x) else None


def _number(raw: dict[str, Any], key: str, default: float, problems: list[str], where: str = "") -> float:
    value = raw.get(key, default)
    if not isinstance(value, int | float) or isinstance(value, bool) or not np.isfinite(value) or value < 0:
        problems.append(f"{where}{key}: {value!r} is not a non-negative number")
        return default
    return float(value)


def load_safety_config(path: str | Path) -> dict[str, Any]:
    """Validate a safety config and read its test inputs; a ConfigError lists every problem."""
    path = Path(path)
    raw = load_yaml_mapping(path)
    problems: list[str] = []
    model_id = raw.get("model_id")
    if not isinstance(model_id, str) or not model_id:
        problems.append("model_id: required, a non-empty string")
    feature_count = raw.get("feature_count")
    if not isinstance(feature_count, int) or isinstance(feature_count, bool) or feature_count < 1:
        problems.append(f"feature_count: {feature_count!r} is not a positive integer")
    bounds = raw.get("valid_output_range")
    if not (isinstance(bounds, list) and len(bounds) == 2 and all(isinstance(v, int | float) for v in bounds)
            and bounds[0] <= bounds[1]):  # fmt: skip
        problems.append(f"valid_output_range: {bounds!r} is not [low, high]")
        bounds = [0.0, 1.0]
    seed = raw.get("seed", 0)
    if not isinstance(seed, int) or isinstance(seed, bool):
        problems.append(f"seed: {seed!r} is not an integer")
    pert = raw.get("perturbation") or {}
    noise_scale = pert.get("noise_scale", "feature_std")
    if noise_scale not in ("feature_std", "absolute"):
        problems.append(f"perturbation.noise_scale: {noise_scale!r} is not feature_std or absolute")
    severities = {}
    for name, value in (raw.get("severity") or {}).items():
        if name not in TESTS:
            problems.append(f"severity.{name}: not a test (tests: {', '.join(TESTS)})")
        severities[name] = check_severity(value, f"severity.{name}", problems)
    evaluator_args = {
        "noise_std": _number(pert, "noise_std", 0.01, problems, "perturbation."),
        "max_output_change": _number(pert, "max_output_change", 0.1, problems, "perturbation."),
        "max_unstable_share": _number(pert, "max_unstable_share", 0.05, problems, "perturbation."),
        "noise_scale": noise_scale, "severities": severities,
    }

    inputs_path, X = None, None
    if not isinstance(raw.get("test_inputs"), str):
        problems.append("test_inputs: required, the path of a CSV or parquet file of numeric rows")
    else:
        inputs_path = (path.parent / raw["test_inputs"]).resolve()
        try:
            frame = read_predictions(inputs_path)
        except ValueError as exc:
            problems.append(f"test_inputs: {exc}")
        else:
            non_numeric = [str(c) for c in frame.columns if not np.issubdtype(frame[c].dtype, np.number)]
            if non_numeric:
                problems.append(f"test_inputs: {inputs_path}: columns {non_numeric} are not numeric")
            elif isinstance(feature_count, int) and frame.shape[1] != feature_count:
                problems.append(f"test_inputs: {inputs_path} has {frame.shape[1]} columns, feature_count is "
                                f"{feature_count}")  # fmt: skip
            elif frame.isna().any().any():
                problems.append(f"test_inputs: {inputs_path}: missing values in columns "
                                f"{[str(c) for c in frame.columns[frame.isna().any()]]}")  # fmt: skip
            else:
                X = frame.to_numpy(dtype=float)

    counterfactual = raw.get("counterfactual")
    if counterfactual is not None and X is not None:
        feature = counterfactual.get("feature") if isinstance(counterfactual, dict) else None
        columns = [str(c) for c in frame.columns]
        if isinstance(feature, str) and feature in columns:
            counterfactual = {**counterfactual, "feature": columns.index(feature)}
        elif not (isinstance(feature, int) and 0 <= feature < len(columns)):
            problems.append(f"counterfactual.feature: {feature!r} is neither a column of test_inputs "
                            f"({', '.join(columns)}) nor a column index")  # fmt: skip
        values = counterfactual.get("values") if isinstance(counterfactual, dict) else None
        if not (isinstance(values, list) and len(values) == 2 and all(isinstance(v, int | float) for v in values)):
            problems.append(f"counterfactual.values: {values!r} is not the attribute's two numeric values [a, b]")
        if isinstance(counterfactual, dict):
            _number(counterfactual, "max_changed_share", 0.0, problems, "counterfactual.")
            _number(counterfactual, "decision_threshold", 0.5, problems, "counterfactual.")
    if problems:
        raise ConfigError(f"{path}: " + "; ".join(problems))
    return {"model_id": model_id, "seed": seed, "feature_count": feature_count, "valid_output_range": bounds,
            "inputs_path": inputs_path, "X": X, "counterfactual": counterfactual,
            "evaluator": evaluator_args}  # fmt: skip


def run_safety(config_path: str | Path, model: Any, model_name: str) -> dict[str, Any]:
    """Run the configured safety tests against a model; the JSON report (see suite.build_report)."""
    config = load_safety_config(config_path)
    evaluator = SafetyEvaluator(model, feature_count=config["feature_count"], seed=config["seed"],
                                valid_output_range=tuple(config["valid_output_range"]),
                                **config["evaluator"])  # fmt: skip
    X = config["X"]
    results = [evaluator.guarded("output_bounds", evaluator.test_output_boundaries, X),
               evaluator.guarded("perturbation_stability", evaluator.test_input_perturbation_stability, X),
               evaluator.test_null_and_edge_inputs()]  # fmt: skip
    cf = config["counterfactual"]
    if cf is not None:
        results.append(evaluator.guarded("counterfactual_consistency", evaluator.test_counterfactual_consistency,
                                         X, cf["feature"], cf["values"], float(cf.get("max_changed_share", 0.0)),
                                         float(cf.get("decision_threshold", 0.5))))
    path = Path(config_path)
    return build_report("safety", config["model_id"], config["seed"], results, model=model_name,
                        config_file=str(path), config_sha256=sha256_file(path),
                        test_inputs=str(config["inputs_path"]), test_inputs_sha256=sha256_file(config["inputs_path"]),
                        rows=len(X))  # fmt: skip
