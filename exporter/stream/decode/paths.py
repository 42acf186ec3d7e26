"""Dotted field paths over parsed JSON events, read by the same rule everywhere (decoder, router)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


def lookup(path: str) -> Callable[[Any], Any]:
    """``event[path]`` for a dotted path over parsed JSON: None wherever a step is missing or not an object."""
    keys = path.split(".")

    def get(event: Any) -> Any:
        for key in keys:
            event = event.get(key) if event.__class__ is dict else None
        return event

    return get
