"""The daemon's own series for attributes joined from side sources (``attribute_sources:``): how each prediction's
id fared per source, the side records taken and refused, the table sizes and the predictions waiting. Counts and
sizes only: no series carries an id or a value."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from prometheus_client import CollectorRegistry, Counter, Gauge


class SideHealth:
    """Registered only by a daemon with attribute sources, every label set of every source shown from the start
    (``outcomes`` and ``rejects``: the join's lists, exporter/stream/state/attribute_join.py)."""

    def __init__(self, registry: CollectorRegistry, sources: list[str], outcomes: Sequence[str],
                 rejects: Sequence[str]) -> None:  # fmt: skip
        self.joins = Counter("fairness_exporter_attribute_joins", "Predictions' ids looked up in a side source "
                             "(attribute_sources), by what became of them: joined at once, joined after waiting, "
                             "never joined within the horizon (counted as unknown), no id, or the waiting room full.",
                             ["source", "outcome"], registry=registry)  # fmt: skip
        self.records = Counter("fairness_exporter_side_records", "Side records (and tombstones) taken into a "
                               "source's table.", ["source"], registry=registry)  # fmt: skip
        self.rejected = Counter("fairness_exporter_side_records_rejected", "Side records not taken, by reason: no "
                                "JSON object (dead-lettered), no key, the table full, a field past its values.",
                                ["source", "reason"], registry=registry)  # fmt: skip
        self.size = Gauge("fairness_exporter_side_table_records", "Ids held in a side source's table.", ["source"],
                          registry=registry)  # fmt: skip
        self.waiting = Gauge("fairness_exporter_predictions_waiting_for_attributes", "Predictions held until their "
                             "side records arrive (or their horizon passes).", registry=registry)  # fmt: skip
        for source in sources:
            self.records.labels(source)
            for outcome in outcomes:
                self.joins.labels(source, outcome)
            for reason in rejects:
                self.rejected.labels(source, reason)

    def count(self, outcomes: Mapping[tuple[str, str], int]) -> None:
        for (source, outcome), n in outcomes.items():
            if n:
                self.joins.labels(source, outcome).inc(n)
