"""Builds the service from its settings: the one place where its parts are
chosen and wired together (as Cosmic Python's ``bootstrap.py``).

In order: the code executor (which logs the isolation its sandbox gets, and
refuses a weak sandbox in a deployment with secrets before anything else
starts), the store (migrated), the observers, the upstream providers (and the
demo model with ``--demo``), the model catalog, the web search, page fetcher
and image clients, the embedder, the vector store, memories and the
files/knowledge service (with its reranker), the tool catalog (tool modules,
MCP and OpenAPI tool servers), the
live bus (with PostgreSQL: the signals that connect processes), the per-turn
wiring and the supervisor. ``Runtime.start`` then resumes what a crash
interrupted; ``Runtime.close`` tears everything down in reverse.

``adapters.http.app`` only mounts routes on what this builds.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

from sqlalchemy.engine import make_url

from adapters.catalog import Catalog
from adapters.code import build_code_executor, start_code_executor
from adapters.config import Settings
from adapters.demo_tools import DEMO_TOOLS_DIR
from adapters.embeddings import open_embedder
from adapters.filters import load_filters
from adapters.images import open_images
from adapters.knowledge.chunking import Cl100kCounter
from adapters.knowledge.files import FileKnowledge, KnowledgeSettings
from adapters.knowledge.memories import Memories
from adapters.live_pg import PgSignals
from adapters.observe.metrics import Metrics
from adapters.observe.observers import Observers
from adapters.observe.tracing import open_tracing
from adapters.owner_locks import open_owner_locks
from adapters.pipes import load_pipes
from adapters.presets import Presets
from adapters.providers.demo import DemoProvider
from adapters.providers.ollama import OllamaProvider
from adapters.providers.openai_chat import OpenAIChatProvider
from adapters.providers.openai_responses import OpenAIResponsesProvider
from adapters.rerank import open_reranker
from adapters.store import create_engine, open_store
from adapters.store.migrate import migrate
from adapters.store.usage import Limits, Quotas, SqlUsage
from adapters.tools.catalog import DirToolCatalog
from adapters.vectors import open_vector_store
from adapters.web import open_fetcher, open_search
from engine.ports import (
    ChatProvider,
    CodeExecutor,
    Embedder,
    EventStore,
    NoTools,
    NoToolServers,
    ToolCatalog,
)
from engine.run.live import InProcessBus
from engine.run.supervisor import Supervisor
from engine.run.wiring import TurnWiring


@dataclass
class Services:
    """What every HTTP handler reaches through the application."""

    settings: Settings
    store: EventStore
    catalog: Catalog
    supervisor: Supervisor
    providers: dict[str, ChatProvider]
    memories: Memories
    knowledge: FileKnowledge  # files, collections, retrieval (engine.ports.Knowledge)
    presets: Presets  # model presets (settings and /v1/presets)
    quotas: Quotas | None = None  # usage and the quotas a turn's start must pass


class Closable(Protocol):
    async def close(self) -> None: ...


@dataclass
class Runtime:
    """The built service: its parts, and what must be closed with it."""

    services: Services
    observers: Observers
    vectors: Closable  # the vector store
    signals: PgSignals | None
    embedder: Closable | None  # the one bootstrap opened (closed with the service), if any
    clients: list[Closable] = field(default_factory=list)  # web search, images, reranker

    async def start(self) -> None:
        svc = self.services
        await svc.knowledge.start()  # resumes the ingestions a crash interrupted
        await svc.supervisor.start()  # records interrupted turns, resumes them
        svc.catalog.start()  # logs the upstreams (or that there is none) and their models

    async def close(self) -> None:
        svc = self.services
        await svc.supervisor.stop()
        await svc.knowledge.stop()
        await self.vectors.close()
        await svc.catalog.close()
        if self.signals is not None:
            await self.signals.close()
        for provider in svc.providers.values():
            await provider.close()
        if self.embedder is not None:
            await self.embedder.close()
        for client in self.clients:
            await client.close()
        await svc.store.close()
        await self.observers.close()


def configured_code_executor(settings: Settings, given: CodeExecutor | None = None) -> CodeExecutor:
    """The code runner of the legacy code loop: ``given``, else the one
    ``TURNLOG_CODE_EXECUTOR`` configures (``adapters.code``)."""
    return given if given is not None else build_code_executor(settings)


async def bootstrap(settings: Settings, *, code: CodeExecutor, metrics: Metrics, embedder: Embedder | None = None) -> Runtime:
    """The service ``settings`` describe. ``embedder`` embeds memories, file
    chunks and queries (tests pass one); None: the one the settings configure,
    if any (else retrieval is lexical only)."""
    await start_code_executor(code, settings)
    await migrate(settings.database_url)
    pool: dict[str, Any] = {} if settings.db_pool_size is None else {"pool_size": settings.db_pool_size}
    store = await open_store(
        settings.database_url,
        synchronous=settings.sqlite_synchronous,
        timeout=settings.db_timeout,
        gather=settings.commit_gather,
        **pool,
    )
    observers = Observers(metrics, open_tracing())  # traces only when OTEL_* asks for them
    store.observer = observers
    providers = open_providers(settings)
    presets = Presets(settings.models, store.engine)
    catalog = Catalog(settings, providers, presets=presets)
    search, fetcher, images = open_search(settings), open_fetcher(settings), open_images(settings)
    opened = open_embedder(settings) if embedder is None else None
    embeddings = embedder if embedder is not None else opened
    vectors = await open_vector_store(settings.database_url)
    memories = Memories(store.engine, embedder=embeddings, vectors=vectors if embeddings is not None else None)
    knowledge_engine = create_engine(settings.database_url, **_knowledge_engine_options(settings))
    reranker = open_reranker(settings)
    knowledge = FileKnowledge.open(
        knowledge_engine, store, vectors=vectors, embedder=embeddings, settings=KnowledgeSettings.from_settings(settings), reranker=reranker
    )
    tools = open_tools(settings)
    servers = open_tool_servers(settings, tools)
    if servers is not None:
        tools = servers  # the catalog knows the mcp:NAME and openapi:NAME tool ids too
    bus = InProcessBus()
    signals: PgSignals | None = None
    owners: list[Supervisor] = []  # the supervisor, once it exists (PgSignals calls back into it)
    if make_url(settings.database_url).get_backend_name() == "postgresql":
        signals = await _open_signals(settings, bus, owners)
    wiring = TurnWiring(
        store=store,
        blobs=store,
        models=catalog,
        settings=settings.engine(),
        tools=tools,
        code=code,
        filters=load_filters(settings),
        memories=memories,
        knowledge=knowledge,
        search=search,
        fetcher=fetcher,
        images=images,
        observer=observers,
        tool_servers=servers if servers is not None else NoToolServers(),
        tokens=Cl100kCounter(),
    )
    supervisor = Supervisor(store=store, bus=bus, wiring=wiring, remote=signals, owner_locks=open_owner_locks(settings.database_url))
    owners.append(supervisor)
    quotas = Quotas(SqlUsage(store.engine), Limits(settings.quota_requests_per_minute, settings.quota_tokens_per_day))
    services = Services(
        settings=settings,
        store=store,
        catalog=catalog,
        supervisor=supervisor,
        providers=providers,
        memories=memories,
        knowledge=knowledge,
        presets=presets,
        quotas=quotas,
    )
    clients: list[Closable] = [client for client in (search, images, reranker) if client is not None]
    return Runtime(services=services, observers=observers, vectors=vectors, signals=signals, embedder=opened, clients=clients)


def open_providers(settings: Settings) -> dict[str, ChatProvider]:
    """A provider per upstream connection (the single-upstream settings are
    the connections ``openai`` and ``ollama``), by connection name; the pipes
    of ``TURNLOG_PIPES_DIR`` and, with ``--demo``, the demo model before them."""
    providers: dict[str, ChatProvider] = {}
    timeouts: dict[str, Any] = {
        "connect_timeout": settings.upstream_connect_timeout,
        "idle_timeout": settings.upstream_idle_timeout,
        "headers_timeout": settings.upstream_headers_timeout,
    }
    for name, connection in settings.all_connections().items():
        key = connection.api_key.get_secret_value() if connection.api_key else None
        if connection.type == "ollama":
            providers[name] = OllamaProvider(connection.base_url, api_key=key, **timeouts)
            continue
        openai_cls = OpenAIResponsesProvider if connection.type == "responses" else OpenAIChatProvider
        providers[name] = openai_cls(connection.base_url, key, **timeouts)
    pipes = load_pipes(settings)
    if pipes is not None:
        # Before the upstreams: a pipe's id is its own, an upstream model of that id gets a prefix.
        providers = {"pipes": pipes, **providers}
    if settings.demo:
        # Listed first: the id `demo` is always the built-in model, even if
        # an upstream has one of that name (that one becomes `openai/demo`).
        providers = {"demo": DemoProvider(chunk_delay=settings.demo_chunk_delay), **providers}
    return providers


def open_tools(settings: Settings) -> ToolCatalog:
    """The tool modules of the tools directory (and the demo's with ``--demo``)."""
    tool_dirs = [d for d in (settings.tools_dir, DEMO_TOOLS_DIR if settings.demo else None) if d]
    return DirToolCatalog(*tool_dirs) if tool_dirs else NoTools()


def open_mcp_servers(settings: Settings, base: ToolCatalog) -> Any:
    """The configured MCP servers over the tool modules, or None; the ``mcp``
    package (the ``mcp`` extra) is imported only when a server is configured."""
    if not settings.mcp_servers:
        return None
    from adapters.tools.mcp import McpServerConfig, McpServers

    configs = {name: McpServerConfig(**server.model_dump()) for name, server in settings.mcp_servers.items()}
    return McpServers(configs, base)


def open_tool_servers(settings: Settings, base: ToolCatalog) -> Any:
    """The configured tool servers (MCP, OpenAPI) over the tool modules, or None."""
    mcp = open_mcp_servers(settings, base)
    if not settings.tool_servers:
        return mcp
    from adapters.tools.openapi import OpenApiServerConfig, OpenApiServers
    from adapters.tools.servers import ToolServerSet

    openapi = OpenApiServers({name: OpenApiServerConfig(**server.model_dump()) for name, server in settings.tool_servers.items()})
    return ToolServerSet(base, [openapi] if mcp is None else [mcp, openapi])


async def _open_signals(settings: Settings, bus: InProcessBus, owners: list[Supervisor]) -> PgSignals:
    """Several processes may share a PostgreSQL database: wake each other's
    subscribers and route cancels to a turn's owner."""

    def cancel_here(turn_id: str, by: str) -> None:
        for owner in owners:
            owner.cancel_requested_elsewhere(turn_id, by)

    def adopt_here() -> None:
        for owner in owners:
            owner.adopt_soon()

    signals = PgSignals(settings.database_url, on_events=bus.wake, on_cancel=cancel_here, on_released=adopt_here)
    await signals.start()
    bus.on_committed = signals.appended
    return signals


def _knowledge_engine_options(settings: Settings) -> dict[str, Any]:
    """The files service's own small pool (SQLite: the service's fsync policy)."""
    if make_url(settings.database_url).get_backend_name() == "sqlite":
        return {"synchronous": settings.sqlite_synchronous, "pool_size": 4}
    return {"pool_size": 4}
