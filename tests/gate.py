"""``python -m tests.gate ARGS...``: the ``turnlog ARGS...`` command, held at a
gate until the test opens it (a line on stdin).

Why: importing the service is most of a process's start (a second or more on a
shared machine, with jitter between processes), so processes launched "at the
same moment" reach their first database statement hundreds of milliseconds
apart, and whether they race on it is luck. Behind the gate each one imports
first, says so (:data:`WAITING` on stdout), and blocks on stdin; the test waits
for every one of them and then releases them all within a few milliseconds.
What runs after the gate is the real ``adapters.cli.main``.
"""

from __future__ import annotations

import sys

# What `turnlog serve` / `turnlog migrate` import lazily, on their way to the
# database: imported here, before the gate, so that it costs nothing after it.
import aiohttp.web  # noqa: F401
import aiosqlite  # noqa: F401
import alembic.command  # noqa: F401
import asyncpg  # noqa: F401
import sqlalchemy.dialects.postgresql.asyncpg  # noqa: F401
import sqlalchemy.dialects.sqlite.aiosqlite  # noqa: F401

import adapters.cli
import adapters.http.app  # noqa: F401
import adapters.store.migrate  # noqa: F401

WAITING = "tests.gate: waiting"


def main() -> int:
    print(WAITING, flush=True)
    if not sys.stdin.readline():  # EOF: the test gave up on us
        return 3
    return adapters.cli.main(sys.argv[1:])


if __name__ == "__main__":
    sys.exit(main())
