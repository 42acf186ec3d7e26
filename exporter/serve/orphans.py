"""The HTTP worker process dies with its daemon, and a daemon takes its port back from a worker that did not.

The worker asks Linux for a parent-death signal (``prctl(PR_SET_PDEATHSIG, SIGKILL)``, through ctypes): when the
daemon dies, even by SIGKILL, the kernel kills the worker at once, so a daemon restarted within a second finds its
port free (before, the worker saw the end of its pipe and shut its server down, which left the port held for up to
two seconds: a restart then exited 2, "already in use"). The pipe's end of file stays the way out elsewhere.

A worker left over anyway (another platform, a worker of an older version) is an *orphan*: its command line names
the daemon that started it (process id and config file), and that daemon is gone or no longer its parent. A
daemon of the same config whose port is in use kills such an orphan if it holds the port's listening socket, and
binds again (:func:`take_back`); a port held by anything else stays refused in one line.

Linux only (``/proc``); elsewhere a port in use is refused as before. Imports neither numpy nor pandas.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import logging
import os
import signal
import sys
import time
from pathlib import Path
from typing import Final

log = logging.getLogger(__name__)
PR_SET_PDEATHSIG: Final = 1
WORKER_MODULE: Final = "exporter.serve.worker"
GONE_SECONDS: Final = 5.0
"""How long :func:`take_back` waits for a killed orphan to release the port."""
PROC = Path("/proc")


def die_with_parent() -> bool:
    """Have the kernel SIGKILL this process when its parent dies; False where that cannot be asked (not Linux)."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        return libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def alive(pid: int) -> bool:
    """Whether a process with this id exists (a zombie counts as dead: its daemon is gone)."""
    try:
        state = (PROC / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


def _parent(pid: int) -> int | None:
    try:
        return int((PROC / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return None


def _listening_inodes(port: int) -> set[str]:
    """The inodes of the TCP sockets listening on the port (IPv4 and IPv6)."""
    inodes = set()
    for table in ("tcp", "tcp6"):
        try:
            lines = (PROC / "net" / table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if len(fields) > 9 and fields[3] == "0A" and int(fields[1].rsplit(":", 1)[1], 16) == port:
                inodes.add(fields[9])
    return inodes


def _holds(pid: int, inodes: set[str]) -> bool:
    """Whether the process has one of these sockets open."""
    wanted = {f"socket:[{inode}]" for inode in inodes}
    try:
        fds = os.listdir(PROC / str(pid) / "fd")
    except OSError:
        return False
    for fd in fds:
        with contextlib.suppress(OSError):
            if os.readlink(PROC / str(pid) / "fd" / fd) in wanted:
                return True
    return False


def orphans(port: int, owner: str) -> list[int]:
    """Worker processes of a dead daemon of this config (``owner``) that hold the port's listening socket."""
    inodes = _listening_inodes(port)
    if not inodes or not PROC.is_dir():
        return []
    found = []
    for entry in PROC.iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().decode(errors="replace").split("\0")
        except OSError:
            continue
        if WORKER_MODULE not in argv:
            continue
        args = argv[argv.index(WORKER_MODULE) + 1:]
        if len(args) < 4 or args[3] != owner or not args[2].isdigit():
            continue
        pid, daemon = int(entry.name), int(args[2])
        if (not alive(daemon) or _parent(pid) != daemon) and _holds(pid, inodes):
            found.append(pid)
    return found


def take_back(port: int, owner: str) -> bool:
    """Kill the orphaned workers of this config that hold the port, and wait until the listening sockets they held
    are gone (not merely the process: its main thread is a zombie while its other threads still hold its files);
    whether there was one and its sockets are gone now."""
    held = _listening_inodes(port)
    found = orphans(port, owner)
    for pid in found:
        log.warning("port %d is held by an HTTP worker (process %d) of a dead daemon of this config: taking it back",
                    port, pid)  # fmt: skip
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + GONE_SECONDS
    while found and time.monotonic() < deadline:
        if not _listening_inodes(port) & held:
            return True
        time.sleep(0.05)
    return False
