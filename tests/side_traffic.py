"""Synthetic applicants whose demographics live apart from the predictions (attribute_sources), with the truth
their counts must equal: shared by the in-memory and the broker tests of the attribute join."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import numpy as np

GENDERS = ("male", "female")
RACES = ("white", "black", "asian")
SOURCE = {"applicants": {"topic": "applicant-demographics", "id": "applicant_id", "horizon": "1m"}}
ATTRIBUTES = [{"name": "gender", "groups": list(GENDERS), "source": "applicants"},
              {"name": "race", "groups": list(RACES), "source": "applicants"}]  # fmt: skip


@dataclass
class Scenario:
    """Side records before the predictions (80%, a few corrected first), the predictions (carrying only the id),
    the records after them (15%, and corrections of earlier ones, which must change nothing counted), and 5%
    never; ``truth``: (attribute, subgroup) -> [predictions, positives], ``unknown`` per attribute."""

    before: list[tuple[str, dict[str, str] | None, float]] = field(default_factory=list)
    predictions: list[dict[str, Any]] = field(default_factory=list)
    after: list[tuple[str, dict[str, str] | None, float]] = field(default_factory=list)
    """(id, record or None for a tombstone, its time: the Kafka timestamp it is in force from)"""
    truth: dict[tuple[str, str], list[int]] = field(default_factory=dict)
    never: int = 0
    positives: int = 0


def scenario(n: int, ts: float, seed: int = 7, model_id: str = "m1") -> Scenario:
    rng = np.random.default_rng(seed)
    out = Scenario(truth={(a, g): [0, 0] for a, groups in (("gender", GENDERS), ("race", RACES)) for g in groups})
    for i in range(n):
        aid = f"A{i:06d}"
        record = {"gender": GENDERS[rng.integers(2)], "race": RACES[rng.integers(3)]}
        prediction = int(rng.random() < (0.6 if record["gender"] == "male" else 0.4))
        when = rng.random()
        if when < 0.80:
            if i % 25 == 0:  # a wrong record first, corrected before the prediction: the correction counts
                out.before.append((aid, {"gender": GENDERS[1 - GENDERS.index(record["gender"])], "race": "asian"},
                                   ts - 12))  # fmt: skip
            out.before.append((aid, record, ts - 10))
            if i % 30 == 1:  # corrected after the prediction: the prediction keeps the value it met
                out.after.append((aid, {"gender": "female", "race": "black"}, ts + 8))
        elif when < 0.95:
            out.after.append((aid, record, ts + 5))
        else:
            record = {}
            out.never += 1
            if i % 2:  # a record that was deleted (tombstone) before the prediction: as if never sent
                out.before += [(aid, {"gender": "male", "race": "white"}, ts - 12), (aid, None, ts - 10)]
        for attribute, value in record.items():
            out.truth[(attribute, value)][0] += 1
            out.truth[(attribute, value)][1] += prediction
        out.positives += prediction
        out.predictions.append({"model_id": model_id, "prediction_id": f"p{i}", "timestamp": ts,
                                "prediction": prediction, "attributes": {"applicant_id": aid}})  # fmt: skip
    return out


def expected_samples(s: Scenario) -> Counter[tuple[str, str]]:
    return Counter({k: v[0] for k, v in s.truth.items()})
