"""The turn a log line is written for.

The actor sets ``current_turn`` in its own task when a turn starts running;
every task it spawns (tools, filters) inherits it through ``contextvars``, so
a log handler can put ``turn_id`` on every line written while working on a
turn without any call passing it along.
"""

from __future__ import annotations

from contextvars import ContextVar

current_turn: ContextVar[str | None] = ContextVar("turnlog_turn_id", default=None)
#: The turn's user and chat, set beside ``current_turn``: what a model written
#: in Python (an Open WebUI pipe) is told about who it answers, which the wire
#: body of a model call does not carry.
current_user: ContextVar[str | None] = ContextVar("turnlog_user_id", default=None)
current_chat: ContextVar[str | None] = ContextVar("turnlog_chat_id", default=None)
