"""A YAML mapping may hold keys that are not text (``1: x``, ``true: y``, ``2026-01-01: z``): every config reader
refuses them in its config error naming the key, never a traceback (STYLE.md: a traceback is a bug report).
The unknown keys of a mapping were listed by ``sorted(set(raw) - allowed)``, which raises ``TypeError`` as soon as
an integer and a text key are both unknown: ``fairness-exporter backtest`` with ``1: x`` and ``foo: y`` in a model
entry ended in ``'<' not supported between instances of 'str' and 'int'``.

Each example config the project ships is read with such a pair of keys put into each of its mappings in turn."""

from __future__ import annotations

import copy
import datetime
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from exporter.config import ConfigError, load_config
from exporter.gate.counterfactual.suite import load_suite
from exporter.gate.redteam.config import load_library, parse_config
from exporter.gate.safety.config import load_safety_config
from exporter.serve import web_config

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"
ODD_KEYS = {1: "x", "zz_not_a_key": "y", datetime.date(2026, 1, 1): "z"}


def _mappings(node: Any, path: tuple[Any, ...] = ()) -> Iterator[tuple[Any, ...]]:
    """The path of every mapping in a YAML tree."""
    if isinstance(node, dict):
        yield path
        for key, value in node.items():
            yield from _mappings(value, (*path, key))
    elif isinstance(node, list):
        for i, value in enumerate(node):
            yield from _mappings(value, (*path, i))


def _with_odd_keys(raw: dict[str, Any], path: tuple[Any, ...]) -> dict[str, Any]:
    changed = copy.deepcopy(raw)
    node: Any = changed
    for step in path:
        node = node[step]
    node.update(ODD_KEYS)
    return changed


def _daemon(tmp_path: Path, raw: dict[str, Any]) -> object:
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(raw))
    return load_config(tmp_path / "c.yaml")


def _safety(tmp_path: Path, raw: dict[str, Any]) -> object:
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(raw))
    return load_safety_config(tmp_path / "c.yaml")


def _redteam(tmp_path: Path, raw: dict[str, Any]) -> object:
    return parse_config(raw, "red-team.yaml", load_library(), "classifier")


def _counterfactual(tmp_path: Path, raw: dict[str, Any]) -> object:
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(raw))
    return load_suite(tmp_path / "c.yaml")


def _web(tmp_path: Path, raw: dict[str, Any]) -> object:
    (tmp_path / "web.yml").write_text(yaml.safe_dump(raw))
    return web_config.load(str(tmp_path / "web.yml"))


def _demo() -> dict[str, Any]:
    return yaml.safe_load((ROOT / "exporter" / "examples" / "demo.yaml").read_text())


def _example(name: str) -> Callable[[], dict[str, Any]]:
    return lambda: yaml.safe_load((EXAMPLES / name).read_text())


def _web_example() -> dict[str, Any]:
    return {"basic_auth_users": {"prom": "$2b$12$" + "a" * 53}, "http_server_config": {"headers": {"X-A": "b"}}}


READERS: dict[str, tuple[Callable[[], dict[str, Any]], Callable[[Path, dict[str, Any]], object],
                         tuple[type[Exception], ...]]] = {
    "daemon (demo)": (_demo, _daemon, (ConfigError,)),
    "audit gate (hiring-screener)": (_example("hiring-screener.yaml"), _daemon, (ConfigError,)),
    "safety": (_example("safety.yaml"), _safety, (ConfigError,)),
    "red team": (_example("red-team.yaml"), _redteam, (ConfigError,)),
    "counterfactual": (_example("counterfactual-screener.yaml"), _counterfactual, (ConfigError,)),
    "web config": (_web_example, _web, (web_config.WebConfigError,)),
}  # fmt: skip


@pytest.mark.parametrize("reader", READERS)
def test_keys_that_are_not_text_in_any_mapping_are_a_config_error(tmp_path: Path, reader: str,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FAIRNESS_DEMO_BOOTSTRAP", "127.0.0.1:9092")
    make, read, refused = READERS[reader]
    base = make()
    paths = list(_mappings(base))
    assert len(paths) >= 3, paths  # the example has nested mappings to put the keys into
    outcomes = []
    for path in paths:
        try:
            read(tmp_path, _with_odd_keys(base, path))
        except refused:
            outcomes.append("refused")
        else:
            outcomes.append("read")  # a mapping of free-form names (headers, a case's metadata) may take any key
    assert outcomes.count("refused") >= len(paths) // 2, list(zip(paths, outcomes, strict=True))
    if reader != "web config":
        whole = _with_odd_keys(base, ())
        with pytest.raises(refused) as top:
            read(tmp_path, whole)
        assert "1: unknown key" in str(top.value) and "zz_not_a_key: unknown key" in str(top.value), str(top.value)
