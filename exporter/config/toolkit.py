"""The toolkit of config validation: collect every problem (named by its path in the file), convert values."""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Iterator
from typing import Any

_ENV_REF = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")


class Errors:
    """Collects problems as ``field: message`` lines, and notes on keys accepted but ignored; :meth:`within` names
    the fields of one part of the file (``models[1] (credit-scorer-v4).metrics[0].threshold``)."""

    def __init__(self, prefix: str = "", lines: list[str] | None = None, notes: list[str] | None = None) -> None:
        self.prefix = prefix
        self.lines: list[str] = [] if lines is None else lines
        self.notes: list[str] = [] if notes is None else notes

    def within(self, prefix: str) -> Errors:
        """The same list of problems, with every path under ``prefix`` (e.g. ``models[1] (credit-scorer-v4).``)."""
        return Errors(self.prefix + prefix, self.lines, self.notes)

    def _where(self, path: str) -> str:
        return f"{self.prefix}{path}" if path else self.prefix.rstrip(".") or "config"

    def add(self, path: str, message: str) -> None:
        self.lines.append(f"{self._where(path)}: {message}")

    def note(self, path: str, message: str) -> None:
        """A warning, logged once the config is valid: it never stops a config from loading."""
        self.notes.append(f"{self._where(path)}: {message}")

    def check_keys(self, path: str, mapping: dict[str, Any], allowed: set[str]) -> None:
        self.lines.extend(unknown_keys(mapping, allowed, f"{self.prefix}{path}." if path else self.prefix))

    def mappings(
        self, section: str, items: list[Any], allowed: set[str], what: str
    ) -> Iterator[tuple[str, dict[str, Any]]]:
        """(path, item) of each item of a list section that is a mapping with known keys; the others are errors."""
        for i, item in enumerate(items):
            path = f"{section}[{i}]"
            if not isinstance(item, dict):
                self.add(path, f"{item!r} is not a mapping{what}")
                continue
            self.check_keys(path, item, allowed)
            yield path, item


def unknown_keys(mapping: dict[Any, Any], allowed: set[str], where: str = "") -> list[str]:
    """A ``<where><key>: unknown key (accepted: ...)`` line for each key of ``mapping`` not ``allowed``, in order of
    their text (a YAML mapping may mix keys that are not text, such as ``1:``, with text ones)."""
    accepted = ", ".join(sorted(allowed))
    return [f"{where}{key}: unknown key (accepted: {accepted})" for key in sorted(set(mapping) - allowed, key=str)]


def expand_env(value: Any, errors: Errors, path: str = "") -> Any:
    """Replace ``${NAME}`` in every string with the environment variable NAME."""
    if isinstance(value, dict):
        return {k: expand_env(v, errors, f"{path}.{k}" if path else str(k)) for k, v in value.items()}
    if isinstance(value, list):
        return [expand_env(v, errors, f"{path}[{i}]") for i, v in enumerate(value)]
    if isinstance(value, str):

        def sub(m: re.Match[str]) -> str:
            if m.group(1) not in os.environ:
                errors.add(path, f"environment variable {m.group(1)} is not set")
                return ""
            return os.environ[m.group(1)]

        return _ENV_REF.sub(sub, value)
    return value


def get(
    raw: dict[str, Any], key: str, default: Any, errors: Errors, path: str, convert: Callable[[Any], Any]
) -> Any:
    """raw[key] converted, or default when absent; a conversion failure is recorded and gives default."""
    if key not in raw or raw[key] is None:
        return default
    try:
        return convert(raw[key])
    except (TypeError, ValueError) as exc:
        errors.add(f"{path}{key}", f"{raw[key]!r} is invalid: {exc}")
        return default


def positive_int(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError("expected a whole number >= 1")
    return value


def choice(*options: str) -> Callable[[Any], str]:
    def convert(value: Any) -> str:
        if value not in options:
            raise ValueError(f"expected one of {', '.join(options)}")
        return str(value)

    return convert


def text(value: Any) -> str:
    if not isinstance(value, str | int | float) or isinstance(value, bool) or not str(value).strip():
        raise ValueError("expected a non-empty string")
    return str(value)


def port(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= 65535:
        raise ValueError("expected a port number 0..65535")
    return value


def section(raw: dict[str, Any], key: str, errors: Errors, allowed: set[str]) -> dict[str, Any]:
    value = raw.get(key)
    if value is None:
        return {}
    if not isinstance(value, dict):
        errors.add(key, f"{value!r} is not a mapping")
        return {}
    errors.check_keys(key, value, allowed)
    return value


