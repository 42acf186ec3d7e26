"""fairness-exporter: continuous fairness monitoring for deployed models, and a CI bias-audit gate.

The public Python API is loaded on first use, so the daemon's import path never loads pandas.
"""

from __future__ import annotations

import functools
import importlib
from importlib.metadata import PackageNotFoundError, version
from typing import Any

try:
    __version__ = version("fairness-exporter")
except PackageNotFoundError:  # running from a source tree that is not installed
    __version__ = "0.0.0+source"

_MODULES = {
    "BiasAuditor": "exporter.gate.fairness.bias",
    "FairnessResult": "exporter.gate.fairness.seed_api",
    "run_audit": "exporter.gate.fairness.audit",
    "SafetyEvaluator": "exporter.gate.safety.evaluator",
    "SafetyReport": "exporter.gate.safety.evaluator",
    "SafetyTestResult": "exporter.gate.suite",
}


@functools.cache
def _public() -> dict[str, str]:
    """Each public name and its module: one function per metric of the table, in the seed-style API. Built on
    first use: ``import exporter`` loads no numpy, so the HTTP worker process (exporter.serve.worker) stays small."""
    from exporter.core.metric_table import COUNT_METRICS

    return {**_MODULES, **dict.fromkeys(COUNT_METRICS, "exporter.gate.fairness.seed_api")}


def __getattr__(name: str) -> Any:
    """Import a public name's module when the name is first used (``__all__`` too)."""
    if name == "__all__":
        return ["__version__", *_public()]
    public = _public()
    if name not in public:
        raise AttributeError(f"module 'exporter' has no attribute {name!r}")
    return getattr(importlib.import_module(public[name]), name)
