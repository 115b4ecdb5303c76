"""Outgoing WebSocket frames of one connection, written together.

aiohttp's ``send_frame`` writes each frame to the transport on its own, and
uvloop's ``transport.write`` sends at once when the socket buffer is empty:
one ``send`` system call per message. A streamed chunk makes a ``delta``
message and, one delta window later, the ``event`` that made it durable, and a
fast read's chunks make a ``delta`` each; with thousands of connections those
system calls were a fifth of the process's samples (bench ``thousands_ws``).

``FrameOutbox`` frames the messages itself (RFC 6455: FIN, a text opcode, the
length; a server never masks) and writes all the frames of one ``add`` (what
the pump renders from one batch of the turn's tail, or the ``delta``
messages of one published read) with ONE ``transport.write``, at once, so no
message waits for the end of the loop's pass. The frames are the ones
aiohttp would write; order is the order of ``add``. Flow control is
aiohttp's: the bytes go to the same transport, whose high-water mark pauses
writing; ``drain`` waits for it as aiohttp's ``send_frame`` does, and
``adapters.http.stall`` watches the same buffer. A connection that
negotiated permessage-deflate is not handled here (``usable`` is False): its
frames need aiohttp's compressor state, so they take aiohttp's own path.

A paced chunk's ``delta`` and its ``event`` never come together (the event
follows a delta window later), so that alone still made two writes per
chunk. A frame added with ``hold`` (the pump's ``model.delta`` events, whose
text the client already has from the ``delta`` messages) waits for the
connection's next message, the next chunk's ``delta``, and goes out with it,
at most ``HOLD_SECONDS`` later: about one write per chunk instead of two
(bench ``thousands_ws``, ``strace -c``).
"""

from __future__ import annotations

import asyncio
import struct
from typing import Any

from aiohttp import web

#: The longest a held frame (``add(..., hold=True)``) waits for company.
HOLD_SECONDS = 1.0

_TEXT_FIN = 0x81  # FIN bit + opcode 1 (text)
_LEN2 = struct.Struct("!BBH").pack
_LEN8 = struct.Struct("!BBQ").pack


def text_frame(payload: bytes) -> bytes:
    """One unmasked, uncompressed text frame holding ``payload`` (UTF-8 JSON)."""
    n = len(payload)
    if n < 126:
        return bytes((_TEXT_FIN, n)) + payload
    if n < 65536:
        return _LEN2(_TEXT_FIN, 126, n) + payload
    return _LEN8(_TEXT_FIN, 127, n) + payload


class FrameOutbox:
    """One connection's frames: written together, held ones kept until the next write."""

    def __init__(self, ws: web.WebSocketResponse, protocol: Any) -> None:
        self._ws = ws
        self._protocol = protocol
        self._loop = asyncio.get_running_loop()
        self._pending: list[bytes] = []
        self._hold_timer: asyncio.TimerHandle | None = None  # the flush of held frames
        self._lock = asyncio.Lock()  # one drain waiter at a time (aiohttp shares one future)
        # Frames aiohttp's compressor must make (its deflate context spans frames).
        self.usable = not ws.compress

    def _transport(self) -> Any:
        transport = self._protocol.transport
        if transport is None or transport.is_closing() or self._ws.closed:
            return None
        return transport

    @property
    def ready(self) -> bool:
        """A synchronous writer may add now: the connection is open and the
        client keeps up (writing not paused by the transport's high-water mark)."""
        return self._transport() is not None and not self._protocol.writing_paused

    def add(self, payloads: list[bytes], *, hold: bool = False) -> None:
        """Write messages (encoded JSON), with any frames held before them, in
        one ``transport.write``.

        ``hold``: instead, keep them for the next messages added without it
        (one write for both), at most ``HOLD_SECONDS``. Raises
        ``ConnectionResetError`` once the connection is gone, as aiohttp's
        ``send_frame`` does, so a pump stops."""
        if self._transport() is None:
            raise ConnectionResetError("Cannot write to closing transport")
        self._pending.extend(text_frame(p) for p in payloads)
        if not hold:
            self.flush()
        elif self._hold_timer is None:
            self._hold_timer = self._loop.call_later(HOLD_SECONDS, self.flush)

    def flush(self) -> None:
        """Write the held frames now. After a close frame nothing may follow:
        then they are dropped, as the client asked to stop."""
        if self._hold_timer is not None:
            self._hold_timer.cancel()
            self._hold_timer = None
        pending = self._pending
        if not pending:
            return
        self._pending = []
        transport = self._transport()
        if transport is not None:
            transport.write(pending[0] if len(pending) == 1 else b"".join(pending))

    async def drain(self) -> None:
        """Wait while the client is behind (the transport paused writing)."""
        if self._protocol.writing_paused:
            async with self._lock:
                if self._protocol.writing_paused:
                    await self._protocol._drain_helper()
