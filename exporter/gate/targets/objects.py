"""A Python object named ``MODULE:OBJECT``, imported from the working directory: how users name their own model code."""

from __future__ import annotations

import importlib
import os
import sys
from typing import Any


class TargetError(Exception):
    """The model cannot be loaded or reached; the message names the spec and the reason."""


def load_object(spec: str) -> Any:
    """Import ``MODULE:OBJECT`` (OBJECT may be dotted) from the working directory and ``PYTHONPATH``."""
    module_name, sep, attr_path = spec.partition(":")
    if not sep or not module_name or not attr_path:
        raise TargetError(f"{spec!r} is not MODULE:OBJECT (for example my_models:moderator)")
    cwd = os.getcwd()
    if cwd not in sys.path:
        sys.path.insert(0, cwd)
    try:
        obj: Any = importlib.import_module(module_name)
    except Exception as exc:  # an import runs the user's code: any failure means "cannot be loaded"
        raise TargetError(f"{spec}: cannot import {module_name!r}: {type(exc).__name__}: {exc}") from exc
    for part in attr_path.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError as exc:
            raise TargetError(f"{spec}: {module_name!r} has no attribute {attr_path!r}") from exc
    return obj
