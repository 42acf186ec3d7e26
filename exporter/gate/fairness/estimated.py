"""The gate's estimated label-based comparisons: audited data with scores and no labels, a labelled reference.

The reference (``estimation.reference``) is read like the evaluation data, reduced to per-group score-bin counts,
and the core (:mod:`exporter.core.estimate`) fits the per-group calibration and estimates each label-based metric
with its interval; the gate's own result rows and verdict rules then apply unchanged (an estimated comparison whose
reference group is too small is ``insufficient_samples``).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import numpy as np
import pandas as pd

from exporter.config import ModelSpec
from exporter.core import estimate
from exporter.core.encoding import attribute_codes, score_predictions
from exporter.core.evaluate import Evaluation
from exporter.core.metric_table import METRICS, Comparisons
from exporter.gate.fairness.frames import encode
from exporter.gate.fairness.ll144 import json_float

ASSUMPTION = ("within each group, P(label = 1 | score bin) in the audited data is what it was in the reference "
              "(per-group calibration holds: no concept shift, labels not selected by the decision)")  # fmt: skip


def estimated_metrics(config: ModelSpec) -> tuple[str, ...]:
    """The configured metrics that need labels and have an estimate."""
    return tuple(m.name for m in config.metrics if m.name in estimate.ESTIMATED_METRICS)


def wants_estimate(config: ModelSpec, frame: pd.DataFrame) -> bool:
    """Estimate when estimation is configured, a label-based metric is, and the data has no label at all."""
    if config.estimation is None or not estimated_metrics(config):
        return False
    return config.label_column not in frame.columns or bool(frame[config.label_column].isna().all())


def frame_score_counts(config: ModelSpec, frame: pd.DataFrame, scores: np.ndarray, y_pred: np.ndarray,
                       y_true: np.ndarray | None) -> dict[str, np.ndarray]:  # fmt: skip
    """Score counts ``(groups, bins, 2, N_SCORE_COUNTS)`` of every configured attribute (rows outside its groups
    left out), binned by the model's ``score_buckets`` as the daemon bins them."""
    bounds = np.asarray(config.score_buckets, dtype=np.float64)
    bins = estimate.score_bins(scores, bounds)
    base = {a.columns[0]: encode(frame[a.columns[0]].to_numpy(), a.groups) for a in config.base_attributes}
    return {a.name: estimate.score_counts(attribute_codes(a, base), len(a.groups), bins, len(bounds) + 1, y_pred,
                                          y_true) for a in config.attributes}  # fmt: skip


def reference_counts(config: ModelSpec, frame: pd.DataFrame, scores: np.ndarray, labels: np.ndarray,
                     about: dict[str, Any]) -> tuple[dict[str, np.ndarray], dict[str, Any]]:  # fmt: skip
    """The reference's score counts per attribute from its rows (scores and labels already checked by the gate's
    column rules), and what the report says of it: ``about`` (file, SHA-256) plus rows and labelled rows per group."""
    assert config.events.score_threshold is not None
    counts = frame_score_counts(config, frame, scores, score_predictions(scores, config.events.score_threshold),
                                labels)  # fmt: skip
    per_group = {}
    for attribute in config.attributes:
        labelled = counts[attribute.name][..., estimate.LABELLED_POS:].sum(axis=(1, 2))
        per_group[attribute.name] = {g: {"labelled_positives": int(labelled[i, 0]),
                                         "labelled_negatives": int(labelled[i, 1])}
                                     for i, g in enumerate(attribute.groups)}  # fmt: skip
    return counts, {**about, "rows": len(frame), "labelled_rows": int((labels >= 0).sum()),
                    "rows_per_group": per_group, "assumption": ASSUMPTION, "score_buckets": list(config.score_buckets),
                    "prior_strength": estimate.PRIOR_STRENGTH, "replicates": estimate.REPLICATES,
                    "seed": estimate.SEED}  # fmt: skip


ESTIMATED_RATES = ("true_positive_rate", "false_positive_rate", "precision", "accuracy")


def with_estimates(config: ModelSpec, evaluations: list[Evaluation], reference: dict[str, np.ndarray],
                   audited: dict[str, np.ndarray]) -> tuple[list[Evaluation], dict[str, Any]]:  # fmt: skip
    """The evaluations with every configured label-based comparison replaced by its estimate (same pairs), and the
    estimated rates of every group with their intervals, per attribute."""
    names = estimated_metrics(config)
    out, groups = [], {}
    for ev in evaluations:
        c = ev.comparisons
        result = estimate.estimate_attribute(ev.attribute, reference[ev.attribute.name], audited[ev.attribute.name],
                                             names)  # fmt: skip
        out.append(replace(ev, comparisons=Comparisons(c.group_a, c.group_b, {**c.metrics, **result.values})))
        rates = {rate: result.estimate.rate(rate) for rate in ESTIMATED_RATES}
        groups[ev.attribute.name] = {g: {rate: {"value": json_float(v[i]), "ci_95": [json_float(lo[i]),
                                                                                     json_float(hi[i])]}
                                         for rate, (v, lo, hi) in rates.items()}
                                     for i, g in enumerate(ev.attribute.groups)}  # fmt: skip
    return out, groups


def mark(results: list[dict[str, Any]], config: ModelSpec) -> None:
    """Flag each result as estimated (a label-based metric) or observed."""
    names = set(estimated_metrics(config))
    for r in results:
        r["estimated"] = r["metric"] in names and METRICS[r["metric"]].needs_labels
