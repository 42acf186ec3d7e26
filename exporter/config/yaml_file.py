"""Reading a YAML file a person wrote, in whatever an editor saved: UTF-8 with or without a byte-order mark, UTF-16
or UTF-32 with one, CRLF or LF line ends. Any other encoding is refused in one line naming the file, the first
byte that is not UTF-8 and where it is, never guessed: a Latin-1 ``é`` read as something else would make a group
name that no event carries. A key given twice in one mapping is refused in one line naming both lines (PyYAML
keeps the last one in silence; Prometheus and Kubernetes refuse it). Imports only PyYAML (the HTTP worker process
reads its web configuration with it)."""

from __future__ import annotations

import codecs
from pathlib import Path
from typing import Any

import yaml

_BOMS = ((codecs.BOM_UTF32_LE, "utf-32"), (codecs.BOM_UTF32_BE, "utf-32"), (codecs.BOM_UTF8, "utf-8-sig"),
         (codecs.BOM_UTF16_LE, "utf-16"), (codecs.BOM_UTF16_BE, "utf-16"))  # fmt: skip
"""UTF-32's marks first: UTF-32 LE's begins with UTF-16 LE's."""


class YamlFileError(ValueError):
    """The file cannot be read as YAML; the message names it and says why."""


def decode(data: bytes, name: str) -> str:
    """The file's text: by its byte-order mark, else UTF-8."""
    encoding = next((e for bom, e in _BOMS if data.startswith(bom)), "utf-8")
    try:
        return data.decode(encoding)
    except UnicodeDecodeError as exc:
        line = data[: exc.start].count(b"\n") + 1
        hint = ("it looks like UTF-16 without a byte-order mark" if b"\x00" in data[:64] and encoding == "utf-8"
                else "Latin-1 and Windows-1252 are not guessed")  # fmt: skip
        raise YamlFileError(f"{name}: not {encoding.removesuffix('-sig').upper()}: byte {data[exc.start]:#04x} at "
                            f"line {line} ({hint}); save the file as UTF-8") from exc  # fmt: skip


class _DuplicateKey(yaml.YAMLError):
    def __init__(self, key: Any, line: int, first: int) -> None:
        super().__init__(f"line {line}: key {key!r} is given twice in one mapping (first at line {first}); keep one: "
                         "YAML would silently use the last")  # fmt: skip


class _UniqueKeyLoader(yaml.SafeLoader):
    """PyYAML's safe loader, refusing a key given twice in one mapping (a merge key's ``<<`` values excepted, which
    a mapping's own keys override by design)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: dict[Any, int] = {}
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue
            key, line = self.construct_object(key_node, deep=True), key_node.start_mark.line + 1
            try:
                if key in seen:
                    raise _DuplicateKey(key, line, seen[key])
            except TypeError:  # an unhashable key: the safe loader refuses it itself
                continue
            seen[key] = line
        return super().construct_mapping(node, deep=deep)


def read_yaml(path: str | Path) -> Any:
    """The file's YAML document (None for an empty file); OSError if it cannot be read, YamlFileError if it is
    not text or not YAML."""
    path = Path(path)
    text = decode(path.read_bytes(), str(path))
    try:
        return yaml.load(text, Loader=_UniqueKeyLoader)  # a SafeLoader
    except _DuplicateKey as exc:
        raise YamlFileError(f"{path}: {exc}") from exc
    except yaml.YAMLError as exc:
        raise YamlFileError(f"{path}: not valid YAML: {exc}") from exc
