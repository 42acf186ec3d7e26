"""The safety config's ``perturbation`` and ``severity`` sections are checked to be mappings before they are read:
``perturbation: 0.01`` (the seed's ``perturbation_magnitude`` written as the section) and ``severity: critical``
(one severity for all) are one line naming the section and exit 2, with an audit-log record of the refused run
(docs/ml/safety-redteam.md: exit 2 "on a bad config ... (one line on stderr naming the field)"); read as mappings
they were tracebacks.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml

from exporter.cli import main


@pytest.fixture
def model(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    (tmp_path / "constant_scorer.py").write_text(
        "import numpy as np\n"
        "class Constant:\n"
        "    def predict(self, X):\n"
        "        return np.full(len(np.atleast_2d(X)), 0.3)\n")
    monkeypatch.chdir(tmp_path)
    return "constant_scorer:Constant"


@pytest.mark.parametrize(("key", "value"), [("perturbation", 0.01), ("severity", "critical")])
def test_a_section_that_is_not_a_mapping_is_one_line_and_exit_2(tmp_path: Path, model: str, key: str,
                                                                value: object,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    pd.DataFrame(np.random.default_rng(0).normal(size=(20, 2)), columns=["a", "b"]).to_csv(tmp_path / "in.csv",
                                                                                          index=False)
    config = tmp_path / "safety.yaml"
    config.write_text(yaml.safe_dump({"model_id": "scorer", "feature_count": 2, "valid_output_range": [0, 1],
                                      "test_inputs": "in.csv", key: value}))  # fmt: skip
    log = tmp_path / "log.jsonl"
    code = main(["safety", "--config", str(config), "--model", model, "--audit-log", str(log)])
    _, err = capsys.readouterr()
    assert code == 2 and err.count("\n") == 1 and key in err, (code, err)
    assert [json.loads(line)["type"] for line in log.read_text().splitlines()] == ["safety_error"]
