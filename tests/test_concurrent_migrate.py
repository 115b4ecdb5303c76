"""Several processes migrating one new database at the same moment.

A deployment with replicas starts them together, and ``serve`` (like
``turnlog migrate``) migrates on start: without serializing the migrations
across processes, two of them both found no schema and both ran
``CREATE TABLE events``; on PostgreSQL the loser exited with "relation
"events" already exists". Three real processes per round, a new database per
round, on each backend.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path

import aiohttp
import pytest
from alembic.script import ScriptDirectory
from sqlalchemy import text

from adapters.store import create_engine
from adapters.store.migrate import alembic_config
from tests.pg import pg_empty_database  # noqa: F401  (fixture)
from tests.processes import CliRun, Server, release_together
from tests.upstream import ScriptedUpstream

PROCESSES = 3
ROUNDS = 2  # each round: a new database, three processes released at once


@pytest.fixture
def new_database(db_backend: str, tmp_path: Path, request: pytest.FixtureRequest) -> Callable[[str], str]:
    """``new_database(tag)``: the URL of a database nobody has migrated yet."""
    if db_backend == "postgres":
        make = request.getfixturevalue("pg_empty_database")
        return lambda _tag: make()
    return lambda tag: f"sqlite+aiosqlite:///{tmp_path / f'{tag}.db'}"


def head_revision(url: str) -> str:
    head = ScriptDirectory.from_config(alembic_config(url)).get_current_head()
    assert head is not None
    return head


async def assert_at_head_once(url: str) -> None:
    """One alembic_version row, at head, and the tables of every migration."""
    engine = create_engine(url)
    try:
        async with engine.connect() as conn:
            versions = (await conn.execute(text("SELECT version_num FROM alembic_version"))).scalars().all()
            assert versions == [head_revision(url)], f"alembic_version holds {versions}"
            for table in ("events", "blobs", "vector_items"):
                await conn.execute(text(f"SELECT count(*) FROM {table}"))
    finally:
        await engine.dispose()


async def test_replicas_starting_together_on_a_new_database(
    new_database: Callable[[str], str], tmp_path: Path, upstream: ScriptedUpstream, http: aiohttp.ClientSession
) -> None:
    for round_ in range(ROUNDS):
        url = new_database(f"serve-{round_}")
        log_dir = tmp_path / f"serve-{round_}"
        log_dir.mkdir()
        servers = [Server(url, upstream.url, auto_resume=False, log_dir=log_dir, gate=True) for _ in range(PROCESSES)]
        try:
            await release_together(servers)
            await asyncio.gather(*(server.ready(http) for server in servers))
            # Still up once all are: none of them is on its way out after a
            # failed start (a second look at each, not a wait).
            for server in servers:
                async with http.get(server.url + "/healthz") as resp:
                    assert resp.status == 200, f"round {round_}: {resp.status}\n{server.log_tail()}"
                assert server.proc.poll() is None, f"round {round_}: exited\n{server.log_tail()}"
            await assert_at_head_once(url)
        finally:
            for server in servers:
                server.stop()


async def test_turnlog_migrate_run_together_on_a_new_database(new_database: Callable[[str], str], tmp_path: Path) -> None:
    for round_ in range(ROUNDS):
        url = new_database(f"migrate-{round_}")
        runs = [CliRun(url, "migrate", log_path=tmp_path / f"migrate-{round_}-{i}.log", gate=True) for i in range(PROCESSES)]
        try:
            await release_together(runs)
            for run in runs:
                code, output = await run.wait()
                assert code == 0, f"round {round_}: turnlog migrate exited {code}:\n{output[-3000:]}"
        finally:
            for run in runs:
                run.stop()
        await assert_at_head_once(url)
