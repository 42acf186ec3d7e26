"""Configs that were accepted and then misbehaved (issue 31 item 6), refused at start and on reload in one line each:
a key given twice (YAML keeps the last in silence: a config with model_id twice served the second), an unknown value
of an enumerated client setting for either client library (security_protocol: BOGUS retried forever), and periods
and floors out of range (evaluation_interval: 1ms, min_samples: 1e9)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from daemon_config import make_config
from prometheus_client import CollectorRegistry
from test_startup_faults import BASE, one_line_problems, serve

from exporter.config import Config, ConfigError, load_config
from exporter.config.yaml_file import read_yaml
from exporter.daemon import Daemon
from exporter.gate.safety.config import load_safety_config
from exporter.serve import web_config

TWICE = """\
model_id: m1
protected_attributes: [{name: gender, groups: [male, female]}]
kafka: {bootstrap_servers: "127.0.0.1:1"}
listen: {address: 127.0.0.1, port: 0}
model_id: m2
"""


def test_a_key_given_twice_stops_the_daemon_in_one_line_naming_both_lines(tmp_path: Path) -> None:
    (tmp_path / "config.yaml").write_text(TWICE)
    with pytest.raises(ConfigError) as refused:
        load_config(tmp_path / "config.yaml")
    assert str(refused.value) == (f"{tmp_path / 'config.yaml'}: line 5: key 'model_id' is given twice in one mapping "
                                  "(first at line 1); keep one: YAML would silently use the last")  # fmt: skip


def test_a_key_given_twice_in_a_nested_or_flow_mapping_is_refused_and_merge_keys_still_override(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    for text, line in (("kafka:\n  topic: a\n  topic: b\n", 3), ("listen: {port: 1, port: 2}\n", 1)):
        path.write_text(text)
        with pytest.raises(ConfigError, match=rf"line {line}: key '(topic|port)' is given twice"):
            load_config(path)
    path.write_text("base: &d {min_samples: 5, bucket: 1m}\nmodel:\n  <<: *d\n  min_samples: 7\n")
    assert read_yaml(path)["model"] == {"min_samples": 7, "bucket": "1m"}  # a merge key: the mapping's own wins


def test_every_yaml_file_is_read_by_one_reader_that_refuses_a_key_given_twice(tmp_path: Path) -> None:
    """The daemon's config and its models_dir, the web configuration, and the gate's suite configs."""
    models = tmp_path / "models"
    models.mkdir()
    (models / "m.yaml").write_text("model_id: m1\nmodel_id: m2\nprotected_attributes: [{name: g, groups: [a, b]}]\n")
    (tmp_path / "config.yaml").write_text("models_dir: models\n")
    with pytest.raises(ConfigError, match=r"models_dir/m\.yaml: .*line 2: key 'model_id' is given twice"):
        load_config(tmp_path / "config.yaml")
    (tmp_path / "web.yml").write_text("basic_auth_users: {}\nbasic_auth_users: {}\n")
    with pytest.raises(web_config.WebConfigError, match="line 2: key 'basic_auth_users' is given twice"):
        web_config.load(str(tmp_path / "web.yml"))
    (tmp_path / "safety.yaml").write_text("model_id: m1\nmodel_id: m2\n")
    with pytest.raises(ConfigError, match="line 2: key 'model_id' is given twice"):
        load_safety_config(tmp_path / "safety.yaml")


@pytest.mark.parametrize(("client", "expected"), [
    ({"security_protocol": "BOGUS"},
     "kafka.client.security_protocol: 'BOGUS' is not one of PLAINTEXT, SSL, SASL_PLAINTEXT, SASL_SSL"),
    ({"security_protocol": "sasl_ssl"},  # kafka-python compares as written: lower case was plaintext
     "kafka.client.security_protocol: 'sasl_ssl' is not one of PLAINTEXT, SSL, SASL_PLAINTEXT, SASL_SSL"),
    ({"sasl_mechanism": "SCRAM-SHA-1"}, "kafka.client.sasl_mechanism: 'SCRAM-SHA-1' is not one of AWS_MSK_IAM, "
                                        "GSSAPI, OAUTHBEARER, PLAIN, SCRAM-SHA-256, SCRAM-SHA-512"),
    ({"isolation_level": "serializable"},
     "kafka.client.isolation_level: 'serializable' is not one of read_uncommitted, read_committed"),
    ({"client_dns_lookup": "default"}, "kafka.client.client_dns_lookup: 'default' is not one of use_all_dns_ips, "
                                       "resolve_canonical_bootstrap_servers_only"),
])  # fmt: skip
def test_an_unknown_value_of_a_kafka_python_enumeration_is_refused(tmp_path: Path, client: dict[str, Any],
                                                                   expected: str) -> None:  # fmt: skip
    assert one_line_problems(serve(tmp_path, kafka={**BASE["kafka"], "client": client})) == [
        f"{expected} (kafka-python's values)"]


def test_the_values_kafka_python_accepts_are_accepted() -> None:
    client = {"security_protocol": "SASL_SSL", "sasl_mechanism": "SCRAM-SHA-512", "isolation_level": "READ-COMMITTED",
              "client_dns_lookup": "resolve_canonical_bootstrap_servers_only"}  # fmt: skip
    assert make_config(kafka={"client": client}).kafka.client == client


@pytest.mark.parametrize(("client", "expected"), [
    ({"security.protocol": "BOGUS"},
     "kafka.client.security.protocol: 'BOGUS' refused by librdkafka: Invalid value \"BOGUS\" for configuration "
     "property \"security.protocol\""),
    ({"sasl.mechanism": "SCRAM-SHA-1"},  # a string to librdkafka, checked only when a SASL client is made
     "kafka.client.sasl.mechanism: 'SCRAM-SHA-1' is not one of GSSAPI, PLAIN, SCRAM-SHA-256, SCRAM-SHA-512, "
     "OAUTHBEARER (librdkafka's SASL mechanisms)"),
    ({"sasl.mechanisms": "plain"},
     "kafka.client.sasl.mechanisms: 'plain' is not one of GSSAPI, PLAIN, SCRAM-SHA-256, SCRAM-SHA-512, OAUTHBEARER"),
])  # fmt: skip
def test_an_unknown_value_of_a_librdkafka_enumeration_is_refused(tmp_path: Path, client: dict[str, Any],
                                                                 expected: str) -> None:  # fmt: skip
    pytest.importorskip("confluent_kafka", reason="the confluent extra is part of .[test]")
    problems = one_line_problems(serve(tmp_path, kafka={**BASE["kafka"], "client_library": "confluent-kafka",
                                                        "client": client}))  # fmt: skip
    assert len(problems) == 1 and problems[0].startswith(expected)


@pytest.mark.parametrize(("setting", "expected"), [
    ({"evaluation_interval": "1ms"}, "evaluation_interval: 1ms is out of range: from 1s to the shortest window (1h)"),
    ({"evaluation_interval": "2h"}, "evaluation_interval: 2h is out of range: from 1s to the shortest window (1h)"),
    ({"checkpoint": {"path": "CHECKPOINTS", "interval": "500ms"}},
     "checkpoint.interval: 500ms is out of range: from 1s to 1h"),
    ({"checkpoint": {"path": "CHECKPOINTS", "interval": "1d"}},
     "checkpoint.interval: 1d is out of range: from 1s to 1h"),
    ({"bucket": "10ms"}, "bucket: 10ms makes 8,670,000 buckets of the longest window plus allowed_lateness (1445m), "
                         "each kept in memory per model: at most 1,000,000; use a wider bucket"),
    ({"min_samples": 1_000_000_000}, "min_samples: 1000000000 is invalid: expected a whole number from 1 to 1,000,000"),
    ({"min_samples": 1e9}, "min_samples: 1000000000.0 is invalid: expected a whole number from 1 to 1,000,000"),
    ({"min_samples": 0}, "min_samples: 0 is invalid: expected a whole number from 1 to 1,000,000"),
])  # fmt: skip
def test_periods_and_floors_out_of_range_are_refused_in_one_line_each(tmp_path: Path, setting: dict[str, Any],
                                                                      expected: str) -> None:  # fmt: skip
    if "checkpoint" in setting:
        setting = {"checkpoint": {**setting["checkpoint"], "path": str(tmp_path / "checkpoints")}}
    assert one_line_problems(serve(tmp_path, **setting)) == [expected]


def test_the_bounds_themselves_are_accepted() -> None:
    config = make_config(evaluation_interval="1h", min_samples=1_000_000, bucket="100ms", windows=["24h"],
                         checkpoint={"path": "/nonexistent/checkpoints", "interval": "1h"})  # fmt: skip
    assert config.evaluation_interval_seconds == 3600 and config.models[0].min_samples == 1_000_000


@pytest.mark.parametrize("change", [
    lambda text: text + "min_samples: 1000000000\n",
    lambda text: text + "evaluation_interval: 1ms\n",
    lambda text: text + "kafka: {bootstrap_servers: '127.0.0.1:1', client: {security_protocol: BOGUS}}\n",
    lambda text: text + "model_id: m2\n",
])  # fmt: skip
def test_each_refusal_holds_on_reload_and_the_running_config_stays(tmp_path: Path, change: Any) -> None:
    path = tmp_path / "config.yaml"
    text = TWICE.replace("model_id: m2\n", "").replace('kafka: {bootstrap_servers: "127.0.0.1:1"}\n', "")
    path.write_text(text)
    config: Config = load_config(path)
    daemon = Daemon(config, registry=CollectorRegistry(), loader=lambda: load_config(path))
    path.write_text(change(text))
    applied, message = daemon.reload()
    assert not applied and message.startswith(str(path)) and daemon.config is config
    assert daemon.registry.get_sample_value("fairness_exporter_config_reload_failures_total") == 1

