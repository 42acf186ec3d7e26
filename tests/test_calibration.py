"""Calibration within groups (issue 41): each group's expected calibration error over the score bins and
``calibration_difference``, the gap between two groups' ECE, in the gate, the daemon and backtest alike.

The oracle recomputes ECE from the raw rows with pandas (``pd.cut`` into the configured bins, a mean label and a mean
score per bin), cross-checked against scikit-learn's ``calibration_curve(strategy="uniform")``, whose bins are the
default ``score_buckets``. In the daemon 40% of the labels arrive late, through the labels topic: each waits with its
prediction's score, so the late label adds that score to its bin's sum.
"""

from __future__ import annotations

import threading
import uuid
from pathlib import Path

import numpy as np
import orjson
import pandas as pd
import pytest
from compas import RACE_GROUPS, compas_frame
from prometheus_client import CollectorRegistry
from sklearn.calibration import calibration_curve
from test_gate_daemon_agreement import T0, _close, _get, _parse, assert_the_page_shows_the_report

from exporter.backtest.replay import backtest
from exporter.config import Config, layout, layout_changes, parse_config
from exporter.core.fairness import Z_95
from exporter.core.scores import calibration, calibration_gap
from exporter.daemon import Daemon
from exporter.devtools.embedded_broker import EmbeddedBroker
from exporter.gate.fairness.audit import run_audit
from exporter.stream.kafka.client import SimpleRecord
from exporter.stream.state.window import WindowStore

BOUNDS = np.round(np.arange(1, 10) / 10, 1)  # the default score_buckets: scikit-learn's ten uniform bins
GROUPS = ["a", "b", "c"]


def _config(checkpoint: str | None = None, **kafka: str) -> Config:
    return parse_config({
        "model_id": "m1", "min_samples": 30, "windows": ["1h"],
        "protected_attributes": [{"name": "group", "groups": GROUPS}, {"name": "site", "groups": ["x", "y"]}],
        "metrics": [{"name": "demographic_parity_difference", "threshold": 0.05},
                    {"name": "calibration_difference", "threshold": 0.05},
                    {"name": "auc_difference", "threshold": 0.05}],
        "events": {"score_threshold": 0.5}, "listen": {"address": "127.0.0.1", "port": 0},
        **({"kafka": kafka} if kafka else {}), **({"checkpoint": {"path": checkpoint}} if checkpoint else {}),
    }, "calibration-config")  # fmt: skip


def _frame(n: int, seed: int) -> pd.DataFrame:
    """Scores over [0, 1]; group a calibrated, b over-confident (labels pulled to 0.5), c shifted down by 0.1."""
    rng = np.random.default_rng(seed)
    group = rng.choice(GROUPS, size=n, p=[0.5, 0.3, 0.2])
    score = rng.beta(2, 2, size=n)
    truth = np.select([group == "a", group == "b"], [score, 0.5 + 0.6 * (score - 0.5)], np.clip(score - 0.1, 0, 1))
    return pd.DataFrame({"model_id": "m1", "prediction_id": [f"p{i}" for i in range(n)],
                         "timestamp": T0 - 1800 + np.arange(n) * 1700 / n, "group": group,
                         "site": rng.choice(["x", "y"], size=n), "score": score,
                         "label": (rng.random(n) < truth).astype(int)})  # fmt: skip


def oracle_ece(rows: pd.DataFrame) -> float:
    """ECE from the raw rows: bins (0, 0.1], ..., (0.9, 1] (the first closed at 0), weighted mean |label - score|."""
    binned = rows.groupby(pd.cut(rows.score, np.r_[0.0, BOUNDS, 1.0], include_lowest=True), observed=True)
    per_bin = binned.agg(n=("label", "size"), label=("label", "mean"), score=("score", "mean"))
    prob_true, prob_pred = calibration_curve(rows.label, rows.score, n_bins=10, strategy="uniform")
    np.testing.assert_allclose(per_bin.label, prob_true, atol=1e-12)  # the same bins as scikit-learn's
    np.testing.assert_allclose(per_bin.score, prob_pred, atol=1e-12)
    return float((per_bin.n * (per_bin.label - per_bin.score).abs()).sum() / per_bin.n.sum())


def test_calibration_difference_is_the_oracles_in_the_gate_the_daemon_with_late_labels_and_backtest(
    tmp_path: Path,
) -> None:
    frame = _frame(6000, 41)
    config = _config(labels_topic="labels")
    events, labels, inline = _events(frame)
    (tmp_path / "events.jsonl").write_bytes(b"\n".join(inline) + b"\n")

    report = run_audit(config, frame)
    daemon = Daemon(config, registry=CollectorRegistry(), clock=lambda: T0)
    daemon.ingest.handle("predictions", 0, [SimpleRecord(e, i) for i, e in enumerate(events)])
    daemon.ingest.handle("labels", 0, [SimpleRecord(e, i) for i, e in enumerate(labels)])
    daemon.computer.compute()
    samples = _parse(daemon.metrics_page())
    assert assert_the_page_shows_the_report(samples, report, ("1h",)) == len(report["results"]) == 3 * (3 + 1)
    replayed = {(w["attribute"], w["metric"]): w for w in backtest(config, [tmp_path / "events.jsonl"])["worst"]}

    checked = 0
    for attribute in ("group", "site"):
        ece = {g: oracle_ece(rows) for g, rows in frame.groupby(attribute)}
        for group, value in ece.items():  # each group's ECE, in the report and on /metrics, with the same bounds
            shown = report["attributes"][attribute]["groups"][group]
            _close(shown["calibration_error"], value, (attribute, group))
            assert shown["calibration_error_ci"][0] <= value <= shown["calibration_error_ci"][1]
            for name, expected in (("", value), ("_lower", shown["calibration_error_ci"][0]),
                                   ("_upper", shown["calibration_error_ci"][1])):  # fmt: skip
                _close(_get(samples, "m1", f"model_score_calibration_error{name}", attribute=attribute, window="1h",
                            subgroup=group), expected, (attribute, group, name))  # fmt: skip
        key = (attribute, "calibration_difference")
        for r in (r for r in report["results"] if (r["attribute"], r["metric"]) == key):
            a, b = r["groups"].split(" vs ")
            _close(r["exact_value"], abs(ece[a] - ece[b]), r)
            checked += 1
        (worst,) = [w for w in report["worst"] if (w["attribute"], w["metric"]) == key]
        other = replayed[key]
        assert other["dimension"] == worst["dimension"]
        for mine, theirs in zip([worst["value"], *worst["ci_simultaneous"]],
                                [other["value"], *other["ci_simultaneous"]], strict=True):  # fmt: skip
            _close(theirs, mine, worst)
    assert checked == 4
    assert ece["x"] < 0.05 and oracle_ece(frame[frame.group == "b"]) > 0.05  # the groups differ as built


def _events(frame: pd.DataFrame) -> tuple[list[bytes], list[bytes], list[bytes]]:
    """The prediction events (40% without their label), the late labels, and every event with its label inline."""
    late = np.random.default_rng(7).random(len(frame)) < 0.4  # these labels come later, on the labels topic
    events = [orjson.dumps({"model_id": "m1", "prediction_id": r.prediction_id, "timestamp": r.timestamp,
                            "score": r.score, **({} if late[i] else {"label": r.label}),
                            "attributes": {"group": r.group, "site": r.site}})
              for i, r in enumerate(frame.itertuples())]  # fmt: skip
    labels = [orjson.dumps({"prediction_id": r.prediction_id, "label": r.label}) for r in frame[late].itertuples()]
    inline = [orjson.dumps({**orjson.loads(e), "label": int(y)}) for e, y in zip(events, frame.label, strict=True)]
    return events, labels, inline


def test_a_waiting_predictions_score_survives_a_checkpoint_for_its_late_label(tmp_path: Path) -> None:
    """Predictions wait for their labels across a restart: the labels read by the restored daemon add the scores
    the checkpoint kept, and every value and bound is the gate's."""
    frame = _frame(3000, 43)
    config = _config(str(tmp_path), labels_topic="labels")
    events, labels, _ = _events(frame)
    first = Daemon(config, registry=CollectorRegistry(), clock=lambda: T0)
    first.checkpointer.restore()
    first.ingest.handle("predictions", 0, [SimpleRecord(e, i) for i, e in enumerate(events)])
    first.checkpointer.write()
    second = Daemon(config, registry=CollectorRegistry(), clock=lambda: T0)
    second.checkpointer.restore()
    assert len(second.fleet.joins.pending) == len(labels) > 1000
    second.ingest.handle("labels", 0, [SimpleRecord(e, i) for i, e in enumerate(labels)])
    second.computer.compute()
    report = run_audit(config, frame)
    assert assert_the_page_shows_the_report(_parse(second.metrics_page()), report, ("1h",)) == len(report["results"])


def test_a_calibrating_models_state_survives_a_checkpoint_and_switching_it_on_is_a_layout_change() -> None:
    config = _config()
    windowing = config.windowing
    (model,) = config.models
    store = WindowStore(model, windowing)
    frame = _frame(500, 3)
    codes = {"group": frame.group.map(GROUPS.index).to_numpy(), "site": (frame.site == "y").to_numpy().astype(int)}
    store.add(frame.timestamp.to_numpy(), codes, (frame.score >= 0.5).to_numpy().astype(int), frame.label.to_numpy(),
              T0, scores=frame.score.to_numpy())  # fmt: skip
    again = WindowStore(model, windowing, threading.RLock())
    again.restore(store.state())
    (sums,) = again.window_labelled_sums(T0).values()
    assert sums[: len(GROUPS)].sum() == pytest.approx(frame.score.sum(), abs=1e-9)
    without = parse_config({**_raw_without_calibration()}, "x").models[0]
    change = layout_changes(layout(without, windowing), layout(model, windowing))
    assert change is not None and change[0] == "labelled_score_sums"


def _raw_without_calibration() -> dict:
    return {"model_id": "m1", "min_samples": 30, "windows": ["1h"],
            "protected_attributes": [{"name": "group", "groups": GROUPS}, {"name": "site", "groups": ["x", "y"]}],
            "metrics": [{"name": "demographic_parity_difference", "threshold": 0.05},
                        {"name": "auc_difference", "threshold": 0.05}],
            "events": {"score_threshold": 0.5}}  # fmt: skip


def _population_ece(miscalibration: float, grid: int = 200_000) -> float:
    """The true ECE over the ten bins of scores ~ Beta(2, 2) with P(label | s) = s + m (s - 0.5) clipped."""
    s = (np.arange(grid) + 0.5) / grid
    density = 6 * s * (1 - s)
    truth = np.clip(s + miscalibration * (s - 0.5), 0, 1)
    b = np.searchsorted(BOUNDS, s, side="left")
    mass = np.bincount(b, density) / grid
    gap = (np.bincount(b, density * truth) - np.bincount(b, density * s)) / grid
    return float(np.abs(gap).sum() / mass.sum())


@pytest.mark.parametrize(("sizes", "miscalibration"), [((300, 300), (0.0, 0.0)), ((2000, 400), (0.0, 0.0)),
                                                       ((1000, 1000), (0.0, 0.4)), ((5000, 800), (0.2, -0.3))])
def test_the_calibration_difference_interval_covers_the_true_gap_at_least_nominally(
    sizes: tuple[int, int], miscalibration: tuple[float, float],
) -> None:
    """Coverage of the 95% interval of |ECE a - ECE b| over 1,000 simulated pairs of groups: conservative by
    construction (a bound on the plug-in's upward bias, docs/auditor/numbers.md), measured at 0.95 or above."""
    rng = np.random.default_rng(sum(sizes))
    truth = abs(_population_ece(miscalibration[0]) - _population_ece(miscalibration[1]))
    covered, draws = 0, 1000
    for _ in range(draws):
        histogram = np.zeros((2, 10, 3))
        for g, (n, m) in enumerate(zip(sizes, miscalibration, strict=True)):
            s = rng.beta(2, 2, size=n)
            y = rng.random(n) < np.clip(s + m * (s - 0.5), 0, 1)
            b = np.searchsorted(BOUNDS, s, side="left")
            histogram[g, :, 0] = np.bincount(b[~y], minlength=10)
            histogram[g, :, 1] = np.bincount(b[y], minlength=10)
            histogram[g, :, 2] = np.bincount(b, s, minlength=10)
        _, lower, upper, _, _ = calibration_gap(histogram, np.array([0]), np.array([1]), Z_95)
        covered += int(lower[0] <= truth <= upper[0])
    assert covered / draws >= 0.95, covered / draws


def test_ece_of_a_histogram_is_the_weighted_mean_gap_and_empty_groups_have_none() -> None:
    rows = _frame(3000, 5)
    b = np.searchsorted(BOUNDS, rows.score, side="left")
    y = rows.label.to_numpy() == 1
    histogram = np.stack([np.bincount(b[~y], minlength=10), np.bincount(b[y], minlength=10),
                          np.bincount(b, rows.score, minlength=10)], axis=-1)[None]  # fmt: skip
    ece, bias, variance, n = calibration(np.concatenate([histogram, np.zeros_like(histogram)]))
    _close(float(ece[0]), oracle_ece(rows), "ece")
    assert int(n[0]) == 3000 and 0 < variance[0] < bias[0] ** 2 and np.isnan(ece[1])


def test_late_labels_take_their_predictions_scores_on_the_staged_path_too(kafka_broker: EmbeddedBroker) -> None:
    """The staged path's join partitions hold a waiting prediction with its score, and its JOINED row carries it to
    the counts task: each group's ECE, AUC and their gaps on the staged daemon's page are the gate's report. Before:
    the staged join kept no score, so every late label was missing from the score counts (and calibration was
    refused there)."""
    from test_stages import live, run, starts

    frame = _frame(3000, 43)
    group = f"staged-scores-{uuid.uuid4().hex[:8]}"
    config = _config(bootstrap_servers=kafka_broker.bootstrap_servers, topic="predictions", labels_topic="labels",
                     group_id=group, stages="staged",
                     internal_topics={"join": {"partitions": 2}, "counts": {"partitions": 2}})  # type: ignore[arg-type]
    report = run_audit(config, frame)
    events, labels, _ = _events(frame)
    daemon = Daemon(config, registry=CollectorRegistry(), clock=lambda: T0)
    stages = live(daemon)
    run(stages, kafka_broker.bootstrap_servers, [("predictions", [SimpleRecord(e, i) for i, e in enumerate(events)]),
                                                 ("labels", [SimpleRecord(e, i) for i, e in enumerate(labels)])],
        starts(stages))  # fmt: skip
    assert daemon.registry.get_sample_value("fairness_exporter_labels_joined_total") == len(labels) > 1000
    daemon.computer.compute()
    samples = _parse(daemon.metrics_page())
    assert assert_the_page_shows_the_report(samples, report, ("1h",)) == len(report["results"]) == 3 * (3 + 1)


def test_compas_deciles_calibration_per_race_and_sex_is_the_oracles_in_the_gate_and_the_daemon() -> None:
    """COMPAS' decile scores (decile / 10: one decile per default bin), its two-year recidivism as the label: each
    race's and sex's ECE and every calibration_difference equal the pandas / scikit-learn oracle to 1e-9, in the
    gate's report and on the daemon's /metrics."""
    frame = compas_frame()
    config = parse_config({
        "model_id": "compas", "min_samples": 30, "windows": ["1h"], "events": {"score_threshold": 0.45},
        "protected_attributes": [{"name": "race", "groups": RACE_GROUPS},
                                 {"name": "sex", "groups": ["Male", "Female"]}],
        "metrics": [{"name": "calibration_difference", "threshold": 0.05}],
        "listen": {"address": "127.0.0.1", "port": 0},
    }, "compas-calibration")  # fmt: skip
    events = [orjson.dumps({"model_id": "compas", "prediction_id": f"p{i}", "timestamp": T0 - 60, "score": r.score,
                            "label": int(r.label), "attributes": {"race": r.race, "sex": r.sex}})
              for i, r in enumerate(frame.itertuples())]  # fmt: skip
    report = run_audit(config, frame.drop(columns="prediction"))
    daemon = Daemon(config, registry=CollectorRegistry(), clock=lambda: T0)
    daemon.ingest.handle("predictions", 0, [SimpleRecord(e, i) for i, e in enumerate(events)])
    daemon.computer.compute()
    samples = _parse(daemon.metrics_page())
    assert assert_the_page_shows_the_report(samples, report, ("1h",)) == len(report["results"])
    checked = 0
    for attribute, groups in (("race", RACE_GROUPS), ("sex", ["Male", "Female"])):
        ece = {g: oracle_ece(frame[frame[attribute] == g]) for g in groups}
        for group, value in ece.items():
            _close(report["attributes"][attribute]["groups"][group]["calibration_error"], value, (attribute, group))
            _close(_get(samples, "compas", "model_score_calibration_error", attribute=attribute, window="1h",
                        subgroup=group), value, (attribute, group))  # fmt: skip
        gaps = [r for r in report["results"] if (r["attribute"], r["metric"]) == (attribute, "calibration_difference")]
        for r in gaps:
            a, b = r["groups"].split(" vs ")
            _close(r["exact_value"], abs(ece[a] - ece[b]), r)
            checked += 1
    assert checked == 3 + 1
