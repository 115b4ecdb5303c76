"""The live path's costs against their floors, measured in the same run.

* ``paced_cpu``: N paced streams started at once (one upstream read per
  chunk, as real models stream); turnlog's process CPU per relayed chunk
  against the floor relay's, interleaved rounds. Batching cannot hide the
  per-chunk work here: every chunk wakes the whole path.
* ``burst_cpu``: a burst of N tiny turns started at once; the CPU of the
  event loop's thread (the main thread: the store's writer runs on another)
  per turn, against the write-ahead floor's loop thread for the same burst
  (``bench/floor.py /durable``: the least a relay that commits each request
  before it goes upstream can do). The loop is what one start queues behind.
* ``burst_procs_pg``: the burst of ``burst_starts`` (paced streams) through N
  ``turnlog serve`` processes on one PostgreSQL database sharing a port
  (``TURNLOG_REUSE_PORT``), N = 1, 2, 4; the median first chunk over the
  relay's, same round. Informational: how far spreading the starts over
  processes goes.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import time
from typing import Any

from bench.loadbench import BURST_CHUNKS, BURST_RATE, _p
from bench.procs import BenchError, cpu_seconds, free_port, thread_cpu_seconds
from bench.scenarios import Ctx, Profiler, _PgServer, body, check, failures, med, phase, spread


class LoopCpuMeter:
    """CPU seconds of a process's main thread (its event loop) and of the
    whole process between a client phase's start and end events."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.marks: dict[str, tuple[float, float]] = {}
        self.loop: dict[str, float] = {}
        self.process: dict[str, float] = {}

    def _now(self) -> tuple[float, float]:
        return thread_cpu_seconds(self.pid).get(self.pid, float("nan")), cpu_seconds(self.pid)

    def on_event(self, ev: dict[str, Any]) -> None:
        name = ev.get("name", "")
        if ev.get("event") == "phase_start":
            self.marks[name] = self._now()
        elif ev.get("event") == "phase_end" and name in self.marks:
            (l0, p0), (l1, p1) = self.marks.pop(name), self._now()
            self.loop[name] = l1 - l0
            self.process[name] = p1 - p0


def _warm(v1: str) -> dict[str, Any]:
    return phase("_warmup", v1, body(5, rate=200.0), requests=20, concurrency=20)


# --------------------------------------------------------------------------- paced


def paced_cpu(ctx: Ctx) -> dict[str, Any]:
    """Process CPU per chunk of paced streams started at once: turnlog / relay."""
    turns, chunks, rate, rounds = (50, 40, 20.0, 1) if ctx.quick else (200, 100, 20.0, 2)
    b = body(chunks, rate=rate)
    # The parse floor (informational): the least a relay that must see every
    # token does, parsing and serializing each chunk; no state, no storage.
    parse_v1 = ctx.floor_v1.rsplit("/v1", 1)[0] + "/parse/v1"
    us: dict[str, list[float]] = {"floor": [], "parse": [], "turnlog": []}
    loop_us: list[float] = []
    bad: list[str] = []
    for i in range(rounds):
        for who, v1, pid in (("floor", ctx.floor_v1, ctx.floor_pid), ("parse", parse_v1, ctx.floor_pid), ("turnlog", ctx.turnlog_v1, ctx.turnlog_pid)):
            meter = LoopCpuMeter(pid)
            ph = phase(who, v1, b, requests=turns, concurrency=turns, preconnect=True, announce=True)
            with Profiler(ctx, f"paced_cpu{i}", pid) if who == "turnlog" else contextlib.nullcontext():
                spec = {"phases": [_warm(v1), ph], "timeout_s": 60 + 3 * chunks / rate}
                res = ctx.procs.run_client(spec, name=f"c-pacedcpu-{who}{i}", on_event=meter.on_event)
            streams = res["phases"][-1]["streams"] if res.get("phases") else []
            bad += failures(streams, chunks) + ([res["error"]] if res.get("error") else [])
            us[who].append(meter.process.get(who, float("nan")) * 1e6 / (turns * chunks))
            if who == "turnlog":
                loop_us.append(meter.loop.get(who, float("nan")) * 1e6 / (turns * chunks))
            time.sleep(0.5)
    if bad:
        raise BenchError(f"paced_cpu: streams failed: {bad[:3]}")
    ratios = [t / f for t, f in zip(us["turnlog"], us["floor"])]
    parse_ratios = [p / f for p, f in zip(us["parse"], us["floor"])]
    return {
        "status": "ok",
        "checks": [
            check("paced_cpu_over_relay", med(ratios), "<=", 1.5),
            check("paced_cpu_parse_floor_over_relay", med(parse_ratios), "<=", 1.5, informational=True),
        ],
        "figures": {
            "turns": turns,
            "chunks_per_turn": chunks,
            "rate_chunks_per_s": rate,
            "rounds": rounds,
            "turnlog_cpu_us_per_chunk": spread(us["turnlog"], digits=1),
            "turnlog_loop_cpu_us_per_chunk": spread(loop_us, digits=1),
            "floor_cpu_us_per_chunk": spread(us["floor"], digits=1),
            "parse_floor_cpu_us_per_chunk": spread(us["parse"], digits=1),
            "ratio_per_round": spread(ratios, digits=3),
            "note": "all streams started in one pass of the client's loop; process CPU (all threads) over the phase "
            "/ (turns x chunks); ratio = turnlog / floor relay of the same round",
        },
    }


# --------------------------------------------------------------------------- burst


def burst_cpu(ctx: Ctx) -> dict[str, Any]:
    """Event-loop CPU per turn in a burst of starts: turnlog / the write-ahead floor."""
    turns, rounds = (100, 1) if ctx.quick else (200, 3)
    durable_v1 = ctx.floor_v1.rsplit("/v1", 1)[0] + "/durable/v1"
    tiny = body(5)
    loop_us: dict[str, list[float]] = {"durable": [], "turnlog": []}
    proc_us: dict[str, list[float]] = {"durable": [], "turnlog": []}
    ttfc: dict[str, list[float]] = {"durable": [], "turnlog": []}
    bad: list[str] = []
    for i in range(rounds):
        for who, v1, pid in (("durable", durable_v1, ctx.floor_pid), ("turnlog", ctx.turnlog_v1, ctx.turnlog_pid)):
            meter = LoopCpuMeter(pid)
            ph = phase(who, v1, tiny, requests=turns, concurrency=turns, preconnect=True, announce=True)
            with Profiler(ctx, f"burst_cpu{i}", pid) if who == "turnlog" else contextlib.nullcontext():
                res = ctx.procs.run_client({"phases": [_warm(v1), ph], "timeout_s": 120}, name=f"c-burstcpu-{who}{i}", on_event=meter.on_event)
            streams = res["phases"][-1]["streams"] if res.get("phases") else []
            bad += failures(streams, 5) + ([res["error"]] if res.get("error") else [])
            loop_us[who].append(meter.loop.get(who, float("nan")) * 1e6 / turns)
            proc_us[who].append(meter.process.get(who, float("nan")) * 1e6 / turns)
            ttfc[who].append(_p([r["ttfc"] * 1000 for r in streams if r.get("ttfc") is not None], "p50") or float("nan"))
            time.sleep(0.5)
    if bad:
        raise BenchError(f"burst_cpu: turns failed: {bad[:3]}")
    ratios = [t / d for t, d in zip(loop_us["turnlog"], loop_us["durable"])]
    return {
        "status": "ok",
        "checks": [check("burst_loop_cpu_over_write_ahead", med(ratios), "<=", 1.5)],
        "figures": {
            "turns": turns,
            "chunks_per_turn": 5,
            "rounds": rounds,
            "turnlog_loop_cpu_us_per_turn": spread(loop_us["turnlog"], digits=1),
            "write_ahead_loop_cpu_us_per_turn": spread(loop_us["durable"], digits=1),
            "turnlog_process_cpu_us_per_turn": spread(proc_us["turnlog"], digits=1),
            "write_ahead_process_cpu_us_per_turn": spread(proc_us["durable"], digits=1),
            "ratio_per_round": spread(ratios, digits=3),
            "turnlog_ttfc_p50_ms": spread(ttfc["turnlog"]),
            "write_ahead_ttfc_p50_ms": spread(ttfc["durable"]),
            "note": "tiny unpaced turns, all started in one pass of the client's loop; loop CPU = the main thread's "
            "(schedstat) over the phase / turns; ratio = turnlog / write-ahead floor (bench/floor.py /durable), same round",
        },
    }


# --------------------------------------------------------------------------- processes


def _postgres(ctx: Ctx) -> tuple[str, _PgServer]:
    server = _PgServer(ctx, "pg-procs")
    url = os.environ.get("TURNLOG_BENCH_POSTGRES_URL", "").strip()
    return (url or server.start()), server


def _burst_round(ctx: Ctx, name: str, v1: str, turns: int, chunks: int) -> dict[str, Any]:
    b = body(chunks, rate=BURST_RATE, stamp=True)
    spec = {
        "phases": [_warm(v1), phase(name, v1, b, requests=turns, concurrency=turns, preconnect=True)],
        "timeout_s": 60 + chunks / BURST_RATE * 3,
    }
    res = ctx.procs.run_client(spec, name=f"c-procs-{name}")
    streams = res["phases"][-1]["streams"] if res.get("phases") else []
    return {"ttfc": [r["ttfc"] * 1000 for r in streams if r.get("ttfc") is not None], "failed": failures(streams, chunks)}


def burst_procs_pg(ctx: Ctx) -> dict[str, Any]:
    """The burst of starts through N processes on PostgreSQL sharing a port."""
    # One round on two cores moves by tens of ms from run to run: the median
    # of three interleaved rounds per N is what is compared.
    turns, chunks, counts, rounds = (50, 20, (1, 2), 1) if ctx.quick else (200, BURST_CHUNKS, (1, 2, 4), 3)
    try:
        url, server = _postgres(ctx)
    except (OSError, subprocess.SubprocessError, RuntimeError) as exc:
        return {"status": "skipped", "reason": f"no PostgreSQL: TURNLOG_BENCH_POSTGRES_URL unset and {exc}"}
    per_n: dict[str, Any] = {}
    over: dict[int, float | None] = {}
    bad: list[str] = []
    try:
        for n in counts:
            port = free_port()
            env = {"TURNLOG_REUSE_PORT": "true"}
            procs = []
            try:
                for k in range(n):  # one after another: the first migrates the database
                    name = f"turnlog-pg{n}-{k}"
                    proc, v1 = ctx.procs.start_turnlog(name, ctx.upstream_v1, ctx.workdir / "unused.db", database_url=url, extra_env=env, port=port)
                    procs.append(proc)
                t50s: list[float | None] = []
                f50s: list[float | None] = []
                t99s: list[float | None] = []
                overs: list[float | None] = []
                for i in range(rounds):
                    f = _burst_round(ctx, f"floor-n{n}-{i}", ctx.floor_v1, turns, chunks)
                    t = _burst_round(ctx, f"turnlog-n{n}-{i}", v1, turns, chunks)
                    bad += t["failed"]
                    f50, t50 = _p(f["ttfc"], "p50"), _p(t["ttfc"], "p50")
                    f50s.append(f50)
                    t50s.append(t50)
                    t99s.append(_p(t["ttfc"], "p99"))
                    overs.append(t50 - f50 if t50 is not None and f50 is not None else None)
            finally:
                for proc in procs:
                    ctx.procs.stop(proc)
            over[n] = med(overs)
            per_n[str(n)] = {
                "ttfc_p50_ms": med(t50s),
                "floor_ttfc_p50_ms": med(f50s),
                "ttfc_p50_over_floor_ms": over[n],
                "ttfc_p50_over_floor_ms_per_round": [round(v, 1) if v is not None else None for v in overs],
                "ttfc_p99_ms": med(t99s),
            }
    finally:
        server.close()
    if bad:
        raise BenchError(f"burst_procs_pg: turns failed: {bad[:3]}")
    return {
        "status": "ok",
        "checks": [check(f"ttfc_p50_over_floor_ms_{n}_procs", over[n], "<=", 30.0, informational=True) for n in counts],
        "figures": {
            "turns": turns,
            "chunks_per_turn": chunks,
            "interval_ms": 1000 / BURST_RATE,
            "rounds": rounds,
            "processes": {k: {m: round(v, 3) if isinstance(v, float) else v for m, v in d.items()} for k, d in per_n.items()},
            "note": "N turnlog serve processes with TURNLOG_REUSE_PORT on one PostgreSQL database, one port; "
            "all requests sent in one pass of the client's loop; over floor = turnlog - floor relay, same N and round; "
            "figures are medians over the rounds",
        },
    }
