"""``adapters.live_pg.PgSignals`` against a real PostgreSQL: a process's event
notifications wake the other processes' subscribers, never its own (they had
those events live from the turn's actor)."""

from __future__ import annotations

import asyncio

from adapters.live_pg import PgSignals


def _signals(url: str, woken: list[str], seen: asyncio.Queue[str]) -> PgSignals:
    def on_events(turn_id: str) -> None:
        woken.append(turn_id)
        seen.put_nowait(turn_id)

    return PgSignals(url, on_events=on_events, on_cancel=lambda turn_id, by: None)


async def test_own_event_notifications_do_not_wake_own_subscribers(pg_url: str) -> None:
    woken_a: list[str] = []
    woken_b: list[str] = []
    seen_a: asyncio.Queue[str] = asyncio.Queue()
    seen_b: asyncio.Queue[str] = asyncio.Queue()
    a, b = _signals(pg_url, woken_a, seen_a), _signals(pg_url, woken_b, seen_b)
    await a.start()
    await b.start()
    try:
        a.appended("turn-from-a")
        assert await asyncio.wait_for(seen_b.get(), 10) == "turn-from-a"
        # Then b notifies: PostgreSQL delivers notifications in commit order,
        # so by the time a hears b's, it has heard (and dropped) its own.
        b.appended("turn-from-b")
        assert await asyncio.wait_for(seen_a.get(), 10) == "turn-from-b"
        assert woken_a == ["turn-from-b"]
        # b's own notification did not come back to b either.
        a.appended("again-from-a")
        assert await asyncio.wait_for(seen_b.get(), 10) == "again-from-a"
        assert woken_b == ["turn-from-a", "again-from-a"]
    finally:
        await a.close()
        await b.close()
