"""The lock files pin what pyproject.toml asks for, and CI, a developer's venv and the images get the same versions.

`make test` installs requirements/*.lock with pip's hash checking and resolves nothing; `make lock` (uv) writes them.
A dependency added to pyproject.toml without `make lock` fails here, not as a missing import in CI.
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest
from packaging.markers import default_environment
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parent.parent
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==([^\s;\\]+)\s*(?:;\s*([^\\]+?))?\s*\\?$")


def pins(path: Path) -> dict[str, str]:
    """The versions a lock file installs on this interpreter (universal locks fork some pins by Python version)."""
    found: dict[str, str] = {}
    for line in path.read_text().splitlines():
        match = PIN.match(line)
        if not match:
            continue
        name, version, marker = match.groups()
        if marker and not Requirement(f"x; {marker}").marker.evaluate(default_environment()):  # type: ignore[union-attr]
            continue
        found[canonicalize_name(name)] = version
    return found


def requirements_of(extra: str) -> list[Requirement]:
    """An extra's requirements, the extras it names of the project itself expanded."""
    name = PYPROJECT["project"]["name"]
    found: list[Requirement] = []
    for text in PYPROJECT["project"]["optional-dependencies"][extra]:
        requirement = Requirement(text)
        if canonicalize_name(requirement.name) == canonicalize_name(name):
            for nested in sorted(requirement.extras):
                found += requirements_of(nested)
        else:
            found.append(requirement)
    return found


def assert_pinned_within_range(requirements: list[Requirement], lock: dict[str, str], where: str) -> None:
    for requirement in requirements:
        name = canonicalize_name(requirement.name)
        assert name in lock, f"{requirement} is not pinned in {where}: run `make lock`"
        assert requirement.specifier.contains(lock[name], prereleases=True), (
            f"{where} pins {name}=={lock[name]}, outside {requirement}: run `make lock`"
        )


def test_the_test_lock_pins_every_requirement_of_the_test_environment() -> None:
    lock = pins(ROOT / "requirements" / "test.lock")
    requirements = [Requirement(r) for r in PYPROJECT["project"]["dependencies"]]
    requirements += requirements_of("test")
    requirements += [Requirement(r) for r in PYPROJECT["build-system"]["requires"]]
    assert_pinned_within_range(requirements, lock, "requirements/test.lock")


def test_every_line_of_the_test_locks_carries_hashes() -> None:
    for name in ("test.lock", "nodeps.lock", "platforms.lock"):
        text = (ROOT / "requirements" / name).read_text()
        entries = re.split(r"\n(?=[A-Za-z0-9])", text.split("\n", 2)[2])
        assert len(entries) > 1
        for entry in entries:
            if entry.strip() and not entry.startswith("#"):
                assert "--hash=sha256:" in entry, f"requirements/{name}: {entry.splitlines()[0]} has no hash"


def test_the_no_deps_lock_pins_exactly_its_input() -> None:
    wanted = {
        canonicalize_name(Requirement(line).name): str(Requirement(line).specifier).removeprefix("==")
        for line in (ROOT / "requirements" / "nodeps.in").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    }
    assert pins(ROOT / "requirements" / "nodeps.lock") == wanted


@pytest.mark.parametrize("image_lock", ["deploy/requirements.lock"])
def test_the_images_get_the_versions_the_tests_run(image_lock: str) -> None:
    tested = pins(ROOT / "requirements" / "test.lock")
    image = pins(ROOT / image_lock)
    assert image, image_lock
    differ = {name: (version, tested.get(name)) for name, version in image.items() if tested.get(name) != version}
    assert not differ, f"{image_lock} and requirements/test.lock disagree (image, tests): {differ}: run `make lock`"


def test_make_installs_the_locks_with_hash_checking_and_no_resolution() -> None:
    makefile = (ROOT / "Makefile").read_text()
    uv_install = re.search(r"^UV_INSTALL = \$\(UV\) pip install (.*)$", makefile, re.MULTILINE)
    assert uv_install and "--no-deps" in uv_install.group(1).split(), "uv must install without resolving anything"
    install = re.search(r"^\t\$\(call UV_INSTALL,\$\(VENV\)\) (.*\$\(LOCKS\).*)$", makefile, re.MULTILINE)
    assert install, "the venv is not installed from $(LOCKS)"
    assert "--require-hashes" in install.group(1).split()
    editable = re.search(r"^\t\$\(call UV_INSTALL,\$\(VENV\)\) (.*-e \.)$", makefile, re.MULTILINE)
    assert editable, "the package itself must be installed by the same command, without its dependencies"
