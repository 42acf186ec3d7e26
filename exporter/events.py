"""Decode and validate a batch of raw prediction events into columns ready to be counted.

One pass of Python per event (orjson parse, a handful of dict lookups), then numpy for the rest. Every event
either becomes a row of the batch, is ignored (another model's), or is rejected under one reason; nothing raises.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Final

import numpy as np
import orjson

from exporter.config import OTHER_GROUP, Config
from exporter.grouping import attribute_codes, encode

REJECT_REASONS: Final = (
    "malformed_json", "missing_field", "unknown_attribute_value", "invalid_prediction", "invalid_score",
    "invalid_label", "invalid_timestamp", "future_timestamp",
)  # fmt: skip


def _getter(path: str) -> Callable[[dict[str, Any]], Any]:
    """A fast accessor for a dotted path into nested dicts; None where any step is missing."""
    keys = path.split(".")
    if len(keys) == 1:
        key = keys[0]
        return lambda event: event.get(key)

    def get(event: dict[str, Any]) -> Any:
        value: Any = event
        for key in keys:
            if not isinstance(value, dict):
                return None
            value = value.get(key)
        return value

    return get


def parse_timestamp(value: Any) -> float | None:
    """Epoch seconds from an ISO-8601 string (naive means UTC) or a number of epoch seconds; None if invalid."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int | float):
        return float(value) if np.isfinite(value) else None
    if isinstance(value, str):
        try:
            parsed = datetime.fromisoformat(value)
        except ValueError:
            return None
        if parsed.tzinfo is None:
            parsed = parsed.replace(tzinfo=UTC)
        return parsed.timestamp()
    return None


@dataclass
class DecodedBatch:
    """Accepted events as columns, and what happened to the others."""

    timestamps: np.ndarray
    predictions: np.ndarray
    labels: np.ndarray
    """-1 where the event carried no label."""
    prediction_ids: list[Any]
    codes: dict[str, np.ndarray]
    """Per configured attribute (intersections included): the subgroup code of every accepted event."""
    rejected: Counter[str] = field(default_factory=Counter)
    ignored: int = 0
    rejected_payloads: list[tuple[bytes, str]] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.timestamps)


class EventDecoder:
    """Turns raw Kafka message values into a :class:`DecodedBatch` for one configured model."""

    def __init__(self, config: Config, keep_rejected: bool = False) -> None:
        self.config = config
        self.keep_rejected = keep_rejected
        f = config.events
        self._model_id = _getter(f.model_id)
        self._prediction_id = _getter(f.prediction_id)
        self._timestamp = _getter(f.timestamp)
        self._prediction = _getter(f.prediction)
        self._score = _getter(f.score)
        self._label = _getter(f.label)
        self._attributes = _getter(f.attributes)
        self._threshold = f.score_threshold
        self._columns = [a.columns[0] for a in config.base_attributes]
        self._other = config.unknown_values == OTHER_GROUP

    def decode(self, values: Sequence[bytes], now: float) -> DecodedBatch:
        """Decode a batch; ``now`` (epoch seconds) bounds how far in the future a timestamp may be."""
        rejected: Counter[str] = Counter()
        bad: list[tuple[bytes, str]] = []
        ignored = 0
        ts_out: list[float] = []
        pred_out: list[int] = []
        label_out: list[int] = []
        ids: list[Any] = []
        raw_kept: list[bytes] = []
        attr_values: list[list[Any]] = [[] for _ in self._columns]
        latest = now + self.config.max_future_skew_seconds
        model_id, threshold = self.config.model_id, self._threshold

        def reject(raw: bytes, reason: str) -> None:
            rejected[reason] += 1
            if self.keep_rejected:
                bad.append((raw, reason))

        for raw in values:
            try:
                event = orjson.loads(raw)
            except (orjson.JSONDecodeError, TypeError):  # TypeError: a tombstone (None value)
                reject(raw, "malformed_json")
                continue
            if not isinstance(event, dict):
                reject(raw, "malformed_json")
                continue
            if self._model_id(event) != model_id:
                ignored += 1
                continue
            ts = parse_timestamp(self._timestamp(event))
            if ts is None:
                reject(raw, "missing_field" if self._timestamp(event) is None else "invalid_timestamp")
                continue
            if ts > latest:
                reject(raw, "future_timestamp")
                continue
            score = self._score(event)
            if score is not None and (isinstance(score, bool) or not isinstance(score, int | float)
                                      or not 0.0 <= score <= 1.0):  # fmt: skip
                reject(raw, "invalid_score")
                continue
            if threshold is not None:
                if score is None:
                    reject(raw, "missing_field")
                    continue
                pred = 1 if score >= threshold else 0
            else:
                pred = self._prediction(event)
                if pred is None:
                    reject(raw, "missing_field")
                    continue
                if isinstance(pred, str) or pred not in (0, 1):
                    reject(raw, "invalid_prediction")
                    continue
            label = self._label(event)
            if label is None:
                label = -1
            elif isinstance(label, str) or label not in (0, 1):
                reject(raw, "invalid_label")
                continue
            attrs = self._attributes(event)
            if not isinstance(attrs, dict):
                reject(raw, "missing_field")
                continue
            values_here = [attrs.get(c) for c in self._columns]
            if not self._other and None in values_here:
                reject(raw, "missing_field")
                continue
            for column, value in zip(attr_values, values_here, strict=True):
                column.append(value)
            ts_out.append(ts)
            pred_out.append(int(pred))
            label_out.append(int(label))
            ids.append(self._prediction_id(event))
            if self.keep_rejected:
                raw_kept.append(raw)

        base = {c: encode(v, a.groups) for c, v, a in
                zip(self._columns, attr_values, self.config.base_attributes, strict=True)}  # fmt: skip
        keep = np.ones(len(ts_out), dtype=bool)
        for codes in base.values():
            keep &= codes >= 0
        n_unknown = int((~keep).sum())
        if n_unknown:
            rejected["unknown_attribute_value"] += n_unknown
            if self.keep_rejected:
                bad.extend((raw_kept[i], "unknown_attribute_value") for i in np.flatnonzero(~keep))
            base = {c: codes[keep] for c, codes in base.items()}
            ids = [i for i, k in zip(ids, keep, strict=True) if k]
        return DecodedBatch(
            timestamps=np.asarray(ts_out, dtype=np.float64)[keep],
            predictions=np.asarray(pred_out, dtype=np.int64)[keep],
            labels=np.asarray(label_out, dtype=np.int64)[keep],
            prediction_ids=ids,
            codes={a.name: attribute_codes(a, base) for a in self.config.attributes},
            rejected=rejected,
            ignored=ignored,
            rejected_payloads=bad,
        )
