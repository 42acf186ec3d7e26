"""Validate the stream's sections of the config: kafka (with the client library's own settings), windows, listen,
checkpoint, and the per-model events paths and alerting budget.

Every check records its problem and carries on, so :func:`exporter.config.parse_config` lists them all at once.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import ipaddress
import itertools
import logging
import math
import re
from pathlib import Path
from typing import Any, Final

from exporter.config.clients import kafka_python_problems, librdkafka_problems
from exporter.config.toolkit import Errors, get, positive_int
from exporter.config.types import (
    AlertingConfig,
    Config,
    EventFields,
    InternalTopic,
    InternalTopics,
    KafkaConfig,
    Window,
    parse_duration,
    topic_regex,
)

log = logging.getLogger(__name__)

_TOPIC = re.compile(r"^[A-Za-z0-9._-]{1,249}$")  # Kafka's own rule for topic names


def _milliseconds(seconds: float) -> int:
    """A duration in whole milliseconds, the unit of the smallest duration the config accepts (exact arithmetic)."""
    return round(seconds * 1000)


def parse_kafka(raw: dict[str, Any], errors: Errors) -> KafkaConfig:
    """The kafka section; every value type-checked, the client settings against the chosen library's own list."""
    defaults = KafkaConfig()
    values: dict[str, Any] = {}
    servers = raw.get("bootstrap_servers", defaults.bootstrap_servers)
    if isinstance(servers, list) and servers and all(isinstance(s, str) and s for s in servers):
        values["bootstrap_servers"] = ",".join(servers)
    elif isinstance(servers, str) and servers.strip():
        values["bootstrap_servers"] = servers
    else:
        errors.add("kafka.bootstrap_servers", f"{servers!r} is not host:port or a list of host:port")
    for key in ("topic", "response_topic", "labels_topic", "dead_letter_topic"):
        topic = raw.get(key, getattr(defaults, key))
        if topic is None:
            continue
        if isinstance(topic, str) and _TOPIC.match(topic):
            values[key] = topic
        else:
            errors.add(f"kafka.{key}", f"{topic!r} is not a topic name (1 to 249 of A-Z a-z 0-9 . _ -)")
    _events_topics(raw, values, errors)
    group_id = raw.get("group_id", defaults.group_id)
    if isinstance(group_id, str) and group_id:
        values["group_id"] = group_id
    else:
        errors.add("kafka.group_id", f"{group_id!r} is not a non-empty string")
    for key, options in (("auto_offset_reset", ("earliest", "latest")), ("assignment", ("subscribe", "manual")),
                         ("client_library", ("kafka-python", "confluent-kafka")), ("stages", ("direct", "staged"))):
        value = raw.get(key, getattr(defaults, key))
        if value in options:
            values[key] = value
        else:
            errors.add(f"kafka.{key}", f"{value!r} is not one of {', '.join(options)}")
    if values.get("stages") == "staged" and values.get("assignment") == "manual":
        errors.add("kafka.assignment", "manual reads every partition, but kafka.stages: staged shares them among the "
                                       "consumer group's replicas: use subscribe")  # fmt: skip
    values["internal_topics"] = _internal_topics(raw.get("internal_topics"), errors)
    named = ("response_topic", "labels_topic", "dead_letter_topic") if "topics" in values or "topic_pattern" in values \
        else ("topic", "response_topic", "labels_topic", "dead_letter_topic")  # fmt: skip
    topics = [values.get(k) for k in named if values.get(k)]
    topics += [t.name for t in (values["internal_topics"].join, values["internal_topics"].counts) if t.name]
    topics += values.get("topics", ())
    if len(set(topics)) != len(topics):
        errors.add("kafka", f"topic, labels_topic, dead_letter_topic and the internal topics must differ, got {topics}")
    for pattern in values.get("topic_pattern", ()):
        for topic in topics:
            if re.fullmatch(topic_regex(pattern), str(topic)):
                errors.add("kafka.topic_pattern", f"{pattern!r} matches {topic!r}, which would be read as events")
    client = raw.get("client") or {}
    if not isinstance(client, dict) or not all(isinstance(k, str) for k in client):
        errors.add("kafka.client", f"{client!r} is not a mapping of client settings")
    elif client:
        library = values.get("client_library", defaults.client_library)
        check = librdkafka_problems if library == "confluent-kafka" else kafka_python_problems
        for key, problem in check(client):
            errors.add(f"kafka.client.{key}" if key else "kafka.client_library", problem)
        values["client"] = client
    return KafkaConfig(**values)


_PATTERN = re.compile(r"^[A-Za-z0-9._*-]{1,249}$")
"""A topic pattern: a topic name whose ``*`` stand for any run of characters but a dot."""


def _events_topics(raw: dict[str, Any], values: dict[str, Any], errors: Errors) -> None:
    """kafka.topics (a list of topic names) or kafka.topic_pattern (a name with ``*``), each instead of
    kafka.topic: one of the three."""
    given = [k for k in ("topic", "topics", "topic_pattern") if raw.get(k) is not None]
    if len(given) > 1:
        errors.add(f"kafka.{given[1]}", f"give one of kafka.topic, kafka.topics and kafka.topic_pattern, not "
                                        f"{' and '.join(f'kafka.{k}' for k in given)}")  # fmt: skip
        return
    topics, pattern = raw.get("topics"), raw.get("topic_pattern")
    if topics is not None:
        if not (isinstance(topics, list) and topics and all(isinstance(t, str) and _TOPIC.match(t) for t in topics)):
            errors.add("kafka.topics", f"{topics!r} is not a non-empty list of topic names (each 1 to 249 of A-Z a-z "
                                       "0-9 . _ -)")  # fmt: skip
        elif len(set(topics)) != len(topics):
            errors.add("kafka.topics", f"{topics!r} names a topic twice")
        else:
            values["topics"] = tuple(topics)
    if pattern is not None:
        if isinstance(pattern, str) and _PATTERN.match(pattern) and "*" in pattern:
            values["topic_pattern"] = (pattern,)
        else:
            errors.add("kafka.topic_pattern", f"{pattern!r} is not a topic name with * for any run of characters "
                                              "but a dot, such as seldon.prod.model.*.inputs")  # fmt: skip
    if (topics is not None or pattern is not None) and raw.get("response_topic") is not None:
        errors.add("kafka.response_topic", f"is one topic beside kafka.topic; with kafka.{given[0]}, Seldon's "
                                           "outputs topics are read beside its inputs topics")  # fmt: skip


def _internal_topics(raw: Any, errors: Errors) -> InternalTopics:
    """kafka.internal_topics: {join: {name, partitions, retention}, counts: {...}}, each key optional."""
    if raw is None:
        return InternalTopics()
    if not isinstance(raw, dict):
        errors.add("kafka.internal_topics", f"{raw!r} is not a mapping with join and counts")
        return InternalTopics()
    errors.check_keys("kafka.internal_topics", raw, {"join", "counts"})
    topics = {}
    for key in ("join", "counts"):
        item = raw.get(key) or {}
        path = f"kafka.internal_topics.{key}"
        if not isinstance(item, dict):
            errors.add(path, f"{item!r} is not a mapping with name, partitions and retention")
            continue
        errors.check_keys(path, item, {"name", "partitions", "retention"})
        name = item.get("name")
        if name is not None and not (isinstance(name, str) and _TOPIC.match(name)):
            errors.add(f"{path}.name", f"{name!r} is not a topic name (1 to 249 of A-Z a-z 0-9 . _ -)")
            name = None
        topics[key] = InternalTopic(name, get(item, "partitions", 12, errors, f"{path}.", positive_int),
                                    get(item, "retention", None, errors, f"{path}.", parse_duration))  # fmt: skip
    return InternalTopics(**topics)


PAYLOAD_FORMATS: Final = ("json", "kserve", "seldon")
PAYLOAD_UNUSED: Final = frozenset({"model_id", "timestamp", "score", "attributes"})
"""Event paths a payload format has no use for (the model, the time and the columns come from the payload)."""


def seldon_outputs(topic: str) -> str | None:
    """Seldon's outputs topic of a model's inputs topic (``seldon.<ns>.model.<name>.inputs``), else None."""
    parts = topic.split(".")
    if len(parts) >= 5 and parts[-3] == "model" and parts[-1] == "inputs":
        return ".".join([*parts[:-1], "outputs"])
    return None


def payload_layout(kafka: KafkaConfig, payload: str, errors: Errors) -> KafkaConfig:
    """The kafka section as a payload format reads it: Seldon's outputs topic beside its inputs topic."""
    if payload == "json":
        return kafka
    if payload == "seldon" and importlib.util.find_spec("google.protobuf") is None:
        errors.add("events.format", "seldon reads protobuf, which is not installed: pip install "
                                    "'fairness-exporter[seldon]'")  # fmt: skip
    if payload == "seldon" and (kafka.topics or kafka.topic_pattern):
        named = [(t, seldon_outputs(t)) for t in kafka.topics]
        patterns = [(p, seldon_outputs(p)) for p in kafka.topic_pattern]
        for name, outputs in named + patterns:
            if outputs is None:
                key = "topics" if kafka.topics else "topic_pattern"
                errors.add(f"kafka.{key}", f"{name!r}: events.format seldon reads models' "
                                           "seldon.<namespace>.model.<name>.inputs topics (each one's .outputs "
                                           "beside it)")  # fmt: skip
        return dataclasses.replace(kafka, topics=tuple(t for pair in named for t in pair if t),
                                   topic_pattern=tuple(p for pair in patterns for p in pair if p))  # fmt: skip
    if payload == "seldon" and any(line.startswith(("kafka.topics:", "kafka.topic_pattern:")) for line in errors.lines):
        return kafka  # kafka.topic was not meant
    if payload == "seldon" and kafka.response_topic is None:
        outputs = seldon_outputs(kafka.topic)
        if outputs is None:
            errors.add("kafka.topic", f"{kafka.topic!r}: events.format seldon reads a model's "
                                      "seldon.<namespace>.model.<name>.inputs topic (its .outputs beside it), or set "
                                      "kafka.response_topic")  # fmt: skip
        return dataclasses.replace(kafka, response_topic=outputs)
    return kafka


def parse_events(raw: dict[str, Any], errors: Errors) -> EventFields:
    """The events section: dotted field paths (strings), an optional score threshold in 0..1 and the bounds of the
    score histograms."""
    values: dict[str, Any] = {}
    payload = raw.get("format", "json")
    if payload not in PAYLOAD_FORMATS:
        errors.add("events.format", f"{payload!r} is not one of {', '.join(PAYLOAD_FORMATS)}")
    for key in EventFields.__dataclass_fields__:
        if key not in raw or raw[key] is None:
            continue
        value = raw[key]
        if key == "format":
            values[key] = value
        elif key == "pair_horizon":
            values[key] = get(raw, key, 600.0, errors, "events.", parse_duration)
        elif key == "component" and payload != "kserve":
            errors.add("events.component", "only KServe's payload logger names the component that logged a call "
                                           "(events.format kserve)")  # fmt: skip
        elif payload != "json" and key in PAYLOAD_UNUSED:
            errors.add(f"events.{key}", f"not read with events.format {payload}: a payload's rows name their "
                                        "columns (events.prediction names the output column, each protected "
                                        "attribute its column)")  # fmt: skip
        elif key == "score_threshold":
            try:
                threshold = float(value)  # a string too: ${ENV} references expand to strings
            except (TypeError, ValueError):
                threshold = -1.0
            if isinstance(value, bool) or not 0 <= threshold <= 1:
                errors.add("events.score_threshold", f"{value!r} is not a number between 0 and 1")
            else:
                values[key] = threshold
        elif key == "score_buckets":
            bounds = _score_buckets(value)
            if bounds is None:
                errors.add("events.score_buckets", f"{value!r} is not a list of increasing numbers in 0..1 "
                                                   "such as [0.1, 0.2, 0.5]")  # fmt: skip
            else:
                values[key] = bounds
        elif isinstance(value, str) and value.strip():
            values[key] = value
        else:
            errors.add(f"events.{key}", f"{value!r} is not a dotted field path such as attributes.gender")
    if values.get("score_buckets") and "score_threshold" not in values:
        errors.add("events.score_buckets", "needs events.score_threshold: only a model that emits scores has "
                                           "score histograms")  # fmt: skip
    return EventFields(**values)


def _score_buckets(value: Any) -> tuple[float, ...] | None:
    """Histogram upper bounds: a non-empty list of strictly increasing numbers in 0..1, else None."""
    if not isinstance(value, list) or not value or any(isinstance(v, bool) for v in value):
        return None
    try:
        bounds = tuple(float(v) for v in value)
    except (TypeError, ValueError):
        return None
    if not all(0.0 <= b <= 1.0 for b in bounds) or any(b >= c for b, c in itertools.pairwise(bounds)):
        return None
    return bounds


def parse_windows(raw: Any, bucket_raw: Any, errors: Errors) -> tuple[list[Window], float]:
    """The windows and the bucket width; each window a distinct whole number of buckets."""
    bucket = 60.0
    if bucket_raw is not None:
        try:
            bucket = parse_duration(bucket_raw)
        except ValueError as exc:
            errors.add("bucket", str(exc))
    windows: list[Window] = []
    if not isinstance(raw, list) or not raw:
        errors.add("windows", f"{raw!r} is not a non-empty list of durations such as [1h, 24h]")
        return windows, bucket
    for i, w in enumerate(raw):
        try:
            window = Window(str(w), parse_duration(w))
        except ValueError as exc:
            errors.add(f"windows[{i}]", str(exc))
            continue
        same = [other.name for other in windows if _milliseconds(other.seconds) == _milliseconds(window.seconds)]
        if same:
            errors.add(f"windows[{i}]", f"{window.name} is the same window as {same[0]} (each would be exported "
                                        "twice)")  # fmt: skip
            continue
        if _milliseconds(window.seconds) % _milliseconds(bucket):
            errors.add(f"windows[{i}]", f"{window.name} is not a whole number of buckets of "
                                        f"{bucket_raw if bucket_raw is not None else '1m'}")  # fmt: skip
        windows.append(window)
    return windows, bucket


MIN_EVALUATION_SECONDS: Final = 1.0
"""evaluation_interval at least 1s: each computation takes the stream's lock and renders every series (1ms was
accepted, and computed without pause)."""
CHECKPOINT_SECONDS: Final = (1.0, 3600.0)
"""checkpoint.interval between 1s (each checkpoint is an fsync'd file of every window) and 1h (a restart re-reads
what was counted since the last one, and offsets are committed only as checkpoints cover them)."""
MAX_RING_BUCKETS: Final = 1_000_000
"""Buckets of the longest window plus allowed_lateness: every model keeps a row of counts per bucket in memory."""


def _duration(seconds: float) -> str:
    """A duration as the config writes it (1h, 90s, 100ms)."""
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60), ("s", 1)):
        if seconds >= size and _milliseconds(seconds) % _milliseconds(size) == 0:
            return f"{_milliseconds(seconds) // _milliseconds(size)}{unit}"
    return f"{_milliseconds(seconds)}ms"


def check_periods(config: Config, raw: dict[str, Any], errors: Errors) -> None:
    """The periods the daemon runs on, within bounds that work: evaluation_interval from 1s to the shortest window
    (a window computed less often than its own length is skipped in part), checkpoint.interval from 1s to 1h, and
    a ring of at most :data:`MAX_RING_BUCKETS` buckets."""
    w = config.windowing
    shortest = min(window.seconds for window in w.windows)
    evaluation = config.evaluation_interval_seconds
    if "evaluation_interval" in raw and not MIN_EVALUATION_SECONDS <= evaluation <= shortest:
        errors.add("evaluation_interval", f"{raw['evaluation_interval']} is out of range: from 1s to the shortest "
                                          f"window ({_duration(shortest)})")  # fmt: skip
    low, high = CHECKPOINT_SECONDS
    if config.checkpoint_path is not None or config.kafka.stages == "staged":
        interval = config.checkpoint_interval_seconds
        if not low <= interval <= high:
            errors.add("checkpoint.interval", f"{_duration(interval)} is out of range: from 1s to 1h")
    buckets = math.ceil((w.longest_seconds + w.allowed_lateness_seconds) / w.bucket_seconds)
    if buckets > MAX_RING_BUCKETS:
        errors.add("bucket", f"{_duration(w.bucket_seconds)} makes {buckets:,} buckets of the longest window plus "
                             f"allowed_lateness ({_duration(w.longest_seconds + w.allowed_lateness_seconds)}), each "
                             f"kept in memory per model: at most {MAX_RING_BUCKETS:,}; use a wider bucket")  # fmt: skip


def check_listen(address: Any, errors: Errors) -> str:
    """The bind address: an IP address (0.0.0.0 for every IPv4 interface, :: for IPv6)."""
    try:
        return str(ipaddress.ip_address(str(address)))
    except ValueError:
        errors.add("listen.address", f"{address!r} is not an IP address (e.g. 0.0.0.0, 127.0.0.1, ::)")
        return str(address)


def check_checkpoint_dir(path: str, errors: Errors) -> None:
    """The checkpoint directory, or its nearest existing ancestor, must be a directory (it is created on write)."""
    for candidate in (Path(path), *Path(path).absolute().parents):
        if candidate.exists():
            if not candidate.is_dir():
                where = "is a file" if candidate == Path(path) else f"is under {candidate}, which is a file"
                errors.add("checkpoint.path", f"{path} {where}: expected a directory for the checkpoint files")
            return


def _fraction(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value < 1:
        raise ValueError("expected a number between 0 and 1 (exclusive)")
    return float(value)


def _positive_number(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value < math.inf:
        raise ValueError("expected a number > 0")
    return float(value)


ALERTING_KEYS: Final = frozenset({*AlertingConfig.__dataclass_fields__, "replicas"})
"""The alerting section's keys: ``replicas`` is accepted, and ignored, for one release."""


def parse_alerting(raw: dict[str, Any], errors: Errors) -> AlertingConfig:
    """The change detectors' section: their false-page budget and the rate shift; the label join's alarm level."""
    if "replicas" in raw:
        log.warning("alerting.replicas is deprecated and ignored: each model's detectors see all of its traffic "
                    "(kafka.stages: staged above one replica), so each keeps the whole false-page budget")
    return AlertingConfig(
        false_pages_per_day=get(raw, "false_pages_per_day", 0.01, errors, "alerting.", _positive_number),
        rate_shift=get(raw, "rate_shift", 0.10, errors, "alerting.", _fraction),
        max_unjoined_share=get(raw, "max_unjoined_share", 0.5, errors, "alerting.", _fraction),
    )
