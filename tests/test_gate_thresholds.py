"""Thresholds under which a check's verdict would no longer depend on the model are refused in one line.

- ``perturbation.max_unstable_share``: the seed's rule is ``unstable / len(test_inputs) < 0.05``, strict, and
  stays so; at 0 no model could pass (0 < 0 is False), so 0 is refused, as are negative shares, NaN and shares
  above 1. ``perturbation_magnitude: 0`` adds no noise: the test would measure nothing, so it is refused too.
- ``bias-report --threshold nan`` (argparse's ``float`` takes it) would make every gap "not biased" (``gap > nan``
  is False), ``inf`` too, and a negative threshold every gap biased: each is one line naming ``--threshold``,
  exit 2, no PASS in the audit log and no passing JUnit. STYLE.md: "Every failure a user can cause is one line
  naming the field and exit code 2; a traceback is a bug report."
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml

from exporter.config import ConfigError
from exporter.gate.safety.config import run_safety

ROOT = Path(__file__).resolve().parent.parent


class Constant:
    """A scorer whose output never moves: 0.3 for every row."""

    def predict(self, X: np.ndarray) -> np.ndarray:
        return np.full(len(np.atleast_2d(X)), 0.3)


def safety_config(tmp_path: Path, perturbation: dict) -> Path:
    rng = np.random.default_rng(4)
    pd.DataFrame(rng.normal(0, 1, (40, 3)), columns=["a", "b", "c"]).to_csv(tmp_path / "inputs.csv", index=False)
    config = tmp_path / "safety.yaml"
    config.write_text(yaml.safe_dump({"model_id": "scorer", "feature_count": 3, "valid_output_range": [0, 1],
                                      "test_inputs": "inputs.csv", "perturbation": perturbation}))  # fmt: skip
    return config


@pytest.mark.parametrize("share", [0, -0.1, 1.5, float("nan"), "5%"])
def test_an_unstable_share_tolerance_no_model_could_pass_is_refused(tmp_path: Path, share: object) -> None:
    with pytest.raises(ConfigError) as error:
        run_safety(safety_config(tmp_path, {"max_unstable_share": share}), Constant())
    assert f"perturbation.max_unstable_share: {share!r} is not a share in (0, 1]" in str(error.value)
    assert "at 0 no model could pass" in str(error.value)


def test_the_strict_rule_of_the_seed_is_kept_for_every_accepted_share(tmp_path: Path) -> None:
    """A model whose outputs never move passes at any accepted tolerance, 1 included (0/40 < 1)."""
    for share in (1, 0.05):
        report = run_safety(safety_config(tmp_path, {"max_unstable_share": share}), Constant())
        stability = next(r for r in report["results"] if r["test_name"] == "input_perturbation_stability")
        assert stability["details"]["summary"] == "0/40 inputs showed instability (>0.1 output change)"
        assert stability["passed"] is True and stability["details"]["max_unstable_share"] == share


def test_the_evaluator_refuses_a_zero_unstable_share_too() -> None:
    from exporter.gate.safety.evaluator import SafetyEvaluator

    with pytest.raises(ValueError, match=r"max_unstable_share 0 is not a share in \(0, 1\]"):
        SafetyEvaluator("m", max_unstable_share=0)


def test_a_perturbation_that_adds_no_noise_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"perturbation\.perturbation_magnitude: 0 adds no noise"):
        run_safety(safety_config(tmp_path, {"perturbation_magnitude": 0}), Constant())


def bias_report(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("FAIRNESS_AUDIT_LOG_KEY", "FAIRNESS_AUDIT_LOG")}
    env["PYTHONPATH"] = str(ROOT)
    return subprocess.run([sys.executable, "-m", "exporter.cli", "bias-report", *args], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=120)  # fmt: skip


@pytest.mark.parametrize("threshold", ["nan", "inf", "-0.1"])
def test_a_threshold_that_decides_regardless_of_the_gap_is_refused_in_one_line(tmp_path: Path,
                                                                               threshold: str) -> None:  # fmt: skip
    """Male 50/50 positive, female 0/50: a gap of 1.0 that ``nan`` and ``inf`` would pass."""
    data = tmp_path / "d.csv"
    data.write_text("gender,y\n" + "male,1\nfemale,0\n" * 50)
    log, junit = tmp_path / "log.jsonl", tmp_path / "junit.xml"
    proc = bias_report(tmp_path, str(data), "--protected", "gender", "--outcome", "y", "--threshold", threshold,
                       "--audit-log", str(log), "--junit", str(junit))  # fmt: skip
    passes_logged = [r for r in map(json.loads, log.read_text().splitlines()) if r.get("verdict") == "PASS"] \
        if log.exists() else []  # fmt: skip
    junit_pass = junit.exists() and ET.parse(junit).getroot().get("failures") == "0" \
        and ET.parse(junit).getroot().get("errors") == "0"  # fmt: skip
    assert "Traceback" not in proc.stderr, proc.stderr[-400:]
    assert proc.returncode == 2 and "--threshold" in proc.stderr and proc.stderr.count("\n") == 1, proc.stderr
    assert passes_logged == [] and not junit_pass, (len(passes_logged), junit_pass)


def test_a_threshold_of_zero_is_accepted_and_passes_equal_groups(tmp_path: Path) -> None:
    data = tmp_path / "d.csv"
    data.write_text("gender,y\n" + "male,1\nfemale,1\nmale,0\nfemale,0\n" * 25)
    proc = bias_report(tmp_path, str(data), "--protected", "gender", "--outcome", "y", "--threshold", "0",
                       "--audit-log", str(tmp_path / "log.jsonl"))  # fmt: skip
    assert proc.returncode == 0 and json.loads(proc.stdout)["gender"]["fairness_gap"] == 0, proc.stderr
