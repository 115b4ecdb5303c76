"""Tools from MCP servers over streamable HTTP, through the official ``mcp`` package.

A request names a server with ``tool_ids: ["mcp:NAME"]``. While the turn
assembles, turnlog opens one MCP session per named server and lists its tools;
each becomes a tool spec named ``NAME_tool`` (cut to 64 characters with a hash,
as Open WebUI does). Every call of the turn goes through that same session,
which is closed when the turn ends. A server that cannot be reached or listed
becomes a warning and the turn goes on without its tools; a call that fails,
raises on the server or outlives its timeout becomes an error result — the
engine records the result either way, so a replay never calls the server.

What a call returns is the MCP ``content`` list (text, image, audio, resource
parts), which ``engine.tools.calls.normalize_result`` processes as
Open WebUI processes MCP results; arguments are not filtered by the tool's
schema (as Open WebUI does for MCP): the server validates them.

The session speaks the initialize handshake (``mode="legacy"``): the protocol
every streamable-HTTP MCP server answers, with a server-side session
(``Mcp-Session-Id``) that the client ends with a ``DELETE`` when it closes.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

# The mcp client checks a tool's structured result with jsonschema, which it
# imports at the first call; that import takes seconds (its format checkers
# build grammars), which the first call of the first turn would spend inside its
# timeout. Imported with this module instead: once, when the service starts.
import jsonschema  # type: ignore[import-untyped]  # noqa: F401
from mcp import Client, MCPError
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client

from adapters.tools.names import function_name, function_names, unlisted_spec
from engine.ports import NoTurnToolServers, ToolCatalog, ToolServerListing, TurnToolServers
from engine.tools.calls import ToolContext, ToolHandle, ToolSpec

log = logging.getLogger("turnlog.mcp")
# One INFO line per HTTP request and per stream reconnect is noise in the
# service's log; what matters (a server not reached, a session that died) is
# logged here as a warning.
for _name in ("httpx2", "mcp.client.streamable_http"):
    logging.getLogger(_name).setLevel(logging.WARNING)

PREFIX = "mcp:"
#: A listing longer than this many pages is cut (a server that paginates forever).
MAX_PAGES = 100
#: How long a closing session may take to end itself (its DELETE) before it is cut off.
CLOSE_SECONDS = 5.0


@dataclass(frozen=True)
class McpServerConfig:
    """One configured server. ``timeout``: seconds a call may take (None: the
    service's tool timeout); ``connect_timeout``: connecting and listing."""

    url: str
    headers: Mapping[str, str] = field(default_factory=dict)
    timeout: float | None = None
    connect_timeout: float = 10.0


class McpToolError(Exception):
    """The server answered the call with ``isError``: its text is the error."""


def _describe(exc: BaseException) -> str:
    """A one-line reason, from the innermost exception of an exception group."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def _content(result: Any) -> list[dict[str, Any]]:
    """The ``content`` parts in MCP's wire shape (what ``normalize_result`` processes); a
    ``resource_link`` is a resource with only its uri."""
    parts: list[dict[str, Any]] = []
    for block in result.content:
        part = block.model_dump(mode="json", by_alias=True, exclude_none=True)
        part.pop("_meta", None)
        part.pop("annotations", None)
        if part.get("type") == "resource_link":
            part = {"type": "resource", "resource": {"uri": part.get("uri", "")}}
        parts.append(part)
    return parts


def _error_text(parts: list[dict[str, Any]]) -> str:
    texts = [str(p.get("text")) for p in parts if p.get("type") == "text" and p.get("text")]
    return "\n".join(texts) or "the MCP tool reported an error"


class _Session:
    """One server's MCP session for one turn.

    The ``mcp`` client lives in anyio task groups that must be left by the task
    that entered them; the session therefore runs in a task of its own, which
    opens it, lists the tools, and holds it until ``close``. Calls from the
    turn's tasks go through it concurrently.
    """

    def __init__(self, name: str, config: McpServerConfig) -> None:
        self.name = name
        self.config = config
        self.client: Client | None = None
        self.tools: list[Any] = []
        self.instructions: str | None = None
        self._ready: asyncio.Future[None] | None = None
        self._closing = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    async def open(self) -> None:
        """Connect and list, within ``connect_timeout``; raises why not."""
        loop = asyncio.get_running_loop()
        self._ready = loop.create_future()
        self._task = loop.create_task(self._run(self._ready), name=f"turnlog:mcp:{self.name}")
        try:
            async with asyncio.timeout(self.config.connect_timeout):
                await asyncio.shield(self._ready)
        except TimeoutError:
            await self._abandon()
            raise TimeoutError(f"no answer within {self.config.connect_timeout:g} s") from None
        except BaseException:
            await self._abandon()
            raise

    async def _abandon(self) -> None:
        """Stop a session that never opened (nothing to end politely)."""
        task = self._task
        if task is not None and not task.done():
            task.cancel()
            await asyncio.wait([task])  # its outcome is the ready future's; our own cancel still raises
        if self._ready is not None and self._ready.done() and not self._ready.cancelled():
            self._ready.exception()

    async def _run(self, ready: asyncio.Future[None]) -> None:
        http = create_mcp_http_client(headers=dict(self.config.headers) or None)
        try:
            async with http:
                transport = streamable_http_client(self.config.url, http_client=http)
                async with Client(transport, mode="legacy", cache=None) as client:
                    tools: list[Any] = []
                    cursor: str | None = None
                    for _ in range(MAX_PAGES):
                        page = await client.list_tools(cursor=cursor)
                        tools.extend(page.tools)
                        cursor = page.next_cursor
                        if cursor is None:
                            break
                    self.client, self.tools, self.instructions = client, tools, client.instructions
                    if not ready.done():
                        ready.set_result(None)
                    await self._closing.wait()
        except BaseException as exc:  # an unreachable server, a protocol error, cancel
            if not ready.done():
                ready.set_exception(exc if isinstance(exc, Exception) else ConnectionError(_describe(exc)))
            elif not isinstance(exc, asyncio.CancelledError):
                log.warning("MCP server %s: session ended: %s", self.name, _describe(exc))
            if isinstance(exc, asyncio.CancelledError):
                raise
        finally:
            self.client = None

    async def close(self) -> None:
        """End the session (the client sends its ``DELETE``); a server that does
        not let go within a few seconds is cut off."""
        self._closing.set()
        task = self._task
        if task is not None and not task.done():
            # asyncio.wait: the session's own failure is logged by it, never
            # raised here; a cancel of this coroutine still is.
            done, _ = await asyncio.wait([task], timeout=CLOSE_SECONDS)
            if not done:
                task.cancel()
                await asyncio.wait([task])
        if self._ready is not None and self._ready.done() and not self._ready.cancelled():
            self._ready.exception()  # retrieved: no "never retrieved" noise


@dataclass
class McpToolHandle:
    """A ``ToolHandle`` for one tool of one server, called in the turn's session."""

    spec: ToolSpec
    servers: McpTurnServers
    server: str
    tool: str | None  # None: found by its function name when first called (a resumed turn)

    async def __call__(self, args: dict[str, Any], ctx: ToolContext) -> Any:
        session = await self.servers.session(self.server)
        tool = self.tool
        if tool is None:
            tool = function_names(self.server, [t.name for t in session.tools]).get(self.spec.name)
            if tool is None:
                raise LookupError(f"MCP server '{self.server}' has no tool named {self.spec.name!r}")
        client = session.client
        if client is None:
            raise ConnectionError(f"the session with MCP server '{self.server}' has ended")
        try:
            result = await client.call_tool(tool, args)
        except MCPError as exc:  # the server refused the request (a JSON-RPC error)
            raise McpToolError(exc.error.message) from exc
        parts = _content(result)
        if result.is_error:
            raise McpToolError(_error_text(parts))
        return parts


def _spec(server: str, name: str, tool: Any, config: McpServerConfig) -> ToolSpec:
    schema = tool.input_schema if isinstance(tool.input_schema, dict) else {}
    parameters = {"type": "object", "properties": {}, **schema}
    parameters.pop("title", None)
    return ToolSpec(
        name=name,
        description=tool.description or tool.name,
        parameters=parameters,
        tool_id=f"{PREFIX}{server}",
        kind="server",
        timeout=config.timeout,
        filter_parameters=False,
    )


class McpTurnServers:
    """``engine.ports.TurnToolServers``: the MCP servers one turn named."""

    def __init__(self, configs: Mapping[str, McpServerConfig]) -> None:
        self._configs = dict(configs)
        self._sessions: dict[str, _Session] = {}
        self._opening: dict[str, asyncio.Task[_Session]] = {}
        self._listed: dict[str, McpToolHandle] = {}
        self._connected = False
        self._closed = False

    async def session(self, server: str) -> _Session:
        """The server's open session, opened at the first need (once per turn)."""
        if self._closed:
            raise ConnectionError("the turn's MCP sessions are closed")
        session = self._sessions.get(server)
        if session is not None and session.client is not None:
            return session
        task = self._opening.get(server)
        # Open it (again): never tried, failed, or a session that has ended since.
        if task is None or (task.done() and (task.cancelled() or task.exception() is not None or session is not None)):
            task = asyncio.ensure_future(self._open(server))
            self._opening[server] = task
        return await asyncio.shield(task)

    async def _open(self, server: str) -> _Session:
        session = _Session(server, self._configs[server])
        await session.open()
        self._sessions[server] = session
        return session

    async def connect(self) -> ToolServerListing:
        tools: dict[str, list[str]] = {}
        warnings: list[str] = []
        instructions: list[str] = []
        results = await asyncio.gather(*(self.session(name) for name in self._configs), return_exceptions=True)
        for name, outcome in zip(self._configs, results, strict=True):
            if isinstance(outcome, BaseException):
                if isinstance(outcome, asyncio.CancelledError):
                    raise outcome
                log.warning("MCP server %s: %s", name, _describe(outcome))
                warnings.append(f"Failed to connect to MCP server '{name}': {_describe(outcome)}")
                continue
            config = self._configs[name]
            names = function_names(name, [t.name for t in outcome.tools])
            by_tool = {t.name: t for t in outcome.tools}
            for function, tool in names.items():
                self._listed[function] = McpToolHandle(_spec(name, function, by_tool[tool], config), self, name, tool)
            tools[f"{PREFIX}{name}"] = list(names)
            if outcome.instructions:
                instructions.append(outcome.instructions)
        self._connected = True
        return ToolServerListing(tools, warnings, instructions)

    def listed(self) -> Mapping[str, ToolHandle]:
        return self._listed

    def handle(self, name: str) -> ToolHandle | None:
        found = self._listed.get(name)
        if found is not None or self._connected:
            return found
        # Not listed in this process (a resumed turn): a name of one of the
        # turn's servers is looked up on that server when it is called.
        found_spec = unlisted_spec(name, PREFIX, {server: config.timeout for server, config in self._configs.items()})
        return None if found_spec is None else McpToolHandle(found_spec[1], self, found_spec[0], None)

    async def close(self) -> None:
        self._closed = True
        opening = [task for task in self._opening.values() if not task.done()]
        for task in opening:
            task.cancel()
        if opening:
            await asyncio.wait(opening)
        for task in self._opening.values():
            if not task.cancelled():
                task.exception()  # retrieved: a failure was a warning or a call's error already
        await asyncio.gather(*(s.close() for s in self._sessions.values()), return_exceptions=True)
        self._sessions.clear()


class McpServers:
    """``engine.ports.ToolServers`` and the process's ``ToolCatalog``: the MCP
    servers of the configuration, over the tool modules of ``base`` (so that
    ``mcp:NAME`` is a tool id a request may name)."""

    prefix = PREFIX

    def __init__(self, configs: Mapping[str, McpServerConfig], base: ToolCatalog) -> None:
        self.configs = dict(configs)
        self.base = base

    def known_ids(self) -> set[str]:
        return self.base.known_ids() | {f"{PREFIX}{name}" for name in self.configs}

    def handles(self, tool_ids: Sequence[str]) -> dict[str, ToolHandle]:
        return self.base.handles([t for t in tool_ids if not t.startswith(PREFIX)])

    def open(self, tool_ids: Sequence[str]) -> TurnToolServers:
        wanted = {t[len(PREFIX) :]: self.configs[t[len(PREFIX) :]] for t in tool_ids if t.startswith(PREFIX) and t[len(PREFIX) :] in self.configs}
        if not wanted:
            return NoTurnToolServers()
        return McpTurnServers(wanted)


__all__ = ["McpServerConfig", "McpServers", "McpToolError", "McpTurnServers", "function_name", "function_names"]
