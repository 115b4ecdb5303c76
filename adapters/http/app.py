"""The aiohttp application factory: the routes, mounted on the service that
``adapters.bootstrap`` builds when the application starts (and closes when it
stops).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator

from aiohttp import web

from adapters.bootstrap import bootstrap, configured_code_executor
from adapters.config import Settings
from adapters.http import (
    approval_routes,
    blob_routes,
    chat_routes,
    file_routes,
    fork_routes,
    memory_routes,
    openapi,
    preset_routes,
    responses_routes,
    turn_list_routes,
    turn_routes,
    ui_routes,
    usage_routes,
    ws_routes,
)
from adapters.http.auth import auth_middleware
from adapters.http.context import SERVICES, Services
from adapters.http.errors import draining_response, error_middleware
from adapters.observe.metrics import Metrics
from engine.ports import CodeExecutor, Embedder, KeyHolder
from engine.run.flush_clock import FlushClock

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
    code = configured_code_executor(settings, code_executor)

    async def lookup(token: str) -> KeyHolder | None:
        return await holder["services"].store.key_holder(token)

    metrics_token = settings.metrics_token.get_secret_value() if settings.metrics_token else None
    app = web.Application(
        client_max_size=settings.max_body_bytes,
        middlewares=[error_middleware, auth_middleware(settings.auth_enabled(), lookup, metrics_token)],
    )

    async def lifecycle(app: web.Application) -> AsyncIterator[None]:
        runtime = await bootstrap(settings, code=code, metrics=metrics, embedder=embedder)
        holder["services"] = runtime.services
        app[SERVICES] = runtime.services
        await runtime.start()
        try:
            yield
        finally:
            await runtime.close()

    app.cleanup_ctx.append(lifecycle)
    app.router.add_get("/healthz", health)
    app.router.add_get("/metrics", metrics.handle)
    blob_routes.setup(app)
    chat_routes.setup(app)
    memory_routes.setup(app)
    file_routes.setup(app)
    turn_routes.setup(app, settings)
    turn_list_routes.setup(app)
    turn_list_routes.setup(app)
    fork_routes.setup(app)
    ws_routes.setup(app)
    ui_routes.setup(app)
    approval_routes.setup(app)
    openapi.setup(app)
    responses_routes.setup(app)
    preset_routes.setup(app)
    usage_routes.setup(app)
    return app


async def health(request: web.Request) -> web.Response:
    services = request.app.get(SERVICES)
    if services is not None and services.supervisor.draining:
        # A load balancer stops sending new requests here while running turns finish.
        return draining_response()
    return web.json_response({"ok": True})
