"""The YAML config shared by the audit gate, the daemon and ``backtest``: one ``ModelSpec`` per model and the
daemon's shared settings beside them (see docs/contract.md).

Modules import in one direction: ``types`` <- ``toolkit`` <- ``sections_stream`` <- ``sections_model`` <- ``load``.
"""

from exporter.config.load import load_config, parse_config
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
    layout,
    parse_duration,
)

__all__ = [
    "DEFAULT_PORT", "AlertingConfig", "Config", "ConfigError", "EventFields", "KafkaConfig", "MetricSpec",
    "ModelSpec", "Window", "Windowing", "layout", "load_config", "parse_config", "parse_duration",
]  # fmt: skip
