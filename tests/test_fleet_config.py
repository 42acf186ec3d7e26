"""A fleet config: `models:` and `models_dir:`, top-level defaults, errors that name the model, the gate's --model."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from exporter.cli import main
from exporter.config import ConfigError, load_config, parse_config

ROOT = Path(__file__).resolve().parents[1]
GENDER = {"name": "gender", "groups": ["male", "female"]}
AGE = {"name": "age", "groups": ["young", "old"]}
FLEET: dict[str, Any] = {
    "kafka": {"topic": "predictions"},
    "windows": ["1h", "24h"],
    "min_samples": 50,
    "events": {"timestamp": "meta.ts"},
    "metrics": [{"name": "demographic_parity_difference", "threshold": 0.05, "severity_on_fail": "blocking"}],
    "models": [
        {"model_id": "hiring-screener-v2", "protected_attributes": [GENDER, AGE]},
        {"model_id": "credit-scorer-v4", "protected_attributes": [GENDER], "min_samples": 200,
         "events": {"attributes": "applicant"},
         "metrics": [{"name": "disparate_impact_ratio", "threshold": 0.8, "severity_on_fail": "warning"}]},
    ],
}  # fmt: skip


def errors_of(raw: dict[str, Any], **kwargs: Any) -> list[str]:
    with pytest.raises(ConfigError) as caught:
        parse_config(raw, "fleet.yaml", **kwargs)
    return [line.strip() for line in str(caught.value).splitlines()[1:]]


def test_each_model_takes_the_top_level_defaults_and_overrides_its_own() -> None:
    config = parse_config(FLEET, "fleet.yaml")
    hiring, credit = config.models
    assert config.model_ids == ("hiring-screener-v2", "credit-scorer-v4")
    assert (hiring.min_samples, credit.min_samples) == (50, 200)
    assert [m.name for m in hiring.metrics] == ["demographic_parity_difference"]  # the default list
    assert [(m.name, m.severity) for m in credit.metrics] == [("disparate_impact_ratio", "warning")]  # replaced
    # mapping sections merge key by key: the fleet's timestamp path and the model's own attributes path
    assert (hiring.events.timestamp, hiring.events.attributes) == ("meta.ts", "attributes")
    assert (credit.events.timestamp, credit.events.attributes) == ("meta.ts", "applicant")
    assert [a.name for a in hiring.attributes] == ["gender", "age"]
    assert config.kafka.topic == "predictions" and [w.name for w in config.windowing.windows] == ["1h", "24h"]
    assert credit.source == "fleet.yaml#models[1]"


def test_a_single_model_file_keeps_its_meaning() -> None:
    config = load_config(ROOT / "examples" / "hiring-screener.yaml")
    (model,) = config.models
    assert config.model() is model and model.model_id == "hiring-screener-v2"
    assert model.source == str(ROOT / "examples" / "hiring-screener.yaml")


def test_errors_name_the_model_and_are_listed_at_once() -> None:
    raw = {**FLEET, "models": [
        FLEET["models"][0],
        {**FLEET["models"][1], "metrics": [{"name": "disparate_impact_ratio", "threshold": 8}], "kafka": {}},
        {"model_id": "hiring-screener-v2", "protected_attributes": [GENDER], "windows": ["1h"], "colour": "red"},
        "not a model",
    ]}  # fmt: skip
    assert errors_of(raw) == [
        "models[1] (credit-scorer-v4).kafka: shared by every model: set it at the top level",
        "models[1] (credit-scorer-v4).metrics[0].threshold: 8 is not a number between 0 and 1",
        "models[2] (hiring-screener-v2).colour: unknown key (accepted: alerting, attribute_sources, baseline_offset, "
        "columns, decision, estimation, evaluation_dataset, events, failure_policy, intersections, metrics, "
        "min_samples, model_id, model_version, multiplicity, protected_attributes, segment_values, segments, strata, "
        "unknown_values)",
        "models[2] (hiring-screener-v2).windows: shared by every model: set it at the top level",
        "models[3]: 'not a model' is not a mapping with a model_id",
        "models: model_id 'hiring-screener-v2' is configured twice",
    ]


def test_a_top_level_model_id_beside_models_and_diverging_routing_paths_are_refused() -> None:
    raw = {**FLEET, "model_id": "x", "models": [FLEET["models"][0],
                                               {**FLEET["models"][1], "events": {"model_id": "meta.model"}}]}
    assert errors_of(raw) == [
        "model_id: with models: or models_dir:, each model names its own model_id",
        "events.model_id: every model must read it at the same path (events are routed by it), got "
        "['meta.model', 'model_id']",
    ]
    labelled = {**FLEET, "kafka": {"labels_topic": "labels"},
                "models": [FLEET["models"][0], {**FLEET["models"][1], "events": {"label": "outcome"}}]}
    assert errors_of(labelled) == ["events.label: every model must read it at the same path (label events carry "
                                   "no model: they are read at one path), got ['label', 'outcome']"]  # fmt: skip
    assert errors_of({**FLEET, "models": []}) == ["models: no model configured (an empty list)"]


def test_models_dir_adds_a_model_per_file_next_to_the_config(tmp_path: Path) -> None:
    (tmp_path / "models").mkdir()
    (tmp_path / "models" / "credit.yaml").write_text(yaml.safe_dump(FLEET["models"][1]))
    (tmp_path / "models" / ".hidden.yaml").write_text("not: [a model")  # a ConfigMap's ..data-style entries
    (tmp_path / "models" / "notes.txt").write_text("ignored")
    (tmp_path / "fleet.yaml").write_text(yaml.safe_dump({**FLEET, "models": [FLEET["models"][0]],
                                                          "models_dir": "models"}))  # fmt: skip
    config = load_config(tmp_path / "fleet.yaml")
    assert config.model_ids == ("hiring-screener-v2", "credit-scorer-v4")
    assert config.model("credit-scorer-v4").min_samples == 200
    assert config.model("credit-scorer-v4").source == str(tmp_path / "models" / "credit.yaml")
    assert config.models_dir == str(tmp_path / "models")
    (tmp_path / "empty").mkdir()  # a fleet of model ConfigMaps before the first one: it starts, and waits for them
    assert parse_config({**FLEET, "models": [], "models_dir": "empty"}, base_dir=tmp_path).models == ()
    (tmp_path / "models" / "bad.yaml").write_text(yaml.safe_dump({"model_id": "bad", "protected_attributes": "x"}))
    assert errors_of(yaml.safe_load((tmp_path / "fleet.yaml").read_text()), base_dir=tmp_path) == [
        "models_dir/bad.yaml (bad).protected_attributes: required: a non-empty list of {name, groups, "
        "pairwise_comparisons}"]


def test_the_gate_audits_the_model_named_with_model(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = tmp_path / "fleet.yaml"
    config.write_text(yaml.safe_dump({k: v for k, v in FLEET.items() if k != "events"}))
    rows = tmp_path / "rows.csv"
    rows.write_text("gender,age,prediction\n" + "male,young,1\nfemale,old,0\n" * 30)
    log = ["--audit-log", str(tmp_path / "log.jsonl")]
    assert main(["audit", str(config), str(rows), *log]) == 2
    assert ("configures 2 models (hiring-screener-v2, credit-scorer-v4): name one with --model"
            in capsys.readouterr().err)  # fmt: skip
    assert main(["audit", str(config), str(rows), "--model", "nope", *log]) == 2
    assert "no model 'nope' (configured: hiring-screener-v2, credit-scorer-v4)" in capsys.readouterr().err
    assert main(["audit", str(config), str(rows), "--model", "hiring-screener-v2", *log]) == 1  # 1.0 vs 0.0
    assert '"model_id": "hiring-screener-v2"' in capsys.readouterr().out
