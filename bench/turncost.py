"""The fixed cost of a turn: what starting and ending a turn costs,
apart from its chunks.

* Scenario ``turn_cost``: tiny turns (5 chunks, unpaced) through a fresh
  turnlog (SQLite), one after another and then a burst of them all at once;
  turnlog's process CPU (utime + stime of ``/proc/PID/stat``, all threads) per
  turn, and the floor relay's for the same requests, interleaved rounds. The
  difference is what turnlog adds to a turn beyond relaying it.
* Store level (``python -m bench.turncost start --dir DIR``, run by the
  scenario in a subprocess): N concurrent ``start_turn`` calls on a fresh
  SQLite store; process CPU per start and the wall time of the N.
* Store level (``python -m bench.turncost commit --dir DIR``): a tiny turn's
  four store calls (the start, ``model.requested``, the delta window with
  ``model.completed``, the terminal events with the index update and the
  lease's release), one turn after another: every call its own group
  commit. Process CPU per commit, and the event loop's thread's share of it
  (the rest is the writer thread's).

The issue's targets are burst figures (``burst_starts``); these are
informational checks, the CPU a turn costs, which a busy shared host does not
blur the way it blurs latencies.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
import uuid
from pathlib import Path
from typing import Any

from bench.procs import BenchError, cpu_seconds
from bench.scenarios import Ctx, _storebench, body, check, failures, med, phase, spread

TINY = 5  # chunks per turn


def turn_cost(ctx: Ctx) -> dict[str, Any]:
    """CPU per tiny turn: turnlog vs the floor, sequential and in a burst; and
    the store's CPU per ``start_turn``."""
    n_seq, n_burst, rounds = (100, 100, 2) if ctx.quick else (300, 200, 3)
    from bench.loadbench import _fresh_turnlog

    proc, v1 = _fresh_turnlog(ctx, "turnlog-cost")
    tiny = body(TINY)
    spent: dict[str, list[float]] = {}
    bad: list[str] = []
    try:
        for r in range(rounds):
            for who, url, pid in (("floor", ctx.floor_v1, ctx.floor_pid), ("turnlog", v1, proc.pid)):
                for shape, n, conc in (("seq", n_seq, 1), ("burst", n_burst, n_burst)):
                    name = f"{who}-{shape}-{r}"
                    ph = phase(name, url, tiny, requests=n, concurrency=conc, preconnect=shape == "burst")
                    before = cpu_seconds(pid)
                    res = ctx.procs.run_client({"phases": [ph], "timeout_s": 120}, name=f"c-cost-{name}")
                    used = cpu_seconds(pid) - before
                    streams = res["phases"][-1]["streams"] if res.get("phases") else []
                    bad += failures(streams, TINY) + ([res["error"]] if res.get("error") else [])
                    spent.setdefault(f"{who}-{shape}", []).append(used / n * 1e6)
    finally:
        ctx.procs.stop(proc)
    if bad:
        raise BenchError(f"turn_cost: turns failed: {bad[:3]}")
    store = _storebench(ctx, ["start", "--turns", "200", "--rounds", "3" if ctx.quick else "5"], 300, name="turncost-start", module="bench.turncost")
    commit = _storebench(ctx, ["commit", "--turns", "100" if ctx.quick else "300", "--rounds", "3"], 300, name="turncost-commit", module="bench.turncost")
    added = {shape: [t - f for t, f in zip(spent[f"turnlog-{shape}"], spent[f"floor-{shape}"])] for shape in ("seq", "burst")}
    return {
        "status": "ok",
        "checks": [
            check("turn_cpu_over_floor_us", med(added["seq"]), "<=", 1000.0, informational=True),
            check("store_start_cpu_us", store["cpu_us_per_start"], "<=", 100.0, informational=True),
        ],
        "figures": {
            "chunks_per_turn": TINY,
            "turns_sequential": n_seq,
            "turns_burst": n_burst,
            "rounds": rounds,
            **{f"{k.replace('-', '_')}_cpu_us_per_turn": spread(v, digits=1) for k, v in spent.items()},
            "seq_added_cpu_us_per_turn": spread(added["seq"], digits=1),
            "burst_added_cpu_us_per_turn": spread(added["burst"], digits=1),
            "store_start": store,
            "store_commit": commit,
            "note": "tiny unpaced turns through a fresh turnlog (SQLite) and the floor relay; process CPU "
            "(the process CPU-time clock, all threads) over the phase / turns; added = turnlog - floor, same round; "
            "store_commit: a tiny turn's 4 store calls one turn after another, process CPU per group commit",
        },
    }


# --------------------------------------------------------------------------- store level


async def _start_rounds(url: str, turns: int, rounds: int) -> dict[str, Any]:
    from adapters.store import migrate, open_store
    from bench.storebench import _open_turns

    await migrate(url)
    store = await open_store(url)
    try:
        await _open_turns(store, 20)  # warm: the writer thread, statement caches
        cpu, wall, batches = [], [], []
        for _ in range(rounds):
            b0 = store.stats["batches"]
            t, c = time.perf_counter(), time.process_time()
            await _open_turns(store, turns)
            wall.append((time.perf_counter() - t) * 1e3)
            cpu.append((time.process_time() - c) * 1e6 / turns)
            batches.append(store.stats["batches"] - b0)
    finally:
        await store.close()
    return {
        "turns": turns,
        "rounds": rounds,
        "cpu_us_per_start": statistics.median(cpu),
        "cpu_us_per_start_spread": spread(cpu, digits=1),
        "wall_ms": spread(wall, digits=1),
        "group_commits": spread([float(b) for b in batches], digits=0),
    }


async def _commit_rounds(url: str, turns: int, rounds: int) -> dict[str, Any]:
    from adapters.store import migrate, open_store
    from engine.events import Event
    from engine.ports import IndexUpdate, TurnRecord

    await migrate(url)
    store = await open_store(url)
    run_id = uuid.uuid4().hex[:8]

    async def tiny_turn(k: int) -> None:
        tid, now = f"commit-{run_id}-{k}", time.time()
        rec = TurnRecord(
            id=tid,
            chat_id=f"chat-{run_id}-{k % 10}",
            user_id="bench",
            model="m",
            status="running",
            created_at=now,
            updated_at=now,
            owner="bench",
        )

        def ev(seq: int, type_: str, data: dict[str, Any]) -> Event:
            return Event(turn_id=tid, seq=seq, type=type_, at=time.time(), data=data)

        token = await store.start_turn(rec, [ev(1, "turn.started", {"v": 1})], lease_seconds=600)
        await store.append([ev(2, "model.requested", {"v": 1, "model": "m"})], fencing=token)
        await store.append(
            [
                ev(3, "model.delta", {"v": 1, "kind": "text", "pos": 0, "text": "Hello there", "lens": [5, 6]}),
                ev(4, "model.completed", {"v": 1, "finish_reason": "stop"}),
            ],
            fencing=token,
            index=IndexUpdate(view={"status": "running", "text": "Hello there"}),
        )
        await store.append(
            [ev(5, "turn.finalized", {"v": 1}), ev(6, "turn.completed", {"v": 1})],
            fencing=token,
            index=IndexUpdate(status="completed", view={"status": "completed"}, release="bench"),
        )

    try:
        for k in range(20):  # warm: the writer thread, statement caches
            await tiny_turn(-1 - k)
        cpu, loop_cpu, commits = [], [], []
        n = 0
        for _ in range(rounds):
            b0 = store.stats["batches"]
            c, lc = time.process_time(), time.thread_time()
            for _k in range(turns):
                await tiny_turn(n)
                n += 1
            done = store.stats["batches"] - b0
            cpu.append((time.process_time() - c) * 1e6 / done)
            loop_cpu.append((time.thread_time() - lc) * 1e6 / done)
            commits.append(done / turns)
    finally:
        await store.close()
    return {
        "turns": turns,
        "rounds": rounds,
        "cpu_us_per_commit": statistics.median(cpu),
        "cpu_us_per_commit_spread": spread(cpu, digits=1),
        "loop_thread_cpu_us_per_commit": spread(loop_cpu, digits=1),
        "commits_per_turn": spread(commits, digits=2),
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.turncost")
    p.add_argument("what", choices=["start", "commit"])
    p.add_argument("--dir", required=True)
    p.add_argument("--turns", type=int, default=200)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--url", default=None)
    a = p.parse_args(argv)
    url = a.url or f"sqlite+aiosqlite:///{Path(a.dir) / f'turncost-{uuid.uuid4().hex[:8]}.db'}"
    run = _start_rounds if a.what == "start" else _commit_rounds
    print(json.dumps(asyncio.run(run(url, a.turns, a.rounds))), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
