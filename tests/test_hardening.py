"""Hostile input at the service's edge: deeply nested JSON on every surface
that parses it, and the like. Each gets a 4xx naming the problem, never a 500,
and nothing of it reaches the log."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import aiohttp

from tests.harness import Service
from tests.processes import Server
from tests.upstream import Reply

USER = [{"role": "user", "content": "hello"}]


def nested(levels: int) -> Any:
    """Arrays nested ``levels`` deep: ``[[…[1]…]]``."""
    value: Any = 1
    for _ in range(levels):
        value = [value]
    return value


async def post_raw(svc: Service, path: str, body: dict[str, Any]) -> tuple[int, Any]:
    # json.dumps, not orjson: the client's encoder must not refuse the depth first.
    async with svc.http.post(svc.v1 + path, data=json.dumps(body), headers={"Content-Type": "application/json"}) as resp:
        return resp.status, await resp.json()


def assert_too_deep(status: int, body: Any) -> None:
    assert status == 400, body
    assert body["error"]["code"] == "json_too_deep" and "64 levels" in body["error"]["message"], body


async def test_json_nested_300_deep_is_a_400_on_chat_and_responses(service: Service) -> None:
    status, body = await post_raw(service, "/chat/completions", {"model": "gpt-test", "messages": USER, "metadata": nested(300)})
    assert_too_deep(status, body)
    status, body = await post_raw(service, "/responses", {"model": "gpt-test", "input": "hi", "metadata": nested(300)})
    assert_too_deep(status, body)
    # One level past the limit (the body's object is the first level) is refused, the limit itself is not.
    status, body = await post_raw(service, "/chat/completions", {"model": "gpt-test", "messages": USER, "metadata": nested(64)})
    assert_too_deep(status, body)
    service.upstream.enqueue(Reply(text="fine"))
    status, body = await post_raw(service, "/chat/completions", {"model": "gpt-test", "messages": USER, "metadata": nested(63)})
    assert status == 200 and body["choices"][0]["message"]["content"] == "fine", body
    assert len(service.upstream.requests) == 1  # the refused ones never reached the model


async def test_json_nested_300_deep_on_the_websocket_is_an_error_frame(service: Service) -> None:
    async with service.http.ws_connect(service.v1 + "/ws") as ws:
        await ws.send_str(json.dumps({"type": "chat", "request": {"model": "gpt-test", "messages": USER, "metadata": nested(300)}}))
        frame = await ws.receive_json(timeout=10)
        assert frame["type"] == "error" and frame["code"] == "json_too_deep" and "64 levels" in frame["message"], frame
        # The connection stays up and answers the next message.
        await ws.send_json({"type": "subscribe", "turn_id": "turn_missing"})
        assert (await ws.receive_json(timeout=10))["code"] == "not_found"
    assert service.upstream.requests == []


# -- the inspector's security headers -------------------------------------------------------


async def test_the_inspector_sends_security_headers(service: Service) -> None:
    for path in ("/ui/", "/ui/turns/turn_0123456789abcdef01234567", "/ui/static/app.js", "/ui/static/app.css"):
        async with service.http.get(service.url + path) as resp:
            assert resp.status == 200, path
            assert resp.headers.get("Content-Security-Policy") == "default-src 'self'; frame-ancestors 'none'", path
            assert resp.headers.get("X-Content-Type-Options") == "nosniff", path
            assert resp.headers.get("Referrer-Policy") == "no-referrer", path


# -- upload filenames --------------------------------------------------------------------------


async def test_an_uploads_filename_keeps_only_its_base_name(service: Service) -> None:
    for sent, kept in (("../../etc/x.txt", "x.txt"), ("C:\\Users\\me\\notes.md", "notes.md"), ("..", "upload"), ("dir/", "upload")):
        # A raw body, as curl sends it: aiohttp's own client would percent-encode the slashes.
        boundary = "turnlog-boundary"
        escaped = sent.replace("\\", "\\\\")  # a quoted-string's backslash escapes itself
        raw = (
            f'--{boundary}\r\nContent-Disposition: form-data; name="file"; filename="{escaped}"\r\n'
            f"Content-Type: text/plain\r\n\r\nsome text\r\n--{boundary}--\r\n"
        ).encode()
        headers = {"Content-Type": f"multipart/form-data; boundary={boundary}"}
        async with service.http.post(service.v1 + "/files", data=raw, headers=headers) as resp:
            status, body = resp.status, await resp.json()
        assert status == 200 and body["filename"] == kept, (sent, body)
        status, listed = await service.get(f"/v1/files/{body['id']}")
        assert status == 200 and listed["filename"] == kept, listed


# -- credentials never reach the log ---------------------------------------------------------


async def test_a_header_over_8_kb_is_refused_without_logging_it(tmp_path: Path) -> None:
    key = "sk-caller-key-" + "7" * 40
    server = Server(tmp_path / "turnlog.db", None, auto_resume=False, log_dir=tmp_path)
    try:
        async with aiohttp.ClientSession() as http:
            await server.ready(http)
        reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
        header = f"Authorization: Bearer {key}{'A' * 9000}\r\n".encode()
        writer.write(b"GET /v1/models HTTP/1.1\r\nHost: turnlog\r\n" + header + b"\r\n")
        await writer.drain()
        status_line = await asyncio.wait_for(reader.readline(), 10)
        assert status_line.startswith(b"HTTP/1.0 400") or status_line.startswith(b"HTTP/1.1 400"), status_line
        writer.close()
        log = await wait_for_output_containing(server, "LineTooLong")
    finally:
        server.stop()
    assert "Error handling request" in log  # the event itself is still logged, as the exception's type
    assert key[:20] not in log and "Bearer" not in log, log


async def wait_for_output_containing(server: Server, needle: str, timeout: float = 20.0) -> str:
    """The served process's log once it has ``needle`` (polled: another
    process's log file gives no other signal; aiohttp writes the line before
    it answers the 400, so this normally returns at once)."""
    deadline = asyncio.get_running_loop().time() + timeout
    while True:
        server.log.flush()
        text = server.log_path.read_text()
        if needle in text:
            return text
        assert asyncio.get_running_loop().time() < deadline, f"{needle!r} never logged:\n{text[-2000:]}"
        await asyncio.sleep(0.05)
