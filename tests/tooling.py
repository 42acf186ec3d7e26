"""Find the external tools a test needs; skip on a laptop without them, fail under CI=true."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

IN_CI = os.environ.get("CI", "").lower() in {"1", "true", "yes"}
VENV_BIN = Path(__file__).resolve().parent.parent / ".venv" / "bin"


def missing(reason: str) -> None:
    """Skip the test on a developer's machine, fail it in CI where every tool must be present."""
    if IN_CI:
        pytest.fail(f"CI=true but {reason}; `make test` installs it", pytrace=False)
    pytest.skip(f"{reason}; run `make test` to install it")


def require_binary(name: str) -> str:
    """Return the path of an executable from PATH or the project's .venv/bin, or skip/fail."""
    found = shutil.which(name) or shutil.which(name, path=str(VENV_BIN))
    if found is None:
        missing(f"`{name}` is not installed")
    return found
