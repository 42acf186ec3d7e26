"""Validate ``attribute_sources:`` (protected attributes joined by id from a side source) and each attribute's
``source:`` naming one of them; docs/ml/joined-attributes.md."""

from __future__ import annotations

from dataclasses import replace
from typing import Any, Final

from exporter.config.toolkit import Errors, get, positive_int, text
from exporter.config.types import AttributeSource, Config, parse_duration
from exporter.core.attributes import Attribute

SOURCE_KEYS: Final = frozenset({"topic", "path", "id", "timestamp", "horizon", "max_records"})


def parse_sources(raw: Any, errors: Errors) -> dict[str, AttributeSource]:
    """``attribute_sources: {name: {id, topic and/or path, timestamp, horizon, max_records}}``."""
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        errors.add("attribute_sources", f"{raw!r} is not a mapping of source names to {{id, topic, path}}")
        return {}
    out = {}
    for name, spec in raw.items():
        path = f"attribute_sources.{name}"
        if not isinstance(spec, dict):
            errors.add(path, f"{spec!r} is not a mapping with id and a topic (daemon) or a path (gate)")
            continue
        errors.check_keys(path, spec, set(SOURCE_KEYS))
        at = f"{path}."
        id_column = get(spec, "id", None, errors, at, text)
        if id_column is None and "id" not in spec:
            errors.add(f"{path}.id", "required: the column holding the id the side records are keyed by")
        topic, location = get(spec, "topic", None, errors, at, text), get(spec, "path", None, errors, at, text)
        if "topic" not in spec and "path" not in spec:
            errors.add(path, "needs a topic (the daemon reads it as a table) or a path (the gate reads it)")
        timestamp = get(spec, "timestamp", None, errors, at, text)
        if timestamp is not None and location is None:
            errors.add(f"{path}.timestamp", "the time column of the dataset at path, and there is no path: "
                                            "a topic's records are in force from their Kafka times")  # fmt: skip
        if timestamp is not None and timestamp == id_column:
            errors.add(f"{path}.timestamp", f"{timestamp!r} is the id column; name the column of each row's time")
        if id_column is not None:
            out[str(name)] = AttributeSource(
                str(name), id_column, topic, location, get(spec, "horizon", 600.0, errors, at, parse_duration),
                get(spec, "max_records", 10_000_000, errors, at, positive_int), timestamp)  # fmt: skip
    return out


def attach(attributes: list[Attribute], raw: Any, sources: dict[str, AttributeSource],
           errors: Errors) -> tuple[list[Attribute], tuple[AttributeSource, ...]]:  # fmt: skip
    """The attributes with their ``source:`` (read from ``raw``, the protected_attributes list), and the sources
    they use; an unknown source name is one line naming the attribute."""
    out, used = list(attributes), {}
    names = [a.name for a in attributes]
    for i, item in enumerate(raw if isinstance(raw, list) else []):
        if not (isinstance(item, dict) and item.get("source") is not None and item.get("name") in names):
            continue
        name, k = str(item["source"]), names.index(item["name"])
        if out[k].proxy is not None:
            errors.add(f"protected_attributes[{i}].source", "a proxy attribute is inferred, not joined by id: remove "
                                                           "source or proxy")  # fmt: skip
            continue
        if name not in sources:
            errors.add(f"protected_attributes[{i}].source", f"{name!r} is not among attribute_sources "
                                                           f"{sorted(sources)}")  # fmt: skip
            continue
        out[k] = replace(out[k], source=name)
        used[name] = sources[name]
        if out[k].columns[0] in (sources[name].id, sources[name].timestamp_column):
            errors.add(f"protected_attributes[{i}].column", f"{out[k].columns[0]!r} is the id or time column of "
                                                           f"source {name!r}, not a field of its records")  # fmt: skip
    return out, tuple(used.values())


def check_daemon_sources(config: Config, errors: Errors) -> None:
    """What the daemon's side of the sources needs: one definition of each source across the models; each used
    source on a topic of its own."""
    seen: dict[str, AttributeSource] = {}
    for model in config.models:
        for source in model.attribute_sources:
            if seen.setdefault(source.name, source) != source:
                errors.add(f"attribute_sources.{source.name}", "defined differently by two models; define it once, at "
                                                               "the top level")  # fmt: skip
    kafka = config.kafka
    for source in seen.values():
        if source.topic is not None and (kafka.reads_events(source.topic) or source.topic == kafka.labels_topic):
            errors.add(f"attribute_sources.{source.name}.topic", f"{source.topic!r} is already read as events or "
                                                                 "labels: side records need a topic of their own")
