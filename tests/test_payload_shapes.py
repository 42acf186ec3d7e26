"""Tensor shapes at the edges of what a count holds, read alike by the one-pass readers
(exporter/stream/payloads/seldon_batch.py, kserve_batch.py) and record by record (exporter/stream/payloads/platforms.py
through ``read_halves``), each ending in a half or a refusal. Found by review9; each test failed before its fix."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from exporter.stream.payloads import seldon_batch
from exporter.stream.payloads.oip import messages
from exporter.stream.payloads.payload import Halves, Raw, read_halves

ROOT = Path(__file__).resolve().parent.parent
TOPIC = "seldon.ns.model.m.inputs"


def _record_by_record(records: list[Raw]) -> Halves:
    """``read_halves`` with the one-pass reader switched off (as tests/test_payload_batch.py compares them)."""
    saved = seldon_batch.halves
    seldon_batch.halves = lambda *_: None  # type: ignore[assignment]
    try:
        return read_halves("seldon", TOPIC, records, {"m"})
    finally:
        seldon_batch.halves = saved


def _request(shape: list[int], values: list[int]) -> bytes:
    request_type, _, _ = messages()
    request = request_type(id="own")
    request.inputs.add(name="x", datatype="INT64", shape=shape).contents.int64_contents.extend(values)
    return request.SerializeToString()  # type: ignore[no-any-return]


@pytest.mark.parametrize("shape", [[2**62, 2], [2**63 - 1, 2], [2**52, 4096]])
def test_a_shape_whose_value_count_passes_int64_is_refused_in_one_pass_as_record_by_record(shape: list[int]) -> None:
    """One record of a usual 128-record Seldon poll claims rows * columns >= 2**63 values (each dimension a valid
    int64, the columns within _MOST_COLUMNS) and carries two. Record by record it is refused (``shape_mismatch``,
    oip._split) and the other 127 are read. The one-pass reader raised OverflowError (the count went into an int64
    array before any count was compared), stopping the poll; a count past what a poll's bytes hold now leaves the
    poll to the record-by-record path."""
    good, bad = _request([1, 2], [1, 2]), _request(shape, [1, 2])
    poll: list[Raw] = [(bad if i == 5 else good, [("x-request-id", f"r{i}".encode())], None, 1_800_000_000_000 + i)
                       for i in range(128)]  # fmt: skip
    alone = _record_by_record(poll)
    assert len(alone.halves) == 127 and [(reason, pid) for _, reason, _, pid in alone.rejected] == [
        ("shape_mismatch", "r5")]  # fmt: skip
    read = read_halves("seldon", TOPIC, poll, {"m"})
    assert repr(read.halves) == repr(alone.halves)
    assert read.rejected == alone.rejected and read.at == alone.at


_CLAIM = """
import resource, sys
sys.path.insert(0, {root!r}); sys.path.insert(0, {tests!r})
import orjson
from payload_logs import cloudevent
from exporter.stream.payloads.oip import BadPayload, messages
from exporter.stream.payloads.payload import read_halves
from exporter.stream.payloads.platforms import seldon_half

request_type, _, _ = messages()
request = request_type(id="own")
request.inputs.add(name="x", datatype="INT64", shape=[0, 10**12])
seldon = request.SerializeToString()
kserve = [(*cloudevent("credit", f"c{{i}}", False, orjson.dumps({{"inputs": [{{"name": "x", "shape": [0, 10**12],
          "datatype": "INT64", "data": []}}]}}), 1_796_000_000.0), 1_800_000_000_000) for i in range(16)]
size = int(next(line for line in open("/proc/self/status") if line.startswith("VmSize")).split()[1]) * 1024
resource.setrlimit(resource.RLIMIT_AS, (size + (256 << 20),) * 2)  # 256 MiB more than the imports took
for name, read in (("seldon", lambda: seldon_half(seldon, {{"x-request-id": b"r"}}, None, "seldon.ns.model.m.inputs",
                                                   1000)),
                   ("kserve", lambda: read_halves("kserve", "kserve", kserve, {{"credit"}}))):
    try:
        found = read()
        print(name, "read", *sorted({{reason for _, reason, *_ in found.rejected}}) if name == "kserve" else [])
    except BadPayload as exc:
        print(name, "refused", exc.reason)
    except MemoryError:
        print(name, "MemoryError")
"""


def test_a_zero_row_tensor_claiming_a_trillion_columns_is_refused_without_naming_them() -> None:
    """A tensor of shape [0, 10**12] holds no value, so ``rows * width == len(values)`` holds (0 == 0), and
    oip._split named its 10**12 empty columns one by one: the record took all the memory there was (MemoryError
    within a 256 MiB allowance; unbounded in the daemon), on both Seldon's and KServe's paths. A tensor of no rows
    now names at most oip.MOST_EMPTY_COLUMNS columns: past that it is a shape_mismatch."""
    script = _CLAIM.format(root=str(ROOT), tests=str(ROOT / "tests"))
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(script)], capture_output=True, text=True,
                          timeout=50, cwd=ROOT)  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split("\n")[:2] == ["seldon refused shape_mismatch", "kserve read shape_mismatch"], done.stdout
