"""Model files from a real training run (scikit-learn on its shipped breast-cancer data; skops, joblib, and ONNX
through skl2onnx) go through `fairness-exporter safety`, each versioned by the SHA-256 of its file; a pickle-based
file (joblib, pickle), local or on S3, loads only with an explicit trust switch, since loading it runs its code."""

from __future__ import annotations

import hashlib
import json
import pickle
from pathlib import Path

import model_files
import numpy as np
import pytest
import yaml
from s3_fixture import S3

from exporter.cli import main
from exporter.gate.targets.files import UntrustedModelFile, load_model
from exporter.gate.targets.objects import TargetError


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> model_files.ModelFiles:
    return model_files.write(tmp_path_factory.mktemp("model-files"))


def config(files: model_files.ModelFiles, model: Path, **extra: object) -> Path:
    path = files.folder / f"safety-{model.suffix[1:]}.yaml"
    path.write_text(yaml.safe_dump({"model_id": "cancer-screen", "model": model.name, "feature_count": 30,
                                    "valid_output_range": [0, 1], "test_inputs": files.inputs_csv.name, "seed": 1,
                                    "perturbation": {"noise_scale": "feature_std"}, **extra}))  # fmt: skip
    return path


def safety(path: Path, log: Path, capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, dict, str]:
    code = main(["safety", "--config", str(path), "--audit-log", str(log), *args])
    out, err = capsys.readouterr()
    return code, json.loads(out) if out.strip() else {}, err


@pytest.mark.parametrize("suffix", ["skops", "onnx", "joblib"])
def test_a_trained_model_file_passes_the_suite_versioned_by_its_hash(files: model_files.ModelFiles, tmp_path: Path,
                                                                   suffix: str,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    model = files.folder / f"model.{suffix}"
    trust = ["--trust-model-file"] if suffix == "joblib" else []
    code, report, _ = safety(config(files, model, trusted_types=["numpy.dtype"]), tmp_path / "log.jsonl", capsys,
                             *trust)  # fmt: skip
    digest = hashlib.sha256(model.read_bytes()).hexdigest()
    assert (code, report["verdict"], report["failed"]) == (0, "PASS", 0)
    assert report["model_version"] == report["model_sha256"] == digest
    assert report["results"][0]["details"]["outputs_per_row"] == 1  # predict: the labels, as the seed judges them
    assert report["results"][2]["details"]["inputs"]["nan_values"] == "ok"
    assert report["results"][3]["details"]["inputs"]["wrong_width_row"].startswith("rejected:")
    record = json.loads((tmp_path / "log.jsonl").read_text())
    assert (record["model_id"], record["model_version"]) == ("cancer-screen", digest)


def test_the_onnx_file_scores_what_the_trained_pipeline_scores(files: model_files.ModelFiles) -> None:
    onnx = load_model(str(files.onnx)).model
    expected = files.pipeline.predict_proba(files.X_test)
    assert np.abs(onnx.predict_proba(files.X_test) - expected).max() < 1e-5  # float32 inside the ONNX graph
    assert (onnx.predict(files.X_test) == files.pipeline.predict(files.X_test)).all()


def test_skops_refuses_types_not_listed_as_trusted(files: model_files.ModelFiles, tmp_path: Path,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = safety(config(files, files.skops), tmp_path / "log.jsonl", capsys)
    assert code == 2 and err.count("\n") == 1
    assert "types skops does not trust by default: numpy.dtype; list those you trust under trusted_types in the " \
        "safety config" in err  # fmt: skip


def test_a_file_that_is_no_model_is_one_line_naming_it(tmp_path: Path) -> None:
    bad = tmp_path / "model.onnx"
    bad.write_bytes(b"not a model")
    with pytest.raises(TargetError, match=r"model.onnx: cannot load the model: "):
        load_model(str(bad))
    with pytest.raises(TargetError, match=r"missing.skops: cannot read: "):
        load_model(str(tmp_path / "missing.skops"))


class _Payload:
    """What an attacker puts in a pickle: unpickling it calls ``open(path, "w")``, creating the file."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def __reduce__(self) -> tuple[object, tuple[str, str]]:
        return open, (str(self.path), "w")


REFUSAL = "runs code from the file; if you trust it as your own code, say so with --trust-model-file or trusted: " \
          "true in the safety config, or save the model with skops (.skops) or as ONNX (.onnx)"  # fmt: skip


@pytest.mark.parametrize("suffix", ["joblib", "pkl", "pickle"])
def test_a_pickle_based_file_is_refused_unread_without_the_trust_switch(files: model_files.ModelFiles,
                                                                        tmp_path: Path, suffix: str,
                                                                        capsys: pytest.CaptureFixture[str]) -> None:
    marker = tmp_path / "code-ran"
    hostile = files.folder / f"hostile.{suffix}"
    hostile.write_bytes(pickle.dumps(_Payload(marker)))
    code, report, err = safety(config(files, hostile), tmp_path / "log.jsonl", capsys)
    assert (code, report) == (2, {}) and err.count("\n") == 1
    assert f"hostile.{suffix}: not loaded: loading a .{suffix} file unpickles it, which " + REFUSAL in err
    assert not marker.exists()  # refused before a byte of it was read
    record = json.loads((tmp_path / "log.jsonl").read_text())
    assert record["type"] == "safety_error" and "unpickles it" in record["error"]


def test_with_the_trust_switch_a_pickle_runs_as_before(files: model_files.ModelFiles, tmp_path: Path,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    by_flag = safety(config(files, files.joblib), tmp_path / "log.jsonl", capsys, "--trust-model-file")
    by_config = safety(config(files, files.joblib, trusted=True), tmp_path / "log.jsonl", capsys)
    for code, report, _ in (by_flag, by_config):
        assert (code, report["verdict"], report["failed"]) == (0, "PASS", 0)
        assert report["model_sha256"] == hashlib.sha256(files.joblib.read_bytes()).hexdigest()
    assert by_flag[1]["results"] == by_config[1]["results"]
    # the switch trusts the file: what it holds runs, as it always did (here: code that leaves a file behind)
    marker = tmp_path / "code-ran"
    (files.folder / "hostile.joblib").write_bytes(pickle.dumps(_Payload(marker)))
    code, _, err = safety(config(files, files.folder / "hostile.joblib"), tmp_path / "log.jsonl", capsys,
                          "--trust-model-file")  # fmt: skip
    assert code == 2 and marker.exists() and "TextIOWrapper" in err  # loaded; not a model the suite can call
    with pytest.raises(UntrustedModelFile, match=r"model.joblib: not loaded: .*--trust-model-file, or save"):
        load_model(str(files.joblib))  # the API's default is no trust too; its hint names the command's flag


def test_a_pickle_on_s3_needs_the_trust_switch_too(files: model_files.ModelFiles, s3: S3, tmp_path: Path,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    fs = s3.filesystem()
    fs.mkdir("models")
    fs.put_file(str(files.joblib), "models/cancer/model.joblib")
    path = config(files, files.joblib)
    path.write_text(path.read_text().replace("model: model.joblib", "model: s3://models/cancer/model.joblib"))
    code, _, err = safety(path, tmp_path / "log.jsonl", capsys)
    assert code == 2 and err.count("\n") == 1
    assert "s3://models/cancer/model.joblib: not loaded: loading a .joblib file unpickles it" in err
    code, report, _ = safety(path, tmp_path / "log.jsonl", capsys, "--trust-model-file")
    assert (code, report["verdict"], report["model"]) == (0, "PASS", "s3://models/cancer/model.joblib")
    assert report["model_version"] == hashlib.sha256(files.joblib.read_bytes()).hexdigest()
