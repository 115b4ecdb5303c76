"""A client that starts a long, fast turn and then reads nothing (SSE and
WebSocket; docs/guides/drain-and-faults.md).

Expected: the turn runs to its end and its whole answer is in the log (the
turn writes the log, never waits for the socket); the stalled connection is
dropped once it has read nothing for ``client_stall_seconds`` (the server
aborts it: the client's TCP socket sees the reset); a new connection catches
up from the log and gets the whole answer once.

The oracle: the client's own TCP state (from the kernel, not from turnlog),
the fold of the log, and what a fresh client receives. Memory per stalled
client is measured in the benchmark (``python -m bench --scenarios
stalled_clients``), not here.
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import socket
import struct
import time
from pathlib import Path

from tests.harness import Service, make_settings, sse_text, start_service, stop_service
from tests.upstream import Reply, ScriptedUpstream

# 6 MB in 8 KB chunks: more than the kernel's socket buffers on loopback
# (tcp_wmem max 4 MB by default) and the transport's high-water mark hold.
TEXT = "".join(f"w{i:06d} " for i in range(750_000))
USER = [{"role": "user", "content": "go"}]
STALL = 1.0  # client_stall_seconds of these tests
TCP_STATES_ENDED = {7, 8}  # TCP_CLOSE (reset), TCP_CLOSE_WAIT (the server's FIN)


def _tcp_state(sock: socket.socket) -> int:
    """The kernel's TCP state of the client's socket (``tcp_info.tcpi_state``)."""
    return sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 8)[0]


async def _connect(service: Service) -> socket.socket:
    host, port = service.url.removeprefix("http://").split(":")
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # the kernel holds little for us
    sock.setblocking(False)
    await asyncio.get_running_loop().sock_connect(sock, (host, int(port)))
    return sock


async def _completed_turn(service: Service) -> str:
    """Wait (without reading the socket) until the client's turn is completed in the log."""
    deadline = time.monotonic() + 60
    while True:
        turns = await service.services.store.list_turns(limit=10)
        if turns and turns[0].status == "completed":
            return turns[0].id
        assert not turns or turns[0].status == "running", turns[0].status
        assert time.monotonic() < deadline, "the turn waited for the client that reads nothing"
        await asyncio.sleep(0.05)


async def _dropped(sock: socket.socket) -> float:
    """Wait until the server ended the connection, as the client's kernel sees it."""
    started = time.monotonic()
    while _tcp_state(sock) not in TCP_STATES_ENDED:
        assert time.monotonic() - started < 20 * STALL, "the stalled client was never dropped"
        await asyncio.sleep(0.05)
    return time.monotonic() - started


async def test_an_sse_client_that_reads_nothing_is_dropped_and_catches_up_from_the_log(database_url: str, tmp_path: Path, upstream: ScriptedUpstream) -> None:
    upstream.enqueue(Reply(text=TEXT, chunk_size=8192))
    settings = make_settings(tmp_path, upstream.url, database_url=database_url, client_stall_seconds=STALL)
    service = await start_service(settings, upstream)
    sock = await _connect(service)
    try:
        body = json.dumps({"model": "gpt-test", "messages": USER, "stream": True}).encode()
        await asyncio.get_running_loop().sock_sendall(
            sock,
            b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body),
        )
        turn_id = await _completed_turn(service)
        assert (await service.turn(turn_id))["content"] == TEXT, "the turn is recorded in full"
        await _dropped(sock)
        assert _tcp_state(sock) in TCP_STATES_ENDED
        # It reconnects and catches up from the log: the whole answer, once.
        async with service.http.get(f"{service.v1}/turns/{turn_id}/stream") as again:
            assert again.status == 200
            assert sse_text(await again.text()) == TEXT
    finally:
        sock.close()
        await stop_service(service)


def _ws_frame(payload: bytes) -> bytes:
    """A masked text frame, as RFC 6455 requires a client to send it."""
    mask = os.urandom(4)
    head = bytearray([0x81])
    if len(payload) < 126:
        head.append(0x80 | len(payload))
    else:
        head.append(0x80 | 126)
        head += struct.pack("!H", len(payload))
    return bytes(head) + mask + bytes(b ^ mask[i % 4] for i, b in enumerate(payload))


async def test_a_websocket_client_that_reads_nothing_is_dropped_and_catches_up_from_the_log(
    database_url: str, tmp_path: Path, upstream: ScriptedUpstream
) -> None:
    upstream.enqueue(Reply(text=TEXT, chunk_size=8192))
    settings = make_settings(tmp_path, upstream.url, database_url=database_url, client_stall_seconds=STALL)
    service = await start_service(settings, upstream)
    sock = await _connect(service)
    loop = asyncio.get_running_loop()
    try:
        key = base64.b64encode(os.urandom(16))
        await loop.sock_sendall(
            sock,
            b"GET /v1/ws HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Key: %s\r\nSec-WebSocket-Version: 13\r\n\r\n" % key,
        )
        chat = {"type": "chat", "request": {"model": "gpt-test", "messages": USER, "stream": True}}
        await loop.sock_sendall(sock, _ws_frame(json.dumps(chat).encode()))
        turn_id = await _completed_turn(service)
        assert (await service.turn(turn_id))["content"] == TEXT, "the turn is recorded in full"
        await _dropped(sock)
        # A new connection subscribes from the start: every event once, the whole answer.
        text, seqs = [], []
        async with service.http.ws_connect(f"{service.v1}/ws") as ws:
            await ws.send_json({"type": "subscribe", "turn_id": turn_id, "after": 0})
            while True:
                message = await asyncio.wait_for(ws.receive_json(), 30)
                if message["type"] != "event":
                    continue
                seqs.append(message["seq"])
                if message["event"]["type"] == "model.delta":
                    text.append(message["event"]["data"]["text"])
                if message["event"]["type"] == "turn.completed":
                    break
        assert seqs == list(range(1, len(seqs) + 1))
        assert "".join(text) == TEXT
    finally:
        sock.close()
        await stop_service(service)
