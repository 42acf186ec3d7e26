"""Build the container image from the repository's Dockerfile: with docker where an engine answers, else buildah.

    python tools/image.py                      # tag fairness-exporter:<package version>
    python tools/image.py --engine buildah     # force buildah (what CI uses)

Where no registry can be reached, the buildah path does not pull `python:3.11-slim`: it makes a Python 3.11
base from Debian bookworm packages with mmdebstrap (from the mirror apt already uses), imports it once as
BASE_IMAGE into buildah's storage and hands it to the Dockerfile's PYTHON_IMAGE argument. The base is kept, so a
second build only redoes the Dockerfile's layers. The host's CA bundle is mounted into RUN steps (never copied
into the image), so pip works behind a TLS-intercepting proxy. Stdlib only.
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
import tempfile
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BASE_IMAGE = "localhost/fairness-exporter-base:python3.11-bookworm"
BASE_PACKAGES = ("python3.11", "python3-pip", "python3-venv", "python-is-python3", "ca-certificates", "passwd")
DEFAULT_MIRROR = "http://deb.debian.org/debian"
HOST_CA_BUNDLE = Path("/etc/ssl/certs/ca-certificates.crt")
# documentation, manuals and translations are not needed in an image; licences (copyright files) stay
SLIM_DPKG_OPTIONS = (
    "path-exclude=/usr/share/doc/*", "path-include=/usr/share/doc/*/copyright", "path-exclude=/usr/share/man/*",
    "path-exclude=/usr/share/info/*", "path-exclude=/usr/share/locale/*",
)  # fmt: skip


class ImageError(Exception):
    """A build that cannot proceed; the message says what is missing."""


def package_version() -> str:
    return str(tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"])


def default_tag() -> str:
    return f"localhost/fairness-exporter:{package_version()}"


def docker_works() -> bool:
    """Whether a docker client is installed and its engine answers."""
    if shutil.which("docker") is None:
        return False
    return subprocess.run(["docker", "info"], capture_output=True, timeout=30).returncode == 0


def debian_mirror(sources: Path = Path("/etc/apt")) -> str:
    """The first Debian mirror apt uses for bookworm (deb822 or one-line format); deb.debian.org otherwise."""
    files = sorted((sources / "sources.list.d").glob("*")) if (sources / "sources.list.d").is_dir() else []
    for path in [sources / "sources.list", *files]:
        if not path.is_file():
            continue
        text = path.read_text(errors="replace")
        for stanza in re.split(r"\n\s*\n", text):  # deb822
            fields = dict(re.findall(r"^(\w[\w-]*):\s*(.+)$", stanza, re.MULTILINE))
            if "bookworm" in fields.get("Suites", "").split() and "deb" in fields.get("Types", "").split():
                return fields["URIs"].split()[0]
        for line in text.splitlines():  # one-line
            match = re.match(r"\s*deb\s+(?:\[[^]]*\]\s+)?(\S+)\s+bookworm\s", line)
            if match:
                return match.group(1)
    return DEFAULT_MIRROR


def _run(command: list[str], **kwargs: object) -> subprocess.CompletedProcess[str]:
    print("+", " ".join(command), file=sys.stderr, flush=True)
    return subprocess.run(command, check=True, text=True, **kwargs)  # type: ignore[call-overload,no-any-return]


def _require(tool: str, package: str) -> str:
    found = shutil.which(tool)
    if found is None:
        raise ImageError(f"`{tool}` is not installed: apt-get install {package}")
    return found


def ensure_base_image() -> str:
    """BASE_IMAGE in buildah's storage, made from Debian packages with mmdebstrap unless it is there already."""
    buildah = _require("buildah", "buildah")
    if subprocess.run([buildah, "inspect", "--type", "image", BASE_IMAGE], capture_output=True).returncode == 0:
        return BASE_IMAGE
    mmdebstrap = _require("mmdebstrap", "mmdebstrap")
    with tempfile.TemporaryDirectory(prefix="fairness-base-") as tmp:
        rootfs = Path(tmp) / "rootfs.tar"
        _run([mmdebstrap, "--variant=minbase", f"--include={','.join(BASE_PACKAGES)}", "--quiet",
              *(f"--dpkgopt={option}" for option in SLIM_DPKG_OPTIONS),
              "bookworm", str(rootfs), debian_mirror()])  # fmt: skip
        container = _run([buildah, "from", "scratch"], capture_output=True).stdout.strip()
        try:
            _run([buildah, "add", "--quiet", container, str(rootfs), "/"], capture_output=True)
            _run([buildah, "config", "--env", "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
                  "--env", "LANG=C.UTF-8", "--cmd", "python3", container])  # fmt: skip
            _run([buildah, "commit", "--quiet", "--rm", container, BASE_IMAGE], capture_output=True)
        except BaseException:
            subprocess.run([buildah, "rm", container], capture_output=True)
            raise
    return BASE_IMAGE


def build(tag: str | None = None, engine: str = "auto") -> str:
    """Build the Dockerfile into `tag` with `engine` (auto: docker if its engine answers, else buildah)."""
    tag = tag or default_tag()
    if engine == "docker" or (engine == "auto" and docker_works()):
        _run(["docker", "build", "--tag", tag, str(ROOT)])
        return tag
    buildah = _require("buildah", "buildah")
    base = ensure_base_image()
    ca = ["--volume", f"{HOST_CA_BUNDLE}:{HOST_CA_BUNDLE}:ro"] if HOST_CA_BUNDLE.is_file() else []
    _run([buildah, "build", "--isolation", "chroot", "--layers", *ca, "--build-arg", f"PYTHON_IMAGE={base}",
          "--tag", tag, "--file", str(ROOT / "Dockerfile"), str(ROOT)])  # fmt: skip
    return tag


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tag", default=None, help="image name (default localhost/fairness-exporter:<version>)")
    parser.add_argument("--engine", choices=["auto", "docker", "buildah"], default="auto")
    args = parser.parse_args(argv)
    try:
        tag = build(args.tag, args.engine)
    except ImageError as exc:
        print(f"image: {exc}", file=sys.stderr)
        return 2
    except subprocess.CalledProcessError as exc:
        print(f"image: {' '.join(exc.cmd)} exited with {exc.returncode}", file=sys.stderr)
        return 1
    print(tag)
    return 0


if __name__ == "__main__":
    sys.exit(main())
