"""Open a dataset where it lives and read it in record batches of the columns asked for.

A dataset is a file, a directory, a glob or an object-store prefix of parquet or CSV files, local or at any URL fsspec
knows (:mod:`exporter.gate.storage`); the ``key=value`` folders of a hive-partitioned table are text columns. Its
files are one table: each file's columns are read by name, a column takes the one type every file's values fit
(a blank CSV column takes the others' type, integers widen to floats), and a column a file lacks or gives another
kind of type is refused when read (:meth:`Dataset.problem`), never read as blanks or cast. Reading goes through
pyarrow datasets, one batch of at most ``BATCH_ROWS`` rows at a time with only the needed columns, so memory follows
the batch and never the data. :func:`read_batches` is the one reading function for every file input.
"""

from __future__ import annotations

import io
import re
from collections.abc import Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Final

import pyarrow as pa
import pyarrow.dataset as ds

from exporter.gate.data.files import DataError, DataFile, Manifest, file_format, filesystem, join, listing, manifest
from exporter.gate.data.files import private_reason as _private_reason
from exporter.gate.data.files import reason as _reason

BATCH_ROWS = 1 << 20
"""Rows per record batch: large enough for numpy to run at memory speed, small enough that a batch of the columns
the audit reads stays in tens of MiB."""
CSV_BLOCK_BYTES = 1 << 24
"""A CSV file's column types are inferred from its first block: 16 MiB, so a file up to that size gets the types its
whole content implies (as pandas read it), and a larger one those of its first 16 MiB."""
PANDAS_NULLS = ["", "#N/A", "#N/A N/A", "#NA", "-1.#IND", "-1.#QNAN", "-NaN", "-nan", "1.#IND", "1.#QNAN", "<NA>",
                "N/A", "NA", "NULL", "NaN", "None", "n/a", "nan", "null"]  # fmt: skip
"""The cells pandas reads as missing in a CSV file: the same cells are missing here."""
TRUE_VALUES: Final = ("True", "TRUE", "true")
FALSE_VALUES: Final = ("False", "FALSE", "false")
"""The cells a CSV column of booleans holds (pandas' spellings), read as True and False."""
HIVE_NULL: Final = "__HIVE_DEFAULT_PARTITION__"
"""The folder value of a missing partition value (Hive's and Spark's)."""
TEXT: Final = pa.dictionary(pa.int32(), pa.string())
"""A hive partition's type: its folder names' text, as Spark reads them with partition type inference off."""
_NUMBER = re.compile(r"\s*([+-]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?|[+-]?inf(?:inity)?)\s*", re.I)
_INTEGER = re.compile(r"\s*[+-]?[0-9]+\s*")
_INSPECTING = 16
"""Files whose schemas are read at once (a footer or a CSV file's first block each: round trips to a bucket)."""


@dataclass(frozen=True)
class Dataset:
    """An opened dataset: where it is, what it holds (``what``: predictions, events, data), its files and format.
    Listing happened in :func:`open_dataset`; nothing is read until :meth:`batches` or :meth:`manifest`."""

    location: str
    what: str
    root: str
    files: tuple[DataFile, ...]
    format: str
    filesystem: Any  # fsspec's, or files.LOCAL
    arrow: ds.Dataset
    ids: tuple[str, ...] = ()
    """Id columns (the keys of ``attribute_sources``): a CSV file's are its text as written (see :func:`_ids`)."""
    file_schemas: tuple[pa.Schema, ...] = ()
    """Each file's own columns in its order (a CSV file's header) and types, as :attr:`files`."""
    problems: Mapping[str, str] = field(default_factory=dict)
    """Why a column cannot be read alike from every file, by column (:func:`_one_table`): :meth:`problem`."""
    private: bool = False
    """Its values never appear in an error (a side table): pyarrow's reasons are told without their cells."""

    @property
    def schema(self) -> pa.Schema:
        return self.arrow.schema

    @property
    def columns(self) -> list[str]:
        return list(self.arrow.schema.names)

    def problem(self, columns: Sequence[str]) -> str | None:
        """Why these columns cannot be read alike from every file (a file lacks one, or gives it a type of another
        kind), every such column in one line naming the files; None when they can."""
        found = [self.problems[c] for c in dict.fromkeys(columns) if c in self.problems]
        return None if not found else (f"{self.location}: {'; '.join(found)}: the files of a dataset are one table, "
                                       "each column read by name, of one kind of value in every file (a blank "
                                       "column and wider numbers aside)")  # fmt: skip

    def batches(self, columns: Sequence[str], batch_rows: int = BATCH_ROWS) -> Iterator[pa.RecordBatch]:
        """The rows in file order, ``batch_rows`` at a time, only ``columns`` (text columns dictionary-encoded), each
        file's columns by name as the dataset's types; DataError when a file lacks one (:meth:`problem`)."""
        problem = self.problem(columns)
        if problem:
            raise DataError(problem)
        ids = [k for k, c in enumerate(columns) if c in self.ids] if self.format == "csv" else []
        try:  # one file at a time, in order, a batch read ahead: memory holds a batch or two whatever the data's size
            for fragment in self.arrow.get_fragments():
                batches = fragment.to_batches(schema=self.arrow.schema, columns=list(columns), batch_size=batch_rows,
                                              batch_readahead=1, fragment_readahead=1, use_threads=True)  # fmt: skip
                yield from (_ids(batch, ids) for batch in batches) if ids else batches
        except (pa.ArrowException, OSError) as exc:
            raise DataError(f"{self.location}: cannot read {self.what}: {_why(exc, self.private)}") from exc

    def manifest(self) -> Manifest:
        """Every file's SHA-256 and the manifest's hash, once the files were counted; DataError for a file that
        changed since it was listed (:func:`exporter.gate.data.files.manifest`)."""
        return manifest(self.location, self.root, self.files, self.filesystem)


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


def _csv_conversion(types: Mapping[str, pa.DataType]) -> Any:
    """How a CSV cell becomes a value: pandas' missing markers and booleans, ``types`` for the columns they name."""
    from pyarrow import csv

    return csv.ConvertOptions(null_values=PANDAS_NULLS, strings_can_be_null=True, column_types=dict(types),
                              true_values=list(TRUE_VALUES), false_values=list(FALSE_VALUES), auto_dict_encode=True)


def _file_format(kind: str, dictionary: Sequence[str], ids: Sequence[str] = (),
                 texts: Sequence[str] = ()) -> ds.FileFormat:  # fmt: skip
    """``dictionary``: parquet text columns read as dictionaries (a column of another type is read as it is)."""
    if kind == "parquet":
        return ds.ParquetFileFormat(read_options=ds.ParquetReadOptions(dictionary_columns=list(dictionary)))
    from pyarrow import csv

    types = {**dict.fromkeys(texts, TEXT), **dict.fromkeys(ids, pa.string())}
    return ds.CsvFileFormat(read_options=csv.ReadOptions(block_size=CSV_BLOCK_BYTES),
                            convert_options=_csv_conversion(types))  # fmt: skip


def csv_values(table: pa.Table, schema: pa.Schema) -> pa.Table:
    """A table of CSV cells as text (another engine's reading: exporter/spark.py) with each column that ``schema``
    types as no text converted as this reader converts a CSV file's cells: the same values for the same cells."""
    from pyarrow import csv

    typed = [c for c in table.column_names if c in schema.names and not _is_text(schema.field(c).type)]
    if not typed or table.num_rows == 0:
        return table
    out = io.BytesIO()
    csv.write_csv(table.select(typed), out)
    converted = csv.read_csv(pa.py_buffer(out.getvalue()), convert_options=_csv_conversion(
        {c: schema.field(c).type for c in typed}))  # fmt: skip
    for name in typed:
        table = table.set_column(table.column_names.index(name), name, converted.column(name))
    return table


def _is_text(kind: pa.DataType) -> bool:
    value = kind.value_type if pa.types.is_dictionary(kind) else kind
    return pa.types.is_string(value) or pa.types.is_large_string(value)


def _why(exc: BaseException, private: bool) -> str:
    return _private_reason(exc) if private else _reason(exc)


def open_dataset(location: str, what: str = "data", dictionary: Sequence[str] = (), ids: Sequence[str] = (),
                 texts: Sequence[str] = (), private: bool = False) -> Dataset:  # fmt: skip
    """List a dataset's files and read their schemas (each parquet footer, or each CSV file's first block): one table
    of them (:func:`_one_table`).

    ``dictionary``: text columns to read as dictionaries (codes and their few distinct values), which is how the
    gate encodes them. ``ids``: id columns, read from CSV as text (:attr:`Dataset.ids`); ``texts``: columns read
    from CSV as their text as written (attribute columns: :func:`written_value`). Raises DataError (one line
    naming the location) when there is nothing to read. ``private``: a side table (:attr:`Dataset.private`)."""
    fs, path = filesystem(location)
    try:
        root, files = listing(fs, path, location, what)
    except DataError:
        raise
    except Exception as exc:  # listing a bucket: credentials, endpoints, permissions
        raise DataError(f"{location}: cannot list {what}: {_reason(exc)}") from exc
    kinds = {file_format(f.path) for f in files}
    if len(kinds) > 1:
        raise DataError(f"{location}: mixes parquet and CSV files; a dataset is one or the other")
    (kind,) = kinds
    assert kind is not None
    names = [join(root, f.path) for f in files]
    keys = [[part.split("=", 1)[0] for part in f.path.split("/")[:-1] if "=" in part] for f in files]
    file_format_ = _file_format(kind, dictionary, ids, texts)
    try:
        plain = ds.dataset(names, filesystem=_arrow_filesystem(fs), format=file_format_)
        fragments = list(plain.get_fragments())
        with ThreadPoolExecutor(_INSPECTING) as pool:
            schemas = [plain.schema, *pool.map(lambda f: f.physical_schema, fragments[1:])]
        schema, problems = _one_table(location, files, schemas, keys)
        partitioned = plain if not any(keys) else ds.dataset(
            names, filesystem=plain.filesystem, format=file_format_, partition_base_dir=root or None,
            partitioning=ds.HivePartitioning.discover(schema=pa.schema([(k, TEXT) for k in dict.fromkeys(
                k for ks in keys for k in ks)]), null_fallback=HIVE_NULL))  # fmt: skip
        arrow = partitioned if len(files) == 1 else ds.FileSystemDataset(
            list(partitioned.get_fragments()), schema, file_format_, plain.filesystem)  # fmt: skip
    except (pa.ArrowException, OSError) as exc:
        raise DataError(f"{location}: cannot read {what}: {_why(exc, private)}") from exc
    return Dataset(location, what, root, files, kind, fs, arrow, tuple(ids), tuple(schemas), problems, private)


def _one_table(location: str, files: Sequence[DataFile], schemas: Sequence[pa.Schema],
               keys: Sequence[Sequence[str]]) -> tuple[pa.Schema, dict[str, str]]:  # fmt: skip
    """The files as one table: every column's type that holds each file's values as that file alone reads them
    (:func:`_widened`), hive partitions as text; and, by column, why one cannot be read alike from every file: a
    file lacks it (read as blanks, its rows would be other models', unknown groups or unlabelled) or gives it a
    type of another kind (a boolean beside integers: cast, 2 would be True). A partition folder naming a column of
    the files is refused here: which of the two is meant cannot be said."""
    types: dict[str, pa.DataType] = {}
    first: dict[str, int] = {}
    problems: dict[str, str] = {}
    held = {name for schema in schemas for name in schema.names}
    for k, (f, schema) in enumerate(zip(files, schemas, strict=True)):
        clash = next((key for key in keys[k] if key in held), None)
        if clash:
            raise DataError(f"{location}: the partition folder {clash}=... of {f.path!r} names a column the files "
                            f"also hold ({clash!r}); rename the folder or drop the column from the files")  # fmt: skip
        for name in schema.names:
            kind = schema.field(name).type
            if name not in types:
                types[name], first[name] = kind, k
                continue
            wider = _widened(types[name], kind)
            if wider is None and name not in problems:
                problems[name] = (f"column {name!r} is {_shown(types[name])} in {files[first[name]].path!r} and "
                                  f"{_shown(kind)} in {f.path!r}")  # fmt: skip
            types[name] = wider or types[name]
    for key in dict.fromkeys(k for ks in keys for k in ks):
        types[key] = TEXT
    for name in types:
        having = {k for k, schema in enumerate(schemas) if name in schema.names or name in keys[k]}
        if len(having) < len(files) and name not in problems:
            lacking = next(k for k in range(len(files)) if k not in having)
            problems[name] = f"{files[lacking].path!r} has no column {name!r}, which {files[min(having)].path!r} has"
    return pa.schema([(name, kind) for name, kind in types.items()]), problems


def _widened(a: pa.DataType, b: pa.DataType) -> pa.DataType | None:
    """The type holding two files' values of a column as each file alone reads them, or None: a blank CSV column
    (null) takes the other's type, integers and floats widen (int32 to int64, int64 to double), text is text; a
    boolean and a number, text and a number, a date and a time are no one type.

    >>> [str(_widened(a, b)) for a, b in ((pa.null(), pa.bool_()), (pa.int64(), pa.float64()),
    ...                                   (pa.bool_(), pa.int64()), (pa.string(), pa.int64()))]
    ['bool', 'double', 'None', 'None']
    """
    if a == b or pa.types.is_null(b):
        return a
    if pa.types.is_null(a):
        return b
    value_a, value_b = (t.value_type if pa.types.is_dictionary(t) else t for t in (a, b))
    try:
        value = pa.unify_schemas([pa.schema([("v", value_a)]), pa.schema([("v", value_b)])],
                                 promote_options="permissive").field("v").type  # fmt: skip
    except (pa.ArrowInvalid, pa.ArrowTypeError):
        return None
    return pa.dictionary(pa.int32(), value) if pa.types.is_dictionary(a) or pa.types.is_dictionary(b) else value


def _shown(kind: pa.DataType) -> str:
    """A type as a user knows it: a dictionary's values' type."""
    return str(kind.value_type if pa.types.is_dictionary(kind) else kind)


def _arrow_filesystem(fs: Any) -> Any:
    """pyarrow's own local filesystem for local paths (the fastest), else the fsspec one behind pyarrow's API."""
    from pyarrow import fs as pafs

    if "file" in fs.protocol or "local" in fs.protocol:
        return pafs.LocalFileSystem()
    return pafs.PyFileSystem(pafs.FSSpecHandler(fs))


def read_batches(location: str, columns: Sequence[str], *, what: str = "data", batch_rows: int = BATCH_ROWS,
                 ids: Sequence[str] = (), private: bool = False) -> Iterator[pa.RecordBatch]:  # fmt: skip
    """The one reading function for a file input: ``columns`` of a dataset (file, folder, glob or prefix; parquet or
    CSV; local or a URL) in record batches (``ids``: id columns, see :attr:`Dataset.ids`; ``private``: see
    :attr:`Dataset.private`). Raises DataError naming the location and the missing columns."""
    dataset = open_dataset(location, what, columns, ids, private=private)
    missing = [c for c in columns if c not in dataset.columns]
    if missing:
        raise DataError(f"{location}: missing column(s) {missing}; the {what} has {dataset.columns}")
    yield from dataset.batches(columns, batch_rows)
