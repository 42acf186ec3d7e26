"""The seed's three metric functions, verbatim (fairness_metrics.py of the product's seed document): the oracle of
exporter's seed API (exporter/gate/fairness/seed_api.py), which must give what they give on the inputs they define;
and the seed's BiasAuditor (its developer docs), the oracle of exporter.BiasAuditor's group_stats, fairness_gap and
is_biased."""

# ruff: noqa
# mypy: ignore-errors
# fmt: off
# Computes standard fairness metrics for binary classification models.
# Designed to run in CI/CD and as a post-deployment monitoring job.

import numpy as np
from dataclasses import dataclass

@dataclass
class FairnessResult:
    metric_name: str
    dimension: str
    group_a: str
    group_b: str
    value: float
    threshold: float
    passed: bool

def demographic_parity_difference(
    y_pred: np.ndarray,
    protected_attribute: np.ndarray,
    group_a_value: str,
    group_b_value: str,
    threshold: float = 0.05
) -> FairnessResult:
    """
    Demographic parity: P(Y_hat=1|A=a) - P(Y_hat=1|A=b)
    A fair model has this value close to 0.
    """
    mask_a = protected_attribute == group_a_value
    mask_b = protected_attribute == group_b_value

    rate_a = y_pred[mask_a].mean()
    rate_b = y_pred[mask_b].mean()
    diff = abs(rate_a - rate_b)

    return FairnessResult(
        metric_name="demographic_parity_difference",
        dimension=f"{group_a_value}_vs_{group_b_value}",
        group_a=group_a_value,
        group_b=group_b_value,
        value=round(diff, 4),
        threshold=threshold,
        passed=diff <= threshold
    )

def equalised_odds_difference(
    y_true: np.ndarray,
    y_pred: np.ndarray,
    protected_attribute: np.ndarray,
    group_a_value: str,
    group_b_value: str,
    threshold: float = 0.05
) -> FairnessResult:
    """
    Equalised odds: max difference in TPR and FPR across groups.
    """
    mask_a = protected_attribute == group_a_value
    mask_b = protected_attribute == group_b_value

    # True positive rates
    tpr_a = y_pred[(mask_a) & (y_true == 1)].mean()
    tpr_b = y_pred[(mask_b) & (y_true == 1)].mean()

    # False positive rates
    fpr_a = y_pred[(mask_a) & (y_true == 0)].mean()
    fpr_b = y_pred[(mask_b) & (y_true == 0)].mean()

    diff = max(abs(tpr_a - tpr_b), abs(fpr_a - fpr_b))

    return FairnessResult(
        metric_name="equalised_odds_difference",
        dimension=f"{group_a_value}_vs_{group_b_value}",
        group_a=group_a_value,
        group_b=group_b_value,
        value=round(diff, 4),
        threshold=threshold,
        passed=diff <= threshold
    )

def disparate_impact_ratio(
    y_pred: np.ndarray,
    protected_attribute: np.ndarray,
    group_a_value: str,
    group_b_value: str,
    threshold: float = 0.80
) -> FairnessResult:
    """
    Disparate impact ratio: P(Y_hat=1|A=b) / P(Y_hat=1|A=a)
    The four-fifths rule: ratio should be >= 0.80.
    """
    mask_a = protected_attribute == group_a_value
    mask_b = protected_attribute == group_b_value

    rate_a = y_pred[mask_a].mean()
    rate_b = y_pred[mask_b].mean()

    ratio = min(rate_a, rate_b) / max(rate_a, rate_b) if max(rate_a, rate_b) > 0 else 0

    return FairnessResult(
        metric_name="disparate_impact_ratio",
        dimension=f"{group_a_value}_vs_{group_b_value}",
        group_a=group_a_value,
        group_b=group_b_value,
        value=round(ratio, 4),
        threshold=threshold,
        passed=ratio >= threshold
    )


# --- BiasAuditor, verbatim from the seed's developer docs ("Class Constructor", "Core Method: evaluate_bias()").
# The docs show the constructor's docstring and not its body; the two assignments are the one addition, the
# attributes evaluate_bias reads.
import pandas as pd
from typing import List

class BiasAuditor:
    def __init__(self, protected_features: List[str], outcome_feature: str):
        """
        :param protected_features: List of protected features (e.g., gender, race).
        :param outcome_feature: Target feature measuring fairness (e.g., accuracy).
        """
        self.protected_features = protected_features  # the one addition (see above)
        self.outcome_feature = outcome_feature  # the one addition (see above)

    def evaluate_bias(self, data: pd.DataFrame) -> dict:
        """
        Evaluate bias within the dataset.

        :param data: Pandas DataFrame containing the dataset.
        :return: Bias analysis report as a dictionary.
        """
        report = {}
        for feature in self.protected_features:
            group_stats = data.groupby(feature)[self.outcome_feature].mean()
            fairness_gap = group_stats.max() - group_stats.min()

            report[feature] = {
                "group_stats": group_stats.to_dict(),
                "fairness_gap": fairness_gap,
                "is_biased": fairness_gap > 0.1  # Define 0.1 as the bias threshold
            }
        return report
