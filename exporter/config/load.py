"""Read a config file into a :class:`~exporter.config.types.Config`: one model at the top level, or a fleet in
``models:`` and/or ``models_dir:``, whose every entry is validated by the same per-model parser.

In a fleet file, a per-model key at the top level is the default of every model: a model's own value replaces it,
except for the mapping sections (``events``, ``alerting``, ``failure_policy``, ``columns``), merged key by key.
Validation collects every problem of every model and raises one :class:`ConfigError` listing them all.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any, Final

from exporter.config import sections_stream as stream
from exporter.config.sections_model import MERGED_SECTIONS, MODEL_KEYS, parse_model
from exporter.config.sections_sources import check_daemon_sources
from exporter.config.toolkit import Errors, expand_env, get, port, positive_int, section
from exporter.config.types import (
    DEFAULT_PORT,
    Config,
    ConfigError,
    KafkaConfig,
    ModelSpec,
    Windowing,
    parse_duration,
)
from exporter.config.yaml_file import YamlFileError, read_yaml

log = logging.getLogger(__name__)
SHARED_KEYS: Final = frozenset({
    "kafka", "windows", "bucket", "allowed_lateness", "max_future_skew", "evaluation_interval", "label_horizon",
    "max_pending_labels", "listen", "checkpoint",
})  # fmt: skip
"""Keys every model of the daemon shares: set once, at the top level."""
FLEET_KEYS: Final = frozenset({"models", "models_dir"})
MODEL_FILE_SUFFIXES: Final = (".yaml", ".yml")


def _merged(defaults: dict[str, Any], own: dict[str, Any]) -> dict[str, Any]:
    """A model's keys over the fleet's defaults (mapping sections merged one level deep)."""
    out = dict(defaults)
    for key, value in own.items():
        if key in MERGED_SECTIONS and isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = {**out[key], **value}
        else:
            out[key] = value
    return out


def _label(raw: dict[str, Any]) -> str:
    model_id = raw.get("model_id")
    return f" ({model_id})" if isinstance(model_id, str) and model_id else ""


def _model_files(directory: Path, errors: Errors) -> list[tuple[str, Any]]:
    """(name, parsed YAML) of each model file in ``models_dir``, by name (dot files, e.g. a ConfigMap's ``..data``,
    skipped)."""
    if not directory.is_dir():
        errors.add("models_dir", f"{directory} is not a directory")
        return []
    out = []
    for path in sorted(directory.iterdir()):
        if path.name.startswith(".") or path.suffix not in MODEL_FILE_SUFFIXES or not path.is_file():
            continue
        try:
            out.append((path.name, read_yaml(path)))
        except (OSError, YamlFileError) as exc:
            errors.add(f"models_dir/{path.name}", f"cannot read the model file: {exc}")
    return out


def _fleet_entries(raw: dict[str, Any], errors: Errors, base_dir: Path) -> list[tuple[str, str, dict[str, Any]]]:
    """(error prefix, source, keys) of every model of a fleet file, before merging the defaults."""
    entries: list[tuple[str, str, dict[str, Any]]] = []
    listed = raw.get("models")
    if listed is not None and not isinstance(listed, list):
        errors.add("models", f"{listed!r} is not a list of models (mappings with a model_id)")
    for i, item in enumerate(listed if isinstance(listed, list) else []):
        entries.append((f"models[{i}]", f"#models[{i}]", item))
    directory = raw.get("models_dir")
    if directory is not None:
        if not isinstance(directory, str) or not directory:
            errors.add("models_dir", f"{directory!r} is not a directory path")
        else:
            folder = base_dir / directory
            for name, item in _model_files(folder, errors):
                entries.append((f"models_dir/{name}", f"{folder / name}", expand_env(item, errors.within(
                    f"models_dir/{name}."))))  # fmt: skip
    return entries


def _parse_models(raw: dict[str, Any], errors: Errors, source: str, base_dir: Path) -> list[ModelSpec]:
    if not FLEET_KEYS & raw.keys():
        errors.check_keys("", raw, set(SHARED_KEYS | MODEL_KEYS))
        model = parse_model(raw, errors, source)
        return [model] if model is not None else []
    errors.check_keys("", raw, set(SHARED_KEYS | MODEL_KEYS | FLEET_KEYS))
    if "model_id" in raw:
        errors.add("model_id", "with models: or models_dir:, each model names its own model_id")
    defaults = {k: v for k, v in raw.items() if k in MODEL_KEYS}
    models: list[ModelSpec] = []
    for where, origin, item in _fleet_entries(raw, errors, base_dir):
        if not isinstance(item, dict):
            errors.add(where, f"{item!r} is not a mapping with a model_id")
            continue
        scoped = errors.within(f"{where}{_label(item)}.")
        for key in sorted(set(item) - MODEL_KEYS, key=str):
            shared = key in SHARED_KEYS or key in FLEET_KEYS
            scoped.add(key, "shared by every model: set it at the top level" if shared else
                       f"unknown key (accepted: {', '.join(sorted(MODEL_KEYS))})")  # fmt: skip
        model = parse_model(_merged(defaults, item), scoped, origin if origin.startswith("/") else source + origin)
        if model is not None:
            models.append(model)
    if not models and not errors.lines and raw.get("models_dir") is None:
        errors.add("models", "no model configured (an empty list)")  # an empty models_dir waits for its files
    seen: dict[str, int] = {}
    for i, model in enumerate(models):
        if model.model_id in seen:
            errors.add("models", f"model_id {model.model_id!r} is configured twice")
        seen.setdefault(model.model_id, i)
    labels_topic = isinstance(raw.get("kafka"), dict) and raw["kafka"].get("labels_topic")
    for key, why in (("model_id", "events are routed by it"), ("format", "the topic is read in one format"),
                     ("pair_horizon", "a call's halves wait in one join"),
                     ("prediction_id", "label events carry no model: they are read at one path"),
                     ("label", "label events carry no model: they are read at one path")):  # fmt: skip
        paths = {getattr(m.events, key) for m in models}
        if len(paths) > 1 and (key in ("model_id", "format", "pair_horizon") or labels_topic):
            errors.add(f"events.{key}", f"every model must read it at the same path ({why}), got {sorted(paths)}")
    shares = {m.alerting.max_unjoined_share for m in models}
    if len(shares) > 1:
        errors.add("alerting.max_unjoined_share", f"every model must have the same (label events carry no model: one "
                                                  f"share is measured), got {sorted(shares)}")  # fmt: skip
    return models


def _checkpoint(checkpoint: Any, stages: str, errors: Errors) -> dict[str, Any] | None:
    """The checkpoint section: a directory and an interval for the direct path; only the interval (of the inline
    snapshots) for the staged path, whose state lives in its internal topics."""
    if checkpoint is None:
        return None
    if stages == "staged":
        if not isinstance(checkpoint, dict):
            errors.add("checkpoint", f"{checkpoint!r} is not a mapping with an interval")
            return None
        errors.check_keys("checkpoint", checkpoint, {"path", "interval"})
        if "path" in checkpoint:
            errors.add("checkpoint.path", "kafka.stages: staged keeps its state in its internal topics, not in files: "
                                          "remove the path (checkpoint.interval sets how often it is snapshotted)")
        return {"interval": checkpoint.get("interval")}
    if not (isinstance(checkpoint, dict) and isinstance(checkpoint.get("path"), str)):
        errors.add("checkpoint", f"{checkpoint!r} is not a mapping with a path (and optional interval)")
        return None
    errors.check_keys("checkpoint", checkpoint, {"path", "interval"})
    stream.check_checkpoint_dir(checkpoint["path"], errors)
    return checkpoint


def parse_config(raw: Any, source: str = "<config>", base_dir: str | Path | None = None) -> Config:
    """Validate a parsed YAML document; raise ConfigError listing every problem. ``base_dir`` resolves a
    relative ``models_dir`` (default: the working directory; :func:`load_config` passes the file's own)."""
    errors = Errors()
    if not isinstance(raw, dict):
        raise ConfigError(f"{source}: the config must be a YAML mapping, got {type(raw).__name__}")
    raw = expand_env(raw, errors)
    models = _parse_models(raw, errors, source, Path(base_dir) if base_dir is not None else Path())
    kafka = stream.parse_kafka(section(raw, "kafka", errors, set(KafkaConfig.__dataclass_fields__)), errors)
    kafka = stream.payload_layout(kafka, models[0].events.format if models else "json", errors)
    listen = section(raw, "listen", errors, {"address", "port", "tls_cert_file", "tls_key_file"})
    checkpoint = _checkpoint(raw.get("checkpoint"), kafka.stages, errors)
    if any(m.counted_columns for m in models) and kafka.stages == "staged":
        errors.note("segments", "the daemon counts segments and strata on the direct path only: with kafka.stages: "
                                "staged its /explain and conditional metrics have no counts (the gate's audit has "
                                "them)")  # fmt: skip
    windows, bucket = stream.parse_windows(raw.get("windows", ["1h", "24h"]), raw.get("bucket"), errors)
    longest = max((w.seconds for w in windows), default=0.0)
    for m in models:
        if m.baseline_offset is not None and m.baseline_offset < longest:
            errors.add("baseline_offset", f"{m.model_id}: {m.baseline_offset:g} s is shorter than the longest window "
                                          f"({longest:g} s): a baseline would overlap the window it is compared "
                                          "with")  # fmt: skip
    tls = {key: listen.get(key) for key in ("tls_cert_file", "tls_key_file")}
    for key, value in tls.items():
        if value is not None and not (isinstance(value, str) and value):
            errors.add(f"listen.{key}", f"{value!r} is not a file path")
    if bool(tls["tls_cert_file"]) != bool(tls["tls_key_file"]):
        errors.add("listen", "tls_cert_file and tls_key_file must be set together")
    models_dir = raw.get("models_dir")

    config = Config(
        models=tuple(models),
        kafka=kafka,
        windowing=Windowing(tuple(windows), bucket, get(raw, "allowed_lateness", 300.0, errors, "", parse_duration)),
        max_future_skew_seconds=get(raw, "max_future_skew", 300.0, errors, "", parse_duration),
        evaluation_interval_seconds=get(raw, "evaluation_interval", 15.0, errors, "", parse_duration),
        label_horizon_seconds=get(raw, "label_horizon", 7 * 86400.0, errors, "", parse_duration),
        max_pending_labels=get(raw, "max_pending_labels", 1_000_000, errors, "", positive_int),
        listen_address=stream.check_listen(listen.get("address", "0.0.0.0"), errors),
        listen_port=get(listen, "port", DEFAULT_PORT, errors, "listen.", port),
        tls_cert_file=tls["tls_cert_file"],
        tls_key_file=tls["tls_key_file"],
        checkpoint_path=checkpoint.get("path") if checkpoint else None,
        checkpoint_interval_seconds=get(checkpoint or {}, "interval", 30.0, errors, "checkpoint.", parse_duration),
        models_dir=str((Path(base_dir) if base_dir is not None else Path()) / models_dir)
        if isinstance(models_dir, str) and models_dir else None,
        source=source,
    )
    if windows:
        stream.check_periods(config, raw, errors)
    check_daemon_sources(config, errors)
    if errors.lines:
        raise ConfigError(f"{source}: invalid config:\n  " + "\n  ".join(errors.lines))
    for note in errors.notes:
        log.warning("%s: %s", source, note)
    return config


def load_config(path: str | Path) -> Config:
    """Read and validate a YAML config file (a relative ``models_dir`` is read next to it)."""
    path = Path(path)
    try:
        raw = read_yaml(path)
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read the config: {exc.strerror}") from exc
    except YamlFileError as exc:  # an encoding that is not UTF-8/16/32, or not YAML: names the file
        raise ConfigError(str(exc)) from exc
    return parse_config(raw, str(path), path.parent)
