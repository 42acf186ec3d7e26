"""fairness-exporter: continuous fairness monitoring for deployed models, and a CI bias-audit gate."""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("fairness-exporter")
except PackageNotFoundError:  # running from a source tree that is not installed
    __version__ = "0.0.0+source"

from exporter.audit import run_audit
from exporter.metrics import (
    FairnessResult,
    demographic_parity_difference,
    disparate_impact_ratio,
    equalised_odds_difference,
)

__all__ = [
    "FairnessResult",
    "__version__",
    "demographic_parity_difference",
    "disparate_impact_ratio",
    "equalised_odds_difference",
    "run_audit",
]
