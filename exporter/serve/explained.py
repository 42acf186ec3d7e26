"""The largest terms of each explained gap change on /metrics (``segments:``), for the paging alerts' descriptions;
GET /explain serves every term."""

from __future__ import annotations

from collections.abc import Iterator, Sequence

from prometheus_client.core import GaugeMetricFamily, Metric

from exporter.serve.snapshot import Snapshot

TOP_TERMS = 3
"""Terms of each explained change on /metrics (model_explanation_top_contribution)."""
_PAIR = ["model_id", "attribute", "window", "dimension", "group_a", "group_b"]


def explanation_families(snapshots: Sequence[Snapshot], cadence: str) -> Iterator[Metric]:
    """The largest terms of each explained change (``segments:``): :data:`TOP_TERMS` series per comparison, rate
    and window, whatever the number of segment values, for the paging alerts' descriptions; /explain has all."""
    if not any(s.explained for s in snapshots):
        return
    family = GaugeMetricFamily(
        "model_explanation_top_contribution", f"The {TOP_TERMS} largest terms (rank 1 the largest) of the change "
        "of the gap rate_a - rate_b from the window before this one (segments:): the segment (column=value), the "
        "term (mix: the groups' shares of it moved; rate: their rates within it moved), its contribution; GET "
        "/explain has every term with its interval." + cadence,
        labels=[*_PAIR, "rate", "rank", "segment", "term"])  # fmt: skip
    for snapshot in snapshots:
        seen = set()
        for window, found in (snapshot.explained or {}).items():
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
