"""The seed's bias-testing-config.yaml, verbatim (tests/data/seed/), runs through `fairness-exporter audit`: its
evaluation_dataset is read from S3 and its report filed at failure_policy.report_destination, on a real S3 API
(moto's server) on loopback."""

from __future__ import annotations

import io
import itertools
import json
import shutil
from pathlib import Path

import pandas as pd
import pytest
from s3_fixture import S3

from exporter.cli import main
from exporter.gate import audit_log

SEED_CONFIG = Path(__file__).parent / "data" / "seed" / "bias-testing-config.yaml"
GENDERS, AGES = ["male", "female", "non_binary"], ["18_29", "30_44", "45_59", "60_plus"]
ETHNICITIES = ["white", "black", "hispanic", "asian", "other"]


def hiring_eval(female_hired: int = 5) -> pd.DataFrame:
    """400 applicants in each of the 60 subgroups, half qualified; 5 of each 10 hired (``female_hired`` for women):
    enough rows for every interval to be narrower than the seed's 0.05."""
    rows = []
    for gender, age, ethnicity in itertools.product(GENDERS, AGES, ETHNICITIES):
        hired = female_hired if gender == "female" else 5
        for label, i in itertools.product((1, 0), range(200)):
            rows.append({"gender": gender, "age_group": age, "ethnicity": ethnicity, "label": label,
                         "prediction": int(i % 10 < hired)})  # fmt: skip
    return pd.DataFrame(rows)


def put_dataset(s3: S3, frame: pd.DataFrame) -> bytes:
    fs = s3.filesystem()
    fs.mkdir("ml-datasets")
    data = io.BytesIO()
    frame.to_parquet(data)
    fs.pipe_file("ml-datasets/hiring-eval-2026q1.parquet", data.getvalue())
    return data.getvalue()


def audit(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, dict, str]:
    code = main(["audit", *args])
    out, err = capsys.readouterr()
    return code, json.loads(out) if out.strip() else {}, err


def test_the_seed_config_reads_its_dataset_from_s3_and_files_its_reports_there(
        s3: S3, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:  # fmt: skip
    import hashlib

    data = put_dataset(s3, hiring_eval())
    s3.filesystem().mkdir("ml-audit-reports")
    code, report, err = audit(capsys, str(SEED_CONFIG), "--audit-log", str(tmp_path / "log.jsonl"),
                              "--html", str(tmp_path / "r.html"), "--impact-ratios-csv", str(tmp_path / "r.csv"))
    # 3 + 3 + 10 pairs, three metrics each; every rate is equal, so every comparison passes
    assert (code, report["verdict"], report["total_tests"], report["passed"]) == (0, "PASS", 48, 48)
    assert report["data_file"] == "s3://ml-datasets/hiring-eval-2026q1.parquet"
    assert report["data_manifest"] == [{"path": "hiring-eval-2026q1.parquet", "size": len(data),
                                        "sha256": hashlib.sha256(data).hexdigest()}] and report["rows"] == 24000
    line = f"{hashlib.sha256(data).hexdigest()}  {len(data)}  hiring-eval-2026q1.parquet\n"
    assert report["data_manifest_sha256"] == hashlib.sha256(line.encode()).hexdigest()
    filed = sorted(s3.filesystem().ls("ml-audit-reports"))
    stem = "ml-audit-reports/hiring-screener-v2_" + report["timestamp"].replace("-", "").replace(":", "")[:22]
    assert filed == [f"{stem}Z.html", f"{stem}Z.json", f"{stem}Z.ll144.csv"]
    assert json.loads(s3.filesystem().cat_file(f"{stem}Z.json")) == report
    assert s3.filesystem().cat_file(f"{stem}Z.html") == (tmp_path / "r.html").read_bytes()
    assert f"report filed at s3://{stem}Z.json" in err
    record = json.loads((tmp_path / "log.jsonl").read_text())
    assert record["data"] == {"file": report["data_file"], "manifest_sha256": report["data_manifest_sha256"]}


def test_a_file_on_the_command_line_overrides_evaluation_dataset(s3: S3, tmp_path: Path,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    s3.filesystem().mkdir("ml-audit-reports")
    local = tmp_path / "hiring.parquet"
    hiring_eval(female_hired=2).to_parquet(local)  # no dataset on S3 at all: the local file is what is read
    code, report, _ = audit(capsys, str(SEED_CONFIG), str(local), "--audit-log", str(tmp_path / "log.jsonl"))
    assert (code, report["verdict"], report["data_file"]) == (1, "FAIL", str(local))
    failed = {(r["attribute"], r["groups"]) for r in report["results"] if not r["passed"]}
    assert failed == {("gender", "male vs female"), ("gender", "female vs non_binary")}


def test_a_report_that_cannot_be_filed_is_one_line_and_loses_nothing(s3: S3, tmp_path: Path,
                                                                     capsys: pytest.CaptureFixture[str]) -> None:
    put_dataset(s3, hiring_eval())  # the destination bucket does not exist
    log, local = tmp_path / "log.jsonl", tmp_path / "report.json"
    code, report, err = audit(capsys, str(SEED_CONFIG), "--audit-log", str(log), "--report", str(local))
    assert code == 2 and report["verdict"] == "PASS"
    lines = err.splitlines()
    problem = [line for line in lines if "not filed" in line]
    assert len(problem) == 1 and problem[0].startswith(
        "fairness-exporter audit: failure_policy.report_destination s3://ml-audit-reports/: the report was not "
        "filed: s3://ml-audit-reports/hiring-screener-v2_")  # fmt: skip
    assert "bucket does not exist" in problem[0]
    assert json.loads(local.read_text()) == report
    assert json.loads(log.read_text())["report"]["timestamp"] == report["timestamp"]
    assert audit_log.verify(log).problems == []


def test_without_data_anywhere_the_audit_exits_2_naming_what_to_set(tmp_path: Path,
                                                                    capsys: pytest.CaptureFixture[str]) -> None:
    config = tmp_path / "c.yaml"
    config.write_text("model_id: m\nprotected_attributes: [{name: g, groups: [a, b]}]\n")
    code, _, err = audit(capsys, str(config), "--audit-log", str(tmp_path / "log.jsonl"))
    assert code == 2 and err == (f"fairness-exporter audit: {config}: no data to audit: name a predictions file on "
                                 "the command line or set evaluation_dataset in the config\n")  # fmt: skip


@pytest.mark.parametrize("scheme", ["", "file://"])
def test_local_dataset_and_destination_relative_to_the_config(tmp_path: Path, scheme: str,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    shutil.copy(SEED_CONFIG, tmp_path / "seed.yaml")
    hiring_eval().to_csv(tmp_path / "eval.csv", index=False)
    text = (tmp_path / "seed.yaml").read_text()
    dest = f"{scheme}{tmp_path}/reports" if scheme else "reports/"
    (tmp_path / "seed.yaml").write_text(text.replace("s3://ml-datasets/hiring-eval-2026q1.parquet", "eval.csv")
                                        .replace("s3://ml-audit-reports/", dest))  # fmt: skip
    code, report, _ = audit(capsys, str(tmp_path / "seed.yaml"), "--audit-log", str(tmp_path / "log.jsonl"))
    assert (code, report["data_file"]) == (0, str(tmp_path / "eval.csv"))
    [filed] = (tmp_path / "reports").iterdir()
    assert json.loads(filed.read_text()) == report and filed.name.startswith("hiring-screener-v2_")
