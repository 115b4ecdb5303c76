"""How many function calls the event loop makes per streamed chunk and per
turn start, counted inside ``turnlog serve``: figures that, unlike CPU times,
a busy shared host does not blur, so a change to the live path shows its
effect in one run.

* ``python -m bench.callcount serve ARGS…`` is ``turnlog serve ARGS…`` with
  two signal handlers: SIGUSR1 starts counting the calls of the main thread
  (the event loop's; ``cProfile``, which sees one thread), SIGUSR2 stops and
  writes the counts, grouped by where the function lives, to the JSON file
  ``$BENCH_CALLCOUNT_OUT``.
* Scenario ``live_calls``: paced streams of two lengths (the difference is
  the cost of the extra chunks alone) and a burst of tiny turns, each phase
  counted on its own. A Python function's call is one frame run; a C call
  (a builtin, a C method) is counted apart.
"""

from __future__ import annotations

import cProfile
import json
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

#: Where a function lives -> its group; the first match wins.
GROUPS = (
    ("/engine/", "turnlog"),
    ("/adapters/", "turnlog"),
    ("/aiohttp/", "aiohttp"),
    ("/pydantic", "pydantic"),
    ("/asyncio/", "asyncio"),
)


def group_of(filename: str) -> str:
    """The group of a function defined in ``filename`` (``~``: a C function)."""
    if filename == "~":
        return "c_calls"
    for part, group in GROUPS:
        if part in filename:
            return group
    return "other_python"


def counts(profile: cProfile.Profile) -> dict[str, int]:
    """Calls of the profiled span by group (``python`` the sum of the Python ones)."""
    import pstats

    out: dict[str, int] = {}
    for (filename, _line, _name), (_prim, calls, *_rest) in pstats.Stats(profile).stats.items():  # type: ignore[attr-defined]
        group = group_of(filename)
        out[group] = out.get(group, 0) + calls
    out["python"] = sum(v for k, v in out.items() if k != "c_calls")
    return out


def serve(argv: list[str]) -> int:
    out = Path(os.environ["BENCH_CALLCOUNT_OUT"])
    profile: cProfile.Profile | None = None

    def start(_sig: int, _frame: Any) -> None:
        nonlocal profile
        profile = cProfile.Profile()
        profile.enable()

    def stop(_sig: int, _frame: Any) -> None:
        nonlocal profile
        if profile is None:
            return
        profile.disable()
        tmp = out.with_suffix(".tmp")
        tmp.write_text(json.dumps(counts(profile)))
        tmp.replace(out)  # whole, for the scenario that waits for it
        profile = None

    signal.signal(signal.SIGUSR1, start)
    signal.signal(signal.SIGUSR2, stop)
    from adapters.cli import main

    return main(argv)


# --------------------------------------------------------------------------- scenario


def live_calls(ctx: Any) -> dict[str, Any]:
    """Calls per chunk of paced streams and per start in a burst (informational)."""
    from bench.livebench import _warm
    from bench.procs import BenchError
    from bench.scenarios import body, failures, phase

    streams, short, long, rate, burst = (20, 10, 30, 20.0, 50) if ctx.quick else (50, 20, 100, 20.0, 200)
    out = ctx.workdir / "callcount.json"
    proc, v1 = ctx.procs.start_turnlog(
        "turnlog-calls", ctx.upstream_v1, ctx.workdir / "turnlog-calls.db", module="bench.callcount", extra_env={"BENCH_CALLCOUNT_OUT": str(out)}
    )

    def counted(name: str, b: dict[str, Any], turns: int, chunks: int) -> dict[str, int]:
        out.unlink(missing_ok=True)

        def on_event(ev: dict[str, Any]) -> None:
            if ev.get("event") == "phase_start" and ev.get("name") == name:
                os.kill(proc.pid, signal.SIGUSR1)

        ph = phase(name, v1, b, requests=turns, concurrency=turns, preconnect=True, announce=True)
        res = ctx.procs.run_client({"phases": [_warm(v1), ph], "timeout_s": 60 + 3 * chunks / rate}, name=f"c-calls-{name}", on_event=on_event)
        bad = failures(res["phases"][-1]["streams"] if res.get("phases") else [], chunks) + ([res["error"]] if res.get("error") else [])
        if bad:
            raise BenchError(f"live_calls: {name}: {bad[:3]}")
        time.sleep(0.5)  # the turns' last steps after their answers (releasing the lease, retiring the actor)
        os.kill(proc.pid, signal.SIGUSR2)
        deadline = time.monotonic() + 30
        while not out.exists():
            if time.monotonic() > deadline:
                raise BenchError(f"live_calls: {name}: no counts written")
            time.sleep(0.05)
        result: dict[str, int] = json.loads(out.read_text())
        return result

    try:
        a = counted("short", body(short, rate=rate), streams, short)
        b = counted("long", body(long, rate=rate), streams, long)
        c = counted("burst", body(5), burst, 5)
    finally:
        ctx.procs.stop(proc)
    groups = sorted(set(a) | set(b) | set(c))
    extra_chunks = streams * (long - short)
    per_chunk = {g: round((b.get(g, 0) - a.get(g, 0)) / extra_chunks, 1) for g in groups}
    per_start = {g: round(a.get(g, 0) / streams - short * per_chunk[g], 1) for g in groups}
    per_burst_turn = {g: round(c.get(g, 0) / burst, 1) for g in groups}
    from bench.scenarios import check

    return {
        "status": "ok",
        # Ratchets, not goals: the counts when these checks were added (52 and
        # 827) plus 10 %, so a change that adds work to the live path shows
        # here even when the machine's noise hides it in the CPU figures.
        # Lower them when the counts fall.
        "checks": [
            check("turnlog_calls_per_chunk", per_chunk["turnlog"], "<=", 58.0),
            check("turnlog_calls_per_burst_turn", per_burst_turn["turnlog"], "<=", 910.0),
        ],
        "figures": {
            "calls_per_chunk": per_chunk,
            "calls_per_paced_start": per_start,
            "calls_per_burst_turn": per_burst_turn,
            "paced_streams": streams,
            "chunks_short_long": [short, long],
            "rate_chunks_per_s": rate,
            "burst_turns": burst,
            "burst_chunks_per_turn": 5,
            "note": "function calls of the event loop's thread (cProfile in turnlog serve), by where the function lives "
            "(turnlog: engine/ and adapters/; python: all Python functions; c_calls: builtins and C methods). "
            "Per chunk: (long - short phase) / the extra chunks; per paced start: the short phase per stream less its chunks'; "
            "per burst turn: 5-chunk unpaced turns started at once",
        },
    }


if __name__ == "__main__":
    if sys.argv[1:2] != ["serve"]:
        sys.exit("usage: python -m bench.callcount serve [turnlog serve options]")
    sys.exit(serve(sys.argv[1:]))
