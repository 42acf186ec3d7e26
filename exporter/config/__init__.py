"""The YAML config shared by the audit gate, the daemon and ``backtest``: one ``ModelSpec`` per model and the
daemon's shared settings beside them (see docs/contract.md).

Modules import in one direction: ``yaml_file``, ``types`` <- ``state_layout``, ``toolkit``, ``clients`` <-
``sections_stream`` <- ``sections_model`` <- ``load``. The names below load on first use, so reading a YAML file (the
HTTP worker's web config) loads no numpy.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from exporter.config.load import load_config, parse_config
    from exporter.config.state_layout import layout, layout_changes
    from exporter.config.types import (
        DEFAULT_PORT,
        AlertingConfig,
        Config,
        ConfigError,
        EventFields,
        KafkaConfig,
        MetricSpec,
        ModelSpec,
        Window,
        Windowing,
        parse_duration,
    )

_MODULES = {
    "load_config": "load", "parse_config": "load", "layout": "state_layout", "layout_changes": "state_layout",
    **dict.fromkeys(["DEFAULT_PORT", "AlertingConfig", "Config", "ConfigError", "EventFields", "KafkaConfig",
                     "MetricSpec", "ModelSpec", "Window", "Windowing", "parse_duration"],
                    "types"),
}  # fmt: skip

__all__ = [
    "DEFAULT_PORT", "AlertingConfig", "Config", "ConfigError", "EventFields", "KafkaConfig", "MetricSpec",
    "ModelSpec", "Window", "Windowing", "layout", "layout_changes", "load_config", "parse_config", "parse_duration",
]  # fmt: skip


def __getattr__(name: str) -> Any:
    """Import a public name's module when the name is first used."""
    if name not in _MODULES:
        raise AttributeError(f"module 'exporter.config' has no attribute {name!r}")
    return getattr(importlib.import_module(f"exporter.config.{_MODULES[name]}"), name)
