"""Build the container images from the repository's Dockerfile: with docker where an engine answers, else buildah.

    python tools/image.py                      # both: fairness-exporter:<version> and fairness-exporter:<version>-full
    python tools/image.py --target daemon      # the daemon image alone
    python tools/image.py --engine buildah     # force buildah (what CI uses)

The Dockerfile's targets: `daemon` (serve, backtest of JSON lines) and `full` (the gate, reports, object storage).
Where no registry can be reached, the buildah path does not pull `python:3.11-slim`: it makes a Python 3.11
base from Debian bookworm packages with mmdebstrap (from the mirror apt already uses), imports it once as
BASE_IMAGE into buildah's storage and hands it to the Dockerfile's PYTHON_IMAGE argument. The base is kept (its tag
names a hash of its recipe), so a second build only redoes the Dockerfile's layers. The host's CA bundle is mounted
into RUN steps (never copied into the image), so pip works behind a TLS-intercepting proxy. Stdlib only.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import re
import shutil
import subprocess
import sys
import tempfile
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# No system pip: the Dockerfile makes virtualenvs (python3-venv brings ensurepip's wheels); passwd for useradd
BASE_PACKAGES = ("python3.11", "python3-venv", "python-is-python3", "ca-certificates", "passwd")
DEFAULT_MIRROR = "http://deb.debian.org/debian"
HOST_CA_BUNDLE = Path("/etc/ssl/certs/ca-certificates.crt")
# documentation, manuals and translations are not needed in an image; licences (copyright files) stay
SLIM_DPKG_OPTIONS = (
    "path-exclude=/usr/share/doc/*", "path-include=/usr/share/doc/*/copyright", "path-exclude=/usr/share/man/*",
    "path-exclude=/usr/share/info/*", "path-exclude=/usr/share/locale/*",
)  # fmt: skip
# merged /usr as debootstrap (and Debian's own container images) set it up, with usr-is-merged: the usrmerge
# package would stay in the image with perl (about 50 MB)
MERGED_USR_HOOK = "/usr/share/mmdebstrap/hooks/merged-usr"
RECIPE = hashlib.sha256(repr((BASE_PACKAGES, SLIM_DPKG_OPTIONS, MERGED_USR_HOOK)).encode()).hexdigest()[:12]
BASE_IMAGE = f"localhost/fairness-exporter-base:python3.11-bookworm-{RECIPE}"
TARGETS = ("daemon", "full")
"""The Dockerfile's images: `daemon` (the default target) and `full`."""


class ImageError(Exception):
    """A build that cannot proceed; the message says what is missing."""


def package_version() -> str:
    return str(tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"])


def default_tag(target: str = "daemon") -> str:
    """localhost/fairness-exporter:<version> for the daemon, <version>-full for the full image."""
    return f"localhost/fairness-exporter:{package_version()}{'' if target == 'daemon' else f'-{target}'}"


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
              f"--hook-dir={MERGED_USR_HOOK}",
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


def build(tag: str | None = None, engine: str = "auto", target: str = "daemon") -> str:
    """Build the Dockerfile's `target` into `tag` with `engine` (auto: docker if its engine answers, else
    buildah)."""
    if target not in TARGETS:
        raise ImageError(f"--target {target!r}: expected one of {', '.join(TARGETS)}")
    tag = tag or default_tag(target)
    if engine == "docker" or (engine == "auto" and docker_works()):
        _run(["docker", "build", "--target", target, "--tag", tag, str(ROOT)])
        return tag
    buildah = _require("buildah", "buildah")
    base = ensure_base_image()
    ca = ["--volume", f"{HOST_CA_BUNDLE}:{HOST_CA_BUNDLE}:ro"] if HOST_CA_BUNDLE.is_file() else []
    # --format docker: the OCI format has no HEALTHCHECK, and buildah drops it from an OCI image
    _run([buildah, "build", "--isolation", "chroot", "--layers", "--format", "docker", *ca,
          "--build-arg", f"PYTHON_IMAGE={base}",
          "--target", target, "--tag", tag, "--file", str(ROOT / "Dockerfile"), str(ROOT)])  # fmt: skip
    return tag


def image_size_mb(tag: str) -> float:
    """The image's size, uncompressed (the sum of its layers), in MB (10^6 bytes) as `buildah images` shows it."""
    buildah = _require("buildah", "buildah")
    listed = json.loads(_run([buildah, "images", "--json", tag], capture_output=True).stdout)
    number, unit = str(listed[0]["size"]).split()
    return float(number) * {"B": 1e-6, "kB": 1e-3, "MB": 1.0, "GB": 1e3}[unit]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--target", choices=[*TARGETS, "both"], default="both",
                        help="the Dockerfile's image to build (default: both)")  # fmt: skip
    parser.add_argument("--tag", default=None, help="image name, with one --target (default "
                        "localhost/fairness-exporter:<version>, and <version>-full for the full image)")  # fmt: skip
    parser.add_argument("--engine", choices=["auto", "docker", "buildah"], default="auto")
    args = parser.parse_args(argv)
    targets = TARGETS if args.target == "both" else (args.target,)
    if args.tag and len(targets) > 1:
        print("image: --tag names one image: give --target daemon or --target full with it", file=sys.stderr)
        return 2
    try:
        for target in targets:
            print(build(args.tag, args.engine, target))
    except ImageError as exc:
        print(f"image: {exc}", file=sys.stderr)
        return 2
    except subprocess.CalledProcessError as exc:
        print(f"image: {' '.join(exc.cmd)} exited with {exc.returncode}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
