"""An append-only, hash-chained JSON-lines log of audit runs: editing, reordering or deleting a record breaks
the chain, and :func:`verify` says where.

Each record holds ``seq``, ``prev_hash`` (the previous record's ``hash``; 64 zeros for the first) and ``hash``.
Two modes, chosen by whether a key is given (the CLI reads it from ``FAIRNESS_AUDIT_LOG_KEY``):

- plain: ``hash`` is the SHA-256 of the record's canonical JSON without ``hash``. It detects an edit, a deletion
  or a reordering by anyone who does not recompute the chain; whoever can write the file can also rewrite a
  record and recompute every later hash. Deleting records from the end leaves a valid shorter chain too. Every
  append returns the new head (seq, hash) for the caller to publish (the gate prints it, CI keeps it), and
  ``verify(..., expect_head=...)`` then detects both.
- keyed: ``hash`` is an HMAC-SHA256 of the same bytes under a secret key and ``chain`` is ``"hmac-sha256"``.
  Without the key nobody can write a record that verifies, so any rewrite, recomputed or not, is detected; only
  truncation at the end still needs ``expect_head``. A keyed verification refuses plain records.

Both hash the parsed record; :func:`verify` also requires each line to be exactly the bytes the writer writes
for it (``json.dumps(record, sort_keys=True, ensure_ascii=False)``), since a key written twice (JSON parsers keep
the last, a reader and grep see the first), reordered keys or changed spacing leave the parsed record and its hash
as they were.

A crash mid-write leaves a torn last line (a record without its newline). The next append does not fail on it:
it ends the torn line, then appends a ``torn_record`` record naming the line, its length and its SHA-256, chained
to the last whole record, then the new entry. :func:`verify` accepts a torn line only with such a record after it.
A crash of that next append leaves a second torn line, the start of the ``torn_record`` it was writing; the append
after it records every torn line not yet recorded, oldest first. :func:`verify` accepts a torn line that follows
an unrecorded one only when it is the start of the ``torn_record`` for the oldest (the bytes are fixed by the
chain), so no more than the last whole record can be passed off as a crash, as before (``expect_head`` shows it).
"""

from __future__ import annotations

import errno
import fcntl
import hashlib
import hmac
import json
import os
import stat
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, Final

GENESIS: Final = "0" * 64
KEYED: Final = "hmac-sha256"
KEY_ENV: Final = "FAIRNESS_AUDIT_LOG_KEY"
MAX_NESTING: Final = 128
"""The gate's records nest under 10 levels; a line nested past this one is damage, not a record."""


def key_from_env() -> bytes | None:
    """The HMAC key from ``$FAIRNESS_AUDIT_LOG_KEY``, or None (a plain chain)."""
    key = os.environ.get(KEY_ENV)
    return key.encode() if key else None


class AuditLogError(ValueError):
    """The audit log cannot be appended to; the message names the file and why."""


def _canonical(record: dict[str, Any]) -> bytes:
    return json.dumps(record, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


def record_hash(record: dict[str, Any], key: bytes | None = None) -> str:
    """SHA-256 (or, with a key, HMAC-SHA256) of the record without its own ``hash`` field."""
    content = _canonical({k: v for k, v in record.items() if k != "hash"})
    return hmac.new(key, content, hashlib.sha256).hexdigest() if key else hashlib.sha256(content).hexdigest()


@dataclass(frozen=True)
class Head:
    """The last record of a log: publish it to detect truncation later."""

    seq: int
    hash: str
    recovered: tuple[str, ...] = ()
    """What the append recovered from before writing (a torn last line), to tell the user."""


@dataclass(frozen=True)
class _Torn:
    """A line that is not a record: the torn end of a crashed write when no whole record but its ``torn_record``
    follows it."""

    line: int
    text: bytes
    why: str

    def facts(self) -> dict[str, Any]:
        return {"line": self.line, "bytes": len(self.text), "sha256": hashlib.sha256(self.text).hexdigest()}

    def recorded_by(self, record: dict[str, Any]) -> bool:
        return record.get("type") == "torn_record" and {k: record.get(k) for k in self.facts()} == self.facts()

    def record(self, last: dict[str, Any] | None, key: bytes | None) -> dict[str, Any]:
        """The ``torn_record`` for this line after ``last``: every append writes these same bytes for it."""
        return _chained({"type": "torn_record", **self.facts()}, last, key)


def _nesting(value: Any) -> int:
    """How deep lists and objects nest in a parsed line, counted a level at a time (no recursion to run out of)."""
    depth, level = 0, [value]
    while level := [v for c in level if isinstance(c, dict | list) for v in (c.values() if isinstance(c, dict) else c)]:
        depth += 1
    return depth


def _parse(lineno: int, line: bytes) -> dict[str, Any] | _Torn:
    text = line.removesuffix(b"\n")
    try:
        record = json.loads(line)
    except UnicodeDecodeError as exc:  # a write cut inside a character of several bytes (records are UTF-8)
        return _Torn(lineno, text, f"not UTF-8: {exc.reason} at byte {exc.start}")
    except json.JSONDecodeError as exc:  # exc.msg alone ends "... at" with no place; exc.pos counts characters
        return _Torn(lineno, text, f"{exc.msg.removesuffix(' at')} at byte {len(exc.doc[:exc.pos].encode())}")
    except (ValueError, RecursionError) as exc:  # JSON past what Python reads (an int of 4,300+ digits, nesting
        return _Torn(lineno, text, f"JSON Python cannot read: {exc}")  # near 1,000 levels): damage like any other
    if not isinstance(record, dict):
        return _Torn(lineno, text, f"{type(record).__name__}, not a record")
    if _nesting(record) > MAX_NESTING:  # loads takes a few levels more than dumps, which hashing and list need
        return _Torn(lineno, text, f"nested deeper than {MAX_NESTING} levels, not a record the gate writes")
    return record


def _open(path: Path, mode: str) -> IO[bytes]:
    """Open a log only when it is a regular file: a device or a pipe holds no chain (/dev/zero reads as one endless
    line, a read of it never ends), and a FIFO's ordinary open waits for a writer before anything can be checked.
    So open without blocking, check, then hand over a blocking file; ``mode`` is ``"rb"`` or ``"a+b"``."""
    flags = os.O_RDONLY if mode == "rb" else os.O_RDWR | os.O_APPEND | os.O_CREAT
    fd = os.open(path, flags | os.O_NONBLOCK, 0o666)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(errno.EINVAL, "not a regular file (an audit log is a file of its own)")
        os.set_blocking(fd, True)
        return os.fdopen(fd, mode)
    except BaseException:
        os.close(fd)
        raise


def _tail(f: IO[bytes]) -> tuple[dict[str, Any] | None, list[_Torn]]:
    """The last whole record, and the torn lines not yet recorded, oldest first (crashes in a row leave several:
    one cut short while recording another). A whole record that does not record the oldest ends them all: they
    were edits, which :func:`verify` reports, and the chain goes on from the record."""
    f.seek(0)
    last: dict[str, Any] | None = None
    torn: list[_Torn] = []
    for lineno, line in enumerate(f, 1):
        if line.strip():
            parsed = _parse(lineno, line)
            if isinstance(parsed, _Torn):
                torn.append(parsed)
            else:
                last, torn = parsed, torn[1:] if torn and torn[0].recorded_by(parsed) else []
    return last, torn


def _chained(entry: dict[str, Any], last: dict[str, Any] | None, key: bytes | None) -> dict[str, Any]:
    """The record that follows ``last``: the entry with its seq, prev_hash, chain and hash."""
    seq = last.get("seq") if last else None  # an edited last record restarts the count; verify reports it
    record = {**entry, "seq": seq + 1 if isinstance(seq, int) else 0,
              "prev_hash": str(last.get("hash")) if last else GENESIS}  # fmt: skip
    if key:
        record["chain"] = KEYED
    record["hash"] = record_hash(record, key)
    return record


def _line(record: dict[str, Any]) -> bytes:
    """A record as the log holds it: one line, the only bytes :func:`verify` accepts for it."""
    return json.dumps(record, sort_keys=True, ensure_ascii=False).encode()


def _edited_bytes(lineno: int, line: bytes, record: dict[str, Any]) -> str | None:
    """Why a line is not the bytes the writer wrote for the record it parses to, or None. The hash covers what a
    JSON parser returns; a key written twice (a parser keeps the last, grep and a reader see the first), reordered
    keys or changed spacing leave that intact, and only the bytes show them."""
    if line.removesuffix(b"\n") == _line(record):
        return None
    repeated: list[str] = []

    def pairs(items: list[tuple[str, Any]]) -> dict[str, Any]:
        keys = [k for k, _ in items]
        repeated.extend(dict.fromkeys(k for k in keys if keys.count(k) > 1))
        return dict(items)

    json.loads(line, object_pairs_hook=pairs)
    if repeated:
        return (f"line {lineno}: key {', '.join(map(repr, repeated))} written twice (the record was edited: a "
                "parser reads the last value, grep and a reader the first)")  # fmt: skip
    return f"line {lineno}: not the bytes the gate writes for its record (keys reordered or respaced: it was edited)"


def append(path: str | Path, entry: dict[str, Any], key: bytes | None = None,
           before: Callable[[Head], None] | None = None) -> Head:  # fmt: skip
    """Append one entry under an exclusive lock (concurrent CI jobs may share a log) and return the new head.
    ``before`` runs under the lock with that head before anything is written (the gate writes its reports, which
    name the head, there); what it raises is raised with nothing appended. The record's bytes are fixed first."""
    path = Path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with _open(path, "a+b") as f:
            fcntl.flock(f, fcntl.LOCK_EX)
            try:
                last, torn = _tail(f)
                # a write cut before its newline: a torn line, kept as evidence (the chain skips it), or a whole
                # record, which the chain continues from; either way the new records start a line
                lines = [b""] if f.seek(0, 2) and (f.seek(-1, 2), f.read(1))[1] != b"\n" else []
                recovered: list[str] = []
                for t in torn:
                    last = t.record(last, key)
                    lines.append(_line(last))
                    recovered.append(f"line {t.line} was torn ({len(t.text)} bytes, not a record: a write cut short); "
                                     f"recorded as record {last['seq']}, the chain continues from it")
                record = _chained(entry, last, key)
                head = Head(record["seq"], record["hash"], tuple(recovered))
                data = b"\n".join([*lines, _line(record)])
                if before is not None:
                    before(head)
                f.write(data + b"\n")
                f.flush()
            finally:
                fcntl.flock(f, fcntl.LOCK_UN)
    except OSError as exc:
        raise AuditLogError(f"{path}: {exc.strerror or exc}") from exc  # some OSErrors carry no strerror
    return head


@dataclass
class Verification:
    """What :func:`verify` found: whole records, problems (the log was changed) and notes (recovered crashes)."""

    records: int = 0
    problems: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    keyed: bool = False


def verify(path: str | Path, expect_head: str | None = None, key: bytes | None = None,
           expect_records: Collection[str] = ()) -> Verification:  # fmt: skip
    """Check the whole chain (every HMAC too when a key is given); no problems means intact. ``expect_head``: the
    last record's hash; ``expect_records``: hashes earlier runs published, each still a record of the chain (the
    end removed and new records appended since leaves the last head intact, not the removed runs' heads)."""
    result = Verification(keyed=key is not None)
    seen: set[str] = set()
    prev, expected_seq = GENESIS, 0
    last: dict[str, Any] | None = None
    torn: list[_Torn] = []  # not yet recorded, oldest first
    with _open(Path(path), "rb") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            record = _parse(lineno, line)
            if isinstance(record, _Torn):
                # after an unrecorded torn line, a crash can only leave the start of the torn_record being written
                if torn and not _line(torn[0].record(last, key)).startswith(record.text):
                    result.problems.append(f"line {lineno}: not a record ({record.why}) and not the start of the "
                                           f"torn_record for line {torn[0].line} that a crashed run was writing "
                                           "(a record was edited)")  # fmt: skip
                torn.append(record)
                continue
            result.records += 1
            if torn and torn[0].recorded_by(record):
                result.notes.append(f"line {torn[0].line}: torn record ({len(torn[0].text)} bytes, a write cut "
                                    f"short), recorded by record {record.get('seq')} on line {lineno}")  # fmt: skip
                torn.pop(0)
            else:
                result.problems.extend(f"line {t.line}: not a record ({t.why}) and not a recorded torn write (a "
                                       "record was edited)" for t in torn)  # fmt: skip
                torn = []
            if edited := _edited_bytes(lineno, line, record):
                result.problems.append(edited)
            _check(record, lineno, prev, expected_seq, key, result.problems)
            last, prev = record, record.get("hash", "")
            seen.add(str(prev))
            seq = record.get("seq")
            expected_seq = (seq if isinstance(seq, int) else expected_seq) + 1
    result.problems.extend(f"line {t.line}: torn: its {len(t.text)} bytes are not a record ({t.why}), a write cut "
                           "short by a crash; the next audit records it and continues the chain" for t in torn)
    if expect_head is not None and prev != expect_head:
        result.problems.append(f"the last record's hash is {prev}, expected head {expect_head} "
                               "(records were removed from the end or the log was replaced)")  # fmt: skip
    for missing in [h for h in dict.fromkeys(expect_records) if h not in seen]:
        result.problems.append(f"no record has the published hash {missing} (records were removed, later ones "
                               "appended after them, or the log was replaced)")  # fmt: skip
    return result


def _check(record: dict[str, Any], lineno: int, prev: str, expected_seq: int, key: bytes | None,
           problems: list[str]) -> None:  # fmt: skip
    if record.get("seq") != expected_seq:
        problems.append(f"line {lineno}: seq {record.get('seq')} where {expected_seq} was expected "
                        "(a record was deleted or reordered)")  # fmt: skip
    if record.get("prev_hash") != prev:
        problems.append(f"line {lineno}: prev_hash does not match the previous record's hash "
                        "(a record before it was changed, deleted or reordered)")  # fmt: skip
    keyed = record.get("chain") == KEYED
    if keyed and key is None:
        problems.append(f"line {lineno}: the record is keyed ({KEYED}); set {KEY_ENV} to verify it")
    elif key is not None and not keyed:
        problems.append(f"line {lineno}: the record is not keyed (written without {KEY_ENV}, or rewritten by "
                        "someone without the key)")  # fmt: skip
    elif not hmac.compare_digest(str(record.get("hash")), record_hash(record, key)):
        problems.append(f"line {lineno}: hash does not match the record's content (the record was edited"
                        f"{' or written without the key' if key else ''})")  # fmt: skip


def records(path: str | Path) -> list[dict[str, Any]]:
    """Every whole record of a log, in order (a torn line is skipped: :func:`verify` reports it)."""
    with _open(Path(path), "rb") as f:
        return [r for n, line in enumerate(f, 1) if line.strip() and isinstance(r := _parse(n, line), dict)]


def select(entries: list[dict[str, Any]], model_id: str | None = None, model_version: str | None = None,
           kind: str | None = None) -> list[dict[str, Any]]:  # fmt: skip
    """The records of one model, version and type (None: any). Records written before versions were recorded
    have no ``model_version`` and match no version."""
    return [r for r in entries
            if (model_id is None or r.get("model_id") == model_id)
            and (model_version is None or r.get("model_version") == model_version)
            and (kind is None or r.get("type") == kind)]  # fmt: skip
