"""Scale-out: two daemons in one consumer group share a topic's partitions, and the shipped recording rules, summing
their counters, give the fleet-wide values one daemon computes over all the events.

Each partition gets different selection rates, so the replicas' own rates differ from the fleet's: only summing
numerators and denominators across replicas (not averaging their rates) gives the right answer. The recording
rules are checked exactly with `promtool test rules` on the counters the replicas expose, and end to end with a
real Prometheus scraping both replicas, where `increase()` extrapolation makes them approximate. The last tests
change the group's membership after events were counted (scale-up, then scale-down): every event is still counted
exactly once across the fleet.
"""

from __future__ import annotations

import contextlib
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
CLIENT_LIBRARY = "kafka-python"  # the default; GROUP_CLIENT is in its setting names
# Tansu holds a new member's JoinGroup for about session_timeout_ms / 2: 6 s keeps a rebalance near 3 s.
GROUP_CLIENT = {"reconnect_backoff_max_ms": 500, "session_timeout_ms": 6000, "heartbeat_interval_ms": 1000}

generate = load_rule_generator()


def new_daemon(bootstrap: str, topic: str, **kafka: object) -> Daemon:
    """A daemon (not started) with the shared test config, these `kafka:` settings changed."""
    base = kafka_config(bootstrap, topic, CLIENT_LIBRARY)
    return Daemon(make_config(**{**base, "kafka": {**base["kafka"], **kafka}}))


def replica(bootstrap: str, topic: str) -> Daemon:
    """A daemon that joins the topic's consumer group (kafka.assignment: subscribe)."""
    return new_daemon(bootstrap, topic, assignment="subscribe", client=GROUP_CLIENT)


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


def assigned(daemon: Daemon) -> frozenset[int]:
    """The partitions the replica's consumer holds right now (read from the test thread: a snapshot)."""
    client = daemon.source.client
    return frozenset(p for _, p in client.assignment()) if client is not None else frozenset()


@dataclass
class Fleet:
    replicas: list[Daemon]
    single: Daemon
    rows: pd.DataFrame
    partitions: list[frozenset[int]]
    prometheus: PrometheusServer

    def instance(self, daemon: Daemon) -> str:
        return f"127.0.0.1:{daemon.port}"


@pytest.fixture(scope="module")
def fleet(kafka_broker: EmbeddedBroker, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    """Two replicas in one group (and one daemon reading everything on its own), a Prometheus scraping the two
    replicas with the shipped rules; the events are produced only after it has scraped their zero counters."""
    bootstrap = kafka_broker.bootstrap_servers
    topic = f"scale-out-{uuid.uuid4().hex[:8]}"
    kafka_broker.create_topic(topic, partitions=len(PARTITIONS))
    replicas = [replica(bootstrap, topic), replica(bootstrap, topic)]
    single = new_daemon(bootstrap, topic, group_id=f"single-{topic}")  # manual assignment of every partition
    daemons = [*replicas, single]
    try:
        for d in daemons:
            d.start()
        partitions = _wait_for_stable_split(replicas)

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
            yield Fleet(replicas, single, rows, partitions, prom)
    finally:
        for daemon in daemons:
            daemon.stop()


def _wait_for_stable_split(replicas: list[Daemon], hold: float = 2.0) -> list[frozenset[int]]:
    """Wait until the replicas hold disjoint, non-empty sets of partitions covering the topic, for `hold` seconds.

    Fails at once when a replica's consumer keeps failing (it is rebuilt after every error: a crash loop)."""
    since: list[float | None] = [None]

    def split() -> list[frozenset[int]] | None:
        errors = [sample(scrape(r.port), "fairness_exporter_consumer_errors_total") for r in replicas]
        if max(e or 0.0 for e in errors) >= 3:
            raise AssertionError(f"consumer errors {errors}: a replica's consumer is failing over and over")
        parts = [assigned(r) for r in replicas]
        ok = all(parts) and sorted(p for part in parts for p in part) == list(range(len(PARTITIONS)))
        if not ok:
            since[0] = None
            return None
        since[0] = since[0] or time.monotonic()
        return parts if time.monotonic() - since[0] >= hold else None

    # Tansu has so far always given both members a share; if it ever gave one member everything, this fails
    # rather than letting the test pass with one replica doing all the work.
    return wait_until(split, 45, "both replicas to hold part of the partitions")


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


def test_replicas_in_one_group_share_the_partitions_and_count_each_event_once(fleet: Fleet) -> None:
    _all_counted(fleet)
    rows = fleet.rows
    consumed = [_consumed(r) for r in fleet.replicas]
    assert all(0 < c < len(rows) for c in consumed), consumed
    assert [assigned(r) for r in fleet.replicas] == fleet.partitions, "a rebalance happened during the test"
    for replica, partitions in zip(fleet.replicas, fleet.partitions, strict=True):
        mine = rows[rows.partition.isin(partitions)]
        assert _consumed(replica) == len(mine)
        assert counter_samples(replica.port) == expected_counters(mine)
    assert counter_samples(fleet.single.port) == expected_counters(rows)


def fleet_values(rows: pd.DataFrame, window: str) -> list[tuple[str, dict[str, str], float]]:
    """(recorded series, its labels besides job and model_id, value) of every recording rule, from pandas."""
    values = []
    for attribute in GROUPS:
        c = counts(rows, attribute)
        rate = c.n1 / (c.n1 + c.n0)
        # the other rates of the core, as PromQL divides the summed counts
        rates = {"true_positive_rate": c.tp / (c.tp + c.fn), "false_positive_rate": c.fp / (c.fp + c.tn),
                 "precision": c.tp / (c.tp + c.fp), "accuracy": (c.tp + c.tn) / (c.tp + c.fp + c.tn + c.fn)}
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
        ]  # fmt: skip
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


@contextlib.contextmanager
def _scaled_up(kafka_broker: EmbeddedBroker, topic: str) -> Iterator[tuple[Daemon, Daemon, pd.DataFrame]]:
    """`first` alone reads the 3 partitions and counts 300 events; `second` joins the group, which splits the
    partitions between them; 300 more events follow. Yields both replicas and the 600 rows once all are consumed
    (by the replicas together, if each is counted once)."""
    bootstrap = kafka_broker.bootstrap_servers
    first, second = replica(bootstrap, topic), replica(bootstrap, topic)
    before, after = (partitioned_rows(seed).sample(300, random_state=seed) for seed in (1, 2))
    try:
        first.start()
        wait_until(lambda: len(assigned(first)) == len(PARTITIONS), 30, "the first replica to hold every partition")
        _produce_spread(bootstrap, topic, before)
        wait_until(lambda: _consumed(first) == len(before), 30, "the first events consumed")
        second.start()
        _wait_for_stable_split([first, second], hold=1.0)
        _produce_spread(bootstrap, topic, after)
        wait_until(lambda: _consumed(first) + _consumed(second) >= len(before) + len(after), 30, "600 events consumed")
        time.sleep(1.5)  # a re-read of the first events would show up now
        yield first, second, pd.concat([before, after])
    finally:
        first.stop()
        second.stop()


def _produce_spread(bootstrap: str, topic: str, rows: pd.DataFrame) -> None:
    produce(bootstrap, topic, payloads(rows, time.time()), partition=lambda i, _: i % len(PARTITIONS))


def _summed_counters(*counters: dict[tuple[str, str, str, str], float]) -> dict[tuple[str, str, str, str], float]:
    total: dict[tuple[str, str, str, str], float] = {}
    for one in counters:
        for key, value in one.items():
            total[key] = total.get(key, 0.0) + value
    return total


def test_a_replica_joining_a_running_group_takes_over_partitions_without_recounting(
    kafka_broker: EmbeddedBroker, topic: str
) -> None:
    """Scale-up or rolling restart: the member that counted the first events commits them when its partitions are
    revoked, so the newcomer starts after them; together they count every event exactly once."""
    with _scaled_up(kafka_broker, topic) as (first, second, rows):
        assert _consumed(second) > 0
        assert _consumed(first) + _consumed(second) == len(rows)
        wait_until(lambda: _counted(first) and _counted(second), 10, "the next computation's counters")
        assert _summed_counters(counter_samples(first.port), counter_samples(second.port)) == expected_counters(rows)


def test_a_replica_leaving_the_group_hands_its_partitions_back_without_recounting(
    kafka_broker: EmbeddedBroker, topic: str
) -> None:
    """Scale-down after a scale-up: the remaining member takes the leaver's partitions back from the offsets the
    leaver committed, not from what it had itself counted in them before the split."""
    with _scaled_up(kafka_broker, topic) as (first, second, rows):
        wait_until(lambda: _counted(second), 10, "the leaving replica's counters")
        left, left_consumed = counter_samples(second.port), _consumed(second)
        second.stop()
        wait_until(lambda: len(assigned(first)) == len(PARTITIONS), 30, "the first replica to hold every partition")
        last = partitioned_rows(seed=3).sample(150, random_state=3)
        _produce_spread(kafka_broker.bootstrap_servers, topic, last)
        everything = pd.concat([rows, last])
        wait_until(lambda: _consumed(first) + left_consumed >= len(everything), 30, "every event consumed")
        time.sleep(1.5)  # a re-read would show up now
        assert _consumed(first) + left_consumed == len(everything)
        wait_until(lambda: _counted(first), 10, "the next computation's counters")
        assert _summed_counters(counter_samples(first.port), left) == expected_counters(everything)
