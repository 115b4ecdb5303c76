"""The engine on ``MemoryEventStore``: what the store contract cannot show.

The contract (``test_store_contract``) holds the memory store to the SQL
stores' behaviour call by call; here a whole turn of the real engine (the
actor, its flushes and index updates, through ``verify``'s re-run) writes to
it and to a SQLite file, and both must end with the same log and index row,
from the same write requests.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from adapters.store import MemoryEventStore, migrate, open_store
from bench.storebench import build_turn
from engine.ports import TurnRecord
from engine.run.verify import verify_turn
from tests.backends import Store


async def test_a_verified_turn_writes_the_same_log_as_on_sqlite(tmp_path: Path) -> None:
    recorded, _ = build_turn("turn-mem", 40, 3)
    url = f"sqlite+aiosqlite:///{tmp_path / 'scratch.db'}"
    await migrate(url)
    stores: list[Store] = [MemoryEventStore(), await open_store(url, synchronous="OFF")]
    logs: list[list[tuple[int, str, dict[str, Any]]]] = []
    turns: list[TurnRecord | None] = []
    try:
        for store in stores:
            result = await verify_turn(recorded, store)
            assert result.ok, result.diff
            # (when a model call's first chunk came is the re-run's own clock reading)
            logs.append([(e.seq, e.type, {k: v for k, v in e.data.items() if k != "first_chunk_at"}) for e in await store.read("turn-mem")])
            turns.append(await store.get_turn("turn-mem"))
    finally:
        for store in stores:
            await store.close()
    assert logs[0] == logs[1] and len(logs[0]) > 3
    assert turns[0] is not None and turns[1] is not None
    assert turns[0].status == turns[1].status == "completed"
    untimed = [{k: v for k, v in (t.view or {}).items() if not k.endswith("_at")} for t in turns if t]
    assert untimed[0] == untimed[1] and untimed[0]  # the times are the re-run's own
    # The same writes (how they group into commits depends on timing).
    writes = [(s.stats["requests"], s.stats["events"]) for s in stores]
    assert writes[0] == writes[1]
