"""The benchmark client: streams Chat Completions and counts chunks (own process).

    python -m bench.client --spec '{"phases": [...], "timeout_s": 60}'

A spec is a list of *phases*, run one after the other; each phase sends
``requests`` streaming POSTs of ``body`` to ``url`` (plus the optional request
``headers``, e.g. ``{"Authorization": "Bearer ..."}``) with at most
``concurrency`` in flight (workers start at random offsets in ``[0, ramp_s)``). A phase
named ``_warmup`` is run but not reported. The result is ONE JSON line on stdout
(``{"phases": [{"name", "streams": [...], "agg": {...}}, ...]}``); with
``"progress": true`` a phase also prints ``{"event": "all_first_content"}``
once every one of its streams has received a content chunk (the orchestrator
samples the server's memory at that point); with ``"announce": true`` it prints
``{"event": "phase_start"|"phase_end", "name"}`` around the phase (the
orchestrator reads the server's CPU time there).

Cheap parsing: a bare asyncio ``Protocol`` (HTTP/1.1, keep-alive per worker,
chunked transfer decoding) takes each read's arrival time first thing in
``data_received``; the body is cut at the last newline and only counted: a content chunk is an SSE ``data:`` event whose delta starts
with ``{"content":`` (the role chunk, finish chunk and usage chunk do not
match), both in the upstream's bytes and in turnlog's. All chunks that arrive in
one read share that read's timestamp.

Per stream: HTTP status, time to the first byte of the body (``ttfb``), time to
the first content chunk (``ttfc``), time of the last content chunk, total time,
content chunks counted, whether ``[DONE]`` and an error event were seen, turnlog's
``X-Turn-Id``. Per phase (``agg``), when asked: the gaps between consecutive
content chunks (``gaps``) and, for a paced upstream with ``bench_stamp``, each
chunk's one-way delivery latency ``now - stamp`` (``stamps``), as percentiles
in milliseconds; ``latency_ms_steady`` counts only the chunks that arrived
once every stream of the phase had received its first content chunk (the
steady state, after the burst of turn starts).

``"preconnect": true`` opens every worker's connection first and then sends
all the phase's first requests in one pass of the event loop (a burst of turn
starts at the same instant; ``ramp_s`` is ignored). ``"raw": true`` adds the
latency samples themselves (``agg.latency_ms_raw``, ms, two decimals) and each
stream's send and end times on the host's monotonic clock (``t_send``,
``t_end``), so the results of several client processes can be merged.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import re
import sys
import time
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any
from urllib.parse import urlsplit

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


class _Dechunk:
    """Undoes HTTP/1.1 chunked transfer coding, incrementally."""

    __slots__ = ("buf", "remaining", "skip", "eof")

    def __init__(self) -> None:
        self.buf = b""
        self.remaining = 0  # payload bytes left in the current chunk
        self.skip = 0  # CRLF bytes to drop after a chunk's payload
        self.eof = False

    def feed(self, data: bytes) -> bytes:
        if self.buf:
            data, self.buf = self.buf + data, b""
        out = []
        pos, end = 0, len(data)
        while pos < end and not self.eof:
            if self.remaining:
                take = min(self.remaining, end - pos)
                out.append(data[pos : pos + take])
                pos += take
                self.remaining -= take
                if not self.remaining:
                    self.skip = 2
            elif self.skip:
                take = min(self.skip, end - pos)
                pos += take
                self.skip -= take
            else:
                nl = data.find(b"\r\n", pos)
                if nl < 0:
                    self.buf = data[pos:]
                    break
                size = int(data[pos:nl].split(b";", 1)[0], 16)
                pos = nl + 2
                if size == 0:
                    self.eof = True
                else:
                    self.remaining = size
        return b"".join(out)


class _Stream(asyncio.Protocol):
    """One HTTP/1.1 connection; runs requests one after another (keep-alive).

    Everything is done in ``data_received``: the arrival time is taken there,
    before any other work, and counting needs no task wake-up.
    """

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.closed = asyncio.get_running_loop().create_future()
        self.r: dict[str, Any] | None = None

    # -- asyncio.Protocol ------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def connection_lost(self, exc: Exception | None) -> None:
        if self.r is not None and not self.done_fut.done():
            if not self.r.get("done") and self.r.get("error") is None:
                self.r["error"] = f"connection closed ({exc!r})" if exc else "connection closed by server"
            self.done_fut.set_result(None)
        if not self.closed.done():
            self.closed.set_result(None)

    def start(self, request: bytes, r: dict[str, Any], state: _PhaseState) -> asyncio.Future[None]:
        self.r = r
        self.state = state
        self.gaps, self.lats = state.gaps, state.lats
        self.head = b""
        self.headers_done = False
        self.dechunk: _Dechunk | None = None
        self.length: int | None = None
        self.body_left = 0
        self.pending = b""
        self.first: float | None = None
        self.last: float | None = None
        self.error_body = b""
        self.done_fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        r["t0"] = time.monotonic()
        assert self.transport is not None
        self.transport.write(request)
        return self.done_fut

    def data_received(self, data: bytes) -> None:
        t = time.monotonic()
        r = self.r
        if r is None or self.done_fut.done():
            return
        r["bytes"] += len(data)
        if not self.headers_done:
            self.head += data
            i = self.head.find(b"\r\n\r\n")
            if i < 0:
                return
            self._headers(self.head[:i].decode("latin-1"))
            self.headers_done = True
            data, self.head = self.head[i + 4 :], b""
            r["ttfb"] = t - r["t0"]
            if not data and not self._finished():
                return
        if self.dechunk is not None:
            data = self.dechunk.feed(data)
        elif self.length is not None:
            data = data[: self.body_left]
            self.body_left -= len(data)
        if r["status"] != 200:
            self.error_body += data
        elif data:
            self._body(data, t)
        if self._finished():
            self._end(t)

    # -- parsing ---------------------------------------------------------------

    def _headers(self, head: str) -> None:
        lines = head.split("\r\n")
        r = self.r
        assert r is not None
        r["status"] = int(lines[0].split(" ", 2)[1])
        chunked = False
        for line in lines[1:]:
            k, _, v = line.partition(":")
            k = k.strip().lower()
            v = v.strip()
            if k == "transfer-encoding" and "chunked" in v.lower():
                chunked = True
            elif k == "content-length":
                self.length = int(v)
                self.body_left = int(v)
            elif k == "x-turn-id":
                r["turn_id"] = v
        if chunked:
            self.dechunk = _Dechunk()
            self.length = None

    def _finished(self) -> bool:
        if self.dechunk is not None:
            return self.dechunk.eof
        if self.length is not None:
            return self.body_left <= 0
        return False  # until the server closes

    def _body(self, data: bytes, t: float) -> None:
        r = self.r
        assert r is not None
        if self.pending:
            data = self.pending + data
        cut = data.rfind(b"\n") + 1
        if cut == 0:
            self.pending = data
            return
        part = data[:cut] if cut < len(data) else data
        self.pending = data[cut:]
        k = part.count(CONTENT)
        if k:
            gaps = self.gaps
            if self.first is None:
                self.first = t
                self.state.on_first()
            elif gaps is not None:
                gaps.append(t - self.last)  # type: ignore[operator]
            if gaps is not None and k > 1:
                gaps.extend([0.0] * (k - 1))
            if self.lats is not None:
                steady = self.state.lats_steady if self.state.all_started else None
                at = self.state.lat_at
                for m in STAMP.findall(part):
                    self.lats.append(t - float(m))
                    if steady is not None:
                        steady.append(t - float(m))
                    if at is not None:
                        at.append(t)
            self.last = t
            r["n"] += k
        if DONE in part:
            r["done"] = True
        if ERROR in part:
            i = part.find(ERROR)
            r["error"] = part[i : i + 300].decode("utf-8", "replace")

    def _end(self, t: float) -> None:
        r = self.r
        assert r is not None
        if r["status"] != 200:
            r["error"] = f"HTTP {r['status']}: {self.error_body[:300].decode('utf-8', 'replace')}"
        if not self.done_fut.done():
            self.done_fut.set_result(None)


class _Conn:
    """A worker's keep-alive connection, reopened when the server closed it."""

    def __init__(self, host: str, port: int) -> None:
        self.host, self.port = host, port
        self.proto: _Stream | None = None

    async def get(self) -> _Stream:
        if self.proto is None or self.proto.closed.done() or self.proto.transport is None or self.proto.transport.is_closing():
            loop = asyncio.get_running_loop()
            _, proto = await loop.create_connection(_Stream, self.host, self.port)
            self.proto = proto
        return self.proto

    def close(self) -> None:
        if self.proto is not None and self.proto.transport is not None:
            self.proto.transport.close()


def build_request(url: str, body: dict[str, Any], headers: dict[str, str] | None = None) -> tuple[str, int, bytes]:
    u = urlsplit(url)
    payload = json.dumps(body).encode()
    extra = "".join(f"{k}: {v}\r\n" for k, v in (headers or {}).items())
    head = (
        f"POST {u.path or '/'} HTTP/1.1\r\nHost: {u.hostname}:{u.port}\r\nContent-Type: application/json\r\n"
        f"Accept: text/event-stream\r\n{extra}Content-Length: {len(payload)}\r\n\r\n"
    )
    return u.hostname or "127.0.0.1", u.port or 80, head.encode() + payload


class _PhaseState:
    """What the streams of one phase share: sample lists and the progress count."""

    def __init__(self, phase: dict[str, Any], total: int) -> None:
        self.total = total
        self.gaps: list[float] | None = [] if phase.get("gaps") else None
        self.lats: list[float] | None = [] if phase.get("stamps") else None
        self.lats_steady: list[float] = []  # chunks that arrived once every stream had started
        self.progress = bool(phase.get("progress"))
        self.raw = bool(phase.get("raw"))
        # With raw samples, each latency's arrival time too (the same clock as
        # the stamps): the benchmark shows the latency over the round.
        self.lat_at: list[float] | None = [] if self.lats is not None and self.raw else None
        self.firsts = 0
        self.ended_without_first = 0
        self.all_started = False

    def on_first(self) -> None:
        self.firsts += 1
        self._check()

    def on_end(self, got_first: bool) -> None:
        if not got_first:
            self.ended_without_first += 1
            self._check()

    def _check(self) -> None:
        if not self.all_started and self.firsts + self.ended_without_first >= self.total:
            self.all_started = True
            if self.progress:
                ev = {"event": "all_first_content", "n": self.firsts, "failed_before_first": self.ended_without_first}
                print(json.dumps(ev), flush=True)


async def one_stream(conn: _Conn, request: bytes, state: _PhaseState) -> dict[str, Any]:
    r: dict[str, Any] = {"status": None, "n": 0, "done": False, "error": None, "bytes": 0, "t0": time.monotonic()}
    proto: _Stream | None = None
    try:
        proto = await conn.get()
        await proto.start(request, r, state)
    except asyncio.CancelledError:  # the phase's deadline: record, do not propagate
        r["error"] = r["error"] or "timeout (client deadline)"
        conn.close()
    except Exception as exc:  # noqa: BLE001 - a failed stream is a figure, not a crash
        r["error"] = f"{type(exc).__name__}: {exc}"
        conn.close()
    end = time.monotonic()
    r["total"] = end - r["t0"]
    if state.raw:
        r["t_send"], r["t_end"] = r["t0"], end
    if proto is not None and proto.first is not None:
        r["ttfc"] = proto.first - r["t0"]
        r["t_last"] = proto.last - r["t0"]
    if proto is not None:
        proto.r = None
    state.on_end(proto is not None and proto.first is not None)
    if r["status"] != 200 or not r["done"]:
        conn.close()  # do not reuse a connection in an unknown state
    return r


async def run_workers(
    phase: dict[str, Any],
    deadline: float,
    total: int,
    one: Callable[[Any, int], Awaitable[dict[str, Any]]],
    connect: Callable[[], Any] | None = None,
) -> tuple[list[dict[str, Any] | None], float, bool, list[asyncio.Task[None]]]:
    """Runs ``one(conn, i)`` for ``i`` in ``range(total)`` on at most ``concurrency``
    workers (started at random offsets in ``[0, ramp_s)``), each with its own
    connection from ``connect()`` (None without it), closed at its end; stops at
    ``deadline`` (the workers still running are cancelled). Prints the
    ``phase_start`` / ``phase_end`` events with ``"announce": true``.

    Returns the results (None: not run), the wall time, whether the deadline was
    reached, and the worker tasks.
    """
    conc = max(1, min(int(phase.get("concurrency", 1)), total))
    ramp = 0.0 if phase.get("preconnect") else float(phase.get("ramp_s", 0.0))
    results: list[dict[str, Any] | None] = [None] * total

    next_index = 0
    stopped = False

    async def worker(w: int) -> None:
        nonlocal next_index
        if ramp > 0:  # random start offsets: paced streams do not tick in lockstep
            await asyncio.sleep(starts[w])
        conn = connect() if connect is not None else None
        try:
            while next_index < total and not stopped:
                i = next_index
                next_index += 1
                results[i] = await one(conn, i)
        finally:
            if conn is not None:
                conn.close()

    announce = bool(phase.get("announce"))
    if announce:
        print(json.dumps({"event": "phase_start", "name": phase.get("name")}), flush=True)
    rnd = random.Random(int(phase.get("seed", 1)))
    starts = sorted(rnd.uniform(0, ramp) for _ in range(conc))
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
    return results, wall, bool(pending), tasks


async def run_phase(phase: dict[str, Any], deadline: float) -> dict[str, Any]:
    host, port, request = build_request(phase["url"], phase["body"], phase.get("headers"))
    total = int(phase.get("requests", 1))
    state = _PhaseState(phase, total)
    connect: Callable[[], Any] = lambda: _Conn(host, port)  # noqa: E731
    if phase.get("preconnect"):
        # Every connection open before the first request: the requests then
        # leave in one pass of the loop (a burst), not spread by connects.
        conns = [_Conn(host, port) for _ in range(max(1, min(int(phase.get("concurrency", 1)), total)))]
        await asyncio.wait_for(asyncio.gather(*(c.get() for c in conns)), timeout=max(1.0, deadline - time.monotonic()))
        connect = iter(conns).__next__
    results, wall, timed_out, _tasks = await run_workers(phase, deadline, total, lambda conn, _i: one_stream(conn, request, state), connect)
    streams = [r if r is not None else {"error": "not run", "n": 0, "done": False} for r in results]
    for r in streams:
        r.pop("t0", None)
    agg: dict[str, Any] = {"wall": wall, "timed_out": timed_out}
    if state.gaps is not None:
        agg["gaps_ms"] = percentiles([g * 1000 for g in state.gaps])
    if state.lats is not None:
        agg["latency_ms"] = percentiles([x * 1000 for x in state.lats])
        agg["latency_ms_steady"] = percentiles([x * 1000 for x in state.lats_steady])
        if state.raw:
            agg["latency_ms_raw"] = [round(x * 1000, 2) for x in state.lats]
            agg["latency_at_raw"] = [round(x, 3) for x in state.lat_at or []]
    return {"name": phase.get("name", "phase"), "streams": streams, "agg": agg}


async def run(spec: dict[str, Any]) -> dict[str, Any]:
    timeout = float(spec.get("timeout_s", 120))
    out: list[dict[str, Any]] = []
    deadline = time.monotonic() + timeout
    for phase in spec["phases"]:
        res = await run_phase(phase, deadline)
        if phase.get("name") != "_warmup":
            out.append(res)
        if res["agg"]["timed_out"]:
            return {"phases": out, "error": f"client deadline of {timeout:g}s reached"}
    return {"phases": out}


def cli(
    argv: list[str] | None,
    prog: str,
    doc: str,
    run_spec: Callable[[dict[str, Any]], Coroutine[Any, Any, dict[str, Any]]],
    *,
    stdin: bool = False,
) -> None:
    """A client's command line: ``--spec JSON`` or ``--spec @FILE`` (with ``stdin``,
    no ``--spec`` reads the spec from stdin); writes ``run_spec``'s result as ONE JSON line."""
    p = argparse.ArgumentParser(prog=prog, description=doc.split("\n")[0])
    if stdin:
        p.add_argument("--spec", help="JSON spec or @file (default: read it from stdin)")
    else:
        p.add_argument("--spec", required=True, help="JSON spec (or @file)")
    args = p.parse_args(argv)
    raw = args.spec if args.spec is not None else sys.stdin.read()
    if raw.startswith("@"):
        with open(raw[1:], encoding="utf-8") as f:
            raw = f.read()
    result = asyncio.run(run_spec(json.loads(raw)))
    sys.stdout.write(json.dumps(result) + "\n")
    sys.stdout.flush()


def main(argv: list[str] | None = None) -> None:
    cli(argv, "python -m bench.client", __doc__, run)


if __name__ == "__main__":
    main()
