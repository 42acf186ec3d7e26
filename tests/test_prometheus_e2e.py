"""End to end: the daemon on the real broker, scraped every second by a real Prometheus that loads the shipped rules.

Biased traffic (selection rate 0.5 for men, 0.2 for women) gives Prometheus the fairness series with the values
pandas computes from the same rows; the change detectors' statistics cross their alarm level, so the paging
demographic parity and disparate impact alerts (with `for: 5s`) go pending, then firing, showing the gap with its
interval; a pair with equal rates raises nothing; a pair of small groups whose rates differ by chance trips the
seed's raw-value warning but pages nobody; and every query of the Grafana dashboard parses and returns data, but
the staged path's, which this direct daemon does not export.
"""

from __future__ import annotations

import math
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import orjson
import pandas as pd
import pytest
from broker_fixture import produce
from daemon_config import make_config
from daemon_fixture import kafka_config, sample, scrape
from dashboard_queries import panel_queries
from prometheus_client import CollectorRegistry
from prometheus_fixture import PrometheusServer, load_rule_generator, wait_until

from exporter.core.metric_table import METRICS
from exporter.daemon import Daemon
from exporter.devtools.embedded_broker import EmbeddedBroker
from exporter.health.counters import StageHealth

pytestmark = pytest.mark.prometheus

FAIRNESS_ALERTS = ("FairnessDemographicParityDrift", "FairnessDisparateImpactViolation")
SEED_WARNINGS = ("FairnessDemographicParityAboveThreshold", "FairnessDisparateImpactBelowThreshold")
BUCKET_SECONDS = 5
SMALL_PAIR = {"s1": (16, 40), "s2": (10, 40)}  # site: (selected, rows); 0.40 vs 0.25, Fisher's exact p = 0.23
UP = 'up{job="fairness-exporter"}'
STAGED_REGISTRY = CollectorRegistry()
StageHealth(STAGED_REGISTRY)
STAGED_SERIES = {s.name for family in STAGED_REGISTRY.collect() for s in family.samples}
"""The series only a staged replica exports (``kafka.stages: staged``)."""
DASHBOARD_VARIABLES = {"model_id": "m1", "attribute": "gender", "window": "1h", "instance": ".*",
                       "__rate_interval": "30s"}  # fmt: skip


def biased_rows() -> pd.DataFrame:
    """1000 men selected at 0.5, 1000 women at 0.2; young and old split every cell evenly (equal rates); 3 in 4
    rows labelled. Shuffled with a fixed seed."""
    cells = []
    for gender, positives, negatives in (("male", 500, 500), ("female", 200, 800)):
        for prediction, n in ((1, positives), (0, negatives)):
            i = np.arange(n)
            cells.append(pd.DataFrame({
                "gender": gender, "age": np.where(i % 2 == 0, "young", "old"), "prediction": prediction,
                # unlabelled (-1) every 4th row; otherwise the label agrees with the prediction 4 times in 5
                "label": np.where(i % 4 == 3, -1, np.where(i % 5 == 0, 1 - prediction, prediction)),
            }))  # fmt: skip
    rows = pd.concat(cells).sample(frac=1.0, random_state=7).reset_index(drop=True)
    # A small pair on its own attribute, `site`: 80 rows get a site, the others none (counted as `other`).
    rows["site"] = None
    for site, (selected, n) in SMALL_PAIR.items():
        chosen = rows.index[rows.site.isna() & (rows.prediction == 1)][:selected].append(
            rows.index[rows.site.isna() & (rows.prediction == 0)][: n - selected])
        rows.loc[chosen, "site"] = site
    return rows


def score(prediction: int, i: int) -> float:
    """A score whose prediction at the 0.5 threshold is ``prediction``, spread over the histogram's bins (the
    model emits scores, so auc_difference has data)."""
    return round(0.5 + 0.49 * (i % 7) / 6, 3) if prediction else round(0.49 * (i % 5) / 4, 3)


def site_payloads(rows: pd.DataFrame, ts: float, start: int = 0) -> list[bytes]:
    """The topic's events, with `site` among the attributes where the row has one (ids from p<start>)."""
    return [orjson.dumps({"model_id": "m1", "prediction_id": f"p{i}", "timestamp": ts, "prediction": int(r.prediction),
                          "score": score(int(r.prediction), i), "label": None if r.label < 0 else int(r.label),
                          "attributes": {"gender": r.gender, "age": r.age,
                                         **({"site": r.site} if isinstance(r.site, str) else {})}})
            for i, r in enumerate(rows.itertuples(), start)]  # fmt: skip


def side_traffic(now: float, n: int = 20) -> list[bytes]:
    """Events the windows never count: late ones, other models' and malformed ones (so health rates are > 0)."""
    old = now - 3 * 86400
    late = [orjson.dumps({"model_id": "m1", "prediction_id": f"late{i}", "timestamp": old, "prediction": 1,
                          "score": 0.9, "attributes": {"gender": "male", "age": "old"}}) for i in range(n)]  # fmt: skip
    foreign = [orjson.dumps({"model_id": "another-model", "timestamp": now})] * n
    return late + foreign + [b"{not json"] * n


class AlertRecorder(threading.Thread):
    """Polls /api/v1/alerts five times a second and records each alert's states in the order first seen."""

    def __init__(self, prometheus: PrometheusServer) -> None:
        super().__init__(name="alert-recorder", daemon=True)
        self.prometheus = prometheus
        self.states: dict[frozenset[tuple[str, str]], list[str]] = {}
        self.lock = threading.Lock()
        self.done = threading.Event()

    def run(self) -> None:
        while not self.done.is_set():
            try:
                alerts = self.prometheus.alerts()
            except (OSError, AssertionError):
                alerts = []
            with self.lock:
                for alert in alerts:
                    seen = self.states.setdefault(frozenset(alert["labels"].items()), [])
                    if alert["state"] not in seen:
                        seen.append(alert["state"])
            self.done.wait(0.2)

    def snapshot(self) -> dict[frozenset[tuple[str, str]], list[str]]:
        with self.lock:
            return {labels: list(states) for labels, states in self.states.items()}

    def states_of(self, alertname: str, **labels: str) -> list[list[str]]:
        """The state sequences of every alert `alertname` whose labels include `labels`."""
        wanted = {("alertname", alertname), *labels.items()}
        return [states for key, states in self.snapshot().items() if wanted <= key]


@dataclass
class Stack:
    daemon: Daemon
    prometheus: PrometheusServer
    alerts: AlertRecorder
    rows: pd.DataFrame
    bootstrap: str
    topic: str


@pytest.fixture(scope="module")
def stack(kafka_broker: EmbeddedBroker, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    """A daemon on its own topic, a Prometheus scraping it with the rules (every `for:` 5s), then the traffic."""
    topic = f"prometheus-e2e-{uuid.uuid4().hex[:8]}"
    kafka_broker.create_topic(topic, partitions=3)
    # every metric of the table, so every dashboard panel has data (a model emitting scores, for auc_difference);
    # 5-second buckets: the detectors take a step every 5 s (their alarm level follows from the bucket).
    every_metric = [{"name": name, "threshold": m.default_threshold}
                    for name, m in METRICS.items()]  # fmt: skip
    daemon = Daemon(make_config(**kafka_config(kafka_broker.bootstrap_servers, topic, "kafka-python",
                                               metrics=every_metric),
                                bucket=f"{BUCKET_SECONDS}s", unknown_values="other",
                                events={"score_threshold": 0.5},
                                protected_attributes=[{"name": "gender", "groups": ["male", "female"]},
                                                      {"name": "age", "groups": ["young", "old"]},
                                                      {"name": "site", "groups": list(SMALL_PAIR)}]))  # fmt: skip
    daemon.start()
    rules = load_rule_generator().rule_file(for_durations="5s", seed_interval=None)  # the seed rules every 1s too
    directory: Path = tmp_path_factory.mktemp("prometheus")
    try:
        with PrometheusServer(directory, [f"127.0.0.1:{daemon.port}"], rules=rules) as prometheus:
            wait_until(lambda: prometheus.values(UP) and set(prometheus.values(UP).values()) == {1.0}, 20,
                       "Prometheus to scrape the daemon")  # fmt: skip
            recorder = AlertRecorder(prometheus)
            recorder.start()
            rows = biased_rows()
            # nine rows in ten in one bucket, the rest in the next: a step is a bucket the events have left, so the
            # detectors step over the first part when the rest comes (the windows count both)
            first = len(rows) * 9 // 10
            produce(kafka_broker.bootstrap_servers, topic, site_payloads(rows.iloc[:first], time.time()))
            time.sleep(BUCKET_SECONDS + 0.5)
            produce(kafka_broker.bootstrap_servers, topic, site_payloads(rows.iloc[first:], time.time(), first))
            try:
                yield Stack(daemon, prometheus, recorder, rows, kafka_broker.bootstrap_servers, topic)
            finally:
                recorder.done.set()
                recorder.join(5)
    finally:
        daemon.stop()


def selection_rates(rows: pd.DataFrame, attribute: str) -> pd.Series:
    counts = rows.groupby(attribute).prediction.agg(["sum", "count"])
    return counts["sum"] / counts["count"]


def stored(stack: Stack, metric: str, **labels: str) -> float:
    """The one value Prometheus holds for metric{labels} (waiting for it to be scraped)."""
    selector = metric + "{" + ",".join(f'{k}="{v}"' for k, v in labels.items()) + "}"
    found = wait_until(lambda: stack.prometheus.values(selector), 30, f"{selector} in Prometheus")
    assert len(found) == 1, found
    return next(iter(found.values()))


def test_prometheus_stores_the_fairness_series_the_daemon_computes(stack: Stack) -> None:
    """The gap and ratio Prometheus stores are the daemon's (as it serves them) and pandas' on the same rows."""
    rates = selection_rates(stack.rows, "gender")
    pair = {"model_id": "m1", "attribute": "gender", "dimension": "male_vs_female", "window": "1h"}
    everything = f'model_subgroup_samples{{attribute="gender",subgroup="overall",window="1h"}} == {len(stack.rows)}'
    wait_until(lambda: stack.prometheus.values(everything), 30, "every event counted and scraped")

    dpd = stored(stack, "model_demographic_parity_difference", **pair)
    di = stored(stack, "model_disparate_impact_ratio", **pair)
    assert dpd == pytest.approx(abs(rates["male"] - rates["female"]), abs=1e-9)
    assert di == pytest.approx(rates.min() / rates.max(), abs=1e-9)
    assert (dpd, di) == (pytest.approx(0.3, abs=1e-9), pytest.approx(0.4, abs=1e-9))  # the design of the rows
    served = scrape(stack.daemon.port)
    labels = {**pair, "group_a": "male", "group_b": "female"}
    assert sample(served, "model_demographic_parity_difference", **labels) == dpd
    assert sample(served, "model_disparate_impact_ratio", **labels) == di
    for group in ("male", "female"):
        assert stored(stack, "model_positive_prediction_rate", model_id="m1", attribute="gender", window="1h",
                      subgroup=group) == pytest.approx(rates[group], abs=1e-9)  # fmt: skip
    up = stack.prometheus.values(UP)
    assert list(up.values()) == [1.0]
    assert ("instance", f"127.0.0.1:{stack.daemon.port}") in next(iter(up))


def firing(stack: Stack, alertname: str, **labels: str) -> bool:
    """Whether alerts `alertname` matching `labels` were seen and every one of them has reached firing."""
    sequences = stack.alerts.states_of(alertname, **labels)
    return bool(sequences) and all("firing" in states for states in sequences)


@pytest.mark.parametrize("alertname", FAIRNESS_ALERTS)
def test_fairness_alert_goes_pending_then_firing(stack: Stack, alertname: str) -> None:
    """The detector of men over women crosses the alarm level: one page per alert, with the gap per window."""
    selector = {"attribute": "gender", "dimension": "male_vs_female"}
    wait_until(lambda: firing(stack, alertname, **selector), 45, f"{alertname} firing")
    sequences = stack.alerts.states_of(alertname, **selector)
    assert sequences == [["pending", "firing"]], sequences
    (active,) = [a for a in stack.prometheus.alerts() if a["labels"]["alertname"] == alertname]
    assert active["state"] == "firing"
    assert active["labels"]["severity"] == "critical"
    assert active["labels"]["direction"] == "a_higher"  # men are selected more
    labels = ",".join(f'{k}="{active["labels"][k]}"' for k in ("model_id", "attribute", "dimension", "metric",
                                                                "direction"))  # fmt: skip
    assert list(stack.prometheus.values(f"fairness_detector_alarm{{{labels}}}").values()) == [1.0]
    (statistic,) = stack.prometheus.values(f"fairness_detector_statistic{{{labels}}}").values()
    assert float(active["value"]) == pytest.approx(statistic)
    description = active["annotations"]["description"]
    assert "1h: " in description and "24h: " in description and "95% interval" in description


def test_a_pair_with_equal_selection_rates_raises_no_alert(stack: Stack) -> None:
    wait_until(lambda: all(firing(stack, name, attribute="gender") for name in FAIRNESS_ALERTS), 45,
               "the gender alerts firing (so the rules have evaluated the age series too)")  # fmt: skip
    everything = f'model_subgroup_samples{{attribute="age",subgroup="overall",window="1h"}} == {len(stack.rows)}'
    wait_until(lambda: stack.prometheus.values(everything), 30, "every event counted and scraped")
    age = {"model_id": "m1", "attribute": "age", "dimension": "young_vs_old", "window": "1h"}
    assert stored(stack, "model_demographic_parity_difference", **age) == 0.0
    assert stored(stack, "model_disparate_impact_ratio", **age) == 1.0
    # Nothing pages, and nothing fires (a raw-value warning may go pending on a partly ingested window).
    on_age = {dict(key)["alertname"]: states for key, states in stack.alerts.snapshot().items()
              if ("attribute", "age") in key}  # fmt: skip
    assert not [name for name in on_age if name in FAIRNESS_ALERTS], on_age
    assert not [name for name, states in on_age.items() if "firing" in states], on_age


def test_a_small_pair_differing_by_chance_warns_by_the_seed_rule_but_pages_nobody(stack: Stack) -> None:
    """16 of 40 against 10 of 40: the raw gap (0.15) trips the seed's literal rules, not the detectors."""
    for name in SEED_WARNINGS:
        wait_until(lambda name=name: firing(stack, name, attribute="site"), 45, f"{name} on the small pair")
    wait_until(lambda: all(firing(stack, name, attribute="gender") for name in FAIRNESS_ALERTS), 45,
               "the gender pages (so the detectors have stepped over the small pair too)")  # fmt: skip
    pair = {"model_id": "m1", "attribute": "site", "dimension": "s1_vs_s2"}
    assert stored(stack, "model_demographic_parity_difference", **pair, window="1h") == pytest.approx(0.15)
    assert set(stack.prometheus.values('fairness_detector_alarm{attribute="site"}').values()) == {0.0}
    statistic = max(stack.prometheus.values('fairness_detector_statistic{attribute="site"}').values())
    assert statistic < stored(stack, "fairness_detector_alarm_level", model_id="m1")
    on_site = {dict(key)["alertname"]: dict(key)["severity"] for key in stack.alerts.snapshot()
               if ("attribute", "site") in key}  # fmt: skip
    assert on_site == dict.fromkeys(SEED_WARNINGS, "warning")


def test_every_dashboard_query_returns_data_from_prometheus(stack: Stack) -> None:
    """Every panel's PromQL, with the dashboard's variables set to the running daemon, parses and has series; the
    staged path's have none on this direct daemon (its start is not drawn as an ever older snapshot), and only they.

    `$__rate_interval` is 30s: fresh side traffic (late, foreign and malformed events) is consumed and scraped
    first, so every rate() window holds samples before and after it and no ratio is 0/0.
    """
    wait_until(lambda: stack.prometheus.values('model_true_positive_rate{attribute="gender",window="1h"}'), 30,
               "the labelled series")  # fmt: skip
    before = sum(stack.prometheus.values("fairness_exporter_events_late_total").values())
    produce(stack.bootstrap, stack.topic, side_traffic(time.time()))
    wait_until(lambda: stack.prometheus.values(f"fairness_exporter_events_late_total > {before}"), 30,
               "the late events scraped")  # fmt: skip
    at = time.time()
    queries = panel_queries(DASHBOARD_VARIABLES)
    assert queries, "the dashboard has no queries"
    empty, not_finite = [], []
    for title, expr in queries:
        body = stack.prometheus.get("/api/v1/query", query=expr, time=at)
        assert body.get("status") == "success", f"panel {title!r}: {expr}: {body}"
        result = body["data"]["result"]
        if not result:
            empty.append((title, expr))
        not_finite += [(title, expr, s) for s in result if not math.isfinite(float(s["value"][1]))]
    staged = [(title, expr) for title, expr in queries if any(name in expr for name in STAGED_SERIES)]
    assert staged and empty == staged, f"queries without data: {empty}"
    assert not_finite == [], f"queries with NaN/Inf values: {not_finite}"
