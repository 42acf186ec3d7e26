"""The container's HEALTHCHECK: ``python -m exporter.serve.healthcheck [PORT]`` gets /healthz over plain HTTP, or
over TLS when the daemon serves TLS (its certificate is not checked: this is the container asking its own socket);
exit 0 when the daemon says it is healthy, 1 otherwise. Imports neither numpy nor pandas."""

from __future__ import annotations

import ssl
import sys
import urllib.error
import urllib.request

DEFAULT_PORT = 9108
TIMEOUT_SECONDS = 4.0


def healthy(port: int) -> tuple[bool, str]:
    """Whether /healthz on the local port answers 200, over HTTP or else over TLS, and what it said."""
    why = "no answer"
    for scheme, context in (("http", None), ("https", ssl._create_unverified_context())):
        try:
            with urllib.request.urlopen(f"{scheme}://127.0.0.1:{port}/healthz", timeout=TIMEOUT_SECONDS,
                                        context=context) as response:  # fmt: skip
                return True, response.read().decode().strip()
        except urllib.error.HTTPError as exc:  # it answered: unhealthy, or a 401 (auth_excluded_paths lacks it)
            return False, f"{scheme}: HTTP {exc.code}: {exc.read().decode().strip()}"
        except OSError as exc:  # a TLS socket closes a plain request; nothing listens; a timeout
            why = f"{scheme}: {exc}"
    return False, why


def main(argv: list[str]) -> int:
    ok, why = healthy(int(argv[1]) if len(argv) > 1 else DEFAULT_PORT)
    print(why, file=sys.stdout if ok else sys.stderr)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv))
