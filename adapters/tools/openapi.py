"""Tools from OpenAPI tool servers (Open WebUI's convention), over plain HTTP.

A request names a server with ``tool_ids: ["openapi:NAME"]``. While the turn
assembles, turnlog reads the server's OpenAPI document (``spec``, by default
``/openapi.json`` under its URL); each operation becomes a tool named
``NAME_OPERATION`` (its ``operationId``, else its method and path; made valid
and unique within 64 characters as MCP tools' names are). Its parameters are
the operation's path and query parameters and the properties of its JSON body
(a body that is not an object is one parameter, ``body``); local ``$ref``\\ s
are resolved.

A call is the HTTP request to the configured URL plus the operation's path;
its JSON or text response is the result. An error status is an error result
the model sees (``HTTP 404: <body>``). The configured URL is trusted, but a
redirect to another origin is refused: the server's headers may carry keys,
and following it would hand them to whoever the server points at. A server
that cannot be reached, or whose document is unusable, becomes an assembly
warning and the turn goes on without its tools; the engine records every
result, so a replay never calls the server.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote

import aiohttp
from yarl import URL

from adapters.tools.names import function_names, unlisted_spec
from engine.ports import NoTurnToolServers, ToolServerListing, TurnToolServers
from engine.tools.calls import ToolContext, ToolHandle, ToolSpec

log = logging.getLogger("turnlog.openapi")

PREFIX = "openapi:"
METHODS = ("get", "put", "post", "delete", "options", "head", "patch", "trace")
#: Same-origin redirects followed at most (a server that loops).
MAX_REDIRECTS = 10
#: How deep ``$ref``\ s are followed (a schema that refers to itself stops there).
MAX_REF_DEPTH = 32
#: The most of a response body kept for the model (the rest is cut).
MAX_BODY_BYTES = 4 * 1024 * 1024


@dataclass(frozen=True)
class OpenApiServerConfig:
    """One configured server: its base URL, where its document is (a path
    under the URL, or an absolute URL), headers sent with every request,
    the seconds a call may take (None: the service's tool timeout) and the
    seconds reading the document may take."""

    url: str
    spec: str = "/openapi.json"
    headers: Mapping[str, str] = field(default_factory=dict)
    timeout: float | None = None
    connect_timeout: float = 10.0

    def spec_url(self) -> URL:
        if self.spec.startswith(("http://", "https://")):
            return URL(self.spec)
        return URL(self.url.rstrip("/") + "/" + self.spec.lstrip("/"))


class OpenApiToolError(Exception):
    """The server answered a call with an error status (its text is what the model sees)."""


class RedirectRefused(Exception):
    """A redirect to another origin than the request's."""


@dataclass(frozen=True)
class Operation:
    """One operation of a document, as a tool: where each parameter goes."""

    method: str
    path: str
    description: str
    parameters: dict[str, Any]
    locations: dict[str, str]  # parameter -> "path" | "query" | "body"
    whole_body: bool  # the body is one parameter, ``body`` (not an object's properties)
    has_body: bool


# -- the document -----------------------------------------------------------------


def _resolve(node: Any, doc: Mapping[str, Any], path: tuple[str, ...] = ()) -> Any:
    """``node`` with its local ``$ref``\\ s replaced by what they name. A
    reference to a schema it is already inside of (a recursive schema), one
    deeper than ``MAX_REF_DEPTH`` or one that is not local becomes ``{}``:
    expanding a tree-shaped schema that names itself twice would never end."""
    if isinstance(node, list):
        return [_resolve(item, doc, path) for item in node]
    if not isinstance(node, dict):
        return node
    ref = node.get("$ref")
    if isinstance(ref, str):
        if ref in path or len(path) >= MAX_REF_DEPTH or not ref.startswith("#/"):
            return {}
        target: Any = doc
        for part in ref[2:].split("/"):
            part = part.replace("~1", "/").replace("~0", "~")
            target = target.get(part) if isinstance(target, dict) else None
        siblings = {k: v for k, v in node.items() if k != "$ref"}
        resolved = _resolve(target, doc, (*path, ref)) if isinstance(target, dict) else {}
        return {**resolved, **_resolve(siblings, doc, path)}
    return {k: _resolve(v, doc, path) for k, v in node.items()}


def _json_body_schema(operation: Mapping[str, Any]) -> tuple[dict[str, Any] | None, bool]:
    """The JSON request body's schema and whether the body is required."""
    body = operation.get("requestBody")
    if not isinstance(body, dict):
        return None, False
    content = body.get("content")
    media = None
    if isinstance(content, dict):
        media = next((v for k, v in content.items() if k.split(";")[0].strip() == "application/json" and isinstance(v, dict)), None)
    if media is None:
        return None, False
    schema = media.get("schema")
    return (dict(schema) if isinstance(schema, dict) else {}), bool(body.get("required"))


def _operation(method: str, path: str, item: Mapping[str, Any], op: Mapping[str, Any]) -> Operation:
    properties: dict[str, Any] = {}
    required: list[str] = []
    locations: dict[str, str] = {}
    declared = [*(item.get("parameters") or []), *(op.get("parameters") or [])]
    for param in declared:  # an operation's own parameters override the path item's
        if not isinstance(param, dict) or param.get("in") not in ("path", "query") or not isinstance(param.get("name"), str):
            continue
        name = param["name"]
        given = param.get("schema")
        param_schema: dict[str, Any] = dict(given) if isinstance(given, dict) else {"type": "string"}
        if param.get("description"):
            param_schema.setdefault("description", param["description"])
        properties[name], locations[name] = param_schema, param["in"]
        if (param.get("required") or param["in"] == "path") and name not in required:
            required.append(name)
    schema, body_required = _json_body_schema(op)
    whole_body = False
    if schema is not None:
        body_properties = schema.get("properties")
        if schema.get("type", "object") == "object" and isinstance(body_properties, dict):
            for name, sub in body_properties.items():
                if name in locations:
                    continue  # a path or query parameter of the same name keeps it
                properties[name], locations[name] = sub, "body"
            required += [n for n in schema.get("required") or [] if locations.get(n) == "body" and n not in required]
        else:
            whole_body = True
            properties["body"], locations["body"] = schema, "body"
            if body_required:
                required.append("body")
    parameters: dict[str, Any] = {"type": "object", "properties": properties}
    if required:
        parameters["required"] = required
    text = op.get("description") or op.get("summary") or f"{method.upper()} {path}"
    return Operation(method, path, str(text), parameters, locations, whole_body, schema is not None)


def operations(doc: Mapping[str, Any]) -> dict[str, Operation]:
    """The document's operations by tool name (``operationId``, else method and path)."""
    if not isinstance(doc.get("paths"), dict):
        raise ValueError("the OpenAPI document has no paths")
    resolved = _resolve(dict(doc), doc)
    found: dict[str, Operation] = {}
    for path, item in resolved["paths"].items():
        if not isinstance(item, dict):
            continue
        for method in METHODS:
            op = item.get(method)
            if not isinstance(op, dict):
                continue
            given = op.get("operationId")
            name = given if isinstance(given, str) and given else f"{method}_{str(path).strip('/')}"
            found.setdefault(name, _operation(method, str(path), item, op))
    return found


# -- HTTP -----------------------------------------------------------------------------


async def request(http: aiohttp.ClientSession, method: str, url: URL, **kw: Any) -> tuple[int, str, bytes]:
    """``method url``, following same-origin redirects only: the status, the
    content type and the body (at most ``MAX_BODY_BYTES``)."""
    for _ in range(MAX_REDIRECTS + 1):
        async with http.request(method, url, allow_redirects=False, **kw) as resp:
            location = resp.headers.get("Location")
            if resp.status in (301, 302, 303, 307, 308) and location:
                target = url.join(URL(location))
                if target.origin() != url.origin():
                    raise RedirectRefused(f"the server redirected to another origin ({target.origin()}); refused")
                if resp.status == 303 or (resp.status in (301, 302) and method.upper() == "POST"):
                    method, kw = "GET", {k: v for k, v in kw.items() if k != "json"}
                url = target
                continue
            body = await resp.content.read(MAX_BODY_BYTES)
            return resp.status, resp.headers.get("Content-Type", ""), body
    raise RedirectRefused(f"more than {MAX_REDIRECTS} redirects")


def _describe(exc: BaseException) -> str:
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def _result(content_type: str, body: bytes) -> Any:
    text = body.decode("utf-8", errors="replace")
    if "json" in content_type.split(";")[0]:
        try:
            return json.loads(text)
        except ValueError:
            return text
    return text


# -- a turn's servers -----------------------------------------------------------------


@dataclass
class OpenApiToolHandle:
    """A ``ToolHandle`` for one operation of one server."""

    spec: ToolSpec
    servers: OpenApiTurnServers
    server: str
    operation: Operation | None  # None: found by its function name when first called (a resumed turn)

    async def __call__(self, args: dict[str, Any], ctx: ToolContext) -> Any:
        operation = self.operation
        if operation is None:
            operation = (await self.servers.listing(self.server)).get(self.spec.name)
            if operation is None:
                raise LookupError(f"OpenAPI tool server '{self.server}' has no operation named {self.spec.name!r}")
        config = self.servers.configs[self.server]
        path = operation.path
        query: dict[str, str] = {}
        body: dict[str, Any] = {}
        for name, value in args.items():
            where = operation.locations.get(name)
            if where == "path":
                path = path.replace("{" + name + "}", quote(str(value), safe=""))
            elif where == "query" and value is not None:
                query[name] = json.dumps(value) if isinstance(value, (dict, list)) else str(value).lower() if isinstance(value, bool) else str(value)
            elif where == "body":
                body[name] = value
        kw: dict[str, Any] = {"params": query, "headers": dict(config.headers)}
        if operation.whole_body and "body" in body:
            kw["json"] = body["body"]
        elif operation.has_body and (body or "body" not in operation.locations):
            kw["json"] = body
        url = URL(config.url.rstrip("/") + path, encoded=True)  # the values are quoted above
        status, content_type, data = await request(self.servers.http(), operation.method.upper(), url, **kw)
        if status >= 400:
            raise OpenApiToolError(f"HTTP {status}: {data.decode('utf-8', errors='replace')}")
        return _result(content_type, data)


def _spec(server: str, name: str, operation: Operation, config: OpenApiServerConfig) -> ToolSpec:
    return ToolSpec(
        name=name,
        description=operation.description,
        parameters=operation.parameters,
        tool_id=f"{PREFIX}{server}",
        kind="server",
        timeout=config.timeout,
    )


class OpenApiTurnServers:
    """``engine.ports.TurnToolServers``: the OpenAPI servers one turn named,
    over one HTTP client session closed when the turn ends."""

    def __init__(self, configs: Mapping[str, OpenApiServerConfig]) -> None:
        self.configs = dict(configs)
        self._http: aiohttp.ClientSession | None = None
        self._listings: dict[str, asyncio.Task[dict[str, Operation]]] = {}
        self._listed: dict[str, OpenApiToolHandle] = {}
        self._connected = False

    def http(self) -> aiohttp.ClientSession:
        if self._http is None:
            self._http = aiohttp.ClientSession()
        return self._http

    async def _read(self, server: str) -> dict[str, Operation]:
        config = self.configs[server]
        async with asyncio.timeout(config.connect_timeout):
            status, content_type, body = await request(self.http(), "GET", config.spec_url(), headers=dict(config.headers))
        if status >= 400:
            raise ConnectionError(f"HTTP {status} for the OpenAPI document")
        try:
            doc = json.loads(body)
        except ValueError:
            raise ValueError("the OpenAPI document is not JSON") from None
        if not isinstance(doc, dict):
            raise ValueError("the OpenAPI document is not an object")
        ops = operations(doc)
        names = function_names(server, list(ops))
        return {function: ops[op] for function, op in names.items()}

    async def listing(self, server: str) -> dict[str, Operation]:
        """The server's operations by function name, read once per turn (again after a failure)."""
        task = self._listings.get(server)
        if task is None or (task.done() and (task.cancelled() or task.exception() is not None)):
            task = asyncio.ensure_future(self._read(server))
            self._listings[server] = task
        return await asyncio.shield(task)

    async def connect(self) -> ToolServerListing:
        tools: dict[str, list[str]] = {}
        warnings: list[str] = []
        results = await asyncio.gather(*(self.listing(name) for name in self.configs), return_exceptions=True)
        for name, outcome in zip(self.configs, results, strict=True):
            if isinstance(outcome, asyncio.CancelledError):
                raise outcome
            if isinstance(outcome, BaseException):
                reason = f"no answer within {self.configs[name].connect_timeout:g} s" if isinstance(outcome, TimeoutError) else _describe(outcome)
                log.warning("OpenAPI tool server %s: %s", name, reason)
                warnings.append(f"Failed to connect to OpenAPI tool server '{name}': {reason}")
                continue
            for function, operation in outcome.items():
                self._listed[function] = OpenApiToolHandle(_spec(name, function, operation, self.configs[name]), self, name, operation)
            tools[f"{PREFIX}{name}"] = list(outcome)
        self._connected = True
        return ToolServerListing(tools, warnings, [])

    def listed(self) -> Mapping[str, ToolHandle]:
        return self._listed

    def handle(self, name: str) -> ToolHandle | None:
        found = self._listed.get(name)
        if found is not None or self._connected:
            return found
        # Not listed in this process (a resumed turn): the document is read at the call.
        found_spec = unlisted_spec(name, PREFIX, {server: config.timeout for server, config in self.configs.items()})
        return None if found_spec is None else OpenApiToolHandle(found_spec[1], self, found_spec[0], None)

    async def close(self) -> None:
        pending = [t for t in self._listings.values() if not t.done()]
        for task in pending:
            task.cancel()
        if pending:
            await asyncio.wait(pending)
        for task in self._listings.values():
            if not task.cancelled():
                task.exception()  # retrieved: a failure was a warning or a call's error already
        if self._http is not None:
            await self._http.close()


class OpenApiServers:
    """``engine.ports.ToolServers``: the OpenAPI tool servers of the configuration."""

    prefix = PREFIX

    def __init__(self, configs: Mapping[str, OpenApiServerConfig]) -> None:
        self.configs = dict(configs)

    def known_ids(self) -> set[str]:
        return {f"{PREFIX}{name}" for name in self.configs}

    def open(self, tool_ids: Sequence[str]) -> TurnToolServers:
        wanted = {t[len(PREFIX) :]: self.configs[t[len(PREFIX) :]] for t in tool_ids if t.startswith(PREFIX) and t[len(PREFIX) :] in self.configs}
        if not wanted:
            return NoTurnToolServers()
        return OpenApiTurnServers(wanted)


__all__ = ["OpenApiServerConfig", "OpenApiServers", "OpenApiToolError", "OpenApiTurnServers", "operations"]
