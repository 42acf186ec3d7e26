"""Gauge families of the /metrics page filled sample by sample: each computation adds tens of thousands, so a
sample is appended as prometheus-client's ``add_metric`` would, from labels named once."""

from __future__ import annotations

import math

from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.samples import Sample


class Family:
    """A gauge with optional _lower/_upper companions, filled with finite values only."""

    def __init__(self, name: str, doc: str, labels: list[str], bounds: bool = False) -> None:
        self.labels = tuple(labels)
        self.main = GaugeMetricFamily(name, doc, labels=labels)
        self.bounds = (
            (GaugeMetricFamily(f"{name}_lower", f"Lower bound of the 95% interval of {name}.", labels=labels),
             GaugeMetricFamily(f"{name}_upper", f"Upper bound of the 95% interval of {name}.", labels=labels))
            if bounds else ()
        )  # fmt: skip

    def add(self, labels: list[str], value: float, lower: float = math.nan, upper: float = math.nan) -> None:
        self.add_named(dict(zip(self.labels, labels, strict=True)), value, lower, upper)

    def add_named(self, named: dict[str, str], value: float, lower: float = math.nan, upper: float = math.nan) -> None:
        """As :meth:`add`, from labels already named: one dict shared by the gauge, its bounds and any other family of
        the same labels (encoders only read it)."""
        if math.isnan(value):
            return
        put(self.main, named, float(value))
        for family, bound in zip(self.bounds, (lower, upper), strict=False):
            if not math.isnan(bound):
                put(family, named, float(bound))

    def families(self) -> list[Metric]:
        return [self.main, *self.bounds]


def put(family: Metric, labels: dict[str, str], value: float) -> None:
    """A gauge's sample, as ``add_metric`` adds it but from labels already named (the page has ~600 per model)."""
    family.samples.append(Sample(family.name, labels, value, None))
