"""Who may read /metrics and the probes: the Prometheus exporter-toolkit web configuration file.

``fairness-exporter serve --web.config.file web.yml`` reads the file every Prometheus exporter reads (the
exporter-toolkit's docs/web-configuration.md): ``tls_server_config`` (``cert_file``, ``key_file``,
``client_auth_type``, ``client_ca_file`` or ``client_ca``, ``client_allowed_sans``, ``min_version``,
``max_version``, ``prefer_server_cipher_suites``), ``http_server_config`` (``headers``; ``http2`` is accepted and
HTTP/1.1 served), ``basic_auth_users`` (bcrypt hashes) and ``rate_limit``. Relative paths are relative to the file.

One key is ours, ``auth_excluded_paths`` (e.g. ``[/healthz, /readyz]``): the kubelet can send neither a client
certificate nor a password it does not keep in the pod spec, so probes need paths that ask for neither.
exporter-toolkit has no such key (it was proposed under this name in its pull request 151, for both
mechanisms). With it and ``RequireAndVerifyClientCert``, the handshake asks for a certificate and verifies the
one given, and a request for any other path without a verified certificate is refused (401).

Refused rather than ignored, because ignoring them would serve with less protection than the file asks for:
``RequestClientCert`` and ``RequireAnyClientCert`` (a certificate nobody verifies proves nothing),
``cipher_suites`` and ``curve_preferences`` (Go's names; OpenSSL's defaults are used), inline ``cert``/``key``.

Imports neither numpy nor pandas: the HTTP worker process loads it.
"""

from __future__ import annotations

import re
import ssl
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Final

from exporter.config.yaml_file import YamlFileError, read_yaml

CLIENT_AUTH: Final = {"NoClientCert": ssl.CERT_NONE, "VerifyClientCertIfGiven": ssl.CERT_OPTIONAL,
                      "RequireAndVerifyClientCert": ssl.CERT_REQUIRED}  # fmt: skip
TLS_VERSIONS: Final = {"TLS10": ssl.TLSVersion.TLSv1, "TLS11": ssl.TLSVersion.TLSv1_1,
                       "TLS12": ssl.TLSVersion.TLSv1_2, "TLS13": ssl.TLSVersion.TLSv1_3}  # fmt: skip
HEADERS: Final = {"Strict-Transport-Security": (), "X-Content-Type-Options": ("nosniff",),
                  "X-Frame-Options": ("deny", "sameorigin"), "X-XSS-Protection": (), "Content-Security-Policy": ()}
"""The headers exporter-toolkit lets a file set, with the values it accepts (none listed: any)."""
_BCRYPT: Final = re.compile(r"\$2[abxy]?\$\d\d\$[./A-Za-z0-9]{53}")
_DURATION: Final = re.compile(r"(\d+(?:\.\d*)?)(ns|us|µs|ms|s|m|h)")
_UNIT_SECONDS: Final = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}
_KEYS: Final = {"": {"tls_server_config", "http_server_config", "basic_auth_users", "rate_limit",
                     "auth_excluded_paths"},
                "tls_server_config": {"cert_file", "key_file", "client_auth_type", "client_ca_file", "client_ca",
                                      "client_allowed_sans", "min_version", "max_version",
                                      "prefer_server_cipher_suites", "cipher_suites", "curve_preferences", "cert",
                                      "key"},
                "http_server_config": {"http2", "headers"}, "rate_limit": {"interval", "burst"}}  # fmt: skip
_REFUSED: Final = {"cipher_suites": "Go's suite names are not mapped: OpenSSL's default suites are used",
                   "curve_preferences": "Go's curve names are not mapped: OpenSSL's default curves are used",
                   "cert": "inline PEM is not read: put the certificate in a file named by cert_file",
                   "key": "inline PEM is not read: put the key in a file named by key_file"}  # fmt: skip


class WebConfigError(ValueError):
    """The web configuration cannot be served; one ``field: problem`` line per problem, naming the file."""


class ListenError(RuntimeError):
    """The metrics endpoint cannot be served as the config's ``listen`` section says; the message names the field."""


@dataclass(frozen=True)
class Tls:
    """``tls_server_config``."""

    cert_file: str
    key_file: str
    client_auth: str = "NoClientCert"
    client_ca_file: str | None = None
    client_ca: str | None = None
    client_allowed_sans: tuple[str, ...] = ()
    min_version: str = "TLS12"
    max_version: str = "TLS13"
    prefer_server_cipher_suites: bool = True
    field_names: tuple[str, str] = ("tls_server_config.cert_file", "tls_server_config.key_file")
    """How messages name the certificate and key (``listen.tls_cert_file`` when they come from the config)."""

    def files(self) -> list[str]:
        return [f for f in (self.cert_file, self.key_file, self.client_ca_file) if f]


@dataclass(frozen=True)
class WebConfig:
    """Who may read, and how the HTTP worker serves them."""

    tls: Tls | None = None
    users: dict[str, str] = field(default_factory=dict)
    """User name to bcrypt hash; none: no basic authentication."""
    excluded_paths: frozenset[str] = frozenset()
    headers: dict[str, str] = field(default_factory=dict)
    rate_limit: tuple[float, int] | None = None
    """(seconds between requests, burst): a token bucket in front of every path; None: no limit."""
    path: str | None = None
    """The file it was read from (read again when it or a file it names changes); None: the config's listen.*."""

    def files(self) -> list[str]:
        """The files whose change makes the HTTP worker read the configuration again."""
        return [*([self.path] if self.path else []), *(self.tls.files() if self.tls else [])]

    @property
    def client_certificate_checked_per_request(self) -> bool:
        """``RequireAndVerifyClientCert`` with paths excluded: the handshake only asks, each request requires."""
        return self.tls is not None and self.tls.client_auth == "RequireAndVerifyClientCert" \
            and bool(self.excluded_paths)  # fmt: skip


def from_listen(cert_file: str | None, key_file: str | None) -> WebConfig:
    """The config's ``listen.tls_cert_file`` and ``listen.tls_key_file`` as a web configuration (TLS only)."""
    if not (cert_file and key_file):
        return WebConfig()
    return WebConfig(Tls(cert_file, key_file, field_names=("listen.tls_cert_file", "listen.tls_key_file")))


def resolve(path: str | None, listen_cert: str | None, listen_key: str | None) -> WebConfig:
    """What the daemon serves under: the web configuration file's, with the config's ``listen.tls_*`` as its TLS
    if the file has none; its TLS files loaded once to check them (WebConfigError, ListenError for ``listen.*``)."""
    listen = from_listen(listen_cert, listen_key)
    web = load(path) if path else listen
    if listen.tls and web is not listen:
        if web.tls:
            raise WebConfigError(f"--web.config.file {path}: tls_server_config and the config's listen.tls_cert_file "
                                 "both set the server's TLS: keep one")  # fmt: skip
        web = replace(web, tls=listen.tls)
    if web.tls is not None and web.tls is listen.tls:
        try:
            server_context(web)
        except WebConfigError as exc:
            raise ListenError(str(exc)) from exc
    return web


def load(path: str) -> WebConfig:
    """The file, every problem reported at once (WebConfigError), its TLS files loaded once to check them."""
    name = f"--web.config.file {path}"
    try:
        raw = read_yaml(path)
    except OSError as exc:
        raise WebConfigError(f"{name}: cannot be read: {exc.strerror}") from exc
    except YamlFileError as exc:
        raise WebConfigError(f"--web.config.file {exc}") from exc
    problems: list[str] = []
    config = _parse({} if raw is None else raw, Path(path).parent, problems)
    if config is not None and config.tls is not None and not problems:
        try:
            server_context(config)
        except WebConfigError as exc:
            problems.append(str(exc))
    if problems or config is None:
        raise WebConfigError(f"{name}: invalid web configuration:\n  " + "\n  ".join(problems))
    return WebConfig(config.tls, config.users, config.excluded_paths, config.headers, config.rate_limit, path)


def _mapping(raw: Any, where: str, problems: list[str]) -> dict[str, Any]:
    """A section as a mapping (missing: empty), its unknown and refused keys reported."""
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        problems.append(f"{where or 'the file'}: {raw!r} is not a mapping")
        return {}
    keys = _KEYS.get(where)
    if keys is not None:
        for key in sorted(set(map(str, raw)) - keys):
            problems.append(f"{where + '.' if where else ''}{key}: unknown key (accepted: {', '.join(sorted(keys))})")
        for key in sorted(set(raw) & set(_REFUSED), key=str):
            problems.append(f"{where}.{key}: not supported ({_REFUSED[key]}); remove it")
    return raw


def _strings(raw: Any, where: str, problems: list[str]) -> tuple[str, ...]:
    if raw is None:
        return ()
    if not (isinstance(raw, list) and all(isinstance(s, str) for s in raw)):
        problems.append(f"{where}: {raw!r} is not a list of strings")
        return ()
    return tuple(raw)


def _parse(raw: Any, directory: Path, problems: list[str]) -> WebConfig | None:
    top = _mapping(raw, "", problems)
    if not isinstance(raw, dict):
        return None
    tls = _parse_tls(_mapping(top.get("tls_server_config"), "tls_server_config", problems), directory, problems)
    users = _mapping(top.get("basic_auth_users"), "basic_auth_users", problems)
    for user, hashed in users.items():
        if not (isinstance(user, str) and isinstance(hashed, str) and _BCRYPT.fullmatch(hashed)):
            problems.append(f"basic_auth_users.{user}: not a bcrypt hash (make one with htpasswd -nBC 10 \"\" | "
                            "tr -d ':\\n')")  # fmt: skip
    excluded = _strings(top.get("auth_excluded_paths"), "auth_excluded_paths", problems)
    for path in excluded:
        if not path.startswith("/"):
            problems.append(f"auth_excluded_paths: {path!r} is not a path (e.g. /healthz)")
    http = _mapping(top.get("http_server_config"), "http_server_config", problems)
    if not isinstance(http.get("http2", True), bool):
        problems.append(f"http_server_config.http2: {http['http2']!r} is not true or false")
    headers = _mapping(http.get("headers"), "http_server_config.headers", problems)
    for header, value in headers.items():
        allowed = HEADERS.get(header)
        if allowed is None:
            problems.append(f"http_server_config.headers.{header}: cannot be set (accepted: {', '.join(HEADERS)})")
        elif not isinstance(value, str) or (allowed and value not in allowed):
            problems.append(f"http_server_config.headers.{header}: {value!r} is not one of {', '.join(allowed)}"
                            if allowed else f"http_server_config.headers.{header}: {value!r} is not a string")
    return WebConfig(tls, dict(users), frozenset(excluded), {k: v for k, v in headers.items() if isinstance(v, str)},
                     _parse_rate_limit(_mapping(top.get("rate_limit"), "rate_limit", problems), problems))


def _parse_tls(raw: dict[str, Any], directory: Path, problems: list[str]) -> Tls | None:
    if not raw:
        return None

    def file(key: str) -> str | None:
        value = raw.get(key)
        if value is None or value == "":
            return None
        if not isinstance(value, str):
            problems.append(f"tls_server_config.{key}: {value!r} is not a file path")
            return None
        return str(directory / value)  # an absolute value stays as it is

    cert, key, ca = file("cert_file"), file("key_file"), file("client_ca_file")
    if cert is None or key is None:
        problems.append("tls_server_config: cert_file and key_file are both needed to serve TLS")
    auth = raw.get("client_auth_type") or "NoClientCert"
    if auth not in CLIENT_AUTH:
        unverified = auth in ("RequestClientCert", "RequireAnyClientCert", "RequireClientCert")
        problems.append(f"tls_server_config.client_auth_type: {auth!r} " + (
            "accepts certificates nobody verifies, which prove nothing" if unverified else "is unknown")
            + f" (accepted: {', '.join(CLIENT_AUTH)})")  # fmt: skip
    client_ca = raw.get("client_ca")
    if client_ca is not None and not isinstance(client_ca, str):
        problems.append(f"tls_server_config.client_ca: {client_ca!r} is not PEM text")
    if (ca or client_ca) and auth == "NoClientCert":
        problems.append("tls_server_config: a client CA is configured without a client_auth_type that verifies")
    sans = _strings(raw.get("client_allowed_sans"), "tls_server_config.client_allowed_sans", problems)
    if sans and auth != "RequireAndVerifyClientCert":
        problems.append("tls_server_config.client_allowed_sans: needs client_auth_type RequireAndVerifyClientCert")
    versions = [raw.get(k, default) for k, default in (("min_version", "TLS12"), ("max_version", "TLS13"))]
    for bound, version in zip(("min_version", "max_version"), versions, strict=True):
        if version not in TLS_VERSIONS:
            problems.append(f"tls_server_config.{bound}: {version!r} is not one of {', '.join(TLS_VERSIONS)}")
    prefer = raw.get("prefer_server_cipher_suites", True)
    if not isinstance(prefer, bool):
        problems.append(f"tls_server_config.prefer_server_cipher_suites: {prefer!r} is not true or false")
    if cert is None or key is None:
        return None
    return Tls(cert, key, str(auth), ca, client_ca if isinstance(client_ca, str) else None, sans, str(versions[0]),
               str(versions[1]), bool(prefer))


def _seconds(duration: Any) -> float | None:
    """A Go duration (``1s``, ``1m30s``, ``250ms``, ``0``; an integer is nanoseconds, as Go reads it) in seconds."""
    if isinstance(duration, int) and not isinstance(duration, bool):
        return duration * 1e-9
    if not isinstance(duration, str):
        return None
    parts = _DURATION.findall(duration)
    if duration == "0" or (parts and "".join(n + u for n, u in parts) == duration):
        return sum(float(n) * _UNIT_SECONDS[u] for n, u in parts)
    return None


def _parse_rate_limit(raw: dict[str, Any], problems: list[str]) -> tuple[float, int] | None:
    if not raw:
        return None
    seconds, burst = _seconds(raw.get("interval", 0)), raw.get("burst", 0)
    if seconds is None or seconds < 0:
        problems.append(f"rate_limit.interval: {raw.get('interval')!r} is not a duration (e.g. 1s, 100ms, 0)")
    if not (isinstance(burst, int) and not isinstance(burst, bool) and burst >= 0):
        problems.append(f"rate_limit.burst: {burst!r} is not a whole number of requests")
    elif seconds:
        return seconds, burst
    return None


def server_context(config: WebConfig) -> ssl.SSLContext:
    """The TLS server context of the configuration (which has TLS); WebConfigError naming the file at fault."""
    tls = config.tls
    assert tls is not None
    for name, path in zip(tls.field_names, (tls.cert_file, tls.key_file), strict=True):
        try:
            Path(path).open("rb").close()
        except OSError as exc:
            raise WebConfigError(f"{name}: {path}: {exc.strerror}") from exc
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    try:
        context.load_cert_chain(tls.cert_file, tls.key_file)
    except ssl.SSLError as exc:
        swapped = b"PRIVATE KEY" in Path(tls.cert_file).read_bytes() and \
            b"CERTIFICATE" in Path(tls.key_file).read_bytes()  # fmt: skip
        hint = "the two files look swapped" if swapped else "expected a PEM certificate and its PEM private key"
        raise WebConfigError(f"{', '.join(tls.field_names)}: {tls.cert_file}, {tls.key_file}: cannot be used "
                             f"({exc.reason or exc}): {hint}") from exc  # fmt: skip
    context.minimum_version, context.maximum_version = TLS_VERSIONS[tls.min_version], TLS_VERSIONS[tls.max_version]
    if tls.prefer_server_cipher_suites:
        context.options |= ssl.OP_CIPHER_SERVER_PREFERENCE
    mode = CLIENT_AUTH[tls.client_auth]
    context.verify_mode = ssl.CERT_OPTIONAL if config.client_certificate_checked_per_request else mode
    if mode != ssl.CERT_NONE:
        try:
            if tls.client_ca_file or tls.client_ca:
                context.load_verify_locations(cafile=tls.client_ca_file, cadata=tls.client_ca)
            else:
                context.load_default_certs(ssl.Purpose.CLIENT_AUTH)
        except (OSError, ssl.SSLError) as exc:
            raise WebConfigError(f"tls_server_config.client_ca_file: {tls.client_ca_file or 'client_ca'}: cannot "
                                 f"be used ({getattr(exc, 'strerror', None) or exc})") from exc  # fmt: skip
    return context
