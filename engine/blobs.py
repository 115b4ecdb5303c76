"""Large base64 payloads become stored blobs, referenced instead of inlined.

Tools may emit (``__event_emitter__``) or return images and other binary data
as ``data:<mime>;base64,...`` URIs or as bare base64 under keys such as
``b64_json``. Pushed inline, every such event costs the log, every subscriber
and every replay the whole payload again. :meth:`Blobs.externalize` returns a
copy of a JSON-like payload in which each such string longer than ``limit``
characters is replaced by a reference::

    {"$blob": "<id>", "mime": "image/png", "bytes": 12345, "url": "/v1/blobs/<id>"}

and the decoded bytes are put into a :class:`BlobStore`.

What is externalized (and nothing else):

* a string that *is* a base64 data URI (``data:type/subtype[;param=v]*;base64,``
  followed by strictly valid base64), under any key;
* a bare base64 string under a key that names base64 (see
  :func:`is_base64_key`: ``data``, ``base64``, ``b64``, ``b64_json``,
  ``*_b64``, ``*_base64``, ``*_b64_json``), directly or in a list under it.
  Its mime is the sibling ``mime_type``/``mimeType``/``media_type``/
  ``mediaType``/``mime``/``content_type`` if that is a valid type (or an
  audio ``format`` such as ``wav``), else sniffed from the bytes' magic
  number, else ``application/octet-stream``. Under the generic key ``data``
  the mime must be known (declared or sniffed): a long unspaced plain string
  there that happens to be valid base64 stays as it is.

Strings that fail strict base64 decoding are left untouched, as are strings
*containing* data URIs (markdown, JSON text): only whole values are replaced.

Ids are content addresses scoped to the user (:func:`blob_id`): the same
bytes of the same user always get the same id (so repeated payloads are stored
once and ``externalize`` is deterministic), and two users never share an id.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import re
from collections.abc import Mapping
from typing import Any

from engine.json_types import JsonObject
from engine.ports import BlobStore

#: The path blobs are served under (``adapters.http.blob_routes``).
BLOB_URL_PREFIX = "/v1/blobs/"

#: Marker key of a blob reference.
BLOB_KEY = "$blob"

_TOKEN = r"[A-Za-z0-9!#$&^_.+-]+"  # RFC 6838 restricted-name chars
_MIME_RE = re.compile(rf"{_TOKEN}/{_TOKEN}")
_DATA_URI_RE = re.compile(
    rf"data:(?P<mime>{_TOKEN}/{_TOKEN})(?P<params>(?:;{_TOKEN}=[^;,]*)*);base64,(?P<b64>.*)",
    re.DOTALL | re.IGNORECASE,
)
_B64_RE = re.compile(r"[A-Za-z0-9+/]*={0,2}")
_WS = str.maketrans("", "", " \t\r\n")

_MIME_KEYS = ("mime_type", "mimeType", "media_type", "mediaType", "mime", "content_type", "contentType")

# Magic numbers of the formats tools commonly emit.
_MAGIC: tuple[tuple[bytes, str], ...] = (
    (b"\x89PNG\r\n\x1a\n", "image/png"),
    (b"\xff\xd8\xff", "image/jpeg"),
    (b"GIF87a", "image/gif"),
    (b"GIF89a", "image/gif"),
    (b"%PDF-", "application/pdf"),
    (b"OggS", "audio/ogg"),
    (b"fLaC", "audio/flac"),
    (b"ID3", "audio/mpeg"),
    (b"PK\x03\x04", "application/zip"),
)


_AUDIO_FORMATS = {
    "wav": "audio/wav",
    "mp3": "audio/mpeg",
    "flac": "audio/flac",
    "ogg": "audio/ogg",
    "opus": "audio/opus",
    "aac": "audio/aac",
}


def blob_id(user_id: str, data: bytes) -> str:
    """The id of ``data`` stored by ``user_id``: sha256 hex of ``user_id NUL data``."""
    h = hashlib.sha256(user_id.encode("utf-8"))
    h.update(b"\0")
    h.update(data)
    return h.hexdigest()


def blob_ref(blob_id_: str, mime: str, size: int) -> JsonObject:
    """The reference that replaces a payload inline."""
    return {BLOB_KEY: blob_id_, "mime": mime, "bytes": size, "url": BLOB_URL_PREFIX + blob_id_}


def is_blob_ref(value: object) -> bool:
    return isinstance(value, Mapping) and isinstance(value.get(BLOB_KEY), str)


def is_base64_key(key: str) -> bool:
    """Whether a bare base64 string under ``key`` may be externalized."""
    k = key.lower()
    return k in ("data", "base64", "b64", "b64_json", "b64json", "bytes_base64") or k.endswith(("_b64", "_base64", "_b64_json", "-b64", "-base64"))


def decode_base64(text: str) -> bytes | None:
    """Strict standard-alphabet base64 (ASCII whitespace ignored, missing
    padding tolerated); None if ``text`` is anything else."""
    s = text.translate(_WS) if any(c in text for c in " \t\r\n") else text
    if not s or _B64_RE.fullmatch(s) is None:
        return None
    s = s.rstrip("=") if len(s) % 4 else s
    rem = len(s) % 4
    if rem == 1:
        return None
    if rem:
        s += "=" * (4 - rem)
    try:
        data = base64.b64decode(s, validate=True)
    except (binascii.Error, ValueError):
        return None
    return data or None


def parse_data_uri(text: str) -> tuple[str, bytes] | None:
    """``(mime, bytes)`` of a base64 data URI, None for anything else.

    The mime is the lower-cased ``type/subtype`` (parameters dropped)."""
    if not text.startswith(("data:", "DATA:", "Data:")):
        return None
    m = _DATA_URI_RE.fullmatch(text)
    if m is None:
        return None
    data = decode_base64(m.group("b64"))
    if data is None:
        return None
    return m.group("mime").lower(), data


def sniff_mime(data: bytes) -> str | None:
    for magic, mime in _MAGIC:
        if data.startswith(magic):
            return mime
    if data[:4] == b"RIFF" and len(data) >= 12:
        kind = data[8:12]
        if kind == b"WEBP":
            return "image/webp"
        if kind == b"WAVE":
            return "audio/wav"
    if data[4:8] == b"ftyp":
        return "video/mp4"
    return None


def _declared_mime(siblings: Mapping[str, object]) -> str | None:
    for key in _MIME_KEYS:
        value = siblings.get(key)
        if isinstance(value, str) and _MIME_RE.fullmatch(value.strip()):
            return value.strip().lower()
    # OpenAI ``input_audio``: {"data": "<b64>", "format": "wav"}.
    fmt = siblings.get("format")
    if isinstance(fmt, str):
        return _AUDIO_FORMATS.get(fmt.lower())
    return None


class Blobs:
    """Externalizes the large base64 payloads of one user's events."""

    def __init__(self, store: BlobStore, user_id: str) -> None:
        self.store = store
        self.user_id = user_id

    async def data_uri(self, url: str) -> str | None:
        """``engine.ports.PayloadStore.data_uri``: this user's blob as a data URI."""
        if not url.startswith(BLOB_URL_PREFIX):
            return None
        found = await self.store.get_blob(self.user_id, url[len(BLOB_URL_PREFIX) :])
        if found is None:
            return None
        mime, data = found
        return f"data:{mime};base64," + base64.b64encode(data).decode()

    async def externalize(self, payload: object, *, limit: int) -> Any:
        """A copy of ``payload`` with every large base64 value replaced by a
        :func:`blob_ref` (see the module doc); ``payload`` itself is not changed.

        Dicts and lists (tuples become lists) are copied; other values are
        returned as they are. Deterministic: equal inputs give equal outputs.
        """
        if limit < 0:
            raise ValueError("limit must be >= 0")
        done: dict[bytes, JsonObject] = {}  # one put per distinct payload
        return await self._walk(payload, limit, None, None, done)

    async def _walk(
        self,
        value: object,
        limit: int,
        key: str | None,
        siblings: Mapping[str, object] | None,
        done: dict[bytes, JsonObject],
    ) -> object:
        if isinstance(value, str):
            if len(value) <= limit:
                return value
            return await self._string(value, key, siblings, done)
        if isinstance(value, Mapping):
            return {k: await self._walk(v, limit, k if isinstance(k, str) else None, value, done) for k, v in value.items()}
        if isinstance(value, (list, tuple)):
            # Items of a list inherit its key: {"b64_json": ["...", "..."]}.
            return [await self._walk(v, limit, key, siblings, done) for v in value]
        return value

    async def _string(
        self,
        text: str,
        key: str | None,
        siblings: Mapping[str, object] | None,
        done: dict[bytes, JsonObject],
    ) -> str | JsonObject:
        parsed = parse_data_uri(text)
        if parsed is not None:
            mime, data = parsed
        elif key is not None and is_base64_key(key):
            decoded = decode_base64(text)
            if decoded is None:
                return text
            data = decoded
            known = (_declared_mime(siblings) if siblings is not None else None) or sniff_mime(data)
            if known is None and key.lower() == "data":
                # "data" also names plain text: only bytes that say what they are.
                return text
            mime = known or "application/octet-stream"
        else:
            return text
        memo_key = mime.encode() + b"\0" + data
        ref = done.get(memo_key)
        if ref is None:
            ident = await self.store.put_blob(self.user_id, data, mime)
            ref = done[memo_key] = blob_ref(ident, mime, len(data))
        return dict(ref)
