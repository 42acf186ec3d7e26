"""The validated config's types: one :class:`ModelSpec` per model, and the daemon's shared settings in
:class:`Config`.

A ``ModelSpec`` is everything the gate, the daemon and ``backtest`` need to know about one model (its attributes,
metrics, thresholds, decision rule, columns and event field paths); each stage is handed the spec and only the
shared settings it needs (:class:`Windowing` for the windows, :class:`KafkaConfig` for the source).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Final, Literal

from exporter.core.attributes import Attribute
from exporter.core.conditional import CONDITIONAL_METRICS, metric
from exporter.core.metric_table import METRICS

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

    def passes(self, value: float) -> bool:
        """The point estimate against the threshold, in the metric's pass direction (from the metric table)."""
        return metric(self.name).passes(value, self.threshold)


@dataclass(frozen=True)
class InternalTopic:
    """One internal topic of the staged path; None: derived (name from the group id, retention from the config)."""

    name: str | None = None
    partitions: int = 12
    """Used only when the daemon creates the topic: an existing topic's partition count is the truth."""
    retention_seconds: float | None = None


@dataclass(frozen=True)
class InternalTopics:
    """The staged path's internal topics: ``join`` (re-keyed by prediction id) and ``counts`` (keyed by model id,
    whose partitions are the ceiling on evaluation parallelism)."""

    join: InternalTopic = field(default_factory=InternalTopic)
    counts: InternalTopic = field(default_factory=InternalTopic)


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
    response_topic: str | None = None
    """Where the responses are when not on ``topic`` (Seldon's ``.outputs`` beside ``.inputs``)."""
    dead_letter_topic: str | None = None
    client: dict[str, Any] = field(default_factory=dict)
    stages: Literal["direct", "staged"] = "direct"
    """direct: each replica counts what it reads; staged: ingest, label join and evaluation run as stages joined by
    internal topics, so each model lives whole on one replica of the group (exporter/stream/stages/replica.py)."""
    internal_topics: InternalTopics = field(default_factory=InternalTopics)
    topics: tuple[str, ...] = ()
    """Events topics read instead of ``topic`` (a fleet of Seldon models: each one's inputs and outputs topics)."""
    topic_pattern: tuple[str, ...] = ()
    """Events topics by name instead of ``topic``: ``*`` stands for any run of characters but a dot
    (``seldon.prod.model.*.inputs``, and Seldon's outputs beside it); topics that appear later are read too."""

    def events_topics(self) -> list[str]:
        """The events topics named in the config (a pattern's are found on the broker)."""
        if self.topics or self.topic_pattern:
            return list(self.topics)
        return [t for t in (self.topic, self.response_topic) if t]

    def reads_events(self, topic: str) -> bool:
        """Whether this topic holds events (or a payload log's requests or responses), named or matched."""
        return topic in self.events_topics() or any(re.fullmatch(topic_regex(p), topic) for p in self.topic_pattern)

    def topics_now(self, cluster: Callable[[], set[str] | None], named: list[str]) -> list[str] | None:
        """The topics to read now: ``named``, and those of the cluster's (``cluster()``, asked only with a pattern)
        that match ``topic_pattern``; None without a pattern, or while no broker answers (the topics known stay)."""
        names = cluster() if self.topic_pattern else None
        return None if names is None else [*named, *sorted(t for t in names - set(named) if self.reads_events(t))]


def topic_regex(pattern: str) -> str:
    """A ``kafka.topic_pattern`` as a regular expression: ``*`` is any run of characters but a dot."""
    return re.escape(pattern).replace(r"\*", "[^.]*")


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
    format: str = "json"
    pair_horizon: float = 600.0
    """Payload formats: how long (seconds) a request or response waits for its partner before it is given up."""
    """json: our events at the paths above; kserve / seldon: the platform's payload log, whose rows name their
    columns (exporter/stream/payloads/payload.py): ``prediction`` names the output column, each attribute its
    ``column``."""
    component: str | None = None
    """KServe: count only the calls this InferenceService component logged (``transformer``, ``predictor``); the
    other components' logs of them, under ids of their own, are ignored (None: every component's)."""


@dataclass(frozen=True)
class AlertingConfig:
    """The change detectors' false-alarm budget and the subgroup rate shift worth a warning."""

    false_pages_per_day: float = 0.01
    """Expected false pages per day, shared by every detector of the model."""
    rate_shift: float = 0.10
    """SubgroupPredictionRateShift: a move of a subgroup's selection rate from its own baseline worth a warning."""
    max_unjoined_share: float = 0.5
    """FairnessLabelJoinBroken: above this share of delayed labels that found no prediction, the join is broken
    (one value for every model: labels carry no model)."""


@dataclass(frozen=True)
class Window:
    """A sliding event-time window, named as written in the config."""

    name: str
    seconds: float


@dataclass(frozen=True)
class Windowing:
    """The event-time windows every model is kept in: their bucket width and how late an event may be."""

    windows: tuple[Window, ...] = (Window("1h", 3600), Window("24h", 86400))
    bucket_seconds: float = 60
    allowed_lateness_seconds: float = 300

    @property
    def longest_seconds(self) -> float:
        return max(w.seconds for w in self.windows)


@dataclass(frozen=True)
class EstimationSpec:
    """``estimation:``: label-based metrics estimated from calibrated scores while the labels are missing."""

    reference: str
    """A labelled file (score, label and the attributes) the per-group calibration is fitted on: a path relative
    to the config's folder, or a URL; read like the evaluation data."""


@dataclass(frozen=True)
class AttributeSource:
    """``attribute_sources.<name>``: protected attributes kept apart, joined by an id (exporter/core/side_table.py)."""

    name: str
    id: str
    """The column holding the id, read where an attribute's column is read (events' attributes, payload columns)."""
    topic: str | None = None
    """The daemon's side: a compacted topic, key the id (UTF-8), value a JSON object {column: value}."""
    path: str | None = None
    """The gate's and backtest's side: a dataset (file, folder, glob or prefix) with the id column."""
    horizon_seconds: float = 600.0
    """How long a prediction waits for its record before its attributes count as unknown."""
    max_records: int = 10_000_000
    timestamp_column: str | None = None
    """``timestamp``: the dataset's column of each row's time, from which it is in force (a version, as a record's
    Kafka timestamp in the topic); None: every row always, the latest of an id winning (a snapshot)."""


@dataclass(frozen=True)
class ModelSpec:
    """One model, as the gate audits it and the daemon monitors it; see docs/contract.md for the YAML form."""

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
    events: EventFields = field(default_factory=EventFields)
    alerting: AlertingConfig = field(default_factory=AlertingConfig)
    model_version: str | None = None
    """The version of the model every audit record names (the seed's "audit trail for each model version"), and
    whose events this model id counts, on /metrics as fairness_model_info; another version's counts are another
    model's, so a new version starts afresh (:func:`layout`)."""
    evaluation_dataset: str | None = None
    """The gate's data when the command line names none: a local path (relative to the config) or a URL."""
    estimation: EstimationSpec | None = None
    """Where the calibration of estimated label-based metrics comes from (docs/auditor/estimated.md)."""
    report_destination: str | None = None
    """failure_policy.report_destination: a folder or URL that receives every report, named by model and time."""
    source: str = "<config>"
    """The file (or ``file#models[i]``) the model was configured in."""
    segments: tuple[str, ...] = ()
    """Columns whose values explain a gap's change (:mod:`exporter.core.explain`)."""
    segment_values: int = 20
    """Values kept per segment column (and per combination of strata); the rest are counted as ``other``."""
    strata: tuple[str, ...] = ()
    """Columns conditional parity is conditioned on (:mod:`exporter.core.conditional`)."""
    baseline_offset: float | None = None
    """The daemon's explanations: how far before each window its baseline window ends (seconds); None: the window's
    own length (the window just before it)."""
    attribute_sources: tuple[AttributeSource, ...] = ()
    """The side sources its attributes name (``source:``)."""
    multiplicity: Literal["holm", "bonferroni", "none"] = "holm"
    """How a comparison's ``fail`` evidence is judged across its metric's comparisons of one attribute
    (docs/auditor/numbers.md#many-comparisons)."""

    def sourced(self) -> dict[str, tuple[Attribute, ...]]:
        """The base attributes read from each side source, by source name."""
        out: dict[str, tuple[Attribute, ...]] = {}
        for a in self.base_attributes:
            if a.source is not None:
                out[a.source] = (*out.get(a.source, ()), a)
        return out

    def thresholds(self) -> dict[str, float]:
        """The threshold of every exported metric: as configured, else the metric table's default."""
        configured = {m.name: m.threshold for m in self.metrics}
        return {**{name: configured.get(name, METRICS[name].default_threshold) for name in self.exported_metrics},
                **{m.name: m.threshold for m in self.metrics if m.name in self.conditional_metrics}}

    def severities(self) -> dict[str, str]:
        """The severity_on_fail of every exported metric; ``none`` for a seed metric exported without being
        configured (the gate does not judge it)."""
        configured = {m.name: m.severity for m in self.metrics}
        return {name: configured.get(name, "none") for name in (*self.exported_metrics, *self.conditional_metrics)}

    @property
    def conditional_metrics(self) -> tuple[str, ...]:
        """The configured conditional metrics (``strata:``), exported beside the others."""
        return tuple(m.name for m in self.metrics if m.name in CONDITIONAL_METRICS)

    @property
    def exported_metrics(self) -> tuple[str, ...]:
        """Metrics on /metrics: the seed's three (as always) and every configured one, in table order."""
        configured = {m.name for m in self.metrics}
        return tuple(name for name, m in METRICS.items() if m.seed or name in configured)

    @property
    def counted_columns(self) -> tuple[str, ...]:
        """The columns counted per (subgroup x value): the segments', then the strata's."""
        return tuple(dict.fromkeys([*self.segments, *self.strata]))

    @property
    def compares_scores(self) -> bool:
        """Whether a configured metric compares scores (``auc_difference``): the labelled score histograms are
        then kept per group, as for the estimation."""
        return any(metric(m.name).scores for m in self.metrics)

    @property
    def calibrates(self) -> bool:
        """Whether ``calibration_difference`` is configured: the labelled scores' sums are then kept per score bin (a
        waiting prediction keeps its score for its label)."""
        return any(m.name == "calibration_difference" for m in self.metrics)

    @property
    def score_buckets(self) -> tuple[float, ...]:
        """Upper bounds of the score bins (histograms, AUC, ECE, estimation): ``events.score_buckets`` or the default,
        with the decision threshold at :attr:`added_score_bound`; empty when the model emits no scores."""
        bounds, at = self.events.score_buckets or DEFAULT_SCORE_BUCKETS, self.added_score_bound
        if self.events.score_threshold is None:
            return ()
        return bounds if at is None else (*bounds[:at], self.events.score_threshold, *bounds[at:])

    @property
    def added_score_bound(self) -> int | None:
        """Where the decision threshold was added to the score bins' bounds: a model that estimates, whose bounds lack
        it (the estimate calibrates a bin as one, and a bin the threshold cut would give its predicted negatives and
        positives one probability). AUC and ECE merge that bound's two bins back: they measure on the bins
        configured. None: nothing added."""
        t, bounds = self.events.score_threshold, self.events.score_buckets or DEFAULT_SCORE_BUCKETS
        return None if t is None or self.estimation is None or t in bounds else sum(b < t for b in bounds)


@dataclass(frozen=True)
class Config:
    """A validated config: the models, and the settings the daemon shares between them."""

    models: tuple[ModelSpec, ...]
    kafka: KafkaConfig = field(default_factory=KafkaConfig)
    windowing: Windowing = field(default_factory=Windowing)
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
    models_dir: str | None = None
    """A directory of one file per model, read with the config (and on every reload)."""
    source: str = "<config>"

    def model(self, model_id: str | None = None) -> ModelSpec:
        """The model of this id, or the only model when ``model_id`` is None (ConfigError otherwise)."""
        if model_id is None:
            if len(self.models) == 1:
                return self.models[0]
            raise ConfigError(f"{self.source}: configures {len(self.models)} models "
                              f"({', '.join(m.model_id for m in self.models)}): name one with --model")  # fmt: skip
        for model in self.models:
            if model.model_id == model_id:
                return model
        raise ConfigError(f"{self.source}: no model {model_id!r} (configured: "
                          f"{', '.join(m.model_id for m in self.models)})")  # fmt: skip

    @property
    def model_ids(self) -> tuple[str, ...]:
        return tuple(m.model_id for m in self.models)

    @property
    def attribute_sources(self) -> dict[str, AttributeSource]:
        """Every side source a model's attributes name, by name (one definition each: checked by the config)."""
        return {s.name: s for m in self.models for s in m.attribute_sources}

    @property
    def attribute_fields(self) -> dict[str, tuple[str, ...]]:
        """The record keys each side source's table keeps: the columns of the attributes that name it, in every
        model, in order of appearance."""
        out: dict[str, list[str]] = {name: [] for name in self.attribute_sources}
        for model in self.models:
            for name, attributes in model.sourced().items():
                out[name] += [a.columns[0] for a in attributes if a.columns[0] not in out[name]]
        return {name: tuple(fields) for name, fields in out.items()}
