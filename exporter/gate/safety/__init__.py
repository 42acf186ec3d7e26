"""The safety suite: the seed's SafetyEvaluator API and the ``fairness-exporter safety`` config that drives it."""
