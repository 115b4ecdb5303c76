"""Upstreams that stall or trickle, and a client that reads nothing (upstream
faults, docs/guides/drain-and-faults.md): the right timeout fires, memory per
turn stays bounded, and the outcome is recorded in the log."""

from __future__ import annotations

import asyncio
import json
import socket
import time
from pathlib import Path

import pytest

from tests.harness import make_settings, sse_text, start_service, stop_service
from tests.stalling_upstream import Mode, StallingUpstream
from tests.upstream import Reply, ScriptedUpstream

USER = [{"role": "user", "content": "go"}]


@pytest.mark.parametrize(
    "mode, expect",
    [
        ("no_headers", "no response headers within 0.5s"),
        ("slow_headers", "no response headers within 0.5s"),
        ("slow_loris", "completed no event for 0.5s"),
    ],
)
async def test_a_stalling_upstream_fails_the_turn_with_the_timeout_that_applies(
    mode: Mode, expect: str, database_url: str, tmp_path: Path, upstream: ScriptedUpstream
) -> None:
    stall = StallingUpstream(mode, interval=0.05)
    await stall.start()
    # A long per-read timeout: only the headers / progress timeouts can fire.
    settings = make_settings(tmp_path, stall.url, database_url=database_url, upstream_idle_timeout=0.5, upstream_headers_timeout=0.5)
    service = await start_service(settings, upstream)
    try:
        started = time.monotonic()
        status, body, headers = await service.post("/v1/chat/completions", {"model": "gpt-test", "messages": USER})
        took = time.monotonic() - started
        assert status == 502, body
        assert expect in body["error"]["message"]
        assert took < 5, f"the timeout fired after {took:.1f} s"
        view = await service.turn(headers["X-Turn-Id"])
        assert view["status"] == "failed" and view["error"]["type"] == "upstream_timeout"
        assert expect in view["error"]["message"]
        assert stall.chat_requests == 1
        if mode == "slow_loris":
            assert stall.body_bytes_sent >= 5, "bytes kept coming: a per-read timer alone never fires"
    finally:
        await stop_service(service)
        await stall.close()


async def test_an_event_that_never_ends_is_cut_at_the_limit(database_url: str, tmp_path: Path, upstream: ScriptedUpstream) -> None:
    stall = StallingUpstream("endless_event", size=40 * 1024 * 1024)
    await stall.start()
    service = await start_service(make_settings(tmp_path, stall.url, database_url=database_url), upstream)
    try:
        status, body, headers = await service.post("/v1/chat/completions", {"model": "gpt-test", "messages": USER})
        assert status == 502, body
        view = await service.turn(headers["X-Turn-Id"])
        assert view["status"] == "failed" and view["error"]["type"] == "upstream_error"
        assert "without completing an event" in view["error"]["message"]
        # cut at the 16 MiB limit, not after the whole 40 MiB (what the upstream
        # counts as sent includes what the kernel's socket buffers hold: up to
        # about 10 MiB on loopback)
        assert stall.body_bytes_sent < 32 * 1024 * 1024
    finally:
        await stop_service(service)
        await stall.close()


@pytest.mark.backends("sqlite")  # the client side does not depend on the store
async def test_a_client_that_reads_nothing_neither_stops_the_turn_nor_loses_its_answer(database_url: str, tmp_path: Path, upstream: ScriptedUpstream) -> None:
    text = "".join(f"w{i:06d} " for i in range(500_000))  # 4 MB: more than the socket buffers hold
    upstream.enqueue(Reply(text=text, chunk_size=4096))
    service = await start_service(make_settings(tmp_path, upstream.url, database_url=database_url), upstream)
    host, port = service.url.removeprefix("http://").split(":")
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # the kernel holds little for us
    sock.setblocking(False)
    loop = asyncio.get_running_loop()
    try:
        await loop.sock_connect(sock, (host, int(port)))
        body = json.dumps({"model": "gpt-test", "messages": USER, "stream": True}).encode()
        await loop.sock_sendall(
            sock,
            b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body),
        )
        # The client reads nothing; the turn still runs to its end in the log.
        deadline = time.monotonic() + 30
        while True:
            turns = await service.services.store.list_turns(limit=10)
            if turns and turns[0].status == "completed":
                break
            assert time.monotonic() < deadline, "the turn waited for the client that reads nothing"
            await asyncio.sleep(0.05)
        assert (await service.turn(turns[0].id))["content"] == text
        # Backpressure, not loss: once it reads, the client gets the whole answer once.
        raw = bytearray()
        while not raw.endswith(b"0\r\n\r\n"):
            data = await asyncio.wait_for(loop.sock_recv(sock, 1 << 20), 30)
            assert data, "the server closed the stream"
            raw += data
        head, _, chunked = bytes(raw).partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 200")
        assert sse_text(_dechunk(chunked).decode()) == text
    finally:
        sock.close()
        await stop_service(service)


def _dechunk(data: bytes) -> bytes:
    out, pos = bytearray(), 0
    while True:
        end = data.index(b"\r\n", pos)
        size = int(data[pos:end].split(b";")[0], 16)
        if size == 0:
            return bytes(out)
        out += data[end + 2 : end + 2 + size]
        pos = end + 2 + size + 2
