"""Which store failures mean "the database is unavailable right now".

A PostgreSQL restart or network cut, a connection pool that cannot hand out a
connection in time, a SQLite file that is locked past its busy timeout or whose
disk is full: none is the client's fault nor a bug, and each passes. The HTTP
layer answers them 503 with ``Retry-After`` instead of a 500, and a
running turn whose write failed is interrupted and resumed from what is durable
once the store is back. Anything else (a constraint violation, a missing table)
is a bug and stays a 500.
"""

from __future__ import annotations

import errno
import socket
import sqlite3

import sqlalchemy.exc

try:  # the PostgreSQL driver is optional for a SQLite-only install
    import asyncpg
except ImportError:  # pragma: no cover
    asyncpg = None

#: SQLite messages of a passing condition (sqlite3 has one OperationalError for all).
_SQLITE_PASSING = ("database or disk is full", "database is locked", "disk i/o error", "unable to open database file")


def unavailable_reason(exc: BaseException) -> str | None:
    """A short reason if ``exc`` (or what it wraps) is the store being
    unavailable; None for any other error."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        reason = _reason(current)
        if reason is not None:
            return reason
        orig = getattr(current, "orig", None)  # SQLAlchemy's wrapped DBAPI error
        current = orig if isinstance(orig, BaseException) else (current.__cause__ or current.__context__)
    return None


def _reason(exc: BaseException) -> str | None:
    if isinstance(exc, sqlalchemy.exc.TimeoutError):
        return "no database connection became free in time"
    if isinstance(exc, sqlalchemy.exc.DBAPIError) and exc.connection_invalidated:
        return "the database connection was lost"
    if isinstance(exc, sqlite3.OperationalError):
        message = str(exc).lower()
        return next((m for m in _SQLITE_PASSING if m in message), None)
    if isinstance(exc, OSError) and exc.errno == errno.ENOSPC:
        return "no space left on the database's disk"
    if isinstance(exc, (ConnectionError, socket.gaierror)) or (isinstance(exc, OSError) and exc.errno in (errno.EHOSTUNREACH, errno.ENETUNREACH)):
        return f"the database cannot be reached ({type(exc).__name__})"
    if asyncpg is not None:
        if isinstance(
            exc,
            (
                asyncpg.PostgresConnectionError,
                asyncpg.exceptions.OperatorInterventionError,  # shutting down, starting up
                asyncpg.exceptions.InsufficientResourcesError,  # disk full, too many connections
            ),
        ):
            return "the database is unavailable"
        if isinstance(exc, asyncpg.InterfaceError) and "closed" in str(exc):
            return "the database connection was lost"
    if isinstance(exc, TimeoutError):
        return "the database did not answer in time"
    return None
