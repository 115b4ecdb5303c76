"""An OpenAI-compatible upstream that misbehaves at the socket level.

``tests.upstream.ScriptedUpstream`` speaks through aiohttp, which always sends
whole headers at once; the faults here need raw bytes on the socket:

* ``"no_headers"``: reads the request and never answers (the socket stays open);
* ``"slow_headers"``: sends the status line and headers one byte per ``interval``;
* ``"slow_loris"``: sends whole headers of a chunked SSE response, then the
  body one byte per ``interval``, never completing an event;
* ``"endless_event"``: sends headers, then one ``data:`` line of ``size`` bytes
  at full speed that never ends.

``GET /v1/models`` is answered properly (the service's catalog asks for it).
"""

from __future__ import annotations

import asyncio
import json
from typing import Literal

Mode = Literal["no_headers", "slow_headers", "slow_loris", "endless_event"]

SSE_HEADERS = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\ncache-control: no-cache\r\n\r\n"


class StallingUpstream:
    def __init__(self, mode: Mode, *, interval: float = 0.05, size: int = 20 * 1024 * 1024) -> None:
        self.mode = mode
        self.interval = interval
        self.size = size
        self.chat_requests = 0
        self.body_bytes_sent = 0
        self._server: asyncio.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()

    @property
    def url(self) -> str:
        assert self._server is not None
        return f"http://127.0.0.1:{self._server.sockets[0].getsockname()[1]}/v1"

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)

    async def close(self) -> None:
        for writer in list(self._writers):
            writer.transport.abort()
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._writers.add(writer)
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                request_line, *lines = head.decode("latin-1").split("\r\n")
                headers = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines if line)}
                length = int(headers.get("content-length", "0"))
                if length:
                    await reader.readexactly(length)
                method, path, _ = request_line.split(" ", 2)
                if method == "GET" and path.endswith("/models"):
                    body = json.dumps({"object": "list", "data": [{"id": "gpt-test", "object": "model", "created": 0, "owned_by": "stall"}]}).encode()
                    writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n%s" % (len(body), body))
                    await writer.drain()
                    continue
                self.chat_requests += 1
                await self._misbehave(writer)
                return
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            self._writers.discard(writer)
            writer.close()

    async def _misbehave(self, writer: asyncio.StreamWriter) -> None:
        if self.mode == "no_headers":
            await asyncio.Event().wait()  # until the server closes
        if self.mode == "slow_headers":
            for byte in SSE_HEADERS:
                writer.write(bytes([byte]))
                await writer.drain()
                await asyncio.sleep(self.interval)
            await asyncio.Event().wait()
        writer.write(SSE_HEADERS)
        if self.mode == "slow_loris":
            for byte in b"data: " + b'{"id":"x","object":"chat.completion.chunk"' * 1000:
                writer.write(b"1\r\n" + bytes([byte]) + b"\r\n")  # a chunk of one byte
                await writer.drain()
                self.body_bytes_sent += 1
                await asyncio.sleep(self.interval)
        else:  # endless_event
            piece = b"x" * 65536
            writer.write(b"%x\r\ndata: \r\n" % 6)
            while self.body_bytes_sent < self.size:
                writer.write(b"%x\r\n%s\r\n" % (len(piece), piece))
                await writer.drain()
                self.body_bytes_sent += len(piece)
        await asyncio.Event().wait()
