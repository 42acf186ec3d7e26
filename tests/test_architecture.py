"""The package layout's promises: the daemon's import path stays light, the core depends on nothing of ours, a folder
is one idea of at most 15 modules, and no module imports itself back through others."""

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
        for path in (PACKAGE / package).rglob("*.py")
        for name in _imports(path)
        if name.startswith("exporter.gate") or name == "pandas"
    }
    assert not offending


def test_stream_never_imports_serve_and_health_imports_neither() -> None:
    """serve/ renders what stream/ counts, so the arrows run serve -> stream -> health: the daemon's own counters live
    in exporter/health, below both, at any depth of a file."""
    graph = _import_graph()
    upward = {f"{name}: {target}" for name, targets in graph.items() for target in targets
              if (name.startswith("exporter.stream") and target.startswith("exporter.serve"))
              or (name.startswith("exporter.health") and target.startswith(("exporter.stream", "exporter.serve")))}
    assert not upward, sorted(upward)


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


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _import_graph() -> dict[str, set[str]]:
    """Each module of the package and the modules of ours it imports, at any depth (function-level included):
    ``from a.b import c`` is an edge to ``a.b.c`` when that is a module, else to ``a.b``."""
    modules = {_module_name(p): p for p in PACKAGE.rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        edges: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                edges.update(a.name for a in node.names if a.name in modules)
            elif isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("exporter"):
                subs = {f"{node.module}.{a.name}" for a in node.names} & modules.keys()
                edges.update(subs or {node.module})
        graph[name] = (edges & modules.keys()) - {name}
    return graph


def test_no_folder_holds_more_than_15_modules() -> None:
    crowded = {str(d.relative_to(PACKAGE.parent)): n for d in [PACKAGE, *PACKAGE.rglob("*/")]
               if d.is_dir() and d.name != "__pycache__"
               and (n := sum(1 for p in d.glob("*.py") if p.name != "__init__.py")) > 15}  # fmt: skip
    assert not crowded


def test_no_import_cycle_among_the_package_modules() -> None:
    graph = _import_graph()
    cycles: list[list[str]] = []
    state: dict[str, int] = {}  # 1: on the current path, 2: done

    def visit(node: str, path: list[str]) -> None:
        state[node] = 1
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                cycles.append([*path[path.index(nxt):], nxt])
            elif nxt not in state:
                visit(nxt, [*path, nxt])
        state[node] = 2

    for start in sorted(graph):
        if start not in state:
            visit(start, [start])
    assert not cycles, " ; ".join(" -> ".join(c) for c in cycles)


def test_the_import_graph_sees_function_level_imports() -> None:
    """The cycle check would pass vacuously if it missed imports inside functions: commands imports the audit there."""
    assert "exporter.gate.fairness.audit" in _import_graph()["exporter.gate.commands"]


def test_backtest_of_json_lines_loads_neither_pandas_nor_pyarrow() -> None:
    """The daemon image replays JSON lines and has neither: the dataset reader loads them only for parquet/CSV."""
    code = ("import sys, exporter.backtest.replay, exporter.backtest.input; "
            "print(sorted({'pandas', 'pyarrow'} & set(sys.modules)))")  # fmt: skip
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
