"""Load scenarios: a burst of simultaneous turn starts, and thousands of streams.

* ``burst_starts``: N turns' requests (connections opened beforehand) leave the
  client in one pass of its event loop; each a paced stream (150 chunks at
  20 ms, stamped). Per delta the added latency (client arrival − upstream
  write), per turn the TTFC from the request's send; the same burst through the
  floor relay, interleaved, in the same run.
* ``thousands_sse`` / ``thousands_ws``: a fresh turnlog (SQLite) holding
  thousands of paced streams open at once, over SSE or over one WebSocket per
  client (``GET /v1/ws``), the clients spread over several processes so the
  client is never what is measured; the same SSE load through the floor for the
  added latency; turnlog's peak RSS.

Every client process reports raw samples (``"raw": true``); the figures are
computed over the union.
"""

from __future__ import annotations

import os
import resource
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import nullcontext
from typing import Any

from bench.client import percentiles
from bench.procs import BenchError, cpu_seconds, histograms, rss_kb, thread_cpu_seconds
from bench.scenarios import Ctx, Profiler, body, check, failures, med, phase, spread

BURST_CHUNKS, BURST_RATE = 150, 50.0  # 150 chunks at 20 ms


def _merge(results: list[dict[str, Any]]) -> dict[str, Any]:
    """One phase out of the measured (last) phase of several client processes."""
    streams: list[dict[str, Any]] = []
    lats: list[float] = []
    lat_at: list[float] | None = []
    errors = []
    for res in results:
        if res.get("error"):
            errors.append(res["error"])
        ph = res["phases"][-1] if res["phases"] else {"streams": [], "agg": {}}
        streams.extend(ph["streams"])
        raw = ph["agg"].get("latency_ms_raw", [])
        at = ph["agg"].get("latency_at_raw")
        lats.extend(raw)
        # Arrival times only where every sample of every process has one.
        if lat_at is not None and at is not None and len(at) == len(raw):
            lat_at.extend(at)
        else:
            lat_at = None
    return {"streams": streams, "lats": lats, "lat_at": lat_at, "errors": errors}


def _timeline(lats: list[float], ats: list[float] | None, step: float = 5.0) -> list[dict[str, Any]] | None:
    """The per-delta latency over the round, ``step`` seconds at a time from
    the first arrival: how a backlog builds (the ramp's starts on top of the
    streams) and drains."""
    if not ats or len(ats) != len(lats):
        return None
    t0 = min(ats)
    buckets: dict[int, list[float]] = {}
    for lat, at in zip(lats, ats):
        buckets.setdefault(int((at - t0) // step), []).append(lat)
    out = []
    for k in sorted(buckets):
        p = percentiles(buckets[k])
        out.append({"from_s": k * step, "n": len(buckets[k]), "p50_ms": round(p["p50"], 1), "p99_ms": round(p["p99"], 1)})
    return out


def _clients(ctx: Ctx, specs: list[dict[str, Any]], name: str, argv: list[str] | None = None) -> dict[str, Any]:
    """Run one client process per spec, all at once; their merged measured phase."""
    with ThreadPoolExecutor(len(specs)) as pool:
        futures = [pool.submit(ctx.procs.run_client, spec, name=f"{name}-{i}", argv=argv) for i, spec in enumerate(specs)]
        return _merge([f.result() for f in futures])


def _max_open(streams: list[dict[str, Any]]) -> int:
    """The most streams open at one instant (send → end, host monotonic clock)."""
    marks = []
    for r in streams:
        if r.get("t_send") is not None and r.get("t_end") is not None:
            marks += [(r["t_send"], 1), (r["t_end"], -1)]
    best = cur = 0
    for _, d in sorted(marks):
        cur += d
        best = max(best, cur)
    return best


class RssPeak:
    """Samples a process's VmRSS every ``every`` s in a thread; ``peak`` in kB."""

    def __init__(self, pid: int, every: float = 0.25) -> None:
        self.pid, self.every = pid, every
        self.samples: list[int] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.samples.append(rss_kb(self.pid))
            except (OSError, BenchError):
                return
            self._stop.wait(self.every)

    def __enter__(self) -> RssPeak:
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    @property
    def peak(self) -> int | None:
        return max(self.samples) if self.samples else None


def _p(values: list[float], q: str) -> float | None:
    return percentiles(values).get(q)


def _lat_figures(lats: list[float]) -> dict[str, Any]:
    pc = percentiles(lats)
    return {k: round(v, 3) if isinstance(v, float) else v for k, v in pc.items()}


# --------------------------------------------------------------------------- burst


def burst_starts(ctx: Ctx) -> dict[str, Any]:
    """N turns started at the same instant; turnlog vs the floor, interleaved rounds."""
    turns = 50 if ctx.quick else 200
    rounds = 1 if ctx.quick else 3
    b = body(BURST_CHUNKS, rate=BURST_RATE, stamp=True)
    per_round: list[dict[str, float | None]] = []
    all_failed: list[str] = []
    keep: dict[str, Any] = {}
    # The write-ahead floor (bench/floor.py /durable): the least a relay that
    # commits each request before sending it upstream can do, as turnlog must.
    durable_v1 = ctx.floor_v1.rsplit("/v1", 1)[0] + "/durable/v1"
    for i in range(rounds):
        got: dict[str, dict[str, Any]] = {}
        for who, v1 in (("floor", ctx.floor_v1), ("durable", durable_v1), ("turnlog", ctx.turnlog_v1)):
            spec = {
                "phases": [
                    phase("_warmup", v1, body(5, rate=200.0, stamp=True), requests=20, concurrency=20),
                    phase(who, v1, b, requests=turns, concurrency=turns, preconnect=True, stamps=True, raw=True),
                ],
                "timeout_s": 60 + BURST_CHUNKS / BURST_RATE * 3,
            }
            with Profiler(ctx, "burst_starts", ctx.turnlog_pid) if who == "turnlog" and i == 0 else nullcontext():
                got[who] = _merge([ctx.procs.run_client(spec, name=f"c-burst-{who}{i}")])
            time.sleep(0.5)
        f, d, t = got["floor"], got["durable"], got["turnlog"]
        failed = failures(t["streams"], BURST_CHUNKS)
        all_failed += failed
        f_ttfc = [r["ttfc"] * 1000 for r in f["streams"] if r.get("ttfc") is not None]
        d_ttfc = [r["ttfc"] * 1000 for r in d["streams"] if r.get("ttfc") is not None]
        t_ttfc = [r["ttfc"] * 1000 for r in t["streams"] if r.get("ttfc") is not None]
        fl, tl = percentiles(f["lats"]), percentiles(t["lats"])
        per_round.append(
            {
                "added_p50_ms": tl.get("p50", float("nan")) - fl.get("p50", float("nan")),
                "added_p99_ms": tl.get("p99", float("nan")) - fl.get("p99", float("nan")),
                "turnlog_p99_ms": tl.get("p99"),
                "floor_p99_ms": fl.get("p99"),
                "ttfc_p50_ms": _p(t_ttfc, "p50"),
                "floor_ttfc_p50_ms": _p(f_ttfc, "p50"),
                "ttfc_p50_over_floor_ms": (_p(t_ttfc, "p50") or float("nan")) - (_p(f_ttfc, "p50") or float("nan")),
                "durable_floor_ttfc_p50_ms": _p(d_ttfc, "p50"),
                "durable_floor_over_floor_ms": (_p(d_ttfc, "p50") or float("nan")) - (_p(f_ttfc, "p50") or float("nan")),
                "ttfc_p50_over_durable_floor_ms": (_p(t_ttfc, "p50") or float("nan")) - (_p(d_ttfc, "p50") or float("nan")),
                "durable_floor_failed": len(failures(d["streams"], BURST_CHUNKS)),
                "ttfc_p99_ms": _p(t_ttfc, "p99"),
                "floor_failed": len(failures(f["streams"], BURST_CHUNKS)),
                "turnlog_failed": len(failed),
            }
        )
        if i == 0:
            keep = {"floor_latency_ms_round0": _lat_figures(f["lats"]), "turnlog_latency_ms_round0": _lat_figures(t["lats"])}
    add99 = med([r["added_p99_ms"] for r in per_round])
    over = med([r["ttfc_p50_over_floor_ms"] for r in per_round])
    over_durable = med([r["ttfc_p50_over_durable_floor_ms"] for r in per_round])
    return {
        "status": "ok",
        "checks": [
            check("added_latency_p99_ms", add99, "<=", 25.0),
            check("ttfc_p50_over_floor_ms", over, "<=", 30.0),
            check("ttfc_p50_over_durable_floor_ms", over_durable, "<=", 30.0, informational=True),
            check("failed_turns", float(len(all_failed)), "<=", 0.0),
        ],
        "figures": {
            "turns": turns,
            "rounds": rounds,
            "chunks_per_turn": BURST_CHUNKS,
            "interval_ms": 1000 / BURST_RATE,
            "added_p50_ms": spread([r["added_p50_ms"] for r in per_round]),
            "added_p99_ms": spread([r["added_p99_ms"] for r in per_round]),
            "ttfc_p50_ms": spread([r["ttfc_p50_ms"] for r in per_round]),
            "floor_ttfc_p50_ms": spread([r["floor_ttfc_p50_ms"] for r in per_round]),
            "ttfc_p50_over_floor_ms": spread([r["ttfc_p50_over_floor_ms"] for r in per_round]),
            "durable_floor_ttfc_p50_ms": spread([r["durable_floor_ttfc_p50_ms"] for r in per_round]),
            "durable_floor_over_floor_ms": spread([r["durable_floor_over_floor_ms"] for r in per_round]),
            "ttfc_p50_over_durable_floor_ms": spread([r["ttfc_p50_over_durable_floor_ms"] for r in per_round]),
            "per_round": [{k: (round(v, 3) if isinstance(v, float) else v) for k, v in r.items()} for r in per_round],
            **keep,
            "turnlog_failures_sample": all_failed[:5],
            "note": "all requests sent in one pass of the client's loop over connections opened beforehand; "
            "latency = client arrival - upstream write stamp; added = turnlog - floor of the same round",
        },
    }


#: Quotas high enough never to refuse a turn of the bench: what is measured
#: is their bookkeeping on each start (the count, the day's tokens).
QUOTA_ENV = {"TURNLOG_QUOTA_REQUESTS_PER_MINUTE": "100000000", "TURNLOG_QUOTA_TOKENS_PER_DAY": "1000000000000"}


def burst_quota(ctx: Ctx) -> dict[str, Any]:
    """The burst of ``burst_starts`` against two fresh turnlogs, one with
    quotas set (``QUOTA_ENV``) and one without, in interleaved rounds (the
    order alternates): the median first chunk with quotas minus without."""
    turns = 50 if ctx.quick else 200
    rounds = 3 if ctx.quick else 5
    b = body(BURST_CHUNKS, rate=BURST_RATE, stamp=True)
    servers = {}
    for who, env in (("plain", {}), ("quota", QUOTA_ENV)):
        proc, v1 = ctx.procs.start_turnlog(f"turnlog-burst-{who}", ctx.upstream_v1, ctx.workdir / f"turnlog-burst-{who}.db", extra_env=env)
        servers[who] = (proc, v1)
    per_round: list[dict[str, float | None]] = []
    failed: list[str] = []
    try:
        for i in range(rounds):
            ttfc: dict[str, float | None] = {}
            for who in ("plain", "quota") if i % 2 == 0 else ("quota", "plain"):
                v1 = servers[who][1]
                spec = {
                    "phases": [
                        phase("_warmup", v1, body(5, rate=200.0, stamp=True), requests=20, concurrency=20),
                        phase(who, v1, b, requests=turns, concurrency=turns, preconnect=True, stamps=True, raw=True),
                    ],
                    "timeout_s": 60 + BURST_CHUNKS / BURST_RATE * 3,
                }
                got = _merge([ctx.procs.run_client(spec, name=f"c-burstq-{who}{i}")])
                failed += failures(got["streams"], BURST_CHUNKS)
                ttfc[who] = _p([r["ttfc"] * 1000 for r in got["streams"] if r.get("ttfc") is not None], "p50")
                time.sleep(0.5)
            plain, quota = ttfc["plain"], ttfc["quota"]
            over = None if plain is None or quota is None else quota - plain
            per_round.append({"plain_ttfc_p50_ms": plain, "quota_ttfc_p50_ms": quota, "quota_over_plain_ms": over})
    finally:
        for proc, _ in servers.values():
            ctx.procs.stop(proc)
    over = med([r["quota_over_plain_ms"] for r in per_round])
    return {
        "status": "ok",
        "checks": [
            # A 2 ms difference is below what a --quick run on a busy host can tell.
            check("quota_ttfc_p50_over_plain_ms", over, "<=", 2.0, informational=ctx.quick),
            check("failed_turns", float(len(failed)), "<=", 0.0),
        ],
        "figures": {
            "turns": turns,
            "rounds": rounds,
            "quota_env": QUOTA_ENV,
            "plain_ttfc_p50_ms": spread([r["plain_ttfc_p50_ms"] for r in per_round]),
            "quota_ttfc_p50_ms": spread([r["quota_ttfc_p50_ms"] for r in per_round]),
            "quota_over_plain_ms": spread([r["quota_over_plain_ms"] for r in per_round]),
            "per_round": [{k: (round(v, 3) if isinstance(v, float) else v) for k, v in r.items()} for r in per_round],
            "failures_sample": failed[:5],
        },
    }


# --------------------------------------------------------------------------- thousands


def _thousands_plan(ctx: Ctx) -> dict[str, Any]:
    if ctx.quick:
        return {"streams": 300, "procs": 2, "chunks": 20, "rate": 4.0, "ramp": 1.0}
    # 2,000 streams at 2 chunks/s (4,000 chunks/s in all: a 2-core host runs the
    # clients, the upstream and turnlog); starts spread over 10 s, each stream
    # 30 s long, so all are open together for ~20 s.
    # BENCH_THOUSANDS_STREAMS overrides the count (a smaller reproduction).
    streams = int(os.environ.get("BENCH_THOUSANDS_STREAMS", "2000"))
    return {"streams": streams, "procs": 4, "chunks": 60, "rate": 2.0, "ramp": 10.0}


def _sse_specs(v1: str, plan: dict[str, Any], who: str) -> list[dict[str, Any]]:
    per = plan["streams"] // plan["procs"]
    b = body(plan["chunks"], rate=plan["rate"], stamp=True)
    duration = plan["ramp"] + plan["chunks"] / plan["rate"]
    return [
        {
            "phases": [phase(who, v1, b, requests=per, concurrency=per, ramp_s=plan["ramp"], stamps=True, raw=True, seed=i + 1)],
            "timeout_s": 60 + 3 * duration,
        }
        for i in range(plan["procs"])
    ]


def _thousands_database() -> str | None:
    """``BENCH_THOUSANDS_DATABASE_URL``: the store of the turnlog under the
    thousands load (e.g. a PostgreSQL URL) instead of a fresh SQLite file."""
    return os.environ.get("BENCH_THOUSANDS_DATABASE_URL", "").strip() or None


def _fresh_turnlog(ctx: Ctx, name: str) -> tuple[Any, str]:
    proc, v1 = ctx.procs.start_turnlog(name, ctx.upstream_v1, ctx.workdir / f"{name}.db", database_url=_thousands_database())
    warm = [phase("_warmup", v1, body(5, rate=100.0), requests=40, concurrency=20)]
    ctx.procs.run_client({"phases": warm, "timeout_s": 60}, name=f"c-{name}-warm")
    return proc, v1


def _harness_cpu(ctx: Ctx) -> float:
    """CPU seconds so far of the benchmark's clients (reaped children) and the
    upstream: what competes with the server under test for the host."""
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    upstream = cpu_seconds(ctx.upstream_pid) if ctx.upstream_pid else 0.0
    return ru.ru_utime + ru.ru_stime + upstream


def _thread_split(before: dict[int, float], after: dict[int, float], pid: int) -> dict[str, float]:
    """The CPU each thread took between two samples: the event loop's (main
    thread), the busiest other thread's, and all other threads' together (a
    thread that exited before ``after`` is not counted)."""
    took = {tid: cpu - before.get(tid, 0.0) for tid, cpu in after.items()}
    others = [cpu for tid, cpu in took.items() if tid != pid]
    return {"loop": took.get(pid, 0.0), "other_max": max(others, default=0.0), "others": sum(others)}


def _floor_round(ctx: Ctx, plan: dict[str, Any]) -> dict[str, Any]:
    if "thousands_floor" not in ctx.cache:
        # The floor process's CPU over its round (all threads, /proc/PID/stat),
        # as turnlog's is measured: the gap per chunk is then known.
        cpu0 = cpu_seconds(ctx.floor_pid) if ctx.floor_pid else None
        got = _clients(ctx, _sse_specs(ctx.floor_v1, plan, "floor"), "c-k-floor")
        got["cpu_s"] = cpu_seconds(ctx.floor_pid) - cpu0 if cpu0 is not None else None
        ctx.cache["thousands_floor"] = got
    return ctx.cache["thousands_floor"]


def _thousands(ctx: Ctx, ws: bool) -> dict[str, Any]:
    plan = _thousands_plan(ctx)
    n = plan["streams"]
    floor = _floor_round(ctx, plan)
    name = "turnlog-ws" if ws else "turnlog-k"
    proc, v1 = _fresh_turnlog(ctx, name)
    try:
        cpu0 = cpu_seconds(proc.pid)
        threads0 = thread_cpu_seconds(proc.pid)
        harness0 = _harness_cpu(ctx)
        t0 = time.monotonic()
        with RssPeak(proc.pid) as rss, Profiler(ctx, name, proc.pid):
            if ws:
                url = v1.replace("http://", "ws://") + "/ws"
                per = n // plan["procs"]
                b = body(plan["chunks"], rate=plan["rate"], stamp=True)
                duration = plan["ramp"] + plan["chunks"] / plan["rate"]
                specs = [
                    {"url": url, "clients": per, "body": b, "ramp_s": plan["ramp"], "seed": i + 1, "timeout_s": 60 + 3 * duration} for i in range(plan["procs"])
                ]
                if os.environ.get("BENCH_WS_DELTAS") == "0":  # the opt-in events-only mode
                    for spec in specs:
                        spec["deltas"] = False
                got = _clients(ctx, specs, "c-k-ws", argv=[sys.executable, "-m", "bench.wsclient"])
            else:
                got = _clients(ctx, _sse_specs(v1, plan, "turnlog"), "c-k-sse")
        cpu = cpu_seconds(proc.pid) - cpu0
        # Warm-up included: its few collections and commits are short.
        seen = histograms(v1, ("turnlog_gc_pause_seconds", "turnlog_store_commit_seconds", "turnlog_store_wait_seconds")) or {}
        threads = _thread_split(threads0, thread_cpu_seconds(proc.pid), proc.pid)
        harness = _harness_cpu(ctx) - harness0
        wall = time.monotonic() - t0
        rss_idle = rss_kb(proc.pid)
    finally:
        ctx.procs.stop(proc)
    # A WebSocket that upgraded (101) counts as a good start, as an SSE 200 does.
    failed = failures([{**r, "status": 200 if r.get("status") == 101 else r.get("status")} for r in got["streams"]], plan["chunks"])
    fl, tl = percentiles(floor["lats"]), percentiles(got["lats"])
    add99 = tl.get("p99", float("nan")) - fl.get("p99", float("nan"))
    ttfc = [r["ttfc"] * 1000 for r in got["streams"] if r.get("ttfc") is not None]
    peak = rss.peak
    return {
        "status": "ok",
        "checks": [
            check("failed_turns", float(len(failed) + len(got["errors"])), "<=", 0.0),
            check("added_latency_p99_ms", add99, "<=", 50.0),
            check("turnlog_rss_mb", peak / 1024 if peak else None, "<=", 400.0),
        ],
        "figures": {
            **{k: plan[k] for k in ("streams", "chunks", "rate", "ramp")},
            "client_processes": plan["procs"],
            "transport": "websocket" if ws else "sse",
            "ws_deltas": (os.environ.get("BENCH_WS_DELTAS") != "0") if ws else None,
            "max_open_streams": _max_open(got["streams"]),
            "floor_max_open_streams": _max_open(floor["streams"]),
            "added_p50_ms": round(tl.get("p50", float("nan")) - fl.get("p50", float("nan")), 3),
            "added_p99_ms": round(add99, 3),
            "turnlog_latency_ms": _lat_figures(got["lats"]),
            "floor_latency_ms": _lat_figures(floor["lats"]),
            "turnlog_ttfc_ms": _lat_figures(ttfc),
            "turnlog_latency_by_5s": _timeline(got["lats"], got.get("lat_at")),
            # The garbage collector's pauses (each stops the event loop): count,
            # total and the histogram bound of the longest (GET /metrics).
            "turnlog_gc_pauses": seen.get("turnlog_gc_pause_seconds"),
            # The store's group commits, and the waits of turns held back
            # until one of their windows was durable (backpressure: a turn
            # stops reading the upstream meanwhile, so its deltas come late).
            "turnlog_store_commits": seen.get("turnlog_store_commit_seconds", {}).get(""),
            "turnlog_store_waits": seen.get("turnlog_store_wait_seconds", {}).get(""),
            "rss_peak_mb": round(peak / 1024, 1) if peak else None,
            "rss_after_mb": round(rss_idle / 1024, 1),
            "rss_samples": len(rss.samples),
            # turnlog's process CPU over the whole load (all threads), and per
            # streamed chunk: what the transport costs, less noisy than p99.
            "turnlog_cpu_s": round(cpu, 2),
            "turnlog_cpu_us_per_chunk": round(cpu / (n * plan["chunks"]) * 1e6, 1),
            # What shared the host with turnlog over its round: the client
            # processes (reaped, RUSAGE_CHILDREN) and the upstream, in cores
            # (CPU seconds / the round's wall time), beside turnlog's own.
            "round_s": round(wall, 1),
            "turnlog_cores": round(cpu / wall, 2) if wall > 0 else None,
            "harness_cores": round(harness / wall, 2) if wall > 0 else None,
            # The same CPU split by thread: the event loop's (the main thread)
            # against its budget per chunk (one core ÷ the chunks per second
            # the load streams), and the busiest other thread (the store's writer).
            "loop_thread_cpu_s": round(threads["loop"], 2),
            "loop_thread_cpu_us_per_chunk": round(threads["loop"] / (n * plan["chunks"]) * 1e6, 1),
            "loop_thread_budget_us_per_chunk": round(1e6 / (n * plan["rate"]), 1),
            "busiest_other_thread_cpu_s": round(threads["other_max"], 2),
            "other_threads_cpu_s": round(threads["others"], 2),
            "floor_cpu_s": round(floor["cpu_s"], 2) if floor.get("cpu_s") is not None else None,
            "floor_cpu_us_per_chunk": round(floor["cpu_s"] / (n * plan["chunks"]) * 1e6, 1) if floor.get("cpu_s") is not None else None,
            "failed": len(failed),
            "failures_sample": failed[:5] + got["errors"][:2],
            "floor_failed": len(failures(floor["streams"], plan["chunks"])),
            "store": "BENCH_THOUSANDS_DATABASE_URL" if _thousands_database() else "a fresh SQLite file",
            "note": "a fresh turnlog (warmed up with 40 turns) on the store above; streams paced and stamped; "
            "added = turnlog's percentile - the floor's (the same SSE load through the floor relay, same run)",
        },
    }


def thousands_sse(ctx: Ctx) -> dict[str, Any]:
    """Thousands of concurrent paced SSE streams on one turnlog process."""
    return _thousands(ctx, ws=False)


def thousands_ws(ctx: Ctx) -> dict[str, Any]:
    """The same over one WebSocket per client (``GET /v1/ws``)."""
    return _thousands(ctx, ws=True)
