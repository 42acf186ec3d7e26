"""A small daemon config shared by the daemon's unit and integration tests."""

from __future__ import annotations

from typing import Any

from exporter.config import Config, parse_config
from exporter.stream.decode.events import EventDecoder
from exporter.stream.state.window import WindowStore


def make_config(**overrides: Any) -> Config:
    raw = {
        "model_id": "m1",
        "protected_attributes": [
            {"name": "gender", "groups": ["male", "female"]},
            {"name": "age", "groups": ["young", "old"]},
        ],
        "min_samples": 5,
        "metrics": [{"name": "demographic_parity_difference", "threshold": 0.05},
                    {"name": "disparate_impact_ratio", "threshold": 0.8}],
        "windows": ["1h", "24h"],
        "bucket": "1m",
        "allowed_lateness": "5m",
        "evaluation_interval": "1s",
        "listen": {"address": "127.0.0.1", "port": 0},
        **overrides,
    }
    return parse_config({k: v for k, v in raw.items() if v is not None}, "test-config")  # None: the key left out


def event(gender: str = "male", age: str = "young", prediction: int = 1, ts: float | str = 1_800_000_000.0,
          label: int | None = None, model_id: str = "m1", **extra: Any) -> dict[str, Any]:  # fmt: skip
    return {"model_id": model_id, "prediction_id": extra.pop("prediction_id", "p"), "timestamp": ts,
            "prediction": prediction, "label": label, "attributes": {"gender": gender, "age": age},
            **extra}  # fmt: skip


def decoder_of(config: Config, keep_rejected: bool = False) -> EventDecoder:
    """The decoder of the config's one model, as the daemon's Fleet builds it."""
    return EventDecoder(config.model(), config.max_future_skew_seconds, keep_rejected)


def store_of(config: Config) -> WindowStore:
    """The window store of the config's one model, as the daemon's Fleet builds it."""
    return WindowStore(config.model(), config.windowing)
