"""SQLite's disk full under a running turn (docs/guides/drain-and-faults.md).

The real fault: the database on a 16 MiB tmpfs of the test's own, which
a filler file fills until the kernel answers ENOSPC (SQLite then says
"database or disk is full"), and which space returns to when the file is
removed. Mounting needs root: where it is not permitted the test skips on a
developer machine and fails in CI (``tests.pg.unavailable``), which runs it as
root. No stand-in store: the fault is the kernel's.

Expected: new turns are refused 503 (``store_unavailable``, ``Retry-After``),
never 500; the running turn stops writing at its last durable window and is
interrupted and resumed once space returns, completing with the whole answer
once; the file is intact (``PRAGMA integrity_check``) and every turn verifies.
"""

from __future__ import annotations

import asyncio
import errno
import sqlite3
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.fault_clients import kept_text, stream_into
from tests.harness import Service, make_settings, start_service, stop_service
from tests.pg import unavailable
from tests.test_observe import scrape
from tests.upstream import Reply, ScriptedUpstream

TEXT = "".join(f"tok{i:03d} " for i in range(80))
# Far longer than the test: the turn must resume once space returns, not once
# its lease runs out (nor at the next lease_seconds / 3 heartbeat).
LEASE = 120.0
USER = [{"role": "user", "content": "count"}]


class FillerFile:
    """A real full file system: a file grown until the kernel answers ENOSPC,
    removed when space returns."""

    def __init__(self, directory: Path) -> None:
        self.path = directory / "filler"

    async def fill(self) -> None:
        await asyncio.to_thread(self._fill)

    def _fill(self) -> None:
        block = b"\0" * 65536
        with open(self.path, "wb", buffering=0) as f:
            try:
                while True:
                    f.write(block)
            except OSError as exc:
                assert exc.errno == errno.ENOSPC, exc
            try:  # the last bytes a smaller write still fits
                while True:
                    f.write(b"\0" * 512)
            except OSError:
                pass

    async def free(self) -> None:
        self.path.unlink()


async def _disk_full_mid_turn(service: Service, upstream: ScriptedUpstream, fault: FillerFile, db_path: Path) -> None:
    """A turn streams, the disk fills under it, new turns get 503, space
    returns: the turn resumes and completes once, the file stays intact."""
    try:
        ids: list[str] = []
        seen: dict[str, bytes] = {}
        client = asyncio.create_task(stream_into(service, ids, seen))
        deadline = time.monotonic() + 20
        while not ids or len((await service.turn(ids[0]))["content"]) < 160:  # 20 chunks durable, then paused
            assert time.monotonic() < deadline
            await asyncio.sleep(0.02)
        turn_id = ids[0]
        await fault.fill()
        upstream.release()  # the turn streams on into a full disk
        status, body, headers = await service.post("/v1/chat/completions", {"model": "gpt-test", "messages": USER})
        assert status == 503, body
        assert body["error"]["code"] == "store_unavailable" and "disk is full" in body["error"]["message"]
        assert headers["Retry-After"].isdigit()
        deadline = time.monotonic() + 20
        # The turn's own writes hit the full disk too: its actor stops (the
        # service's own gauge of the turns it runs), short of the answer.
        while (await scrape(service))["turnlog_turns_running"] != 0:
            assert time.monotonic() < deadline, "the turn never stopped on the full disk"
            await asyncio.sleep(0.02)
        durable = (await service.turn(turn_id))["content"]
        assert TEXT.startswith(durable) and durable != TEXT
        await fault.free()  # space returns
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
    db = sqlite3.connect(db_path)
    try:
        assert db.execute("PRAGMA integrity_check").fetchone() == ("ok",)
    finally:
        db.close()


def _paused_upstream() -> ScriptedUpstream:
    return ScriptedUpstream(models=["gpt-test"], default=Reply(text=TEXT, chunk_size=8, delay=0.01, pause_after=20))


@pytest.fixture
def small_fs(tmp_path: Path) -> Iterator[Path]:
    """A 16 MiB tmpfs of the test's own (root only: ``mount``)."""
    where = tmp_path / "fs"
    where.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=16m", "tmpfs", str(where)], capture_output=True, text=True)
    if done.returncode != 0:
        unavailable(f"cannot mount a small file system here ({done.stderr.strip()})")
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], check=False)


async def test_a_real_full_disk_mid_turn_then_space_returns(small_fs: Path, tmp_path: Path) -> None:
    """The real fault: SQLite's file on a small tmpfs that a filler file fills
    (ENOSPC from the kernel, "database or disk is full" from SQLite)."""
    upstream = _paused_upstream()
    await upstream.start()
    db = small_fs / "turnlog.db"
    settings = make_settings(tmp_path, upstream.url, database_url=f"sqlite+aiosqlite:///{db}", lease_seconds=LEASE)
    service = await start_service(settings, upstream)
    await _disk_full_mid_turn(service, upstream, FillerFile(small_fs), db)
