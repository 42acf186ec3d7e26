"""A run's report files (``--report``, ``--junit``, ``--summary-md``, ``--impact-ratios-csv``, ``--html``): all
written before the run's audit-log record, each atomically, and none left behind by a run that was not logged.

The gate renders and writes every file while it holds the log's lock with the head its record will have (the
reports name it), then appends the record: a file that cannot be written (a folder at its path, a full disk, a
read-only mount) stops the run before anything is logged, and the files it had already written are removed, so no
report claims a record that is not in the log.
"""

from __future__ import annotations

import os
import secrets
from collections.abc import Callable
from pathlib import Path


class ReportWriteError(Exception):
    """A report file that could not be written (or rendered); the message names its flag, its path and why.

    Not an OSError: the audit log's append, which runs the writes under its lock, must not take it for its own."""


def _staged(flag: str, path: Path, text: str) -> Path:
    """``text`` (UTF-8) in a new temporary file beside ``path`` (its folder made as needed), synced to disk."""
    temporary = path.with_name(f".{path.name}.{secrets.token_hex(4)}.tmp")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)  # the umask applies, as to any file
        with os.fdopen(fd, "wb") as f:
            f.write(text.encode())
            f.flush()
            os.fsync(f.fileno())
    except OSError as exc:
        temporary.unlink(missing_ok=True)
        raise ReportWriteError(f"{flag} {path}: {exc.strerror or exc}") from exc
    return temporary


class RunReports:
    """The report files of one run: each a flag, a path (None: not asked for) and how to render it."""

    def __init__(self) -> None:
        self._files: list[tuple[str, Path, Callable[[], str]]] = []
        self.written: list[Path] = []

    def add(self, flag: str, path: str | None, render: Callable[[], str]) -> None:
        """Write ``render()`` to ``path`` when :meth:`write` runs, if a path was given."""
        if path:
            self._files.append((flag, Path(path), render))

    def write(self) -> None:
        """Render every file into a temporary file beside it, then rename each over its path: a file never exists
        half written. On a failure no temporary file stays, the files renamed already are removed (the earlier
        files at those paths are then gone too: only a rename, after every file was rendered and written, can fail
        so late, e.g. a folder at the path) and ReportWriteError is raised."""
        staged: list[tuple[str, Path, Path]] = []
        try:
            for flag, path, render in self._files:
                try:
                    text = render()
                except ImportError as exc:  # the HTML reports need matplotlib (the `reports` extra)
                    raise ReportWriteError(f"{flag} {path}: {exc}") from exc
                staged.append((flag, path, _staged(flag, path, text)))
            for flag, path, temporary in staged:
                try:
                    os.replace(temporary, path)
                except OSError as exc:
                    raise ReportWriteError(f"{flag} {path}: {exc.strerror or exc}") from exc
                self.written.append(path)
        except ReportWriteError:
            for _, _, temporary in staged:
                temporary.unlink(missing_ok=True)
            self.remove()
            raise

    def remove(self) -> None:
        """Remove the files written (the run they report was not logged)."""
        for path in self.written:
            path.unlink(missing_ok=True)
        self.written.clear()
