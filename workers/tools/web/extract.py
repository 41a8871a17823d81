"""A fetched body as text for the model, by content type.

Markdown and plain text pass through; HTML is extracted to Markdown (or text) by
trafilatura, which falls back to its own readability and jusText passes, then to the
page's whole text; JSON is pretty-printed; PDF becomes text (pypdf). Anything else is
`unsupported_content_type`. Heavy imports happen here, on the web worker only.
"""

from __future__ import annotations

import io
import json
import re
from dataclasses import dataclass
from typing import Literal

from workers.egress.netguard import EgressError

Mode = Literal["markdown", "text"]
HTML_TYPES = frozenset({"text/html", "application/xhtml+xml"})
TEXT_TYPES = frozenset({"text/plain", "text/markdown", "text/x-markdown", "text/csv"})
JSON_TYPES = frozenset({"application/json", "application/ld+json", "application/problem+json"})
PDF_TYPES = frozenset({"application/pdf"})
THIN_PAGE_CHARS = 200  # less than this from a page with scripts: it renders in the browser
TITLE = re.compile(rb"<title[^>]*>(.*?)</title>", re.I | re.S)


@dataclass
class Extracted:
    text: str
    title: str
    extractor: str
    note: str = ""


def decode(body: bytes, charset: str | None) -> str:
    """Text in its declared charset, else what charset detection finds, else UTF-8."""
    if charset:
        try:
            return body.decode(charset, errors="replace")
        except LookupError:
            pass
    try:
        return body.decode("utf-8")
    except UnicodeDecodeError:
        from charset_normalizer import from_bytes

        best = from_bytes(body[:200_000]).best()
        return body.decode(best.encoding if best else "utf-8", errors="replace")


def extract(body: bytes, content_type: str, charset: str | None, url: str, mode: Mode) -> Extracted:
    kind = content_type or _sniff(body)
    if kind in TEXT_TYPES or (kind.startswith("text/") and kind not in HTML_TYPES):
        return Extracted(decode(body, charset), "", "markdown" if "markdown" in kind else "text")
    if kind in HTML_TYPES:
        return _html(decode(body, charset), url, mode)
    if kind in JSON_TYPES or kind.endswith("+json"):
        try:
            return Extracted(json.dumps(json.loads(body), indent=2, ensure_ascii=False), "", "json")
        except ValueError as exc:
            raise EgressError("url_not_accessible", f"the JSON does not parse: {exc}") from None
    if kind in PDF_TYPES:
        return _pdf(body)
    raise EgressError(
        "unsupported_content_type",
        f"{kind or 'an unknown type'} is not text, HTML, JSON or PDF; web_fetch cannot read it",
    )


def _sniff(body: bytes) -> str:
    head = body[:512].lstrip().lower()
    if head.startswith(b"%pdf"):
        return "application/pdf"
    if head.startswith((b"<!doctype html", b"<html")) or b"<body" in head:
        return "text/html"
    if head[:1] in (b"{", b"["):
        return "application/json"
    return ""


def _html(html: str, url: str, mode: Mode) -> Extracted:
    import trafilatura

    text = trafilatura.extract(
        html,
        url=url,
        output_format="markdown" if mode == "markdown" else "txt",
        include_links=mode == "markdown",
        include_tables=True,
        include_comments=False,
        favor_recall=True,
    )
    extractor = "trafilatura"
    if not text or len(text) < THIN_PAGE_CHARS:
        whole = trafilatura.html2txt(html) or ""
        if len(whole) > len(text or ""):
            text, extractor = whole, "trafilatura-html2txt"
    metadata = trafilatura.extract_metadata(html, default_url=url)
    title = metadata.title if metadata is not None and metadata.title else ""
    if not title and (found := TITLE.search(html.encode(errors="ignore"))):
        title = found.group(1).decode(errors="replace").strip()
    note = ""
    if len((text or "").strip()) < THIN_PAGE_CHARS and "<script" in html.lower():
        note = (
            "the page yields almost no text: it looks rendered in the browser by scripts; "
            "the browser tool can read it"
        )
    return Extracted((text or "").strip(), title, extractor, note)


def _pdf(body: bytes) -> Extracted:
    from pypdf import PdfReader
    from pypdf.errors import PdfReadError

    try:
        reader = PdfReader(io.BytesIO(body))
        pages = [page.extract_text() or "" for page in reader.pages]
    except (PdfReadError, ValueError, KeyError) as exc:
        raise EgressError("url_not_accessible", f"the PDF does not read: {exc}") from None
    title = ""
    if reader.metadata is not None and reader.metadata.title:
        title = str(reader.metadata.title)
    text = "\n\n".join(f"[page {i}]\n{p.strip()}" for i, p in enumerate(pages, 1) if p.strip())
    return Extracted(text, title, "pypdf")
