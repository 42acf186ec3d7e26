"""Load and validate the YAML config shared by the audit gate and the daemon.

Validation collects every problem it finds and raises one :class:`ConfigError` naming the file, the field, the
value and what would be accepted, so a user fixes a config in one round trip. The types are here; the checks of
each section are in :mod:`exporter.config_parse` (gate sections) and :mod:`exporter.config_daemon` (daemon sections).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final, Literal

import yaml

from exporter.core.attributes import Attribute
from exporter.core.metric_table import METRICS, max_widths

SEVERITIES: Final = ("blocking", "warning")
DEFAULT_SCORE_BUCKETS: Final = (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9)
DEFAULT_PORT: Final = 9108

_DURATION = re.compile(r"^(\d+)(ms|s|m|h|d|w)$")
_UNIT_SECONDS: Final = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}


class ConfigError(ValueError):
    """The config is invalid; the message lists every problem found."""


def parse_duration(text: str) -> float:
    """Seconds in a Prometheus-style duration such as ``15s``, ``1m``, ``24h`` or ``7d``."""
    m = _DURATION.match(str(text).strip())
    if not m or int(m.group(1)) == 0:
        raise ValueError(f"{text!r} is not a duration like 15s, 1m, 24h or 7d")
    return int(m.group(1)) * _UNIT_SECONDS[m.group(2)]


@dataclass(frozen=True)
class MetricSpec:
    """One gate metric: its threshold and what a failure means."""

    name: str
    threshold: float
    severity: Literal["blocking", "warning"]
    max_interval_width: float | None = None
    """A value is reported only when its interval's half-width is at most this (None: the table's default)."""

    def passes(self, value: float) -> bool:
        """The point estimate against the threshold, in the metric's pass direction (from the metric table)."""
        return METRICS[self.name].passes(value, self.threshold)


@dataclass(frozen=True)
class KafkaConfig:
    """Where the daemon reads events from; ``client`` is passed through to the client library (checked against it)."""

    bootstrap_servers: str = "localhost:9092"
    topic: str = "predictions"
    group_id: str = "fairness-exporter"
    auto_offset_reset: Literal["earliest", "latest"] = "earliest"
    assignment: Literal["subscribe", "manual"] = "subscribe"
    """subscribe: share partitions with the replicas of the consumer group; manual: read every partition."""
    client_library: Literal["kafka-python", "confluent-kafka"] = "kafka-python"
    """confluent-kafka (optional extra) decodes records in C; ``client`` then holds librdkafka properties."""
    labels_topic: str | None = None
    dead_letter_topic: str | None = None
    client: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class EventFields:
    """Dotted paths of the fields in a JSON event."""

    model_id: str = "model_id"
    prediction_id: str = "prediction_id"
    timestamp: str = "timestamp"
    prediction: str = "prediction"
    score: str = "score"
    score_threshold: float | None = None
    score_buckets: tuple[float, ...] = ()
    """Upper bounds of the per-subgroup score histograms (only with ``score_threshold``: a model that emits
    scores); empty: :data:`DEFAULT_SCORE_BUCKETS` when the model emits scores, else no histogram."""
    label: str = "label"
    attributes: str = "attributes"


@dataclass(frozen=True)
class AlertingConfig:
    """The change detectors' false-alarm budget and the subgroup rate shift worth a warning."""

    false_pages_per_day: float = 0.01
    """Expected false pages per day, shared by every detector of the model and every replica."""
    replicas: int = 1
    """Replicas sharing the traffic (the Helm chart sets it from replicaCount): each takes 1/replicas of it."""
    rate_shift: float = 0.10
    """SubgroupPredictionRateShift: a move of a subgroup's selection rate from its own baseline worth a warning."""


@dataclass(frozen=True)
class Window:
    """A sliding event-time window, named as written in the config."""

    name: str
    seconds: float


@dataclass(frozen=True)
class Config:
    """A validated config; see docs/contract.md for the YAML form and the defaults."""

    model_id: str
    base_attributes: tuple[Attribute, ...]
    attributes: tuple[Attribute, ...]
    metrics: tuple[MetricSpec, ...]
    min_samples: int = 30
    decision: Literal["point_estimate", "evidence"] = "point_estimate"
    """What sets a gate result's verdict: the point estimate against the threshold, or its interval."""
    inconclusive: Literal["fail", "warn"] = "fail"
    """failure_policy.inconclusive, with decision: evidence: ``fail`` counts an inconclusive result as a failure of
    its metric's severity (a blocking metric blocks); ``warn`` counts it as a warning that never blocks."""
    unknown_values: Literal["reject", "other"] = "reject"
    prediction_column: str = "prediction"
    label_column: str = "label"
    score_column: str | None = None
    """A score column: the LL144 table then reports scoring rates (share above the median score)."""
    timestamp_column: str = "timestamp"
    kafka: KafkaConfig = field(default_factory=KafkaConfig)
    events: EventFields = field(default_factory=EventFields)
    windows: tuple[Window, ...] = (Window("1h", 3600), Window("24h", 86400))
    bucket_seconds: float = 60
    allowed_lateness_seconds: float = 300
    max_future_skew_seconds: float = 300
    evaluation_interval_seconds: float = 15
    label_horizon_seconds: float = 7 * 86400
    max_pending_labels: int = 1_000_000
    listen_address: str = "0.0.0.0"
    listen_port: int = DEFAULT_PORT
    tls_cert_file: str | None = None
    tls_key_file: str | None = None
    checkpoint_path: str | None = None
    checkpoint_interval_seconds: float = 30
    alerting: AlertingConfig = field(default_factory=AlertingConfig)
    model_version: str | None = None
    """The version of the model every audit record names (the seed's "audit trail for each model version")."""
    evaluation_dataset: str | None = None
    """The gate's data when the command line names none: a local path (relative to the config) or a URL."""
    report_destination: str | None = None
    """failure_policy.report_destination: a folder or URL that receives every report, named by model and time."""
    source: str = "<config>"

    def max_interval_widths(self) -> dict[str, float]:
        """Each metric's max_interval_width: as configured, else from its configured threshold, else the table's."""
        return max_widths((m.name, m.threshold, m.max_interval_width) for m in self.metrics)

    def thresholds(self) -> dict[str, float]:
        """The threshold of every exported metric: as configured, else the metric table's default."""
        configured = {m.name: m.threshold for m in self.metrics}
        return {name: configured.get(name, METRICS[name].default_threshold) for name in self.exported_metrics}

    @property
    def exported_metrics(self) -> tuple[str, ...]:
        """Metrics on /metrics: the seed's three (as always) and every configured one, in table order."""
        configured = {m.name for m in self.metrics}
        return tuple(name for name, m in METRICS.items() if m.seed or name in configured)

    def layout(self) -> dict[str, Any]:
        """Everything the meaning and shape of the window state depend on (a checkpoint must match it)."""
        return {
            "model_id": self.model_id,
            "attributes": {a.name: list(a.groups) for a in self.attributes},
            "unknown_rows": True,  # one row per attribute counts its unknown category
            "windows": [w.name for w in self.windows],
            "bucket_seconds": self.bucket_seconds,
            "allowed_lateness_seconds": self.allowed_lateness_seconds,
            **({"score_buckets": list(self.score_buckets)} if self.score_buckets else {}),
        }

    @property
    def score_buckets(self) -> tuple[float, ...]:
        """Upper bounds of the score histograms; empty when the model emits no scores (no histograms)."""
        if self.events.score_threshold is None:
            return ()
        return self.events.score_buckets or DEFAULT_SCORE_BUCKETS


def parse_config(raw: Any, source: str = "<config>") -> Config:
    """Validate a parsed YAML document; raise ConfigError listing every problem."""
    from exporter import config_daemon as daemon  # the section parsers build this module's types
    from exporter import config_parse as p

    errors = p.Errors()
    if not isinstance(raw, dict):
        raise ConfigError(f"{source}: the config must be a YAML mapping, got {type(raw).__name__}")
    raw = p.expand_env(raw, errors)
    errors.check_keys("", raw, p.TOP_LEVEL)
    model_id = raw.get("model_id")
    if not isinstance(model_id, str) or not model_id.strip():
        errors.add("model_id", f"{model_id!r} is not a non-empty string")
    unknown_values = p.get(raw, "unknown_values", "reject", errors, "", p.choice("reject", "other"))
    base = p.parse_attributes(raw.get("protected_attributes"), unknown_values == "other", errors)
    attributes = base + p.parse_intersections(raw.get("intersections"), base, errors)
    metrics = p.parse_metrics(raw.get("metrics"), errors)
    decision, inconclusive = p.parse_decision(raw, errors)

    columns = p.section(raw, "columns", errors, {"prediction", "label", "score", "timestamp"})
    kafka = daemon.parse_kafka(p.section(raw, "kafka", errors, set(KafkaConfig.__dataclass_fields__)), errors)
    events = daemon.parse_events(p.section(raw, "events", errors, set(EventFields.__dataclass_fields__)), errors)
    listen = p.section(raw, "listen", errors, {"address", "port", "tls_cert_file", "tls_key_file"})
    checkpoint = raw.get("checkpoint")
    if checkpoint is not None and not (isinstance(checkpoint, dict) and isinstance(checkpoint.get("path"), str)):
        errors.add("checkpoint", f"{checkpoint!r} is not a mapping with a path (and optional interval)")
        checkpoint = None
    elif checkpoint is not None:
        errors.check_keys("checkpoint", checkpoint, {"path", "interval"})
        daemon.check_checkpoint_dir(checkpoint["path"], errors)
    windows, bucket = daemon.parse_windows(raw.get("windows", ["1h", "24h"]), raw.get("bucket"), errors)
    tls = {key: listen.get(key) for key in ("tls_cert_file", "tls_key_file")}
    for key, value in tls.items():
        if value is not None and not (isinstance(value, str) and value):
            errors.add(f"listen.{key}", f"{value!r} is not a file path")
    if bool(tls["tls_cert_file"]) != bool(tls["tls_key_file"]):
        errors.add("listen", "tls_cert_file and tls_key_file must be set together")

    config = Config(
        model_id=str(model_id),
        base_attributes=tuple(base),
        attributes=tuple(attributes),
        metrics=tuple(metrics),
        min_samples=p.get(raw, "min_samples", 30, errors, "", p.positive_int),
        decision=decision,
        inconclusive=inconclusive,
        unknown_values=unknown_values,
        prediction_column=str(columns.get("prediction", "prediction")),
        label_column=str(columns.get("label", "label")),
        score_column=str(columns["score"]) if columns.get("score") is not None else None,
        timestamp_column=str(columns.get("timestamp", "timestamp")),
        kafka=kafka,
        events=events,
        windows=tuple(windows),
        bucket_seconds=bucket,
        allowed_lateness_seconds=p.get(raw, "allowed_lateness", 300.0, errors, "", parse_duration),
        max_future_skew_seconds=p.get(raw, "max_future_skew", 300.0, errors, "", parse_duration),
        evaluation_interval_seconds=p.get(raw, "evaluation_interval", 15.0, errors, "", parse_duration),
        label_horizon_seconds=p.get(raw, "label_horizon", 7 * 86400.0, errors, "", parse_duration),
        max_pending_labels=p.get(raw, "max_pending_labels", 1_000_000, errors, "", p.positive_int),
        listen_address=daemon.check_listen(listen.get("address", "0.0.0.0"), errors),
        listen_port=p.get(listen, "port", DEFAULT_PORT, errors, "listen.", p.port),
        tls_cert_file=tls["tls_cert_file"],
        tls_key_file=tls["tls_key_file"],
        checkpoint_path=checkpoint["path"] if checkpoint else None,
        checkpoint_interval_seconds=p.get(checkpoint or {}, "interval", 30.0, errors, "checkpoint.", parse_duration),
        alerting=daemon.parse_alerting(p.section(raw, "alerting", errors, set(AlertingConfig.__dataclass_fields__)),
                                       errors),
        model_version=p.get(raw, "model_version", None, errors, "", p.text),
        evaluation_dataset=p.get(raw, "evaluation_dataset", None, errors, "", p.text),
        report_destination=p.get(raw.get("failure_policy") or {}, "report_destination", None, errors,
                                 "failure_policy.", p.text),
        source=source,
    )
    if errors.lines:
        raise ConfigError(f"{source}: invalid config:\n  " + "\n  ".join(errors.lines))
    return config


def load_config(path: str | Path) -> Config:
    """Read and validate a YAML config file."""
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read the config: {exc.strerror}") from exc
    try:
        raw = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not valid YAML: {exc}") from exc
    return parse_config(raw, str(path))
