"""Bounded-rate logging: a fault that repeats on every record must not flood the log."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable


class RateLimitedLog:
    """Log at most ``per_minute`` messages per key per minute, then a count of what was suppressed."""

    def __init__(self, logger: logging.Logger, per_minute: int = 10) -> None:
        self.logger = logger
        self.per_minute = per_minute
        self._window: dict[str, tuple[float, int]] = {}

    def warning(self, key: str, message: str, *args: object) -> None:
        now = time.monotonic()
        start, count = self._window.get(key, (now, 0))
        if now - start >= 60:
            if count > self.per_minute:
                self.logger.warning("%s: %d more messages suppressed in the last minute", key,
                                    count - self.per_minute)  # fmt: skip
            start, count = now, 0
        self._window[key] = (start, count + 1)
        if count < self.per_minute:
            self.logger.warning(message, *args)

    def reasons(self, counts: Iterable[tuple[str, int]], context: str) -> None:
        """Log a batch's rejections, one line per reason."""
        for reason, n in counts:
            self.warning(reason, "rejected %d event(s) in %s: %s", n, context, reason)
