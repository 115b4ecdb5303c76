"""Durable append throughput of the event store (group commit).

N turns run concurrently; each appends M events one at a time (one ``append``
per event, awaiting it before the next, fencing token given, like a turn actor
flushing one delta window after another). An append returns only once its
transaction is committed, so the figure is *durable* events per second.

    python bench/store_append.py                      # SQLite, synchronous=FULL
    python bench/store_append.py --synchronous NORMAL
    python bench/store_append.py --url postgresql+asyncpg://...   (empty, migrated DB)
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from adapters.store import migrate, open_store  # noqa: E402
from engine.events import Event  # noqa: E402
from engine.ports import TurnRecord  # noqa: E402


async def run(url: str, turns: int, per_turn: int, engine_kwargs: dict) -> None:
    await migrate(url)
    store = await open_store(url, **engine_kwargs)
    run_id = uuid.uuid4().hex[:8]
    now = time.time()
    tokens = {}
    for t in range(turns):
        tid = f"bench-{run_id}-{t}"
        rec = TurnRecord(
            id=tid,
            chat_id=f"chat-{run_id}-{t % 10}",
            user_id="bench",
            model="m",
            status="running",
            created_at=now,
            updated_at=now,
            owner="bench",
        )
        started = Event(turn_id=tid, seq=1, type="turn.started", at=now, data={"v": 1})
        tokens[tid] = await store.start_turn(rec, [started], lease_seconds=60)

    async def turn(tid: str) -> None:
        token = tokens[tid]
        for seq in range(2, per_turn + 2):
            event = Event(
                turn_id=tid,
                seq=seq,
                type="model.delta",
                at=time.time(),
                data={"v": 1, "kind": "text", "pos": seq, "text": "Hello, wörld! ", "lens": [7, 7]},
            )
            await store.append([event], fencing=token)

    before = dict(store.stats)
    t0 = time.perf_counter()
    await asyncio.gather(*(turn(tid) for tid in tokens))
    elapsed = time.perf_counter() - t0
    total = turns * per_turn
    batches = store.stats["batches"] - before["batches"]
    for tid in list(tokens)[:3]:
        assert [e.seq for e in await store.read(tid)] == list(range(1, per_turn + 2))
    await store.close()
    print(
        f"{total} events ({turns} turns x {per_turn}) in {elapsed:.3f}s: "
        f"{total / elapsed:,.0f} durable events/s; {batches} commits, "
        f"{total / batches:.1f} appends/commit"
    )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--url", help="database URL (default: a temp SQLite file)")
    p.add_argument("--turns", type=int, default=100)
    p.add_argument("--events", type=int, default=100, help="events per turn")
    p.add_argument("--synchronous", default="FULL", help="SQLite PRAGMA synchronous")
    args = p.parse_args()
    engine_kwargs = {}
    with tempfile.TemporaryDirectory(dir=os.environ.get("BENCH_DIR")) as tmp:
        url = args.url or f"sqlite+aiosqlite:///{tmp}/bench.db"
        if url.startswith("sqlite"):
            engine_kwargs["synchronous"] = args.synchronous
        print(f"url={url} synchronous={engine_kwargs.get('synchronous', '-')}")
        asyncio.run(run(url, args.turns, args.events, engine_kwargs))


if __name__ == "__main__":
    main()
