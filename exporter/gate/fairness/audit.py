"""The CI bias-audit gate: a predictions dataset and a config in, a JSON report and a verdict out.

The predictions are counted a batch at a time (:mod:`exporter.gate.fairness.frames`), so a dataset of any size is
audited in the memory of one batch; the report names the data by its manifest (every file's path, size and SHA-256).
"""

from __future__ import annotations

import hashlib
import io
import math
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path, PurePosixPath
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa

from exporter import __version__
from exporter.config import Config, ModelSpec, load_config
from exporter.core.conditional import metric
from exporter.core.evaluate import Evaluation, evaluate_many
from exporter.core.explain import Unvalued, with_unvalued
from exporter.gate import storage
from exporter.gate.data import columns as col
from exporter.gate.data.dataset import DataError, Dataset
from exporter.gate.data.files import ACCEPTED, file_format
from exporter.gate.data.quantile import median
from exporter.gate.data.side import JoinedRows
from exporter.gate.fairness import estimated, ll144, proxy
from exporter.gate.fairness.frames import BatchCounter, FrameRows, Rows, Scan, open_rows, required_columns, scan
from exporter.gate.fairness.ll144 import json_float
from exporter.gate.fairness.local_counts import LocalCounts, local_rows
from exporter.gate.fairness.results import metric_results
from exporter.gate.fairness.segments import SegmentTally, explain_change, mark_conditional, with_conditional


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
    """Read a small parquet or CSV file of ``what`` whole, local or at a URL (:mod:`exporter.gate.storage`): the frame
    and the SHA-256 of the bytes read. The safety suite's test inputs; audited data is read as a dataset."""
    name = str(location)
    suffix = PurePosixPath(name.split("?")[0]).suffix.lower()
    kind = file_format(name.split("?")[0])
    if kind is None:
        raise DataError(f"{name}: unsupported file type {suffix!r} (accepted: {ACCEPTED})")
    if not storage.is_url(name) and not Path(name).is_file():
        raise DataError(f"{name}: no such {what} file")
    try:
        data = storage.read_bytes(name)
        frame = pd.read_parquet(io.BytesIO(data)) if kind == "parquet" else pd.read_csv(
            io.BytesIO(data), compression="gzip" if suffix == ".gz" else None)  # fmt: skip
    except storage.StorageError as exc:
        raise DataError(str(exc)) from exc
    except (OSError, ValueError, pd.errors.ParserError) as exc:
        raise DataError(f"{name}: cannot read {what}: {exc}") from exc
    if frame.empty:
        raise DataError(f"{name}: the file has no rows")
    return frame, hashlib.sha256(data).hexdigest()


def _group_report(ev: Evaluation) -> dict[str, Any]:
    g = ev.groups
    per_group = {}
    scored, calibrated = ev.auc(), ev.calibration()
    for i, name in enumerate(ev.attribute.groups):
        auc = {} if scored is None else {"auc": json_float(scored[0][i]),
                                         "auc_ci": [json_float(scored[1][i]), json_float(scored[2][i])]}
        auc |= {} if calibrated is None else {"calibration_error": json_float(calibrated[0][i]), "calibration_error_ci":
                                              [json_float(calibrated[1][i]), json_float(calibrated[2][i])]}
        per_group[name] = {
            "samples": ll144.count(g.samples[i]),
            "labelled": ll144.count(g.labelled[i]),
            "selection_rate": json_float(g.selection_rate[i]),
            "selection_rate_ci": [json_float(g.selection_rate_ci[0][i]), json_float(g.selection_rate_ci[1][i])],
            "true_positive_rate": json_float(g.true_positive_rate[i]),
            "false_positive_rate": json_float(g.false_positive_rate[i]),
            "accuracy": json_float(g.accuracy[i]),
            "precision": json_float(g.precision[i]),
            **auc,
        }
    return {"excluded_rows": ll144.count(ev.unknown_samples),
            "overall_selection_rate": json_float(ev.overall.selection_rate[0]),
            "overall_samples": int(ev.overall.samples[0]), "groups": per_group,
            **proxy.about(ev.attribute)}  # fmt: skip


def _impact_ratios(config: ModelSpec, rows: Rows, counted: Scan, name: str, evaluations: list[Evaluation],
                   csv: bool) -> dict[str, Any]:  # fmt: skip
    """The LL144 table: selection rates from the gate's own evaluations or, with a score column, scoring rates
    (the share of rows above the median score) from the core on the rows' above-median flags: the exact median
    of every score (:func:`exporter.gate.data.quantile.median`), then one more pass counting the rows above it
    (``csv``: a CSV file's, as :func:`scan` reads them)."""
    median_score = None
    if config.score_column is not None:
        score_column = config.score_column

        def scores() -> Any:
            for batch in _own_batches(config, rows, [score_column]):
                yield col.numbers(batch.column(score_column))

        median_score = median(scores, counted.rows)
        above = scan(config, rows, name, above=median_score, csv=csv)
        evaluations = evaluate_many([(a, above.tally.counts()[a.name]) for a in config.attributes],
                                    config.min_samples, multiplicity=config.multiplicity)  # fmt: skip
    return {
        "rate_kind": "selection_rate" if median_score is None else "scoring_rate",
        "score_median": median_score,
        "small_category_share": ll144.SMALL_CATEGORY_SHARE,
        "date_range": counted.date_range,
        "attributes": {ev.attribute.name: ll144.attribute_table(ev, ev.unknown_samples, counted.rows)
                       for ev in evaluations},
    }


def _own_batches(config: ModelSpec, rows: Rows, columns: list[str]) -> Any:
    """The batches of this model's rows (all rows when there is no model_id column), only ``columns``."""
    shared = "model_id" in rows.columns
    for batch in rows.batches([*columns, *(["model_id"] if shared else [])]):
        if shared:
            indices, ids = col.text(batch.column("model_id"))
            batch = batch.filter(pa.array(np.array([i == config.model_id for i in ids] + [False])[indices]))
        yield batch


def _worst(config: ModelSpec, ev: Evaluation) -> list[dict[str, Any]]:
    """Per configured metric (observed, not estimated): its worst comparison of the attribute, with the interval
    that holds over all its judged comparisons at once, and what that interval says against the threshold."""
    out = ev.worst_rows(m.name for m in config.metrics)
    for row in out:
        lower, upper = (math.nan if x is None else x for x in row["ci_simultaneous"])
        row["threshold"] = threshold = config.thresholds()[row["metric"]]
        row["evidence"] = str(metric(row["metric"]).evidence(lower, upper, threshold)) if row["dimension"] else \
            "inconclusive"  # fmt: skip
    return out


def dataset_location(config: ModelSpec, predictions: str | Path | None) -> str:
    """The data to audit: the command line's file, else the config's ``evaluation_dataset`` (a local path relative
    to the config's folder, or a URL)."""
    if predictions is not None:
        return str(predictions)
    if config.evaluation_dataset is None:
        raise DataError(f"{config.source}: no data to audit: name a predictions file on the command line or set "
                        "evaluation_dataset in the config")  # fmt: skip
    return storage.resolve(config.evaluation_dataset, Path(config.source).parent)


def count(config: ModelSpec, rows: Rows, name: str, *, empty: str = "the predictions have no rows",
          weights: str | None = None, also: BatchCounter | None = None, csv: bool = False) -> Scan:  # fmt: skip
    """Count a model's rows in one pass, after checking the columns it needs; DataError for rows that cannot be
    audited (a missing column, no rows of this model, a value that is no 0/1 or score). ``csv``: see :func:`scan`."""
    label_metrics = [m.name for m in config.metrics if metric(m.name).needs_labels]
    estimable = estimated.estimable(config)  # then data without a label column is estimated, not refused
    missing = [c for c in required_columns(config, rows.columns, bool(label_metrics) and not estimable)
               if c not in rows.columns]  # fmt: skip
    if missing:
        verb = "needs" if len(label_metrics) == 1 else "need"
        raise DataError(f"{name}: missing column(s) {missing}; the file has {rows.columns}"
                        + (f" ({', '.join(label_metrics)} {verb} the label column)"
                           if config.label_column in missing else ""))  # fmt: skip
    if config.score_column is not None and config.score_column not in rows.columns:
        raise DataError(f"{name}: no score column {config.score_column!r} (columns.score); the file has {rows.columns}")
    absent = [c for c in (also.columns if also is not None else []) if c not in rows.columns]
    if absent:
        raise DataError(f"{name}: missing column(s) {absent} named by segments/strata; the file has {rows.columns}")
    return _found(config, rows, name, scan(config, rows, name, weights=weights, csv=csv,
                                           scores=estimable or config.compares_scores, also=also), empty)  # fmt: skip


def _found(config: ModelSpec, rows: Rows, name: str, counted: Scan, empty: str) -> Scan:
    """The scan, once it found rows of this model and no value that cannot be counted; else DataError."""
    if counted.rows == 0 and counted.other_models == 0:
        raise DataError(f"{name}: {empty}")
    if counted.rows == 0:
        raise DataError(f"{name}: no row has model_id {config.model_id!r}; the file's models are "
                        f"{_models(rows)}")  # fmt: skip
    counted.checks.raise_first(config, name, counted.rows)
    return counted


def _models(rows: Rows) -> list[str]:
    """The first ten model ids of the rows, sorted (for the message of a file without the audited model)."""
    ids: set[str] = set()
    for batch in rows.batches(["model_id"]):
        ids.update(col.text(batch.column("model_id"))[1])
    return sorted(ids)[:10]


def run_audit(
    config: ModelSpec | Config | str | Path,
    predictions: pd.DataFrame | str | Path | None = None,
    *,
    override: Override | None = None,
    now: datetime | None = None,
    model_id: str | None = None,
    engine: str = "local",
    baseline: pd.DataFrame | str | Path | None = None,
) -> dict[str, Any]:
    """Audit predictions (a DataFrame, or a dataset: a file, folder, glob or prefix of parquet or CSV files) against
    a model's config (a config or its file: its only model, or ``model_id`` of its ``models:``); return the
    JSON-ready report. ``engine="spark"`` counts the dataset with Spark (:mod:`exporter.spark`). ``baseline``: the
    data of an earlier period, read the same way: the report then explains each gap's change from it over the
    config's ``segments`` (``explanations``).

    Raises ConfigError or DataError (both ValueError) for input that cannot be audited.
    """
    if isinstance(config, str | Path):
        config = load_config(config)
    if isinstance(config, Config):
        config = config.model(model_id)
    data_file: str | None = None
    weights, csv = None, False
    if isinstance(predictions, pd.DataFrame):
        rows: Rows = FrameRows(predictions)
    else:
        data_file = dataset_location(config, predictions)
        dataset = open_rows(data_file, "predictions", config)
        rows, csv = dataset, dataset.format == "csv"  # each engine reads a CSV file's attribute columns as text
        if engine == "spark":
            from exporter.spark import spark_rows

            rows, weights = spark_rows(config, dataset), "count"
        else:  # DuckDB's counts where they are faster and the same (exporter/gate/fairness/local_counts.py)
            rows, weights = local_rows(config, dataset)
    path_name = data_file or "<predictions>"
    if weights is None:  # attributes joined by id from their side tables, if any (an engine joined its own)
        rows = JoinedRows.of(config, rows, path_name)
    segmented = SegmentTally(config) if config.segments or config.strata else None
    if baseline is not None and not config.segments:
        raise DataError(f"{config.source}: --baseline explains a gap's change over the config's segments: "
                        "name the columns in segments: [...]")  # fmt: skip
    before = None if baseline is None else _baseline(config, baseline, segmented)
    current = segmented.fresh() if segmented is not None else None
    empty = "the file has no rows" if data_file else "the predictions have no rows"
    try:
        counted = count(config, rows, path_name, empty=empty, weights=weights, also=current, csv=csv)
    except DataError:
        if not isinstance(rows, LocalCounts):
            raise
        rows, weights = dataset, None  # the row pass words the refusal, naming rows
        counted = count(config, rows, path_name, empty=empty, also=current, csv=csv)
    if weights is not None:  # counts of an engine: the date range is its own aggregation's
        counted.date_range = getattr(rows, "date_range", None)

    attributes: dict[str, Any] = {}
    results: list[dict[str, Any]] = []
    all_counts = counted.tally.counts()
    evaluations = evaluate_many([(a, all_counts[a.name]) for a in config.attributes], config.min_samples,
                                multiplicity=config.multiplicity, scores=[counted.tally.scores[a.name]
                                                                          for a in config.attributes]
                                if config.compares_scores else None,
                                score_sums=[counted.tally.score_sums.get(a.name) for a in config.attributes]
                                if config.calibrates else None, added_bound=config.added_score_bound)  # fmt: skip
    evaluations, conditional = with_conditional(config, evaluations, current)
    judged, estimation = evaluations, None
    if estimated.estimable(config) and counted.labelled == 0:  # scores and not one label in the whole dataset
        reference, estimation = read_reference(config)
        judged, estimation["groups"] = estimated.with_estimates(config, evaluations, reference, counted.tally.scores)
    worst: list[dict[str, Any]] = []
    for attribute, ev, judged_ev in zip(config.attributes, evaluations, judged, strict=True):
        attributes[attribute.name] = _group_report(ev)
        if attribute.proxy is not None:
            attributes[attribute.name] |= {"proxy_corrected": proxy.corrected(attribute, counted.tally),
                                           "proxy_evidence": proxy.evidence(attribute, counted.tally)}
        results.extend(metric_results(config, judged_ev, None if estimation is None else
                                      estimated.estimated_metrics(config)))  # fmt: skip
        worst.extend(_worst(config, judged_ev))
    mark_conditional(results, config, conditional, current)
    impact_ratios = _impact_ratios(config, rows, counted, path_name, evaluations, csv)
    manifest = dataset.manifest() if data_file is not None else None  # once read: a changed file is refused
    impact_ratios["source"] = {"file": data_file, "manifest_sha256": manifest and manifest.sha256}

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
        "data_manifest_sha256": manifest and manifest.sha256,
        "data_manifest": list(manifest.files) if manifest else None,
        "rows": counted.rows,
        "rows_of_other_models": counted.other_models,
        "min_samples": config.min_samples,
        "decision": config.decision,
        "inconclusive": sum(r["evidence"] == "inconclusive" for r in results),
        "total_tests": len(results),
        "passed": len(results) - len(failed),
        "failed": len(failed),
        "blocking_failures": len(blocking),
        "warning_failures": len(failed) - len(blocking),
        "insufficient_samples": sum(r["status"] == "insufficient_samples" for r in results),
        "multiplicity": config.multiplicity,
        "comparisons_judged": len(results) - sum(r["status"] == "insufficient_samples" for r in results),
        "verdict": verdict,
        "override": override_record,
        "attributes": attributes,
        "impact_ratios": impact_ratios,
        "worst": worst,
        **({"estimation": estimation} if estimation is not None else {}),
        "results": results,
        **(_explained(config, before, current) if before is not None and current is not None else {}),
    }


def _baseline(config: ModelSpec, baseline: pd.DataFrame | str | Path, tally: SegmentTally | None) -> \
        tuple[dict[str, Any], SegmentTally]:  # fmt: skip
    """Count the baseline's rows by segment (first, so its values take the table's first codes); what the report
    says of it."""
    assert tally is not None
    if isinstance(baseline, pd.DataFrame):
        rows: Rows = FrameRows(baseline)
        about: dict[str, Any] = {"file": None, "manifest_sha256": None}
    else:
        rows, about = open_rows(str(baseline), "baseline", config), {"file": str(baseline), "manifest_sha256": None}
    counted = count(config, rows, about["file"] or "<baseline>", empty="the baseline has no rows", also=tally,
                    csv=isinstance(rows, Dataset) and rows.format == "csv")  # fmt: skip
    if isinstance(rows, Dataset):  # hashed once counted, as the audited data
        about["manifest_sha256"] = rows.manifest().sha256
    return {**about, "rows": counted.rows}, tally


def _explained(config: ModelSpec, before: tuple[dict[str, Any], SegmentTally], current: SegmentTally) -> \
        dict[str, Any]:  # fmt: skip
    """The report's baseline, segment tables and explanations."""
    about, baseline = before
    unvalued = {c: Unvalued(baseline.missing_rows.get(c, 0), current.missing_rows.get(c, 0)) for c in config.segments}
    return {"baseline": about,
            "segment_values": {"baseline": baseline.describe(), "current": current.describe()},
            "explanations": with_unvalued(explain_change(config, baseline, current), unvalued)}  # fmt: skip


def read_reference(config: ModelSpec) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """The estimation reference's score counts per attribute, and what a report says of it (its manifest, rows,
    labelled rows per group): the one place it is read (the gate, the daemon and ``backtest`` call this), a dataset
    like the audited data, counted a batch at a time by the same scan."""
    assert config.estimation is not None
    location = storage.resolve(config.estimation.reference, Path(config.source).parent)
    dataset = open_rows(location, "estimation reference", config)
    missing = [c for c in (config.events.score, config.label_column, *(a.columns[0] for a in config.base_attributes))
               if c not in dataset.columns]  # fmt: skip
    if missing:
        raise DataError(f"{location}: missing column(s) {missing} (estimation.reference needs the score, the label "
                        f"and the attributes); the file has {dataset.columns}")  # fmt: skip
    counted = _found(config, dataset, location, scan(config, dataset, location, scores=True,
                                                     csv=dataset.format == "csv"), "the file has no rows")  # fmt: skip
    manifest = dataset.manifest()
    about = {"file": location, "manifest_sha256": manifest.sha256, "manifest": list(manifest.files)}
    return counted.tally.scores, estimated.describe_reference(config, counted, about)


def exit_code(report: dict[str, Any]) -> int:
    """0 when the model may ship (no blocking failure, or an override), 1 otherwise."""
    return 1 if report["verdict"] == "FAIL" else 0
