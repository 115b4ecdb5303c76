"""A real MCP server for the tests: the ``mcp`` package's own ``MCPServer``
(FastMCP) over streamable HTTP, run by uvicorn on a loopback port.

``python -m tests.mcp_server PORT``. Around the MCP app sits a counting layer
that reads the wire, so the tests' oracle is what the server saw, not what
turnlog says it did: ``GET /stats`` gives the sessions the server created
(``Mcp-Session-Id`` values it answered an ``initialize`` with), the sessions
clients ended (``DELETE``), and every ``tools/call`` with its session and its
arguments exactly as they arrived.
"""

from __future__ import annotations

import asyncio
import base64
import json
import sys
from typing import Any

import uvicorn
from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.utilities.types import Image
from mcp_types import BlobResourceContents, EmbeddedResource, TextResourceContents

#: A 1x1 PNG: what the ``pixel`` tool returns.
PIXEL = base64.b64decode("iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8BQDwAEhQGAhKmMIQAAAABJRU5ErkJggg==")

# CRITICAL: a tool that raises is not logged with a rich traceback, whose first
# rendering (imports, syntax highlighting) can outlast a test's tool timeout.
server = MCPServer("turnlog-test", instructions="Numbers are added with the add tool.", log_level="CRITICAL")


@server.tool()
def echo(text: str) -> str:
    """Say the text back."""
    return text


@server.tool()
def add(a: int, b: int) -> dict[str, int]:
    """Add two integers."""
    return {"sum": a + b}


@server.tool()
def pixel() -> list[str | Image]:
    """A caption and a one-pixel image."""
    return ["a red pixel", Image(data=PIXEL, format="png")]


#: Large enough (77 KB) to be stored as a blob rather than inline in the log.
POSTER = b"\x89PNG\r\n\x1a\n" + bytes(range(256)) * 300


@server.tool()
def poster() -> Image:
    """A large image."""
    return Image(data=POSTER, format="png")


@server.tool()
def documents() -> list[EmbeddedResource]:
    """A text resource and a binary one."""
    return [
        EmbeddedResource(type="resource", resource=TextResourceContents(uri="file:///notes.txt", text="the notes")),
        EmbeddedResource(
            type="resource",
            resource=BlobResourceContents(uri="file:///a.zip", mime_type="application/zip", blob=base64.b64encode(b"PK").decode()),
        ),
    ]


@server.tool()
def boom(reason: str = "") -> str:
    """Always fails."""
    raise ValueError(f"kaboom {reason}")


@server.tool()
async def hang() -> str:
    """Never answers."""
    await asyncio.Event().wait()
    return "unreachable"


class Counting:
    """ASGI middleware: records what crosses the wire, answers ``GET /stats``."""

    def __init__(self, app: Any) -> None:
        self.app = app
        self.sessions: list[str] = []
        self.deleted: list[str] = []
        self.calls: list[dict[str, Any]] = []

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        if scope["path"] == "/stats":
            body = json.dumps({"sessions": self.sessions, "deleted": self.deleted, "calls": self.calls}).encode()
            await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"application/json")]})
            await send({"type": "http.response.body", "body": body})
            return
        headers = {k.decode().lower(): v.decode() for k, v in scope["headers"]}
        session = headers.get("mcp-session-id")
        if scope["method"] == "DELETE" and session:
            self.deleted.append(session)
        chunks: list[bytes] = []
        more = True
        while more:
            message = await receive()
            chunks.append(message.get("body", b""))
            more = message.get("more_body", False)
        raw = b"".join(chunks)
        try:
            rpc = json.loads(raw) if raw else None
        except ValueError:
            rpc = None
        if isinstance(rpc, dict) and rpc.get("method") == "tools/call":
            params = rpc.get("params") or {}
            self.calls.append({"session": session, "name": params.get("name"), "arguments": params.get("arguments")})
        replayed = False

        async def replay() -> dict[str, Any]:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": raw, "more_body": False}
            return await receive()

        async def watch(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.start" and isinstance(rpc, dict) and rpc.get("method") == "initialize":
                for key, value in message.get("headers", []):
                    if key.decode().lower() == "mcp-session-id":
                        self.sessions.append(value.decode())
            await send(message)

        await self.app(scope, replay, watch)


def main() -> None:
    port = int(sys.argv[1])
    app = Counting(server.streamable_http_app())
    uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning", lifespan="on")


if __name__ == "__main__":
    main()
