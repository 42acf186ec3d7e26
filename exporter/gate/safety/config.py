"""``fairness-exporter safety``: the safety config, the model it names, and the seed's SafetyEvaluator run on them.

The config (see ``examples/safety.yaml``) names the model (or the command line does), the test inputs and the
settings; :func:`run_safety` calls the same
:class:`~exporter.gate.safety.evaluator.SafetyEvaluator` methods a user's own code calls, so both give the same report.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Final

import numpy as np

from exporter.config import ConfigError
from exporter.config.toolkit import Errors, section, unknown_keys
from exporter.gate import storage
from exporter.gate.fairness.audit import read_table, sha256_file
from exporter.gate.safety.evaluator import NAN_POLICIES, NOISE_SCALES, OWN_CHECKS, TESTS, SafetyEvaluator
from exporter.gate.suite import check_severity, load_yaml_mapping
from exporter.gate.targets.files import LoadedModel, is_model_file, load_model

KEYS: Final = {"model_id", "model_version", "model", "model_factory", "trusted_types", "feature_count",
               "valid_output_range", "test_inputs", "seed", "nan_policy", "perturbation", "counterfactual",
               "severity", "skip_checks", "trusted"}  # fmt: skip
PERTURBATION_KEYS: Final = {"perturbation_magnitude", "noise_scale", "max_output_change", "max_unstable_share"}


def _number(raw: dict[str, Any], key: str, default: float, problems: list[str], where: str = "") -> float:
    value = raw.get(key, default)
    if not isinstance(value, int | float) or isinstance(value, bool) or not np.isfinite(value) or value < 0:
        problems.append(f"{where}{key}: {value!r} is not a non-negative number")
        return default
    return float(value)


def _inputs(raw: dict[str, Any], path: Path, feature_count: Any, problems: list[str]) -> tuple[Any, Any, Any]:
    """(location, frame, SHA-256) of test_inputs, a CSV or parquet file of numeric rows (local or a URL)."""
    if not isinstance(raw.get("test_inputs"), str):
        problems.append("test_inputs: required, the path (or URL) of a CSV or parquet file of numeric rows")
        return None, None, None
    location = storage.resolve(raw["test_inputs"], path.parent)
    try:
        frame, sha = read_table(location, "test inputs")
    except ValueError as exc:
        problems.append(f"test_inputs: {exc}")
        return location, None, None
    non_numeric = [str(c) for c in frame.columns if not np.issubdtype(frame[c].dtype, np.number)]
    if non_numeric:
        problems.append(f"test_inputs: {location}: columns {non_numeric} are not numeric")
    elif isinstance(feature_count, int) and frame.shape[1] != feature_count:
        problems.append(f"test_inputs: {location} has {frame.shape[1]} columns, feature_count is {feature_count}")
    elif frame.isna().any().any():
        problems.append(f"test_inputs: {location}: missing values in columns "
                        f"{[str(c) for c in frame.columns[frame.isna().any()]]}")  # fmt: skip
    else:
        return location, frame, sha
    return location, None, None


def _counterfactual(raw: Any, frame: Any, problems: list[str]) -> dict[str, Any] | None:
    if raw is None or frame is None:
        return None
    if not isinstance(raw, dict):
        problems.append(f"counterfactual: {raw!r} is not a mapping with feature and values")
        return None
    problems.extend(unknown_keys(raw, {"feature", "values", "max_changed_share", "decision_threshold"},
                                 "counterfactual."))
    feature, values = raw.get("feature"), raw.get("values")
    columns = [str(c) for c in frame.columns]
    if isinstance(feature, str) and feature in columns:
        feature = columns.index(feature)
    elif not (isinstance(feature, int) and 0 <= feature < len(columns)):
        problems.append(f"counterfactual.feature: {feature!r} is neither a column of test_inputs "
                        f"({', '.join(columns)}) nor a column index")  # fmt: skip
    if not (isinstance(values, list) and len(values) == 2 and all(isinstance(v, int | float) for v in values)):
        problems.append(f"counterfactual.values: {values!r} is not the attribute's two numeric values [a, b]")
    elif values[0] == values[1]:
        problems.append(f"counterfactual.values: {values!r} names one value twice: swapping it with itself changes no "
                        "decision, so the check would measure nothing; give the attribute's two different values")
    return {"feature": feature, "values": values,
            "max_changed_share": _number(raw, "max_changed_share", 0.0, problems, "counterfactual."),
            "decision_threshold": _number(raw, "decision_threshold", 0.5, problems, "counterfactual.")}  # fmt: skip


def load_safety_config(path: str | Path) -> dict[str, Any]:
    """Validate a safety config and read its test inputs; a ConfigError lists every problem."""
    path = Path(path)
    raw = load_yaml_mapping(path)
    problems: list[str] = []
    problems.extend(unknown_keys(raw, KEYS, ""))
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
    nan_policy = raw.get("nan_policy", "finite_output")
    if nan_policy not in NAN_POLICIES:
        problems.append(f"nan_policy: {nan_policy!r} is not one of {', '.join(NAN_POLICIES)}")
    errors = Errors(lines=problems)  # the config toolkit's sections, adding to the same problems
    pert = section(raw, "perturbation", errors, PERTURBATION_KEYS)
    noise_scale = pert.get("noise_scale", "absolute")
    if noise_scale not in NOISE_SCALES:
        problems.append(f"perturbation.noise_scale: {noise_scale!r} is not one of {', '.join(NOISE_SCALES)}")
    severities = {}
    for name, value in section(raw, "severity", errors, set(TESTS)).items():  # keys: the tests
        severities[name] = check_severity(value, f"severity.{name}", problems)
    model = raw.get("model")
    if model is not None and not (isinstance(model, str) and model):
        problems.append(f"model: {model!r} is not a model file (.skops, .joblib, .pkl, .onnx) or MODULE:OBJECT")
    trusted = raw.get("trusted_types") or []
    if not (isinstance(trusted, list) and all(isinstance(t, str) for t in trusted)):
        problems.append(f"trusted_types: {trusted!r} is not a list of type names")
    for key in ("model_factory", "trusted"):
        if not isinstance(raw.get(key, False), bool):
            problems.append(f"{key}: {raw[key]!r} is not true or false")
    skipped = raw.get("skip_checks") or []
    if not (isinstance(skipped, list) and all(name in OWN_CHECKS for name in skipped)):
        problems.append(f"skip_checks: {skipped!r} is not a list of this project's checks ({', '.join(OWN_CHECKS)}); "
                        "the seed's tests always run")  # fmt: skip
        skipped = []
    location, frame, sha = _inputs(raw, path, feature_count, problems)
    counterfactual = _counterfactual(raw.get("counterfactual"), frame, problems)
    numbers = {key: _number(pert, key, default, problems, "perturbation.") for key, default in
               (("perturbation_magnitude", 0.01), ("max_output_change", 0.1))}
    if numbers["perturbation_magnitude"] == 0:  # no noise: every output equals itself, the test measures nothing
        problems.append("perturbation.perturbation_magnitude: 0 adds no noise, so the stability test would measure "
                        "nothing; give a positive number (default 0.01)")  # fmt: skip
    share = pert.get("max_unstable_share", 0.05)
    if isinstance(share, bool) or not isinstance(share, int | float) or not 0 < share <= 1:  # NaN too
        problems.append(f"perturbation.max_unstable_share: {share!r} is not a share in (0, 1]: the test passes when "
                        "fewer than this share of rows are unstable (the seed's rule: unstable / rows < 0.05), so "
                        "at 0 no model could pass")  # fmt: skip
        share = 0.05
    numbers["max_unstable_share"] = float(share)
    if problems:
        raise ConfigError(f"{path}: " + "; ".join(problems))
    version = raw.get("model_version")
    return {"model_id": model_id, "model_version": None if version is None else str(version), "seed": seed,
            "feature_count": feature_count, "valid_output_range": tuple(bounds),
            "model": storage.resolve(model, path.parent) if model and is_model_file(model) else model,
            "model_factory": bool(raw.get("model_factory", False)), "trusted_types": trusted,
            "trusted": bool(raw.get("trusted", False)), "skip_checks": skipped,
            "inputs": location, "inputs_sha256": sha, "X": frame.to_numpy(dtype=float),
            "counterfactual": counterfactual, "nan_policy": nan_policy, "noise_scale": noise_scale,
            "severities": severities, **numbers}  # fmt: skip


def run_safety(config_path: str | Path, model: Any = None, *, model_version: str | None = None,
               trust_model_file: bool = False) -> dict[str, Any]:  # fmt: skip
    """Run the configured safety tests; the JSON report. ``model`` is a model spec (a file or MODULE:OBJECT), an
    object to test, or None for the config's ``model``; ``model_version`` overrides the config's. A pickle-based
    model file loads only when ``trust_model_file`` or the config's ``trusted: true`` says it may run its code."""
    config = load_safety_config(config_path)
    spec = config["model"] if model is None else model
    if spec is None:
        raise ConfigError(f"{config_path}: model: no model to test: set model in the config or pass --model")
    loaded = load_model(spec, factory=config["model_factory"], trusted_types=config["trusted_types"],
                        trust_file=trust_model_file or config["trusted"],
                        trust_hint="--trust-model-file or trusted: true in the safety config") \
        if isinstance(spec, str) else LoadedModel(spec, type(spec).__qualname__)  # fmt: skip
    evaluator = SafetyEvaluator(config["model_id"], seed=config["seed"], noise_scale=config["noise_scale"],
                                model_version=model_version or config["model_version"] or loaded.file_sha256,
                                max_unstable_share=config["max_unstable_share"], nan_policy=config["nan_policy"],
                                severities=config["severities"])  # fmt: skip
    m, X = loaded.model, config["X"]
    evaluator.test_output_boundaries(m, X, config["valid_output_range"])
    evaluator.test_input_perturbation_stability(m, X, config["perturbation_magnitude"], config["max_output_change"])
    evaluator.test_null_and_edge_inputs(m, config["feature_count"])
    if "malformed_input_rejection" not in config["skip_checks"]:
        evaluator.test_malformed_inputs(m, config["feature_count"])
    if "well_formed_outputs" not in config["skip_checks"]:
        evaluator.test_well_formed_outputs(m, X)
    cf = config["counterfactual"]
    if cf is not None:
        evaluator.test_counterfactual_consistency(m, X, cf["feature"], cf["values"], cf["max_changed_share"],
                                                  cf["decision_threshold"])  # fmt: skip
    path = Path(config_path)
    evaluator.report.facts = {"model": loaded.spec, "model_sha256": loaded.file_sha256, "config_file": str(path),
                              "config_sha256": sha256_file(path), "test_inputs": config["inputs"],
                              "test_inputs_sha256": config["inputs_sha256"], "rows": len(X)}  # fmt: skip
    return evaluator.report.to_dict()
