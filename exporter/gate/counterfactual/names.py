"""The values that fill an attribute's slot, from files: the shipped name lists (data/PROVENANCE.md says where
each comes from and under which licence), the shipped items, and the user's own files beside the suite.
"""

from __future__ import annotations

import csv
import io
import itertools
from importlib import resources
from pathlib import Path
from typing import Any, Final

from exporter.config.toolkit import Errors
from exporter.core.attributes import INTERSECTION_SEP

DATA = resources.files("exporter.gate.counterfactual") / "data"
NAME_LISTS: Final = {"bertrand-mullainathan-2004": "names-bertrand-mullainathan-2004.csv"}
"""Shipped name lists (``names: {list: ...}``); data/PROVENANCE.md says where each comes from and its licence."""
SHIPPED_PREFIX: Final = "shipped:"
"""``items_file: shipped:resumes.txt`` (and ``questions_file`` of the ambiguous kind) names a file shipped in data/."""


def shipped_text(name: str) -> str:
    """A file shipped in data/ (``shipped:resumes.txt``)."""
    return (DATA / name).read_text(encoding="utf-8")


def read_text_file(value: str, base: Path, where: str, errors: Errors) -> str | None:
    """A user's file (relative to the suite's folder) or a shipped one (``shipped:NAME``); None after an error."""
    if value.startswith(SHIPPED_PREFIX):
        name = value[len(SHIPPED_PREFIX):]
        shipped = sorted(p.name for p in DATA.iterdir() if p.name != "PROVENANCE.md")
        if name not in shipped:
            errors.add(where, f"{value!r}: no such shipped file (shipped: {', '.join(shipped)})")
            return None
        return shipped_text(name)
    path = base / value
    try:
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        errors.add(where, f"cannot read {path}: {getattr(exc, 'strerror', None) or exc}")
        return None


def name_list(raw: Any, slot: str | None, base: Path, where: str, errors: Errors) -> dict[str, list[str]]:
    """``names: {list: bertrand-mullainathan-2004 | file: PATH, by: gender | race | [gender, race]}``: the first names
    of each value of the ``by`` column (of a list of columns, each combination of their values, joined with ``:``
    as the gate's intersections are: ``female:white``), ordered so that position i holds the same values of the
    other columns (a cell) in every group (item i then compares, say, a White woman's name with a Black woman's). A
    group with fewer names than another in a cell repeats its own there, in turn, so no name is dropped; a cell with
    no name in some group cannot be paired, and a combination of the ``by`` columns with no name is no category of
    the intersectional table: both are refused."""
    if not isinstance(raw, dict) or set(raw) - {"list", "file", "by"} or ("list" in raw) == ("file" in raw):
        errors.add(where, f"{raw!r} is not {{list: NAME or file: PATH, by: COLUMN}} (lists: {', '.join(NAME_LISTS)})")
        return {}
    if slot is None:
        errors.add(where, "a name list fills one slot: give the attribute a slot (e.g. slot: name)")
    if "list" in raw:
        if raw["list"] not in NAME_LISTS:
            errors.add(f"{where}.list", f"{raw['list']!r} is not a shipped list ({', '.join(NAME_LISTS)})")
            return {}
        text: str | None = shipped_text(NAME_LISTS[raw["list"]])
    else:
        text = read_text_file(str(raw["file"]), base, f"{where}.file", errors)
    if text is None:
        return {}
    rows = list(csv.DictReader(io.StringIO(text)))
    columns = list(rows[0]) if rows else []
    by = _by_columns(raw.get("by"), columns, where, errors)
    if not by:
        return {}
    others = [c for c in columns if c not in ("first_name", *by)]
    groups: dict[str, dict[tuple[str, ...], list[str]]] = {g: {} for g in _categories(rows, by, where, errors)}
    if not groups:
        return {}
    for row in rows:
        key = INTERSECTION_SEP.join(row[c] for c in by)
        groups[key].setdefault(tuple(row[c] for c in others), []).append(row["first_name"])
    cells = sorted({cell for g in groups.values() for cell in g})
    missing = [(cell, g) for cell in cells for g, by_cell in groups.items() if cell not in by_cell]
    if missing:
        cell, group = missing[0]
        counts = ", ".join(f"{g} {len(by_cell.get(cell, []))}" for g, by_cell in groups.items())
        errors.add(where, f"by: {raw['by']}: no name of {group} with {_cell_text(others, cell)} ({counts}): item i "
                          "compares names that differ only in the by column, so each combination of the other "
                          "columns needs a name in every group")  # fmt: skip
        return {}
    width = {cell: max(len(by_cell[cell]) for by_cell in groups.values()) for cell in cells}
    out = {}
    for group, by_cell in groups.items():
        # per cell, the group's names in turn up to the widest group's count; then the cells interleaved
        # (Black, White, Black, ...) in one order for every group
        columns_of_names = [list(itertools.islice(itertools.cycle(by_cell[cell]), width[cell])) for cell in cells]
        out[group] = [n for row in itertools.zip_longest(*columns_of_names) for n in row if n is not None]
    return out


def _by_columns(by: Any, columns: list[str], where: str, errors: Errors) -> list[str]:
    """``by:`` as a list of the list's columns (one, or several for their intersection); empty after an error."""
    names = [by] if isinstance(by, str) else by
    if not isinstance(names, list) or not names or not all(isinstance(c, str) for c in names) or \
            len(set(names)) < len(names) or "first_name" not in columns or \
            not set(names) <= set(columns) - {"first_name"}:  # fmt: skip
        errors.add(where, f"by: {by!r}: the list needs a first_name column and the by column (or a list of distinct "
                          f"columns, [gender, race], for their intersection); it has {columns}")  # fmt: skip
        return []
    return names


def _categories(rows: list[dict[str, str]], by: list[str], where: str, errors: Errors) -> list[str]:
    """The groups of ``by``: its column's values in the list's order or, of several columns, every combination of
    their values (the first column's slowest, as the gate's intersections), joined with ``:``; empty after an error
    naming a combination no name has, or two that join to one name."""
    values = [list(dict.fromkeys(row[c] for row in rows)) for c in by]
    combos = list(itertools.product(*values))
    present = {tuple(row[c] for c in by) for row in rows}
    absent = [combo for combo in combos if combo not in present]
    if absent:
        errors.add(where, f"by: {by}: no name with {_cell_text(by, absent[0])}: every combination of the by columns "
                          "is a category of the intersectional table, and this one could not be asked")  # fmt: skip
        return []
    joined = [INTERSECTION_SEP.join(combo) for combo in combos]
    if len(set(joined)) < len(joined):
        errors.add(where, f"by: {by}: values holding {INTERSECTION_SEP!r} join two combinations to one category "
                          "name; rename them")  # fmt: skip
        return []
    return joined


def _cell_text(columns: list[str], cell: tuple[str, ...]) -> str:
    return ", ".join(f"{c}={v}" for c, v in zip(columns, cell, strict=True)) or "no other column"
