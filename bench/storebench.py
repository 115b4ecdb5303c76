"""Store-level benchmarks, run in a subprocess by ``python -m bench``.

    python -m bench.storebench append --dir DIR [--turns 200] [--events 100] [--repeat 3] [--url DB_URL]
    python -m bench.storebench replay --dir DIR [--events 10000] [--chunks-per-event 1] [--repeat 5]
    python -m bench.storebench chain --dir DIR [--turns 200] [--events 100] [--rounds 5] [--url DB_URL]

Each prints ONE JSON line.

``append``: N turns run concurrently (one asyncio task each, all on the store
returned by ``adapters.store.open_store``, SQLite, default ``synchronous=FULL``);
each appends M ``model.delta`` events one at a time, with its fencing token,
awaiting each append before the next (like a turn actor flushing one window
after another). An append returns once its group commit is COMMITted, so the
figure is *durable* events/s.

``chain``: what the hash chain costs appends: ``append``'s workload in
rounds, each round one run on a store without the chain (``open_store(...,
chain=False)``: no canonical form, no sha256, NULL hashes) and one with it,
the order alternating from round to round, on the same database. The figure
is the median of the rounds' ratios (chained events/s ÷ unchained events/s).

``replay``: a turn of exactly E events (``turn.started``, ``assembly.completed``,
``model.requested``, E-6 ``model.delta`` of C chunks each, ``model.completed``,
``turn.finalized``, ``turn.completed``) is written to the store, read back with
``store.read`` and folded with ``engine.fold.turn_view.fold``; the fold (and,
separately, the read) is timed.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
import uuid
from pathlib import Path
from typing import Any

from adapters.store import migrate, open_store
from engine.chain import GENESIS, canonical, link
from engine.events import (
    AssemblyCompleted,
    Event,
    ModelCompleted,
    ModelDelta,
    ModelRequested,
    TurnCompleted,
    TurnFinalized,
    TurnStarted,
    make_event,
)
from engine.fold.turn_view import TurnView, fold
from engine.ports import TurnRecord

WORDS = [" the", " quick", " brown", " fox", " jumps", " over", " a", " lazy", " dog", "."]


async def bench_append(url: str, turns: int, per_turn: int, repeat: int, chain: bool = True) -> dict[str, Any]:
    await migrate(url)
    store = await open_store(url, chain=chain)
    runs = []
    try:
        for _ in range(repeat):
            run_id = uuid.uuid4().hex[:8]
            now = time.time()
            tokens: dict[str, int] = {}
            for t in range(turns):
                tid = f"bench-{run_id}-{t}"
                rec = TurnRecord(
                    id=tid, chat_id=f"chat-{run_id}-{t % 10}", user_id="bench", model="m",
                    status="running", created_at=now, updated_at=now, owner="bench",
                )
                started = Event(turn_id=tid, seq=1, type="turn.started", at=now, data={"v": 1})
                tokens[tid] = await store.start_turn(rec, [started], lease_seconds=600)

            async def turn(tid: str, tokens: dict[str, int] = tokens) -> None:
                token = tokens[tid]
                for seq in range(2, per_turn + 2):
                    event = Event(
                        turn_id=tid, seq=seq, type="model.delta", at=time.time(),
                        data={"v": 1, "kind": "text", "pos": seq, "text": " the quick", "lens": [4, 6]},
                    )
                    await store.append([event], fencing=token)

            before = dict(store.stats)
            t0, c0 = time.perf_counter(), time.process_time()
            await asyncio.gather(*(turn(tid) for tid in tokens))
            elapsed = time.perf_counter() - t0
            cpu = time.process_time() - c0
            total = turns * per_turn
            batches = store.stats["batches"] - before["batches"]
            for tid in list(tokens)[:3]:
                assert [e.seq for e in await store.read(tid)] == list(range(1, per_turn + 2))
            runs.append(
                {"events": total, "seconds": elapsed, "events_per_s": total / elapsed,
                 "cpu_us_per_event": cpu * 1e6 / total,
                 "commits": batches, "appends_per_commit": total / max(1, batches)}
            )
    finally:
        await store.close()
    eps = [r["events_per_s"] for r in runs]
    return {
        "events_per_s": statistics.median(eps),
        "cpu_us_per_event": statistics.median(r["cpu_us_per_event"] for r in runs),
        "events_per_s_min": min(eps),
        "events_per_s_max": max(eps),
        "turns": turns,
        "events_per_turn": per_turn,
        "synchronous": "FULL",
        "runs": runs,
    }


async def bench_chain(url: str, turns: int, per_turn: int, rounds: int) -> dict[str, Any]:
    """Alternating unchained/chained append runs on one database (see the module docstring)."""
    with_chain: list[float] = []
    without: list[float] = []
    ratios: list[float] = []
    cpu_on: list[float] = []
    cpu_off: list[float] = []
    for i in range(rounds):
        order = (False, True) if i % 2 == 0 else (True, False)
        got: dict[bool, dict[str, Any]] = {}
        for chain in order:
            got[chain] = await bench_append(url, turns, per_turn, 1, chain=chain)
        with_chain.append(got[True]["events_per_s"])
        without.append(got[False]["events_per_s"])
        ratios.append(got[True]["events_per_s"] / got[False]["events_per_s"])
        cpu_on.append(got[True]["cpu_us_per_event"])
        cpu_off.append(got[False]["cpu_us_per_event"])
    # The chain's own work per event, timed alone (canonical form + sha256 link).
    sample = Event(
        turn_id="bench-chain", seq=2, type="model.delta", at=time.time(),
        data={"v": 1, "kind": "text", "pos": 2, "text": " the quick", "lens": [4, 6]},
    )
    n = 100_000
    t0 = time.perf_counter()
    prev = GENESIS
    for _ in range(n):
        prev = link(prev, canonical(sample.turn_id, sample.seq, sample.type, sample.at, sample.data))
    chain_us = (time.perf_counter() - t0) * 1e6 / n
    return {
        "ratio": statistics.median(ratios),
        "ratios": ratios,
        # Process CPU (both threads) per durable event, and their ratio: steadier
        # than wall-clock throughput on a shared machine.
        "cpu_us_per_event_chained": statistics.median(cpu_on),
        "cpu_us_per_event_unchained": statistics.median(cpu_off),
        "cpu_ratio": statistics.median(cpu_off) / statistics.median(cpu_on),
        "chain_us_per_event": chain_us,
        # The chain's work alone as a share of an unchained append's CPU.
        "chain_cpu_share": chain_us / statistics.median(cpu_off),
        "events_per_s_chained": statistics.median(with_chain),
        "events_per_s_unchained": statistics.median(without),
        "turns": turns,
        "events_per_turn": per_turn,
        "rounds": rounds,
    }


def build_turn(turn_id: str, n_events: int, chunks_per_event: int) -> tuple[list[Event], str]:
    """A legal, complete turn of exactly ``n_events`` events, and its answer text."""
    if n_events < 7:
        raise ValueError("need at least 7 events")
    view = TurnView(turn_id)
    out: list[Event] = []
    t = time.time()

    def add(data: Any) -> None:
        nonlocal t
        t += 0.001
        event = make_event(turn_id, view.last_seq + 1, data, at=t)
        view.apply(event)
        out.append(event)

    request = {"model": "bench", "stream": True, "messages": [{"role": "user", "content": "Tell me a long story."}]}
    add(TurnStarted(chat_id="chat-bench", user_id="bench", model="bench", stream=True, request=request))
    add(AssemblyCompleted(messages=request["messages"], params={}, history_len=0, new_messages=request["messages"]))
    add(ModelRequested(iteration=0))
    answer: list[str] = []
    w = 0
    for _ in range(n_events - 6):
        chunks = []
        for _ in range(chunks_per_event):
            chunks.append(WORDS[w % len(WORDS)])
            w += 1
        answer.extend(chunks)
        add(ModelDelta(kind="text", pos=view.next_pos, text="".join(chunks), lens=[len(c) for c in chunks]))
    add(ModelCompleted(finish_reason="stop", usage={"prompt_tokens": 6, "completion_tokens": w, "total_tokens": 6 + w}))
    add(TurnFinalized(finish_reason="stop"))
    add(TurnCompleted())
    assert len(out) == n_events
    return out, "".join(answer)


async def bench_replay(url: str, n_events: int, chunks_per_event: int, repeat: int) -> dict[str, Any]:
    await migrate(url)
    store = await open_store(url)
    try:
        turn_id = f"turn_replay_{uuid.uuid4().hex[:12]}"
        built, answer = build_turn(turn_id, n_events, chunks_per_event)
        now = time.time()
        rec = TurnRecord(
            id=turn_id, chat_id="chat-bench", user_id="bench", model="bench",
            status="running", created_at=now, updated_at=now, owner="bench",
        )
        token = await store.start_turn(rec, built[:1], lease_seconds=600)
        for i in range(1, len(built), 500):
            await store.append(built[i : i + 500], fencing=token)
        reads, folds = [], []
        for _ in range(repeat):
            t0 = time.perf_counter()
            events = await store.read(turn_id)
            t1 = time.perf_counter()
            view = fold(turn_id, events)
            t2 = time.perf_counter()
            reads.append(t1 - t0)
            folds.append(t2 - t1)
            assert len(events) == n_events and view.status == "completed" and view.content == answer
    finally:
        await store.close()
    ms = [f * 1000 for f in folds]
    return {
        "fold_ms": statistics.median(ms),
        "fold_ms_min": min(ms),
        "fold_ms_max": max(ms),
        "read_ms": statistics.median(r * 1000 for r in reads),
        "events": n_events,
        "chunks_per_delta_event": chunks_per_event,
        "chunks": (n_events - 6) * chunks_per_event,
        "fold_us_per_event": statistics.median(ms) * 1000 / n_events,
        "repeat": repeat,
    }


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m bench.storebench", description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    a = sub.add_parser("append")
    a.add_argument("--dir", required=True)
    a.add_argument("--turns", type=int, default=200)
    a.add_argument("--events", type=int, default=100)
    a.add_argument("--repeat", type=int, default=3)
    a.add_argument("--url", help="database URL (default: a fresh SQLite file in --dir), e.g. postgresql+asyncpg://...")
    c = sub.add_parser("chain")
    c.add_argument("--dir", required=True)
    c.add_argument("--turns", type=int, default=200)
    c.add_argument("--events", type=int, default=100)
    c.add_argument("--rounds", type=int, default=5)
    c.add_argument("--url", help="database URL (default: a fresh SQLite file in --dir)")
    r = sub.add_parser("replay")
    r.add_argument("--dir", required=True)
    r.add_argument("--events", type=int, default=10_000)
    r.add_argument("--chunks-per-event", type=int, default=1)
    r.add_argument("--repeat", type=int, default=5)
    args = p.parse_args(argv)
    db = Path(args.dir) / f"store-{args.cmd}-{uuid.uuid4().hex[:6]}.db"
    url = getattr(args, "url", None) or f"sqlite+aiosqlite:///{db}"
    if args.cmd == "append":
        out = asyncio.run(bench_append(url, args.turns, args.events, args.repeat))
        if not url.startswith("sqlite"):
            out["synchronous"] = "n/a (" + url.split(":", 1)[0] + ": the server's own durability settings)"
    elif args.cmd == "chain":
        out = asyncio.run(bench_chain(url, args.turns, args.events, args.rounds))
    else:
        out = asyncio.run(bench_replay(url, args.events, args.chunks_per_event, args.repeat))
    sys.stdout.write(json.dumps(out) + "\n")


if __name__ == "__main__":
    main()
