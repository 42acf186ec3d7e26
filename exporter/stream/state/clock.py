"""The daemon's clock: wall-clock time that does not jump.

The windows' head, the bound on events from the future and the label horizon read the clock. A wall clock stepped
back (a wrong NTP source, a virtual machine restored from a snapshot) made every event look ahead of it, and be
rejected as ``future_timestamp``; one stepped forward moved the head, emptied the windows and, once set right,
made every event late. :class:`SteadyClock` follows ``time.time()`` while it keeps pace with ``CLOCK_BOOTTIME``
(which counts suspended time and is never stepped); a step of more than :data:`JUMP_SECONDS` is logged, counted
(``fairness_exporter_clock_jumps_total``) and not followed, unless the wall clock keeps its new offset for
:data:`TRUST_SECONDS`: then the step is taken for a correction (a clock set right) and followed.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Final

log = logging.getLogger(__name__)

JUMP_SECONDS: Final = 2.0
"""A step of the wall clock larger than this is a jump (NTP slews smaller offsets and steps larger ones)."""
TRUST_SECONDS: Final = 600.0
"""How long a jumped wall clock must keep its new offset before it is believed."""


def _boottime() -> float:
    return time.clock_gettime(time.CLOCK_BOOTTIME) if hasattr(time, "CLOCK_BOOTTIME") else time.monotonic()


class SteadyClock:
    """Seconds since the epoch, as ``time.time()`` but for its jumps; ``on_jump(seconds)`` hears each one."""

    def __init__(self, on_jump: Callable[[float], None] = lambda _: None,
                 wall: Callable[[], float] | None = None, steady: Callable[[], float] = _boottime) -> None:  # fmt: skip
        self.on_jump = on_jump
        self._wall, self._steady = wall or (lambda: time.time()), steady
        self._offset = self._wall() - steady()
        self._jumped_at: float | None = None  # steady time of the jump not followed
        self._jumped_offset = 0.0  # the wall clock's offset since that jump
        self._lock = threading.Lock()

    def __call__(self) -> float:
        with self._lock:
            steady, wall = self._steady(), self._wall()
            expected = steady + self._offset
            if abs(wall - expected) <= JUMP_SECONDS:
                self._offset, self._jumped_at = wall - steady, None  # in step (small adjustments followed)
                return wall
            if self._jumped_at is None or abs(wall - steady - self._jumped_offset) > JUMP_SECONDS:
                self._jumped_at, self._jumped_offset = steady, wall - steady
                log.warning("the wall clock jumped by %+.0f s; keeping time by the steady clock (%d s after the "
                            "jump, a wall clock still that far off is taken for a correction)", wall - expected,
                            TRUST_SECONDS)  # fmt: skip
                self.on_jump(wall - expected)
            elif steady - self._jumped_at >= TRUST_SECONDS:
                log.warning("the wall clock kept its jump of %+.0f s for %d s: following it", wall - expected,
                            TRUST_SECONDS)  # fmt: skip
                self._offset, self._jumped_at = wall - steady, None
                return wall
            return expected
