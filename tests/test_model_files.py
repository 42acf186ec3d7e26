"""Model files from a real training run (scikit-learn on its shipped breast-cancer data; skops, joblib, and ONNX
through skl2onnx) go through `fairness-exporter safety`, each versioned by the SHA-256 of its file."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import model_files
import numpy as np
import pytest
import yaml

from exporter.cli import main
from exporter.gate.targets.files import load_model
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


def safety(path: Path, log: Path, capsys: pytest.CaptureFixture[str]) -> tuple[int, dict, str]:
    code = main(["safety", "--config", str(path), "--audit-log", str(log)])
    out, err = capsys.readouterr()
    return code, json.loads(out) if out.strip() else {}, err


@pytest.mark.parametrize("suffix", ["skops", "onnx", "joblib"])
def test_a_trained_model_file_passes_the_suite_versioned_by_its_hash(files: model_files.ModelFiles, tmp_path: Path,
                                                                   suffix: str,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    model = files.folder / f"model.{suffix}"
    code, report, _ = safety(config(files, model, trusted_types=["numpy.dtype"]), tmp_path / "log.jsonl", capsys)
    digest = hashlib.sha256(model.read_bytes()).hexdigest()
    assert (code, report["verdict"], report["failed"]) == (0, "PASS", 0)
    assert report["model_version"] == report["model_sha256"] == digest
    assert report["results"][0]["details"]["outputs_per_row"] == 2  # predict_proba: both classes
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
