from __future__ import annotations

import os
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web

# The oracles' asserts explain their failures like a test's own (before the import below).
pytest.register_assert_rewrite("tests.oracle")

from tests.backends import POSTGRES, SERVICE_BACKENDS, Backend, backends_for, make_backend, parse_selection  # noqa: E402
from tests.documents import EmbeddingServer  # noqa: E402
from tests.harness import Service, make_settings, start_service, stop_service  # noqa: E402
from tests.llama_server import llama_server  # noqa: F401, E402  (fixture: a real model server, session-scoped)
from tests.pg import pg_url  # noqa: F401, E402  (fixture: a fresh PostgreSQL database)
from tests.upstream import ScriptedUpstream  # noqa: E402


@pytest.fixture
async def embedding_server() -> AsyncIterator[EmbeddingServer]:
    """OpenAI's ``POST /v1/embeddings`` on loopback (vectors by concept, see tests.documents)."""
    server = EmbeddingServer()
    await server.start()
    try:
        yield server
    finally:
        await server.close()


@pytest.fixture
async def upstream() -> AsyncIterator[ScriptedUpstream]:
    up = ScriptedUpstream(models=["gpt-test", "gpt-other"])
    await up.start()
    try:
        yield up
    finally:
        await up.close()


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--backend",
        default=os.environ.get("TURNLOG_TEST_BACKEND", "all"),
        help="event-store backends: all (default), both (sqlite and postgres), or a comma list "
        "of memory, sqlite, postgres; the service-level tests run on sqlite and postgres only",
    )


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "sqlite_only: the test reads the SQLite file itself")
    config.addinivalue_line("markers", "backends(*names): the backends the test can run on (tests/backends.py)")
    config.addinivalue_line("markers", "live_paths(*paths): the test runs over the live path's shortcuts and over its plain reference path (or those named)")
    try:
        parse_selection(config.getoption("backend"))
    except ValueError as exc:
        raise pytest.UsageError(str(exc)) from None


#: The live path's two implementations (``TURNLOG_LIVE_FAST_PATHS``): a test
#: marked ``live_paths`` runs over both, as one suite runs over a parser's C
#: and Python implementations.
LIVE_PATHS = ("fast", "plain")


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """Every test that uses ``db_backend`` (the service's ``database_url``, the
    store's ``store_backend``) runs on each selected backend it supports; one
    marked ``live_paths`` on each live path too."""
    paths = metafunc.definition.get_closest_marker("live_paths")
    if "live_path" in metafunc.fixturenames and paths is not None:
        metafunc.parametrize("live_path", paths.args or LIVE_PATHS, indirect=True)
    if "db_backend" not in metafunc.fixturenames:
        return
    selection = parse_selection(metafunc.config.getoption("backend"))
    metafunc.parametrize("db_backend", backends_for(metafunc.definition, selection))


@pytest.fixture
def database_url(db_backend: str, tmp_path: Path, request: pytest.FixtureRequest) -> str:
    """The service's database: a SQLite file, or a fresh PostgreSQL database."""
    if db_backend not in SERVICE_BACKENDS:
        raise ValueError(f"the service cannot run on {db_backend!r}: mark the test with a database backend")
    if db_backend == POSTGRES:
        return str(request.getfixturevalue("pg_url"))
    return f"sqlite+aiosqlite:///{tmp_path / 'turnlog.db'}"


@pytest.fixture
async def store_backend(db_backend: str, tmp_path: Path, request: pytest.FixtureRequest) -> Backend:
    """The store-level side of ``db_backend``: opens stores on one migrated database."""
    return await make_backend(db_backend, tmp_path, request)


@pytest.fixture
def live_path(request: pytest.FixtureRequest) -> str:
    """Which live path the service runs (``LIVE_PATHS``; the shortcuts unless the test is marked ``live_paths``)."""
    return str(getattr(request, "param", "fast"))


@pytest.fixture
async def service(tmp_path: Path, upstream: ScriptedUpstream, database_url: str, live_path: str) -> AsyncIterator[Service]:
    settings = make_settings(tmp_path, upstream.url, database_url=database_url, live_fast_paths=live_path == "fast")
    svc = await start_service(settings, upstream)
    try:
        yield svc
    finally:
        await stop_service(svc)


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as session:
        yield session


RawHandler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@pytest.fixture
async def handler_server() -> AsyncIterator[Callable[..., Awaitable[str]]]:
    """Serve one hand-written aiohttp handler on a loopback port (for wire
    details no scripted upstream produces: split lines, CRLF, odd endings).
    ``await handler_server(handler, path, url_suffix)`` returns the base URL."""
    runners: list[web.AppRunner] = []

    async def serve(handler: RawHandler, path: str, url_suffix: str = "") -> str:
        async def quiet(request: web.Request) -> web.StreamResponse:
            try:
                return await handler(request)
            except ConnectionResetError:
                return web.Response()

        app = web.Application()
        app.router.add_post(path, quiet)
        runner = web.AppRunner(app, access_log=None, shutdown_timeout=0.5)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", 0).start()
        runners.append(runner)
        return f"http://127.0.0.1:{runner.addresses[0][1]}{url_suffix}"

    yield serve
    for runner in runners:
        await runner.cleanup()
