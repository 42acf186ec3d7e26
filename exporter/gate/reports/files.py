"""A run's report files (``--report``, ``--junit``, ``--summary-md``, ``--impact-ratios-csv``, ``--html``): all
written before the run's audit-log record, each atomically, and none left behind by a run that was not logged.

The gate renders and writes every file while it holds the log's lock with the head its record will have (the
reports name it), then appends the record: a file that cannot be written (a folder at its path, a full disk, a
read-only mount) stops the run before anything is logged, and the files it had already written are taken back: the
file an earlier run left at a path is put back (each is kept, hard-linked under a hidden name, until the run is
logged), a path that held none is left empty; so no report claims a record that is not in the log, and no earlier
report is lost to a run that was not logged.
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
        self._earlier: dict[Path, Path | None] = {}
        """Each written path's earlier file, hard-linked under a hidden name (None: the path held no file)."""

    def add(self, flag: str, path: str | None, render: Callable[[], str]) -> None:
        """Write ``render()`` to ``path`` when :meth:`write` runs, if a path was given."""
        if path:
            self._files.append((flag, Path(path), render))

    def write(self) -> None:
        """Render every file into a temporary file beside it, then rename each over its path: a file never exists
        half written. The file each replaces is kept until :meth:`done` (or put back by :meth:`remove`). On a
        failure no temporary file stays, the paths written already get their earlier files back, and
        ReportWriteError is raised."""
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
                    earlier = _kept(path)
                    os.replace(temporary, path)
                except OSError as exc:
                    raise ReportWriteError(f"{flag} {path}: {exc.strerror or exc}") from exc
                self._earlier[path] = earlier
                self.written.append(path)
        except ReportWriteError:
            for _, _, temporary in staged:
                temporary.unlink(missing_ok=True)
            self.remove()
            raise

    def remove(self) -> None:
        """Take back the files written (the run they report was not logged): each path gets the file an earlier run
        left there, or none."""
        for path in reversed(self.written):
            earlier = self._earlier.pop(path, None)
            if earlier is not None:
                os.replace(earlier, path)
            else:
                path.unlink(missing_ok=True)
        self.written.clear()

    def done(self) -> None:
        """The run is logged: the earlier files the reports replaced are let go."""
        for earlier in self._earlier.values():
            if earlier is not None:
                earlier.unlink(missing_ok=True)
        self._earlier.clear()


def _kept(path: Path) -> Path | None:
    """The regular file at ``path``, hard-linked under a hidden name beside it (None: no such file). A link costs
    no copy and leaves ``path`` in place until the rename over it."""
    if not path.is_file() or path.is_symlink():
        return None
    kept = path.with_name(f".{path.name}.{secrets.token_hex(4)}.earlier")
    os.link(path, kept)
    return kept
