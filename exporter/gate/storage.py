"""Where the gate reads its data and files its reports: local paths, ``file://``, ``s3://``, ``gs://``, ``az://``
and anything else fsspec knows, through fsspec.

Credentials and endpoints come from each cloud's own environment, read by its fsspec library at the time of the
call: ``AWS_ACCESS_KEY_ID`` / ``AWS_SECRET_ACCESS_KEY`` / ``AWS_PROFILE`` / ``AWS_ENDPOINT_URL`` (s3fs, through
botocore), ``GOOGLE_APPLICATION_CREDENTIALS`` (gcsfs), ``AZURE_STORAGE_CONNECTION_STRING`` or
``AZURE_STORAGE_ACCOUNT_NAME`` with a key, SAS token or Azure identity (adlfs). The cloud libraries are the
``storage`` extra: ``pip install 'fairness-exporter[storage]'``.
"""

from __future__ import annotations

import re
from datetime import datetime
from pathlib import Path
from typing import Any

EXTRA_HINT = "pip install 'fairness-exporter[storage]'"
_URL = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://")
_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")


class StorageError(OSError):
    """A location cannot be read or written; the message names it and says why in one line."""


def is_url(location: str) -> bool:
    """Whether a location is a URL (``s3://...``) rather than a local path."""
    return bool(_URL.match(location))


def resolve(location: str, base: Path | None) -> str:
    """A relative local path taken from a config is relative to the config's folder; URLs stay as they are."""
    if is_url(location) or base is None or Path(location).is_absolute():
        return location
    return str(base / location)


def filesystem(location: str) -> tuple[Any, str]:
    """The fsspec filesystem of a location and the path on it; StorageError when its backend is missing."""
    import fsspec

    try:
        # a fresh instance each time: credentials and endpoints are read from the environment of this call
        return fsspec.core.url_to_fs(location, skip_instance_cache=True)
    except ImportError as exc:
        raise StorageError(f"{location}: {exc} ({EXTRA_HINT})") from exc
    except ValueError as exc:  # an unknown protocol
        raise StorageError(f"{location}: {exc}") from exc


def _reason(exc: BaseException) -> str:
    text = " ".join(str(exc).split()) or type(exc).__name__
    return text if isinstance(exc, OSError) else f"{type(exc).__name__}: {text}"


def read_bytes(location: str) -> bytes:
    """The whole content of a file, local or remote."""
    fs, path = filesystem(location)
    try:
        data: bytes = fs.cat_file(path)
    except Exception as exc:  # each backend raises its own errors (botocore, azure, google): one line for all
        raise StorageError(f"{location}: cannot read: {_reason(exc)}") from exc
    return data


def write_bytes(location: str, data: bytes) -> None:
    """Write a whole file, local (its folder made as needed) or remote (the bucket must exist)."""
    fs, path = filesystem(location)
    try:
        if "file" in fs.protocol:
            Path(path).parent.mkdir(parents=True, exist_ok=True)
        fs.pipe_file(path, data)
    except Exception as exc:  # as in read_bytes
        raise StorageError(f"{location}: cannot write: {_reason(exc)}") from exc


def report_name(model_id: str, timestamp: str, suffix: str) -> str:
    """``<model id>_<UTC time>.<suffix>``, e.g. ``hiring-screener-v2_20260115T093000.250113Z.json``: sorts by time
    per model, and two runs in the same second do not overwrite each other."""
    when = datetime.fromisoformat(timestamp.replace("Z", "+00:00"))
    return f"{_UNSAFE.sub('_', model_id)}_{when.strftime('%Y%m%dT%H%M%S.%f')}Z.{suffix}"


def join(folder: str, name: str) -> str:
    """A file inside a destination folder, whether the folder ends with a slash or not."""
    return folder.rstrip("/") + "/" + name
