"""Owner locks: a process that runs turns holds a lock named by its owner token
(a ``flock``-ed file beside the SQLite database, an advisory lock on
PostgreSQL). After kill -9 the lock is free, so the restarted process adopts
the dead one's turns at once instead of waiting for their lease."""

from __future__ import annotations

import time
from pathlib import Path

import aiohttp

from tests.processes import Server, get_json, wait_for

# Long, so that "well under the lease" holds however slowly a loaded machine
# starts the second process: the lease, renewed every 20 s, has 40 to 60 s
# left at the kill.
LEASE = "60"


def counted(n: int) -> str:
    return ", ".join(str(i) for i in range(1, n + 1)) + "."


async def test_kill9_restart_resumes_at_once_not_at_lease_expiry(http: aiohttp.ClientSession, tmp_path: Path, database_url: str) -> None:
    first = Server(database_url, None, auto_resume=True, log_dir=tmp_path, args=("--demo",), TURNLOG_LEASE_SECONDS=LEASE, TURNLOG_DEMO_CHUNK_DELAY="0.01")
    try:
        await first.ready(http)
        resp = await http.post(
            first.url + "/v1/chat/completions",
            json={"model": "demo", "stream": True, "messages": [{"role": "user", "content": "count to 2000"}]},
        )
        turn_id = resp.headers["X-Turn-Id"]
        async for line in resp.content:
            if b'"content":"50, "' in line:
                break
        first.kill9()
        resp.close()
    finally:
        first.stop()
    killed = time.monotonic()
    second = Server(database_url, None, auto_resume=True, log_dir=tmp_path, args=("--demo",), TURNLOG_LEASE_SECONDS=LEASE, TURNLOG_DEMO_CHUNK_DELAY="0")
    try:
        await second.ready(http)
        done = await wait_for(http, f"{second.url}/v1/turns/{turn_id}", lambda v: v["status"] == "completed", timeout=90)
        took = time.monotonic() - killed
        assert took < 35.0, f"resumed {took:.1f} s after the kill (the lease is {LEASE} s)"
        assert done["content"] == counted(2000)
        events = (await get_json(http, f"{second.url}/v1/turns/{turn_id}/events?limit=10000"))["events"]
        interrupted = next(e for e in events if e["type"] == "turn.interrupted")
        assert interrupted["data"]["last_owner"].endswith("-locked")
        assert [e["type"] for e in events].count("turn.resumed") == 1
        log = second.log_tail(200)
        assert f"turn {turn_id}: its owner {interrupted['data']['last_owner']} is gone (its lock is free): adopted now" in log
    finally:
        second.stop()


async def test_a_live_owners_lock_is_never_free(tmp_path: Path, database_url: str) -> None:
    """Two processes on one database must not take each other's turns: a held
    lock is not free to anyone else (in this process too), an unknown owner's
    is not free (its lease decides), a dead owner's is."""
    from adapters.owner_locks import FileOwnerLocks, open_owner_locks

    mine, theirs = open_owner_locks(database_url), open_owner_locks(database_url)
    assert mine is not None and theirs is not None
    await mine.hold("proc_a-locked")
    try:
        assert not await theirs.is_free("proc_a-locked")
        assert not await theirs.is_free("proc_a-locked")  # a probe leaves it as it was
        if isinstance(mine, FileOwnerLocks):
            assert not await theirs.is_free("proc_never-locked")
            lock_file = mine.path("proc_a-locked")
            assert lock_file.parent == tmp_path and lock_file.exists()
            import os

            os.close(mine._held.pop("proc_a-locked"))  # what the kernel does at kill -9
            assert await theirs.is_free("proc_a-locked")
            await theirs.forget("proc_a-locked")
            assert not lock_file.exists() and not await theirs.is_free("proc_a-locked")
        else:
            await mine.release("proc_a-locked")  # the session ends, as at kill -9
            assert await theirs.is_free("proc_a-locked")
    finally:
        await mine.release("proc_a-locked")
        await theirs.release("proc_x-locked")
