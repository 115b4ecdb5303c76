"""Blobs: the bytes behind the ``{"$blob": id, "url": "/v1/blobs/<id>"}``
references that ``engine.blobs.Blobs.externalize`` leaves in events.

``GET /v1/blobs/{blob_id}`` answers the stored bytes with their mime as
``Content-Type``; an unknown id and another user's are the same 404 (the OpenAI
error shape), so ids leak nothing.

The bytes come from tool output, so the mime is not trusted as a document
type: the answer carries ``X-Content-Type-Options: nosniff`` and a sandboxing
``Content-Security-Policy`` (an HTML or SVG blob opened in a browser runs no
script on our origin), and a mime that is not a plain ``type/subtype`` is
served as ``application/octet-stream``. Blobs are content-addressed, hence
immutable: the id is the ETag and the answer may be cached privately.
"""

from __future__ import annotations

import re
from typing import cast

from aiohttp import web

from adapters.http.auth import USER
from adapters.http.context import services
from adapters.http.errors import not_found
from engine.blobs import BLOB_URL_PREFIX
from engine.ports import BlobStore

_BLOB_ID = re.compile(r"[0-9a-f]{64}")
_MIME = re.compile(r"[A-Za-z0-9!#$&^_.+-]+/[A-Za-z0-9!#$&^_.+-]+")

ROUTE = BLOB_URL_PREFIX + "{blob_id}"


async def get_blob(request: web.Request) -> web.Response:
    blob_id = request.match_info["blob_id"]
    if _BLOB_ID.fullmatch(blob_id) is None:
        raise not_found("blob")
    store = cast(BlobStore, services(request).store)
    found = await store.get_blob(request[USER], blob_id)
    if found is None:
        raise not_found("blob")
    mime, data = found
    etag = f'"{blob_id}"'
    headers = {
        "ETag": etag,
        "Cache-Control": "private, max-age=31536000, immutable",
        "X-Content-Type-Options": "nosniff",
        "Content-Security-Policy": "default-src 'none'; style-src 'unsafe-inline'; sandbox",
    }
    if etag in {t.strip() for t in request.headers.get("If-None-Match", "").split(",")}:
        return web.Response(status=304, headers=headers)
    content_type = mime if _MIME.fullmatch(mime or "") else "application/octet-stream"
    return web.Response(body=data, content_type=content_type, headers=headers)


def setup(app: web.Application) -> None:
    app.router.add_get(ROUTE, get_blob)
