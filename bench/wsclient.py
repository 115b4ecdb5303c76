"""A WebSocket benchmark client for turnlog's ``GET /v1/ws`` (own process).

    python -m bench.wsclient --spec '{"url": "ws://127.0.0.1:PORT/v1/ws", "clients": 500, ...}'

Each of ``clients`` WebSocket connections sends ONE ``{"type": "chat",
"request": body}`` message and reads what comes back until its turn's terminal
``event`` (``turn.completed``, ``turn.failed``, ``turn.cancelled``). Every
connection is opened first; the chat messages then leave at random offsets in
``[0, ramp_s)`` (all at once with ``ramp_s`` 0).

Cheap parsing, as ``bench.client``: each frame's arrival time is taken first,
and a frame is only searched for bytes. A ``delta`` message of the bench
upstream's stamped content (``"content":"@<monotonic> "``) gives one latency
sample (arrival − the upstream's write time) and counts as a content chunk
(at its ``pos``); a ``model.delta`` event counts, and times at its arrival,
the chunks of positions no ``delta`` message showed (a subscription that fell
behind catches up from the log: the protocol's durable path).

The result is ONE JSON line shaped like ``bench.client``'s, one phase:
per connection ``status`` (101 once upgraded), ``n``, ``done``, ``error``,
``ttfc`` (chat message sent → first delta), ``t_last``, ``total``, ``t_send``,
``t_end``; ``agg`` with ``latency_ms`` percentiles and ``latency_ms_raw``.
"""

from __future__ import annotations

import asyncio
import json
import random
import re
import time
from typing import Any

import aiohttp

from bench.client import cli, percentiles

STAMP = re.compile(r'"content":"@([0-9]+\.[0-9]+) ')
STAMP_TEXT = re.compile(r"@([0-9]+\.[0-9]+) ")
POS = re.compile(r'"pos":([0-9]+)')
DELTA = '{"type":"delta"'
TERMINAL = ('"type":"turn.completed"', '"type":"turn.failed"', '"type":"turn.cancelled"')


async def _one(
    session: aiohttp.ClientSession,
    url: str,
    message: str,
    delay: float,
    ready: asyncio.Event,
    lats: list[float],
    opened: list[int],
) -> dict[str, Any]:
    r: dict[str, Any] = {"status": None, "n": 0, "done": False, "error": None}
    seen: set[int] = set()  # stream positions shown (delta messages) or held (model.delta events)
    t0 = time.monotonic()
    first = last = None
    try:
        async with session.ws_connect(url, max_msg_size=0, autoping=True) as ws:
            r["status"] = 101
            opened[0] += 1
            await ready.wait()
            if delay:
                await asyncio.sleep(delay)
            t0 = time.monotonic()
            await ws.send_str(message)
            while True:
                msg = await ws.receive()
                t = time.monotonic()
                if msg.type != aiohttp.WSMsgType.TEXT:
                    r["error"] = f"socket ended ({msg.type.name}) before the turn's end"
                    break
                data: str = msg.data
                if data.startswith(DELTA):
                    pos = POS.search(data)
                    if pos is not None:
                        seen.add(int(pos.group(1)))
                    m = STAMP.search(data)
                    if m is not None:
                        lats.append(t - float(m.group(1)))
                    if first is None:
                        first = t
                    last = t
                elif data.startswith('{"type":"event"'):
                    if '"type":"model.delta"' in data:
                        # Chunks that came only durably (the subscription fell
                        # behind, or the event overtook them): counted and
                        # timed at the event's arrival.
                        ev = json.loads(data)["event"]["data"]
                        text, at = ev.get("text", ""), ev["pos"]
                        for n in ev.get("lens", []):
                            if at not in seen:
                                seen.add(at)
                                m = STAMP_TEXT.match(text)
                                if m is not None:
                                    lats.append(t - float(m.group(1)))
                                if first is None:
                                    first = t
                                last = t
                            text, at = text[n:], at + 1
                        continue
                    if any(k in data for k in TERMINAL):
                        r["done"] = '"type":"turn.completed"' in data
                        if not r["done"]:
                            r["error"] = data[:300]
                        break
                elif data.startswith('{"type":"error"'):
                    r["error"] = data[:300]
                    break
    except asyncio.CancelledError:
        r["error"] = r["error"] or "timeout (client deadline)"
    except Exception as exc:  # noqa: BLE001 - a failed connection is a figure, not a crash
        r["error"] = f"{type(exc).__name__}: {exc}"
    end = time.monotonic()
    r["n"] = len(seen)
    r.update(total=end - t0, t_send=t0, t_end=end)
    if first is not None:
        r["ttfc"] = first - t0
        r["t_last"] = (last or first) - t0
    return r


async def run(spec: dict[str, Any]) -> dict[str, Any]:
    n = int(spec["clients"])
    ramp = float(spec.get("ramp_s", 0.0))
    timeout = float(spec.get("timeout_s", 120))
    chat: dict[str, Any] = {"type": "chat", "request": spec["body"]}
    if spec.get("deltas") is False:  # events only (the text per delta window)
        chat["deltas"] = False
    message = json.dumps(chat)
    rnd = random.Random(int(spec.get("seed", 1)))
    delays = [rnd.uniform(0, ramp) if ramp else 0.0 for _ in range(n)]
    lats: list[float] = []
    ready = asyncio.Event()
    connector = aiohttp.TCPConnector(limit=0, force_close=False)
    async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=None, sock_connect=30)) as session:
        opened = [0]
        tasks = [asyncio.create_task(_one(session, spec["url"], message, d, ready, lats, opened)) for d in delays]
        # Every connection upgraded (or failed) before the first chat goes out;
        # polled, since this is set-up and not measured.
        t_conn = time.monotonic()
        while time.monotonic() - t_conn < 30:
            await asyncio.sleep(0.05)
            if opened[0] + sum(t.done() for t in tasks) >= n:
                break
        ready.set()
        t0 = time.monotonic()
        done, pending = await asyncio.wait(tasks, timeout=timeout)
        for t in pending:
            t.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
        wall = time.monotonic() - t0
    streams = [t.result() for t in tasks]
    agg = {
        "wall": wall,
        "timed_out": bool(pending),
        "latency_ms": percentiles([x * 1000 for x in lats]),
        "latency_ms_raw": [round(x * 1000, 2) for x in lats],
    }
    out: dict[str, Any] = {"phases": [{"name": spec.get("name", "ws"), "streams": streams, "agg": agg}]}
    if pending:
        out["error"] = f"client deadline of {timeout:g}s reached"
    return out


def main(argv: list[str] | None = None) -> None:
    cli(argv, "python -m bench.wsclient", __doc__, run)


if __name__ == "__main__":
    main()
