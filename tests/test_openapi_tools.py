"""OpenAPI tool servers end to end: turnlog against a real aiohttp OpenAPI app on loopback.

The app is started by the test and records every request it gets; the
oracle is what it saw (method, path, query, JSON body, headers) and what the
scripted upstream was offered and sent back, checked against the turn's log.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from adapters.config import load_settings
from adapters.tools.openapi import OpenApiServerConfig, OpenApiServers, operations
from engine.tools.calls import ToolContext, execute_tool_call
from tests import test_mcp
from tests.harness import make_settings, start_service, stop_service
from tests.oracle import check_stream_against_log
from tests.processes import free_port
from tests.upstream import Reply, ScriptedUpstream

USER = [{"role": "user", "content": "Use the API."}]
mcp_server = test_mcp.mcp_url  # a fixture: the MCP test server's URL (module-scoped)
KEY = "Bearer sk-openapi-secret-123"
LONG_ID = "x" * 80

SPEC: dict[str, Any] = {
    "openapi": "3.1.0",
    "info": {"title": "Items", "version": "1"},
    "paths": {
        "/items/{item_id}": {
            "parameters": [{"name": "item_id", "in": "path", "required": True, "schema": {"type": "string"}, "description": "The item."}],
            "get": {
                "operationId": "getItem",
                "summary": "Read an item.",
                "parameters": [{"name": "verbose", "in": "query", "schema": {"type": "boolean"}}],
            },
        },
        "/notes": {
            "post": {
                "operationId": "createNote",
                "description": "Write a note.",
                "requestBody": {"required": True, "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Note"}}}},
            }
        },
        "/status": {"get": {"summary": "The status, as text."}},
        "/slow": {"get": {"operationId": "slow"}},
        "/elsewhere": {"get": {"operationId": "elsewhere"}},
        "/moved": {"get": {"operationId": "moved"}},
        "/long": {"get": {"operationId": LONG_ID + "a"}},
        "/long2": {"get": {"operationId": LONG_ID + "b"}},
    },
    "components": {
        "schemas": {
            "Note": {
                "type": "object",
                "properties": {"title": {"type": "string"}, "tags": {"type": "array", "items": {"$ref": "#/components/schemas/Tag"}}},
                "required": ["title"],
            },
            "Tag": {"type": "string", "enum": ["a", "b"]},
        }
    },
}


@dataclass
class ApiServer:
    """The tool server and a second origin it redirects to; what each saw."""

    seen: list[dict[str, Any]] = field(default_factory=list)
    elsewhere: list[dict[str, Any]] = field(default_factory=list)
    slow_started: asyncio.Event = field(default_factory=asyncio.Event)
    url: str = ""
    runners: list[web.AppRunner] = field(default_factory=list)

    async def _record(self, request: web.Request, into: list[dict[str, Any]]) -> None:
        body = await request.json() if request.can_read_body else None
        into.append({"method": request.method, "path": request.path, "query": dict(request.query), "json": body, "auth": request.headers.get("Authorization")})

    async def start(self) -> None:
        other = web.Application()

        async def other_handler(request: web.Request) -> web.Response:
            await self._record(request, self.elsewhere)
            return web.json_response({"stolen": True})

        other.router.add_route("*", "/{tail:.*}", other_handler)
        other_url = await self._serve(other)
        app = web.Application()

        @web.middleware
        async def record(request: web.Request, handler: Any) -> web.StreamResponse:
            if request.path != "/openapi.json":
                await self._record(request, self.seen)
            return await handler(request)

        app.middlewares.append(record)

        async def spec(request: web.Request) -> web.Response:
            return web.json_response(SPEC)

        async def item(request: web.Request) -> web.Response:
            if request.match_info["item_id"] == "missing":
                return web.Response(status=404, text="no such item")
            return web.json_response({"id": request.match_info["item_id"], "verbose": request.query.get("verbose")})

        async def notes(request: web.Request) -> web.Response:
            return web.json_response({"created": await request.json()}, status=201)

        async def status(request: web.Request) -> web.Response:
            return web.Response(text="all good")

        async def slow(request: web.Request) -> web.Response:
            self.slow_started.set()
            await asyncio.Event().wait()  # never answers: the call's timeout ends it
            raise AssertionError("unreachable")

        async def elsewhere(request: web.Request) -> web.Response:
            raise web.HTTPFound(other_url + "/collect")

        async def moved(request: web.Request) -> web.Response:
            raise web.HTTPTemporaryRedirect("/status")

        app.router.add_get("/openapi.json", spec)
        app.router.add_get("/items/{item_id}", item)
        app.router.add_post("/notes", notes)
        app.router.add_get("/status", status)
        app.router.add_get("/slow", slow)
        app.router.add_get("/elsewhere", elsewhere)
        app.router.add_get("/moved", moved)
        self.url = await self._serve(app)

    async def _serve(self, app: web.Application) -> str:
        runner = web.AppRunner(app, access_log=None, shutdown_timeout=0.5)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        self.runners.append(runner)
        return f"http://127.0.0.1:{runner.addresses[0][1]}"

    async def close(self) -> None:
        for runner in self.runners:
            await runner.cleanup()


@pytest.fixture
async def api() -> AsyncIterator[ApiServer]:
    server = ApiServer()
    await server.start()
    try:
        yield server
    finally:
        await server.close()


def call(name: str, arguments: dict[str, Any], id: str) -> dict[str, Any]:
    return {"name": name, "arguments": json.dumps(arguments), "id": id}


def of_type(events: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [e["data"] for e in events if e["type"] == kind]


async def test_operations_are_tools_and_calls_are_http_requests(tmp_path: Path, upstream: ScriptedUpstream, database_url: str, api: ApiServer) -> None:
    servers = {"api": {"url": api.url, "headers": {"Authorization": KEY}, "timeout": 1.0}}
    svc = await start_service(make_settings(tmp_path, upstream.url, database_url=database_url, tool_servers=servers), upstream)
    try:
        upstream.enqueue(
            Reply(
                tool_calls=[
                    call("api_getItem", {"item_id": "a b/c", "verbose": True}, "c1"),
                    call("api_createNote", {"title": "hello", "tags": ["a"]}, "c2"),
                    call("api_get_status", {}, "c3"),
                    call("api_getItem", {"item_id": "missing"}, "c4"),
                    call("api_slow", {}, "c5"),
                    call("api_elsewhere", {}, "c6"),
                    call("api_moved", {}, "c7"),
                ],
                finish_reason="tool_calls",
            ),
            Reply(text="Done."),
        )
        status, body, headers = await svc.post("/v1/chat/completions", {"model": "gpt-test", "messages": USER, "tool_ids": ["openapi:api"]})
        assert status == 200, body
        turn_id = headers["X-Turn-Id"]
        assert body["choices"][0]["message"]["content"] == "Done."

        # Offered: each operation, by operationId or method and path, with its parameters.
        offered = {t["function"]["name"]: t["function"] for t in upstream.requests[0]["tools"]}
        long_names = [n for n in offered if n.startswith("api_xxx")]
        assert len(long_names) == 2 and all(len(n) == 64 for n in long_names) and long_names[0] != long_names[1]
        assert {"api_getItem", "api_createNote", "api_get_status", "api_slow", "api_elsewhere", "api_moved"} <= set(offered)
        get_item = offered["api_getItem"]
        assert get_item["description"] == "Read an item."
        assert get_item["parameters"]["properties"]["item_id"] == {"type": "string", "description": "The item."}
        assert get_item["parameters"]["properties"]["verbose"] == {"type": "boolean"}
        assert get_item["parameters"]["required"] == ["item_id"]
        note = offered["api_createNote"]["parameters"]
        assert note["properties"]["tags"] == {"type": "array", "items": {"type": "string", "enum": ["a", "b"]}}  # $refs resolved
        assert note["required"] == ["title"]

        # What the server saw: one request per call, the key header, parameters in place.
        seen = {(r["method"], r["path"]): r for r in api.seen}
        assert seen[("GET", "/items/a b/c")]["query"] == {"verbose": "true"}
        assert seen[("POST", "/notes")]["json"] == {"title": "hello", "tags": ["a"]}
        assert all(r["auth"] == KEY for r in api.seen)
        assert ("GET", "/status") in seen and ("GET", "/slow") in seen
        assert api.elsewhere == []  # the redirect to another origin was not followed

        completed = {d["call_id"]: d for d in of_type(await svc.events(turn_id), "tool.completed")}
        assert json.loads(completed["c1"]["output"]) == {"id": "a b/c", "verbose": "true"}
        assert json.loads(completed["c2"]["output"]) == {"created": {"title": "hello", "tags": ["a"]}}
        assert completed["c3"]["output"] == "all good" and completed["c3"]["status"] == "completed"
        assert completed["c4"]["status"] == "failed" and json.loads(completed["c4"]["output"]) == {"error": "HTTP 404: no such item"}
        assert completed["c5"]["status"] == "failed"
        assert completed["c5"]["output"] == 'Error: Tool "api_slow" did not finish within 1 seconds and was cancelled.'
        assert completed["c6"]["status"] == "failed" and "another origin" in json.loads(completed["c6"]["output"])["error"]
        assert completed["c7"]["output"] == "all good"  # a same-origin redirect is followed
        # The model saw the error results.
        sent = {m["tool_call_id"]: m["content"] for m in upstream.requests[1]["messages"] if m["role"] == "tool"}
        assert "HTTP 404: no such item" in sent["c4"]

        # The key never reaches the log.
        async with svc.http.get(svc.url + f"/v1/turns/{turn_id}/events") as resp:
            assert resp.status == 200 and "sk-openapi-secret" not in await resp.text()
        calls_before = len(api.seen)
        status, verified = await svc.get(f"/v1/turns/{turn_id}/verify")
        assert status == 200 and verified["ok"], verified
        assert len(api.seen) == calls_before  # a replay never calls the server
    finally:
        await stop_service(svc)


async def test_an_unreachable_server_is_a_warning(tmp_path: Path, upstream: ScriptedUpstream, database_url: str, api: ApiServer) -> None:
    servers = {"api": {"url": api.url}, "down": {"url": f"http://127.0.0.1:{free_port()}"}, "nospec": {"url": api.url, "spec": "/nothing.json"}}
    svc = await start_service(make_settings(tmp_path, upstream.url, database_url=database_url, tool_servers=servers), upstream)
    try:
        upstream.enqueue(Reply(text="Without two of them."))
        body = {"model": "gpt-test", "stream": True, "messages": USER, "tool_ids": ["openapi:down", "openapi:nospec", "openapi:api"]}
        async with svc.http.post(svc.v1 + "/chat/completions", json=body) as resp:
            assert resp.status == 200
            turn_id = resp.headers["X-Turn-Id"]
            raw = await resp.text()
        view = await svc.turn(turn_id)
        assert view["status"] == "completed"
        assert any(w.startswith("Failed to connect to OpenAPI tool server 'down':") for w in view["warnings"]), view["warnings"]
        assert any(w.startswith("Failed to connect to OpenAPI tool server 'nospec': ") and "HTTP 404" in w for w in view["warnings"]), view["warnings"]
        await check_stream_against_log(svc, turn_id, raw)
        names = {t["function"]["name"] for t in upstream.requests[0]["tools"]}
        assert "api_getItem" in names and not any(n.startswith(("down_", "nospec_")) for n in names)
        status, data, _ = await svc.post("/v1/chat/completions", {"model": "gpt-test", "messages": USER, "tool_ids": ["openapi:nope"]})
        assert status == 400 and "openapi:nope" in data["error"]["message"]
    finally:
        await stop_service(svc)


async def test_a_resumed_turn_reads_the_document_at_the_call(api: ApiServer) -> None:
    servers = OpenApiServers({"api": OpenApiServerConfig(api.url)})
    turn = servers.open(["openapi:api"])
    try:
        handle = turn.handle("api_getItem")
        assert handle is not None and turn.handle("other_getItem") is None
        ctx = ToolContext(user={}, messages=[], files=[], metadata={}, emit=None)
        execution = await execute_tool_call("api_getItem", '{"item_id": "7"}', {"api_getItem": handle}, ctx)
        assert json.loads(execution.result.text or "") == {"id": "7", "verbose": None}
        missing = turn.handle("api_nothing")
        assert missing is not None
        failed = await execute_tool_call("api_nothing", "{}", {"api_nothing": missing}, ctx)
        assert failed.result.status == "failed" and "has no operation named" in (failed.error or "")
    finally:
        await turn.close()


def test_a_body_that_is_not_an_object_is_one_parameter() -> None:
    doc: dict[str, Any] = {
        "paths": {
            "/bulk": {"put": {"requestBody": {"content": {"application/json; charset=utf-8": {"schema": {"type": "array", "items": {"type": "integer"}}}}}}},
            "/self": {"post": {"operationId": "loop", "requestBody": {"content": {"application/json": {"schema": {"$ref": "#/components/schemas/Node"}}}}}},
        },
        "components": {
            "schemas": {
                "Node": {"type": "object", "properties": {"next": {"$ref": "#/components/schemas/Node"}}},
                # Two references to itself: expanded to any fixed depth, 2^depth copies.
                "Tree": {"type": "object", "properties": {"left": {"$ref": "#/components/schemas/Tree"}, "right": {"$ref": "#/components/schemas/Tree"}}},
            }
        },
    }
    doc["paths"]["/tree"] = {
        "post": {"operationId": "tree", "requestBody": {"content": {"application/json": {"schema": {"$ref": "#/components/schemas/Tree"}}}}}
    }
    ops = operations(doc)
    bulk = ops["put_bulk"]
    assert bulk.whole_body and bulk.parameters == {"type": "object", "properties": {"body": {"type": "array", "items": {"type": "integer"}}}}
    assert ops["loop"].parameters["properties"]["next"] == {}  # a schema naming itself stops there
    assert ops["tree"].parameters["properties"] == {"left": {}, "right": {}}
    with pytest.raises(ValueError, match="no paths"):
        operations({"openapi": "3.1.0"})


def test_configuration_from_the_environment_and_toml(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TURNLOG_TOOL_SERVERS", json.dumps({"a": {"url": "http://h", "headers": {"Authorization": "Bearer t"}}}))
    settings = load_settings(None)
    assert settings.tool_servers["a"].url == "http://h" and settings.tool_servers["a"].spec == "/openapi.json"
    monkeypatch.delenv("TURNLOG_TOOL_SERVERS")
    config = tmp_path / "turnlog.toml"
    config.write_text('[tool_servers.files]\nurl = "http://f"\nspec = "/v1/spec.json"\ntimeout = 5\n')
    settings = load_settings(config)
    assert settings.tool_servers["files"].spec == "/v1/spec.json" and settings.tool_servers["files"].timeout == 5
    config.write_text('[tool_servers."bad name"]\nurl = "http://f"\n')
    with pytest.raises(ValueError, match="bad name"):
        load_settings(config)


async def test_mcp_and_openapi_servers_in_one_turn(tmp_path: Path, upstream: ScriptedUpstream, database_url: str, api: ApiServer, mcp_server: str) -> None:
    settings = make_settings(
        tmp_path, upstream.url, database_url=database_url, tool_servers={"api": {"url": api.url}}, mcp_servers={"tools": {"url": mcp_server}}
    )
    svc = await start_service(settings, upstream)
    try:
        upstream.enqueue(
            Reply(tool_calls=[call("tools_echo", {"text": "from mcp"}, "m1"), call("api_get_status", {}, "o1")], finish_reason="tool_calls"),
            Reply(text="Both answered."),
        )
        status, body, headers = await svc.post("/v1/chat/completions", {"model": "gpt-test", "messages": USER, "tool_ids": ["mcp:tools", "openapi:api"]})
        assert status == 200, body
        offered = {t["function"]["name"] for t in upstream.requests[0]["tools"]}
        assert {"tools_echo", "api_getItem", "api_get_status"} <= offered
        events = await svc.events(headers["X-Turn-Id"])
        (step,) = [d for d in of_type(events, "assembly.step") if d["step"] == "tool_servers"]
        assert set(step["detail"]["servers"]) == {"mcp:tools", "openapi:api"}
        completed = {d["call_id"]: d for d in of_type(events, "tool.completed")}
        assert completed["m1"]["output"] == "from mcp" and completed["o1"]["output"] == "all good"
        # A request naming no server takes the plain path: nothing is connected.
        upstream.enqueue(Reply(text="No tools."))
        status, body, headers = await svc.post("/v1/chat/completions", {"model": "gpt-test", "messages": USER})
        assert status == 200 and "tools" not in upstream.requests[-1]
        assert not [d for d in of_type(await svc.events(headers["X-Turn-Id"]), "assembly.step") if d["step"] == "tool_servers"]
    finally:
        await stop_service(svc)
