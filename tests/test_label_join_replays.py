"""The label join's ids joined within the horizon: kept through a checkpoint or a snapshot, so that a label delivered
again after a restart or a rebalance is a duplicate, and a prediction delivered again after its label joined is not
held again; and one bound shared by the joins of one replica (the staged path's join tasks)."""

from __future__ import annotations

from collections import Counter

import numpy as np

from exporter.stream.state.label_join import OutcomeJoin

T0 = 1_700_000_000.0


def _held(join: OutcomeJoin, ids: list[str], origins: list[int] | None = None) -> Counter[str]:
    given_up: Counter[str] = Counter()
    n = len(ids)
    join.add_predictions("m", ids, np.full(n, T0), np.ones(n, dtype=np.int64), np.zeros((n, 1), dtype=np.int64),
                         given_up, origins=None if origins is None else np.array(origins))  # fmt: skip
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


def test_a_prediction_is_sent_again_only_from_the_record_it_was_had_from_through_a_snapshot() -> None:
    """A counts task's replay names the source record the join had (skipped); another record of the same id and
    time (delivered twice, or a new prediction) is not one: the direct path's rules count it."""
    join = OutcomeJoin(3600)
    _held(join, ["a", "b"], [7, 9])
    join.add_outcomes(["a"], [1], T0, Counter())
    restored = OutcomeJoin(3600)
    restored.restore(join.state(T0))
    assert restored.again(["a", "a", "b", "b", "c"], np.array([7, 8, 9, 10, 7])).tolist() == [True, False, True,
                                                                                              False, False]
    assert _held(restored, ["b"], [10]) == Counter(duplicate_prediction=1)  # the later one replaces the one held
    assert restored.again(["b", "b"], np.array([9, 10])).tolist() == [True, True]  # either record sent again
    restored.expire(T0 + 7200, Counter())  # a's joined id forgotten; b waits (the restored labels' clock holds)
    assert not restored.recently_joined and set(restored.origins) == set(restored.pending) == {"b"}


def test_the_joins_of_one_replica_hold_max_pending_together() -> None:
    joins: list[OutcomeJoin] = []
    for i in range(3):
        joins.append(OutcomeJoin(3600, 10, lambda i=i: [x for j, x in enumerate(joins) if j != i]))  # type: ignore[misc]
    assert _held(joins[0], [f"p{i}" for i in range(8)]) == Counter()  # 8 on one partition: the direct path holds them
    assert _held(joins[1], ["q0", "q1", "q2"]) == Counter(pending_state_full=1)  # 10 in all, as the direct path
    given_up: Counter[str] = Counter()
    joins[2].add_outcomes(["x"], [1], T0, given_up)
    assert given_up == Counter() and len(joins[2].orphans) == 1  # orphans have a bound of their own


def test_the_joins_of_one_replica_forget_the_oldest_joined_id_of_them_all_never_the_one_just_joined() -> None:
    joins: list[OutcomeJoin] = []
    for i in range(2):
        joins.append(OutcomeJoin(3600, 3, lambda i=i: [joins[1 - i]]))  # type: ignore[misc]
    for join, pid in ((joins[0], "a0"), (joins[1], "b0"), (joins[0], "a1"), (joins[1], "b1")):
        _held(join, [pid], [len(pid)])
        join.add_outcomes([pid], [1], T0, Counter())  # one time for all: the order they joined in decides
    assert [list(j.recently_joined) for j in joins] == [["a1"], ["b0", "b1"]]
    assert set(joins[0].origins) == {"a1"}
