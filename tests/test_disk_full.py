"""SQLite's disk full under a running turn (API.md §9 faults).

A size-limited file system needs root here, so the fault is injected at the
store port (the edge the brief allows): a wrapper around the real store whose
writes fail, while the disk is "full", with exactly what the real store raises
then (SQLAlchemy's ``OperationalError`` around sqlite3's "database or disk is
full"). Everything else is the real service on a real SQLite file.

Expected: new turns are refused 503 (``store_unavailable``, ``Retry-After``),
never 500; the running turn stops writing at its last durable window and is
interrupted and resumed as soon as space returns (not when its lease runs
out), completing with the whole answer once; the file is intact (``PRAGMA integrity_check``) and every turn verifies.
"""

from __future__ import annotations

import asyncio
import sqlite3
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy.exc

import adapters.http.app
from engine.events import Event
from tests.fault_clients import kept_text, stream_into
from tests.harness import make_settings, start_service, stop_service
from tests.upstream import Reply, ScriptedUpstream

TEXT = "".join(f"tok{i:03d} " for i in range(80))
# Far longer than the test: the turn must resume once space returns, not once
# its lease runs out (nor at the next lease_seconds / 3 heartbeat).
LEASE = 120.0
USER = [{"role": "user", "content": "count"}]


def _disk_full() -> sqlalchemy.exc.OperationalError:
    return sqlalchemy.exc.OperationalError("INSERT INTO events …", {}, sqlite3.OperationalError("database or disk is full"))


class FullDisk:
    """The real store, whose writes that add rows fail while ``full`` is set."""

    def __init__(self, store: Any) -> None:
        self._store = store
        self.full = False
        self.refused = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)

    async def start_turn(self, *args: Any, **kwargs: Any) -> int:
        if self.full:
            self.refused += 1
            raise _disk_full()
        return int(await self._store.start_turn(*args, **kwargs))

    async def append(self, events: Sequence[Event], **kwargs: Any) -> None:
        await self.append_nowait(events, **kwargs)

    def append_nowait(self, events: Sequence[Event], **kwargs: Any) -> asyncio.Future[None]:
        if self.full:
            self.refused += 1
            future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            future.set_exception(_disk_full())
            return future
        return self._store.append_nowait(events, **kwargs)  # type: ignore[no-any-return]


@pytest.mark.backends("sqlite")
async def test_disk_full_mid_turn_then_space_returns(tmp_path: Path, database_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    wrappers: list[FullDisk] = []
    real_open = adapters.http.app.open_store

    async def open_full_disk(*args: Any, **kwargs: Any) -> FullDisk:
        wrappers.append(FullDisk(await real_open(*args, **kwargs)))
        return wrappers[-1]

    monkeypatch.setattr(adapters.http.app, "open_store", open_full_disk)
    upstream = ScriptedUpstream(models=["gpt-test"], default=Reply(text=TEXT, chunk_size=8, delay=0.01, pause_after=20))
    await upstream.start()
    service = await start_service(make_settings(tmp_path, upstream.url, database_url=database_url, lease_seconds=LEASE), upstream)
    (disk,) = wrappers
    try:
        ids: list[str] = []
        seen: dict[str, bytes] = {}
        client = asyncio.create_task(stream_into(service, ids, seen))
        deadline = time.monotonic() + 20
        while not ids or len((await service.turn(ids[0]))["content"]) < 160:  # 20 chunks durable, then paused
            assert time.monotonic() < deadline
            await asyncio.sleep(0.02)
        turn_id = ids[0]
        disk.full = True
        upstream.release()  # the turn streams on into a full disk
        status, body, headers = await service.post("/v1/chat/completions", {"model": "gpt-test", "messages": USER})
        assert status == 503, body
        assert body["error"]["code"] == "store_unavailable" and "disk is full" in body["error"]["message"]
        assert headers["Retry-After"].isdigit()
        deadline = time.monotonic() + 20
        while disk.refused < 2:  # the POST, then the turn's own writes hit the full disk too
            assert time.monotonic() < deadline, "the turn never wrote into the full disk"
            await asyncio.sleep(0.02)
        durable = (await service.turn(turn_id))["content"]
        assert TEXT.startswith(durable) and durable != TEXT
        disk.full = False  # space returns
        deadline = time.monotonic() + 15
        while (view := await service.turn(turn_id))["status"] != "completed":
            upstream.release()  # the continuation pauses too
            assert time.monotonic() < deadline, f"not completed within 15 s of space returning (lease {LEASE:g} s): {view['status']}"
            await asyncio.sleep(0.05)
        # The live client stayed on through the fault: with the resumed notice
        # applied, it shows the answer once.
        await asyncio.wait_for(client, 10)
        raw = seen[turn_id].decode(errors="replace")
        assert '"resumed"' in raw, "the client was told that shown text was lost"
        assert raw.rstrip().endswith("data: [DONE]") and kept_text(raw) == TEXT
        assert view["content"] == TEXT, "nothing duplicated, nothing missing"
        # A client that (re)connects now gets the whole answer once.
        async with service.http.get(f"{service.v1}/turns/{turn_id}/stream") as again:
            assert kept_text(await again.text()) == TEXT
        events = await service.events(turn_id)
        assert [e["seq"] for e in events] == list(range(1, len(events) + 1))
        types = [e["type"] for e in events]
        assert types.count("turn.completed") == 1 and "turn.interrupted" in types and "turn.resumed" in types
        # the service takes new turns again
        upstream.enqueue(Reply(text="again"))
        status, body, _ = await service.post("/v1/chat/completions", {"model": "gpt-test", "messages": USER})
        assert status == 200, body
    finally:
        await stop_service(service)  # verifies every finished turn
        await upstream.close()
    db = sqlite3.connect(database_url.removeprefix("sqlite+aiosqlite:///"))
    try:
        assert db.execute("PRAGMA integrity_check").fetchone() == ("ok",)
    finally:
        db.close()
