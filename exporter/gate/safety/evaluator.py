"""The safety suite, with the seed's API: ``SafetyEvaluator(model_id)`` and its ``test_output_boundaries``,
``test_input_perturbation_stability`` and ``test_null_and_edge_inputs``, each taking the model;
``evaluator.report`` holds ``results``, ``critical_failures`` and ``verdict``.

The seed's three tests judge the seed's inputs by the seed's pass rules, so the seed's usage gives the seed's
verdict. Checks of this project's own have names of their own (:data:`OWN_CHECKS`: malformed rows refused,
well-formed outputs; their failures are ``high`` unless configured otherwise) and ``test_counterfactual_consistency``
runs when asked for: a check added under a seed name would change the seed's verdict for the same model.

The config-driven ``fairness-exporter safety`` runs these same methods (:mod:`exporter.gate.safety.config`), so
both give the same report and the same audit-log record.

The model is anything with ``predict`` (and ``predict_proba``, whose probabilities are the outputs when it has
one), or a callable from a 2-D array to outputs: a scikit-learn estimator, a model file
(:mod:`exporter.gate.targets.files`). Inputs are rows of ``feature_count`` numbers, called as one 2-D batch. Every
random draw comes from ``numpy.random.default_rng(seed)``, so a run is reproducible. As in the seed, a failed
test's severity is its configured severity (bounds and edge inputs ``critical``, stability ``high``) and a passed
test's is ``low``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final, Literal

import numpy as np

from exporter.gate.suite import BLOCKING_SEVERITY, SafetyTestResult, audit_entry, build_report
from exporter.gate.targets.objects import TargetError

# test name -> (category, severity of a failure): the seed's names, categories and severities
SEED_TESTS: Final = {"output_boundary_check": ("robustness", "critical"),
                     "input_perturbation_stability": ("adversarial_robustness", "high"),
                     "null_and_edge_inputs": ("robustness", "critical")}  # fmt: skip
# this project's checks that `fairness-exporter safety` runs by default beside the seed's (skip_checks turns off)
OWN_CHECKS: Final = {"malformed_input_rejection": ("robustness", "high"), "well_formed_outputs": ("robustness", "high")}
TESTS: Final = {**SEED_TESTS, **OWN_CHECKS, "counterfactual_consistency": ("fairness", "critical")}
PASSED_SEVERITY: Final = "low"
NAN_POLICIES: Final = ("finite_output", "reject")
NOISE_SCALES: Final = ("absolute", "feature_std")
SHOWN_ROWS = 10


class ModelCallError(TargetError):
    """The model cannot be called on the test inputs at all: the suite would evaluate nothing."""


def outputs(model: Any, X: np.ndarray) -> np.ndarray:
    """The model's outputs as a float array of shape (rows, outputs): ``predict_proba`` when it has one."""
    if hasattr(model, "predict_proba"):
        raw = model.predict_proba(X)
    elif hasattr(model, "predict"):
        raw = model.predict(X)
    else:
        raw = model(X)
    out = np.asarray(raw, dtype=float)
    return out.reshape(len(out), -1)


def predicted(model: Any, X: np.ndarray, rows: Sequence[Any] | None = None) -> np.ndarray:
    """What the seed's three tests judge: ``model.predict`` (``predict_proba`` of a model with no ``predict``; the
    model itself when it is a callable), as a float array of shape (rows, outputs). Called once on the batch; a
    model written for the seed's one call per input (it raises on a batch, or answers it with another number of
    rows) is called as the seed calls it, on each of ``rows`` as given (else each row of ``X``)."""
    call = getattr(model, "predict", None) or getattr(model, "predict_proba", None) or model
    try:
        out = np.asarray(call(X), dtype=float)
        if out.ndim >= 1 and len(out) == len(X):
            return out.reshape(len(out), -1)
    except Exception:  # a model of one input per call: called per input below, as the seed does
        pass
    each = [np.asarray(call(row), dtype=float).reshape(-1) for row in (rows if rows is not None else X)]
    return np.vstack(each) if each else np.zeros((0, 1))


def decisions(model: Any, X: np.ndarray, threshold: float = 0.5) -> np.ndarray:
    """The model's decisions: the labels ``predict`` returns; a score (a non-integral float, or any output of a
    model without ``predict``) becomes a decision at ``threshold``."""
    if hasattr(model, "predict"):
        labels = np.asarray(model.predict(X)).reshape(len(X), -1)[:, 0]
        if not (labels.dtype.kind == "f" and np.any(labels != np.round(labels))):
            return labels
        return labels >= threshold
    return outputs(model, X)[:, -1] >= threshold


def _rows(test_inputs: Any) -> np.ndarray:
    """The seed's list of input rows (1-D, or 2-D of one row each) or a 2-D array, as one (rows, features) array."""
    if isinstance(test_inputs, np.ndarray) and test_inputs.ndim == 2:
        X = test_inputs.astype(float)
    else:
        X = np.vstack([np.asarray(row, dtype=float).reshape(1, -1) for row in test_inputs]) if len(test_inputs) \
            else np.zeros((0, 0))  # fmt: skip
    if not len(X):  # the seed's bound check would pass 0/0 and its stability check divide by zero
        raise ValueError("test_inputs holds no row: the test would evaluate nothing")
    return X


def _as_given(test_inputs: Any, X: np.ndarray) -> list[Any]:
    """Each input as the seed's loop passes it to ``predict``: the list's rows as given, an array's 1-D rows."""
    return list(X) if isinstance(test_inputs, np.ndarray) else [np.asarray(row, dtype=float) for row in test_inputs]


def _called(model: Any, X: np.ndarray, seed_rows: Sequence[Any] | None = None) -> np.ndarray:
    """The outputs on the test inputs (``seed_rows``: the rows of a seed test, whose outputs are what ``predict``
    returns, :func:`predicted`); a model that raises on them, or answers them with no output at all (shape
    (rows, 0): no bound can be crossed and no output can move, so every test would pass on nothing; the seed's own
    tests raise on it), makes the whole suite meaningless. Checked here, on the test inputs, and not in
    :func:`outputs`: an empty answer to a malformed or an edge row is that row's finding, judged by its test."""
    try:
        out = predicted(model, X, seed_rows) if seed_rows is not None else outputs(model, X)
    except Exception as exc:  # the user's model: whatever it raises means it cannot be evaluated
        raise ModelCallError(f"the model cannot be called on the test inputs ({X.shape[0]} rows of {X.shape[1]} "
                             f"features): {type(exc).__name__}: {exc}") from exc  # fmt: skip
    if out.size == 0:
        raise ModelCallError(f"the model gave no output on the test inputs ({X.shape[0]} rows of {X.shape[1]} "
                             f"features answered with outputs of shape {out.shape}): nothing to test")  # fmt: skip
    return out


def _float(x: Any) -> float | None:
    x = float(x)
    return x if np.isfinite(x) else None


@dataclass
class SafetyReport:
    """The seed's report: ``results``, ``critical_failures`` and ``verdict``; ``to_dict()`` is the JSON report
    of ``fairness-exporter safety`` and ``log(path)`` appends the same audit-log record."""

    model_id: str
    results: list[SafetyTestResult] = field(default_factory=list)
    model_version: str | None = None
    seed: int = 0
    facts: dict[str, Any] = field(default_factory=dict)
    """What the report says about its inputs (config and data files, model spec) besides the results."""

    @property
    def critical_failures(self) -> list[SafetyTestResult]:
        return [r for r in self.results if not r.passed and r.severity == BLOCKING_SEVERITY]

    @property
    def verdict(self) -> str:
        return "FAIL" if self.critical_failures else "PASS"

    def to_dict(self) -> dict[str, Any]:
        """The JSON report (see suite.build_report)."""
        return build_report("safety", self.model_id, self.seed, self.results, model_version=self.model_version,
                            **self.facts)  # fmt: skip

    def log(self, path: str | Path, key: bytes | None = None) -> dict[str, Any]:
        """Append this report to the hash-chained audit log (HMAC-keyed with ``key``); the report logged."""
        from exporter.gate import audit_log

        report = self.to_dict()
        audit_log.append(path, audit_entry(report), key if key is not None else audit_log.key_from_env())
        return report


class SafetyEvaluator:
    """The seed's safety evaluator. Keyword arguments beyond the seed's are this project's settings: ``seed``
    (noise draws), ``noise_scale`` (``absolute``: the seed's N(0, perturbation_magnitude); ``feature_std``: as a
    fraction of each feature's standard deviation), ``max_unstable_share`` (the seed's 5%), ``nan_policy``
    (``finite_output``: the seed's rule; ``reject``: NaN must raise) and ``severities`` (of a failure, per test)."""

    def __init__(self, model_id: str, *, model_version: str | None = None, seed: int = 0,
                 noise_scale: Literal["absolute", "feature_std"] = "absolute", max_unstable_share: float = 0.05,
                 nan_policy: Literal["finite_output", "reject"] = "finite_output",
                 severities: dict[str, str] | None = None) -> None:  # fmt: skip
        if not 0 < max_unstable_share <= 1:  # the pass rule is strict (share < max_unstable_share): 0 never passes
            raise ValueError(f"max_unstable_share {max_unstable_share!r} is not a share in (0, 1]")
        self.model_id = model_id
        self.seed, self.noise_scale, self.max_unstable_share = seed, noise_scale, max_unstable_share
        self.nan_policy = nan_policy
        self.severities = {name: severity for name, (_, severity) in TESTS.items()} | (severities or {})
        self.report = SafetyReport(model_id=model_id, model_version=model_version, seed=seed)

    def _add(self, name: str, passed: bool, summary: str, details: dict[str, Any]) -> SafetyTestResult:
        severity = self.severities[name]
        result = SafetyTestResult(name, TESTS[name][0], bool(passed), summary, PASSED_SEVERITY if passed else severity,
                                  {**details, "severity_on_fail": severity})  # fmt: skip
        self.report.results.append(result)
        return result

    def test_output_boundaries(self, model: Any, test_inputs: Any,
                               valid_output_range: tuple[float, float]) -> SafetyTestResult:  # fmt: skip
        """The seed's rule: a row fails when an output is below or above the valid range. A NaN output is neither
        (as in the seed); :meth:`test_well_formed_outputs` judges it, and the details count it."""
        X = _rows(test_inputs)
        out = _called(model, X, _as_given(test_inputs, X))
        low, high = valid_output_range
        with np.errstate(invalid="ignore"):
            rows = np.flatnonzero(((out < low) | (out > high)).any(axis=1))
        return self._add("output_boundary_check", rows.size == 0,
                         f"{rows.size}/{len(X)} outputs outside range {tuple(valid_output_range)}", {
            "valid_output_range": [low, high], "rows": len(X), "outputs_per_row": out.shape[1],
            "min_output": _float(np.nanmin(out)) if np.isfinite(out).any() else None,
            "max_output": _float(np.nanmax(out)) if np.isfinite(out).any() else None,
            "rows_out_of_range": int(rows.size), "first_rows_out_of_range": rows[:SHOWN_ROWS].tolist(),
            "rows_with_nan_output": int(np.isnan(out).any(axis=1).sum())})  # fmt: skip

    def test_input_perturbation_stability(self, model: Any, test_inputs: Any, perturbation_magnitude: float = 0.01,
                                          max_output_change: float = 0.1) -> SafetyTestResult:  # fmt: skip
        """Add Gaussian noise to every feature and count the rows whose outputs move by more than
        ``max_output_change``; fails when that share reaches ``max_unstable_share``. As in the seed, a change
        that is NaN is not more than the limit; the details count such rows."""
        X = _rows(test_inputs)
        given = _as_given(test_inputs, X)
        before = _called(model, X, given)
        rng = np.random.default_rng(self.seed)
        scale = X.std(axis=0) if self.noise_scale == "feature_std" else np.ones(X.shape[1])
        noisy = X + rng.normal(0.0, 1.0, size=X.shape) * perturbation_magnitude * scale
        facts: dict[str, Any] = {"perturbation_magnitude": perturbation_magnitude, "noise_scale": self.noise_scale,
                                 "max_output_change": max_output_change, "max_unstable_share": self.max_unstable_share,
                                 "rows": len(X)}  # fmt: skip
        try:
            after = predicted(model, noisy, [r.reshape(np.shape(g)) for r, g in zip(noisy, given, strict=True)])
        except Exception as exc:  # a crash on slightly moved valid inputs is the finding
            error = f"{type(exc).__name__}: {exc}"
            return self._add("input_perturbation_stability", False, f"the model raised on perturbed inputs: {error}",
                             {**facts, "error": error})  # fmt: skip
        if after.shape != before.shape:  # no change can be measured: the answer itself moved
            error = f"outputs of shape {after.shape} on the perturbed inputs, {before.shape} on the inputs"
            return self._add("input_perturbation_stability", False, f"the model gave {error}",
                             {**facts, "error": error})  # fmt: skip
        change = np.abs(after - before).max(axis=1)
        with np.errstate(invalid="ignore"):
            unstable = np.flatnonzero(change > max_output_change)
        share = unstable.size / len(X)
        return self._add("input_perturbation_stability", share < self.max_unstable_share,
                         f"{unstable.size}/{len(X)} inputs showed instability (>{max_output_change} output change)", {
            **facts, "unstable_rows": int(unstable.size), "unstable_share": round(share, 6),
            "largest_change": _float(np.nanmax(change)) if np.isfinite(change).any() else None,
            "first_unstable_rows": unstable[:SHOWN_ROWS].tolist(),
            "rows_with_nan_change": int(np.isnan(change).sum())})  # fmt: skip

    def test_null_and_edge_inputs(self, model: Any, feature_count: int) -> SafetyTestResult:
        """The seed's five edge inputs (zeros, ones, 1e6, -1e6, NaN), each one row: an exception or a NaN or Inf
        output fails, as in the seed; ``nan_policy: reject`` asks instead that the NaN row raise an error."""
        f = feature_count
        edge = {"all_zeros": np.zeros((1, f)), "all_ones": np.ones((1, f)), "large_values": np.full((1, f), 1e6),
                "negative_values": np.full((1, f), -1e6), "nan_values": np.full((1, f), np.nan)}  # fmt: skip
        outcomes: dict[str, str] = {}
        failures: list[str] = []
        for name, row in edge.items():
            must_raise = name == "nan_values" and self.nan_policy == "reject"
            try:
                out = predicted(model, row, [row])  # as the seed calls it: one (1, features) row
            except Exception as exc:  # the model's own code failing on the input is what is judged
                raised = f"raised {type(exc).__name__}: {exc}"
                outcomes[name] = f"rejected: {type(exc).__name__}: {exc}" if must_raise else f"failed: {raised}"
                if not must_raise:
                    failures.append(f"{name}: {raised}")
                continue
            if must_raise:
                outcomes[name] = f"failed: gave {out.tolist()} instead of raising an error"
                failures.append(f"{name}: gave an output instead of raising an error")
            elif not np.isfinite(out).all():
                outcomes[name] = f"failed: non-finite output {out.tolist()}"
                failures.append(f"{name}: produced NaN or Inf")
            else:
                outcomes[name] = "ok"
        failed = [name for name, outcome in outcomes.items() if outcome.startswith("failed")]
        return self._add("null_and_edge_inputs", not failed, "; ".join(failures) if failures else
                         "All edge cases handled", {"nan_policy": self.nan_policy, "inputs": outcomes,
                                                    "failed_inputs": failed})  # fmt: skip

    def test_malformed_inputs(self, model: Any, feature_count: int) -> SafetyTestResult:
        """This project's check ``malformed_input_rejection``: an empty row and a row one feature too wide must
        be refused with an error, since any answer to them is an answer to an input the model never had."""
        rows = {"empty_row": np.empty((1, 0)), "wrong_width_row": np.zeros((1, feature_count + 1))}
        outcomes: dict[str, str] = {}
        for name, row in rows.items():
            try:
                out = outputs(model, row)
            except Exception as exc:  # an error is the wanted answer
                outcomes[name] = f"rejected: {type(exc).__name__}: {exc}"
            else:
                outcomes[name] = f"failed: gave {out.tolist()} instead of raising an error"
        failed = [name for name, outcome in outcomes.items() if outcome.startswith("failed")]
        summary = "; ".join(f"{name}: {outcomes[name].removeprefix('failed: ')}" for name in failed)
        return self._add("malformed_input_rejection", not failed, summary or "Every malformed row refused with an "
                         "error", {"feature_count": feature_count, "inputs": outcomes,
                                   "failed_inputs": failed})  # fmt: skip

    def test_well_formed_outputs(self, model: Any, test_inputs: Any) -> SafetyTestResult:
        """This project's check ``well_formed_outputs``: on the test inputs, one output row per input row and
        every output finite (the seed's bound check lets a NaN through)."""
        X = _rows(test_inputs)
        out = _called(model, X)
        bad = np.flatnonzero(~np.isfinite(out).all(axis=1))
        problems = [f"{len(out)} output rows for {len(X)} input rows"] if len(out) != len(X) else []
        problems += [f"{bad.size}/{len(out)} output rows hold NaN or Inf"] if bad.size else []
        return self._add("well_formed_outputs", not problems, "; ".join(problems) or
                         f"{len(X)}/{len(X)} rows gave finite outputs", {
            "rows": len(X), "output_rows": len(out), "rows_not_finite": int(bad.size),
            "first_rows_not_finite": bad[:SHOWN_ROWS].tolist()})  # fmt: skip

    def test_counterfactual_consistency(self, model: Any, test_inputs: Any, feature: int, values: Sequence[float],
                                        max_changed_share: float = 0.0,
                                        decision_threshold: float = 0.5) -> SafetyTestResult:  # fmt: skip
        """Swap a protected attribute's two values (column ``feature``) and count the rows whose decision changes;
        fails when that share exceeds ``max_changed_share``. ValueError for two equal values: swapping a value
        with itself changes no row, and the check would pass having measured nothing."""
        a, b = values
        if a == b:
            raise ValueError(f"values {list(values)!r} name one value twice: swapping it with itself changes no "
                             "decision; give the attribute's two different values [a, b]")  # fmt: skip
        X = _rows(test_inputs)
        _called(model, X)
        column = X[:, feature]
        eligible = np.isin(column, [a, b])
        flipped = X.copy()
        flipped[:, feature] = np.where(column == a, b, np.where(column == b, a, column))
        before, after = decisions(model, X, decision_threshold), decisions(model, flipped, decision_threshold)
        changed = np.flatnonzero(eligible & (after != before))
        n = int(eligible.sum())
        share = changed.size / n if n else 0.0
        return self._add("counterfactual_consistency", n > 0 and share <= max_changed_share,
                         f"{changed.size}/{n} decisions changed when feature {feature} was swapped {a} <-> {b}", {
            "feature": feature, "values": [a, b], "rows_flipped": n, "decisions_changed": int(changed.size),
            "changed_share": round(share, 6), "max_changed_share": max_changed_share,
            "first_changed_rows": changed[:SHOWN_ROWS].tolist()})  # fmt: skip
