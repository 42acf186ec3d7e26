"""Why each gap moved, on /metrics: the largest terms of each explained gap change (``segments:``), for the paging
alerts' descriptions (GET /explain has every term), and each window's rows under a segment column's ``other`` and
those its conditional metrics leave out (computed by exporter/serve/segment_rows.py with each snapshot)."""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence

from prometheus_client.core import GaugeMetricFamily, Metric

from exporter.serve.segment_rows import AMBIGUOUS
from exporter.serve.snapshot import Snapshot

TOP_TERMS = 3
"""Terms of each explained change on /metrics (model_explanation_top_contribution)."""
_PAIR = ["model_id", "attribute", "window", "dimension", "group_a", "group_b"]


def explanation_families(snapshots: Sequence[Snapshot], cadence: str) -> Iterator[Metric]:
    """The largest terms of each explained change (``segments:``): :data:`TOP_TERMS` series per comparison, rate
    and window, whatever the number of segment values, for the paging alerts' descriptions (/explain has all); and
    each window's predictions under a segment column's ``other``, by reason."""
    yield from _excluded_family(snapshots, cadence)
    if not any(s.explained for s in snapshots):
        return
    family = GaugeMetricFamily(
        "model_explanation_top_contribution", f"The {TOP_TERMS} largest terms (rank 1 the largest) of the change "
        "of the gap rate_a - rate_b from the window before this one (segments:): the segment (column=value), the "
        "term (mix: the groups' shares of it moved; rate: their rates within it moved), its contribution; GET "
        "/explain has every term with its interval." + cadence,
        labels=[*_PAIR, "rate", "rank", "segment", "term"])  # fmt: skip
    others = GaugeMetricFamily(
        "model_segment_other_samples", "Predictions of the window's current period (in the segment buckets) counted "
        "under a segment column's other value (segments:), by reason: missing (the event had no value of the "
        "column: a producer that stops sending it shows here, not as rows leaving its values), overflow (a value "
        f"past segment_values), {AMBIGUOUS} (both have happened since the counts began: the windows cannot tell "
        "them apart)." + cadence, labels=["model_id", "window", "column", "reason"])  # fmt: skip
    for snapshot in snapshots:
        seen = set()
        for window, found in (snapshot.explained or {}).items():
            for column, periods in found.get("segment_rows", {}).items():
                current = periods["current"]
                _by_reason(others, [snapshot.model_id, window, column], current)
            for e in found["explanations"]:
                key = (window, e["attribute"], e["comparison"], e["rate"])
                if key in seen:  # one rate's change, explained once for every metric comparing it
                    continue
                seen.add(key)
                a, b = e["comparison"].split(" vs ", 1)
                terms = sorted(((s[t], f"{s['column']}={s['value']}", t) for s in e["segments"]
                                for t in ("rate", "mix")), key=lambda x: -abs(x[0]))[:TOP_TERMS]  # fmt: skip
                for rank, (value, segment, term) in enumerate(terms, start=1):
                    family.add_metric([snapshot.model_id, e["attribute"], window, f"{a}_vs_{b}", a, b, e["rate"],
                                       str(rank), segment, term], value)  # fmt: skip
    yield family
    yield others


def _excluded_family(snapshots: Sequence[Snapshot], cadence: str) -> Iterator[Metric]:
    """Each window's predictions its conditional metrics leave out, by reason (:func:`excluded`)."""
    if not any(s.conditional_excluded for s in snapshots):
        return
    family = GaugeMetricFamily(
        "model_conditional_excluded_samples", "Predictions of the window's current period that the conditional "
        "metrics (strata:) leave out, by reason: missing (the event had no value of a stratum column), overflow (its "
        f"combination came past segment_values), {AMBIGUOUS} (both have happened since the counts began: the windows "
        "cannot tell them apart). The gate's report says the same of its rows (strata.rows_excluded)." + cadence,
        labels=["model_id", "window", "reason"])  # fmt: skip
    for snapshot in snapshots:
        for window, current in (snapshot.conditional_excluded or {}).items():
            _by_reason(family, [snapshot.model_id, window], current)
    yield family


def _by_reason(family: GaugeMetricFamily, labels: list[str], current: Mapping[str, int | None]) -> None:
    """A period's rows under ``other`` (:func:`exporter.serve.segment_rows.segment_rows`) by reason: ``missing`` and
    ``overflow``, or one :data:`AMBIGUOUS` series when the counts cannot tell them apart."""
    if current["missing"] is None:
        family.add_metric([*labels, AMBIGUOUS], float(current["other"] or 0))
        return
    for reason in ("missing", "overflow"):
        family.add_metric([*labels, reason], float(current[reason] or 0))
