"""The turn a log line is written for.

The actor sets ``current_turn`` in its own task when a turn starts running;
every task it spawns (tools, filters) inherits it through ``contextvars``, so
a log handler can put ``turn_id`` on every line written while working on a
turn without any call passing it along.
"""

from __future__ import annotations

from contextvars import ContextVar

current_turn: ContextVar[str | None] = ContextVar("turnlog_turn_id", default=None)
