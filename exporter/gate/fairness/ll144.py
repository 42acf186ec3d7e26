"""The NYC Local Law 144 bias-audit table: per category, its rows, its selection (or scoring) rate and its impact
ratio against the most selected category; the unknown category's rows; categories under 2% of the data flagged
and left out of the impact ratios.

The rates come from the core's group statistics; this module only chooses the reference category and lays the
numbers out for the JSON report, the CSV file and the HTML page.
"""

from __future__ import annotations

import csv
import io
import math
from typing import Any, Final

import numpy as np
import pandas as pd

from exporter.core.attributes import titled
from exporter.core.evaluate import Evaluation

SMALL_CATEGORY_SHARE: Final = 0.02
"""DCWP rules (6 RCNY 5-301) let an auditor leave categories under 2% of the data out of the impact ratio
calculations, if their count and rate are still published: they are flagged, kept in the table with their count
and rate, left out of the impact ratios (null: a rate over the reference's would give a ratio above 1, which is no
impact ratio) and never chosen as the reference; unless every category is that small, when none is left out."""

CSV_COLUMNS: Final = ("model_id", "data_file", "data_manifest_sha256", "date_start", "date_end", "attribute",
                      "category", "samples", "share", "rate_kind", "rate", "impact_ratio",
                      "small_category")  # fmt: skip
UNKNOWN_CATEGORY: Final = "(unknown)"


def json_float(x: float) -> float | None:
    """A JSON-safe report number: None for NaN (undefined: too few samples)."""
    return None if math.isnan(x) else float(x)


def count(x: float) -> int | float:
    """A report's count: a whole number, or a proxy attribute's sum of posteriors (to 6 places)."""
    return int(x) if float(x).is_integer() else round(float(x), 6)


def attribute_table(ev: Evaluation, excluded_rows: float, total_rows: int) -> dict[str, Any]:
    """One attribute's table from the evaluation whose selection rates are the LL144 rates (selection, or the share
    above the median score). The bounded ``other`` group (``unknown_values: other``; of an intersection, every
    category holding it) is the unknown category, with the excluded rows; a configured group named ``other`` under
    ``unknown_values: reject`` is a category like any."""
    groups = ev.attribute.groups
    rates = ev.groups.selection_rate
    samples = ev.groups.samples
    unknown = np.array([ev.attribute.catch_all(g) for g in groups], dtype=bool)
    small = samples < SMALL_CATEGORY_SHARE * total_rows
    known = ~unknown & np.isfinite(rates)
    eligible = known & ~small if (known & ~small).any() else known
    reference = int(np.flatnonzero(eligible)[np.argmax(rates[eligible])]) if eligible.any() else None
    best = rates[reference] if reference is not None else math.nan
    categories = [{
        "category": groups[i],
        "samples": count(samples[i]),
        "share": float(samples[i] / total_rows),
        "rate": json_float(rates[i]),
        "impact_ratio": json_float(rates[i] / best) if best > 0 and eligible[i] else None,
        "small_category": bool(small[i]),
    } for i in np.flatnonzero(~unknown)]  # fmt: skip
    return {
        "unknown_rows": count(excluded_rows + samples[unknown].sum()),
        "reference_category": groups[reference] if reference is not None else None,
        "categories": categories,
        **({"proxy": True} if ev.attribute.proxy else {}),
    }


def date_range(frame: pd.DataFrame, column: str) -> dict[str, Any] | None:
    """First and last timestamp of the data (UTC, ISO 8601), or None when the file has no such column."""
    if column not in frame.columns:
        return None
    values = frame[column]
    if pd.api.types.is_numeric_dtype(values):
        stamps = pd.to_datetime(values, unit="s", utc=True, errors="coerce")
    else:
        stamps = pd.to_datetime(values, utc=True, errors="coerce", format="mixed")
    valid = stamps.dropna()
    iso = (lambda t: t.isoformat().replace("+00:00", "Z"))  # noqa: E731
    return {"column": column, "start": iso(valid.min()) if len(valid) else None,
            "end": iso(valid.max()) if len(valid) else None, "rows_without_date": int(stamps.isna().sum())}  # fmt: skip


def csv_rows(report: dict[str, Any]) -> list[list[Any]]:
    """The table as CSV rows (after the CSV_COLUMNS header): one per category, one for each unknown category."""
    table = report["impact_ratios"]
    dates = table["date_range"] or {}
    head = [report["model_id"], table["source"]["file"] or "", table["source"]["manifest_sha256"] or "",
            dates.get("start") or "", dates.get("end") or ""]  # fmt: skip
    out = []
    for name, block in table["attributes"].items():
        attribute = titled(name, block.get("proxy"))
        for row in block["categories"]:
            out.append([*head, attribute, row["category"], row["samples"], f"{row['share']:.4f}", table["rate_kind"],
                        "" if row["rate"] is None else f"{row['rate']:.4f}",
                        "" if row["impact_ratio"] is None else f"{row['impact_ratio']:.4f}",
                        str(row["small_category"]).lower()])  # fmt: skip
        out.append([*head, attribute, UNKNOWN_CATEGORY, block["unknown_rows"],
                    f"{block['unknown_rows'] / report['rows']:.4f}", table["rate_kind"], "", "", ""])
    return out


def csv_text(report: dict[str, Any]) -> str:
    """The ``--impact-ratios-csv`` file: the CSV_COLUMNS header, then :func:`csv_rows`."""
    text = io.StringIO()
    writer = csv.writer(text)
    writer.writerow(CSV_COLUMNS)
    writer.writerows(csv_rows(report))
    return text.getvalue()
