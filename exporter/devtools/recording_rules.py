"""The fleet-wide recording rules: each replica's monotonic counters summed first, then divided, from the core's
tables of rates and metrics (so a metric added to the table is recorded fleet-wide with no edit here)."""

from __future__ import annotations

from typing import Any

from exporter.core.fairness import COUNT_NAMES, FN, FP, PRED_NEG, PRED_POS, RATES, TN, TP
from exporter.core.metric_table import COUNT_METRICS, METRICS
from exporter.devtools.rule_text import own

REPLICA_LABELS = ("instance", "pod")  # labels that tell replicas apart; recording rules sum them away


def _ratio(series: str, label: str, numerator: str, denominator: str) -> str:
    """Matching `label` values numerator / denominator, per remaining labels; 0 (not absent) with no numerator.

    A subgroup that never had a positive prediction has no predicted="1" series at all; `or ... * 0`
    keeps it in as rate 0 instead of dropping the most affected subgroup from the comparison.
    """
    op = "=~" if "|" in numerator else "="
    selected = own(series, f'{label}{op}"{numerator}"')
    num = f"sum without ({label}) ({selected})"
    den = _support(series, label, denominator)
    return f"(\n  {num}\n  or\n  {den} * 0\n)\n/\n({den} > 0)"


def _support(series: str, label: str, denominator: str) -> str:
    """The count a rate rests on (its denominator), per remaining labels."""
    selected = own(series, f'{label}=~"{denominator}"')
    return f"sum without ({label}) ({selected})"


def _indent(text: str) -> str:
    """`text` with every line indented by two spaces (nesting in a multi-line expression)."""
    return "\n".join("  " + line for line in text.splitlines())


# The counters a count column of the core is exported in: (counter's recorded increase, label, label value).
_COUNTER_OF: dict[int, tuple[str, str, str]] = {
    PRED_POS: ("predictions", "predicted", "1"), PRED_NEG: ("predictions", "predicted", "0"),
    **{c: ("labelled_predictions", "outcome", COUNT_NAMES[c]) for c in (TP, FP, TN, FN)},
}  # fmt: skip


def _rate_parts(rate: str, window: str) -> tuple[str, str, str, str]:
    """(series, label, numerator values, denominator values) of one rate of the core's RATES over the counters."""
    numerator, denominator = RATES[rate]
    (counter, label), *_ = {_COUNTER_OF[c][:2] for c in denominator}
    values = lambda cols: "|".join(_COUNTER_OF[c][2] for c in cols)  # noqa: E731
    return f"model_attribute_subgroup:fairness_{counter}:increase{window}", label, values(numerator), \
        values(denominator)  # fmt: skip


def _rate_record(rate: str, window: str) -> str:
    return f"model_attribute_subgroup:fairness_{rate}:ratio_{window}"


def _metric_record(metric: str, window: str) -> str:
    kind = "max_minus_min" if METRICS[metric].kind == "difference" else "min_over_max"
    return f"model_attribute:fairness_{metric}:{kind}_{window}"


def _comparable(rate: str, window: str) -> str:
    """Subgroups (not the overall population) with at least the model's min_samples of what the rate counts,
    as the daemon compares them; min_samples is the daemon's exported fairness_min_samples, not a constant here."""
    series, label, _, denominator = _rate_parts(rate, window)
    subgroups = own(_rate_record(rate, window), 'subgroup!="overall"')
    scope = "job, namespace, model_id"  # the model's own release: two namespaces may each monitor a model of one name
    return (f"{subgroups}\n  and\n  {_support(series, label, denominator)}"
            f"\n  >= on ({scope}) group_left ()\n  max by ({scope}) ({own('fairness_min_samples')})")


def _metric_expr(metric: str, window: str) -> str:
    """A metric over the fleet, from the table: the spread (max - min) of each compared rate over the comparable
    subgroups (the largest pairwise gap), the max of those for several rates; min/max for a ratio."""
    parts = []
    for rate in METRICS[metric].rates:
        comparable = _comparable(rate, window)
        at_least_two = f"count without (subgroup) (\n  {comparable}\n) > 1"
        lowest = _indent(f"min without (subgroup) (\n  {comparable}\n)")
        highest = _indent(f"max without (subgroup) (\n  {comparable}\n)")
        if METRICS[metric].kind == "ratio":
            # a subgroup with no positive has no ratio (insufficient, as in the daemon), never 0
            # (... > 0) in parentheses: `/` binds tighter than `>`
            parts.append(f"(\n  (\n{_indent(lowest)} > 0\n  )\n  /\n  (\n{_indent(highest)} > 0\n  )\n)\nand\n"
                         f"{at_least_two}")
        else:
            parts.append(f"(\n{highest}\n  -\n{lowest}\n)\nand\n{at_least_two}")
    if len(parts) == 1:
        return parts[0]
    first, second = (f"(\n{_indent(p)}\n)" for p in parts)
    return f"{first}\n>= {second}\nor\n{second}\n> {first}"  # the larger, defined only when both are


def recording_rules(window: str) -> list[dict[str, Any]]:
    """Fleet-wide rates and metrics over `window`: sum the replicas' counters first, then divide."""
    replicas = ", ".join(REPLICA_LABELS)
    rules: list[dict[str, Any]] = [
        {"record": f"model_attribute_subgroup:fairness_{counter}:increase{window}",
         "expr": f"sum without ({replicas}) (increase({own(f'fairness_{counter}_total')}[{window}]))"}
        for counter in ("predictions", "labelled_predictions")
    ]  # fmt: skip
    rules += [{"record": _rate_record(rate, window), "expr": _ratio(*_rate_parts(rate, window))} for rate in RATES]
    rules += [{"record": _metric_record(metric, window), "expr": _metric_expr(metric, window)}
              for metric in COUNT_METRICS]
    return rules
