"""The fleet-wide recording rules: the counters of daemons that each counted part of a model's events, summed by
the shipped rules, give the values one daemon computes over all the events.

With ``kafka.stages: staged`` a model's counters move with the model: after a rebalance its old owner's series stop
and its new owner's go on, and only the rules' sum over replicas covers the whole hour (two direct replicas in one
group no longer share a topic: tests/test_direct_replicas.py). Here two daemons each read one part of the events
(their own topic), like the old and the new owner of one model. Each part gets different selection rates, so the
daemons' own rates differ from the fleet's: only summing numerators and denominators across daemons (not averaging
their rates) gives the right answer. The recording rules are checked exactly with `promtool test rules` on the
counters the daemons expose, and end to end with a real Prometheus scraping both, where `increase()`
extrapolation makes them approximate.
"""

from __future__ import annotations

import subprocess
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
import yaml
from broker_fixture import produce
from daemon_config import make_config
from daemon_fixture import kafka_config, payloads, sample, scrape
from prometheus_fixture import JOB, PrometheusServer, load_rule_generator, wait_until
from tooling import require_binary

from exporter.daemon import Daemon
from exporter.devtools.embedded_broker import EmbeddedBroker

pytestmark = pytest.mark.prometheus

GROUPS = {"gender": ["male", "female"], "age": ["young", "old"]}
# Per partition: events, and the selection rates of men and women in it.
PARTITIONS = ((900, 0.7, 0.3), (600, 0.45, 0.35), (500, 0.2, 0.1))
COUNTERS = ("fairness_predictions_total", "fairness_labelled_predictions_total")
COUNTER_SERIES = sum(map(len, GROUPS.values())) * 6  # per replica: predicted 0/1 and tp/fp/tn/fn per subgroup
WINDOWS = ("1h", "24h")
CLIENT_LIBRARY = "kafka-python"

generate = load_rule_generator()


def new_daemon(bootstrap: str, topic: str, **kafka: object) -> Daemon:
    """A daemon (not started) with the shared test config, these `kafka:` settings changed."""
    base = kafka_config(bootstrap, topic, CLIENT_LIBRARY)
    return Daemon(make_config(**{**base, "kafka": {**base["kafka"], **kafka}}))


def partitioned_rows(seed: int = 17) -> pd.DataFrame:
    """Events with a `partition` column; the selection rates differ per partition, 30% of rows are unlabelled."""
    rng = np.random.default_rng(seed)
    frames = []
    for partition, (n, male_rate, female_rate) in enumerate(PARTITIONS):
        gender = rng.choice(GROUPS["gender"], n)
        prediction = (rng.random(n) < np.where(gender == "male", male_rate, female_rate)).astype(int)
        correct = rng.random(n) < 0.8
        label = np.where(rng.random(n) < 0.3, -1, np.where(correct, prediction, 1 - prediction))
        frames.append(pd.DataFrame({"partition": partition, "gender": gender, "age": rng.choice(GROUPS["age"], n),
                                    "prediction": prediction, "label": label}))  # fmt: skip
    return pd.concat(frames, ignore_index=True)


def counts(rows: pd.DataFrame, attribute: str) -> pd.DataFrame:
    """Per subgroup of `attribute`: predictions by class (n1, n0) and labelled outcomes (tp, fp, tn, fn)."""
    labelled = rows.label >= 0
    by = rows.assign(n1=rows.prediction == 1, n0=rows.prediction == 0,
                     tp=labelled & (rows.prediction == 1) & (rows.label == 1),
                     fp=labelled & (rows.prediction == 1) & (rows.label == 0),
                     tn=labelled & (rows.prediction == 0) & (rows.label == 0),
                     fn=labelled & (rows.prediction == 0) & (rows.label == 1))  # fmt: skip
    table = by.groupby(attribute)[["n1", "n0", "tp", "fp", "tn", "fn"]].sum().astype(int)
    return table.reindex(GROUPS[attribute], fill_value=0)


def selection_rates(rows: pd.DataFrame, attribute: str) -> pd.Series:
    c = counts(rows, attribute)
    return c.n1 / (c.n1 + c.n0)


def counter_samples(port: int) -> dict[tuple[str, str, str, str], float]:
    """One replica's outcome counters, keyed by (metric, attribute, subgroup, predicted or outcome)."""
    found = {}
    for (name, labels), value in scrape(port).items():
        if name in COUNTERS:
            d = dict(labels)
            found[(name, d["attribute"], d["subgroup"], d.get("predicted") or d["outcome"])] = value
    return found


def expected_counters(rows: pd.DataFrame) -> dict[tuple[str, str, str, str], float]:
    """What counter_samples() should give for a daemon that counted exactly these rows."""
    expected = {}
    for attribute in GROUPS:
        for subgroup, c in counts(rows, attribute).iterrows():
            for predicted, column in (("1", "n1"), ("0", "n0")):
                expected[(COUNTERS[0], attribute, subgroup, predicted)] = float(c[column])
            for outcome in ("tp", "fp", "tn", "fn"):
                expected[(COUNTERS[1], attribute, subgroup, outcome)] = float(c[outcome])
    return expected


@dataclass
class Fleet:
    replicas: list[Daemon]
    single: Daemon
    rows: pd.DataFrame
    partitions: list[frozenset[int]]
    prometheus: PrometheusServer

    def instance(self, daemon: Daemon) -> str:
        return f"127.0.0.1:{daemon.port}"


PARTS = (frozenset({0}), frozenset({1, 2}))
"""The partitions of PARTITIONS each of the two daemons counts (from a topic of its own)."""


@pytest.fixture(scope="module")
def fleet(kafka_broker: EmbeddedBroker, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    """Two daemons that each count part of the events (and one daemon reading everything), a Prometheus scraping
    the two with the shipped rules; the events are produced only after it has scraped their zero counters."""
    bootstrap = kafka_broker.bootstrap_servers
    topic = f"scale-out-{uuid.uuid4().hex[:8]}"
    kafka_broker.create_topic(topic, partitions=len(PARTITIONS))
    for i, part in enumerate(PARTS):
        kafka_broker.create_topic(f"{topic}-{i}", partitions=len(part))
    replicas = [new_daemon(bootstrap, f"{topic}-{i}", group_id=f"g-{topic}-{i}") for i in range(len(PARTS))]
    single = new_daemon(bootstrap, topic, group_id=f"single-{topic}")  # manual assignment of every partition
    daemons = [*replicas, single]
    try:
        for d in daemons:
            d.start()
        targets = [f"127.0.0.1:{d.port}" for d in replicas]
        with PrometheusServer(tmp_path_factory.mktemp("prometheus"), targets, rules=generate.rule_file()) as prom:
            zeros = "fairness_predictions_total == 0 or fairness_labelled_predictions_total == 0"
            wait_until(
                lambda: len(prom.values(zeros)) == len(targets) * COUNTER_SERIES,
                20,
                "every replica's zero counters scraped (so increase() sees them start at 0)",
            )
            rows = partitioned_rows()
            produce(bootstrap, topic, payloads(rows, time.time()), partition=lambda i, _: int(rows.partition[i]))
            for i, part in enumerate(PARTS):
                _produce_part(bootstrap, f"{topic}-{i}", rows[rows.partition.isin(part)], sorted(part))
            yield Fleet(replicas, single, rows, list(PARTS), prom)
    finally:
        for daemon in daemons:
            daemon.stop()


def _produce_part(bootstrap: str, topic: str, rows: pd.DataFrame, partitions: list[int]) -> None:
    """The rows to the topic of one daemon, each row's partition of PARTITIONS to its index among ``partitions``."""
    where = [partitions.index(int(p)) for p in rows.partition]
    produce(bootstrap, topic, payloads(rows, time.time()), partition=lambda j, _: where[j])


def _consumed(daemon: Daemon) -> float:
    return sample(scrape(daemon.port), "fairness_exporter_events_consumed_total") or 0.0


def _all_counted(fleet: Fleet) -> None:
    """Wait until the replicas together, and the single daemon, consumed and counted every event."""
    n = len(fleet.rows)
    wait_until(lambda: sum(map(_consumed, fleet.replicas)) == n and _consumed(fleet.single) == n, 60,
               f"{n} events consumed by the replicas together and by the single daemon")  # fmt: skip
    wait_until(lambda: all(map(_counted, (*fleet.replicas, fleet.single))), 10, "the next computation's counters")


def _counted(daemon: Daemon) -> bool:
    """Whether the daemon's exposed counters include every event it consumed (once per attribute)."""
    predictions = sum(v for k, v in counter_samples(daemon.port).items() if k[0] == COUNTERS[0])
    return predictions == len(GROUPS) * _consumed(daemon)


def test_each_daemon_counts_its_part_and_the_single_daemon_everything(fleet: Fleet) -> None:
    _all_counted(fleet)
    for replica, partitions in zip(fleet.replicas, fleet.partitions, strict=True):
        mine = fleet.rows[fleet.rows.partition.isin(partitions)]
        assert _consumed(replica) == len(mine)
        assert counter_samples(replica.port) == expected_counters(mine)
    assert counter_samples(fleet.single.port) == expected_counters(fleet.rows)


def fleet_values(rows: pd.DataFrame, window: str) -> list[tuple[str, dict[str, str], float]]:
    """(recorded series, its labels besides job and model_id, value) of every recording rule, from pandas."""
    values = []
    for attribute in GROUPS:
        c = counts(rows, attribute)
        rate = c.n1 / (c.n1 + c.n0)
        # the other rates of the core, as PromQL divides the summed counts
        rates = {"true_positive_rate": c.tp / (c.tp + c.fn), "false_positive_rate": c.fp / (c.fp + c.tn),
                 "precision": c.tp / (c.tp + c.fp), "accuracy": (c.tp + c.tn) / (c.tp + c.fp + c.tn + c.fn),
                 "false_negative_rate": c.fn / (c.fn + c.tp), "true_negative_rate": c.tn / (c.tn + c.fp),
                 "negative_predictive_value": c.tn / (c.tn + c.fn), "false_discovery_rate": c.fp / (c.fp + c.tp),
                 "false_omission_rate": c.fn / (c.fn + c.tn)}
        for subgroup in GROUPS[attribute]:
            at = {"attribute": attribute, "subgroup": subgroup}
            for predicted, column in (("1", "n1"), ("0", "n0")):
                values.append((f"model_attribute_subgroup:fairness_predictions:increase{window}",
                               {**at, "predicted": predicted}, float(c.loc[subgroup, column])))  # fmt: skip
            for outcome in ("tp", "fp", "tn", "fn"):
                values.append((f"model_attribute_subgroup:fairness_labelled_predictions:increase{window}",
                               {**at, "outcome": outcome}, float(c.loc[subgroup, outcome])))  # fmt: skip
            values.append((f"model_attribute_subgroup:fairness_selection_rate:ratio_{window}", at,
                           float(rate[subgroup])))  # fmt: skip
            values += [(f"model_attribute_subgroup:fairness_{name}:ratio_{window}", at, float(r[subgroup]))
                       for name, r in rates.items()]  # fmt: skip
        spread = {name: float(r.max() - r.min()) for name, r in rates.items()}
        values += [
            (f"model_attribute:fairness_demographic_parity_difference:max_minus_min_{window}",
             {"attribute": attribute}, float(rate.max() - rate.min())),
            (f"model_attribute:fairness_disparate_impact_ratio:min_over_max_{window}",
             {"attribute": attribute}, float(rate.min() / rate.max())),
            (f"model_attribute:fairness_equalised_odds_difference:max_minus_min_{window}", {"attribute": attribute},
             max(spread["true_positive_rate"], spread["false_positive_rate"])),
            (f"model_attribute:fairness_equal_opportunity_difference:max_minus_min_{window}",
             {"attribute": attribute}, spread["true_positive_rate"]),
            (f"model_attribute:fairness_false_positive_rate_difference:max_minus_min_{window}",
             {"attribute": attribute}, spread["false_positive_rate"]),
            (f"model_attribute:fairness_predictive_parity_difference:max_minus_min_{window}",
             {"attribute": attribute}, spread["precision"]),
            (f"model_attribute:fairness_accuracy_difference:max_minus_min_{window}",
             {"attribute": attribute}, spread["accuracy"]),
            (f"model_attribute:fairness_negative_predictive_value_difference:max_minus_min_{window}",
             {"attribute": attribute}, spread["negative_predictive_value"]),
        ]  # fmt: skip
        ratios = ("false_positive_rate", "false_negative_rate", "true_negative_rate", "negative_predictive_value",
                  "false_discovery_rate", "false_omission_rate")
        values += [(f"model_attribute:fairness_{name}_ratio:min_over_max_{window}", {"attribute": attribute},
                    float(rates[name].min() / rates[name].max())) for name in ratios]  # fmt: skip
    return values


def _selector(labels: dict[str, str]) -> str:
    return ",".join(f'{k}="{v}"' for k, v in labels.items())


def _recording_rule_test(fleet: Fleet) -> dict[str, Any]:
    """A promtool test: each replica's counters as scraped (0 for two minutes, then their value), and every
    recording rule's value at 60m as pandas computes it from all the rows (promtool compares floats exactly)."""
    common = {"job": JOB, "model_id": "m1"}
    series = []
    for replica in fleet.replicas:
        for (name, attribute, subgroup, key), value in sorted(counter_samples(replica.port).items()):
            labels = {**common, "instance": fleet.instance(replica), "attribute": attribute, "subgroup": subgroup,
                      "predicted" if name == COUNTERS[0] else "outcome": key}  # fmt: skip
            series.append({"series": f"{name}{{{_selector(labels)}}}", "values": f"0 0 {value:.0f}+0x60"})
        # the recording rules read min_samples from the daemon's config, as each replica exports it
        min_samples = sample(scrape(replica.port), "fairness_min_samples", model_id="m1")
        labels = {**common, "instance": fleet.instance(replica)}
        series.append({"series": f"fairness_min_samples{{{_selector(labels)}}}", "values": f"{min_samples:.0f}+0x62"})
    expected: dict[str, list[dict[str, Any]]] = {}
    for window in WINDOWS:
        for record, labels, value in fleet_values(fleet.rows, window):
            expected.setdefault(record, []).append(
                {"labels": f"{record}{{{_selector({**common, **labels})}}}", "value": value}
            )
    return {"rule_files": ["rules.yaml"], "evaluation_interval": "1m",
            "tests": [{"name": "two replicas' counters give the fleet-wide values", "interval": "1m",
                       "input_series": series,
                       "promql_expr_test": [{"expr": record, "eval_time": "60m", "exp_samples": samples}
                                            for record, samples in expected.items()]}]}  # fmt: skip


def test_recording_rules_over_both_replicas_equal_one_daemon_over_all_events(fleet: Fleet, tmp_path: Path) -> None:
    """promtool evaluates the shipped recording rules on the replicas' scraped counters: the exact values pandas
    (and the single daemon reading every partition) compute from all the rows."""
    promtool = require_binary("promtool")
    _all_counted(fleet)
    single = scrape(fleet.single.port)
    for attribute, (a, b) in GROUPS.items():
        rate = selection_rates(fleet.rows, attribute)
        pair = {"model_id": "m1", "attribute": attribute, "window": "1h", "dimension": f"{a}_vs_{b}",
                "group_a": a, "group_b": b}  # fmt: skip
        assert sample(single, "model_demographic_parity_difference", **pair) == pytest.approx(
            rate.max() - rate.min(), abs=1e-12
        )
        assert sample(single, "model_disparate_impact_ratio", **pair) == pytest.approx(
            rate.min() / rate.max(), abs=1e-12
        )
    # Each replica's own rates differ from the fleet's: a rule that averaged them instead of summing the counts
    # would fail here.
    own = [selection_rates(fleet.rows[fleet.rows.partition.isin(p)], "gender") for p in fleet.partitions]
    assert (sum(own) / len(own) - selection_rates(fleet.rows, "gender")).abs().max() > 0.01

    (tmp_path / "rules.yaml").write_text(yaml.safe_dump(generate.rule_file(), sort_keys=False))
    (tmp_path / "fleet.test.yaml").write_text(yaml.safe_dump(_recording_rule_test(fleet), sort_keys=False))
    result = subprocess.run([promtool, "test", "rules", "fleet.test.yaml"], cwd=tmp_path, capture_output=True,
                            text=True, timeout=120, check=False)  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr


def test_a_real_prometheus_scraping_both_replicas_records_the_fleet_wide_values(fleet: Fleet) -> None:
    """The same rules in a real Prometheus scraping both replicas: the summed counters are exact, every recorded
    series is there, and the rates and gaps agree to 0.02. Not exactly: increase() extrapolates each replica's
    counters from its last sample to the evaluation time (up to a scrape interval further, while the counters
    started at 0 only seconds ago), by a factor that differs between replicas; measured errors are ~0.005."""
    _all_counted(fleet)
    prom = fleet.prometheus
    total = f'sum without (instance, pod) (fairness_predictions_total{{job="{JOB}"}})'
    wait_until(lambda: sum(prom.values(total).values()) == len(GROUPS) * len(fleet.rows), 20,
               "the final counters scraped")  # fmt: skip
    raw = {(dict(k)["attribute"], dict(k)["subgroup"], dict(k)["predicted"]): v for k, v in prom.values(total).items()}
    assert raw == {
        (labels["attribute"], labels["subgroup"], labels["predicted"]): value
        for record, labels, value in fleet_values(fleet.rows, "1h")
        if record == "model_attribute_subgroup:fairness_predictions:increase1h"
    }

    expected = {frozenset({"__name__": record, "job": JOB, "model_id": "m1", **labels}.items()): value
                for window in WINDOWS for record, labels, value in fleet_values(fleet.rows, window)}  # fmt: skip
    recorded = '{__name__=~"model_attribute(_subgroup)?:fairness_.+"}'
    mismatches: list[object] = []

    def agrees() -> bool:
        got = prom.values(recorded)
        mismatches[:] = [("missing or extra", sorted(map(sorted, got.keys() ^ expected.keys())))] if (
            got.keys() != expected.keys()) else []  # fmt: skip
        for key in expected.keys() & got.keys():
            want, name = expected[key], dict(key)["__name__"]
            # counts: extrapolated up, never down (the counters started at 0); ratios: close
            ok = want <= got[key] <= 1.25 * want if ":increase" in name else abs(got[key] - want) <= 0.02
            if not ok:
                mismatches.append((sorted(key), want, got[key]))
        return not mismatches

    try:
        wait_until(agrees, 20, "recorded fleet-wide values")
    except AssertionError as exc:
        raise AssertionError(f"{exc}: {mismatches}") from None
