"""The shipped CI steps, run as their CI runs them: each shell step of action.yml with GitHub's environment, the
GitLab template's job script with GitLab's, in a fresh workspace and a fresh Python environment that has the
package's dependencies but not the package (the steps install it).

What GitHub or GitLab do themselves is checked, not imitated: `uses:` steps are read for what they would receive
(the Python version, the paths uploaded), `artifacts:` for the files they name.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml
from junitparser import Failure
from junitparser.xunit2 import JUnitXml
from test_ci_reports import write_audit

ROOT = Path(__file__).resolve().parent.parent
ACTION = ROOT / "action.yml"
GITLAB = ROOT / "ci" / "gitlab" / "fairness-audit.gitlab-ci.yml"
EXPRESSION = re.compile(r"\$\{\{\s*(.*?)\s*\}\}")
FAILING_CASE = "demographic_parity_difference male vs female"
# `uses: owner/repo@<full commit SHA> # vX.Y.Z`: a moved tag never changes what runs, and the comment says which
PINNED_USES = re.compile(r"^\s*(?:- )?uses: (?P<action>[\w.-]+/[\w.-]+)@(?P<sha>[0-9a-f]{40}) # v\d+\.\d+\.\d+$")


@dataclass
class Runner:
    """A machine with Python and the package's dependencies, and a checkout of the action (the package's sources
    and action.yml), as a runner has once the action is fetched."""

    bin: Path
    action_path: Path

    def env(self, workspace: Path, **extra: str) -> dict[str, str]:
        path = [str(self.bin), *(p for p in os.environ["PATH"].split(os.pathsep) if ".venv" not in p)]
        env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH", "FAIRNESS_AUDIT_LOG")}
        return {**env, "PATH": os.pathsep.join(path), "HOME": str(workspace.parent), "CI": "true", **extra}


@pytest.fixture(scope="module")
def runner(tmp_path_factory: pytest.TempPathFactory) -> Runner:
    base = tmp_path_factory.mktemp("runner")
    action_path = base / "_actions" / "fairness-exporter" / "v0"
    action_path.mkdir(parents=True)
    for name in ("pyproject.toml", "README.md", "action.yml"):
        shutil.copy(ROOT / name, action_path / name)
    shutil.copytree(ROOT / "exporter", action_path / "exporter", ignore=shutil.ignore_patterns("__pycache__"))
    venv = base / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    where = "import sysconfig; print(sysconfig.get_paths()['purelib'])"
    site = Path(subprocess.run([venv / "bin" / "python", "-c", where], capture_output=True, text=True,
                               check=True).stdout.strip())  # fmt: skip
    # the dependencies (and pip) of the environment running the tests, but not its fairness-exporter
    paths = sysconfig.get_paths()
    (site / "dependencies.pth").write_text(f"{paths['purelib']}\n{paths['platlib']}\n")
    assert not (venv / "bin" / "fairness-exporter").exists()
    return Runner(venv / "bin", action_path)


def workspace_with_failing_audit(tmp_path: Path) -> Path:
    """A checkout holding a config and predictions whose parity gap (0.4) fails a blocking 0.05 threshold."""
    workspace = tmp_path / "workspace"
    workspace.mkdir()
    config, data = write_audit(tmp_path, female_positives=100)
    shutil.move(config, workspace / "fairness.yaml")
    shutil.move(data, workspace / "preds.csv")
    return workspace


def evaluate(text: str, context: dict[str, Any]) -> str:
    """GitHub's ``${{ }}`` expressions, of the few forms action.yml may use."""

    def one(match: re.Match[str]) -> str:
        expr = match.group(1)
        if m := re.fullmatch(r"inputs\.([\w-]+)", expr):
            return str(context["inputs"][m.group(1)])
        if m := re.fullmatch(r"steps\.([\w-]+)\.outputs\.([\w-]+)", expr):
            return str(context["steps"].get(m.group(1), {}).get(m.group(2), ""))
        if expr == "github.action_path":
            return str(context["action_path"])
        raise AssertionError(f"action.yml uses an expression this test does not evaluate: {expr}")

    return EXPRESSION.sub(one, text)


def read_outputs(path: Path) -> dict[str, str]:
    """A step's $GITHUB_OUTPUT file: ``name=value`` lines and ``name<<DELIMITER`` blocks."""
    outputs, lines = {}, iter(path.read_text().splitlines())
    for line in lines:
        if "<<" in line.split("=", 1)[0]:
            name, delimiter = line.split("<<", 1)
            outputs[name] = "\n".join(iter(lambda: next(lines), delimiter))
        elif line:
            name, value = line.split("=", 1)
            outputs[name] = value
    return outputs


@dataclass
class ActionRun:
    exit_code: int
    outputs: dict[str, str]
    summary: str
    uploaded: list[Path] = field(default_factory=list)
    logs: list[str] = field(default_factory=list)


def run_action(runner: Runner, workspace: Path, **given: str) -> ActionRun:
    """Run action.yml's steps in order, as a runner does: a failed step skips the steps after it unless their
    ``if:`` asks for them; the action fails with the first failure's exit code."""
    action = yaml.safe_load(ACTION.read_text())
    inputs = {name: str(spec.get("default", "")) for name, spec in action["inputs"].items()}
    assert set(given) <= set(inputs), f"not inputs of action.yml: {set(given) - set(inputs)}"
    inputs |= given
    assert all(inputs[n] for n, spec in action["inputs"].items() if spec.get("required")), "required input unset"
    temp = workspace.parent / "runner_temp"
    temp.mkdir(exist_ok=True)
    summary = temp / "step_summary.md"
    summary.touch()
    context: dict[str, Any] = {"inputs": inputs, "steps": {}, "action_path": runner.action_path}
    result = ActionRun(0, {}, "")
    for i, step in enumerate(action["runs"]["steps"]):
        if result.exit_code and step.get("if") not in ("${{ !cancelled() }}", "${{ always() }}"):
            continue
        if "uses" in step:
            with_ = {k: evaluate(str(v), context) for k, v in step.get("with", {}).items()}
            action_name = step["uses"].split("@")[0]
            if action_name == "actions/setup-python":
                assert sys.version_info[:2] >= tuple(map(int, with_["python-version"].split(".")))
            elif action_name == "actions/upload-artifact":
                result.uploaded = [workspace / p for p in with_["path"].split("\n") if p.strip()]
            else:
                raise AssertionError(f"action.yml uses {step['uses']}, which this test does not know")
            continue
        assert step["shell"] == "bash" and "${{" not in step["run"], "inputs reach run: scripts through env only"
        output = temp / f"output_{i}"
        output.touch()
        env = runner.env(workspace, GITHUB_ACTIONS="true", GITHUB_WORKSPACE=str(workspace),
                         GITHUB_ACTION_PATH=str(runner.action_path), GITHUB_OUTPUT=str(output),
                         GITHUB_STEP_SUMMARY=str(summary), RUNNER_TEMP=str(temp),
                         **{k: evaluate(str(v), context) for k, v in step.get("env", {}).items()})  # fmt: skip
        script = temp / f"step_{i}.sh"
        script.write_text(step["run"])
        # GitHub's command line for `shell: bash`
        done = subprocess.run(["bash", "--noprofile", "--norc", "-eo", "pipefail", str(script)], cwd=workspace,
                              env=env, capture_output=True, text=True, timeout=600)  # fmt: skip
        result.logs.append(done.stdout + done.stderr)
        if "id" in step:
            context["steps"][step["id"]] = read_outputs(output)
        result.exit_code = result.exit_code or done.returncode
    result.outputs = {name: evaluate(spec["value"], context) for name, spec in action["outputs"].items()}
    result.summary = summary.read_text()
    return result


def value_and_interval(failure: Failure) -> str:
    """``0.4000 [0.3611, 0.4358]`` from the failure's message, which must say the comparison failed on evidence."""
    match = re.fullmatch(r"blocking: (0\.4000 \[0\.\d{4}, 0\.\d{4}\]), threshold ≤ 0\.05, evidence fail",
                         failure.message)  # fmt: skip
    assert match, failure.message
    return match.group(1)


def failed_case(junit: Path) -> Failure:
    xml = JUnitXml.fromfile(str(junit))
    (case,) = [c for suite in xml for c in suite if c.name == FAILING_CASE]
    (failure,) = case.result
    assert isinstance(failure, Failure)
    return failure


def test_a_github_actions_run_shows_a_failing_comparison_as_a_failed_test_case(runner: Runner,
                                                                               tmp_path: Path) -> None:  # fmt: skip
    workspace = workspace_with_failing_audit(tmp_path)
    run = run_action(runner, workspace, config="fairness.yaml", data="preds.csv")
    assert run.exit_code == 1, run.logs
    assert (runner.bin / "fairness-exporter").exists()  # the install step installed the action's checkout
    assert (run.outputs["verdict"], run.outputs["exit-code"]) == ("FAIL", "1")
    shown = value_and_interval(failed_case(workspace / run.outputs["junit"]))
    assert run.summary.startswith("### ❌ Fairness audit: FAIL — m1\n")
    assert f"| gender | demographic_parity_difference | male vs female | {shown} | ≤ 0.05 | fail |" in run.summary
    last_record = json.loads((workspace / "fairness-audit-log.jsonl").read_text().splitlines()[-1])
    assert run.outputs["audit-log-head"] == last_record["hash"]
    assert run.uploaded == [workspace / "fairness-reports", workspace / "fairness-audit-log.jsonl"]
    assert {p.name for p in (workspace / "fairness-reports").iterdir()} == {"report.json", "junit.xml", "summary.md"}


def test_a_github_actions_run_on_bad_input_fails_with_exit_2_and_says_why(runner: Runner, tmp_path: Path) -> None:
    workspace = workspace_with_failing_audit(tmp_path)
    run = run_action(runner, workspace, config="fairness.yaml", data="missing.csv")
    assert run.exit_code == 2
    assert (run.outputs["verdict"], run.outputs["exit-code"]) == ("ERROR", "2")
    assert run.summary.startswith("### 🛑 Fairness audit: ERROR")
    assert "missing.csv: no such predictions file" in run.summary
    assert run.uploaded  # the upload step still runs after the failed gate


def run_gitlab_job(runner: Runner, workspace: Path, **variables: str) -> tuple[int, dict[str, Any], str]:
    """The template's job as a GitLab runner with a bash image runs it: the job's variables and GitLab's own in
    the environment, before_script and script as one script under ``set -eo pipefail``."""
    job = yaml.safe_load(GITLAB.read_text())["fairness-audit"]
    assert set(variables) <= set(job["variables"]), f"not variables of the template: {variables}"
    env = runner.env(workspace, GITLAB_CI="true", CI_PROJECT_DIR=str(workspace), CI_JOB_NAME="fairness-audit",
                     CI_PIPELINE_ID="1", CI_COMMIT_SHA="0" * 40,
                     **({k: str(v) for k, v in job["variables"].items()} | variables))  # fmt: skip
    script = workspace.parent / "gitlab_job.sh"
    script.write_text("set -eo pipefail\n" + "\n".join([*job.get("before_script", []), *job["script"]]))
    done = subprocess.run(["bash", str(script)], cwd=workspace, env=env, capture_output=True, text=True,
                          timeout=600)  # fmt: skip
    return done.returncode, job["artifacts"], done.stdout + done.stderr


def test_a_gitlab_pipeline_shows_a_failing_comparison_as_a_failed_test_case(runner: Runner, tmp_path: Path) -> None:
    workspace = workspace_with_failing_audit(tmp_path)
    code, artifacts, log = run_gitlab_job(runner, workspace, FAIRNESS_CONFIG="fairness.yaml",
                                          FAIRNESS_DATA="preds.csv",
                                          FAIRNESS_EXPORTER_PACKAGE=f"{runner.action_path}[gate]")  # fmt: skip
    assert code == 1, log
    assert artifacts["when"] == "always"  # the reports are uploaded from the failed job
    failure = failed_case(workspace / artifacts["reports"]["junit"])
    assert value_and_interval(failure) in failure.text  # GitLab shows the element's text
    assert all((workspace / p).exists() for p in artifacts["paths"])
    assert "m1: FAIL" in log  # the human summary in the job log


def test_a_gitlab_pipeline_with_an_override_passes_and_keeps_the_failed_case(runner: Runner,
                                                                             tmp_path: Path) -> None:  # fmt: skip
    workspace = workspace_with_failing_audit(tmp_path)
    code, artifacts, log = run_gitlab_job(
        runner, workspace, FAIRNESS_CONFIG="fairness.yaml", FAIRNESS_DATA="preds.csv",
        FAIRNESS_OVERRIDE_JUSTIFICATION="Legal approved a 100-user pilot, ticket FAIR-12",
        FAIRNESS_OVERRIDE_AUTHOR="ana@example.org",
        FAIRNESS_EXPORTER_PACKAGE=f"{runner.action_path}[gate]")  # fmt: skip
    assert code == 0, log
    assert failed_case(workspace / artifacts["reports"]["junit"]).message.startswith("blocking, overridden: 0.4000")
    summary = (workspace / "fairness-reports" / "summary.md").read_text()
    assert "Overridden by ana@example.org: Legal approved a 100-user pilot, ticket FAIR-12" in summary


def test_every_action_the_action_uses_is_pinned_by_commit_sha_with_its_version() -> None:
    lines = [line for line in ACTION.read_text().splitlines() if re.match(r"^\s*(- )?uses:", line)]
    steps = [step for step in yaml.safe_load(ACTION.read_text())["runs"]["steps"] if "uses" in step]
    assert len(lines) == len(steps) == 2
    for line in lines:
        assert PINNED_USES.match(line), f"{line.strip()}: pin the full commit SHA, the version in a comment"


def test_the_gitlab_job_pins_its_image_by_digest_and_the_package_by_version() -> None:
    """The image is the Dockerfile's base, by digest; the package is this version with the gate extra (the audit
    needs pandas and pyarrow, which a plain install leaves out)."""
    job = yaml.safe_load(GITLAB.read_text())["fairness-audit"]
    dockerfile_base = re.search(r"^ARG PYTHON_IMAGE=(\S+)$", (ROOT / "Dockerfile").read_text(), re.MULTILINE)
    assert dockerfile_base and job["image"] == dockerfile_base.group(1)
    assert re.fullmatch(r"python:3\.11\.\d+-slim-\w+@sha256:[0-9a-f]{64}", job["image"])
    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    assert job["variables"]["FAIRNESS_EXPORTER_PACKAGE"] == f"fairness-exporter[gate]=={version}"
