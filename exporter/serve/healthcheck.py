"""The container's HEALTHCHECK: ``python -m exporter.serve.healthcheck [--config FILE | PORT]`` gets /healthz where
the daemon listens, over plain HTTP, or over TLS when the daemon serves TLS (its certificate is not checked: this
is the container asking its own socket); exit 0 when the daemon says it is healthy, 1 otherwise.

Where it listens is the config's ``listen.address`` and ``listen.port`` (a container on port 9200 is healthy too),
read from ``--config``, else from the config file of the running ``serve`` command (its command line in /proc: the
container's own processes, so an overridden CMD is followed), else from /etc/fairness-exporter/config.yaml. Imports
neither numpy nor pandas: it runs every 30 s.
"""

from __future__ import annotations

import ipaddress
import ssl
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from exporter.config.yaml_file import YamlFileError, read_yaml

DEFAULT_PORT = 9108
DEFAULT_CONFIG = Path("/etc/fairness-exporter/config.yaml")
TIMEOUT_SECONDS = 4.0
CONFIG_FLAGS = ("--config", "--config.file")
WILDCARDS = {"0.0.0.0": "127.0.0.1", "::": "::1"}  # a wildcard bind answers on loopback


def healthy(port: int, host: str = "127.0.0.1") -> tuple[bool, str]:
    """Whether /healthz at host:port answers 200, over HTTP or else over TLS, and what it said."""
    netloc = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    why = "no answer"
    for scheme, context in (("http", None), ("https", ssl._create_unverified_context())):
        try:
            with urllib.request.urlopen(f"{scheme}://{netloc}/healthz", timeout=TIMEOUT_SECONDS,
                                        context=context) as response:  # fmt: skip
                return True, response.read().decode().strip()
        except urllib.error.HTTPError as exc:  # it answered: unhealthy, or a 401 (auth_excluded_paths lacks it)
            return False, f"{scheme}: HTTP {exc.code}: {exc.read().decode().strip()}"
        except OSError as exc:  # a TLS socket closes a plain request; nothing listens; a timeout
            why = f"{scheme}: {exc}"
    return False, why


def _config_argument(argv: list[str]) -> str | None:
    """The config file of a ``serve`` command line (``--config F``, ``--config=F``, ``--config.file F``)."""
    if "serve" not in argv:
        return None
    for i, arg in enumerate(argv):
        name, eq, value = arg.partition("=")
        if name in CONFIG_FLAGS:
            return value if eq else (argv[i + 1] if i + 1 < len(argv) else None)
    return None


def _serving_configs(proc: Path) -> Iterator[Path]:
    """The config file of every ``serve`` process under ``proc``, relative paths taken from the process's cwd."""
    for entry in sorted(proc.iterdir(), key=lambda p: int(p.name) if p.name.isdigit() else -1):
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().decode(errors="replace").split("\0")
            found = _config_argument(argv)
            if found is not None:
                yield Path(found) if Path(found).is_absolute() else (entry / "cwd").resolve() / found
        except OSError:  # the process ended, or is not ours to read
            continue


def config_file(proc: Path = Path("/proc")) -> Path:
    """The running daemon's config file, else the image's default."""
    return next(_serving_configs(proc), DEFAULT_CONFIG) if proc.is_dir() else DEFAULT_CONFIG


def listen_target(config: Path) -> tuple[str, int]:
    """(host, port) to reach the daemon of this config at: its listen section, a wildcard address as loopback."""
    raw = read_yaml(config)
    listen: Any = raw.get("listen") if isinstance(raw, dict) else None
    listen = listen if isinstance(listen, dict) else {}
    if any("${" in str(value) for value in listen.values()):  # ${VAR}: expanded as the daemon's loader does
        from exporter.config.toolkit import Errors, expand_env

        errors = Errors()
        listen = expand_env(listen, errors, "listen")
        if errors.lines:
            raise ValueError(f"{config}: {'; '.join(errors.lines)}")
    address = str(listen.get("address") or "0.0.0.0")
    address = str(ipaddress.ip_address(address))  # the daemon accepts IP addresses only
    return WILDCARDS.get(address, address), int(listen.get("port") or DEFAULT_PORT)


def main(argv: list[str]) -> int:
    """``[--config FILE | PORT]``: exit 0 when /healthz answers 200, 1 otherwise (the reason on stderr)."""
    args = argv[1:]
    try:
        if args and args[0].isdigit():
            host, port = "127.0.0.1", int(args[0])
        else:
            config = Path(args[1]) if args[:1] == ["--config"] and len(args) > 1 else config_file()
            host, port = listen_target(config)
    except (OSError, YamlFileError, ValueError) as exc:
        print(f"healthcheck: {exc}", file=sys.stderr)
        return 1
    ok, why = healthy(port, host)
    print(why, file=sys.stdout if ok else sys.stderr)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv))
