"""An equalised-odds page names the largest term of its own rate's change only. FairnessEqualisedOddsDrift
pages per detector, one for the TPR gap (``metric="true_positive_rate_difference"``) and one for the FPR gap, but
its description named the largest term of *both* rates' changes (``rate=~"true_positive_rate|false_positive_rate"``).
A page about the TPR gap then said "Largest term of the change since the window before: ... channel=web mix +0.200
(false_positive_rate)": the cause of a gap the page is not about, possibly larger than the real one. ``backtest``
explains the same page by the detector's own rate only (``rule_text.EXPLAINED_RATES``: true_positive_rate_difference
-> true_positive_rate, replay._explained), so the alert and the backtest disagreed on why the page fired. Fault:
``rule_text.explained`` was built from the alert's metrics, not from the firing series' ``metric`` label."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import yaml
from tooling import require_binary

from exporter.devtools import rules as generate
from exporter.devtools.rule_text import EXPLAINED_RATES

LABELS = ('job="fairness-exporter",instance="a:9108",model_id="credit-scorer",attribute="gender",'
          'dimension="male_vs_female",group_a="male",group_b="female"')  # fmt: skip
ALERT_LABELS = {"severity": "critical", "job": "fairness-exporter", "instance": "a:9108", "model_id": "credit-scorer",
                "attribute": "gender", "dimension": "male_vs_female", "group_a": "male", "group_b": "female",
                "metric": "true_positive_rate_difference", "direction": "a_higher"}  # fmt: skip


@pytest.mark.prometheus
def test_a_tpr_page_names_the_largest_term_of_the_tpr_gap_only(tmp_path: Path) -> None:
    promtool = require_binary("promtool")
    assert EXPLAINED_RATES["true_positive_rate_difference"] == "true_positive_rate"  # what backtest's page explains
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump(generate.rule_file(), sort_keys=False), encoding="utf-8")
    description = (
        "Model credit-scorer, male vs female (gender, dimension male_vs_female), direction a_higher: the change "
        "detector on a:9108 is in alarm (evidence now 20.000 nats): the true or false positive rates have moved "
        "apart by the equalised_odds_difference threshold or more (the detector's reference value). Now: Largest "
        "term of the change since the window before: 24h: region=north rate +0.030 (true_positive_rate); ")
    test = {"rule_files": ["rules.yaml"], "evaluation_interval": "1m", "tests": [{
        "interval": "1m",
        "input_series": [
            {"series": f'fairness_detector_statistic{{{LABELS},metric="true_positive_rate_difference",'
                       f'direction="a_higher"}}', "values": "20+0x5"},
            {"series": f'fairness_detector_alarm{{{LABELS},metric="true_positive_rate_difference",'
                       f'direction="a_higher"}}', "values": "1+0x5"},
            # the TPR gap's largest term, and the FPR gap's (whose detector is not in alarm)
            {"series": f'model_explanation_top_contribution{{{LABELS},window="24h",rate="true_positive_rate",'
                       f'rank="1",segment="region=north",term="rate"}}', "values": "0.03+0x5"},
            {"series": f'model_explanation_top_contribution{{{LABELS},window="24h",rate="false_positive_rate",'
                       f'rank="1",segment="channel=web",term="mix"}}', "values": "0.2+0x5"},
        ],
        "alert_rule_test": [{"alertname": "FairnessEqualisedOddsDrift", "eval_time": "1m", "exp_alerts": [{
            "exp_labels": ALERT_LABELS,
            "exp_annotations": {
                "summary": "Model credit-scorer: evidence of equalised odds drift for male_vs_female.",
                "description": description,
                "runbook_url": "https://github.com/fairness-exporter/fairness-exporter/blob/main/rules/RUNBOOK.md"
                               "#fairnessequalisedoddsdrift"}}]}]}]}  # fmt: skip
    (tmp_path / "page.test.yaml").write_text(yaml.safe_dump(test, sort_keys=False), encoding="utf-8")
    result = subprocess.run([promtool, "test", "rules", "page.test.yaml"], cwd=tmp_path, capture_output=True,
                            text=True, timeout=300, check=False)  # fmt: skip
    # observed: the description goes on "...; 24h: channel=web mix +0.200 (false_positive_rate); "
    assert result.returncode == 0, result.stdout + result.stderr
