"""The SQLite writer prepares a dozen INSERT statements per table, however
its batches vary.

The sqlite3 module keeps a connection's last 128 prepared statements, and a
multi-row INSERT holds ~0.7 KB per row of its text. Written one statement per
row count, batches of 1 to 1,000 rows kept tens of MB per connection (10,000
turns waiting for a tool approval grew the process by ~30 MB, most of it
this cache). Rows now go in statements of a few sizes.
"""

from __future__ import annotations

import random
import threading
import time
import uuid
from pathlib import Path

from adapters.store import migrate, open_store
from adapters.store.sqlite_writer import ROWS_PER_INSERT, one_statement, statement_sizes
from engine.events import Event
from engine.ports import TurnRecord


def test_the_sizes_cover_the_rows_with_the_largest_first_and_few_distinct_ones() -> None:
    for most in (ROWS_PER_INSERT, 199, 3276, 7):
        seen: set[int] = set()
        for n in range(0, 3 * most + 3):
            sizes = statement_sizes(n, most)
            assert sum(sizes) == n and all(s > 0 for s in sizes)
            assert sizes == sorted(sizes, reverse=True)
            # whole statements of ``most`` while more are left, then distinct powers of two below it
            tail = [s for s in sizes if s != most]
            assert len(set(tail)) == len(tail) and all(s < most and s & (s - 1) == 0 for s in tail)
            assert sizes.count(most) == n // most
            seen.update(sizes)
        assert len(seen) <= most.bit_length() + 1, (most, sorted(seen))
    assert one_statement(ROWS_PER_INSERT) and one_statement(64) and not one_statement(37) and not one_statement(ROWS_PER_INSERT + 1)


def _event(turn_id: str, seq: int) -> Event:
    return Event(turn_id=turn_id, seq=seq, type="test.event", at=time.time(), data={"v": seq})


async def test_appends_of_every_size_use_a_dozen_insert_statements_and_store_every_row(tmp_path: Path) -> None:
    url = f"sqlite+aiosqlite:///{tmp_path / 't.db'}"
    await migrate(url)
    store = await open_store(url)
    try:
        now = time.time()
        turn_id = f"t-{uuid.uuid4().hex}"
        record = TurnRecord(id=turn_id, chat_id="c", user_id="u", model="m", status="running", created_at=now, updated_at=now, owner="w")
        token = await store.start_turn(record, [_event(turn_id, 1)], lease_seconds=600)
        # The writer's own connection (made by the first write), traced from here on.
        raw = store._writes._writer._conn.dbapi_connection  # type: ignore[attr-defined]
        traced: list[str] = []
        lock = threading.Lock()

        def trace(sql: str) -> None:
            with lock:
                traced.append(sql)

        raw.set_trace_callback(trace)
        sizes = list(range(1, 121))
        random.Random(7).shuffle(sizes)
        seq = 1
        for size in sizes:  # each append alone in its commit: one run of ``size`` rows
            await store.append([_event(turn_id, seq + k) for k in range(1, size + 1)], fencing=token)
            seq += size
        raw.set_trace_callback(None)
        # The trace shows each statement with its values bound: one statement
        # text per row count (every row holds the type literal once).
        rows_per_insert = {sql.count("'test.event'") for sql in traced if sql.startswith("INSERT INTO events")}
        assert rows_per_insert == {1, 2, 4, 8, 16, 32, 64}, sorted(rows_per_insert)
        assert [e.seq for e in await store.read(turn_id)] == list(range(1, seq + 1))
    finally:
        await store.close()
