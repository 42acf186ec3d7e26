"""Many models in one daemon: one read routed by model id gives each model exactly the numbers of a daemon of that
model alone; a reload adds, changes and removes models and keeps the others' counts and detector state."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import orjson
import pytest
from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families

from exporter.config import Config, ConfigError, parse_config
from exporter.daemon import Daemon

T0 = 1_800_000_000.0
METRICS = [{"name": name, "threshold": threshold} for name, threshold in (
    ("demographic_parity_difference", 0.05), ("equalised_odds_difference", 0.05), ("disparate_impact_ratio", 0.8),
    ("equal_opportunity_difference", 0.05), ("predictive_parity_difference", 0.05))]  # fmt: skip
MODELS: dict[str, dict[str, list[str]]] = {
    "hiring": {"gender": ["male", "female"], "age": ["young", "old"]},
    "credit": {"gender": ["male", "female"], "region": ["north", "south", "east"]},
    "moderation": {"language": ["en", "es", "fr"]},
}
UNKNOWN = "not-configured"


def model_entry(model_id: str, attributes: dict[str, list[str]] | None = None, **extra: Any) -> dict[str, Any]:
    attributes = attributes or MODELS[model_id]
    return {"model_id": model_id, "protected_attributes": [{"name": n, "groups": g} for n, g in attributes.items()],
            **extra}  # fmt: skip


def fleet_raw(models: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
    return {"windows": ["1h", "24h"], "bucket": "1m", "allowed_lateness": "5m", "evaluation_interval": "1s",
            "listen": {"address": "127.0.0.1", "port": 0}, "min_samples": 5, "metrics": METRICS,
            "kafka": {"labels_topic": "labels"}, "models": models, **extra}  # fmt: skip


@dataclass
class Record:
    value: bytes
    offset: int


class Clock:
    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> float:
        return self.now


def traffic(minutes: int, seed: int = 7) -> list[list[dict[str, Any]]]:
    """Per minute, events of every model and of an unconfigured one, interleaved; each model's rates differ by
    group, a third of the events labelled inline, a third later on the labels topic, the rest never."""
    rng = np.random.default_rng(seed)
    out = []
    for minute in range(minutes):
        events = []
        for model_id, attributes in [*MODELS.items(), (UNKNOWN, MODELS["hiring"])]:
            for i in range(int(rng.integers(40, 90))):
                values = {name: str(rng.choice(groups)) for name, groups in attributes.items()}
                first, groups = next(iter(attributes.items()))
                p = 0.3 + 0.15 * (values[first] == groups[0]) + 0.01 * minute  # the first group is favoured
                prediction = int(rng.random() < p)
                truth = prediction if rng.random() < 0.8 else 1 - prediction
                kind = rng.integers(0, 3)
                events.append({"model_id": model_id, "prediction_id": f"{model_id}-{minute}-{i}",
                               "timestamp": T0 + 60 * minute + float(rng.uniform(0, 59)), "prediction": prediction,
                               "label": truth if kind == 0 else None, "attributes": values,
                               "_later": truth if kind == 1 else None})  # fmt: skip
        rng.shuffle(events)  # type: ignore[arg-type]
        out.append(events)
    return out


def feed(daemon: Daemon, minutes: list[list[dict[str, Any]]], keep: set[str] | None = None) -> None:
    """Each minute's events (of the models in ``keep``, default all), then the labels of the minute before, then
    the scheduled computation at the end of the minute."""
    offset = 0
    for minute, events in enumerate(minutes):
        mine = [e for e in events if keep is None or e["model_id"] in keep]
        values = [orjson.dumps({k: v for k, v in e.items() if k != "_later"}) for e in mine]
        daemon.clock.now = T0 + 60 * minute + 59.5  # type: ignore[attr-defined]
        daemon.ingest.handle("predictions", 0, [Record(v, offset + i) for i, v in enumerate(values)])
        if minute:
            earlier = [e for e in minutes[minute - 1] if e["_later"] is not None and (keep is None or
                                                                                     e["model_id"] in keep)]
            labels = [orjson.dumps({"prediction_id": e["prediction_id"], "label": e["_later"]}) for e in earlier]
            daemon.ingest.handle("labels", 0, [Record(v, offset + i) for i, v in enumerate(labels)])
        offset += len(values)
        daemon.computer.compute()


def model_samples(daemon: Daemon, model_id: str) -> dict[tuple[str, frozenset], float]:
    """Every sample on the daemon's page that belongs to one model."""
    return {(s.name, frozenset(s.labels.items())): s.value
            for family in text_string_to_metric_families(daemon.metrics_page()) for s in family.samples
            if s.labels.get("model_id") == model_id}  # fmt: skip


def daemon_of(config: Config) -> Daemon:
    return Daemon(config, registry=CollectorRegistry(), clock=Clock())


def test_each_model_of_a_fleet_equals_a_daemon_of_that_model_alone_and_the_unknown_leaves_no_series() -> None:
    minutes = traffic(12)
    fleet = daemon_of(parse_config(fleet_raw([model_entry(m) for m in MODELS])))
    feed(fleet, minutes)
    page = fleet.metrics_page()
    assert UNKNOWN not in page  # its id is no label value of any series
    unknown_events = sum(e["model_id"] == UNKNOWN for events in minutes for e in events)
    ignored = [s.value for f in text_string_to_metric_families(page) for s in f.samples
               if s.name == "fairness_exporter_events_ignored_total" and s.labels == {"reason": "unconfigured_model"}]
    assert ignored == [unknown_events]
    for model_id in MODELS:
        alone = daemon_of(parse_config(fleet_raw([model_entry(model_id)])))
        feed(alone, minutes, keep={model_id})
        ours, theirs = model_samples(fleet, model_id), model_samples(alone, model_id)
        assert ours == theirs, model_id  # exact: same counts, values, intervals and detector statistics
        steps = ("fairness_detector_steps_total", frozenset({("model_id", model_id)}))
        assert ours[steps] == 11  # a step per minute the events have left (the 12th is open)
        stats = [v for (name, _), v in ours.items() if name == "fairness_detector_statistic"]
        assert len(stats) > 10 and max(stats) > 0  # the detectors did read evidence
        labelled = [v for (name, labels), v in ours.items()
                    if name == "model_subgroup_labelled_samples" and ("window", "24h") in labels]
        assert sum(labelled) > 0  # inline and delayed labels reached this model


def test_a_reload_adds_changes_and_removes_models_and_keeps_the_others_state() -> None:
    daemon = daemon_of(parse_config(fleet_raw([model_entry(m) for m in MODELS])))
    configs = iter([parse_config(fleet_raw([
        model_entry("hiring"),  # untouched
        model_entry("credit", metrics=[{"name": "demographic_parity_difference", "threshold": 0.1}]),  # new threshold
        model_entry("moderation", {"language": ["en", "es", "fr", "de"]}),  # a new group: starts afresh
        model_entry("fraud", {"channel": ["web", "app"]}),  # added
    ]))])
    daemon.loader = lambda: next(configs)
    minutes = traffic(6)
    feed(daemon, minutes[:3])
    before = {m: model_samples(daemon, m) for m in MODELS}
    store = daemon.fleet.models["hiring"].store
    credit_steps = daemon.fleet.models["credit"].store.detection.steps
    pending = len(daemon.fleet.joins.pending)
    applied, what = daemon.reload()
    assert applied, what
    assert what == "added fraud; updated credit; restarted afresh moderation; unchanged hiring"
    assert daemon.fleet.models["hiring"].store is store  # the untouched model keeps its state object
    assert model_samples(daemon, "hiring") == before["hiring"]  # exact (the clock has not moved)
    credit = daemon.fleet.models["credit"].store
    assert credit.detection.steps == credit_steps and credit.totals.sum() > 0  # counts and detectors carried over
    threshold = ("fairness_threshold", frozenset({("model_id", "credit"), ("metric", "demographic_parity_difference"),
                                                  ("severity", "blocking")}))
    assert model_samples(daemon, "credit")[threshold] == 0.1
    assert daemon.fleet.models["moderation"].store.totals.sum() == 0  # afresh
    assert len(daemon.fleet.joins.pending) < pending  # moderation's waiting predictions are given up, counted
    dropped = {s.labels["reason"]: s.value for f in text_string_to_metric_families(daemon.metrics_page())
               for s in f.samples if s.name == "fairness_exporter_labels_dropped_total"}
    assert dropped["model_reconfigured"] == pending - len(daemon.fleet.joins.pending)
    assert "fraud" in daemon.metrics_page()
    feed(daemon, minutes[3:])  # the fleet goes on counting after the reload


def test_removing_a_model_takes_its_series_off_the_page_at_the_next_publication() -> None:
    daemon = daemon_of(parse_config(fleet_raw([model_entry(m) for m in MODELS])))
    daemon.loader = lambda: parse_config(fleet_raw([model_entry("hiring"), model_entry("credit")]))
    feed(daemon, traffic(2))
    assert model_samples(daemon, "moderation")
    assert daemon.reload() == (True, "removed moderation; unchanged hiring, credit")
    assert not model_samples(daemon, "moderation") and model_samples(daemon, "hiring")


def test_a_new_model_version_starts_afresh_and_names_its_version_on_the_page() -> None:
    """A canary id reused across rollouts: the next version's numbers must not hold the last version's events."""
    daemon = daemon_of(parse_config(fleet_raw([model_entry("hiring"), model_entry("credit", model_version="4.0")])))
    daemon.loader = lambda: parse_config(fleet_raw([model_entry("hiring"), model_entry("credit", model_version="4.1")]))
    feed(daemon, traffic(2))
    info = ("fairness_model_info", frozenset({("model_id", "credit"), ("model_version", "4.0")}))
    assert model_samples(daemon, "credit")[info] == 1
    assert daemon.fleet.models["credit"].store.totals.sum() > 0
    before = model_samples(daemon, "hiring")
    assert daemon.reload() == (True, "restarted afresh credit; unchanged hiring")
    assert daemon.fleet.models["credit"].store.totals.sum() == 0
    samples = model_samples(daemon, "credit")
    assert samples[("fairness_model_info", frozenset({("model_id", "credit"), ("model_version", "4.1")}))] == 1
    assert info not in samples
    assert model_samples(daemon, "hiring") == before
    unversioned = ("fairness_model_info", frozenset({("model_id", "hiring"), ("model_version", "")}))
    assert before[unversioned] == 1


@pytest.mark.parametrize(("broken", "why"), [
    (lambda: parse_config({"models": [{"model_id": "x"}]}), "protected_attributes: required"),
    (lambda: parse_config(fleet_raw([model_entry("hiring")], kafka={"topic": "elsewhere"})),
     "kafka changed, which takes effect only on a restart; the running config is kept"),
])  # fmt: skip
def test_a_reload_that_cannot_be_applied_changes_nothing_and_is_counted(broken: Any, why: str) -> None:
    daemon = daemon_of(parse_config(fleet_raw([model_entry(m) for m in MODELS])))

    def loader() -> Config:
        try:
            return broken()
        except ConfigError as exc:  # what load_config raises for a file that does not validate
            raise ConfigError(str(exc)) from exc

    daemon.loader = loader
    feed(daemon, traffic(2))
    models = daemon.fleet.models
    page = {m: model_samples(daemon, m) for m in MODELS}
    applied, what = daemon.reload()
    assert not applied and why in what
    assert daemon.fleet.models is models and {m: model_samples(daemon, m) for m in MODELS} == page
    health = {s.name: s.value for f in text_string_to_metric_families(daemon.metrics_page()) for s in f.samples}
    assert health["fairness_exporter_config_reload_failures_total"] == 1
    assert health["fairness_exporter_config_last_reload_successful"] == 0
    assert health["fairness_exporter_models"] == 3
