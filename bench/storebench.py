"""Store-level benchmarks, run in a subprocess by ``python -m bench``.

    python -m bench.storebench append --dir DIR [--turns 200] [--events 100] [--repeat 3] [--url DB_URL]
    python -m bench.storebench replay --dir DIR [--events 10000] [--chunks-per-event 1] [--repeat 5]
    python -m bench.storebench chain --dir DIR [--turns 200] [--events 100] [--rounds 5] [--url DB_URL]
    python -m bench.storebench gather --dir DIR [--turns 2000] [--sizes 1,2,4,8,16,32,128] [--url DB_URL]

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

``gather``: what a group commit costs per event against how many it holds
(why ``TURNLOG_COMMIT_GATHER`` exists): N turns open, then for each size K
every turn appends one ``model.delta`` window, K turns' appends queued
together (one commit); the process CPU per event, for each K, twice.
``synchronous=NORMAL``, the service's default.

``replay``: a turn of exactly E events (``turn.started``, ``assembly.completed``,
``model.requested``, E-6 ``model.delta`` of C chunks each, ``model.completed``,
``turn.finalized``, ``turn.completed``) is written to the store, read back with
``store.read`` and folded with ``engine.fold.turn_view.fold``; the fold (and,
separately, the read) is timed.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import hashlib
import json
import statistics
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import orjson

from adapters.store import migrate, open_store
from adapters.store.common import event_rows, link_rows
from engine.chain import GENESIS
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


async def _open_turns(store: Any, turns: int) -> dict[str, int]:
    """``turns`` fresh turns (one ``turn.started`` each), started concurrently:
    turn id -> fencing token."""
    run_id = uuid.uuid4().hex[:8]
    now = time.time()
    ids = [f"bench-{run_id}-{t}" for t in range(turns)]

    async def start(t: int, tid: str) -> int:
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
        return int(await store.start_turn(rec, [started], lease_seconds=600))

    tokens = await asyncio.gather(*(start(t, tid) for t, tid in enumerate(ids)))
    return dict(zip(ids, tokens))


async def _append_run(store: Any, tokens: dict[str, int], per_turn: int) -> dict[str, Any]:
    """One timed run: every turn of ``tokens`` appends ``per_turn`` ``model.delta``
    events one at a time, concurrently."""

    async def turn(tid: str) -> None:
        token = tokens[tid]
        for seq in range(2, per_turn + 2):
            event = Event(
                turn_id=tid,
                seq=seq,
                type="model.delta",
                at=time.time(),
                data={"v": 1, "kind": "text", "pos": seq, "text": " the quick", "lens": [4, 6]},
            )
            await store.append([event], fencing=token)

    before, reads = store.stats["batches"], store.stats.get("chain_reads", 0)
    t0, c0 = time.perf_counter(), time.process_time()
    await asyncio.gather(*(turn(tid) for tid in tokens))
    elapsed = time.perf_counter() - t0
    cpu = time.process_time() - c0
    total = len(tokens) * per_turn
    batches = store.stats["batches"] - before
    chain_reads = store.stats.get("chain_reads", 0) - reads
    for tid in list(tokens)[:3]:
        assert [e.seq for e in await store.read(tid)] == list(range(1, per_turn + 2))
    return {
        "events": total,
        "seconds": elapsed,
        "events_per_s": total / elapsed,
        "cpu_us_per_event": cpu * 1e6 / total,
        "commits": batches,
        "appends_per_commit": total / max(1, batches),
        "chain_reads": chain_reads,
    }


async def bench_gather(url: str, turns: int, sizes: list[int]) -> dict[str, Any]:
    await migrate(url)
    store = await open_store(url, synchronous="NORMAL")
    out: dict[str, Any] = {"turns": turns, "synchronous": "NORMAL", "cpu_us_per_event": {}, "commits": {}}
    try:
        tokens = await _open_turns(store, turns)
        seqs = dict.fromkeys(tokens, 1)
        ids = list(tokens)

        def window(tid: str) -> Event:
            seqs[tid] += 1
            data = {"v": 1, "kind": "text", "pos": seqs[tid], "text": " the quick", "lens": [4, 6]}
            return Event(turn_id=tid, seq=seqs[tid], type="model.delta", at=time.time(), data=data)

        for k in sizes:
            cpu = []
            for _ in range(2):
                before, c0 = store.stats["batches"], time.process_time()
                for i in range(0, turns, k):
                    await asyncio.gather(*(store.append_nowait([window(t)], fencing=tokens[t]) for t in ids[i : i + k]))
                cpu.append((time.process_time() - c0) * 1e6 / turns)
                out["commits"][str(k)] = store.stats["batches"] - before
            out["cpu_us_per_event"][str(k)] = _spread(cpu)
    finally:
        await store.close()
    return out


async def bench_append(url: str, turns: int, per_turn: int, repeat: int, chain: bool = True) -> dict[str, Any]:
    await migrate(url)
    store = await open_store(url, chain=chain)
    runs = []
    try:
        for _ in range(repeat):
            runs.append(await _append_run(store, await _open_turns(store, turns), per_turn))
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


def _spread(values: list[float]) -> dict[str, float]:
    """Median, quartiles and extremes: how far one pair can stray."""
    q = statistics.quantiles(values, n=4) if len(values) > 1 else [values[0]] * 3
    return {"median": q[1], "p25": q[0], "p75": q[2], "min": min(values), "max": max(values), "n": len(values)}


async def bench_chain(url: str, turns: int, per_turn: int, rounds: int) -> dict[str, Any]:
    """Short runs with and without the chain, alternating, on one database (see
    the module docstring)."""
    await migrate(url)
    stores = {True: await open_store(url, chain=True), False: await open_store(url, chain=False)}
    runs: dict[bool, list[dict[str, Any]]] = {True: [], False: []}
    try:
        for chain in (True, False):  # warm-up, not counted
            await _append_run(stores[chain], await _open_turns(stores[chain], turns), per_turn)
        for i in range(rounds):
            # ABBA: a drift (the file growing, a neighbour's load ramping)
            # weighs on both variants alike.
            for chain in (False, True) if i % 2 == 0 else (True, False):
                tokens = await _open_turns(stores[chain], turns)
                gc.collect()  # no run pays for the garbage of the one before
                runs[chain].append(await _append_run(stores[chain], tokens, per_turn))
    finally:
        for store in stores.values():
            await store.close()
    on, off = runs[True], runs[False]
    ratios = [a["events_per_s"] / b["events_per_s"] for a, b in zip(on, off)]
    cpu_ratios = [b["cpu_us_per_event"] / a["cpu_us_per_event"] for a, b in zip(on, off)]
    pooled = (sum(r["events"] for r in on) / sum(r["seconds"] for r in on)) / (sum(r["events"] for r in off) / sum(r["seconds"] for r in off))
    cpu_on = statistics.median(r["cpu_us_per_event"] for r in on)
    cpu_off = statistics.median(r["cpu_us_per_event"] for r in off)
    # The chain's own work per event, timed alone: the data's sorted encoding
    # (the unchained store encodes it too, unsorted) and the link.
    sample = [
        Event(
            turn_id=f"bench-chain-{t}",
            seq=2,
            type="model.delta",
            at=time.time(),
            data={"v": 1, "kind": "text", "pos": 2, "text": " the quick", "lens": [4, 6]},
        )
        for t in range(1000)
    ]

    # Thread CPU, the best of 5: what the work costs, not what a neighbour took.
    def timed(chain: bool) -> float:
        best = float("inf")
        for _ in range(5):
            t0 = time.thread_time()
            for _ in range(4):
                link_rows(event_rows(sample, chain=chain), {}, lambda turn_id, seq: GENESIS)
            best = min(best, time.thread_time() - t0)
        return best

    chained_rows, plain_rows = timed(True), timed(False)
    chain_us = max(0.0, chained_rows - plain_rows) * 1e6 / (4 * len(sample))
    floor_us = _chain_floor_us(sample)
    return {
        # The figure: the median over rounds of chained ÷ unchained events/s of
        # the round's two runs.
        "ratio": statistics.median(ratios),
        "ratio_spread": _spread(ratios),
        # All chained events over all chained seconds ÷ the same unchained.
        "pooled_ratio": pooled,
        # Process CPU (both threads) per durable event, unchained ÷ chained, per
        # round: the chain's cost without the fsyncs' wall-clock noise.
        "cpu_ratio": statistics.median(cpu_ratios),
        "cpu_ratio_spread": _spread(cpu_ratios),
        "cpu_us_per_event_chained": cpu_on,
        "cpu_us_per_event_unchained": cpu_off,
        "chain_us_per_event": chain_us,
        # The chain's work alone as a share of an unchained append's CPU.
        "chain_cpu_share": chain_us / cpu_off,
        # Previous hashes read back from the database per chained event: 0
        # while the store links from the heads it keeps (a read per append
        # would cost more than the rest of the chain).
        # What no implementation of this chain can skip, per event: sorting the
        # data's keys (over the unsorted encoding), the canonical array from
        # the encoded data, one sha256 of it after the previous hash.
        "floor_us_per_event": floor_us,
        # The chain's own work over that floor: how much an implementation
        # could still save.
        "chain_over_floor": chain_us / floor_us if floor_us else None,
        # The ratio with the chain's cost cut to its floor (everything above
        # the mandatory operations gone): the best this chain can reach here.
        "ratio_at_floor": 1 - (1 - statistics.median(ratios)) * min(1.0, floor_us / chain_us) if chain_us else None,
        "chain_reads_per_event": sum(r["chain_reads"] for r in on) / sum(r["events"] for r in on),
        "events_per_s_chained": statistics.median(r["events_per_s"] for r in on),
        "events_per_s_unchained": statistics.median(r["events_per_s"] for r in off),
        "turns": turns,
        "events_per_turn": per_turn,
        "rounds": rounds,
    }


def _chain_floor_us(sample: list[Event]) -> float:
    """Thread CPU per event of the chain's mandatory operations alone, in the
    tightest loop Python allows (the best of 5)."""
    sort, dumps, fragment, sha256 = orjson.OPT_SORT_KEYS, orjson.dumps, orjson.Fragment, hashlib.sha256
    items = [(e.turn_id, e.seq, e.type, e.at, e.data) for e in sample]

    def best(fn: Any) -> float:
        least = float("inf")
        for _ in range(5):
            t0 = time.thread_time()
            for _ in range(4):
                fn()
            least = min(least, time.thread_time() - t0)
        return least * 1e6 / (4 * len(items))

    def plain() -> None:
        for _t, _s, _y, _a, data in items:
            dumps(data)

    def chained() -> None:
        prev = GENESIS
        for turn_id, seq, type_, at, data in items:
            text = dumps(data, option=sort)
            prev = sha256(prev + dumps([turn_id, seq, type_, at, fragment(text)])).digest()

    return max(0.0, best(chained) - best(plain))


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

    request: dict[str, Any] = {"model": "bench", "stream": True, "messages": [{"role": "user", "content": "Tell me a long story."}]}
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
            id=turn_id,
            chat_id="chat-bench",
            user_id="bench",
            model="bench",
            status="running",
            created_at=now,
            updated_at=now,
            owner="bench",
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
    c.add_argument("--events", type=int, default=25)
    c.add_argument("--rounds", type=int, default=40)
    c.add_argument("--url", help="database URL (default: a fresh SQLite file in --dir)")
    g = sub.add_parser("gather")
    g.add_argument("--dir", required=True)
    g.add_argument("--turns", type=int, default=2000)
    g.add_argument("--sizes", default="1,2,4,8,16,32,128")
    g.add_argument("--url", help="database URL (default: a fresh SQLite file in --dir)")
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
    elif args.cmd == "gather":
        out = asyncio.run(bench_gather(url, args.turns, [int(k) for k in args.sizes.split(",")]))
        if not url.startswith("sqlite"):
            out["synchronous"] = "n/a (" + url.split(":", 1)[0] + ": the server's own durability settings)"
    else:
        out = asyncio.run(bench_replay(url, args.events, args.chunks_per_event, args.repeat))
    sys.stdout.write(json.dumps(out) + "\n")


if __name__ == "__main__":
    main()
