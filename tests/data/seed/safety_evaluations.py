# safety_evaluations.py
# Safety test suite for AI models before deployment.

import json
from dataclasses import dataclass, field

@dataclass
class SafetyTestResult:
    test_name: str
    category: str
    passed: bool
    details: str
    severity: str  # "critical", "high", "medium", "low"

@dataclass
class SafetyReport:
    model_id: str
    results: list = field(default_factory=list)

    @property
    def critical_failures(self):
        return [r for r in self.results if not r.passed and r.severity == "critical"]

    @property
    def verdict(self):
        return "FAIL" if self.critical_failures else "PASS"

class SafetyEvaluator:
    def __init__(self, model_id: str):
        self.model_id = model_id
        self.report = SafetyReport(model_id=model_id)

    def test_output_boundaries(self, model, test_inputs: list, valid_output_range: tuple):
        """Verify model outputs stay within expected bounds."""
        violations = 0
        for inp in test_inputs:
            output = model.predict(inp)
            if output < valid_output_range[0] or output > valid_output_range[1]:
                violations += 1

        self.report.results.append(SafetyTestResult(
            test_name="output_boundary_check",
            category="robustness",
            passed=violations == 0,
            details=f"{violations}/{len(test_inputs)} outputs outside range {valid_output_range}",
            severity="critical" if violations > 0 else "low"
        ))

    def test_input_perturbation_stability(self, model, test_inputs: list,
                                           perturbation_magnitude: float = 0.01,
                                           max_output_change: float = 0.1):
        """Test that small input changes do not cause large output changes."""
        import numpy as np
        unstable = 0
        for inp in test_inputs:
            original = model.predict(inp)
            perturbed_inp = inp + np.random.normal(0, perturbation_magnitude, size=inp.shape)
            perturbed = model.predict(perturbed_inp)
            if abs(original - perturbed) > max_output_change:
                unstable += 1

        self.report.results.append(SafetyTestResult(
            test_name="input_perturbation_stability",
            category="adversarial_robustness",
            passed=unstable / len(test_inputs) < 0.05,
            details=f"{unstable}/{len(test_inputs)} inputs showed instability (>{max_output_change} output change)",
            severity="high" if unstable / len(test_inputs) >= 0.05 else "low"
        ))

    def test_null_and_edge_inputs(self, model, feature_count: int):
        """Test model behaviour on null, zero, min, and max inputs."""
        import numpy as np
        edge_cases = {
            "all_zeros": np.zeros(feature_count),
            "all_ones": np.ones(feature_count),
            "large_values": np.full(feature_count, 1e6),
            "negative_values": np.full(feature_count, -1e6),
            "nan_values": np.full(feature_count, np.nan),
        }

        failures = []
        for name, inp in edge_cases.items():
            try:
                output = model.predict(inp.reshape(1, -1))
                if np.isnan(output).any() or np.isinf(output).any():
                    failures.append(f"{name}: produced NaN or Inf")
            except Exception as e:
                failures.append(f"{name}: raised {type(e).__name__}: {e}")

        self.report.results.append(SafetyTestResult(
            test_name="null_and_edge_inputs",
            category="robustness",
            passed=len(failures) == 0,
            details="; ".join(failures) if failures else "All edge cases handled",
            severity="critical" if failures else "low"
        ))
