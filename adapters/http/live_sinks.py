"""The socket side of live output: how a streamed chunk reaches a client's
socket without waking the client's task (the ``LiveSink`` of
``engine.ports``: SSE streams and WebSocket subscriptions), in as few writes
as the order allows, and how a client that stopped reading is dropped.

SSE (``DirectSSE``, the ``engine.run.follow.DirectOutput`` of a stream):
live output written from the turn actor's publish. Without it every streamed
chunk wakes the handler's task (one event-loop hop and task switch per
chunk); with many concurrent paced streams that hop is most of the latency
turnlog adds.

WebSocket (``FrameOutbox``): outgoing frames of one connection, written together.

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
``StallGuard`` watches the same buffer. A connection that
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
import logging
import socket
import struct
from typing import Any, Protocol

from aiohttp import web

from engine.run.per_loop import PerLoop

log = logging.getLogger("turnlog.http")


class Renderer(Protocol):
    """What renders a follower's output as SSE bytes (chat chunks, Responses events)."""

    view: Any
    last_sent: int
    done: bool  # the stream has sent its end

    def render(self, outs: list[Any]) -> bytes: ...


class DirectSSE:
    """``engine.run.follow.DirectOutput`` for an SSE response. The first chunk
    of a burst (what one upstream read carried) is written at once; the rest
    of the burst is collected and written in one piece by a callback at the
    end of the loop's pass, so a fast stream still makes one write per read,
    not one per chunk. ``StreamResponse.write`` only suspends to wait for a
    backed-up socket (then ``ready`` is False); should it suspend anyway, a
    task finishes it and later writes queue behind it."""

    def __init__(self, request: web.Request, response: web.StreamResponse) -> None:
        self.protocol = request.protocol
        self.response = response
        self.renderer: Renderer | None = None
        self.pending: asyncio.Task[None] | None = None
        self.failed: BaseException | None = None
        self.burst: list[bytes] | None = None
        self._loop = asyncio.get_running_loop()
        self._ends = _ENDS.get(self._loop)

    def ready(self) -> bool:
        return (
            self.renderer is not None
            and self.failed is None
            and (self.pending is None or self.pending.done())
            and self.protocol.transport is not None
            and not self.protocol.writing_paused
        )

    def deliver(self, follower: Any, outs: list[Any]) -> None:
        renderer = self.renderer
        assert renderer is not None
        renderer.view = follower.view
        sent = renderer.last_sent
        try:
            data = renderer.render(outs)
        except BaseException:
            renderer.last_sent = sent  # nothing of it went out: the handler renders it again
            raise
        if not data:
            return
        if self.burst is not None:
            self.burst.append(data)
            return
        self.burst = []
        self._ends.add(self)
        self._write(data)

    def _end_burst(self) -> None:
        burst, self.burst = self.burst, None
        if burst:
            self._write(b"".join(burst))

    def _write(self, data: bytes) -> None:
        if self.failed is not None:
            return
        if self.pending is not None and not self.pending.done():
            self.pending = self._loop.create_task(_write_after(self.pending, self.response, data))
            return
        coro = self.response.write(data)
        try:
            yielded = coro.send(None)
        except StopIteration:
            return
        except Exception as exc:  # the client went away: the handler's task raises it
            self.failed = exc
            return
        self.pending = self._loop.create_task(_finish_write(coro, yielded))

    async def settle(self) -> None:
        """Before the handler's own write: everything direct is written first."""
        if self.burst:
            burst, self.burst = self.burst, None
            self._write(b"".join(burst))
        if self.pending is not None:
            pending, self.pending = self.pending, None
            await pending
        if self.failed is not None:
            failed, self.failed = self.failed, None
            raise failed


class _BurstEnds:
    """Ends the open bursts of one loop's direct streams at the end of the
    loop's pass: one callback per pass for all of them, not one per stream
    and chunk (with 2,000 paced streams, 4,000 callbacks a second less)."""

    __slots__ = ("_open", "_scheduled")

    def __init__(self) -> None:
        # No reference to the loop: it is this object's key (engine.run.per_loop).
        self._open: list[DirectSSE] = []
        self._scheduled = False

    def add(self, sse: DirectSSE) -> None:
        self._open.append(sse)
        if not self._scheduled:
            self._scheduled = True
            sse._loop.call_soon(self._end)

    def _end(self) -> None:
        self._scheduled = False
        opened, self._open = self._open, []
        for sse in opened:
            try:
                sse._end_burst()  # (its write keeps its own failure)
            except Exception as exc:  # never leave the others' bursts open
                sse.burst = None
                sse.failed = exc  # this stream's handler raises it (settle)
                log.exception("direct SSE: a burst could not be written")


_ENDS: PerLoop[_BurstEnds] = PerLoop(lambda _loop: _BurstEnds())


async def _finish_write(coro: Any, yielded: Any) -> None:
    """Drive a coroutine that suspended on its first step (on a future) to its end."""
    while True:
        await asyncio.wait((yielded,))
        try:
            yielded = coro.send(None)
        except StopIteration:
            return


async def _write_after(previous: asyncio.Task[None], response: web.StreamResponse, data: bytes) -> None:
    await previous
    await response.write(data)


# --------------------------------------------------------------------------- WebSocket frames


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


# --------------------------------------------------------------------------- stalled clients


#: Checks per stall period: the drop comes between ``seconds`` and
#: ``1.25 × seconds`` after the client's last read.
CHECKS_PER_PERIOD = 4


class StallGuard:
    """Drops a client that stopped reading (docs/guides/drain-and-faults.md);
    ``stop()`` when the connection's handler is done with it.

    Such a client never slows its turn (the turn writes the log, not the
    socket), and what it costs is bounded (the transport pauses writing at
    its high-water mark; the live subscription queues a bounded number of
    messages, then catches up from the log), but its handler, waiting for a
    socket that never drains, would hold the connection, its follower (the
    fold of the turn so far) and the last write's bytes for as long as the
    peer keeps the TCP connection open, which may be forever. So while the
    send buffer stays backed up (writing paused) and does not shrink at all
    for ``seconds``, the connection is reset (``_reset``): the handler's
    pending write fails as a disconnect does, and the client, if it comes
    back, catches up from the log. A slow reader is not a stalled one: any
    byte it takes restarts the clock. The check is a timer per connection
    every ``seconds / 4``, nothing per streamed chunk.
    """

    def __init__(self, protocol: Any, seconds: float, what: str) -> None:
        self._protocol = protocol
        self._seconds = seconds
        self._what = what
        self._loop = asyncio.get_running_loop()
        self._since: float | None = None  # when the buffer was first seen stuck
        self._size = -1
        self._timer: asyncio.TimerHandle | None = None
        self.dropped = False
        if seconds > 0:
            self._schedule()

    def _schedule(self) -> None:
        self._timer = self._loop.call_later(self._seconds / CHECKS_PER_PERIOD, self._check)

    def _check(self) -> None:
        self._timer = None
        transport = getattr(self._protocol, "transport", None)
        if transport is None or (transport.is_closing() and not self._protocol.writing_paused):
            return  # gone: nothing to watch
        size = transport.get_write_buffer_size()
        if not self._protocol.writing_paused or size < self._size:
            self._since = None  # the client reads (or nothing waits for it)
        elif self._since is None:
            self._since = self._loop.time()
        elif self._loop.time() - self._since >= self._seconds:
            self.dropped = True
            log.warning(
                "%s: the client read nothing for %g s (%d bytes waiting): disconnected; it can reconnect and catch up from the log",
                self._what,
                self._seconds,
                size,
            )
            _reset(transport)
            return
        self._size = size
        self._schedule()

    def stop(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None


def _reset(transport: Any) -> None:
    """Abort with a TCP reset: a plain close would queue the FIN behind the
    bytes the peer never reads, keeping the connection (and the kernel's send
    buffer) alive; ``SO_LINGER`` 0 discards them and tells the peer at once."""
    sock = transport.get_extra_info("socket")
    if sock is not None:
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        except OSError:
            pass
    transport.abort()
