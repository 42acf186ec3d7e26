"""The seed's SafetyEvaluator API, used exactly as the seed defines it (safety_evaluations.py beside this file is
the seed's own code, verbatim): the three tests, then the report's verdict and critical failures.

``run`` takes the SafetyEvaluator class so that the tests can run these same lines on the seed's implementation
and on ``from exporter import SafetyEvaluator`` and compare what they report.
"""


def run(SafetyEvaluator, model, test_inputs, feature_count):
    evaluator = SafetyEvaluator("credit-scorer-v4")
    evaluator.test_output_boundaries(model, test_inputs, valid_output_range=(0.0, 1.0))
    evaluator.test_input_perturbation_stability(model, test_inputs, perturbation_magnitude=0.01,
                                                max_output_change=0.1)
    evaluator.test_null_and_edge_inputs(model, feature_count)
    report = evaluator.report
    print(report.verdict, [r.test_name for r in report.critical_failures])
    return report
