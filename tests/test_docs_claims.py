"""Sentences of README.md and docs/ checked against what the code does (review 26 found each of them false). Each test
quotes its sentence (file:line) and what it said before, reads the claim from the doc itself where it can, and checks
it against the code."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from exporter.core.conditional import CONDITIONAL_METRICS
from exporter.core.metric_table import METRICS
from exporter.stream.stages.records import PENDING_COLUMNS, Kind

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
CONTRACT = ROOT / "docs" / "contract.md"
NUMBERS = {1: "one", 2: "two", 3: "three", 4: "four", 5: "five"}


def one_line(text: str) -> str:
    return " ".join(text.split())


def test_readme_example_summary_line_is_what_the_shipped_audit_prints(tmp_path: Path) -> None:
    """README.md:75-77: "The shipped example blocks (exit 1): the summary on stderr lists every comparison with its
    value, its 95% interval and its evidence, e.g. `FAIL blocking gender demographic_parity_difference male vs
    female: 0.0775 [0.0439, 0.1108], evidence inconclusive; about 2,125 (male) and 2,098 (female) samples would
    decide it`": the line the shipped audit prints, word for word.

    Before, the README quoted `0.078 [0.044, 0.111]`, three places: the summary prints four (docs/ml/gate.md), so
    the quoted line was never printed."""
    pattern = r"e\.g\. `(FAIL blocking gender demographic_parity_difference[^`]*)`"
    quoted = re.search(pattern, one_line(README.read_text()))
    assert quoted, "the README's example line moved"
    run = subprocess.run(
        [sys.executable, "-m", "exporter.cli", "audit", "examples/hiring-screener.yaml",
         "examples/hiring-predictions.csv", "--audit-log", str(tmp_path / "audit.jsonl")],
        cwd=ROOT, capture_output=True, text=True, timeout=120)  # fmt: skip
    assert run.returncode == 1, run.stderr[-2000:]
    pair = "gender demographic_parity_difference male vs female"
    printed = [line.strip() for line in run.stderr.splitlines() if pair in line]
    assert quoted[1] in printed, (quoted[1], printed)


def test_readme_counts_the_gate_metrics_it_names() -> None:
    """README.md:27-28: "compares the groups of every protected attribute (demographic parity, equalised odds,
    disparate impact and thirteen more, each with its 95% interval, plus three conditional on `strata:`)".

    The one metric table (exporter/core/metric_table.py) has 16 metrics: the three named and 13 more (the README's
    own table of parts lists them all), and exporter/core/conditional.py the three conditional ones. Before, the
    README said "and four more", and nothing of the conditional ones."""
    pattern = r"demographic parity, equalised odds, disparate impact and (\w+) more"
    said = re.search(pattern, one_line(README.read_text()))
    assert said, "the README's sentence moved"
    words = {"one": 1, "two": 2, "three": 3, "four": 4, "five": 5, "six": 6, "seven": 7, "eight": 8, "nine": 9,
             "ten": 10, "eleven": 11, "twelve": 12, "thirteen": 13}  # fmt: skip
    assert 3 + words[said[1]] == len(METRICS), sorted(METRICS)
    assert re.search(rf"plus {NUMBERS[len(CONDITIONAL_METRICS)]} conditional on `strata:`", one_line(
        README.read_text())), sorted(CONDITIONAL_METRICS)  # fmt: skip


def contract_record_rows() -> dict[str, tuple[int, str]]:
    text = CONTRACT.read_text()
    section = text[text.index("## Internal records of the staged path") :]
    rows = re.findall(r"^\| `([A-Z]+)` \((\d+)\) \|(.*)$", section, flags=re.M)
    return {name: (int(number), rest) for name, number, rest in rows}


def test_contract_lists_every_kind_of_internal_record() -> None:
    """docs/contract.md:1-3 and 468-491: "This file fixes the names every part uses ... Change it only together with
    every user", then the internal records' table: PREDICTIONS (1), JOINED (2), PENDING (3), LABELS (4),
    SNAPSHOT (5), HALVES (6), each kind exporter/stream/stages/records.py writes.

    Before, HALVES (6) was absent: the records a staged daemon sends to the join topic for a payload log (its
    request or response halves, kafka.stages: staged with events.format kserve or seldon)."""
    listed = {name: number for name, (number, _) in contract_record_rows().items()}
    assert listed, "the contract's table of internal records moved"
    assert listed == {kind.name: int(kind.value) for kind in Kind}


def contract_columns(kind: str) -> set[str]:
    """The columns the contract's table names in a kind's rows cell."""
    _, rest = contract_record_rows()[kind]
    return set(re.findall(r"`(\w+)`", rest.split("|")[-2]))


def test_contract_pending_rows_name_every_column_written() -> None:
    """docs/contract.md:486: "| `PENDING` (3) | join | `model`, `layout`, `sources` | `source`, `position`,
    `timestamp`, `prediction`, `codes`, `score` (...), prediction ids |"; likewise JOINED's rows end with `score`
    and PREDICTIONS' with `ids` (only for a model with attribute_sources), as exporter/stream/stages/records.py
    writes them, and HALVES' are `source`, `position`, `ids`.

    A PENDING record's rows are PENDING_COLUMNS (a waiting prediction takes its score to its label); a JOINED
    record's the scores of joined_columns; a PREDICTIONS record carries side_ids with attribute_sources. Before,
    the contract's PENDING and JOINED rows lacked `score`, PREDICTIONS' lacked `ids`, and HALVES had no row."""
    named = contract_columns("PENDING")
    assert set(PENDING_COLUMNS) <= named, sorted(set(PENDING_COLUMNS) - named)
    assert {"codes", "score"} <= contract_columns("JOINED")
    assert {"score", "ids"} <= contract_columns("PREDICTIONS")
    assert contract_columns("HALVES") >= {"source", "position", "ids"}


@pytest.mark.skipif(shutil.which("make") is None, reason="needs make")
@pytest.mark.parametrize("doc", ["docs/getting-started.md", "README.md"])
def test_make_test_needs_the_apt_get_installs_of_the_packages_the_docs_name(doc: str, tmp_path: Path) -> None:
    """docs/getting-started.md:45-48 and README.md:16-19: "`make test` needs root or sudo for two `apt-get install`s
    ..., each only where one of its tools is missing: `nodejs` and `npm` (the Grafana dashboard's schema check),
    then `prometheus`, `prometheus-alertmanager`, `buildah`, `mmdebstrap` and `chromium` (...)".

    On the fresh Debian/Ubuntu machine the docs start from (no node), `make test-deps` runs two: `nodejs npm`
    for the Grafana schema (tools/grafana-schema), then the five. `make -n` shows both without running them.
    Before, both docs said one `apt-get install` (of the five), and the README left out mmdebstrap."""
    text = one_line((ROOT / doc).read_text())
    said = re.search(r"needs root or sudo for (\w+) `apt-get install`s?.*?each only where one of its tools is "
                     r"missing: (.*?); CI runs", text)  # fmt: skip
    assert said, f"the {doc} sentence moved"
    named = [re.findall(r"`([\w-]+)`", part.split(" (")[0]) for part in said[2].split("), then ")]
    for name in ("pyproject.toml", "requirements/test.lock", "requirements/nodeps.lock",
                 "requirements/platforms.lock", "tools/grafana-schema/package-lock.json"):  # fmt: skip
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).touch()
    shutil.copy(ROOT / "Makefile", tmp_path / "Makefile")
    dry = subprocess.run(["make", "-n", "test-deps"], cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert dry.returncode == 0, dry.stderr
    installs = re.findall(r"apt-get install -y -qq --no-install-recommends ([\w ./-]+?)(?:;|$)", dry.stdout, re.M)
    assert (NUMBERS[len(installs)], [line.split() for line in installs]) == (said[1], named), installs
