"""fairness-exporter: continuous fairness monitoring for deployed models, and a CI bias-audit gate.

The public Python API is loaded on first use, so the daemon's import path never loads pandas.
"""

from __future__ import annotations

import importlib
from importlib.metadata import PackageNotFoundError, version
from typing import Any

try:
    __version__ = version("fairness-exporter")
except PackageNotFoundError:  # running from a source tree that is not installed
    __version__ = "0.0.0+source"

from exporter.core.metric_table import METRIC_NAMES

_PUBLIC = {
    "BiasAuditor": "exporter.gate.bias",
    "FairnessResult": "exporter.gate.seed_api",
    **dict.fromkeys(METRIC_NAMES, "exporter.gate.seed_api"),  # one function per metric of the table
    "run_audit": "exporter.gate.audit",
}

__all__ = ["__version__", *_PUBLIC]


def __getattr__(name: str) -> Any:
    """Import a public name's module when the name is first used."""
    if name not in _PUBLIC:
        raise AttributeError(f"module 'exporter' has no attribute {name!r}")
    return getattr(importlib.import_module(_PUBLIC[name]), name)
