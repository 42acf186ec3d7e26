"""The running daemon's watch of its config's files (the config file and every file of ``models_dir``), checked on
the daemon's schedule (``--config.watch-interval``): a change reloads the config once the files have stood still for
one check, so a file caught half written (an editor saving in place, a copy under way) is never read and refused."""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Callable
from pathlib import Path

from exporter.config.types import Config

log = logging.getLogger(__name__)

Fingerprint = tuple[tuple[str, int, int, int, bytes], ...]


def fingerprint(config: Config) -> Fingerprint:
    """What identifies the content of the config file and of every file in models_dir (following symlinks, so a
    Kubernetes ConfigMap update, which swaps a symlink, changes it): each file's times, size and inode, and a digest
    of its bytes, for a rewrite that keeps them all (within the file system's time granularity, or by a copy that
    sets the old times: ``cp -p``, ``rsync -t``). Config files are small: the digest costs one read per check."""
    paths = [Path(config.source)]
    if config.models_dir is not None and Path(config.models_dir).is_dir():
        paths += sorted(p for p in Path(config.models_dir).iterdir() if not p.name.startswith("."))
    out = []
    for path in paths:
        try:
            st = path.stat()
            with path.open("rb") as f:
                digest = hashlib.file_digest(f, "sha256").digest()
        except OSError:  # gone, a directory, unreadable: what the reload then finds is refused or reported there
            continue
        out.append((str(path), st.st_mtime_ns, st.st_size, st.st_ino, digest))
    return tuple(out)


class ConfigWatch:
    """The periodic check of the running config's files, which reloads the config when they changed and then did
    not change again until the next check (a change seen at check N is reloaded at check N+1 if the files are the
    same then). A version that is refused is not tried again until the files change: one refusal per version.

    ``config`` gives the config running now (whose files are watched), ``reload`` reloads it (the daemon's reload,
    which calls :meth:`mark` once it applied a config).
    """

    def __init__(self, config: Callable[[], Config], reload: Callable[[], tuple[bool, str]]) -> None:
        self._config = config
        self._reload = reload
        self._loaded: Fingerprint = ()
        """The files as last loaded, or as last refused by a check (not tried again until they change)."""
        self._seen: Fingerprint | None = None
        """A change the last check saw: reloaded if this check sees the files the same."""

    def mark(self) -> None:
        """Take the files as they are now as the version running: at start, and after each applied reload."""
        self._loaded, self._seen = fingerprint(self._config()), None

    def check(self) -> None:
        """The scheduled check: reload when the files changed at the last check and stayed so since."""
        seen = fingerprint(self._config())
        if seen == self._loaded:
            self._seen = None
        elif seen != self._seen:  # changed since the last check: maybe still being written
            self._seen = seen
        else:
            self._loaded, self._seen = seen, None  # a refused config is not retried until it changes again
            log.info("the config files changed and stayed so for one check: reloading")
            self._reload()
