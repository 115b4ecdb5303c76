"""Scenario ``stalled_clients``: clients that start a long, fast answer and read nothing.

Two fresh turnlogs (SQLite), one after the other. On each, 50 clients (10
with ``--quick``) each open a streaming turn of a 5 MB answer (1 KiB chunks,
the upstream as fast as it can): on the first the clients read everything,
on the second they never read a byte (receive buffer 4 KB). Sampled every
50 ms: turnlog's VmRSS, peak minus before. Every turn must complete in the
log with its whole answer, and every stalled connection must be ended by
the server (``TURNLOG_CLIENT_STALL_SECONDS``, 5 s here, 60 s by default; the
client's kernel sees the reset).

The check: the extra peak RSS of a stalled client over a reading one, per MB
of answer, <= 2. What a stalled client can hold beyond a reading one: its
live subscription's queue before it lags (at most ``SUBSCRIPTION_LIMIT`` =
4,096 chunks, here 4 MB, less than one answer) and one rendered write in the
transport's buffer (a catch-up batch, at most about one answer rendered);
its turn and its follower's fold cost a reading client as much. A turnlog
that buffered the stream for the client without bound would hold the whole
rendered answer per client on top and grow with every chunk. Informational
beside it: the stalled clients' peak growth per client per MB of answer
(their turns included).
"""

from __future__ import annotations

import json
import socket
import sqlite3
import statistics
import threading
import time
from typing import Any

from bench.procs import BenchError, rss_kb
from bench.scenarios import Ctx, check

TOKEN = "x" * 1023 + " "  # 1 KiB chunks
STALL_SECONDS = 5.0
TCP_ENDED = {7, 8}  # TCP_CLOSE (reset), TCP_CLOSE_WAIT (FIN)
#: Extra peak RSS of a stalled client over a reading one, per MB of answer.
BOUND = 2.0


def _open(url: str, chunks: int) -> socket.socket:
    host, port = url.removeprefix("http://").split("/")[0].split(":")
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.connect((host, int(port)))
    body = json.dumps(
        {"model": "bench", "stream": True, "messages": [{"role": "user", "content": "long"}], "bench_chunks": chunks, "bench_tokens": [TOKEN]}
    ).encode()
    sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
    return sock


def _state(sock: socket.socket) -> int:
    return sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 8)[0]


def _read_all(sock: socket.socket) -> int:
    sock.settimeout(60)
    n, tail = 0, b""
    while True:
        data = sock.recv(1 << 20)
        if not data:
            return n
        n += len(data)
        tail = (tail + data)[-64:]
        if b"data: [DONE]" in tail:
            return n


def _run(ctx: Ctx, clients: int, chunks: int, *, read: bool) -> dict[str, Any]:
    """One fresh turnlog; ``clients`` streams of ``chunks`` 1 KiB chunks, read or not."""
    name = "stalled" if not read else "reading"
    db = ctx.workdir / f"turnlog-{name}.db"
    proc, v1 = ctx.procs.start_turnlog(f"turnlog-{name}", ctx.upstream_v1, db, extra_env={"TURNLOG_CLIENT_STALL_SECONDS": str(STALL_SECONDS)})
    pid = proc.pid
    out: dict[str, Any] = {}
    socks: list[socket.socket] = []
    try:
        warm = _open(v1, 64)
        _read_all(warm)
        warm.close()
        time.sleep(1.0)
        before = statistics.median(rss_kb(pid) for _ in range(5))
        t0 = time.monotonic()
        socks = [_open(v1, chunks) for _ in range(clients)]
        readers: list[threading.Thread] = []
        if read:
            readers = [threading.Thread(target=_read_all, args=(s,), daemon=True) for s in socks]
            for r in readers:
                r.start()
        peak = before
        deadline = t0 + 120
        while True:
            peak = max(peak, rss_kb(pid))
            with sqlite3.connect(db) as conn:
                completed = conn.execute("SELECT count(*) FROM turns WHERE status = 'completed'").fetchone()[0]
                sizes = [row[0] for row in conn.execute("SELECT length(view) FROM turns WHERE status = 'completed'")]
            if completed >= clients + 1:
                break
            if time.monotonic() > deadline:
                raise BenchError(f"{name}: only {completed - 1} of {clients} turns completed")
            time.sleep(0.05)
        out["all_completed_s"] = round(time.monotonic() - t0, 2)
        if sorted(sizes)[1] < chunks * len(TOKEN):
            raise BenchError(f"{name}: a turn's recorded answer is shorter than the upstream's")
        if read:
            for r in readers:
                r.join(60)
        else:
            while any(_state(s) not in TCP_ENDED for s in socks):
                peak = max(peak, rss_kb(pid))
                if time.monotonic() > deadline:
                    raise BenchError("the stalled connections were not all dropped")
                time.sleep(0.05)
            out["all_dropped_s"] = round(time.monotonic() - t0, 2)
        time.sleep(1.0)
        after = statistics.median(rss_kb(pid) for _ in range(5))
    finally:
        for s in socks:
            s.close()
        ctx.procs.stop(proc)
    out.update(
        {
            "rss_before_mb": round(before / 1024, 1),
            "rss_peak_mb": round(peak / 1024, 1),
            "rss_after_mb": round(after / 1024, 1),
            "peak_growth_mb_per_client": round((peak - before) / 1024 / clients, 2),
        }
    )
    return out


def stalled_clients(ctx: Ctx) -> dict[str, Any]:
    clients = 10 if ctx.quick else 50
    answer_mb = 5
    chunks = answer_mb * 1024
    reading = _run(ctx, clients, chunks, read=True)
    stalled = _run(ctx, clients, chunks, read=False)
    extra = stalled["peak_growth_mb_per_client"] - reading["peak_growth_mb_per_client"]
    figures: dict[str, Any] = {
        "clients": clients,
        "answer_mb": answer_mb,
        "stall_seconds": STALL_SECONDS,
        "reading": reading,
        "stalled": stalled,
        "extra_mb_per_stalled_client": round(extra, 2),
        "note": "VmRSS of a fresh turnlog process (SQLite) sampled every 50 ms while N clients each stream their "
        "own turn of a fast answer: once clients that read everything, once clients that read nothing (their "
        "turns complete in the log, their connections are reset after TURNLOG_CLIENT_STALL_SECONDS); "
        "extra = peak growth per stalled client minus per reading client",
    }
    return {
        "status": "ok",
        "checks": [
            check("stalled_client_extra_rss_per_answer_size", extra / answer_mb, "<=", BOUND),
            check("stalled_client_rss_per_answer_size", stalled["peak_growth_mb_per_client"] / answer_mb, "<=", 8.0, informational=True),
        ],
        "figures": figures,
    }
