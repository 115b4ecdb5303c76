"""PostgreSQL specifics of the event store: the engine (its writes:
``adapters.store.postgres_writer``).

``events.id`` is a surrogate key from its ``BIGSERIAL`` sequence, nothing more:
nothing reads the log across turns by it, so it is neither gap-free nor in
commit order. Migration 0004 moved the sequence past the ids that earlier
versions numbered themselves.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine


def postgres_engine(url: str, *, timeout: float | None = None, **kwargs: Any) -> AsyncEngine:
    """An async engine for ``postgresql+asyncpg://`` (``kwargs`` go to
    ``create_async_engine``).

    ``timeout`` (the event store's ``TURNLOG_DB_TIMEOUT``): the longest wait
    for one statement's answer (asyncpg's ``command_timeout``: a server
    stopped or frozen, a lock held by another session), for a pooled
    connection, and for a new connection (at most 5 s). None: no statement
    timeout (long index builds of the vector store), 10 s for the pool."""
    kwargs.setdefault("pool_pre_ping", True)
    # Bounded waits while the database is down or unreachable: a request
    # fails (503, adapters.store.faults) instead of hanging for minutes.
    kwargs.setdefault("pool_timeout", 10 if timeout is None else timeout)
    connect_args = kwargs.setdefault("connect_args", {})
    # asyncpg's connect timeout (default 60 s)
    connect_args.setdefault("timeout", 5 if timeout is None else min(5.0, timeout))
    if timeout is not None:
        connect_args.setdefault("command_timeout", timeout)
    settings = connect_args.setdefault("server_settings", {})
    settings.setdefault("application_name", "turnlog")
    # A process frozen mid-transaction (SIGSTOP, a VM pause) would hold its
    # row locks (the fencing check's on ``turns``) and stall the processes
    # that take its turns over: PostgreSQL ends such a session, the locks go,
    # and the frozen process finds its lease gone (fencing) when it wakes.
    settings.setdefault("idle_in_transaction_session_timeout", "5000")
    return create_async_engine(url, **kwargs)
