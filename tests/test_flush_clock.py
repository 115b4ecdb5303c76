"""The flush clock: every window sealed within its interval, never later;
windows due close together share one loop timer.

A loop whose clock the test sets (``ManualLoop``, which can also run its
timers late, as a saturated loop does) shows the deadlines and the timers
exactly; one test runs on the real event loop and checks the bound
against ``loop.time()``; one runs the service on both backends and checks it
against the time an SSE client received each chunk.
"""

from __future__ import annotations

import asyncio
import gc
import heapq
import itertools
import json
import time
import weakref
from pathlib import Path
from typing import Any

import pytest

from engine.run.flush_clock import MAX_TICK, STALE_AFTER, FlushClock
from tests.harness import make_settings, start_service, stop_service
from tests.upstream import Reply, ScriptedUpstream


class ManualLoop:
    """The part of an event loop the clock uses, with a clock the test moves."""

    def __init__(self) -> None:
        self.now = 1000.0
        self.timers: list[tuple[float, int, Any, tuple[Any, ...]]] = []
        self.timers_made = 0
        self.errors: list[dict[str, Any]] = []
        self._order = itertools.count()
        # How late each timer runs: a saturated loop's callbacks queue behind others.
        self.lateness = 0.0

    def time(self) -> float:
        return self.now

    def call_at(self, when: float, callback: Any, *args: Any) -> None:
        self.timers_made += 1
        heapq.heappush(self.timers, (when, next(self._order), callback, args))

    def call_soon(self, callback: Any, *args: Any) -> None:
        self.call_at(self.now, callback, *args)

    def call_exception_handler(self, context: dict[str, Any]) -> None:
        self.errors.append(context)

    def run_until(self, t: float) -> None:
        while self.timers and self.timers[0][0] + self.lateness <= t:
            when, _, callback, args = heapq.heappop(self.timers)
            self.now = max(self.now, when + self.lateness)
            callback(*args)
        self.now = max(self.now, t)


def test_each_window_is_sealed_within_its_interval_and_close_ones_share_a_timer() -> None:
    loop = ManualLoop()
    clock = FlushClock(loop)  # type: ignore[arg-type]
    delay = 0.05
    fired: dict[int, float] = {}
    opened: dict[int, float] = {}
    # 200 windows opened 0.3 ms apart (60 ms in all), as many paced streams would
    for token in range(200):
        opened[token] = loop.now
        clock.call_within(delay, lambda t: fired.__setitem__(t, loop.now), token)
        loop.run_until(loop.now + 0.0003)
    loop.run_until(loop.now + 1.0)

    assert sorted(fired) == list(range(200))
    tick = min(delay / 10, MAX_TICK)
    for token, at in fired.items():
        waited = at - opened[token]
        assert delay - tick - 1e-9 <= waited <= delay + 1e-9, (token, waited)
    # one timer per grid point: 60 ms of openings on a 5 ms grid, not 200 timers
    assert loop.timers_made <= 60 / (tick * 1000) + 2, loop.timers_made
    assert len({round(at, 9) for at in fired.values()}) == loop.timers_made


def test_a_short_interval_keeps_its_windows_apart() -> None:
    """The grid is at most a tenth of the interval: 1 ms windows are not held
    5 ms, nor sealed early by more than 0.1 ms."""
    loop = ManualLoop()
    clock = FlushClock(loop)  # type: ignore[arg-type]
    fired: list[float] = []
    clock.call_within(0.001, lambda _: fired.append(loop.now), 0)
    loop.run_until(loop.now + 0.01)
    assert len(fired) == 1 and 0.0009 - 1e-9 <= fired[0] - 1000.0 <= 0.001 + 1e-9


def test_a_failing_callback_does_not_stop_the_others_due_with_it() -> None:
    loop = ManualLoop()
    clock = FlushClock(loop)  # type: ignore[arg-type]
    fired: list[int] = []

    def seal(token: int) -> None:
        if token == 1:
            raise RuntimeError("this window's store is gone")
        fired.append(token)

    for token in range(3):
        clock.call_within(0.05, seal, token)
    loop.run_until(loop.now + 1.0)
    assert fired == [0, 2]
    assert len(loop.errors) == 1 and isinstance(loop.errors[0]["exception"], RuntimeError)


async def test_on_the_real_loop_no_window_waits_longer_than_its_interval() -> None:
    loop = asyncio.get_running_loop()
    clock = FlushClock.of(loop)
    assert FlushClock.of(loop) is clock  # one per loop
    delay = 0.03
    done = loop.create_future()
    opened: dict[int, float] = {}
    waited: dict[int, float] = {}

    def seal(token: int) -> None:
        waited[token] = loop.time() - opened[token]
        if len(waited) == 20 and not done.done():
            done.set_result(None)

    for token in range(20):
        opened[token] = loop.time()
        clock.call_within(delay, seal, token)
        await asyncio.sleep(0.001)  # windows opening over ~20 ms (not a synchronization)
    await asyncio.wait_for(done, 5)
    tick = min(delay / 10, MAX_TICK)
    # never sealed before its grid point; the loop's own lateness is all above that
    assert min(waited.values()) >= delay - tick - 0.002, waited


@pytest.mark.parametrize("delay", [0.0, -1.0])
def test_no_interval_seals_at_once(delay: float) -> None:
    loop = ManualLoop()
    clock = FlushClock(loop)  # type: ignore[arg-type]
    fired: list[int] = []
    clock.call_within(delay, fired.append, 7)
    loop.run_until(loop.now)
    assert fired == [7]


async def test_a_paced_streams_windows_are_sealed_by_time_on_the_service(tmp_path: Path, upstream: ScriptedUpstream, database_url: str) -> None:
    """Chunks 1.5 s apart with a 0.3 s interval: each chunk is a window of its
    own, sealed (its ``model.delta``'s ``at``) about 0.3 s after the client got
    the chunk: not at once, and not only when the next chunk comes; the last
    one with the answer's end."""
    interval = 0.3
    svc = await start_service(make_settings(tmp_path, upstream.url, database_url=database_url, flush_interval=interval), upstream)
    try:
        chunks = ["one ", "two ", "three"]
        upstream.enqueue(Reply(chunks=chunks, delay=1.5))
        received: list[tuple[float, str]] = []
        async with svc.http.post(
            svc.v1 + "/chat/completions", json={"model": "gpt-test", "messages": [{"role": "user", "content": "q"}], "stream": True}
        ) as resp:
            assert resp.status == 200
            turn_id = resp.headers["X-Turn-Id"]
            async for line in resp.content:
                if not line.startswith(b"data: {"):
                    continue
                content = json.loads(line[6:])["choices"][0]["delta"].get("content")
                if content:
                    received.append((time.time(), content))
        await svc.wait_status(turn_id, "completed")
        windows = [e for e in await svc.events(turn_id) if e["type"] == "model.delta"]
        assert [w["data"]["text"] for w in windows] == chunks == [c for _, c in received]
        sealed_after = [w["at"] - got_at for w, (got_at, _) in zip(windows, received)]
        # the service had a chunk before the client did: a little earlier than the
        # interval minus the grid is possible, sealing at once is not
        for text, after in zip(chunks[:-1], sealed_after[:-1]):
            assert interval - 0.1 <= after <= interval + 1.0, (text, after)
        # the last window goes with the end of the answer, before its interval is up
        assert sealed_after[-1] < interval - 0.1, sealed_after
    finally:
        await stop_service(svc)


def test_a_closed_loop_is_not_kept_alive_by_its_clock() -> None:
    loop = asyncio.new_event_loop()
    clock = FlushClock.of(loop)
    clock.call_within(0.3, lambda token: None, 1)  # a pending grid point too
    gone = weakref.ref(loop)
    loop.close()
    del loop, clock
    gc.collect()
    assert gone() is None


def _sealed_after(loop: ManualLoop, clock: FlushClock, delay: float, stretch_to: float) -> float:
    """How long one window opened now stays open (the loop's own lateness, which
    only delays the timer's run, taken out)."""
    fired: list[float] = []
    opened = loop.now
    clock.call_within(delay, lambda _: fired.append(loop.now), 0, stretch_to)
    loop.run_until(loop.now + stretch_to + loop.lateness + 1.0)
    assert len(fired) == 1
    return fired[0] - loop.lateness - opened


def _run_late(loop: ManualLoop, clock: FlushClock, lateness: float, windows: int = 60) -> None:
    """``windows`` windows of 50 ms, each timer run ``lateness`` late."""
    loop.lateness = lateness
    for token in range(windows):
        clock.call_within(0.05, lambda _: None, token)
        loop.run_until(loop.now + 0.05 + lateness + 0.001)


@pytest.mark.parametrize(
    ("lateness", "expected"),
    [
        (0.0, 0.05),  # on time: the interval as it is
        (0.004, 0.05),  # the loop's jitter (below 5 ms) does not stretch
        (0.01, 0.05 + 40 * 0.005),  # 40 s of window per second late beyond 5 ms
        (0.02, 0.05 + 40 * 0.015),
        (0.3, 1.0),  # never beyond the bound the caller gave
    ],
)
def test_a_late_loop_stretches_the_windows_that_allow_it(lateness: float, expected: float) -> None:
    loop = ManualLoop()
    clock = FlushClock(loop)  # type: ignore[arg-type]
    _run_late(loop, clock, lateness)
    tick = MAX_TICK
    got = _sealed_after(loop, clock, 0.05, 1.0)
    # 60 timers in, the clock's lateness is within 0.2 % of the loop's
    assert expected - tick - 0.01 * expected <= got <= expected + 1e-9, (lateness, got)
    # a window that allows no stretch keeps its interval, however late the loop
    assert 0.05 - tick - 1e-9 <= _sealed_after(loop, clock, 0.05, 0.05) <= 0.05 + 1e-9


def test_the_stretch_goes_when_the_loop_catches_up() -> None:
    loop = ManualLoop()
    clock = FlushClock(loop)  # type: ignore[arg-type]
    _run_late(loop, clock, 0.1)
    assert _sealed_after(loop, clock, 0.05, 1.0) > 0.9
    # back on time: within a few dozen timers the windows are back to 50 ms
    _run_late(loop, clock, 0.0)
    assert _sealed_after(loop, clock, 0.05, 1.0) <= 0.05 + 1e-9


def test_an_old_lateness_does_not_stretch_a_window_after_an_idle_spell() -> None:
    loop = ManualLoop()
    clock = FlushClock(loop)  # type: ignore[arg-type]
    _run_late(loop, clock, 0.1)
    loop.lateness = 0.0
    loop.run_until(loop.now + STALE_AFTER + 0.5)  # nothing to seal meanwhile: no timer measured the loop
    assert _sealed_after(loop, clock, 0.05, 1.0) <= 0.05 + 1e-9


async def _window_gauge(svc: Any) -> float:
    async with svc.http.get(svc.url + "/metrics") as resp:
        assert resp.status == 200
        text = await resp.text()
    (line,) = [line for line in text.splitlines() if line.startswith("turnlog_delta_window_seconds ")]
    return float(line.split()[1])


async def _stream_with_a_busy_loop(
    tmp_path: Path, upstream: ScriptedUpstream, database_url: str, max_interval: float
) -> tuple[list[str], list[dict[str, Any]], tuple[float, float]]:
    """A paced answer (24 chunks, 50 ms apart) while something else holds the
    event loop 40 ms of every 50 (the service, its store's callbacks and the
    upstream share it): what the client received, the turn's windows, and the
    window the service's ``/metrics`` reported before and at the end of the load."""
    await asyncio.to_thread(tmp_path.mkdir)
    settings = make_settings(tmp_path, upstream.url, database_url=database_url, flush_interval=0.02, flush_max_interval=max_interval, lease_seconds=60.0)
    svc = await start_service(settings, upstream)
    loop = asyncio.get_running_loop()
    hogging = True

    def hog() -> None:
        if hogging:
            time.sleep(0.04)  # the load: the loop runs nothing else meanwhile
            loop.call_later(0.01, hog)

    try:
        idle = await _window_gauge(svc)
        upstream.enqueue(Reply(chunks=[f"c{i} " for i in range(24)], delay=0.05))
        loop.call_soon(hog)
        received: list[str] = []
        async with svc.http.post(
            svc.v1 + "/chat/completions", json={"model": "gpt-test", "messages": [{"role": "user", "content": "q"}], "stream": True}
        ) as resp:
            assert resp.status == 200
            turn_id = resp.headers["X-Turn-Id"]
            async for line in resp.content:
                if line.startswith(b"data: {"):
                    content = json.loads(line[6:])["choices"][0]["delta"].get("content")
                    if content:
                        received.append(content)
        busy = await _window_gauge(svc)
        hogging = False
        await svc.wait_status(turn_id, "completed")
        return received, [e for e in await svc.events(turn_id) if e["type"] == "model.delta"], (idle, busy)
    finally:
        hogging = False
        await stop_service(svc)


async def test_on_a_busy_service_windows_stretch_and_keep_every_chunk(tmp_path: Path, upstream: ScriptedUpstream, database_url: str) -> None:
    """The same stream on a loop kept busy: with windows allowed up to 1 s, its
    24 chunks go in at most half as many windows; with the stretch off
    (``flush_max_interval`` at the interval), about one window per chunk. Either
    way the log holds exactly what the client was shown, in order, and
    ``turnlog_delta_window_seconds`` shows the window in force."""
    chunks = [f"c{i} " for i in range(24)]
    got, stretched, (idle, busy) = await _stream_with_a_busy_loop(tmp_path / "a", upstream, database_url, 1.0)
    assert got == chunks
    assert "".join(w["data"]["text"] for w in stretched) == "".join(chunks)
    # what /metrics says: the interval on the idle service, more under the load, never beyond the bound
    assert idle == pytest.approx(0.02) and 0.1 < busy <= 1.0, (idle, busy)
    got, fixed, (idle, busy) = await _stream_with_a_busy_loop(tmp_path / "b", upstream, database_url, 0.0)
    assert got == chunks
    assert "".join(w["data"]["text"] for w in fixed) == "".join(chunks)
    assert idle == pytest.approx(0.02) and busy == pytest.approx(0.02), (idle, busy)
    assert len(fixed) >= 21, [w["data"]["text"] for w in fixed]
    assert len(stretched) <= 12, [w["data"]["text"] for w in stretched]
