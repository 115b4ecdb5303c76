"""The event-store backends the tests run on, chosen in one place.

``tests/conftest.py`` parametrizes ``db_backend`` with these names for every
test that uses it (through ``database_url`` for the service, through
``store_backend`` for the store itself), filtered by ``--backend``:

* ``memory``: ``MemoryEventStore`` (store-level tests only: the service needs a
  database it can migrate);
* ``sqlite``: a temp file, ``open_store`` (group commits in the writer thread);
* ``sqlite-async``: the same file, the store built on its aiosqlite engine
  alone (``SqlEventStore(engine)``, which opens its own writer connection)
  rather than by ``open_store`` (store-level only: the service always uses
  ``open_store``);
* ``postgres``: a fresh database per test from ``tests.pg.pg_url`` (skipped
  when there is no PostgreSQL).

A test runs on ``SERVICE_BACKENDS`` unless it says otherwise with
``@pytest.mark.backends(...)`` (or ``@pytest.mark.sqlite_only``).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from adapters.store import MemoryDatabase, MemoryEventStore, SqlEventStore, migrate, open_store, sqlite_engine

MEMORY, SQLITE, SQLITE_ASYNC, POSTGRES = "memory", "sqlite", "sqlite-async", "postgres"

#: What a test of the store through its port runs on.
STORE_BACKENDS = (MEMORY, SQLITE, SQLITE_ASYNC, POSTGRES)
#: What a test of the SQL schema or migrations runs on.
SQL_BACKENDS = (SQLITE, SQLITE_ASYNC, POSTGRES)
#: What the service runs on: the default.
SERVICE_BACKENDS = (SQLITE, POSTGRES)

#: ``--backend`` names: a backend is selected by its family.
FAMILY = {MEMORY: "memory", SQLITE: "sqlite", SQLITE_ASYNC: "sqlite", POSTGRES: "postgres"}
SELECTIONS = {"all": {"memory", "sqlite", "postgres"}, "both": {"sqlite", "postgres"}}

Store = SqlEventStore | MemoryEventStore


def parse_selection(value: str) -> set[str]:
    """``--backend``'s value: ``all``, ``both`` (the two databases) or a comma
    list of families (``memory,sqlite``)."""
    if value in SELECTIONS:
        return SELECTIONS[value]
    families = {part.strip() for part in value.split(",") if part.strip()}
    unknown = families - set(FAMILY.values())
    if unknown or not families:
        raise ValueError(f"--backend: unknown {sorted(unknown) or value!r}; use all, both, memory, sqlite, postgres")
    return families


def backends_for(definition: pytest.Function | pytest.Item, selection: set[str]) -> list[str]:
    """The backends one test runs on: what it supports, of what was selected."""
    marker = definition.get_closest_marker("backends")
    supported: tuple[str, ...] = tuple(marker.args) if marker else SERVICE_BACKENDS
    if definition.get_closest_marker("sqlite_only"):
        supported = (SQLITE,)
    unknown = set(supported) - set(FAMILY)
    if unknown:
        raise ValueError(f"{definition.nodeid}: unknown backends {sorted(unknown)}")
    return [name for name in supported if FAMILY[name] in selection]


@dataclass
class Backend:
    """How a test opens (and reopens: a second "process") a migrated store."""

    name: str
    url: str | None  # None: no database (memory)
    file: Path | None  # the SQLite file, for tests that read it
    open: Callable[[Callable[[], float]], Awaitable[Store]]  # the clock for leases


async def make_backend(name: str, tmp_path: Path, request: pytest.FixtureRequest) -> Backend:
    """``name``'s backend, migrated: stores opened on it share their data."""
    if name == MEMORY:
        database = MemoryDatabase()

        async def open_memory(clock: Callable[[], float]) -> Store:
            return MemoryEventStore(database, clock=clock)

        return Backend(name, None, None, open_memory)
    if name == POSTGRES:
        url, path = str(request.getfixturevalue("pg_url")), None
    else:
        path = tmp_path / "turnlog.db"
        url = f"sqlite+aiosqlite:///{path}"

    async def open_sql(clock: Callable[[], float]) -> Store:
        if name == SQLITE_ASYNC:
            return SqlEventStore(sqlite_engine(url), clock=clock)
        return await open_store(url, clock=clock)

    await migrate(url)
    return Backend(name, url, path, open_sql)
