"""WebSocket frames written together (the ``thousands_ws`` bench scenario).

The oracle for "fewer writes" is the client's kernel: ``TCP_INFO``'s
``tcpi_data_segs_in`` counts the data segments that reached the client's
socket. The server sets ``TCP_NODELAY`` and loopback sends each write at once,
so a server writing every frame on its own delivers about one segment per
frame, however the client reads. The oracle for "nothing lost, nothing out of
order" is the log: the ``event`` messages must be the turn's events, seq by
seq, and the ``delta`` messages' text the answer the log folds to.
"""

from __future__ import annotations

import asyncio
import json
import socket
import struct
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tests.harness import make_settings, start_service, stop_service
from tests.pg import unavailable
from tests.upstream import Reply, ScriptedUpstream

USER = [{"role": "user", "content": "go"}]
CHUNKS = [f"w{i} " for i in range(20)]
#: ``struct tcp_info`` (linux/tcp.h): ``tcpi_data_segs_in`` is the u32 at byte 152 (Linux >= 4.6).
DATA_SEGS_IN = 152


def data_segments_in(sock: socket.socket) -> int:
    info = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 256)
    if len(info) < DATA_SEGS_IN + 4:
        unavailable("this kernel's tcp_info has no tcpi_data_segs_in (Linux >= 4.6)")
    return int(struct.unpack_from("I", info, DATA_SEGS_IN)[0])


async def _chat(
    svc: Any, request: dict[str, Any], on_message: Callable[[dict[str, Any]], None] | None = None, **connect: Any
) -> tuple[list[dict[str, Any]], int | None]:
    """Every message of one ``chat`` until its terminal event, and the data
    segments the client's socket received meanwhile (None if not measurable).
    ``on_message`` sees each message as it arrives."""
    got: list[dict[str, Any]] = []
    async with svc.http.ws_connect(svc.v1 + "/ws", **connect) as ws:
        sock = ws.get_extra_info("socket")
        before = data_segments_in(sock) if sys.platform == "linux" else None
        await ws.send_json({"type": "chat", "request": request})
        async for msg in ws:
            data = json.loads(msg.data)
            got.append(data)
            if on_message is not None:
                on_message(data)
            if data["type"] == "event" and data["event"]["type"] in ("turn.completed", "turn.failed", "turn.cancelled"):
                break
        segments = data_segments_in(sock) - before if before is not None else None
    return got, segments


async def _check_against_the_log(svc: Any, got: list[dict[str, Any]], text: str) -> None:
    """The client received every event of the log once, in seq order; each
    ``delta`` is the chunk the log holds at its position, in position order,
    and came before the event of its seq (a preview whose event went out
    first is dropped: docs/reference/websocket.md); the answer is ``text``."""
    assert got[0]["type"] == "turn"
    turn_id = got[0]["turn_id"]
    logged = await svc.events(turn_id)
    events = [m for m in got if m["type"] == "event"]
    assert [(m["seq"], m["event"]["type"]) for m in events] == [(e["seq"], e["type"]) for e in logged]
    chunks: dict[int, str] = {}  # the log's chunks by position (data.pos, data.pos + 1, … per entry of data.lens)
    for event in logged:
        if event["type"] == "model.delta":
            at, data = 0, event["data"]
            for i, n in enumerate(data["lens"]):
                chunks[data["pos"] + i] = data["text"][at : at + n]
                at += n
    sent: set[int] = set()
    for m in got:
        if m["type"] == "event":
            sent.add(m["seq"])
        elif m["type"] == "delta":
            assert m["seq"] not in sent, f"delta {m} after its event"
            assert m["content"] == chunks[m["pos"]]
    deltas = [m["pos"] for m in got if m["type"] == "delta"]
    assert deltas == sorted(set(deltas))
    assert "".join(chunks[p] for p in sorted(chunks)) == text
    view = await svc.turn(turn_id)
    assert view["content"] == text


async def test_a_paced_stream_arrives_in_fewer_writes_than_frames(tmp_path: Path, upstream: ScriptedUpstream, database_url: str) -> None:
    """Each paced chunk makes a ``delta`` and, a window later, its ``model.delta``
    event: the event goes out with the next chunk's delta, one write for both.
    Frame by frame, the client would receive a segment per message."""
    svc = await start_service(make_settings(tmp_path, upstream.url, database_url=database_url, flush_interval=0.02), upstream)
    try:
        upstream.enqueue(Reply(chunks=CHUNKS, delay=0.1))
        got, segments = await _chat(svc, {"model": "gpt-test", "messages": USER})
        await _check_against_the_log(svc, got, "".join(CHUNKS))
        frames = len(got)
        assert sum(m["type"] == "delta" for m in got) >= len(CHUNKS) * 3 // 4  # (a pump behind its event drops a delta)
        assert sum(m["type"] == "event" and m["event"]["type"] == "model.delta" for m in got) >= len(CHUNKS) - 2  # a window per paced chunk
        if segments is None:
            unavailable("TCP_INFO is Linux-only; the order and completeness were checked")
        assert segments <= 0.7 * frames, f"{segments} data segments for {frames} messages: frames written one by one"
    finally:
        await stop_service(svc)


async def test_a_burst_of_chunks_is_written_whole_and_in_order(tmp_path: Path, upstream: ScriptedUpstream, database_url: str) -> None:
    """A fast answer (many chunks per upstream read, rendered into the outbox
    as one message of the bus): every delta and event, once, in order. (No
    segment count here: the kernel's autocorking merges back-to-back writes
    of one burst anyway.)"""
    words = [f"b{i} " for i in range(400)]
    svc = await start_service(make_settings(tmp_path, upstream.url, database_url=database_url), upstream)

    releasing: list[asyncio.Task[None]] = []

    async def release() -> None:
        await upstream.paused.wait()
        upstream.release()

    def release_once_live(message: dict[str, Any]) -> None:
        # The first chunk reached the client (as a delta, or in its window's
        # event): the subscription is live, so the burst comes as deltas.
        # Unheld, a fast answer can be durable before the pump joins, and is
        # then (rightly) sent as events only.
        live = message["type"] == "delta" or (message["type"] == "event" and message["event"]["type"] == "model.delta")
        if live and not releasing:
            releasing.append(asyncio.ensure_future(release()))

    try:
        upstream.enqueue(Reply(chunks=words, pause_after=1))
        got, _ = await _chat(svc, {"model": "gpt-test", "messages": USER}, on_message=release_once_live)
        await _check_against_the_log(svc, got, "".join(words))
        # Live deltas came (all of the burst, unless the pump fell behind its
        # events: on an overloaded machine, once, only the first chunk did).
        assert sum(m["type"] == "delta" for m in got) >= 1
    finally:
        await stop_service(svc)


async def test_permessage_deflate_clients_get_every_message_in_order(tmp_path: Path, upstream: ScriptedUpstream, database_url: str) -> None:
    """A client that negotiated compression takes aiohttp's own frame path
    (its deflate context spans frames): the same messages, the same order."""
    svc = await start_service(make_settings(tmp_path, upstream.url, database_url=database_url, flush_interval=0.02), upstream)
    try:
        upstream.enqueue(Reply(chunks=CHUNKS[:8], delay=0.05))
        got, _ = await _chat(svc, {"model": "gpt-test", "messages": USER}, compress=15)
        await _check_against_the_log(svc, got, "".join(CHUNKS[:8]))
    finally:
        await stop_service(svc)


async def test_a_held_event_goes_out_when_no_message_follows(tmp_path: Path, upstream: ScriptedUpstream, database_url: str) -> None:
    """The upstream stops after 3 chunks: the last window's ``model.delta``
    event has no next ``delta`` to go out with, and still arrives (after at
    most ``HOLD_SECONDS``) while the stream is stalled."""
    svc = await start_service(make_settings(tmp_path, upstream.url, database_url=database_url, flush_interval=0.02), upstream)
    try:
        upstream.enqueue(Reply(chunks=CHUNKS[:6], delay=0.05, pause_after=3))
        async with svc.http.ws_connect(svc.v1 + "/ws") as ws:
            await ws.send_json({"type": "chat", "request": {"model": "gpt-test", "messages": USER}})
            shown: list[str] = []
            durable = ""
            while durable != "".join(CHUNKS[:3]):
                data = json.loads((await asyncio.wait_for(ws.receive(), 10)).data)
                if data["type"] == "delta":
                    shown.append(data["content"])
                elif data["type"] == "event" and data["event"]["type"] == "model.delta":
                    durable += data["event"]["data"]["text"]
            assert upstream.paused.is_set() and set(shown) <= set(CHUNKS[:3])  # nothing after the pause came
            upstream.release()
            while not (data["type"] == "event" and data["event"]["type"] == "turn.completed"):
                data = json.loads((await asyncio.wait_for(ws.receive(), 10)).data)
                if data["type"] == "event" and data["event"]["type"] == "model.delta":
                    durable += data["event"]["data"]["text"]
        assert durable == "".join(CHUNKS[:6])
    finally:
        await stop_service(svc)
