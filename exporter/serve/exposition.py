"""The /metrics page assembled from its two parts: the snapshot's cached rendering and the live registry's.

One code path for every page: the HTTP worker process (exporter.serve.worker) holds a :class:`Pages` fed by the
daemon's publications, and ``Daemon.metrics_page`` feeds one the same parts. Imports neither numpy nor pandas:
the worker process loads this module and stays small.
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Mapping
from typing import Final, NamedTuple

from prometheus_client.exposition import choose_encoder

OM_EOF: Final = b"# EOF\n"
MAX_FORMATS: Final = 4
"""Formats kept per snapshot: the text format, OpenMetrics and a few escaping variants clients may ask for."""
EXPLANATIONS: Final = "application/json; explanations"
"""The key of the snapshot's explanations (``segments:``) among its renderings: published with them, served on
/explain, never a /metrics page."""
DEFAULT_CONTENT_TYPE: Final = choose_encoder("")[1]
"""The text format 0.0.4: served when a client asks for none, or for a format beyond :data:`MAX_FORMATS`."""


class Page(NamedTuple):
    """One /metrics response: its body, content type and whether the body is gzipped."""

    body: bytes
    content_type: str
    gzipped: bool


class Rendered(NamedTuple):
    """A snapshot's exposition in one format: the text, its raw deflate stream ended by a sync flush (no final
    block: the live part's blocks follow it) and its CRC-32, so that a page deflates and checksums only the small
    live part (the CRC of the whole megabyte-sized page took most of a scrape's CPU)."""

    text: bytes
    deflated: bytes
    crc: int

    @classmethod
    def of(cls, text: bytes) -> Rendered:
        return cls(text, _deflate(text, 6, final=False), zlib.crc32(text))


_GZIP_HEADER: Final = b"\x1f\x8b\x08\x00\x00\x00\x00\x00\x00\xff"  # deflate, no name, no mtime, OS unknown


def _deflate(text: bytes, level: int, final: bool) -> bytes:
    compressor = zlib.compressobj(level, zlib.DEFLATED, -zlib.MAX_WBITS)
    return compressor.compress(text) + compressor.flush(zlib.Z_FINISH if final else zlib.Z_SYNC_FLUSH)


def gzip_one_member(head: Rendered, tail: bytes) -> bytes:
    """``head.text + tail`` as ONE gzip member, reusing the head's cached deflate stream and CRC-32.

    A sync flush ended the head's deflate blocks on a byte boundary without a final block, so the tail's
    independently compressed blocks (the last one final) follow it in the same member (as pigz joins blocks); the
    trailer's CRC-32 continues the head's over the tail. Single-member decoders (curl --compressed, urllib3) read
    the whole page.
    """
    crc = zlib.crc32(tail, head.crc)
    size = (len(head.text) + len(tail)) & 0xFFFFFFFF
    return b"".join((_GZIP_HEADER, head.deflated, _deflate(tail, 1, final=True), struct.pack("<II", crc, size)))


class Pages:
    """Every /metrics page of one publication, assembled once per format, plain and gzipped.

    :meth:`apply` takes the snapshot's rendering per content type (None: unchanged since the last call) and the
    live registry's rendering per content type; each page is the snapshot's text then the live text (whose "# EOF"
    line, in OpenMetrics, ends the page). A scrape only looks a page up. Swapped as one reference: a reader on
    another thread sees the old pages or the new ones, never a mix.
    """

    def __init__(self) -> None:
        self._snapshot: dict[str, Rendered] = {}
        self._pages: dict[tuple[str, bool], Page] = {}

    def apply(self, snapshot: Mapping[str, bytes] | None, live: Mapping[str, bytes]) -> None:
        if snapshot is not None:
            self._snapshot = {kind: Rendered.of(text.removesuffix(OM_EOF)) for kind, text in snapshot.items()}
        pages: dict[tuple[str, bool], Page] = {}
        for kind, tail in live.items():
            head = self._snapshot.get(kind)
            if head is not None:
                pages[kind, False] = Page(head.text + tail, kind, False)
                pages[kind, True] = Page(gzip_one_member(head, tail), kind, True)
        self._pages = pages

    def document(self, kind: str) -> bytes | None:
        """A rendering of the snapshot that is no /metrics page (:data:`EXPLANATIONS`); None if not published."""
        rendered = self._snapshot.get(kind)
        return None if rendered is None else rendered.text

    def formats(self) -> set[str]:
        """The content types this publication has pages for."""
        return {kind for kind, _ in self._pages}

    def get(self, content_type: str, accept_encoding: str) -> Page | None:
        """The page in ``content_type``, gzipped when the Accept-Encoding header allows it; None if not published."""
        return self._pages.get((content_type, "gzip" in accept_encoding))
