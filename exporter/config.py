"""Load and validate the YAML config shared by the audit gate and the daemon.

Validation collects every problem it finds and raises one :class:`ConfigError` naming the file, the field, the
value and what would be accepted, so a user fixes a config in one round trip.
"""

from __future__ import annotations

import itertools
import math
import os
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final, Literal

import yaml

from exporter.core.attributes import INTERSECTION_SEP, OTHER_GROUP, Attribute

METRIC_NAMES: Final = ("demographic_parity_difference", "equalised_odds_difference", "disparate_impact_ratio")
SEVERITIES: Final = ("blocking", "warning")
DEFAULT_PORT: Final = 9108

_DURATION = re.compile(r"^(\d+)(ms|s|m|h|d|w)$")
_UNIT_SECONDS: Final = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}
_ENV_REF = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")


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

    def passes(self, value: float) -> bool:
        """Differences pass at or below the threshold; the impact ratio at or above it."""
        if self.name == "disparate_impact_ratio":
            return value >= self.threshold
        return value <= self.threshold


@dataclass(frozen=True)
class KafkaConfig:
    """Where the daemon reads events from; ``client`` is passed through to kafka-python."""

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
    label: str = "label"
    attributes: str = "attributes"


@dataclass(frozen=True)
class AlertingConfig:
    """The change detectors' false-alarm budget and the subgroup rate shift worth a warning."""

    false_pages_per_day: float = 0.01
    """Expected days with a false page per day, shared by every detector of the model and every replica."""
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
    source: str = "<config>"

    def layout(self) -> dict[str, Any]:
        """Everything the meaning and shape of the window state depend on (a checkpoint must match it)."""
        return {
            "model_id": self.model_id,
            "attributes": {a.name: list(a.groups) for a in self.attributes},
            "windows": [w.name for w in self.windows],
            "bucket_seconds": self.bucket_seconds,
            "allowed_lateness_seconds": self.allowed_lateness_seconds,
        }


class _Errors:
    """Collects problems as ``field: message`` lines."""

    def __init__(self) -> None:
        self.lines: list[str] = []

    def add(self, path: str, message: str) -> None:
        self.lines.append(f"{path}: {message}")

    def check_keys(self, path: str, mapping: dict[str, Any], allowed: set[str]) -> None:
        for key in sorted(set(mapping) - allowed):
            self.add(f"{path}.{key}" if path else key, f"unknown key (accepted: {', '.join(sorted(allowed))})")


def _expand_env(value: Any, errors: _Errors, path: str = "") -> Any:
    """Replace ``${NAME}`` in every string with the environment variable NAME."""
    if isinstance(value, dict):
        return {k: _expand_env(v, errors, f"{path}.{k}" if path else str(k)) for k, v in value.items()}
    if isinstance(value, list):
        return [_expand_env(v, errors, f"{path}[{i}]") for i, v in enumerate(value)]
    if isinstance(value, str):

        def sub(m: re.Match[str]) -> str:
            if m.group(1) not in os.environ:
                errors.add(path, f"environment variable {m.group(1)} is not set")
                return ""
            return os.environ[m.group(1)]

        return _ENV_REF.sub(sub, value)
    return value


def _get(
    raw: dict[str, Any], key: str, default: Any, errors: _Errors, path: str, convert: Callable[[Any], Any]
) -> Any:
    """raw[key] converted, or default when absent; a conversion failure is recorded and gives default."""
    if key not in raw or raw[key] is None:
        return default
    try:
        return convert(raw[key])
    except (TypeError, ValueError) as exc:
        errors.add(f"{path}{key}", f"{raw[key]!r} is invalid: {exc}")
        return default


def _positive_int(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError("expected a whole number >= 1")
    return value


def _choice(*options: str) -> Callable[[Any], str]:
    def convert(value: Any) -> str:
        if value not in options:
            raise ValueError(f"expected one of {', '.join(options)}")
        return str(value)

    return convert


def _port(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= 65535:
        raise ValueError("expected a port number 0..65535")
    return value


def _parse_pairs(raw: Any, groups: list[str], path: str, errors: _Errors) -> tuple[tuple[int, int], ...]:
    if raw is None or raw == "all":
        return tuple(itertools.combinations(range(len(groups)), 2))
    if not isinstance(raw, list):
        errors.add(path, f"{raw!r} is neither 'all' nor a list of [group_a, group_b] pairs")
        return ()
    pairs = []
    for i, pair in enumerate(raw):
        if not (isinstance(pair, list) and len(pair) == 2):
            errors.add(f"{path}[{i}]", f"{pair!r} is not a pair [group_a, group_b]")
            continue
        a, b = (str(g) for g in pair)
        for g in (a, b):
            if g not in groups:
                errors.add(f"{path}[{i}]", f"group {g!r} is not in groups {groups}")
        if a == b:
            errors.add(f"{path}[{i}]", f"compares {a!r} with itself")
        if a in groups and b in groups and a != b:
            pairs.append((groups.index(a), groups.index(b)))
    return tuple(pairs)


def _parse_attributes(raw: Any, other: bool, errors: _Errors) -> list[Attribute]:
    if not isinstance(raw, list) or not raw:
        errors.add("protected_attributes", "required: a non-empty list of {name, groups, pairwise_comparisons}")
        return []
    out: list[Attribute] = []
    for i, item in enumerate(raw):
        path = f"protected_attributes[{i}]"
        if not isinstance(item, dict):
            errors.add(path, f"{item!r} is not a mapping with name and groups")
            continue
        errors.check_keys(path, item, {"name", "groups", "pairwise_comparisons", "column"})
        name = item.get("name")
        if not isinstance(name, str) or not name:
            errors.add(f"{path}.name", "required: the attribute's name")
            continue
        if any(a.name == name for a in out):
            errors.add(f"{path}.name", f"{name!r} is configured twice")
        groups_raw = item.get("groups")
        if not isinstance(groups_raw, list) or len(groups_raw) < 2:
            errors.add(f"{path}.groups", f"{groups_raw!r} is not a list of at least two groups")
            continue
        groups = [str(g) for g in groups_raw]
        if len(set(groups)) != len(groups):
            errors.add(f"{path}.groups", f"{groups} lists a group twice")
        if other and OTHER_GROUP in groups:
            errors.add(f"{path}.groups", f"{OTHER_GROUP!r} is reserved when unknown_values is 'other'")
        pairs = _parse_pairs(item.get("pairwise_comparisons"), groups, f"{path}.pairwise_comparisons", errors)
        column = str(item.get("column", name))
        out.append(Attribute(name, (column,), tuple([*groups, OTHER_GROUP] if other else groups), pairs))
    return out


def _parse_intersections(raw: Any, base: list[Attribute], errors: _Errors) -> list[Attribute]:
    if raw is None:
        return []
    if not isinstance(raw, list):
        errors.add("intersections", f"{raw!r} is not a list of attribute-name lists, e.g. [[gender, age_group]]")
        return []
    by_name = {a.name: a for a in base}
    out = []
    for i, names in enumerate(raw):
        path = f"intersections[{i}]"
        if not (isinstance(names, list) and len(names) >= 2 and all(isinstance(n, str) for n in names)):
            errors.add(path, f"{names!r} is not a list of two or more attribute names")
            continue
        unknown = [n for n in names if n not in by_name]
        if unknown:
            errors.add(path, f"{unknown} not among protected_attributes {sorted(by_name)}")
            continue
        parts = [by_name[n] for n in names]
        groups = tuple(INTERSECTION_SEP.join(combo) for combo in itertools.product(*(p.groups for p in parts)))
        configured = [
            i
            for i, combo in enumerate(itertools.product(*(p.groups for p in parts)))
            if OTHER_GROUP not in combo
        ]
        out.append(
            Attribute(
                name="_x_".join(names),
                columns=tuple(p.columns[0] for p in parts),
                groups=groups,
                pairs=tuple(itertools.combinations(configured, 2)),
                base_sizes=tuple(len(p.groups) for p in parts),
            )
        )
    return out


def _parse_metrics(raw: Any, errors: _Errors) -> list[MetricSpec]:
    if raw is None:
        return [
            MetricSpec("demographic_parity_difference", 0.05, "blocking"),
            MetricSpec("disparate_impact_ratio", 0.80, "blocking"),
        ]
    if not isinstance(raw, list):
        errors.add("metrics", f"{raw!r} is not a list of {{name, threshold, severity_on_fail}}")
        return []
    out = []
    for i, item in enumerate(raw):
        path = f"metrics[{i}]"
        if not isinstance(item, dict):
            errors.add(path, f"{item!r} is not a mapping")
            continue
        errors.check_keys(path, item, {"name", "threshold", "severity_on_fail"})
        name, threshold = item.get("name"), item.get("threshold")
        severity = item.get("severity_on_fail", "blocking")
        ok = True
        if name not in METRIC_NAMES:
            errors.add(f"{path}.name", f"unknown metric {name!r} (accepted: {', '.join(METRIC_NAMES)})")
            ok = False
        if isinstance(threshold, bool) or not isinstance(threshold, int | float) or not 0 <= threshold <= 1:
            errors.add(f"{path}.threshold", f"{threshold!r} is not a number between 0 and 1")
            ok = False
        if severity not in SEVERITIES:
            errors.add(f"{path}.severity_on_fail", f"{severity!r} is not one of {', '.join(SEVERITIES)}")
            ok = False
        if ok:
            out.append(MetricSpec(name, float(threshold), severity))
    return out


def _section(raw: dict[str, Any], key: str, errors: _Errors, allowed: set[str]) -> dict[str, Any]:
    value = raw.get(key) or {}
    if not isinstance(value, dict):
        errors.add(key, f"{value!r} is not a mapping")
        return {}
    errors.check_keys(key, value, allowed)
    return value


def _fraction(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value < 1:
        raise ValueError("expected a number between 0 and 1 (exclusive)")
    return float(value)


def _positive_number(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value < math.inf:
        raise ValueError("expected a number > 0")
    return float(value)


def _parse_alerting(raw: dict[str, Any], errors: _Errors) -> AlertingConfig:
    return AlertingConfig(
        false_pages_per_day=_get(raw, "false_pages_per_day", 0.01, errors, "alerting.", _positive_number),
        replicas=_get(raw, "replicas", 1, errors, "alerting.", _positive_int),
        rate_shift=_get(raw, "rate_shift", 0.10, errors, "alerting.", _fraction),
    )


_TOP_LEVEL: Final = {
    "model_id", "protected_attributes", "intersections", "metrics", "failure_policy", "min_samples",
    "unknown_values", "columns", "kafka", "events", "windows", "bucket", "allowed_lateness", "max_future_skew",
    "evaluation_interval", "label_horizon", "max_pending_labels", "listen", "checkpoint", "alerting",
}  # fmt: skip


def parse_config(raw: Any, source: str = "<config>") -> Config:
    """Validate a parsed YAML document; raise ConfigError listing every problem."""
    errors = _Errors()
    if not isinstance(raw, dict):
        raise ConfigError(f"{source}: the config must be a YAML mapping, got {type(raw).__name__}")
    raw = _expand_env(raw, errors)
    errors.check_keys("", raw, _TOP_LEVEL)
    model_id = raw.get("model_id")
    if not isinstance(model_id, str) or not model_id.strip():
        errors.add("model_id", f"{model_id!r} is not a non-empty string")
    unknown_values = _get(raw, "unknown_values", "reject", errors, "", _choice("reject", "other"))
    base = _parse_attributes(raw.get("protected_attributes"), unknown_values == "other", errors)
    attributes = base + _parse_intersections(raw.get("intersections"), base, errors)
    metrics = _parse_metrics(raw.get("metrics"), errors)

    columns = _section(raw, "columns", errors, {"prediction", "label", "score", "timestamp"})
    kafka_raw = _section(raw, "kafka", errors, set(KafkaConfig.__dataclass_fields__))
    events_raw = _section(raw, "events", errors, set(EventFields.__dataclass_fields__))
    listen = _section(raw, "listen", errors, {"address", "port", "tls_cert_file", "tls_key_file"})
    checkpoint = raw.get("checkpoint")
    if checkpoint is not None and not (isinstance(checkpoint, dict) and isinstance(checkpoint.get("path"), str)):
        errors.add("checkpoint", f"{checkpoint!r} is not a mapping with a path (and optional interval)")
        checkpoint = None
    elif checkpoint is not None:
        errors.check_keys("checkpoint", checkpoint, {"path", "interval"})

    kafka = KafkaConfig()
    servers = kafka_raw.get("bootstrap_servers", kafka.bootstrap_servers)
    try:
        kafka = KafkaConfig(**{**kafka_raw, "bootstrap_servers": ",".join(servers) if isinstance(servers, list)
                               else str(servers)})  # fmt: skip
    except TypeError as exc:
        errors.add("kafka", str(exc))
    if kafka.auto_offset_reset not in ("earliest", "latest"):
        errors.add("kafka.auto_offset_reset", f"{kafka.auto_offset_reset!r} is not one of earliest, latest")
    if kafka.assignment not in ("subscribe", "manual"):
        errors.add("kafka.assignment", f"{kafka.assignment!r} is not one of subscribe, manual")
    if kafka.client_library not in ("kafka-python", "confluent-kafka"):
        errors.add("kafka.client_library", f"{kafka.client_library!r} is not one of kafka-python, confluent-kafka")
    if not isinstance(kafka.client, dict):
        errors.add("kafka.client", f"{kafka.client!r} is not a mapping of kafka-python settings")
    threshold = _get(events_raw, "score_threshold", None, errors, "events.", float)
    if threshold is not None and not 0 <= threshold <= 1:
        errors.add("events.score_threshold", f"{threshold!r} is not between 0 and 1")
    events = EventFields(**{**{k: str(v) for k, v in events_raw.items()}, "score_threshold": threshold})

    windows_raw = raw.get("windows", ["1h", "24h"])
    windows: list[Window] = []
    if not isinstance(windows_raw, list) or not windows_raw:
        errors.add("windows", f"{windows_raw!r} is not a non-empty list of durations such as [1h, 24h]")
    else:
        for i, w in enumerate(windows_raw):
            try:
                windows.append(Window(str(w), parse_duration(w)))
            except ValueError as exc:
                errors.add(f"windows[{i}]", str(exc))
    bucket = _get(raw, "bucket", 60.0, errors, "", parse_duration)
    for w in windows:
        if w.seconds % bucket:
            errors.add("windows", f"{w.name} is not a whole number of buckets of {raw.get('bucket', '1m')}")

    alerting = _parse_alerting(_section(raw, "alerting", errors, set(AlertingConfig.__dataclass_fields__)), errors)
    config = Config(
        model_id=str(model_id),
        base_attributes=tuple(base),
        attributes=tuple(attributes),
        metrics=tuple(metrics),
        min_samples=_get(raw, "min_samples", 30, errors, "", _positive_int),
        unknown_values=unknown_values,
        prediction_column=str(columns.get("prediction", "prediction")),
        label_column=str(columns.get("label", "label")),
        score_column=str(columns["score"]) if columns.get("score") is not None else None,
        timestamp_column=str(columns.get("timestamp", "timestamp")),
        kafka=kafka,
        events=events,
        windows=tuple(windows),
        bucket_seconds=bucket,
        allowed_lateness_seconds=_get(raw, "allowed_lateness", 300.0, errors, "", parse_duration),
        max_future_skew_seconds=_get(raw, "max_future_skew", 300.0, errors, "", parse_duration),
        evaluation_interval_seconds=_get(raw, "evaluation_interval", 15.0, errors, "", parse_duration),
        label_horizon_seconds=_get(raw, "label_horizon", 7 * 86400.0, errors, "", parse_duration),
        max_pending_labels=_get(raw, "max_pending_labels", 1_000_000, errors, "", _positive_int),
        listen_address=str(listen.get("address", "0.0.0.0")),
        listen_port=_get(listen, "port", DEFAULT_PORT, errors, "listen.", _port),
        tls_cert_file=listen.get("tls_cert_file"),
        tls_key_file=listen.get("tls_key_file"),
        checkpoint_path=checkpoint["path"] if checkpoint else None,
        checkpoint_interval_seconds=_get(checkpoint or {}, "interval", 30.0, errors, "checkpoint.", parse_duration),
        alerting=alerting,
        source=source,
    )
    if bool(config.tls_cert_file) != bool(config.tls_key_file):
        errors.add("listen", "tls_cert_file and tls_key_file must be set together")
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
