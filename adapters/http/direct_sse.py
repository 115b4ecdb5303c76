"""Live SSE output written from the turn actor's publish (``engine.run.follow.DirectOutput``).

Without it every streamed chunk wakes the handler's task (one event-loop hop
and task switch per chunk); with many concurrent paced streams that hop is
most of the latency turnlog adds.
"""

from __future__ import annotations

import asyncio
import logging
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
    """``engine.run.follow.DirectOutput`` for an SSE response: live chunks are
    rendered and written inside the actor's publish, not by this handler's task.

    The first chunk of a burst (what one upstream read carried) is written at
    once; the rest of the burst is collected and written in one piece by a
    callback at the end of the loop's pass, so a fast stream still makes one
    write per read, not one per chunk. ``StreamResponse.write`` only suspends
    to wait for a backed-up socket (then ``ready`` is False); should it suspend
    anyway, a task finishes it and later writes queue behind it.
    """

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
