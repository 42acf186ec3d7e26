"""The examples of README.md and docs/ run as tests (sybil), so the docs cannot rot.

Every ```python block runs (a block of `>>>` lines is a doctest: its printed output is checked); every ```yaml block
parses, and one that is a config passes the config's own validation; every ```bash and ```console block runs as a
bash script with `set -euo pipefail`, in a workspace holding the repository's examples/ and the files the examples
name (generated below). A command expected to fail says so on its own line, as a reader
sees it: `fairness-exporter audit ...   # exit 1`. A block that cannot run in a test (a cluster, a daemon that runs
until stopped, a network install) is preceded by `<!-- skip: next "why" -->` in the Markdown source.
"""

import atexit
import functools
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterable
from pathlib import Path
from typing import Any
from unittest import mock

import yaml
from sybil import Document, Example, Region, Sybil
from sybil.parsers.markdown import CodeBlockParser, PythonCodeBlockParser, SkipParser

ROOT = Path(__file__).resolve().parent
EXPECTED_EXIT = re.compile(r"^(?P<command>.*\S)\s+#\s*exit (?P<code>\d+)\b.*$", re.MULTILINE)
SHELL_TIMEOUT_SECONDS = 300
CONFIG_KEYS = {"model_id", "models"}


def _expect_exit_codes(script: str) -> str:
    """`command   # exit 1` runs `command` and fails the block unless it exits 1."""
    return EXPECTED_EXIT.sub(
        lambda m: (f"{m['command']} && rc=0 || rc=$?; [ $rc = {m['code']} ] || "
                   f"{{ echo \"expected exit {m['code']}, got $rc\" >&2; exit 1; }}"),
        script,
    )


def _write_doc_files(workspace: Path) -> None:
    """The files the docs' commands name beside examples/: a scored data file, a saved model, a predictions file."""
    import numpy as np
    import pandas as pd
    import skops.io

    shutil.copytree(ROOT / "examples", workspace / "examples", ignore=shutil.ignore_patterns("__pycache__"))
    (workspace / ".venv").symlink_to(Path(sys.executable).parent.parent)  # the docs call .venv/bin/fairness-exporter
    for shipped in ("deploy", "rules"):  # read by the docs' helm and rules examples, never written
        (workspace / shipped).symlink_to(ROOT / shipped)
    rng = np.random.default_rng(7)
    rows = 600
    pd.DataFrame({
        "gender": rng.choice(["male", "female"], rows),
        "race": rng.choice(["white", "black", "asian"], rows),
        "prediction_accuracy": rng.uniform(0.7, 0.95, rows).round(3),
    }).to_csv(workspace / "data.csv", index=False)
    predictions = pd.read_csv(ROOT / "examples" / "hiring-predictions.csv")
    (workspace / "eval").mkdir()
    (workspace / "models.d").mkdir()  # the fleet example's models_dir
    predictions.to_parquet(workspace / "eval" / "predictions.parquet")
    events = pd.DataFrame({  # the same predictions as the topic's JSON events, one every 29 s over a day
        "model_id": "hiring-screener-v2", "prediction_id": predictions["prediction_id"],
        "timestamp": pd.Timestamp("2026-11-30T00:00:00Z") + pd.to_timedelta(29 * predictions.index, unit="s"),
        "prediction": predictions["prediction"], "label": predictions["label"].astype("Int64"),
        "attributes": predictions[["gender", "age_group"]].to_dict("records"),
    })
    events.to_json(workspace / "recorded-events.jsonl", orient="records", lines=True, date_format="iso")
    spec = importlib.util.spec_from_file_location("example_models", ROOT / "examples" / "example_models.py")
    assert spec is not None and spec.loader is not None
    example_models = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example_models)
    skops.io.dump(example_models.credit_model, workspace / "examples" / "model.skops")  # the example model, saved


@functools.cache
def _temporary() -> Path:
    """Where the workspaces live, made on the first document and removed when the session ends."""
    path = Path(tempfile.mkdtemp(prefix="fairness-docs-"))
    atexit.register(shutil.rmtree, path, ignore_errors=True)
    return path


@functools.cache
def _doc_files() -> Path:
    """Made once per session, on the first document; each document runs in a fresh copy of it."""
    template = _temporary() / "doc-files"
    _write_doc_files(template)
    return template


def _setup(namespace: dict[str, Any]) -> None:
    """Each document's examples share a fresh workspace, also the working directory of its Python examples."""
    workspace = Path(tempfile.mkdtemp(dir=_temporary(), prefix="doc-")) / "workspace"
    shutil.copytree(_doc_files(), workspace, symlinks=True)
    namespace["_previous_cwd"], namespace["_workspace"] = Path.cwd(), workspace
    os.chdir(workspace)


def _teardown(namespace: dict[str, Any]) -> None:
    os.chdir(namespace["_previous_cwd"])
    shutil.rmtree(namespace["_workspace"].parent)


def _run_shell(example: Example) -> str | None:
    workspace: Path = example.namespace["_workspace"]
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
           "FAIRNESS_AUDIT_LOG": str(workspace / "fairness-audit-log.jsonl")}
    env.pop("FAIRNESS_AUDIT_LOG_KEY", None)
    script = _expect_exit_codes(str(example.parsed))
    result = subprocess.run(["bash", "-euo", "pipefail", "-c", script], cwd=workspace, env=env,
                            capture_output=True, text=True, timeout=SHELL_TIMEOUT_SECONDS)
    if result.returncode != 0:
        return f"exit {result.returncode}\n--- stdout\n{result.stdout[-4000:]}\n--- stderr\n{result.stderr[-4000:]}"
    return None


def _check_yaml(example: Example) -> None:
    """Every ```yaml block parses; one that is a config (`model_id` or `models` at its top, or under a chart's
    `config:`) is validated by the daemon's and the gate's own parser, `${NAME}` references set."""
    from exporter.config import parse_config

    document = yaml.safe_load(str(example.parsed))
    config = document.get("config", document) if isinstance(document, dict) else document
    if isinstance(config, dict) and CONFIG_KEYS & config.keys():
        references = {name: "set-in-the-environment" for name in re.findall(r"\$\{(\w+)\}", str(example.parsed))}
        with mock.patch.dict(os.environ, references):
            parse_config(config, f"{example.path}:{example.line}", example.namespace["_workspace"])


def _check_json(example: Example) -> None:
    json.loads(str(example.parsed))


def _refuse_unrun_shell(example: Example) -> str:
    return "write shell examples as ```bash (they run) or mark them `<!-- skip: next \"why\" -->`"


class _SkipWithReason(SkipParser):
    """`skip: next "why"`: a skip without its reason is refused, so no example stops running unexplained."""

    def __call__(self, document: Document) -> Iterable[Region]:
        for region in super().__call__(document):
            action, reason = region.parsed
            if action in ("next", "start") and not reason:
                raise ValueError(f"{document.path}: `skip: {action}` needs a reason: skip: {action} \"why\"")
            yield region


def _parsers() -> list[Any]:
    return [
        _SkipWithReason(),
        PythonCodeBlockParser(),
        CodeBlockParser("bash", _run_shell),
        CodeBlockParser("console", _run_shell),
        CodeBlockParser("yaml", _check_yaml),
        CodeBlockParser("json", _check_json),
        *(CodeBlockParser(language, _refuse_unrun_shell) for language in ("sh", "shell", "zsh")),
    ]


pytest_collect_file = Sybil(
    parsers=_parsers(),
    patterns=["README.md", "docs/*.md", "docs/**/*.md", "deploy/helm/fairness-exporter/README.md"],
    setup=_setup,
    teardown=_teardown,
).pytest()
