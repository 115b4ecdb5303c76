"""Text out of an uploaded document: PDF, HTML, Markdown, plain text.

* PDF: ``pypdf`` (pure Python, BSD, maintained): the text layer of every page,
  pages separated by a blank line. A scanned PDF has no text layer: that is a
  failure ("no text could be extracted"), not an empty document, so a user
  learns why the file will never answer anything. A file pypdf cannot parse
  fails with pypdf's own reason.
* HTML: ``inscriptis`` (Apache-2.0, maintained): a layout-aware HTML-to-text
  renderer that keeps paragraphs, lists and table cells apart and drops
  ``<script>``/``<style>``. Preferred to ``html2text`` because that one is
  GPL-3.0 (this project is Apache-2.0) and produces Markdown markup (``**``,
  ``[text](url)``) that would only add noise to chunks and BM25 terms.
* Markdown and plain text: kept as they are, decoded as UTF-8 (a BOM is
  dropped); anything else fails with the offset of the first bad byte.

Every result has ``\\r\\n`` normalized to ``\\n`` and no NUL characters
(PostgreSQL's ``text`` cannot hold them), and is valid UTF-8 (lone surrogates
a PDF may yield become ``?``).
"""

from __future__ import annotations

import io
import re

SUPPORTED_TYPES = ("text/plain", "text/markdown", "text/html", "application/pdf")

#: What a file name's extension means, for clients that send no useful type.
EXTENSIONS = {
    ".txt": "text/plain",
    ".text": "text/plain",
    ".md": "text/markdown",
    ".markdown": "text/markdown",
    ".html": "text/html",
    ".htm": "text/html",
    ".pdf": "application/pdf",
}

#: Declared types that mean one of ours.
ALIASES = {"text/x-markdown": "text/markdown", "application/xhtml+xml": "text/html", "application/x-pdf": "application/pdf"}

NO_TEXT = "no text could be extracted"

_META_CHARSET = re.compile(rb"""<meta[^>]+charset\s*=\s*["']?\s*([A-Za-z0-9._:-]+)""", re.IGNORECASE)


class ExtractionError(Exception):
    """The document's text cannot be had; the message is the reason shown to the user."""


def content_type_for(declared: str | None, filename: str) -> str | None:
    """The supported type of an upload: its declared type if that is one of
    ours, else its file name's extension; None if neither is."""
    mime = (declared or "").split(";", 1)[0].strip().lower()
    mime = ALIASES.get(mime, mime)
    if mime in SUPPORTED_TYPES:
        return mime
    dot = filename.rfind(".")
    return EXTENSIONS.get(filename[dot:].lower()) if dot >= 0 else None


def too_much_text(max_bytes: int) -> str:
    return f"the file's text is over the limit of {max_bytes:,} bytes (TURNLOG_FILE_MAX_TEXT_BYTES)"


def extract_text(data: bytes, content_type: str, max_bytes: int | None = None) -> str:
    """The text of ``data`` (a document of ``content_type``, one of
    ``SUPPORTED_TYPES``), at most ``max_bytes`` of UTF-8 (a PDF stops at the
    first page past it). Raises :class:`ExtractionError`. CPU-bound: call it
    in a worker thread, or (PDF, HTML: a small file may take minutes) through
    ``adapters.knowledge.extract_process``."""
    if content_type == "application/pdf":
        text = _pdf(data, max_bytes)
    elif content_type == "text/html":
        text = _html(data)
    elif content_type in ("text/plain", "text/markdown"):
        text = _utf8(data)
    else:
        raise ExtractionError(f"unsupported content type {content_type!r}")
    text = _clean(text)
    if max_bytes is not None and len(text) > max_bytes // 4 and len(text.encode()) > max_bytes:
        raise ExtractionError(too_much_text(max_bytes))
    if not text.strip():
        raise ExtractionError(NO_TEXT)
    return text


def _utf8(data: bytes) -> str:
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise ExtractionError(f"the file is not UTF-8 text (invalid byte at offset {exc.start})") from None


def _pdf(data: bytes, max_bytes: int | None) -> str:
    from pypdf import PdfReader

    try:
        reader = PdfReader(io.BytesIO(data))
        if reader.is_encrypted and not reader.decrypt(""):
            raise ExtractionError("the PDF is encrypted with a password")
        pages: list[str] = []
        total = 0
        for page in reader.pages:
            pages.append(page.extract_text() or "")
            total += len(pages[-1].encode("utf-8", "replace"))
            if max_bytes is not None and total > max_bytes:
                raise ExtractionError(too_much_text(max_bytes))  # the rest is never extracted
    except ExtractionError:
        raise
    except Exception as exc:  # pypdf raises many kinds (PdfReadError, ValueError, KeyError...)
        reason = str(exc) or type(exc).__name__
        raise ExtractionError(f"the PDF could not be read: {reason}") from None
    return "\n\n".join(page.strip("\n") for page in pages)


def _html(data: bytes) -> str:
    from inscriptis import get_text
    from inscriptis.model.config import ParserConfig

    try:
        markup = data.decode("utf-8-sig")
    except UnicodeDecodeError:
        declared = _META_CHARSET.search(data[:4096])
        if declared is None:
            raise ExtractionError("the HTML is not UTF-8 and declares no charset") from None
        try:
            markup = data.decode(declared.group(1).decode("ascii"))
        except (LookupError, UnicodeDecodeError) as exc:
            raise ExtractionError(f"the HTML cannot be decoded as its declared charset: {exc}") from None
    # lxml refuses a str that carries an XML encoding declaration.
    markup = re.sub(r"^\s*<\?xml[^>]*\?>", "", markup)
    try:
        return get_text(markup, ParserConfig(display_links=False, display_images=False))
    except Exception as exc:  # lxml's parser errors
        raise ExtractionError(f"the HTML could not be parsed: {exc}") from None


def _clean(text: str) -> str:
    text = text.replace("\r\n", "\n").replace("\r", "\n").replace("\x00", "")
    return text.encode("utf-8", "replace").decode("utf-8")
