"""One vectorised pass for many metrics (:func:`compute_many`, :func:`fails_many`): each pair's numbers are those it
has alone, bit for bit, and a family of one comparison keeps its 95% intervals as its simultaneous ones."""

from __future__ import annotations

from functools import partial

import numpy as np

from exporter.backtest.series import stacked
from exporter.core.attributes import Attribute
from exporter.core.evaluate import evaluate_many
from exporter.core.fairness import N_COUNTS
from exporter.core.metric_table import COUNT_METRICS, METRICS, MetricValues, compute_many
from exporter.core.multiplicity import fails, fails_many
from exporter.core.scores import auc_gap

FIELDS = ("value", "lower", "upper", "half_width", "support")


def bits(v: MetricValues) -> list[bytes]:
    """Every number of the values as its bytes (so -0.0 differs from 0.0 and NaN equals NaN)."""
    return [np.ascontiguousarray(np.where(np.isnan(x), np.nan, x) if x.dtype.kind == "f" else x).tobytes()
            for x in (getattr(v, f) for f in FIELDS)]  # fmt: skip


def attribute(name: str, groups: int) -> Attribute:
    pairs = tuple((i, k) for i in range(groups) for k in range(i + 1, groups))
    return Attribute(name, (name,), tuple(f"{name}{i}" for i in range(groups)), pairs)


def test_one_pass_gives_every_request_the_numbers_it_has_alone() -> None:
    rng = np.random.default_rng(3)
    for weighted in (False, True):  # a proxy attribute's counts are posterior sums
        counts = rng.integers(0, 400, size=(7, N_COUNTS)).astype(np.float64 if weighted else np.int64)
        counts[2, 2:] = 0  # a group without labels: undefined rates and no ratio
        if weighted:
            counts *= rng.uniform(0.2, 1.0, size=counts.shape)
        histogram = np.stack([rng.integers(0, 40, size=(7, 6)), rng.integers(0, 40, size=(7, 6)),
                              rng.uniform(0, 20, size=(7, 6))], axis=-1).astype(np.float64)  # fmt: skip
        requests = []
        for name in METRICS:
            for comparisons in (1, 3, rng.integers(1, 12, size=9)):
                a, b = rng.integers(0, 7, size=9), rng.integers(0, 7, size=9)
                requests.append((METRICS[name], a, b, np.broadcast_to(np.asarray(comparisons, np.int64), (9,))))
        together = compute_many(counts, requests, histogram=histogram)
        assert len(together) == len(requests) == 3 * len(METRICS)
        for request, values in zip(requests, together, strict=True):
            alone = request[0].compute(counts, request[1], request[2], comparisons=request[3], histogram=histogram)
            assert bits(values) == bits(alone), request[0].name
        # and a score metric's numbers are its gap function's, at the quantile of each pair's family
        (values,) = compute_many(counts, [requests[-6]], histogram=histogram)
        assert METRICS["auc_difference"] is requests[-6][0]
        direct = auc_gap(histogram, requests[-6][1], requests[-6][2], 1.959963984540054)
        assert np.allclose(values.value, direct[0], equal_nan=True)


def test_holm_of_all_metrics_at_once_fails_what_each_fails_alone() -> None:
    rng = np.random.default_rng(5)
    counts = np.concatenate([rng.integers(200, 2000, size=(5, 2)), rng.integers(50, 900, size=(5, 4))], axis=1)
    counts[:, 0] = (counts[:, 0] * np.linspace(0.4, 1.6, 5)).astype(np.int64)  # unequal selection rates
    attr = attribute("a", 5)
    pairs = np.array(attr.pairs)
    (ev,) = evaluate_many([(attr, counts)], 30, COUNT_METRICS, "holm")
    assert ev.simultaneous is not None
    family = np.zeros(len(pairs), dtype=np.int64)
    thresholds = {m: METRICS[m].default_threshold for m in COUNT_METRICS}
    judged = {m: ev.sufficient(m) for m in COUNT_METRICS}
    compute = partial(compute_many, counts)
    together = fails_many(thresholds, "holm", compute, pairs, judged, family, ev.simultaneous.metrics)
    some = 0
    for m, t in thresholds.items():
        alone = fails(m, t, "holm", compute, pairs, judged[m], family, ev.simultaneous.metrics[m])
        assert np.array_equal(together[m, t], alone), m
        some += int(alone.sum())
    assert 0 < some < len(pairs) * len(thresholds)  # some fail, some do not: Holm's steps ran


def test_a_family_of_one_comparison_keeps_its_95_intervals() -> None:
    """K <= 1 judged comparisons: 95%/K is 95%, so the simultaneous pass is skipped; its numbers are those the pass
    computes (95%/1) bit for bit, while a family of K > 1 has its own, wider."""
    two, three = attribute("sex", 2), attribute("race", 3)
    counts_two = np.array([[700, 300, 150, 60, 80, 40], [500, 500, 120, 90, 100, 60]])
    # race: only groups 0 and 1 reach min_samples: one of its three comparisons is judged
    counts_three = np.array([[700, 300, 150, 60, 80, 40], [520, 480, 120, 90, 100, 60], [3, 4, 1, 1, 1, 1]])
    four = attribute("age", 4)
    counts_four = np.array([[700, 300, 150, 60, 80, 40], [520, 480, 120, 90, 100, 60], [400, 600, 90, 80, 120, 70],
                            [300, 200, 60, 50, 60, 30]])  # fmt: skip
    evaluations = evaluate_many([(two, counts_two), (three, counts_three), (four, counts_four)], 30, COUNT_METRICS,
                                "holm")  # fmt: skip
    for ev, counts in zip(evaluations, (counts_two, counts_three, counts_four), strict=True):
        assert ev.simultaneous is not None
        a, b = np.array(ev.attribute.pairs).T
        for name in COUNT_METRICS:
            judged = int(ev.sufficient(name).sum())
            wide = ev.simultaneous.metrics[name]
            recomputed = METRICS[name].compute(counts, a, b, comparisons=max(judged, 1))
            assert bits(wide) == bits(recomputed), (ev.attribute.name, name)
            if judged <= 1:
                assert bits(wide) == bits(ev.values(name)), (ev.attribute.name, name)
                assert bits(wide) == bits(METRICS[name].compute(counts, a, b, comparisons=1))
            else:
                v = ev.values(name)
                ok = ev.sufficient(name)
                assert (wide.upper[ok] - wide.lower[ok] > v.upper[ok] - v.lower[ok]).any(), name
    assert int(evaluations[1].sufficient("demographic_parity_difference").sum()) == 1


def test_an_evaluation_without_worsts_has_every_other_number_of_the_full_one() -> None:
    """``worsts=False`` (backtest's every step but the last) leaves out the worst comparisons and defers the
    simultaneous intervals until a fail is judged under a multiplicity rule; every comparison, interval and evidence
    is the same, and the deferred intervals are the full evaluation's bit for bit, in one family or in three
    (backtest's stacked steps)."""
    rng = np.random.default_rng(8)
    for families in (1, 3):
        attr = attribute("race", 4)
        attr = stacked(attr, families) if families > 1 else attr
        counts = np.concatenate([rng.integers(300, 900, size=(4 * families, 2)),
                                 rng.integers(40, 300, size=(4 * families, 4))], axis=1)  # fmt: skip
        counts[::4, 0] //= 3  # each step's first group is selected less: some comparisons fail
        for multiplicity in ("holm", "bonferroni", "none"):
            (full,) = evaluate_many([(attr, counts)], 30, COUNT_METRICS, multiplicity, families=families)
            (lean,) = evaluate_many([(attr, counts)], 30, COUNT_METRICS, multiplicity, families=families,
                                    worsts=False)  # fmt: skip
            assert full.worsts and not lean.worsts
            assert lean.simultaneous is None and lean.deferred == (multiplicity != "none")
            assert full.simultaneous is not None
            for name in COUNT_METRICS:
                assert bits(lean.values(name)) == bits(full.values(name)), name
                threshold = METRICS[name].default_threshold
                assert lean.evidence(name, threshold).tolist() == full.evidence(name, threshold).tolist(), name
                if lean.deferred:
                    deferred = lean._simultaneous(name)
                    assert deferred is not None
                    assert bits(deferred) == bits(full.simultaneous.metrics[name]), name
            evidence = [e for name in COUNT_METRICS for e in full.evidence(name, METRICS[name].default_threshold)]
            assert "fail" in evidence
            if multiplicity != "none":  # the rule changed some 95% fails: the deferred intervals were used
                alone = [e for name in COUNT_METRICS
                         for e in evaluate_many([(attr, counts)], 30, [name], "none", families=families)[0]
                         .evidence(name, METRICS[name].default_threshold)]  # fmt: skip
                assert alone.count("fail") > evidence.count("fail")
