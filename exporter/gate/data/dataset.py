"""Open a dataset where it lives and read it in record batches of the columns asked for.

A dataset is a file, a directory, a glob or an object-store prefix of parquet or CSV files, local or at any URL fsspec
knows (:mod:`exporter.gate.storage`); the ``key=value`` folders of a hive-partitioned table are columns. Reading
goes through pyarrow datasets, one batch of at most ``BATCH_ROWS`` rows at a time with only the needed columns, so
memory follows the batch and never the data. :func:`read_batches` is the one reading function for every file input.
"""

from __future__ import annotations

import hashlib
import os
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import PurePosixPath
from typing import Any, Final

import pyarrow as pa
import pyarrow.dataset as ds

from exporter.gate import storage

BATCH_ROWS = 1 << 20
"""Rows per record batch: large enough for numpy to run at memory speed, small enough that a batch of the columns
the audit reads stays in tens of MiB."""
CSV_BLOCK_BYTES = 1 << 24
"""A CSV file's column types are inferred from its first block: 16 MiB, so a file up to that size gets the types its
whole content implies (as pandas read it), and a larger one those of its first 16 MiB."""
FORMATS = {".parquet": "parquet", ".pq": "parquet", ".csv": "csv", ".gz": "csv", ".txt": "csv"}
PANDAS_NULLS = ["", "#N/A", "#N/A N/A", "#NA", "-1.#IND", "-1.#QNAN", "-NaN", "-nan", "1.#IND", "1.#QNAN", "<NA>",
                "N/A", "NA", "NULL", "NaN", "None", "n/a", "nan", "null"]  # fmt: skip
"""The cells pandas reads as missing in a CSV file: the same cells are missing here."""
TRUE_VALUES: Final = ("True", "TRUE", "true")
FALSE_VALUES: Final = ("False", "FALSE", "false")
"""The cells a CSV column of booleans holds (pandas' spellings), read as True and False."""
_NUMBER = re.compile(r"\s*([+-]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?|[+-]?inf(?:inity)?)\s*", re.I)
_INTEGER = re.compile(r"\s*[+-]?[0-9]+\s*")
_GLOB = re.compile(r"[*?\[]")
_HIDDEN = ("_", ".")  # _SUCCESS, _committed_*, .crc files that Spark and Hadoop write beside the data


class DataError(ValueError):
    """The data cannot be read or audited; the message names the location, the column and the values."""


@dataclass(frozen=True)
class DataFile:
    """One file of a dataset: its path relative to the dataset's root (as the manifest names it) and its size."""

    path: str
    size: int


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


@dataclass(frozen=True)
class Dataset:
    """An opened dataset: where it is, what it holds (``what``: predictions, events, data), its files and format.
    Listing happened in :func:`open_dataset`; nothing is read until :meth:`batches` or :meth:`manifest`."""

    location: str
    what: str
    root: str
    files: tuple[DataFile, ...]
    format: str
    filesystem: Any  # fsspec's, or _Local
    arrow: ds.Dataset
    ids: tuple[str, ...] = ()
    """Id columns (the keys of ``attribute_sources``): a CSV file's are its text as written (see :func:`_ids`)."""

    @property
    def schema(self) -> pa.Schema:
        return self.arrow.schema

    @property
    def columns(self) -> list[str]:
        return list(self.arrow.schema.names)

    def batches(self, columns: Sequence[str], batch_rows: int = BATCH_ROWS) -> Iterator[pa.RecordBatch]:
        """The rows in file order, ``batch_rows`` at a time, only ``columns`` (text columns dictionary-encoded)."""
        ids = [k for k, c in enumerate(columns) if c in self.ids] if self.format == "csv" else []
        try:  # one file at a time, in order, a batch read ahead: memory holds a batch or two whatever the data's size
            for fragment in self.arrow.get_fragments():
                batches = fragment.to_batches(schema=self.arrow.schema, columns=list(columns), batch_size=batch_rows,
                                              batch_readahead=1, fragment_readahead=1, use_threads=True)  # fmt: skip
                yield from (_ids(batch, ids) for batch in batches) if ids else batches
        except (pa.ArrowException, OSError) as exc:
            raise DataError(f"{self.location}: cannot read {self.what}: {_reason(exc)}") from exc

    def manifest(self) -> Manifest:
        """Every file's SHA-256 (its bytes read once more, a MiB at a time) and the manifest's hash."""
        entries = []
        for f in sorted(self.files, key=lambda f: f.path.encode()):
            digest = hashlib.sha256()
            try:
                with self.filesystem.open(_join(self.root, f.path), "rb") as handle:
                    while chunk := handle.read(1 << 20):
                        digest.update(chunk)
            except Exception as exc:  # each backend raises its own errors
                raise DataError(f"{self.location}: cannot read {f.path}: {_reason(exc)}") from exc
            entries.append({"path": f.path, "size": f.size, "sha256": digest.hexdigest()})
        unhashed = Manifest(self.location, tuple(entries), "")
        return Manifest(self.location, tuple(entries), hashlib.sha256(unhashed.lines().encode()).hexdigest())


WHOLE_FLOAT_ID: Final = r"^(-?[0-9]+)\.0+$"
"""An id written as an integer and ``.0`` (the integer captured first): read as that integer, on every engine."""


def _ids(batch: pa.RecordBatch, at: Sequence[int]) -> pa.RecordBatch:
    """A CSV batch's id columns, read as text (type inference made ``007`` the integer 7 and merged two 20-digit ids
    into one float), with an integer followed by ``.0`` read as that integer: how pandas writes an integer column
    holding a blank, and how the daemon and a parquet file read such a number (``12.0`` joins ``12``)."""
    import pyarrow.compute as pc

    arrays = list(batch.columns)
    for k in at:
        arrays[k] = pc.replace_substring_regex(arrays[k], WHOLE_FLOAT_ID, r"\1")
    return pa.RecordBatch.from_arrays(arrays, names=batch.schema.names)


def written_value(cell: str) -> bool | int | float | None:
    """What a CSV cell's text writes when read alone: a boolean, an integer (exactly, however long), a float, or
    None when it writes none of these. A CSV column's type inference reads ``01`` as 1 and ``1.0`` as 1.0 for the
    whole column; an attribute column is read as text instead, and a cell that names no group is matched by this.

    >>> [written_value(c) for c in ("01", "1.0", "-2e3", "true", "x", "1_0")]
    [1, 1.0, -2000.0, True, None, None]
    """
    if cell in TRUE_VALUES or cell in FALSE_VALUES:
        return cell in TRUE_VALUES
    if _INTEGER.fullmatch(cell):
        return int(cell)
    return float(cell) if _NUMBER.fullmatch(cell) else None


def _join(root: str, path: str) -> str:
    return path if not root else f"{root.rstrip('/')}/{path}"


def _reason(exc: BaseException) -> str:
    return " ".join(str(exc).split()) or type(exc).__name__


def _kind(path: str) -> str | None:
    return FORMATS.get(PurePosixPath(path).suffix.lower())


def _listing(fs: Any, path: str, location: str, what: str) -> tuple[str, list[tuple[str, int]]]:
    """The dataset's root and its data files with their sizes: the file itself, every data file under a folder
    (recursively, hidden and ``_`` files left out), or the files a glob matches."""
    if _GLOB.search(path):
        root = path[: _GLOB.search(path).start()].rsplit("/", 1)[0]  # type: ignore[union-attr]
        found = fs.glob(path, detail=True)
    elif fs.isdir(path):
        root, found = path, fs.find(path, detail=True)
    elif fs.isfile(path):
        if _kind(path) is None:
            raise DataError(f"{location}: unsupported file type {PurePosixPath(path).suffix!r} "
                            f"(accepted: {', '.join(sorted(FORMATS))}, or a folder or glob of such files)")  # fmt: skip
        return path.rsplit("/", 1)[0] if "/" in path else "", [(path, int(fs.info(path)["size"]))]
    else:
        raise DataError(f"{location}: no such {what} file, folder or prefix")
    files = [(name, int(info.get("size") or 0)) for name, info in sorted(found.items())
             if info.get("type", "file") == "file" and _kind(name) is not None
             and not any(part.startswith(_HIDDEN) for part in name[len(root):].split("/") if part)]  # fmt: skip
    if not files:
        raise DataError(f"{location}: no parquet or CSV files ({', '.join(sorted(FORMATS))}) in this {what} "
                        f"{'glob' if _GLOB.search(path) else 'folder'}")  # fmt: skip
    return root, files


def _file_format(kind: str, dictionary: Sequence[str], ids: Sequence[str] = (),
                 texts: Sequence[str] = ()) -> ds.FileFormat:  # fmt: skip
    if kind == "parquet":
        return ds.ParquetFileFormat(read_options=ds.ParquetReadOptions(dictionary_columns=list(dictionary)))
    from pyarrow import csv

    types = {**dict.fromkeys(texts, pa.dictionary(pa.int32(), pa.string())), **dict.fromkeys(ids, pa.string())}
    return ds.CsvFileFormat(
        read_options=csv.ReadOptions(block_size=CSV_BLOCK_BYTES),
        convert_options=csv.ConvertOptions(null_values=PANDAS_NULLS, strings_can_be_null=True, column_types=types,
                                           true_values=list(TRUE_VALUES), false_values=list(FALSE_VALUES),
                                           auto_dict_encode=True),
    )  # fmt: skip


def open_dataset(location: str, what: str = "data", dictionary: Sequence[str] = (),
                 ids: Sequence[str] = (), texts: Sequence[str] = ()) -> Dataset:  # fmt: skip
    """List a dataset's files and read its schema (a parquet footer, or a CSV file's first block).

    ``dictionary``: text columns to read as dictionaries (codes and their few distinct values), which is how the
    gate encodes them. ``ids``: id columns, read from CSV as text (:attr:`Dataset.ids`); ``texts``: columns read
    from CSV as their text as written (attribute columns: :func:`written_value`). Raises DataError (one line
    naming the location) when there is nothing to read."""
    fs, path = _filesystem(location)
    try:
        root, files = _listing(fs, path, location, what)
    except DataError:
        raise
    except Exception as exc:  # listing a bucket: credentials, endpoints, permissions
        raise DataError(f"{location}: cannot list {what}: {_reason(exc)}") from exc
    kinds = {_kind(name) for name, _ in files}
    if len(kinds) > 1:
        raise DataError(f"{location}: mixes parquet and CSV files; a dataset is one or the other")
    (kind,) = kinds
    assert kind is not None
    arrow_fs = _arrow_filesystem(fs)
    try:
        partitioning = ds.HivePartitioning.discover(null_fallback="__HIVE_DEFAULT_PARTITION__")
        probe = ds.dataset([name for name, _ in files], filesystem=arrow_fs, format=_file_format(kind, (), ids, texts),
                           partitioning=partitioning, partition_base_dir=root or None)  # fmt: skip
        text = [n for n in dictionary if (n in probe.schema.names and pa.types.is_string(probe.schema.field(n).type))
                or (n in probe.schema.names and pa.types.is_large_string(probe.schema.field(n).type))]  # fmt: skip
        arrow = probe if kind == "csv" or not text else ds.dataset(
            [name for name, _ in files], filesystem=arrow_fs, format=_file_format(kind, text),
            partitioning=partitioning, partition_base_dir=root or None)  # fmt: skip
    except (pa.ArrowException, OSError) as exc:
        raise DataError(f"{location}: cannot read {what}: {_reason(exc)}") from exc
    relative = tuple(DataFile(name[len(root):].lstrip("/") if root else name, size) for name, size in files)
    return Dataset(location, what, root, relative, kind, fs, arrow, tuple(ids))


def _filesystem(location: str) -> tuple[Any, str]:
    if not storage.is_url(location) and not _GLOB.search(location):
        return _LOCAL, _LOCAL.path(location)
    try:
        return storage.filesystem(location)
    except storage.StorageError as exc:
        raise DataError(str(exc)) from exc


class _Local:
    """A local file or folder (no glob) listed and read without fsspec, whose import costs a first call ~0.05 s:
    what :func:`_listing` and :meth:`Dataset.manifest` use of fsspec's local filesystem, with the same answers
    (a folder's files found recursively; symbolic links inside it are neither files nor followed, as in fsspec)."""

    protocol = ("file", "local")
    isdir, isfile = staticmethod(os.path.isdir), staticmethod(os.path.isfile)

    @staticmethod
    def path(location: str) -> str:
        """Absolute, ``~`` expanded, no trailing slash (as fsspec names local paths)."""
        return os.path.abspath(os.path.expanduser(location))

    @staticmethod
    def info(path: str) -> dict[str, Any]:
        return {"size": os.path.getsize(path), "type": "file" if os.path.isfile(path) else "other"}

    def find(self, path: str, detail: bool = True) -> dict[str, dict[str, Any]]:
        """Every file under ``path`` with its info (detailed, as ``_listing`` asks)."""
        names = (os.path.join(folder, name) for folder, _, files in os.walk(path) for name in files)
        return {name: self.info(name) for name in names if os.path.isfile(name) and not os.path.islink(name)}

    @staticmethod
    def open(path: str, mode: str) -> Any:
        return open(path, mode)


_LOCAL = _Local()


def _arrow_filesystem(fs: Any) -> Any:
    """pyarrow's own local filesystem for local paths (the fastest), else the fsspec one behind pyarrow's API."""
    from pyarrow import fs as pafs

    if "file" in fs.protocol or "local" in fs.protocol:
        return pafs.LocalFileSystem()
    return pafs.PyFileSystem(pafs.FSSpecHandler(fs))


def read_batches(location: str, columns: Sequence[str], *, what: str = "data", batch_rows: int = BATCH_ROWS,
                 ids: Sequence[str] = ()) -> Iterator[pa.RecordBatch]:  # fmt: skip
    """The one reading function for a file input: ``columns`` of a dataset (file, folder, glob or prefix; parquet or
    CSV; local or a URL) in record batches (``ids``: id columns, see :attr:`Dataset.ids`). Raises DataError naming
    the location and the missing columns."""
    dataset = open_dataset(location, what, columns, ids)
    missing = [c for c in columns if c not in dataset.columns]
    if missing:
        raise DataError(f"{location}: missing column(s) {missing}; the {what} has {dataset.columns}")
    yield from dataset.batches(columns, batch_rows)
