"""The label join's ids joined within the horizon: kept through a checkpoint or a snapshot, so that a label delivered
again after a restart or a rebalance is a duplicate, and a prediction delivered again after its label joined is not
held again; and one bound shared by the joins of one replica (the staged path's join tasks)."""

from __future__ import annotations

from collections import Counter

import numpy as np

from exporter.stream.state.label_join import OutcomeJoin

T0 = 1_700_000_000.0


def _held(join: OutcomeJoin, ids: list[str]) -> Counter[str]:
    given_up: Counter[str] = Counter()
    n = len(ids)
    join.add_predictions("m", ids, np.full(n, T0), np.ones(n, dtype=np.int64), np.zeros((n, 1), dtype=np.int64),
                         given_up)  # fmt: skip
    return given_up


def test_a_label_delivered_again_after_a_restore_is_a_duplicate_not_an_orphan() -> None:
    join = OutcomeJoin(3600)
    _held(join, ["a", "b"])
    assert sum(map(len, join.add_outcomes(["a", "b"], [1, 0], T0 + 10, Counter()).values())) == 2
    restored = OutcomeJoin(3600)
    restored.restore(join.state(T0 + 20))
    given_up: Counter[str] = Counter()
    assert restored.add_outcomes(["b", "a"], [0, 1], T0 + 30, given_up) == {}
    assert given_up == Counter(duplicate_label=2) and not restored.orphans
    restored.expire(T0 + 3600 + 11, given_up)  # the ids are forgotten a horizon after their labels arrived
    assert not restored.recently_joined


def test_a_checkpoint_written_before_the_joined_ids_were_kept_restores_none() -> None:
    join = OutcomeJoin(3600)
    _held(join, ["a"])
    join.add_outcomes(["a"], [1], T0, Counter())
    old = {k: v for k, v in join.state(T0).items() if not k.startswith("joined")}
    restored = OutcomeJoin(3600)
    restored.restore(old)
    assert not restored.recently_joined and not restored.pending


def test_a_prediction_delivered_again_after_its_label_joined_is_not_held_again() -> None:
    join = OutcomeJoin(3600)
    _held(join, ["a"])
    join.add_outcomes(["a"], [1], T0, Counter())
    assert _held(join, ["a"]) == Counter(duplicate_prediction=1) and not join.pending
    assert join.again("m", ["a", "b"], np.array([T0, T0])).tolist() == [True, False]


def test_the_joins_of_one_replica_hold_max_pending_together() -> None:
    joins: list[OutcomeJoin] = []
    for i in range(3):
        joins.append(OutcomeJoin(3600, 10, lambda i=i: tuple(  # type: ignore[misc]
            sum(h[k] for j, h in enumerate(x.held() for x in joins) if j != i) for k in range(3))))  # fmt: skip
    assert _held(joins[0], [f"p{i}" for i in range(8)]) == Counter()  # 8 on one partition: the direct path holds them
    assert _held(joins[1], ["q0", "q1", "q2"]) == Counter(pending_state_full=1)  # 10 in all, as the direct path
    given_up: Counter[str] = Counter()
    joins[2].add_outcomes(["x"], [1], T0, given_up)
    assert given_up == Counter() and len(joins[2].orphans) == 1  # orphans have a bound of their own
