"""The vector selectors of a PromQL expression, for checks that every one of them is scoped.

A scanner, not a parser (promtool has no command that prints a parsed expression): it reads what our rules and
dashboard write (metric names, `{...}` matchers, `[...]` ranges, function calls and aggregations,
`by`/`without`/`on`/`ignoring`/`group_*` label lists, numbers, operators) and tells a selector from a function, a
keyword or a label name. Not for subqueries, `@` modifiers or matchers whose values hold `}` outside quotes.

    >>> selectors('sum without (pod) (rate(a_total{job="x"}[5m])) > on (job) group_left () b')
    [('a_total', {'job': 'x'}), ('b', {})]
"""

from __future__ import annotations

import re

KEYWORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "bool", "and", "or", "unless", "offset",
            "atan2", "inf", "nan"}  # fmt: skip
_STRING = r'"(?:[^"\\]|\\.)*"'
_TOKEN = re.compile(
    rf"(?P<string>{_STRING}|'(?:[^'\\]|\\.)*'|`[^`]*`)"
    r"|(?P<labels>\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\))"
    r"|(?P<range>\[[^\]]*\])"
    r"|(?P<number>(?<![\w:.])\d+(?:\.\d+)?(?:[eE][+-]?\d+)?[smhdwy]?)"
    rf"|(?P<name>(?<![\w:.])[a-zA-Z_:][\w:]*)?\s*(?P<matchers>\{{(?:[^}}\"]|{_STRING})*\}})?"
)
_CALL = re.compile(r"\s*(?:(?:by|without)\s*\([^)]*\)\s*)?\(")
_MATCHER = re.compile(rf"\s*([a-zA-Z_]\w*)\s*(=~|!~|!=|=)\s*({_STRING})\s*,?")


def _matchers(text: str) -> dict[str, str]:
    """`{a="1", b=~"x|y"}` as {"a": "1", "b": "=~x|y"}: an equality's value alone, another operator before it."""
    found = {}
    for name, op, value in _MATCHER.findall(text[1:-1]):
        found[name] = (op if op != "=" else "") + value[1:-1]
    return found


def selectors(expr: str) -> list[tuple[str, dict[str, str]]]:
    """(metric name, matchers) of every vector selector of ``expr``, in order; a `{...}` alone has name ''."""
    found = []
    for match in _TOKEN.finditer(expr):
        name, matchers = match.group("name"), match.group("matchers")
        if name is None and matchers is None:
            continue
        # a function's or an aggregation's name: `rate(`, `sum (`, `sum without (pod) (`
        is_call = name is not None and matchers is None and _CALL.match(expr, match.end()) is not None
        if is_call or (name or "").lower() in KEYWORDS:
            continue
        found.append((name or "", _matchers(matchers or "{}")))
    return found
