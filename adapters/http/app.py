"""The aiohttp application factory.

Everything the service needs is built in one cleanup context, in order: the
store (migrated), the upstream providers (and the demo model with ``--demo``),
the model catalog (which reports the upstreams it finds), the vector store and
the files/knowledge service (which resumes the ingestions a crash
interrupted), the supervisor (which records interrupted turns and resumes
them) — and torn down in reverse.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from typing import Any

from aiohttp import web
from sqlalchemy.engine import make_url

from adapters.catalog import Catalog
from adapters.code import build_code_executor, start_code_executor
from adapters.config import Settings
from adapters.demo_tools import DEMO_TOOLS_DIR
from adapters.embeddings import open_embedder
from adapters.filters import load_filters
from adapters.http import (
    approval_routes,
    blob_routes,
    chat_routes,
    file_routes,
    fork_routes,
    memory_routes,
    openapi,
    responses_routes,
    turn_routes,
    ui_routes,
    usage_routes,
    ws_routes,
)
from adapters.http.auth import auth_middleware
from adapters.http.context import SERVICES, Services
from adapters.http.errors import draining_response, error_middleware
from adapters.images import open_images
from adapters.knowledge.chunking import Cl100kCounter
from adapters.knowledge.files import FileKnowledge, KnowledgeSettings
from adapters.knowledge.memories import Memories
from adapters.live_pg import PgSignals
from adapters.observe.metrics import Metrics
from adapters.observe.observers import Observers
from adapters.observe.tracing import open_tracing
from adapters.owner_locks import open_owner_locks
from adapters.providers.demo import DemoProvider
from adapters.providers.ollama import OllamaProvider
from adapters.providers.openai_chat import OpenAIChatProvider
from adapters.providers.openai_responses import OpenAIResponsesProvider
from adapters.store import create_engine, open_store
from adapters.store.migrate import migrate
from adapters.store.usage import Limits, Quotas, SqlUsage
from adapters.tools.catalog import DirToolCatalog
from adapters.vectors import open_vector_store
from adapters.web import open_fetcher, open_search
from engine.ports import ChatProvider, CodeExecutor, Embedder, KeyHolder, NoTools, ToolCatalog
from engine.run.flush_clock import FlushClock
from engine.run.live import InProcessBus
from engine.run.supervisor import Supervisor

log = logging.getLogger("turnlog")


def create_app(settings: Settings, *, code_executor: CodeExecutor | None = None, embedder: Embedder | None = None) -> web.Application:
    """The service. ``code_executor`` plugs a code runner into the legacy code
    loop; None: the one ``TURNLOG_CODE_EXECUTOR`` configures (``adapters.code``).
    ``embedder`` embeds memories, file chunks and queries (tests pass one that
    calls their own ``/v1/embeddings`` server); None: the one the settings
    configure, if any (else retrieval is lexical only)."""
    holder: dict[str, Services] = {}
    metrics = Metrics()  # this app's own registry (GET /metrics)

    def delta_window() -> float:
        """Scraped on the event loop whose clock seals the windows."""
        loop = asyncio.get_running_loop()
        return FlushClock.of(loop).stretched(settings.flush_interval, settings.flush_max_interval, loop.time())

    metrics.watch_delta_windows(delta_window)
    code = code_executor if code_executor is not None else build_code_executor(settings)

    async def lookup(token: str) -> KeyHolder | None:
        return await holder["services"].store.key_holder(token)

    metrics_token = settings.metrics_token.get_secret_value() if settings.metrics_token else None
    app = web.Application(
        client_max_size=settings.max_body_bytes,
        middlewares=[error_middleware, auth_middleware(settings.auth_enabled(), lookup, metrics_token)],
    )

    async def lifecycle(app: web.Application) -> AsyncIterator[None]:
        # First: it logs the isolation the sandbox gets here, and refuses a weak
        # sandbox in a deployment with secrets before anything else starts.
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
        providers: dict[str, ChatProvider] = {}
        connect, idle = settings.upstream_connect_timeout, settings.upstream_idle_timeout
        if settings.openai_base_url:
            key = settings.openai_api_key.get_secret_value() if settings.openai_api_key else None
            openai_cls = OpenAIResponsesProvider if settings.openai_api_mode == "responses" else OpenAIChatProvider
            providers["openai"] = openai_cls(
                settings.openai_base_url, key, connect_timeout=connect, idle_timeout=idle, headers_timeout=settings.upstream_headers_timeout
            )
        if settings.ollama_base_url:
            providers["ollama"] = OllamaProvider(
                settings.ollama_base_url, connect_timeout=connect, idle_timeout=idle, headers_timeout=settings.upstream_headers_timeout
            )
        if settings.demo:
            # Listed first: the id `demo` is always the built-in model, even if
            # an upstream has one of that name (that one becomes `openai/demo`).
            providers = {"demo": DemoProvider(chunk_delay=settings.demo_chunk_delay), **providers}
        catalog = Catalog(settings, providers)
        search, fetcher, images = open_search(settings), open_fetcher(settings), open_images(settings)
        opened = open_embedder(settings) if embedder is None else None  # closed with the app
        embeddings = embedder if embedder is not None else opened
        vectors = await open_vector_store(settings.database_url)
        memories = Memories(store.engine, embedder=embeddings, vectors=vectors if embeddings is not None else None)
        knowledge_engine = create_engine(settings.database_url, **_knowledge_engine_options(settings))
        knowledge = FileKnowledge.open(knowledge_engine, store, vectors=vectors, embedder=embeddings, settings=KnowledgeSettings.from_settings(settings))
        tool_dirs = [d for d in (settings.tools_dir, DEMO_TOOLS_DIR if settings.demo else None) if d]
        tools: ToolCatalog = DirToolCatalog(*tool_dirs) if tool_dirs else NoTools()
        mcp = open_mcp_servers(settings, tools)
        if mcp is not None:
            tools = mcp  # the catalog knows the mcp:NAME tool ids too
        bus = InProcessBus()
        signals: PgSignals | None = None
        owners: list[Supervisor] = []  # the supervisor, once it exists (PgSignals calls back into it)
        if make_url(settings.database_url).get_backend_name() == "postgresql":
            # Several processes may share this database: wake each other's
            # subscribers and route cancels to a turn's owner.
            def cancel_here(turn_id: str, by: str) -> None:
                for owner in owners:
                    owner.cancel_requested_elsewhere(turn_id, by)

            def adopt_here() -> None:
                for owner in owners:
                    owner.adopt_soon()

            signals = PgSignals(settings.database_url, on_events=bus.wake, on_cancel=cancel_here, on_released=adopt_here)
            await signals.start()
            bus.on_committed = signals.appended
        supervisor = Supervisor(
            store=store,
            blobs=store,
            bus=bus,
            models=catalog,
            settings=settings.engine(),
            tools=tools,
            code=code,
            remote=signals,
            filters=load_filters(settings),
            memories=memories,
            knowledge=knowledge,
            search=search,
            fetcher=fetcher,
            images=images,
            observer=observers,
            tool_servers=mcp,
            owner_locks=open_owner_locks(settings.database_url),
            tokens=Cl100kCounter(),
        )
        owners.append(supervisor)
        service_limits = Limits(settings.quota_requests_per_minute, settings.quota_tokens_per_day)
        quotas = Quotas(SqlUsage(store.engine), service_limits)
        svc = Services(
            settings=settings, store=store, catalog=catalog, supervisor=supervisor, providers=providers, memories=memories, knowledge=knowledge, quotas=quotas
        )
        holder["services"] = svc
        app[SERVICES] = svc
        await knowledge.start()  # resumes the ingestions a crash interrupted
        await supervisor.start()
        catalog.start()  # logs the upstreams (or that there is none) and their models
        try:
            yield
        finally:
            await supervisor.stop()
            await knowledge.stop()
            await vectors.close()
            await catalog.close()
            if signals is not None:
                await signals.close()
            for provider in providers.values():
                await provider.close()
            if opened is not None:
                await opened.close()
            for client in (search, images):
                if client is not None:
                    await client.close()
            await store.close()
            await observers.close()

    app.cleanup_ctx.append(lifecycle)
    app.router.add_get("/healthz", health)
    app.router.add_get("/metrics", metrics.handle)
    blob_routes.setup(app)
    chat_routes.setup(app)
    memory_routes.setup(app)
    file_routes.setup(app)
    turn_routes.setup(app, settings)
    fork_routes.setup(app)
    ws_routes.setup(app)
    ui_routes.setup(app)
    approval_routes.setup(app)
    openapi.setup(app)
    responses_routes.setup(app)
    usage_routes.setup(app)
    return app


def open_mcp_servers(settings: Settings, base: ToolCatalog) -> Any:
    """The configured MCP servers over the tool modules, or None; the ``mcp``
    package (the ``mcp`` extra) is imported only when a server is configured."""
    if not settings.mcp_servers:
        return None
    from adapters.tools.mcp import McpServerConfig, McpServers

    configs = {name: McpServerConfig(**server.model_dump()) for name, server in settings.mcp_servers.items()}
    return McpServers(configs, base)


def _knowledge_engine_options(settings: Settings) -> dict[str, Any]:
    """The files service's own small pool (SQLite: the service's fsync policy)."""
    if make_url(settings.database_url).get_backend_name() == "sqlite":
        return {"synchronous": settings.sqlite_synchronous, "pool_size": 4}
    return {"pool_size": 4}


async def health(request: web.Request) -> web.Response:
    services = request.app.get(SERVICES)
    if services is not None and services.supervisor.draining:
        # A load balancer stops sending new requests here while running turns finish.
        return draining_response()
    return web.json_response({"ok": True})
