"""Decode ground-truth events from the outcomes topic (the delayed labels joined to predictions by id), by the
same rules as the prediction decoder: a bounded prediction id, an outcome that is 0 or 1 (a boolean counts as 0/1),
and a number beyond a float malformed only in those two fields (exporter/stream/decode/bignum.py)."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from exporter.stream.decode.bignum import Reader
from exporter.stream.decode.events import is_binary, is_valid_id


@dataclass
class DecodedOutcomes:
    """Ground-truth events from the outcomes topic: prediction ids and their 0/1 outcomes, and how many were
    invalid (not JSON, no usable prediction id, or an outcome that is neither 0/1 nor a boolean)."""

    prediction_ids: list[str]
    outcomes: list[int]
    invalid: int
    positions: list[int]
    """Where each valid event was among the decoded values (the staged path tells its source offset by it)."""


def decode_outcomes(values: Iterable[bytes | None], id_field: str, outcome_field: str) -> DecodedOutcomes:
    """Decode ground-truth events ``{"<id_field>": ..., "<outcome_field>": 0 or 1, or false or true}``."""
    ids: list[str] = []
    outcomes: list[int] = []
    positions: list[int] = []
    invalid = 0
    read = Reader([([id_field], True), ([outcome_field], True)])
    for i, raw in enumerate(values):
        try:
            message = read(raw)  # a tombstone (None) raises TypeError
        except Exception:  # JSONDecodeError (nested past 1024 levels too), TypeError, anything: this one is invalid
            message = None
        pid = message.get(id_field) if message.__class__ is dict else None
        outcome = message.get(outcome_field) if message.__class__ is dict else None
        if pid is None or not is_valid_id(pid) or not is_binary(outcome):
            invalid += 1
            continue
        ids.append(str(pid))
        outcomes.append(int(outcome))
        positions.append(i)
    return DecodedOutcomes(ids, outcomes, invalid, positions)
