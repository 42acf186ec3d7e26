"""The CI bias-audit gate: a predictions file and a config in, a JSON report and a verdict out."""

from __future__ import annotations

import hashlib
import io
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path, PurePosixPath
from typing import Any

import numpy as np
import pandas as pd

from exporter import __version__
from exporter.config import Config, ModelSpec, load_config
from exporter.core.encoding import score_predictions
from exporter.core.evaluate import Evaluation, evaluate_many
from exporter.core.metric_table import METRICS, samples_to_decide
from exporter.gate import storage
from exporter.gate.fairness import estimated, ll144
from exporter.gate.fairness.frames import frame_counts
from exporter.gate.fairness.ll144 import json_float


class DataError(ValueError):
    """The predictions file cannot be audited; the message names the file, the column and the values."""


@dataclass(frozen=True)
class Override:
    """A person's written decision to ship despite blocking failures."""

    justification: str
    author: str

    MIN_JUSTIFICATION = 20

    def problems(self) -> list[str]:
        """What is missing for this override to be accepted."""
        out = []
        if len(self.justification.strip()) < self.MIN_JUSTIFICATION:
            out.append(f"--override-justification must explain the decision in at least "
                       f"{self.MIN_JUSTIFICATION} characters, got {self.justification.strip()!r}")  # fmt: skip
        if not self.author.strip():
            out.append("--override-author must name the person taking responsibility for the override")
        return out


def sha256_file(path: Path) -> str:
    """Hex SHA-256 of a file's bytes."""
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def read_table(location: str | Path, what: str = "predictions") -> tuple[pd.DataFrame, str]:
    """Read a parquet or CSV file of ``what``, local or at a URL (:mod:`exporter.gate.storage`): the frame and the
    SHA-256 of the bytes read."""
    name = str(location)
    suffix = PurePosixPath(name.split("?")[0]).suffix.lower()
    if suffix not in (".parquet", ".pq", ".csv", ".gz", ".txt"):
        raise DataError(f"{name}: unsupported file type {suffix!r} (accepted: .parquet, .pq, .csv)")
    if not storage.is_url(name) and not Path(name).is_file():
        raise DataError(f"{name}: no such {what} file")
    try:
        data = storage.read_bytes(name)
        frame = pd.read_parquet(io.BytesIO(data)) if suffix in (".parquet", ".pq") else pd.read_csv(
            io.BytesIO(data), compression="gzip" if suffix == ".gz" else None)  # fmt: skip
    except storage.StorageError as exc:
        raise DataError(str(exc)) from exc
    except (OSError, ValueError, pd.errors.ParserError) as exc:
        raise DataError(f"{name}: cannot read {what}: {exc}") from exc
    if frame.empty:
        raise DataError(f"{name}: the file has no rows")
    return frame, hashlib.sha256(data).hexdigest()


def read_predictions(path: str | Path) -> pd.DataFrame:
    """Read a parquet or CSV predictions file, local or at a URL."""
    return read_table(path)[0]


def binary_column(frame: pd.DataFrame, column: str, path: str | Path, allow_missing: bool) -> np.ndarray:
    """A 0/1 column as int64, -1 for missing values where those are allowed (unlabelled rows).

    The daemon's rule for a JSON 0/1 field: a number equal to 0 or 1, or a boolean (true is 1); never text, so a
    parquet column of strings "0"/"1" is refused as the daemon refuses ``"1"``."""
    values = frame[column]
    missing = values.isna().to_numpy()
    if missing.any() and not allow_missing:
        rows = np.flatnonzero(missing)[:5].tolist()
        raise DataError(f"{path}: column {column!r} has {int(missing.sum())} missing values (first rows: {rows})")
    if pd.api.types.is_bool_dtype(values) or pd.api.types.is_numeric_dtype(values):
        text = np.zeros(len(values), dtype=bool)
        numeric = values.astype("float64")  # booleans (nullable ones too) count as 1/0, a missing value as NaN
    else:  # object or string: numbers and booleans count as they are, text is refused
        text = values.map(lambda v: isinstance(v, str | bytes)).to_numpy(dtype=bool)
        numeric = pd.to_numeric(values.where(~text, -1), errors="coerce")
    bad = ~missing & ~numeric.isin([0, 1]).to_numpy()
    if bad.any():
        sample = values[bad].unique()[:5].tolist()
        raise DataError(f"{path}: column {column!r} must hold only 0 or 1 (numbers) or true/false (booleans)"
                        f"{' or be empty' if allow_missing else ''}; found {sample}"
                        + (" (text is no number: a string column, or a CSV column mixing numbers and words)"
                           if text.any() else ""))  # fmt: skip
    return np.where(missing, -1, numeric.to_numpy(dtype=np.float64)).astype(np.int64)


def prediction_column(config: ModelSpec) -> str:
    """The column a model's predictions come from: its score column when it emits scores (``events.score_threshold``:
    the daemon then reads the score and never the prediction field), else its prediction column."""
    return config.events.score if config.events.score_threshold is not None else config.prediction_column


def predicted(frame: pd.DataFrame, config: ModelSpec, path: str | Path) -> np.ndarray:
    """Each row's 0/1 prediction, by the daemon's rules: from the score column against ``events.score_threshold``
    (:func:`scores_of`), else from the prediction column (:func:`binary_column`)."""
    threshold = config.events.score_threshold
    if threshold is None:
        return binary_column(frame, config.prediction_column, path, allow_missing=False)
    return score_predictions(scores_of(frame, config, path), threshold)


def scores_of(frame: pd.DataFrame, config: ModelSpec, path: str | Path) -> np.ndarray:
    """The score column of a model that emits scores: numbers in [0, 1], no gaps."""
    column = config.events.score
    values = frame[column]
    scores = (values.astype("float64") if pd.api.types.is_numeric_dtype(values) and not
              pd.api.types.is_bool_dtype(values) else pd.Series(np.nan, index=values.index))  # fmt: skip
    bad = (scores.isna() | (scores < 0) | (scores > 1)).to_numpy()
    if bad.any():
        rows = np.flatnonzero(bad)[:5].tolist()
        raise DataError(f"{path}: column {column!r} must hold scores, numbers between 0 and 1 "
                        f"(events.score_threshold is {config.events.score_threshold:g}); not so in {int(bad.sum())} "
                        f"of {len(bad)} rows (first rows: {rows})")  # fmt: skip
    return np.asarray(scores.to_numpy(), dtype=np.float64)


def model_ids(frame: pd.DataFrame) -> pd.Series:
    """The ``model_id`` column as the gate and ``backtest`` match it against the config's model ids: as text."""
    return frame["model_id"].astype(str)


def own_rows(frame: pd.DataFrame, config: ModelSpec, path: str | Path) -> tuple[pd.DataFrame, int]:
    """The rows of this model, when the file has a ``model_id`` column (rows recorded from a topic that several models
    share: the daemon counts its model's events alone), and how many rows of other models were left out."""
    if "model_id" not in frame.columns:
        return frame, 0
    ids = model_ids(frame)
    own = (ids == config.model_id).to_numpy()
    if not own.any():
        raise DataError(f"{path}: no row has model_id {config.model_id!r}; the file's models are "
                        f"{sorted(ids.unique().tolist())[:10]}")  # fmt: skip
    return frame[own], int((~own).sum())


def _group_report(ev: Evaluation) -> dict[str, Any]:
    g = ev.groups
    per_group = {}
    for i, name in enumerate(ev.attribute.groups):
        per_group[name] = {
            "samples": int(g.samples[i]),
            "labelled": int(g.labelled[i]),
            "selection_rate": json_float(g.selection_rate[i]),
            "selection_rate_ci": [json_float(g.selection_rate_ci[0][i]), json_float(g.selection_rate_ci[1][i])],
            "true_positive_rate": json_float(g.true_positive_rate[i]),
            "false_positive_rate": json_float(g.false_positive_rate[i]),
            "accuracy": json_float(g.accuracy[i]),
            "precision": json_float(g.precision[i]),
        }
    return {"excluded_rows": ev.unknown_samples, "overall_selection_rate": json_float(ev.overall.selection_rate[0]),
            "overall_samples": int(ev.overall.samples[0]), "groups": per_group}  # fmt: skip


def _impact_ratios(
    config: ModelSpec,
    frame: pd.DataFrame,
    path: str,
    evaluations: list[Evaluation],
) -> dict[str, Any]:
    """The LL144 table: selection rates from the gate's own evaluations or, with a score column, scoring rates
    (the share of rows above the median score) from the core on the rows' above-median flags."""
    median = None
    if config.score_column is not None:
        if config.score_column not in frame.columns:
            raise DataError(f"{path}: no score column {config.score_column!r} (columns.score); "
                            f"the file has {list(frame.columns)}")  # fmt: skip
        scores = pd.to_numeric(frame[config.score_column], errors="coerce")
        if scores.isna().any():
            bad = frame[config.score_column][scores.isna()].unique()[:5].tolist()
            raise DataError(f"{path}: score column {config.score_column!r} must be numeric with no gaps; found {bad}")
        median = float(scores.median())
        above = (scores > median).to_numpy(dtype=np.int64)
        counts = frame_counts(config, frame, above, None)
        evaluations = evaluate_many([(a, counts[a.name]) for a in config.attributes], config.min_samples)
    return {
        "rate_kind": "selection_rate" if median is None else "scoring_rate",
        "score_median": median,
        "small_category_share": ll144.SMALL_CATEGORY_SHARE,
        "date_range": ll144.date_range(frame, config.timestamp_column),
        "attributes": {ev.attribute.name: ll144.attribute_table(ev, ev.unknown_samples, len(frame))
                       for ev in evaluations},
    }


def _results(config: ModelSpec, ev: Evaluation) -> list[dict[str, Any]]:
    """One result per configured metric and pair: the point estimate against the threshold (``passed``, the seed's
    rule) whenever the comparison has a value, and what its interval says (``evidence``)."""
    out = []
    groups = ev.attribute.groups
    samples = ev.groups.samples
    for spec in config.metrics:
        v = ev.values(spec.name)
        sufficient = ev.sufficient(spec.name)
        evidence = ev.evidence(spec.name, spec.threshold).tolist()
        for k, (a, b) in enumerate(ev.attribute.pairs):
            ok = bool(sufficient[k])
            passed = ok and spec.passes(float(v.value[k]))
            pair_samples = {groups[a]: int(samples[a]), groups[b]: int(samples[b])}
            out.append({
                "attribute": ev.attribute.name,
                "metric": spec.name,
                "groups": f"{groups[a]} vs {groups[b]}",
                "dimension": f"{groups[a]}_vs_{groups[b]}",
                "value": round(float(v.value[k]), 4) if ok else None,
                "exact_value": json_float(v.value[k]),
                "ci_95": [json_float(v.lower[k]), json_float(v.upper[k])],
                "half_width": json_float(v.half_width[k]),
                "threshold": spec.threshold,
                "passed": passed,
                "status": "insufficient_samples" if not ok else ("pass" if passed else "fail"),
                "evidence": evidence[k],
                "samples_to_decide": samples_to_decide(float(v.half_width[k]), float(v.value[k]), spec.threshold,
                                                       pair_samples) if evidence[k] == "inconclusive" else None,
                "severity": spec.severity,
                "counts_as": _counts_as(config, spec.severity, passed, evidence[k]),
                "samples": pair_samples,
                "support": int(v.support[k]),
            })  # fmt: skip
    return out


def _counts_as(config: ModelSpec, severity: str, passed: bool, evidence: str) -> str:
    """``pass``, ``blocking`` or ``warning``: what a result does to the verdict under ``decision`` and
    ``failure_policy.inconclusive``."""
    if config.decision == "point_estimate":
        return "pass" if passed else severity
    if evidence == "inconclusive":
        return severity if config.inconclusive == "fail" else "warning"
    return "pass" if evidence == "pass" else severity


def dataset_location(config: ModelSpec, predictions: str | Path | None) -> str:
    """The data to audit: the command line's file, else the config's ``evaluation_dataset`` (a local path relative
    to the config's folder, or a URL)."""
    if predictions is not None:
        return str(predictions)
    if config.evaluation_dataset is None:
        raise DataError(f"{config.source}: no data to audit: name a predictions file on the command line or set "
                        "evaluation_dataset in the config")  # fmt: skip
    return storage.resolve(config.evaluation_dataset, Path(config.source).parent)


def run_audit(
    config: ModelSpec | Config | str | Path,
    predictions: pd.DataFrame | str | Path | None = None,
    *,
    override: Override | None = None,
    now: datetime | None = None,
    model_id: str | None = None,
) -> dict[str, Any]:
    """Audit a predictions file against a model's config (a config or its file: its only model, or ``model_id``
    of its ``models:``); return the JSON-ready report.

    Raises ConfigError or DataError (both ValueError) for input that cannot be audited.
    """
    if isinstance(config, str | Path):
        config = load_config(config)
    if isinstance(config, Config):
        config = config.model(model_id)
    data_file: str | None = None
    data_sha256: str | None = None
    if isinstance(predictions, pd.DataFrame):
        frame = predictions
    else:
        data_file = dataset_location(config, predictions)
        frame, data_sha256 = read_table(data_file)
    path_name = data_file or "<predictions>"
    if frame.empty:
        raise DataError(f"{path_name}: the predictions have no rows")

    frame, other_models = own_rows(frame, config, path_name)
    label_metrics = [m.name for m in config.metrics if METRICS[m.name].needs_labels]
    required = [prediction_column(config), *(a.columns[0] for a in config.base_attributes)]
    estimating = estimated.wants_estimate(config, frame)
    if label_metrics and not estimating:
        required.append(config.label_column)
    missing = [c for c in required if c not in frame.columns]
    if missing:
        verb = "needs" if len(label_metrics) == 1 else "need"
        raise DataError(f"{path_name}: missing column(s) {missing}; the file has {list(frame.columns)}"
                        + (f" ({', '.join(label_metrics)} {verb} the label column)"
                           if config.label_column in missing else ""))  # fmt: skip
    y_pred = predicted(frame, config, path_name)
    y_true = (binary_column(frame, config.label_column, path_name, allow_missing=True)
              if config.label_column in frame.columns else None)  # fmt: skip

    all_counts = frame_counts(config, frame, y_pred, y_true)
    attributes: dict[str, Any] = {}
    results: list[dict[str, Any]] = []
    evaluations = evaluate_many([(a, all_counts[a.name]) for a in config.attributes], config.min_samples)
    reference = _estimation(config, frame, path_name) if estimating else None
    for attribute, ev in zip(config.attributes, evaluations, strict=True):
        attributes[attribute.name] = _group_report(ev)
    judged = evaluations
    if reference is not None:
        judged, reference[2]["groups"] = estimated.with_estimates(config, evaluations, *reference[:2])
    for ev in judged:
        results.extend(_results(config, ev))
    if reference is not None:
        estimated.mark(results, config)
    impact_ratios = _impact_ratios(config, frame, path_name, evaluations)
    impact_ratios["source"] = {"file": data_file, "sha256": data_sha256}

    failed = [r for r in results if r["counts_as"] != "pass"]
    blocking = [r for r in failed if r["counts_as"] == "blocking"]
    verdict = "FAIL" if blocking else "PASS"
    override_record = None
    if override is not None and blocking:
        verdict = "OVERRIDDEN"
        override_record = {"justification": override.justification.strip(), "author": override.author.strip(),
                           "overridden_failures": len(blocking)}  # fmt: skip
    timestamp = (now or datetime.now(UTC)).isoformat().replace("+00:00", "Z")
    return {
        "model_id": config.model_id,
        "timestamp": timestamp,
        "tool": f"fairness-exporter {__version__}",
        "config_file": config.source,
        "config_sha256": sha256_file(Path(config.source)) if Path(config.source).is_file() else None,
        "model_version": config.model_version,
        "data_file": data_file,
        "data_sha256": data_sha256,
        "rows": len(frame),
        "rows_of_other_models": other_models,
        "min_samples": config.min_samples,
        "decision": config.decision,
        "inconclusive": sum(r["evidence"] == "inconclusive" for r in results),
        "total_tests": len(results),
        "passed": len(results) - len(failed),
        "failed": len(failed),
        "blocking_failures": len(blocking),
        "warning_failures": len(failed) - len(blocking),
        "insufficient_samples": sum(r["status"] == "insufficient_samples" for r in results),
        "verdict": verdict,
        "override": override_record,
        "attributes": attributes,
        "impact_ratios": impact_ratios,
        **({"estimation": reference[2]} if reference is not None else {}),
        "results": results,
    }


def read_reference(config: ModelSpec) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """The estimation reference's score counts per attribute, and what a report says of it: the one place it is
    read (the gate, the daemon and ``backtest`` call this)."""
    assert config.estimation is not None
    location = storage.resolve(config.estimation.reference, Path(config.source).parent)
    ref, sha256 = read_table(location, "estimation reference")
    ref, _ = own_rows(ref, config, location)
    missing = [c for c in (config.events.score, config.label_column, *(a.columns[0] for a in config.base_attributes))
               if c not in ref.columns]  # fmt: skip
    if missing:
        raise DataError(f"{location}: missing column(s) {missing} (estimation.reference needs the score, the label "
                        f"and the attributes); the file has {list(ref.columns)}")  # fmt: skip
    labels = binary_column(ref, config.label_column, location, allow_missing=True)
    return estimated.reference_counts(config, ref, scores_of(ref, config, location), labels,
                                      {"file": location, "sha256": sha256})  # fmt: skip


def _estimation(config: ModelSpec, frame: pd.DataFrame, path: str) -> tuple[dict[str, np.ndarray],
                                                                            dict[str, np.ndarray], dict[str, Any]]:
    """Score counts of the estimation reference and of the audited rows, and the report's ``estimation`` section."""
    counts, about = read_reference(config)
    scores = scores_of(frame, config, path)
    return counts, estimated.frame_score_counts(config, frame, scores, predicted(frame, config, path), None), about


def exit_code(report: dict[str, Any]) -> int:
    """0 when the model may ship (no blocking failure, or an override), 1 otherwise."""
    return 1 if report["verdict"] == "FAIL" else 0
