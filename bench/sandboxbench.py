"""The sandbox code executor's cost per run, in a subprocess of ``python -m bench``.

    python -m bench.sandboxbench [--runs 100] [--warmup 3]

Prints ONE JSON line. A run is ``await SandboxExecutor().run("print(1)",
"python")`` with the default limits, timed from the call to its result, runs
one after another (what one turn waits for). Interleaved with each run, the
floor: the same interpreter started the same way (``-I -S``, asyncio
subprocess, pipes) running ``print(1)`` and nothing else; ``overhead_ms`` is
the sandbox's cost above that floor (namespaces, mounts, two forks, limits,
privileges, the report).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
from typing import Any

from adapters.code import CodeLimits, SandboxExecutor
from bench.client import percentiles


async def floor_once() -> float:
    started = time.perf_counter()
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-I",
        "-S",
        "-c",
        "print(1)",
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env={"PATH": "/usr/bin:/bin"},
        start_new_session=True,
    )
    out, _ = await proc.communicate(b"")
    if out != b"1\n":
        raise RuntimeError(f"the floor printed {out!r}")
    return (time.perf_counter() - started) * 1000


async def main(runs: int, warmup: int) -> dict[str, Any]:
    executor = SandboxExecutor(CodeLimits())
    description = await executor.start()
    for _ in range(warmup):
        await executor.run("print(1)", "python")
        await floor_once()
    sandbox_ms: list[float] = []
    floor_ms: list[float] = []
    for _ in range(runs):
        started = time.perf_counter()
        out = await executor.run("print(1)", "python")
        sandbox_ms.append((time.perf_counter() - started) * 1000)
        if out.get("stdout") != "1\n" or out.get("stderr"):
            raise RuntimeError(f"the sandbox answered {out!r}")
        floor_ms.append(await floor_once())
    pct = percentiles(sandbox_ms, (0.5, 0.9, 0.99))
    floor_p50 = statistics.median(floor_ms)
    return {
        "runs": runs,
        "p50_ms": round(statistics.median(sandbox_ms), 2),
        "p90_ms": round(pct["p90"], 2),
        "p99_ms": round(pct["p99"], 2),
        "min_ms": round(pct["min"], 2),
        "max_ms": round(pct["max"], 2),
        "floor_p50_ms": round(floor_p50, 2),
        "overhead_p50_ms": round(statistics.median(sandbox_ms) - floor_p50, 2),
        "isolation": executor.report,
        "description": description,
    }


if __name__ == "__main__":
    p = argparse.ArgumentParser(prog="python -m bench.sandboxbench")
    p.add_argument("--runs", type=int, default=100)
    p.add_argument("--warmup", type=int, default=3)
    args = p.parse_args()
    print(json.dumps(asyncio.run(main(args.runs, args.warmup))), flush=True)
