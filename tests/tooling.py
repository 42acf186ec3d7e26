"""Find the external tools a test needs; skip on a laptop without them, fail under CI=true."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
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


@contextmanager
def tmpfs(directory: Path, size: str) -> Iterator[Path]:
    """A tmpfs of ``size`` (mount's ``size=``) mounted at ``directory``/volume, unmounted afterwards: a real file
    system to fill up or remount read-only. Needs root (skipped with the reason on a laptop, failed under CI)."""
    mountpoint = directory / "volume"
    mountpoint.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(mountpoint)],
                             capture_output=True, text=True)  # fmt: skip
    if mounted.returncode != 0:
        missing(f"mounting a tmpfs needs root: {mounted.stderr.strip()}")
    try:
        yield mountpoint
    finally:
        subprocess.run(["umount", str(mountpoint)], check=True)
