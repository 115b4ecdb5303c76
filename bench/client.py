"""The benchmark client: streams Chat Completions and counts chunks (own process).

    python -m bench.client --spec '{"phases": [...], "timeout_s": 60}'

A spec is a list of *phases*, run one after the other; each phase sends
``requests`` streaming POSTs of ``body`` to ``url`` with at most
``concurrency`` in flight (start times spread over ``ramp_s`` seconds). A phase
named ``_warmup`` is run but not reported. The result is ONE JSON line on stdout
(``{"phases": [{"name", "streams": [...], "agg": {...}}, ...]}``); with
``"progress": true`` a phase also prints ``{"event": "all_first_content"}``
once every one of its streams has received a content chunk (the orchestrator
samples the server's memory at that point); with ``"announce": true`` it prints
``{"event": "phase_start"|"phase_end", "name"}`` around the phase (the
orchestrator reads the server's CPU time there).

Cheap parsing: the body is read with ``iter_any()``, cut at the last newline,
and only counted: a content chunk is an SSE ``data:`` event whose delta starts
with ``{"content":`` (the role chunk, finish chunk and usage chunk do not
match), both in the upstream's bytes and in turnlog's. All chunks that arrive in
one read share that read's timestamp.

Per stream: HTTP status, time to the first byte of the body (``ttfb``), time to
the first content chunk (``ttfc``), time of the last content chunk, total time,
content chunks counted, whether ``[DONE]`` and an error event were seen, turnlog's
``X-Turn-Id``. Per phase (``agg``), when asked: the gaps between consecutive
content chunks (``gaps``) and, for a paced upstream with ``bench_stamp``, each
chunk's one-way delivery latency ``now - stamp`` (``stamps``), as percentiles
in milliseconds.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import sys
import time
from typing import Any

import aiohttp

CONTENT = b'"delta":{"content":'
DONE = b"data: [DONE]"
ERROR = b'data: {"error"'
STAMP = re.compile(rb'"delta":\{"content":"@([0-9]+\.[0-9]+) ')


def percentiles(values: list[float], qs: tuple[float, ...] = (0.5, 0.9, 0.99, 0.999)) -> dict[str, float]:
    if not values:
        return {"n": 0}
    s = sorted(values)
    out: dict[str, float] = {"n": len(s), "min": s[0], "max": s[-1], "mean": sum(s) / len(s)}
    for q in qs:
        k = min(len(s) - 1, max(0, int(round(q * (len(s) - 1)))))
        out[f"p{q * 100:g}"] = s[k]
    return out


async def one_stream(
    session: aiohttp.ClientSession, url: str, body: dict[str, Any], *, gaps: list[float] | None,
    lats: list[float] | None, on_first: Any,
) -> dict[str, Any]:
    now = time.monotonic
    r: dict[str, Any] = {"status": None, "n": 0, "done": False, "error": None, "bytes": 0}
    t0 = now()
    r["t0"] = t0
    first = None
    last = None
    try:
        async with session.post(url, json=body) as resp:
            r["status"] = resp.status
            r["turn_id"] = resp.headers.get("X-Turn-Id")
            if resp.status != 200:
                r["error"] = f"HTTP {resp.status}: {(await resp.text())[:300]}"
                r["total"] = now() - t0
                return r
            pending = b""
            n = 0
            nbytes = 0
            async for data in resp.content.iter_any():
                t = now()
                if r.get("ttfb") is None:
                    r["ttfb"] = t - t0
                nbytes += len(data)
                if pending:
                    data = pending + data
                cut = data.rfind(b"\n") + 1
                if cut == 0:
                    pending = data
                    continue
                part = data[:cut] if cut < len(data) else data
                pending = data[cut:]
                k = part.count(CONTENT)
                if k:
                    if first is None:
                        first = t
                        on_first()
                    elif gaps is not None:
                        gaps.append(t - last)  # type: ignore[operator]
                    if gaps is not None and k > 1:
                        gaps.extend([0.0] * (k - 1))
                    if lats is not None:
                        for m in STAMP.findall(part):
                            lats.append(t - float(m))
                    last = t
                    n += k
                if DONE in part:
                    r["done"] = True
                if ERROR in part:
                    r["error"] = part[part.find(ERROR) : part.find(ERROR) + 300].decode("utf-8", "replace")
            r["n"] = n
            r["bytes"] = nbytes
    except asyncio.CancelledError:  # the phase's deadline: record, do not propagate
        r["error"] = r["error"] or "timeout (client deadline)"
    except Exception as exc:  # noqa: BLE001 - a failed stream is a figure, not a crash
        r["error"] = f"{type(exc).__name__}: {exc}"
    finally:
        end = now()
        r["total"] = end - t0
        if first is not None:
            r["ttfc"] = first - t0
            r["t_last"] = last - t0  # type: ignore[operator]
    return r


async def run_phase(session: aiohttp.ClientSession, phase: dict[str, Any], deadline: float) -> dict[str, Any]:
    url = phase["url"]
    body = phase["body"]
    total = int(phase.get("requests", 1))
    conc = max(1, min(int(phase.get("concurrency", 1)), total))
    ramp = float(phase.get("ramp_s", 0.0))
    gaps: list[float] | None = [] if phase.get("gaps") else None
    lats: list[float] | None = [] if phase.get("stamps") else None
    progress = bool(phase.get("progress"))
    results: list[dict[str, Any] | None] = [None] * total
    firsts = 0
    announced = False

    def on_first() -> None:
        nonlocal firsts, announced
        firsts += 1
        if progress and not announced and firsts >= total:
            announced = True
            print(json.dumps({"event": "all_first_content", "n": firsts}), flush=True)

    next_index = 0
    stopped = False

    async def worker(w: int) -> None:
        nonlocal next_index
        if ramp > 0:
            await asyncio.sleep(ramp * w / conc)
        while next_index < total and not stopped:
            i = next_index
            next_index += 1
            results[i] = await one_stream(session, url, body, gaps=gaps, lats=lats, on_first=on_first)

    announce = bool(phase.get("announce"))
    if announce:
        print(json.dumps({"event": "phase_start", "name": phase.get("name")}), flush=True)
    tasks = [asyncio.create_task(worker(w)) for w in range(conc)]
    t0 = time.monotonic()
    _done, pending = await asyncio.wait(tasks, timeout=max(0.0, deadline - t0))
    if pending:
        stopped = True
        for t in pending:
            t.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
    wall = time.monotonic() - t0
    if announce:
        print(json.dumps({"event": "phase_end", "name": phase.get("name")}), flush=True)
    streams = [r if r is not None else {"error": "not run", "n": 0, "done": False} for r in results]
    for r in streams:
        r.pop("t0", None)
    agg: dict[str, Any] = {"wall": wall, "timed_out": bool(pending)}
    if gaps is not None:
        agg["gaps_ms"] = percentiles([g * 1000 for g in gaps])
    if lats is not None:
        agg["latency_ms"] = percentiles([x * 1000 for x in lats])
    return {"name": phase.get("name", "phase"), "streams": streams, "agg": agg}


async def run(spec: dict[str, Any]) -> dict[str, Any]:
    timeout = float(spec.get("timeout_s", 120))
    out: list[dict[str, Any]] = []
    connector = aiohttp.TCPConnector(limit=0, force_close=False)
    async with aiohttp.ClientSession(
        connector=connector, timeout=aiohttp.ClientTimeout(total=None, sock_connect=10, sock_read=timeout)
    ) as session:
        deadline = time.monotonic() + timeout
        for phase in spec["phases"]:
            res = await run_phase(session, phase, deadline)
            if phase.get("name") != "_warmup":
                out.append(res)
            if res["agg"]["timed_out"]:
                return {"phases": out, "error": f"client deadline of {timeout:g}s reached"}
    return {"phases": out}


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m bench.client", description=__doc__.split("\n")[0])
    p.add_argument("--spec", required=True, help="JSON spec (or @file)")
    args = p.parse_args(argv)
    raw = args.spec
    if raw.startswith("@"):
        with open(raw[1:], encoding="utf-8") as f:
            raw = f.read()
    result = asyncio.run(run(json.loads(raw)))
    sys.stdout.write(json.dumps(result) + "\n")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
