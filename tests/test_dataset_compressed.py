"""A gzipped file's format is the suffix before ``.gz``, by one rule for the gate and ``backtest``
(exporter/gate/data/files.py, ``file_format``): the same file is read the same way by both commands, alone or in a
folder, and a gzipped file of another format is refused rather than read as CSV or as JSON lines."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pandas as pd
import pytest
import yaml
from test_backtest import RAW_CONFIG, drifting_events

from exporter.backtest.replay import backtest
from exporter.cli import main
from exporter.config import parse_config


def test_backtest_reads_a_gzipped_csv_file_as_the_gate_and_a_folder_of_it_do(tmp_path: Path) -> None:
    """events.csv.gz is a CSV dataset to the gate and to backtest, named alone or in a folder: the events of
    events.csv (71,366), where reading it as JSON lines replayed none (1,530 lines rejected as malformed_json)."""
    config = parse_config(RAW_CONFIG, "<test>")
    frame = drifting_events(hours=2)
    frame.to_csv(tmp_path / "events.csv", index=False)
    (tmp_path / "folder").mkdir()
    frame.to_csv(tmp_path / "folder" / "events.csv.gz", index=False)
    frame.to_csv(tmp_path / "events.csv.gz", index=False)
    plain = backtest(config, [str(tmp_path / "events.csv")])
    assert plain["events"] == len(frame) == 71366
    assert backtest(config, [str(tmp_path / "folder")]) == plain  # the folder's .csv.gz: read as CSV
    gzipped = backtest(config, [str(tmp_path / "events.csv.gz")])
    assert (gzipped["events"], gzipped["rejected_reasons"]) == (plain["events"], plain["rejected_reasons"])
    assert gzipped == plain


def test_a_gzipped_json_lines_file_in_a_folder_is_not_read_as_csv(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A folder of predictions: part-0.csv and part-1.jsonl.gz (JSON lines, gzipped). Read as CSV, part-1's first
    JSON object would be a header and its other 99 lines rows without a model_id, and the gate would give a verdict
    on part-0 alone. A file the gate cannot read is refused (exit 2), naming it."""
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump({
        "model_id": "m", "min_samples": 5, "protected_attributes": [{"name": "gender", "groups": ["male", "female"]}],
        "metrics": [{"name": "demographic_parity_difference", "threshold": 0.2, "severity_on_fail": "blocking"}]}))
    frame = pd.DataFrame({"model_id": "m", "gender": ["male", "female"] * 50, "prediction": [1, 0] * 50})
    (tmp_path / "preds").mkdir()
    frame.to_csv(tmp_path / "preds" / "part-0.csv", index=False)
    with gzip.open(tmp_path / "preds" / "part-1.jsonl.gz", "wt") as f:
        f.write(frame.to_json(orient="records", lines=True))
    code = main(["audit", str(config), str(tmp_path / "preds"), "--audit-log", str(tmp_path / "log")])
    out, err = capsys.readouterr()
    report = json.loads(out) if out.startswith("{") else None
    assert code == 2, (code, report and (report["rows"], report["rows_of_other_models"],
                                         [f["path"] for f in report["data_manifest"]]))  # fmt: skip
    assert "part-1.jsonl.gz" in err


def test_backtest_refuses_gzipped_json_lines_in_one_line(tmp_path: Path) -> None:
    """events.jsonl.gz is no table, and its bytes are no JSON lines: refused naming the file, where reading it as
    lines rejected every line as malformed JSON."""
    from exporter.backtest.input import BacktestError

    with gzip.open(tmp_path / "events.jsonl.gz", "wt") as f:
        f.write('{"model_id": "m"}\n')
    with pytest.raises(BacktestError, match=r"events\.jsonl\.gz: a gzipped file is read only as CSV"):
        backtest(parse_config(RAW_CONFIG, "<test>"), [str(tmp_path / "events.jsonl.gz")])
