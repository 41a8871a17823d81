"""Content decoding with a bounded output per step, for the egress client's capped reads.

httpx decodes each raw chunk whole: the first 64 KiB of a gzip bomb inflates to ~67 MB
at once, before any cap can look at it. Here zlib's `max_length` bounds every step, and
the compressed input it did not consume waits in `unconsumed_tail`, so a body costs at
most the cap plus one step, whatever its ratio. Only gzip and deflate are asked for
(`ACCEPT_ENCODING`); a body in another coding is refused rather than decoded unbounded.
"""

from __future__ import annotations

import zlib
from collections.abc import Iterator

from workers.egress.netguard import EgressError

ACCEPT_ENCODING = "gzip, deflate"
STEP = 64 * 1024  # the most one step may inflate to
IDENTITY = ("", "identity")


class Inflater:
    """One content coding (gzip, deflate) undone a bounded step at a time."""

    def __init__(self, coding: str) -> None:
        self.coding = coding
        # gzip: its header; deflate: zlib's wrapper, or raw deflate (sent by some servers)
        self.inner = zlib.decompressobj(zlib.MAX_WBITS | 16 if coding == "gzip" else 0)
        self.first = True

    def steps(self, data: bytes, limit: int) -> Iterator[bytes]:
        """The decoded bytes of `data`, each step at most `limit`; stop when enough."""
        pending = data
        while pending and not self.inner.eof:
            try:
                out = self.inner.decompress(pending, limit)
            except zlib.error:
                if not (self.coding == "deflate" and self.first):
                    raise
                self.inner = zlib.decompressobj(-zlib.MAX_WBITS)  # raw deflate after all
                self.first = False
                continue
            self.first = False
            pending = self.inner.unconsumed_tail
            yield out


def decoder(content_encoding: str) -> Inflater | None:
    """The inflater for a response's Content-Encoding (None: as it is); a coding that
    cannot be bounded, or several stacked, is refused."""
    codings = [c.strip().lower() for c in content_encoding.split(",") if c.strip()]
    codings = [c for c in codings if c not in IDENTITY]
    if not codings:
        return None
    coding = "gzip" if codings == ["x-gzip"] else codings[0]
    if len(codings) > 1 or coding not in ("gzip", "deflate"):
        raise EgressError(
            "url_not_accessible", f"the body is encoded as {content_encoding}, not gzip or deflate"
        )
    return Inflater(coding)


def decoded(raw: Iterator[bytes], inflater: Inflater | None) -> Iterator[bytes]:
    """The body's bytes, decoded a bounded step at a time (the reader stops when full)."""
    for chunk in raw:
        if inflater is None:
            yield chunk
            continue
        try:
            yield from inflater.steps(chunk, STEP)
        except zlib.error as exc:
            raise EgressError("url_not_accessible", f"the body does not decode: {exc}") from None
