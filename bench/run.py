"""``python -m bench``: run the scenarios, print ONE JSON object on stdout.

    python -m bench [--quick] [--scenarios a,b] [--json-out FILE] [--profile DIR] [--keep]

A readable table goes to stderr. Exit status: 0 all good; 1 a target missed
(full run) or a LARGE regression (``--quick``: below half the target for
"at least" figures, above twice the limit for "at most" figures); 2 a scenario
could not be measured; 130 interrupted. See ``bench/README.md``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import signal
import sqlite3
import subprocess
import sys
import tempfile
import time
import traceback
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from bench.procs import ROOT, BenchError, Procs, _cpu_times, wait_quiet
from bench.scenarios import NOT_IMPLEMENTED, SCENARIOS, Ctx

ORDER = [
    "ttfc",
    "long_answer",
    "cpu_per_chunk",
    "linearity",
    "concurrent_paced",
    "burst_starts",
    "burst_quota",
    "paced_cpu",
    "burst_cpu",
    "burst_procs_pg",
    "live_calls",
    "thousands_sse",
    "thousands_ws",
    "log_size",
    "append_throughput",
    "hash_chain",
    "replay_fold",
    "open_turns_rss",
    "tool_loop",
    "rag_ttfc",
    "rag_tool_loop",
    "web_fetch",
    "postgres",
    "vector_query",
    "openwebui",
    "knowledge_ingest",
    "knowledge_retrieval",
    "retrieval_quality",
    "sandbox",
    "waiting_turns_rss",
    "responses_cpu",
    "stalled_clients",
    "turn_cost",
    "turn_search",
]
assert set(ORDER) == set(SCENARIOS)
ALL = ORDER + list(NOT_IMPLEMENTED)


def _sigterm(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt


def host_info() -> dict[str, Any]:
    info: dict[str, Any] = {
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "sqlite": sqlite3.sqlite_version,
    }
    try:
        import aiohttp

        info["aiohttp"] = aiohttp.__version__
    except ImportError:  # pragma: no cover
        pass
    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True, timeout=5)
        dirty = subprocess.run(["git", "status", "--porcelain"], cwd=ROOT, capture_output=True, text=True, timeout=5)
        info["git"] = {"commit": commit.stdout.strip(), "dirty": bool(dirty.stdout.strip())}
    except (OSError, subprocess.SubprocessError):
        pass
    return info


def calibrate() -> dict[str, float]:
    """A fixed CPU yardstick (this process, nothing else of ours running): how fast
    the machine runs Python right now. Absolute figures (µs/chunk, TTFC, events/s)
    of two runs compare only as well as their yardsticks agree; ratios to the floor
    do not need it."""
    chunk = json.dumps(
        {
            "id": "chatcmpl-x",
            "object": "chat.completion.chunk",
            "created": 1,
            "model": "bench",
            "choices": [{"index": 0, "delta": {"content": " fox"}, "logprobs": None, "finish_reason": None}],
        }
    ).encode()
    loads = json.loads
    best_json = best_loop = float("inf")
    for _ in range(3):
        t = time.perf_counter()
        for _ in range(20_000):
            loads(chunk)
        best_json = min(best_json, (time.perf_counter() - t) / 20_000 * 1e6)
        t = time.perf_counter()
        x = 0
        for i in range(300_000):
            x += i
        best_loop = min(best_loop, (time.perf_counter() - t) / 300_000 * 1e9)
    return {"json_loads_chunk_us": round(best_json, 3), "py_add_loop_ns": round(best_loop, 1)}


class Servers:
    """The upstream, the floor and turnlog, shared by the scenarios."""

    def __init__(self, ctx: Ctx) -> None:
        self.ctx = ctx
        self.turnlog_proc: subprocess.Popen[bytes] | None = None
        self.restarts = 0

    def ensure(self) -> None:
        ctx = self.ctx
        py = sys.executable
        if not ctx.upstream_v1:
            upstream_proc, ctx.upstream_v1 = ctx.procs.start_url_server("upstream", [py, "-m", "bench.upstream", "--port", "0"])
            ctx.upstream_pid = upstream_proc.pid
        if not ctx.floor_v1:
            floor_proc, ctx.floor_v1 = ctx.procs.start_url_server("floor", [py, "-m", "bench.floor", "--upstream", ctx.upstream_v1, "--port", "0"])
            ctx.floor_pid = floor_proc.pid
        if self.turnlog_proc is None or self.turnlog_proc.poll() is not None:
            if self.turnlog_proc is not None:
                self.restarts += 1
            ctx.db_path = ctx.workdir / "turnlog.db"
            self.turnlog_proc, ctx.turnlog_v1 = ctx.procs.start_turnlog("turnlog", ctx.upstream_v1, ctx.db_path)
            ctx.turnlog_pid = self.turnlog_proc.pid


def _busy_snapshot(procs: Procs) -> tuple[float, float, float, float]:
    total, idle = _cpu_times()
    return time.monotonic(), total, idle, procs.cpu_used()


def _busy_since(snap: tuple[float, float, float, float], procs: Procs) -> dict[str, float]:
    """Average busy CPUs machine-wide since ``snap``, and how much of it was not ours
    (a test suite running next to the benchmark shows up in ``others``)."""
    t0, total0, idle0, ours0 = snap
    total, idle = _cpu_times()
    wall = time.monotonic() - t0
    if wall <= 0:
        return {}
    busy = ((total - total0) - (idle - idle0)) / wall
    ours = (procs.cpu_used() - ours0) / wall
    return {"all": round(busy, 2), "bench": round(ours, 2), "others": round(max(0.0, busy - ours), 2)}


def evaluate(result: dict[str, Any], quick: bool) -> None:
    checks = [c for c in result.get("checks") or [] if not c.get("informational")]  # reported, never counted
    result["pass"] = bool(checks) and all(c["pass"] for c in checks)
    result["large_regression"] = any(c["large_regression"] for c in checks)


def render_table(out: dict[str, Any]) -> str:
    rows = [("scenario", "status", "metric", "value", "target", "result")]
    for name, r in out["scenarios"].items():
        status = r["status"]
        if status != "ok":
            reason = r.get("reason") or r.get("error", "")
            rows.append((name, status, reason.splitlines()[0][:70] if reason else "", "", "", ""))
            continue
        for i, c in enumerate(r["checks"]):
            verdict = "pass" if c["pass"] else ("MISS (large)" if c["large_regression"] else "MISS")
            if c.get("informational"):
                verdict += " (info)"
            value = "n/a" if c["value"] is None else f"{c['value']:,.4g}"
            rows.append((name if i == 0 else "", status if i == 0 else "", c["metric"], value, f"{c['op']} {c['target']:g}", verdict))
    widths = [max(len(str(r[i])) for r in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(str(v).ljust(w) for v, w in zip(r, widths)).rstrip() for r in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench", description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true", help="reduced subset (< 60 s); fails only on a large regression")
    p.add_argument("--scenarios", help=f"comma-separated subset of: {', '.join(ALL)}")
    p.add_argument("--json-out", help="also write the JSON to this file")
    p.add_argument("--profile", metavar="DIR", help="py-spy record turnlog during ttfc, long_answer, concurrent_paced, paced_cpu and burst_cpu into DIR")
    p.add_argument(
        "--openwebui",
        metavar="VENV",
        help="also run the openwebui scenario: Open WebUI (installed in the virtualenv VENV) as a peer, beside turnlog",
    )
    p.add_argument("--keep", action="store_true", help="keep the work directory (databases, logs)")
    p.add_argument(
        "--turnlog-env",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a setting for the turnlog under test, e.g. TURNLOG_FLUSH_INTERVAL=0.02 (repeatable); TURNLOG_* variables of the environment are not passed on",
    )
    p.add_argument(
        "--quiet-wait",
        type=float,
        default=30.0,
        metavar="S",
        help="before each scenario wait up to S s for the host to be idle (default 30; no wait with --quick)",
    )
    args = p.parse_args(argv)

    selected = ALL if not args.scenarios else [s.strip() for s in args.scenarios.split(",") if s.strip()]
    unknown = [s for s in selected if s not in ALL]
    if unknown:
        p.error(f"unknown scenarios {unknown}; known: {', '.join(ALL)}")

    turnlog_env: dict[str, str] = {}
    for item in args.turnlog_env:
        key, sep, value = item.partition("=")
        if not sep or not key.startswith("TURNLOG_"):
            p.error(f"--turnlog-env wants TURNLOG_NAME=VALUE, got {item!r}")
        turnlog_env[key] = value

    calibration = {"start": calibrate()}
    signal.signal(signal.SIGTERM, _sigterm)
    # Ctrl-C always stops the run (a shell may start background jobs with SIGINT ignored).
    signal.signal(signal.SIGINT, signal.default_int_handler)
    started = time.monotonic()
    workdir = Path(tempfile.mkdtemp(prefix="turnlog-bench-", dir=os.environ.get("BENCH_DIR")))
    procs = Procs(workdir)
    procs.turnlog_env.update(turnlog_env)
    profile_dir = Path(args.profile).resolve() if args.profile else None
    if profile_dir:
        profile_dir.mkdir(parents=True, exist_ok=True)
    ctx = Ctx(procs=procs, quick=args.quick, workdir=workdir, profile_dir=profile_dir)
    if args.openwebui:
        ctx.cache["openwebui_venv"] = args.openwebui  # read by bench.peer_openwebui
    servers = Servers(ctx)
    results: dict[str, dict[str, Any]] = {}
    interrupted = False
    try:
        for name in ORDER:
            if name not in selected:
                continue
            if args.quick and not SCENARIOS[name][2]:
                results[name] = {"status": "skipped", "reason": "not part of --quick"}
                continue
            fn, needs_servers, _ = SCENARIOS[name]
            print(f"[bench] {name} ...", file=sys.stderr, flush=True)
            t0 = time.monotonic()
            try:
                if needs_servers:
                    servers.ensure()
                derived = name == "cpu_per_chunk" and "cpu_per_chunk" in ctx.cache  # measured in long_answer
                quiet = {"skipped": True} if derived else wait_quiet(0.0 if args.quick else args.quiet_wait)
                t0 = time.monotonic()
                cpu0 = _busy_snapshot(procs)
                r = fn(ctx)
                r["host"] = {"derived_from": "long_answer"} if derived else {"idle_wait": quiet, "busy_cores_during": _busy_since(cpu0, procs)}
            except BenchError as exc:
                r = {"status": "error", "error": str(exc)}
            except (OSError, ValueError, KeyError, TypeError, ZeroDivisionError, RuntimeError) as exc:
                r = {"status": "error", "error": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc(limit=5)}
            r["seconds"] = round(time.monotonic() - t0, 2)
            if r["status"] == "ok":
                evaluate(r, args.quick)
            results[name] = r
            print(f"[bench] {name}: {r['status']} in {r['seconds']}s", file=sys.stderr, flush=True)
    except KeyboardInterrupt:
        interrupted = True
        print("[bench] interrupted: stopping every process", file=sys.stderr, flush=True)
    finally:
        procs.close()
        if not args.keep:
            shutil.rmtree(workdir, ignore_errors=True)

    if not interrupted:
        calibration["end"] = calibrate()
    for name, reason in NOT_IMPLEMENTED.items():
        if name in selected:
            results[name] = {"status": "not_implemented", "reason": reason}

    measured = {k: v for k, v in results.items() if v["status"] == "ok"}
    missed = [k for k, v in measured.items() if not v["pass"]]
    large = [k for k, v in measured.items() if v["large_regression"]]
    errors = [k for k, v in results.items() if v["status"] == "error"]
    out: dict[str, Any] = {
        "bench": "turnlog",
        "version": 1,
        "mode": "quick" if args.quick else "full",
        "started_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "duration_s": round(time.monotonic() - started, 1),
        "host": {**host_info(), "calibration": calibration},
        "interrupted": interrupted,
        "turnlog_restarts": servers.restarts,
        "turnlog_env": procs.turnlog_env,
        "scenarios": {name: results[name] for name in ALL if name in results},
        "summary": {
            "passed": [k for k in measured if k not in missed],
            "missed": missed,
            "large_regressions": large,
            "errors": errors,
        },
    }
    if ctx.profiles:
        out["profiles"] = ctx.profiles
    if args.keep:
        out["workdir"] = str(workdir)
    text = json.dumps(out, indent=2)
    sys.stdout.write(text + "\n")
    sys.stdout.flush()
    if args.json_out:
        Path(args.json_out).write_text(text + "\n")
    print("\n" + render_table(out), file=sys.stderr)
    if interrupted:
        return 130
    if errors:
        print(f"\n[bench] could not measure: {', '.join(errors)}", file=sys.stderr)
        return 2
    failing = large if args.quick else missed
    if failing:
        what = "large regressions" if args.quick else "targets missed"
        print(f"\n[bench] {what}: {', '.join(failing)}", file=sys.stderr)
        return 1
    return 0
