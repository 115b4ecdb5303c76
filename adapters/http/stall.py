"""Dropping a client that stopped reading (docs/guides/drain-and-faults.md).

A streaming client (SSE or WebSocket) that reads nothing never slows its turn:
the turn writes the log, not the socket. What such a client costs is bounded
on its own — the transport pauses writing at its high-water mark, the live
subscription queues a bounded number of messages and then catches up from
the log — but a handler waiting for a socket that never drains would hold
its connection, its follower (the fold of the turn so far) and the last
write's bytes for as long as the peer keeps the TCP connection open, which
may be forever.

``StallGuard`` ends that: while the server's send buffer towards the client
stays backed up (writing paused) and does not shrink at all for
``seconds``, the connection is reset (``SO_LINGER`` 0, then
``transport.abort()``; a ``close()`` would wait for the buffer to flush,
which a peer that reads nothing never lets happen). The handler's pending write then fails as a
disconnect does, its subscription closes, and the client, if it ever comes
back, reconnects and catches up from the log (``GET /v1/turns/{id}/stream``
with ``Last-Event-ID``, or a WebSocket ``subscribe`` with ``after``).

A slow reader is not a stalled one: any byte it takes shrinks the buffer and
restarts the clock. The check is a timer per connection every
``seconds / 4``, nothing per streamed chunk.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import struct
from typing import Any

log = logging.getLogger("turnlog.http")

#: Checks per stall period: the drop comes between ``seconds`` and
#: ``1.25 × seconds`` after the client's last read.
CHECKS_PER_PERIOD = 4


class StallGuard:
    """Watches one connection; ``stop()`` when its handler is done with it."""

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
