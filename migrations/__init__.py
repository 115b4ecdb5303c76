"""Alembic migrations of the event store (a package so ``migrate()`` can find it)."""
