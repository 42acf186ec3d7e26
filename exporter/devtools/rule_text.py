"""What every generated alert shares: the templates of its labels and value, its numbers, its runbook link, its
shape (exporter/devtools/rules.py, health_rules.py and stage_rules.py build the alerts from these)."""

from __future__ import annotations

from typing import Any

JOB = "fairness-exporter"  # the scrape job of every target (the chart's ServiceMonitor names it so)
SCOPE = f'job="{JOB}"'
"""The matcher of every selector of the exporter's own series, raw or recorded by the rules. A plain Prometheus
names its scrape job so; the chart replaces it with its release's job and namespace, so that two releases' rules
neither read nor record each other's series (deploy/helm/fairness-exporter/templates/prometheusrule.yaml)."""
RUNBOOK_URL = "https://github.com/fairness-exporter/fairness-exporter/blob/main/rules/RUNBOOK.md"
VALUE_3F = '{{ printf "%.3f" $value }}'
VALUE_0F = '{{ printf "%.0f" $value }}'


def label(name: str) -> str:
    """The alert template that renders one label of the alerting series."""
    return "{{ $labels." + name + " }}"


def configured(metric: str) -> str:
    """An annotation fragment showing the alerting target's own value of ``metric``, one of its periods."""
    query = f'printf "{metric}{{job=%q,instance=%q}}" $labels.job $labels.instance'
    return "{{ with " + query + " | query }}{{ . | first | value | humanizeDuration }}{{ end }}"


def own(metric: str, *matchers: str) -> str:
    """A selector of one of the exporter's series, raw or recorded, scoped by :data:`SCOPE`: ``own("up")`` is
    ``up{job="fairness-exporter"}``, ``own("m", 'x="1"')`` is ``m{job="fairness-exporter", x="1"}``."""
    return metric + "{" + ", ".join((SCOPE, *matchers)) + "}"


def fmt(number: float) -> str:
    """A threshold as written in PromQL and in annotations: 0.8, 0.05, 300."""
    return f"{number:g}"


def alert(name: str, expr: str, for_: str, severity: str, summary: str, description: str) -> dict[str, Any]:
    """One alerting rule with a runbook anchor named after the alert."""
    return {
        "alert": name,
        "expr": expr,
        "for": for_,
        "labels": {"severity": severity},
        "annotations": {"summary": summary, "description": description,
                        "runbook_url": f"{RUNBOOK_URL}#{name.lower()}"},
    }  # fmt: skip


EXPLAINED_RATES = {"demographic_parity_difference": "selection_rate", "disparate_impact_ratio": "selection_rate",
                   "true_positive_rate_difference": "true_positive_rate",
                   "false_positive_rate_difference": "false_positive_rate"}  # fmt: skip
"""The rate whose gap a pair detector's metric watches: its explanation (model_explanation_top_contribution)."""


def explained(metrics: tuple[str, ...]) -> str:
    """An annotation fragment naming the largest term of the change of the firing series' gap in every window, for a
    model with ``segments:`` (nothing for a model without: the query finds no series). An alert over metrics of
    several rates (equalised odds: a detector on the TPR gap, one on the FPR gap) names the terms of the rate of the
    series' own ``metric`` only, as backtest's explanation of the same page does."""
    rates = {m: EXPLAINED_RATES[m] for m in metrics if m in EXPLAINED_RATES}
    if len(set(rates.values())) <= 1:
        return "".join(_largest_term(rate) for rate in set(rates.values()))
    return "".join('{{ if eq $labels.metric "' + m + '" }}' + _largest_term(rate) + "{{ end }}"
                   for m, rate in rates.items())  # fmt: skip


def _largest_term(rate: str) -> str:
    """The fragment naming the largest term of ``rate``'s gap change in every window."""
    query = ('printf "model_explanation_top_contribution{model_id=%q,attribute=%q,dimension=%q,instance=%q,rank=%q,'
             'rate=%q}" $labels.model_id $labels.attribute $labels.dimension $labels.instance "1" "' + rate + '"')
    return ("{{ with " + query + " | query }}Largest term of the change since the window before: {{ range . | "
            'sortByLabel "window" }}{{ .Labels.window }}: {{ .Labels.segment }} {{ .Labels.term }} '
            '{{ printf "%+.3f" .Value }} ({{ .Labels.rate }}); {{ end }}{{ end }}')
