"""A hand-written SSE body sent in pieces whose boundaries are network reads.

Writing pieces with a pause between them only makes separate reads likely, on
a fast machine. Here piece ``k`` is written only once the client has
*received* ``k`` payloads, so the client has read piece ``k - 1`` before piece
``k`` exists; a small write on loopback arrives whole, so a line cut at a piece
boundary arrives in two reads, however slow or busy the machine is.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

from aiohttp import web

from engine.ports import RawChunk, RawWarning


class Stepped:
    """Serve ``pieces`` in order; piece ``k`` waits for ``k`` received payloads
    (count them with :meth:`collect`). So each piece but the last must complete
    at least one payload, or the stream stalls (give the provider a short idle
    timeout: the stall then fails the test quickly)."""

    def __init__(self, *pieces: bytes) -> None:
        self.pieces = pieces
        self.received = 0
        self._progress = asyncio.Event()

    async def handler(self, request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        for k, piece in enumerate(self.pieces):
            while self.received < k:
                await self._progress.wait()
                self._progress.clear()
            await resp.write(piece)
        await resp.write_eof()
        return resp

    async def collect(self, stream: AsyncIterator[RawChunk | RawWarning]) -> list[RawChunk | RawWarning]:
        items: list[RawChunk | RawWarning] = []
        async for item in stream:
            items.append(item)
            self.received += 1
            self._progress.set()
        return items
