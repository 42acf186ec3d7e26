"""Windows slide in event time, late events are dropped and counted, and /metrics renders the snapshot."""

from __future__ import annotations

import re

import numpy as np
import orjson
import pandas as pd
import pytest
from daemon_config import event, make_config
from prometheus_client import CollectorRegistry, generate_latest

from exporter.config import parse_config
from exporter.core.evaluate import evaluate_many
from exporter.core.fairness import TP
from exporter.gate.fairness.audit import run_audit
from exporter.health.counters import Health
from exporter.serve.collector import SnapshotCollector
from exporter.serve.snapshot import Computer
from exporter.stream.state.fleet import Fleet

T0 = 1_800_000_000.0  # a bucket boundary: 2027-01-15T08:00:00Z


class Clock:
    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


class Harness:
    """Decoder + store + computer + collector on a fresh registry, driven by a fake clock."""

    def __init__(self, **config: object) -> None:
        self.config = make_config(**config)
        self.clock = Clock(T0)
        self.registry = CollectorRegistry()
        self.health = Health(self.registry)
        self.fleet = Fleet(self.config)
        (model,) = self.fleet.models.values()
        self.store, self.decoder = model.store, model.decoder
        self.computer = Computer(self.fleet, self.health, self.clock)
        self.registry.register(SnapshotCollector(lambda: self.computer.latest, "1s"))

    def feed(self, events: list[dict]) -> int:
        batch = self.decoder.decode([orjson.dumps(e) for e in events], self.clock.now)
        late = self.store.add(batch.timestamps, batch.codes, batch.predictions, batch.outcomes, self.clock.now)
        self.health.late.inc(late)
        return late

    def value(self, name: str, **labels: str) -> float | None:
        self.computer.compute()
        return self.registry.get_sample_value(name, {"model_id": "m1", **labels})


def group_events(gender: str, positives: int, total: int, ts: float, **kw: object) -> list[dict]:
    return [event(gender, prediction=int(i < positives), ts=ts, **kw) for i in range(total)]


def test_rates_and_gaps_per_window() -> None:
    h = Harness()
    h.feed(group_events("male", 40, 100, T0 - 30) + group_events("female", 25, 100, T0 - 30))
    labels = {"attribute": "gender", "window": "1h"}
    assert h.value("model_positive_prediction_rate", subgroup="male", **labels) == 0.4
    assert h.value("model_positive_prediction_rate", subgroup="overall", **labels) == 0.325
    assert h.value("model_subgroup_samples", subgroup="female", **labels) == 100
    pair = {**labels, "dimension": "male_vs_female", "group_a": "male", "group_b": "female"}
    assert abs(h.value("model_demographic_parity_difference", **pair) - 0.15) < 1e-12
    assert abs(h.value("model_disparate_impact_ratio", **pair) - 0.625) < 1e-12
    lower = h.value("model_disparate_impact_ratio_lower", **pair)
    upper = h.value("model_disparate_impact_ratio_upper", **pair)
    assert lower < 0.625 < upper <= 1.0
    assert h.value("model_comparison_insufficient_samples", metric="disparate_impact_ratio", **pair) == 0.0
    # no labels: equalised odds is insufficient, so it is absent rather than a made-up number
    assert h.value("model_equalised_odds_difference", **pair) is None
    assert h.value("model_comparison_insufficient_samples", metric="equalised_odds_difference", **pair) == 1.0


def test_window_slides_old_buckets_out() -> None:
    h = Harness()
    h.feed(group_events("male", 10, 10, T0 - 1800) + group_events("female", 0, 10, T0 - 1800))
    h.clock.now = T0 + 2 * 3600  # 2.5 h after those events
    h.feed(group_events("male", 5, 10, T0 + 2 * 3600 - 10) + group_events("female", 5, 10, T0 + 2 * 3600 - 10))
    one_h = {"attribute": "gender", "window": "1h", "subgroup": "male"}
    day = {**one_h, "window": "24h"}
    assert h.value("model_positive_prediction_rate", **one_h) == 0.5  # only the new events
    assert h.value("model_positive_prediction_rate", **day) == 0.75  # both batches
    assert h.value("model_subgroup_samples", **day) == 20
    h.clock.now = T0 + 27 * 3600  # everything has left even the 24h window
    assert h.value("model_subgroup_samples", **day) == 0
    assert h.value("model_positive_prediction_rate", **day) is None


def test_late_events_are_counted_and_excluded() -> None:
    h = Harness()
    late = h.feed(group_events("male", 1, 3, T0 - 24 * 3600 - 6 * 60) + group_events("male", 1, 2, T0 - 60))
    assert late == 3
    assert h.registry.get_sample_value("fairness_exporter_events_late_total") == 3
    assert h.value("model_subgroup_samples", attribute="gender", window="24h", subgroup="male") == 2
    # within the allowed lateness (5m) beyond the longest window: accepted into its bucket, not late
    assert h.feed(group_events("male", 1, 1, T0 - 24 * 3600 - 4 * 60)) == 0


def test_below_min_samples_a_comparison_is_insufficient() -> None:
    h = Harness()  # min_samples 5
    h.feed(group_events("male", 4, 4, T0) + group_events("female", 0, 20, T0))
    pair = {"attribute": "gender", "window": "1h", "dimension": "male_vs_female", "group_a": "male",
            "group_b": "female"}  # fmt: skip
    assert h.value("model_demographic_parity_difference", **pair) is None
    assert h.value("model_comparison_insufficient_samples", metric="demographic_parity_difference", **pair) == 1.0
    assert h.value("model_positive_prediction_rate", attribute="gender", window="1h", subgroup="male") == 1.0


def test_an_imprecise_value_is_exported_with_its_interval_and_evidence_and_the_limits_are_exported() -> None:
    # 100 per group, rates 0.40 vs 0.25: |d| = 0.15 with a half-width of about 0.13 against a 0.05 threshold: the
    # number, its interval and "inconclusive", never a blank (issue 20)
    h = Harness(metrics=[{"name": "demographic_parity_difference", "threshold": 0.05},
                         {"name": "equal_opportunity_difference", "threshold": 0.1}])
    h.feed(group_events("male", 40, 100, T0 - 30) + group_events("female", 25, 100, T0 - 30))
    pair = {"attribute": "gender", "window": "1h", "dimension": "male_vs_female", "group_a": "male",
            "group_b": "female"}  # fmt: skip
    assert h.value("model_demographic_parity_difference", **pair) == pytest.approx(0.15)
    lower = h.value("model_demographic_parity_difference_lower", **pair)
    upper = h.value("model_demographic_parity_difference_upper", **pair)
    assert lower is not None and upper is not None and lower < 0.05 < 0.15 < upper
    assert h.value("model_comparison_insufficient_samples", metric="demographic_parity_difference", **pair) == 0.0
    evidence = {state: h.value("model_comparison_evidence", metric="demographic_parity_difference", evidence=state,
                               **pair) for state in ("pass", "fail", "inconclusive")}  # fmt: skip
    assert evidence == {"pass": 0.0, "fail": 0.0, "inconclusive": 1.0}
    # no labels: equal opportunity has no value, is insufficient, and its evidence is inconclusive
    assert h.value("model_equal_opportunity_difference", **pair) is None
    assert h.value("model_comparison_insufficient_samples", metric="equal_opportunity_difference", **pair) == 1.0
    assert h.value("model_comparison_evidence", metric="equal_opportunity_difference", evidence="inconclusive",
                   **pair) == 1.0  # fmt: skip
    # thresholds and limits of every exported metric: the seed's three, and the configured new one, with the
    # severity the gate judges each by (none: exported, not configured)
    expected = {"demographic_parity_difference": (0.05, "blocking"), "equalised_odds_difference": (0.05, "none"),
                "disparate_impact_ratio": (0.8, "none"), "equal_opportunity_difference": (0.1, "blocking")}
    assert {m: h.value("fairness_threshold", metric=m, severity=s) for m, (_, s) in expected.items()} == \
        {m: t for m, (t, _) in expected.items()}  # fmt: skip
    assert h.value("fairness_threshold", metric="accuracy_difference", severity="none") is None
    assert h.value("fairness_min_samples") == 5


def test_the_evidence_follows_the_interval_against_the_configured_threshold() -> None:
    # 2,000 per group, 0.40 vs 0.25: the interval of 0.15 (about +-0.03) is wholly beyond 0.05 and within 0.5
    for threshold, state in ((0.05, "fail"), (0.5, "pass")):
        h = Harness(metrics=[{"name": "demographic_parity_difference", "threshold": threshold}])
        h.feed(group_events("male", 800, 2000, T0 - 30) + group_events("female", 500, 2000, T0 - 30))
        got = {s: h.value("model_comparison_evidence", attribute="gender", window="1h", dimension="male_vs_female",
                          group_a="male", group_b="female", metric="demographic_parity_difference", evidence=s)
               for s in ("pass", "fail", "inconclusive")}  # fmt: skip
        assert got == {s: float(s == state) for s in got}, threshold


def test_outcome_counters_are_monotonic_and_survive_the_window() -> None:
    h = Harness()
    h.feed(group_events("female", 3, 5, T0, label=1))
    h.clock.now = T0 + 30 * 3600
    h.feed(group_events("female", 1, 2, T0 + 30 * 3600, label=0))
    base = {"attribute": "gender", "subgroup": "female"}
    assert h.value("fairness_predictions_total", predicted="1", **base) == 4
    assert h.value("fairness_predictions_total", predicted="0", **base) == 3
    assert h.value("fairness_labelled_predictions_total", outcome="tp", **base) == 3
    assert h.value("fairness_labelled_predictions_total", outcome="fn", **base) == 2
    assert h.value("fairness_labelled_predictions_total", outcome="fp", **base) == 1
    assert h.value("model_subgroup_samples", attribute="gender", window="24h", subgroup="female") == 2


def test_daemon_numbers_equal_the_audit_gate_on_the_same_rows() -> None:
    rng = np.random.default_rng(7)
    n = 2000
    frame = pd.DataFrame({
        "gender": rng.choice(["male", "female"], n), "age": rng.choice(["young", "old"], n),
        "prediction": rng.integers(0, 2, n), "label": rng.integers(0, 2, n),
    })  # fmt: skip
    h = Harness(metrics=[{"name": m, "threshold": 0.5} for m in
                         ("demographic_parity_difference", "equalised_odds_difference")])  # fmt: skip
    h.feed([event(r.gender, r.age, int(r.prediction), ts=T0 - 5, label=int(r.label)) for r in frame.itertuples()])
    report = run_audit(h.config, frame)
    for r in report["results"]:
        a, b = r["groups"].split(" vs ")
        exported = h.value(f"model_{r['metric']}", attribute=r["attribute"], window="1h",
                           dimension=f"{a}_vs_{b}", group_a=a, group_b=b)  # fmt: skip
        assert exported == r["exact_value"]


def test_metrics_page_has_help_and_no_timestamps() -> None:
    h = Harness()
    h.feed(group_events("male", 10, 40, T0) + group_events("female", 10, 40, T0))
    h.computer.compute()
    page = generate_latest(h.registry).decode()
    assert "# HELP model_disparate_impact_ratio min/max of the two selection rates" in page
    assert "Computed every 1s" in page
    sample_lines = [line for line in page.splitlines() if line and not line.startswith("#")]
    assert sample_lines and not [line for line in sample_lines if re.search(r"\} \S+ \S+$", line)]


def test_unknown_values_count_in_their_attributes_unknown_row_and_everywhere_else() -> None:
    h = Harness()
    batch = h.decoder.decode([orjson.dumps(event("robot", "old", prediction=1, ts=T0 - 5)),
                              orjson.dumps(event("male", "old", prediction=0, ts=T0 - 5))], T0)  # fmt: skip
    h.store.add(batch.timestamps, batch.codes, batch.predictions, batch.outcomes, T0)
    # a delayed label for the "robot" prediction lands in gender's unknown row and in age's "old" row
    h.store.add_joined(batch.timestamps[:1], {k: v[:1] for k, v in batch.codes.items()}, np.array([TP]))
    window = h.store.layout.split(h.store.window_counts(T0)["1h"])
    assert window["gender"].tolist() == [[0, 1, 0, 0, 0, 0], [0, 0, 0, 0, 0, 0], [1, 0, 1, 0, 0, 0]]  # male, female, ?
    assert window["age"].tolist() == [[0, 0, 0, 0, 0, 0], [1, 1, 1, 0, 0, 0], [0, 0, 0, 0, 0, 0]]  # young, old, ?
    base = {"attribute": "gender", "window": "1h"}
    assert h.value("model_subgroup_unknown_samples", **base) == 1
    assert h.value("model_subgroup_samples", subgroup="overall", **base) == 2
    assert h.value("model_positive_prediction_rate", subgroup="overall", **base) == 0.5


def test_each_model_of_a_fleet_gets_the_numbers_of_its_own_evaluation() -> None:
    """The computation evaluates the models of alike settings in one pass: each model's numbers (values, intervals,
    simultaneous intervals, evidence with Holm or Bonferroni, worst comparisons) are those of evaluating it alone."""
    race, sex = {"name": "race", "groups": ["a", "b", "c"]}, {"name": "sex", "groups": ["f", "m"]}
    metrics = [{"name": "demographic_parity_difference", "threshold": 0.02},
               {"name": "false_positive_rate_ratio", "threshold": 0.9},
               {"name": "equalised_odds_difference", "threshold": 0.05}]  # fmt: skip
    models = [{"model_id": "m0", "protected_attributes": [race, sex], "metrics": metrics},
              {"model_id": "m1", "protected_attributes": [race, sex], "metrics": metrics},  # alike m0
              {"model_id": "m2", "protected_attributes": [race], "metrics": metrics, "min_samples": 400},
              {"model_id": "m3", "protected_attributes": [race, sex], "metrics": metrics[:1],
               "multiplicity": "bonferroni"}]  # fmt: skip
    config = parse_config({"kafka": {"topic": "p"}, "windows": ["1h", "24h"], "min_samples": 30, "models": models},
                          "fleet.yaml")  # fmt: skip
    fleet = Fleet(config)
    rng = np.random.default_rng(11)
    for k, monitored in enumerate(fleet.models.values()):
        n = 4000
        codes = {a.name: rng.integers(0, len(a.groups), n) for a in monitored.spec.attributes}
        shift = 0.05 * k * codes["race"]
        predictions = (rng.random(n) < 0.3 + shift).astype(np.int64)
        labels = np.where(rng.random(n) < 0.5, (rng.random(n) < 0.4 + shift).astype(np.int64), -1)
        monitored.store.add(rng.uniform(T0 - 80_000, T0, n), codes, predictions, labels, T0)
    snapshot = Computer(fleet, Health(CollectorRegistry()), Clock(T0)).compute()
    states = []
    for s, monitored in zip(snapshot.models, fleet.models.values(), strict=True):
        spec = monitored.spec
        thresholds = {m: t for m, t, _ in s.thresholds if m in spec.exported_metrics}
        alone = evaluate_many([(ev.attribute, np.vstack([ev.counts, ev.unknown])) for _, ev in s.evaluations],
                              spec.min_samples, spec.exported_metrics, spec.multiplicity, thresholds=thresholds)
        for (_, ev), own in zip(s.evaluations, alone, strict=True):
            assert ev.min_samples == spec.min_samples and ev.multiplicity == spec.multiplicity
            for name in ("selection_rate", "false_positive_rate_ci", "samples"):
                np.testing.assert_array_equal(getattr(ev.groups, name), getattr(own.groups, name))
            for metric, t in thresholds.items():
                for f in ("value", "lower", "upper", "half_width", "support"):
                    np.testing.assert_array_equal(getattr(ev.values(metric), f), getattr(own.values(metric), f))
                for f in ("lower", "upper"):
                    np.testing.assert_array_equal(getattr(ev.simultaneous.metrics[metric], f),
                                                  getattr(own.simultaneous.metrics[metric], f))  # fmt: skip
                np.testing.assert_array_equal(ev.evidence(metric, t), own.evidence(metric, t))
                for f in ("pair", "value", "lower", "upper", "judged"):
                    np.testing.assert_array_equal(getattr(ev.worst(metric), f), getattr(own.worst(metric), f))
                states.extend(ev.evidence(metric, t).tolist())
    assert {"pass", "fail", "inconclusive"} <= set(states)
