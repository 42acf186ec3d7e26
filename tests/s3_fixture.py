"""A real S3 API on loopback: moto's standalone server (moto[server], how s3fs tests itself), started once per
session; each test that asks for it gets the environment a CI job would set and empty buckets."""

from __future__ import annotations

import logging
import socket
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
import tooling


@dataclass(frozen=True)
class S3:
    endpoint: str

    def filesystem(self) -> Any:  # s3fs ships no type hints
        import s3fs

        return s3fs.S3FileSystem(skip_instance_cache=True)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="session")
def _moto_endpoint() -> Iterator[str]:
    try:
        from moto.server import ThreadedMotoServer
    except ImportError:
        tooling.missing("moto[server] is not installed")
    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # one access-log line per request otherwise
    port = _free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    yield f"http://127.0.0.1:{port}"
    server.stop()


@pytest.fixture
def s3(_moto_endpoint: str, monkeypatch: pytest.MonkeyPatch) -> S3:
    """The S3 server, empty, with the standard AWS variables pointing at it."""
    urllib.request.urlopen(urllib.request.Request(f"{_moto_endpoint}/moto-api/reset", method="POST")).close()
    for name, value in {"AWS_ENDPOINT_URL": _moto_endpoint, "AWS_ACCESS_KEY_ID": "testing",
                        "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1"}.items():  # fmt: skip
        monkeypatch.setenv(name, value)
    for name in ("AWS_PROFILE", "AWS_SESSION_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    return S3(_moto_endpoint)
