"""A dataset's files: which files of a folder, glob or prefix are data and in what format, what each was when listed,
and the manifest that names the bytes an audit read.

No pyarrow here: ``backtest`` tells a table from JSON lines by :func:`file_format` in the daemon's image too.
"""

from __future__ import annotations

import hashlib
import os
import re
from dataclasses import dataclass
from pathlib import PurePosixPath
from typing import Any, Final

from exporter.gate import storage

FORMATS: Final = {".parquet": "parquet", ".pq": "parquet", ".csv": "csv", ".txt": "csv"}
"""A data file's format by its suffix; a CSV file may be gzipped (``.csv.gz``, ``.txt.gz``): :func:`file_format`."""
GZIP: Final = ".gz"
ROWS: Final = (GZIP, ".jsonl", ".ndjson")
"""Suffixes of files that hold rows the gate does not read as such: in a folder, refused rather than left out."""
ACCEPTED: Final = ".parquet, .pq, .csv, .txt, .csv.gz, .txt.gz"
_GLOB = re.compile(r"[*?\[]")
_HIDDEN = ("_", ".")  # _SUCCESS, _committed_*, .crc files that Spark and Hadoop write beside the data
_VERSIONS = ("ETag", "etag", "generation", "mtime", "LastModified", "last_modified", "updated", "created")
"""What a listing says of a file's version, first found first (an object store's ETag, then a modification time)."""


class DataError(ValueError):
    """The data cannot be read or audited; the message names the location, the column and the values."""


def file_format(name: str) -> str | None:
    """A data file's format by its name: its suffix's, or that of the suffix before ``.gz`` (only CSV is read
    gzipped; a parquet file compresses inside itself); None for a file of no format the gate reads. The one rule of
    the gate's datasets and of ``backtest``'s inputs.

    >>> [file_format(n) for n in ("a.csv.gz", "a.txt", "a.pq", "a.jsonl.gz", "a.parquet.gz", "a.gz", "README.md")]
    ['csv', 'csv', 'parquet', None, None, None, None]
    """
    suffixes = [s.lower() for s in PurePosixPath(name).suffixes]
    if suffixes[-1:] == [GZIP]:
        return "csv" if len(suffixes) > 1 and FORMATS.get(suffixes[-2]) == "csv" else None
    return FORMATS.get(suffixes[-1]) if suffixes else None


@dataclass(frozen=True)
class DataFile:
    """One file of a dataset: its path relative to the dataset's root (as the manifest names it), its size, and its
    version when listed (an ETag or a modification time), which the manifest compares after hashing."""

    path: str
    size: int
    version: str = ""


@dataclass(frozen=True)
class Manifest:
    """Which data was read: every file's path (relative to ``root``), size and SHA-256, and one hash over them.

    ``sha256`` is the SHA-256 of the lines ``<file sha256>  <size>  <path>\\n``, sorted by path (bytewise): an
    auditor recomputes it with ``sha256sum`` and ``stat`` (docs/auditor/data-manifest.md)."""

    root: str
    files: tuple[dict[str, Any], ...]
    sha256: str

    def lines(self) -> str:
        """The text whose SHA-256 is :attr:`sha256`."""
        return "".join(f"{f['sha256']}  {f['size']}  {f['path']}\n" for f in self.files)


def manifest(location: str, root: str, files: tuple[DataFile, ...], fs: Any) -> Manifest:
    """Every file's SHA-256 (its bytes read once more, a MiB at a time) and the manifest's hash. Called once the
    files were counted: a file whose bytes hashed, size or version now differ from its listing changed during the
    audit, and its counts and its hash may be of two states of it: DataError naming it."""
    entries = []
    for f in sorted(files, key=lambda f: f.path.encode()):
        digest, read = hashlib.sha256(), 0
        try:
            with fs.open(join(root, f.path), "rb") as handle:
                while chunk := handle.read(1 << 20):
                    digest.update(chunk)
                    read += len(chunk)
            now = _listed(fs, join(root, f.path), fresh=True)
        except Exception as exc:  # each backend raises its own errors
            raise DataError(f"{location}: cannot read {f.path}: {reason(exc)}") from exc
        if read != f.size or now != (f.size, f.version):
            raise DataError(f"{location}: {f.path} changed during the audit (listed at {f.size} bytes, {read} bytes "
                            "when hashed): its counts and its hash may be of different bytes; audit data at rest "
                            "(a closed partition, a finished job's output)")  # fmt: skip
        entries.append({"path": f.path, "size": f.size, "sha256": digest.hexdigest()})
    unhashed = Manifest(location, tuple(entries), "")
    return Manifest(location, tuple(entries), hashlib.sha256(unhashed.lines().encode()).hexdigest())


def join(root: str, path: str) -> str:
    """A file's path on its filesystem, from the dataset's root and its path relative to it."""
    return path if not root else f"{root.rstrip('/')}/{path}"


def reason(exc: BaseException) -> str:
    return " ".join(str(exc).split()) or type(exc).__name__


_CSV_ROW: Final = re.compile(r"CSV parse error: (?:Row #(\d+): )?Expected (\d+) columns, got (\d+)")
_CSV_CELL: Final = re.compile(r"In CSV column #(\d+): (?:Row #(\d+): )?CSV conversion error to (\w+)")


def private_reason(exc: BaseException) -> str:
    """Why a side table cannot be read, without a cell of it: pyarrow's CSV errors quote the row or the value, and a
    side table's values never leave the process (docs/ml/joined-attributes.md, The firewall). A reason not known
    to quote nothing is withheld, save an I/O error's (paths and permissions).

    >>> private_reason(ValueError("CSV parse error: Row #52: Expected 3 columns, got 4: Z-9,female,black,x"))
    'line 52 has 4 fields where the header has 3 (its cells not shown)'
    >>> private_reason(ValueError("In CSV column #1: CSV conversion error to int64: invalid value 'female'"))
    'column 2 (from the left) holds a cell that cannot be read as int64, the type the file gave it (not shown)'
    """
    text = str(exc)
    if row := _CSV_ROW.search(text):
        line, expected, got = row.groups()
        where = f"line {line}" if line else "a line"
        return f"{where} has {got} fields where the header has {expected} (its cells not shown)"
    if cell := _CSV_CELL.search(text):
        column, line, kind = cell.groups()
        on = f" on line {line}" if line else ""
        return (f"column {int(column) + 1} (from the left) holds a cell{on} that cannot be read as {kind}, the type "
                "the file gave it (not shown)")  # fmt: skip
    if isinstance(exc, OSError):
        return reason(exc)
    return f"{type(exc).__name__}, whose message is not shown: it may quote a row"


def _version(info: dict[str, Any]) -> str:
    return next((f"{key}={info[key]}" for key in _VERSIONS if info.get(key) is not None), "")


def _listed(fs: Any, path: str, fresh: bool = False) -> tuple[int, str]:
    """A file's size and version as its filesystem states them now (``fresh``: not from a cached listing)."""
    if fresh and hasattr(fs, "invalidate_cache"):
        fs.invalidate_cache(path)
    info = fs.info(path)
    return int(info.get("size") or 0), _version(info)


def is_glob(location: str) -> bool:
    return bool(_GLOB.search(location))


def listing(fs: Any, path: str, location: str, what: str) -> tuple[str, tuple[DataFile, ...]]:
    """The dataset's root and its data files (path relative to the root, size, version): the file itself, every
    data file under a folder (recursively, hidden and ``_`` files left out), or the files a glob matches. A file of
    rows in no format the gate reads (JSON lines, a gzipped file other than CSV) is refused, naming it."""
    glob = _GLOB.search(path)
    if glob:
        root = path[: glob.start()].rsplit("/", 1)[0]
        found = fs.glob(path, detail=True)
    elif fs.isdir(path):
        root, found = path, fs.find(path, detail=True)
    elif fs.isfile(path):
        if file_format(path) is None:
            raise DataError(f"{location}: unsupported file type {''.join(PurePosixPath(path).suffixes[-2:])!r} "
                            f"(accepted: {ACCEPTED}, or a folder or glob of such files)")  # fmt: skip
        root = path.rsplit("/", 1)[0] if "/" in path else ""
        return root, (DataFile(path[len(root):].lstrip("/") if root else path, *_listed(fs, path)),)
    else:
        raise DataError(f"{location}: no such {what} file, folder or prefix")
    files = {name[len(root):].lstrip("/"): info for name, info in sorted(found.items())
             if info.get("type", "file") == "file"
             and not any(part.startswith(_HIDDEN) for part in name[len(root):].split("/") if part)}  # fmt: skip
    unread = [name for name in files if file_format(name) is None and name.lower().endswith(ROWS)]
    if unread:
        raise DataError(f"{location}: cannot read {unread[0]!r}: a {what} dataset is parquet or CSV files "
                        f"({ACCEPTED}); move the file out of it or convert it")  # fmt: skip
    data = tuple(DataFile(name, int(info.get("size") or 0), _version(info)) for name, info in files.items()
                 if file_format(name) is not None)  # fmt: skip
    if not data:
        raise DataError(f"{location}: no parquet or CSV files ({ACCEPTED}) in this {what} "
                        f"{'glob' if glob else 'folder'}")  # fmt: skip
    return root, data


def filesystem(location: str) -> tuple[Any, str]:
    """The filesystem a location lives on and its path there: our own for a local path without a glob."""
    if not storage.is_url(location) and not _GLOB.search(location):
        return LOCAL, LOCAL.path(location)
    try:
        return storage.filesystem(location)
    except storage.StorageError as exc:
        raise DataError(str(exc)) from exc


class _Local:
    """A local file or folder (no glob) listed and read without fsspec, whose import costs a first call ~0.05 s:
    what :func:`listing` and :func:`manifest` use of fsspec's local filesystem, with the same answers (a folder's
    files found recursively; symbolic links inside it are neither files nor followed, as in fsspec)."""

    protocol = ("file", "local")
    isdir, isfile = staticmethod(os.path.isdir), staticmethod(os.path.isfile)

    @staticmethod
    def path(location: str) -> str:
        """Absolute, ``~`` expanded, no trailing slash (as fsspec names local paths)."""
        return os.path.abspath(os.path.expanduser(location))

    @staticmethod
    def info(path: str) -> dict[str, Any]:
        """Size, type and modification time of one stat, as fsspec states them."""
        stat = os.stat(path)
        return {"size": stat.st_size, "type": "file" if os.path.isfile(path) else "other", "mtime": stat.st_mtime}

    def find(self, path: str, detail: bool = True) -> dict[str, dict[str, Any]]:
        """Every file under ``path`` with its info (detailed, as ``listing`` asks)."""
        names = (os.path.join(folder, name) for folder, _, files in os.walk(path) for name in files)
        return {name: self.info(name) for name in names if os.path.isfile(name) and not os.path.islink(name)}

    @staticmethod
    def open(path: str, mode: str) -> Any:
        return open(path, mode)


LOCAL = _Local()
