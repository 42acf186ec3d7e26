"""A model's state layout: everything the meaning and shape of its window state depend on, which its checkpoint must
match (a model whose layout changed starts afresh)."""

from __future__ import annotations

from typing import Any

from exporter.config.types import ModelSpec, Windowing


def layout(model: ModelSpec, windowing: Windowing) -> dict[str, Any]:
    """Everything the meaning and shape of a model's window state depend on (its checkpoint must match it)."""
    return {
        "model_id": model.model_id,
        "attributes": {a.name: list(a.groups) for a in model.attributes},
        "unknown_rows": True,  # one row per attribute counts its unknown category
        "windows": [w.name for w in windowing.windows],
        "bucket_seconds": windowing.bucket_seconds,
        "allowed_lateness_seconds": windowing.allowed_lateness_seconds,
        **({"score_buckets": list(model.score_buckets)} if model.score_buckets else {}),
        # estimation keeps counts per score bin and predicted class: configuring it (or dropping it) starts afresh
        **({"estimation_counts": True} if model.estimation is not None or model.compares_scores else {}),
        # calibration keeps the labelled scores' sums per score bin, and a waiting prediction its score
        **({"labelled_score_sums": True} if model.calibrates else {}),
        # a proxy attribute's counts are weighted floats, apart from the exact ones (exporter/stream/state/proxy.py)
        **({"proxy_attributes": [a.name for a in model.attributes if a.proxy]}
           if any(a.proxy for a in model.attributes) else {}),
        # another version's counts are another model's: a new version starts afresh (and so does its checkpoint)
        **({"model_version": model.model_version} if model.model_version is not None else {}),
        # counts per segment value: their columns and cap are the shape (and meaning) of that axis
        **({"segments": list(model.segments), "strata": list(model.strata), "segment_values": model.segment_values,
            "baseline_offset": model.baseline_offset} if model.counted_columns else {}),
    }


def layout_changes(was: dict[str, Any], now: dict[str, Any]) -> tuple[str, str] | None:
    """How two :func:`layout` results differ (a model's state under the one cannot be the other's): the keys that
    changed joined by "+" (a counter's label), and a line showing them; None when they are the same."""
    keys = sorted(k for k in set(now) | set(was) if now.get(k) != was.get(k))
    if not keys:
        return None
    before, after = {k: was.get(k) for k in keys}, {k: now.get(k) for k in keys}
    return "+".join(keys), f"{', '.join(keys)}: was {before}, now {after}"
