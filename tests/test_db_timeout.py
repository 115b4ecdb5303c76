"""A hung database does not hang requests (``TURNLOG_DB_TIMEOUT``, README "Faults").

PostgreSQL: the test's own server is frozen with SIGSTOP (every process of it:
connections stay open, nothing answers); requests that need the store are
answered 503 ``store_unavailable`` with ``Retry-After`` within the timeout's
bounds; after SIGCONT the service answers and runs turns again.

SQLite: another connection holds the write lock; a request that must write
(a turn's start) is answered 503 after the busy timeout, the configured one.

The oracle is the HTTP answers and their timing, from outside.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sqlite3
import time
from pathlib import Path

import pytest

from tests import test_db_outage
from tests.harness import Service, make_settings, start_service, stop_service
from tests.test_db_outage import OwnServer
from tests.upstream import Reply, ScriptedUpstream

USER = [{"role": "user", "content": "hi"}]
TIMEOUT = 1.5  # TURNLOG_DB_TIMEOUT of these tests

own_pg = test_db_outage.own_pg  # the fixture: a private PostgreSQL this module may freeze


def _server_pids(server: OwnServer) -> list[int]:
    """The postmaster and its children (backends, background workers)."""
    home = server.dir
    if (server.dir / "home").exists():
        home = Path((server.dir / "home").read_text().strip())
    postmaster = int((home / "data" / "postmaster.pid").read_text().split()[0])
    children = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == postmaster:
                children.append(int(entry))
    return [postmaster, *children]


def _signal(pids: list[int], sig: signal.Signals) -> None:
    for pid in pids:
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass


async def _timed(service: Service, method: str, path: str, body: object = None) -> tuple[int, dict[str, object], dict[str, str], float]:
    started = time.monotonic()
    request = service.http.request(method, service.url + path, json=body)
    async with await asyncio.wait_for(request, 30) as resp:  # a hang fails here, not the suite
        data = await asyncio.wait_for(resp.json(), 30)
        return resp.status, data, dict(resp.headers), time.monotonic() - started


def _unavailable(status: int, body: dict[str, object], headers: dict[str, str]) -> None:
    assert status == 503, body
    error = body["error"]
    assert isinstance(error, dict) and error["code"] == "store_unavailable", body
    assert headers["Retry-After"].isdigit()


async def test_a_frozen_postgres_is_answered_503_within_the_timeout(own_pg: OwnServer, tmp_path: Path, upstream: ScriptedUpstream) -> None:
    url = own_pg.cluster.fresh_database()
    settings = make_settings(tmp_path, upstream.url, database_url=url, db_timeout=TIMEOUT, lease_seconds=60.0)
    service = await start_service(settings, upstream)
    pids: list[int] = []
    try:
        upstream.enqueue(Reply(text="before"))
        status, body, headers, _ = await _timed(service, "POST", "/v1/chat/completions", {"model": "gpt-test", "messages": USER})
        assert status == 200, body
        turn_id = headers["X-Turn-Id"]
        pids = _server_pids(own_pg)
        _signal(pids, signal.SIGSTOP)
        # A read (its pooled connection answers nothing) and a turn's start (a write).
        # Bound: a statement's timeout, then the pool's re-connect (connect
        # timeout = the same setting, at most 5 s), plus slack for a busy machine.
        for method, path, payload in (
            ("GET", f"/v1/turns/{turn_id}", None),
            ("POST", "/v1/chat/completions", {"model": "gpt-test", "messages": USER}),
            ("GET", f"/v1/turns/{turn_id}/events", None),
        ):
            status, body, headers, took = await _timed(service, method, path, payload)
            _unavailable(status, body, headers)
            assert took < 3 * TIMEOUT + 2, f"{method} {path}: answered after {took:.1f} s"
        _signal(pids, signal.SIGCONT)
        pids = []
        deadline = time.monotonic() + 30
        while True:  # recovers: reads, then a whole turn
            status, body, _, _ = await _timed(service, "GET", f"/v1/turns/{turn_id}")
            if status == 200:
                break
            assert status == 503 and time.monotonic() < deadline, body
            await asyncio.sleep(0.1)
        assert body["content"] == "before"
        upstream.enqueue(Reply(text="after"))
        status, body, _, _ = await _timed(service, "POST", "/v1/chat/completions", {"model": "gpt-test", "messages": USER})
        assert status == 200, body
    finally:
        _signal(pids, signal.SIGCONT)
        await stop_service(service)


@pytest.mark.backends("sqlite")
async def test_a_sqlite_lock_held_elsewhere_is_answered_503_after_the_busy_timeout(database_url: str, tmp_path: Path, upstream: ScriptedUpstream) -> None:
    settings = make_settings(tmp_path, upstream.url, database_url=database_url, db_timeout=TIMEOUT)
    service = await start_service(settings, upstream)
    other = sqlite3.connect(database_url.removeprefix("sqlite+aiosqlite:///"), isolation_level=None)
    try:
        other.execute("BEGIN EXCLUSIVE")  # another process's long write transaction
        status, body, headers, took = await _timed(service, "POST", "/v1/chat/completions", {"model": "gpt-test", "messages": USER})
        _unavailable(status, body, headers)
        assert TIMEOUT * 0.8 <= took < TIMEOUT + 2, f"answered after {took:.1f} s, the busy timeout is {TIMEOUT} s"
        other.execute("ROLLBACK")
        upstream.enqueue(Reply(text="after"))
        status, body, _, _ = await _timed(service, "POST", "/v1/chat/completions", {"model": "gpt-test", "messages": USER})
        assert status == 200, body
    finally:
        other.close()
        await stop_service(service)
