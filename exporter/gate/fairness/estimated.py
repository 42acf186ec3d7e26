"""The gate's estimated label-based comparisons: audited data with scores and no labels, a labelled reference.

The reference (``estimation.reference``) is read like the evaluation data, a dataset
(:func:`exporter.gate.fairness.audit.read_reference`), and the audited data is counted by the same scan
(:func:`exporter.gate.fairness.frames.scan`): both become per-group score-bin counts a batch at a time. The core
(:mod:`exporter.core.estimate`) fits the per-group calibration and estimates each label-based metric with its
interval; the gate's own result rows and verdict rules then apply unchanged (an estimated comparison whose
reference group is too small is ``insufficient_samples``).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import numpy as np

from exporter.config import ModelSpec
from exporter.core import estimate
from exporter.core.evaluate import Evaluation
from exporter.core.metric_table import Comparisons
from exporter.gate.fairness.frames import Scan
from exporter.gate.fairness.ll144 import json_float

ASSUMPTION = ("within each group, P(label = 1 | score bin) in the audited data is what it was in the reference "
              "(per-group calibration holds: no concept shift, labels not selected by the decision)")  # fmt: skip


def estimated_metrics(config: ModelSpec) -> tuple[str, ...]:
    """The configured metrics that need labels and have an estimate."""
    return tuple(m.name for m in config.metrics if m.name in estimate.ESTIMATED_METRICS)


def estimable(config: ModelSpec) -> bool:
    """Whether the model can be estimated: estimation is configured and so is a label-based metric. The gate then
    estimates when the audited data, all of it, has no label (a label column absent, or empty in every row)."""
    return config.estimation is not None and bool(estimated_metrics(config))


def describe_reference(config: ModelSpec, counted: Scan, about: dict[str, Any]) -> dict[str, Any]:
    """What the report says of the reference: ``about`` (file, manifest), its rows and labelled rows, the labelled
    positives and negatives of each group (what decides ``insufficient_samples``), the assumption, the settings."""
    per_group = {}
    for attribute in config.attributes:
        labelled = counted.tally.scores[attribute.name][..., estimate.LABELLED_POS:].sum(axis=(1, 2))
        per_group[attribute.name] = {g: {"labelled_positives": int(labelled[i, 0]),
                                         "labelled_negatives": int(labelled[i, 1])}
                                     for i, g in enumerate(attribute.groups)}  # fmt: skip
    return {**about, "rows": counted.rows, "labelled_rows": counted.labelled, "rows_per_group": per_group,
            "assumption": ASSUMPTION, "score_buckets": list(config.score_buckets),
            "prior_strength": estimate.PRIOR_STRENGTH, "replicates": estimate.REPLICATES, "seed": estimate.SEED}


ESTIMATED_RATES = ("true_positive_rate", "false_positive_rate", "precision", "accuracy")


def with_estimates(config: ModelSpec, evaluations: list[Evaluation], reference: dict[str, np.ndarray],
                   audited: dict[str, np.ndarray]) -> tuple[list[Evaluation], dict[str, Any]]:  # fmt: skip
    """The evaluations with every configured label-based comparison replaced by its estimate (same pairs), and the
    estimated rates of every group with their intervals, per attribute: null for a group with fewer than min_samples
    of the rate's labelled rows in the reference (its calibration is the other groups'), as its comparisons are."""
    names = estimated_metrics(config)
    out, groups = [], {}
    for ev in evaluations:
        c = ev.comparisons
        result = estimate.estimate_attribute(ev.attribute, reference[ev.attribute.name], audited[ev.attribute.name],
                                             names)  # fmt: skip
        observed = ev.simultaneous  # an estimate's comparisons are judged one by one (no worst, no multiplicity)
        assert observed is not None
        out.append(replace(ev, comparisons=Comparisons(c.group_a, c.group_b, {**c.metrics, **result.values}),
                           simultaneous=Comparisons(c.group_a, c.group_b, {k: v for k, v in observed.metrics.items()
                                                                           if k not in result.values})))  # fmt: skip
        rates = {rate: result.estimate.rate(rate, config.min_samples) for rate in ESTIMATED_RATES}
        groups[ev.attribute.name] = {g: {rate: {"value": json_float(v[i]), "ci_95": [json_float(lo[i]),
                                                                                     json_float(hi[i])]}
                                         for rate, (v, lo, hi) in rates.items()}
                                     for i, g in enumerate(ev.attribute.groups)}  # fmt: skip
    return out, groups
