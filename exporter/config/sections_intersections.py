"""Validate ``intersections:`` into attributes whose subgroups are their parts' groups joined with ``:``.

Every later stage keys counts and results by an attribute's name and a subgroup's name (the gate's counts per
attribute, the report's ``attributes`` and each result's ``samples``), so a name given twice is refused here:
rows would be counted twice (a repeated intersection), counts of different shapes mixed (an intersection named
like an attribute), or two subgroups reported as one (``x:y`` + ``z`` and ``x`` + ``y:z``). ``bias-report``'s
features are named the same way and refused by the same :func:`unique_intersection`.
"""

from __future__ import annotations

import itertools
from collections.abc import Collection

from exporter.config.toolkit import Errors
from exporter.core.attributes import INTERSECTION_SEP, Attribute


def parse_intersections(raw: object, base: list[Attribute], errors: Errors) -> list[Attribute]:
    """``intersections: [[gender, age_group]]``: each an attribute named ``gender_x_age_group``, its groups every
    combination of its parts' groups (``female:45_plus``); every name given twice is an error."""
    if raw is None:
        return []
    if not isinstance(raw, list):
        errors.add("intersections", f"{raw!r} is not a list of attribute-name lists, e.g. [[gender, age_group]]")
        return []
    by_name = {a.name: a for a in base}
    taken: dict[str, list[str]] = {}
    out = []
    for i, names in enumerate(raw):
        path = f"intersections[{i}]"
        if not (isinstance(names, list) and len(names) >= 2 and all(isinstance(n, str) for n in names)):
            errors.add(path, f"{names!r} is not a list of two or more attribute names")
            continue
        unknown = [n for n in names if n not in by_name]
        if unknown:
            errors.add(path, f"{unknown} not among protected_attributes {sorted(by_name)}")
            continue
        parts = [by_name[n] for n in names]
        if any(p.proxy is not None for p in parts):
            errors.add(path, f"{[p.name for p in parts if p.proxy]} are proxy attributes: an intersection needs "
                             "each row's own group, which a proxy does not give")  # fmt: skip
            continue
        combos = list(itertools.product(*(p.groups for p in parts)))
        groups = tuple(INTERSECTION_SEP.join(combo) for combo in combos)
        unique = unique_intersection(names, path, by_name, taken, errors)
        if len(set(groups)) < len(groups):
            _subgroup_collisions(parts, path, errors)
        if not unique or len(set(groups)) < len(groups):
            continue
        catch_alls = frozenset(g for g, combo in zip(groups, combos, strict=True)
                               if any(p.catch_all(v) for p, v in zip(parts, combo, strict=True)))  # fmt: skip
        configured = [i for i, g in enumerate(groups) if g not in catch_alls]
        out.append(
            Attribute(
                name="_x_".join(names),
                columns=tuple(p.columns[0] for p in parts),
                groups=groups,
                pairs=tuple(itertools.combinations(configured, 2)),
                base_sizes=tuple(len(p.groups) for p in parts),
                other=any(p.other for p in parts),
                catch_alls=catch_alls,
            )
        )
    return out


def unique_intersection(names: list[str], path: str, by_name: Collection[str], taken: dict[str, list[str]],
                        errors: Errors) -> bool:  # fmt: skip
    """Whether an intersection names nothing else: no attribute listed twice in it, not the same attributes as an
    earlier one, its name (the attributes' names joined with ``_x_``) none of ``by_name`` (the attributes) nor an
    earlier one's. ``taken``: the path of each earlier intersection -> its attributes; this one is added."""
    name = "_x_".join(names)
    twice = sorted({n for n in names if names.count(n) > 1})
    same = next((p for p, other in taken.items() if sorted(other) == sorted(names)), None)
    homonym = next((p for p, other in taken.items() if "_x_".join(other) == name), None)
    taken[path] = names
    if twice:
        errors.add(path, f"{names} lists {twice} more than once: an intersection crosses different attributes")
    elif same is not None:
        errors.add(path, f"{names} repeats {same}: every row would be counted twice; list each intersection once")
    elif name in by_name:
        errors.add(path, f"its name {name!r} is also a protected attribute's: rename that attribute (an "
                         "intersection is named by its attributes' names joined with '_x_')")  # fmt: skip
    elif homonym is not None:
        errors.add(path, f"its name {name!r} is also the name of {homonym}: rename an attribute so the two differ")
    return not (twice or same or homonym or name in by_name)


def _subgroup_collisions(parts: list[Attribute], path: str, errors: Errors) -> None:
    """One error per subgroup name that two combinations of groups join to (``x:y`` + ``z`` and ``x`` + ``y:z``)."""
    first: dict[str, tuple[str, ...]] = {}
    for combo in itertools.product(*(p.groups for p in parts)):
        joined = INTERSECTION_SEP.join(combo)
        if joined in first:
            errors.add(path, f"groups {list(first[joined])} and {list(combo)} of {[p.name for p in parts]} both make "
                             f"the subgroup {joined!r}: rename a group so no two join (with "
                             f"{INTERSECTION_SEP!r}) to one name")  # fmt: skip
        else:
            first[joined] = combo
