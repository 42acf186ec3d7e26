"""Each request's access, under the web configuration (exporter.serve.web_config), and what was refused.

The HTTP worker asks its :class:`Guard` for the TLS context of each new connection and for the :class:`Access`
of each request. A refusal is a 401 (a failed handshake, for a certificate the handshake verifies) and is
counted by reason; the daemon exports the counts as ``fairness_exporter_http_auth_failures_total{reason}``.

bcrypt is slow on purpose (about 0.1 s at cost 10): a verified user, password and hash are kept (as
exporter-toolkit does), so a scrape pays it once, and checks run one at a time outside the GIL, so a flood of
wrong passwords takes at most one core and never holds up a cached scraper or an excluded probe.

Imports neither numpy nor pandas: the HTTP worker process loads it.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import logging
import os
import ssl
import threading
import time
from collections import Counter
from typing import Any, Final

import bcrypt

from exporter.serve.web_config import WebConfig, WebConfigError, load, server_context

log = logging.getLogger(__name__)

CACHED_CHECKS: Final = 100
"""Verified (user, hash, password) outcomes kept; the oldest goes first."""
RELOAD_CHECK_SECONDS: Final = 1.0
"""How often a new connection looks whether the web configuration or its files changed (certificates rotate)."""
_DECOY: Final = b"$2b$10$7uwAQD1BqPtX98t5jG1uTu5.tdfe.I6O/Fb3AiU4WWCktacBgVZxa"
"""A bcrypt hash (cost 10) checked for an unknown user, so that timing does not tell which users exist."""


class Failures:
    """Refusals by reason, counted by any thread."""

    def __init__(self) -> None:
        self._counts: Counter[str] = Counter()
        self._lock = threading.Lock()

    def count(self, reason: str) -> None:
        with self._lock:
            self._counts[reason] += 1

    def totals(self) -> dict[str, int]:
        with self._lock:
            return dict(self._counts)


def handshake_failure(exc: OSError) -> str:
    """The reason a TLS handshake failed, as counted."""
    reason = getattr(exc, "reason", None)
    if reason == "PEER_DID_NOT_RETURN_A_CERTIFICATE":
        return "client_certificate_missing"
    if reason in ("CERTIFICATE_VERIFY_FAILED", "TLSV1_ALERT_UNKNOWN_CA", "SSLV3_ALERT_BAD_CERTIFICATE"):
        return "client_certificate_invalid"
    return "tls_handshake_failed"


class Access:
    """Decides each request under one web configuration."""

    def __init__(self, config: WebConfig) -> None:
        self.config = config
        self._sans = set(config.tls.client_allowed_sans) if config.tls else set()
        self._checked: dict[bytes, bool] = {}
        self._bcrypt = threading.Lock()
        self._tokens = float(config.rate_limit[1]) if config.rate_limit else 0.0
        self._refilled = time.monotonic()
        self._bucket = threading.Lock()

    def limited(self) -> bool:
        """Whether the rate limit refuses this request (a token bucket, as exporter-toolkit's)."""
        if self.config.rate_limit is None:
            return False
        interval, burst = self.config.rate_limit
        with self._bucket:
            now = time.monotonic()
            self._tokens = min(float(burst), self._tokens + (now - self._refilled) / interval)
            self._refilled = now
            if self._tokens < 1:
                return True
            self._tokens -= 1
            return False

    def refusal(self, path: str, authorization: str, certificate: dict[str, Any] | None) -> str | None:
        """Why this request may not be served (one of exporter/health/counters.py AUTH_FAILURES), or None."""
        config = self.config
        if path in config.excluded_paths:
            return None
        if config.client_certificate_checked_per_request and not certificate:
            return "client_certificate_missing"
        if self._sans and not self._sans & _sans(certificate or {}):
            return "client_certificate_not_allowed"
        if config.users:
            return self._basic(authorization)
        return None

    def _basic(self, authorization: str) -> str | None:
        scheme, _, encoded = authorization.partition(" ")
        try:
            user, sep, password = base64.b64decode(encoded, validate=True).decode().partition(":")
        except (binascii.Error, UnicodeDecodeError):
            sep = ""
        if scheme.lower() != "basic" or not sep:
            return "no_credentials"
        hashed = self.config.users.get(user)
        key = hashlib.sha256(b"\0".join(s.encode() for s in (user, hashed or "", password))).digest()
        ok = self._checked.get(key)
        if ok is None:
            with self._bcrypt:  # one check at a time: a flood of guesses takes one core, never all
                try:
                    ok = bcrypt.checkpw(password.encode(), hashed.encode() if hashed else _DECOY) and bool(hashed)
                except ValueError:  # a password over bcrypt's 72 bytes: no hash matches it
                    ok = False
                if len(self._checked) >= CACHED_CHECKS:
                    del self._checked[next(iter(self._checked))]
                self._checked[key] = ok
        if ok:
            return None
        return "wrong_password" if hashed is not None else "unknown_user"


def _sans(certificate: dict[str, Any]) -> set[str]:
    """A verified peer certificate's subject alternative names (DNS, IP, email, URI values), as getpeercert()
    gives them."""
    return {value for _, value in certificate.get("subjectAltName", ())}


class Guard:
    """The current TLS context and access of the HTTP worker, read again when the web configuration file or a
    file it names changes (a rotated certificate is served to the next connection). A change that cannot be
    served is logged and the previous configuration kept."""

    def __init__(self, config: WebConfig) -> None:
        self.failures = Failures()
        self._lock = threading.Lock()
        self._apply(config)
        self._checked_at = time.monotonic()

    def _apply(self, config: WebConfig) -> None:
        self.context = server_context(config) if config.tls else None
        self.access = Access(config)
        self._stamps = _stamps(config.files())

    def current(self) -> tuple[ssl.SSLContext | None, Access]:
        """The context for a new connection and the access for its requests."""
        now = time.monotonic()
        if now - self._checked_at >= RELOAD_CHECK_SECONDS and self._lock.acquire(blocking=False):
            try:
                self._checked_at = now
                config = self.access.config
                if _stamps(config.files()) != self._stamps:
                    self._reload(config)
            finally:
                self._lock.release()
        return self.context, self.access

    def _reload(self, config: WebConfig) -> None:
        try:
            self._apply(load(config.path) if config.path else config)
            log.info("web configuration read again: %s changed", ", ".join(config.files()))
        except WebConfigError as exc:
            self._stamps = _stamps(config.files())  # logged once per change, not per connection
            log.error("the web configuration changed and cannot be served; serving the previous one: %s", exc)


def _stamps(paths: list[str]) -> list[tuple[int, int, int] | None]:
    stamps: list[tuple[int, int, int] | None] = []
    for path in paths:
        try:
            s = os.stat(path)
        except OSError:
            stamps.append(None)
            continue
        stamps.append((s.st_mtime_ns, s.st_size, s.st_ino))
    return stamps
