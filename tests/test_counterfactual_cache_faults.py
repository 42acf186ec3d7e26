"""The counterfactual gate's answer cache (``--cache``) where it cannot be written. A folder that cannot be written
at all is refused before the first request (exit 2 naming ``--cache``, the run logged as an error): before, the
first answer's write raised out of a worker thread, a traceback after the calls were spent. An answer that cannot
be written mid-run (a disk that fills up) is counted in the report's ``cache.not_written`` and said on stderr; the
run judges every answer it received as if the cache had kept it."""

from __future__ import annotations

import errno
import json
import os
from pathlib import Path

import chat_servers
import pytest
import scripted_screener
import yaml

from exporter.cli import main
from exporter.gate.counterfactual import calls


@pytest.fixture(autouse=True)
def _key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", chat_servers.KEY)


def _suite(tmp_path: Path) -> Path:
    suite = tmp_path / "suite.yaml"
    suite.write_text(yaml.safe_dump(scripted_screener.suite(20)))
    return suite


def test_a_cache_folder_that_cannot_be_written_is_refused_before_any_request(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:  # fmt: skip
    (tmp_path / "cache").write_text("a file where the folder should be\n")
    log = tmp_path / "log.jsonl"
    with chat_servers.serve(scripted_screener.screener({"female": 0.5, "male": 0.5})) as server:
        code = main(["counterfactual", str(_suite(tmp_path)), "--target", server.base_url, "--model",
                     chat_servers.MODEL, "--cache", str(tmp_path / "cache"), "--audit-log", str(log)])  # fmt: skip
        sent = server.calls
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and sent == 0
    assert f"--cache {tmp_path / 'cache'}: the answers cannot be written there" in err[-1], err
    assert json.loads(log.read_text().splitlines()[-1])["type"] == "counterfactual_error"


def test_answers_the_cache_cannot_keep_mid_run_are_counted_and_the_run_judges_them(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    replace = os.replace

    def full_disk(src: object, dst: object) -> None:
        if str(dst).endswith(".json") and "cache" in str(dst):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        replace(src, dst)  # type: ignore[arg-type]

    monkeypatch.setattr(calls.os, "replace", full_disk)
    with chat_servers.serve(scripted_screener.screener({"female": 0.5, "male": 0.5})) as server:
        code = main(["counterfactual", str(_suite(tmp_path)), "--target", server.base_url, "--model",
                     chat_servers.MODEL, "--cache", str(tmp_path / "cache"), "--audit-log",
                     str(tmp_path / "log.jsonl")])  # fmt: skip
    out, err = capsys.readouterr()
    report = json.loads(out)
    assert code in (0, 1) and report["requests"]["sent"] == 40 and report["requests"]["failed"] == 0
    assert report["cache"]["not_written"] == 40 and "No space left on device" in report["cache"]["first_error"]
    assert "40 answer(s) could not be kept in the cache" in err
    assert not [p for p in (tmp_path / "cache").rglob("*") if p.is_file()]  # no temporary file left behind
