"""The Dockerfile builds a pinned, non-root image that serves the contract's port and checks its own health."""

from __future__ import annotations

import json
import re
import shlex
import tomllib
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parent.parent
DOCKERFILE = ROOT / "Dockerfile"
DOCKERIGNORE = ROOT / ".dockerignore"
LOCK = ROOT / "deploy" / "requirements.lock"
CHART_VALUES = ROOT / "deploy" / "helm" / "fairness-exporter" / "values.yaml"
SECRET_WORDS = re.compile(r"passw|secret|token|credential|api_?key|private_?key", re.IGNORECASE)
PINNED_PYTHON = re.compile(r"python:3\.11\.\d+-slim(-\w+)?(@sha256:[0-9a-f]{64})?|python:[^@\s]+@sha256:[0-9a-f]{64}")


@dataclass(frozen=True)
class Instruction:
    keyword: str
    args: str


def parse(text: str) -> list[list[Instruction]]:
    """The Dockerfile's instructions grouped by stage (global ARGs before the first FROM are stage 0's prefix)."""
    logical: list[str] = []
    pending = ""
    for line in text.splitlines():
        if not line.strip() or line.lstrip().startswith("#"):  # comments may sit inside a continued line
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        logical.append(pending + line)
        pending = ""
    stages: list[list[Instruction]] = [[]]
    for line in logical:
        keyword, _, args = line.strip().partition(" ")
        instruction = Instruction(keyword.upper(), args.strip())
        if instruction.keyword == "FROM" and any(i.keyword == "FROM" for i in stages[-1]):
            stages.append([])
        stages[-1].append(instruction)
    return stages


def global_args(stages: list[list[Instruction]]) -> dict[str, str]:
    args: dict[str, str] = {}
    for instruction in stages[0]:
        if instruction.keyword == "FROM":
            break
        if instruction.keyword == "ARG" and "=" in instruction.args:
            name, _, default = instruction.args.partition("=")
            args[name] = default
    return args


def base_image(stage: list[Instruction], args: dict[str, str]) -> str:
    (from_line,) = [i.args for i in stage if i.keyword == "FROM"]
    image = from_line.split()[0]
    return re.sub(r"\$\{(\w+)\}|\$(\w+)", lambda m: args[m.group(1) or m.group(2)], image)


def last(stage: list[Instruction], keyword: str) -> Instruction:
    found = [i for i in stage if i.keyword == keyword]
    assert found, f"the final stage has no {keyword}"
    return found[-1]


def lock_pins() -> dict[str, str]:
    pins = {}
    for line in LOCK.read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            name, _, version = line.partition("==")
            pins[canonicalize_name(name)] = version
    return pins


@pytest.fixture(scope="module")
def stages() -> list[list[Instruction]]:
    return parse(DOCKERFILE.read_text())


@pytest.fixture(scope="module")
def final(stages: list[list[Instruction]]) -> list[Instruction]:
    return stages[-1]


def contract_default_port() -> int:
    """listen.port of the daemon config in docs/contract.md."""
    contract = (ROOT / "docs" / "contract.md").read_text()
    block = contract.split("## Daemon config", 1)[1].split("```yaml", 1)[1].split("```", 1)[0]
    return int(yaml.safe_load(block)["listen"]["port"])


def test_build_is_multi_stage_from_a_pinned_slim_python(stages: list[list[Instruction]]) -> None:
    args = global_args(stages)
    assert len(stages) >= 2
    first_from = next(i.args for i in stages[0] if i.keyword == "FROM")
    assert re.search(r"\sAS\s+\w+$", first_from, re.IGNORECASE), "name the build stage"
    for stage in stages:
        image = base_image(stage, args)
        assert PINNED_PYTHON.fullmatch(image), f"{image}: pin python:3.11.<patch>-slim or a digest"


def test_final_stage_runs_as_a_numeric_non_root_user(final: list[Instruction]) -> None:
    user, _, group = last(final, "USER").args.partition(":")
    assert user.isdigit() and int(user) > 0, user
    assert not group or (group.isdigit() and int(group) > 0), group


def test_exposed_port_is_the_contract_and_chart_port(final: list[Instruction]) -> None:
    exposed = {int(port.split("/")[0]) for i in final if i.keyword == "EXPOSE" for port in i.args.split()}
    values = yaml.safe_load(CHART_VALUES.read_text())
    assert exposed == {contract_default_port()}
    assert exposed == {values["config"]["listen"]["port"], values["service"]["port"]}


def test_healthcheck_gets_healthz_with_the_packages_own_check(final: list[Instruction]) -> None:
    healthcheck = last(final, "HEALTHCHECK").args
    assert '"-m", "exporter.serve.healthcheck"' in healthcheck  # urllib, over HTTP or TLS (tests/test_web_config.py)
    assert f'"{contract_default_port()}"' in healthcheck
    assert not re.search(r"\b(curl|wget)\b", healthcheck)


def test_entrypoint_and_cmd_serve_the_mounted_config(final: list[Instruction]) -> None:
    assert json.loads(last(final, "ENTRYPOINT").args) == ["fairness-exporter"]
    assert json.loads(last(final, "CMD").args) == ["serve", "--config", "/etc/fairness-exporter/config.yaml"]


def test_no_secret_in_env_or_arg(stages: list[list[Instruction]]) -> None:
    for stage in stages:
        for instruction in stage:
            if instruction.keyword in {"ENV", "ARG"}:
                assert not SECRET_WORDS.search(instruction.args), instruction


def test_every_pip_install_is_constrained_by_the_lock(stages: list[list[Instruction]]) -> None:
    installs = [
        command
        for stage in stages
        for i in stage
        if i.keyword == "RUN"
        for command in re.split(r"&&|;", i.args)
        if re.search(r"\bpip (install|wheel)\b", command) and "--no-deps" not in command
    ]
    assert installs
    for command in installs:
        words = shlex.split(command)
        assert "deploy/requirements.lock" in " ".join(words), command
        assert {"--constraint", "-c", "--requirement", "-r"} & set(words), command


def test_every_lock_line_is_an_exact_pin() -> None:
    for line in LOCK.read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            assert re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*==[A-Za-z0-9.+!]+", line), line


def test_lock_pins_every_dependency_within_its_range(stages: list[list[Instruction]]) -> None:
    """The package's dependencies, those of the extras the image installs by default, and the build backend."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    pins = lock_pins()
    extras = global_args(stages).get("FAIRNESS_EXTRAS")
    assert extras == "storage", "the image installs the storage extra by default (s3://, gs://, az:// datasets)"
    optional = project["project"]["optional-dependencies"]
    requirements = [Requirement(r) for r in project["project"]["dependencies"]]
    requirements += [Requirement(r) for extra in extras.split(",") for r in optional[extra]]
    requirements += [Requirement(r) for r in project["build-system"]["requires"]]
    for requirement in requirements:
        name = canonicalize_name(requirement.name)
        assert name in pins, f"{requirement.name} is not pinned in {LOCK.relative_to(ROOT)}"
        assert requirement.specifier.contains(pins[name], prereleases=True), (requirement, pins[name])


def test_dockerignore_lets_in_exactly_what_the_build_copies(stages: list[list[Instruction]]) -> None:
    patterns = [p.strip() for p in DOCKERIGNORE.read_text().splitlines() if p.strip() and not p.startswith("#")]
    assert patterns[0] == "*", "start from nothing, then re-include what the build copies"
    included = {p[1:].rstrip("/") for p in patterns if p.startswith("!")}
    copied = {
        source.rstrip("/")
        for stage in stages
        for i in stage
        if i.keyword == "COPY" and "--from" not in i.args
        for source in i.args.split()[:-1]
    }
    assert copied == included
