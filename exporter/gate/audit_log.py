"""An append-only, hash-chained JSON-lines log of audit runs: editing, reordering or deleting a record breaks
the chain, and :func:`verify` says where.

Each record holds ``seq``, ``prev_hash`` (the previous record's ``hash``; 64 zeros for the first) and ``hash``,
the SHA-256 of the record's canonical JSON without ``hash``. Deleting records from the end leaves a valid shorter
chain, so every append returns the new head (seq, hash) for the caller to publish (the gate prints it in its
report and CI keeps it); ``verify(..., expect_head=...)`` then detects truncation too.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

GENESIS = "0" * 64


def _canonical(record: dict[str, Any]) -> bytes:
    return json.dumps(record, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


def record_hash(record: dict[str, Any]) -> str:
    """SHA-256 of the record without its own ``hash`` field."""
    return hashlib.sha256(_canonical({k: v for k, v in record.items() if k != "hash"})).hexdigest()


@dataclass(frozen=True)
class Head:
    """The last record of a log: publish it to detect truncation later."""

    seq: int
    hash: str


def _last_record(f: Any) -> dict[str, Any] | None:
    f.seek(0)
    last = None
    for line in f:
        if line.strip():
            last = line
    return json.loads(last) if last else None


def append(path: str | Path, entry: dict[str, Any]) -> Head:
    """Append one entry under an exclusive lock (concurrent CI jobs may share a log) and return the new head."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a+", encoding="utf-8") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            last = _last_record(f)
            record = {**entry, "seq": last["seq"] + 1 if last else 0,
                      "prev_hash": last["hash"] if last else GENESIS}  # fmt: skip
            record["hash"] = record_hash(record)
            f.seek(0, 2)
            f.write(json.dumps(record, sort_keys=True, ensure_ascii=False) + "\n")
            f.flush()
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)
    return Head(record["seq"], record["hash"])


def verify(path: str | Path, expect_head: str | None = None) -> tuple[int, list[str]]:
    """Check the whole chain; return (number of records, problems found). No problems means intact."""
    problems: list[str] = []
    prev, count, expected_seq = GENESIS, 0, 0
    with Path(path).open(encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            count += 1
            try:
                record = json.loads(line)
            except json.JSONDecodeError as exc:
                problems.append(f"line {lineno}: not valid JSON ({exc.msg})")
                continue
            if record.get("seq") != expected_seq:
                problems.append(f"line {lineno}: seq {record.get('seq')} where {expected_seq} was expected "
                                "(a record was deleted or reordered)")  # fmt: skip
            if record.get("prev_hash") != prev:
                problems.append(f"line {lineno}: prev_hash does not match the previous record's hash "
                                "(a record before it was changed, deleted or reordered)")  # fmt: skip
            if record.get("hash") != record_hash(record):
                problems.append(f"line {lineno}: hash does not match the record's content (the record was edited)")
            prev = record.get("hash", "")
            expected_seq = (record.get("seq") if isinstance(record.get("seq"), int) else expected_seq) + 1
    if expect_head is not None and prev != expect_head:
        problems.append(f"the last record's hash is {prev}, expected head {expect_head} "
                        "(records were removed from the end or the log was replaced)")  # fmt: skip
    return count, problems
