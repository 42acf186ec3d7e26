"""A file that changes while the gate reads it. The gate lists the files (with their sizes), counts them, then
hashes them for the manifest: three reads of a file another process may still be writing. A manifest must name the
bytes counted, so a file whose size or version changed between its listing and its hash is refused."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
import yaml

from exporter.cli import main
from exporter.gate.fairness import audit as audit_module

CONFIG = {"model_id": "m", "min_samples": 5,
          "protected_attributes": [{"name": "gender", "groups": ["male", "female"]}],
          "metrics": [{"name": "demographic_parity_difference", "threshold": 0.2,
                       "severity_on_fail": "blocking"}]}  # fmt: skip


def test_a_file_appended_to_after_listing_is_refused_as_changed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A writer appends 100 rows to preds.csv just after the gate listed it (simulated by wrapping open_rows, the
    gate's opening of the dataset). Counted and hashed, the report would give 200 rows and a manifest line of the
    listing's 1,027 bytes with the SHA-256 of the 2,027 bytes hashed: a line no auditor's ``sha256sum`` and ``stat``
    can give (docs/auditor/data-manifest.md). The run is refused (exit 2, the file named as changed), or at least
    its manifest's size and hash are those of one state of the file."""
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump(CONFIG))
    data = tmp_path / "preds.csv"
    frame = pd.DataFrame({"model_id": "m", "gender": ["male", "female"] * 50, "prediction": [1, 0] * 50})
    frame.to_csv(data, index=False)
    before = data.stat().st_size
    opened = audit_module.open_rows

    def open_then_append(*args: Any, **kwargs: Any) -> Any:
        dataset = opened(*args, **kwargs)
        with data.open("a") as f:  # the writer goes on
            f.write(frame.to_csv(index=False, header=False))
        return dataset

    monkeypatch.setattr(audit_module, "open_rows", open_then_append)
    code = main(["audit", str(config), str(data), "--audit-log", str(tmp_path / "log")])
    out, err = capsys.readouterr()
    if code == 2:
        assert "preds.csv" in err and "changed" in err
        return
    report = json.loads(out)
    (entry,) = report["data_manifest"]
    after = data.read_bytes()
    assert (entry["size"], entry["sha256"]) == (len(after), hashlib.sha256(after).hexdigest()), (
        report["rows"], entry["size"], before, len(after))


def test_bias_report_refuses_a_file_appended_to_while_it_was_read(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """``bias-report`` built its manifest from a second listing of the data, after the evaluation: a file appended to
    while it was read got the manifest of its new bytes beside a report of the old ones, and nothing said so. It now
    lists once, evaluates, and hashes that listing's files, as the audit does."""
    from exporter.gate.fairness.bias import BiasAuditor

    data = tmp_path / "preds.csv"
    frame = pd.DataFrame({"gender": ["male", "female"] * 50, "outcome": [1, 0] * 50})
    frame.to_csv(data, index=False)
    evaluate = BiasAuditor.evaluate_opened

    def evaluate_then_append(self: BiasAuditor, dataset: Any) -> Any:
        report = evaluate(self, dataset)
        with data.open("a") as f:  # the writer goes on once the rows were counted
            f.write(frame.to_csv(index=False, header=False))
        return report

    monkeypatch.setattr(BiasAuditor, "evaluate_opened", evaluate_then_append)
    code = main(["bias-report", str(data), "--protected", "gender", "--outcome", "outcome",
                 "--audit-log", str(tmp_path / "log.jsonl")])  # fmt: skip
    _, err = capsys.readouterr()
    assert code == 2 and "preds.csv" in err and "changed" in err, (code, err)
    assert not (tmp_path / "log.jsonl").exists()
