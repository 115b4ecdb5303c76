"""One callback per loop pass ends the bursts of every direct SSE stream
(``adapters.http.live_sinks``); the streams here are the mechanism's inputs,
shaped as ``DirectSSE`` is towards it (a loop, a burst, ``_end_burst``)."""

from __future__ import annotations

import asyncio
import gc
import weakref
from typing import Any

from adapters.http import live_sinks


class Stream:
    def __init__(self, loop: asyncio.AbstractEventLoop, fails: bool = False) -> None:
        self._loop = loop
        self.burst: list[bytes] | None = [b"x"]
        self.failed: BaseException | None = None
        self.ended = 0
        self.fails = fails

    def _end_burst(self) -> None:
        self.ended += 1
        if self.fails:
            raise RuntimeError("boom")
        self.burst = None


async def test_one_callback_ends_every_open_burst_and_a_failure_stops_only_its_stream() -> None:
    loop = asyncio.get_running_loop()
    ends = live_sinks._ENDS.get(loop)
    assert live_sinks._ENDS.get(loop) is ends  # one per loop
    streams = [Stream(loop), Stream(loop, fails=True), Stream(loop)]
    scheduled = []
    real_call_soon = loop.call_soon

    def counting(callback: Any, *args: Any, **kwargs: Any) -> Any:
        scheduled.append(callback)
        return real_call_soon(callback, *args, **kwargs)

    setattr(loop, "call_soon", counting)  # noqa: B010 - an instance attribute shadows the method until deleted
    try:
        for stream in streams:
            ends.add(stream)  # type: ignore[arg-type]
    finally:
        del loop.call_soon
    assert len(scheduled) == 1
    done = loop.create_future()
    loop.call_soon(done.set_result, None)  # runs after the burst end, in the next pass
    await done
    assert [s.ended for s in streams] == [1, 1, 1]
    assert streams[0].burst is None and streams[2].burst is None
    assert streams[1].burst is None and isinstance(streams[1].failed, RuntimeError)


def test_a_closed_loop_is_not_kept_alive() -> None:
    loop = asyncio.new_event_loop()
    live_sinks._ENDS.get(loop)
    gone = weakref.ref(loop)
    loop.close()
    del loop
    gc.collect()
    assert gone() is None
