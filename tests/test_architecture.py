"""The package layout's promises: the daemon's import path stays light, and the core depends on nothing of ours."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "exporter"


def _imports(path: Path) -> set[str]:
    """Every module a file imports (absolute names), at any depth of the file."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
    return names


def test_importing_the_daemon_does_not_load_pandas() -> None:
    code = "import sys, exporter.daemon, exporter.cli; print('pandas' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"


def test_core_imports_nothing_of_ours_outside_core() -> None:
    offending = {
        f"{path.relative_to(PACKAGE)}: {name}"
        for path in (PACKAGE / "core").glob("*.py")
        for name in _imports(path)
        if (name.startswith("exporter") and not name.startswith("exporter.core")) or name == "pandas"
    }
    assert not offending


def test_stream_and_serve_never_import_the_gate() -> None:
    offending = {
        f"{path.relative_to(PACKAGE)}: {name}"
        for package in ("stream", "serve")
        for path in (PACKAGE / package).glob("*.py")
        for name in _imports(path)
        if name.startswith("exporter.gate") or name == "pandas"
    }
    assert not offending


def test_the_http_worker_process_loads_neither_numpy_nor_pandas() -> None:
    """The worker (python -m exporter.serve.worker) serves bytes: it stays small and starts fast."""
    code = ("import sys, exporter.serve.worker; "
            "print(sorted({'numpy', 'pandas'} & set(sys.modules)))")  # fmt: skip
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_no_module_is_over_400_lines() -> None:
    long = {str(p.relative_to(PACKAGE)): n for p in PACKAGE.rglob("*.py")
            if (n := len(p.read_text(encoding="utf-8").splitlines())) > 400}  # fmt: skip
    assert not long
