"""The user's memories as model context (Open WebUI's ≤0.8.x format).

Pure functions, no I/O. The caller searches the user's memories with the last
user message as the query (``MemorySearch.search(user, query, k)``, k =
``EngineSettings.memory_top_k``, 3 by default) and gives the hits, nearest
first, to ``memory_block``; ``with_memory`` appends the block to the system
message::

    User Context:
    1. [2024-05-01] Likes green tea
    2. [Unknown Date] Lives in Lyon

Unlike Open WebUI 0.8.x nothing is injected when nothing matched (pinned by
tests/test_memory_block.py::test_q25_nothing_matched_gives_no_block).
Dates are UTC (Open WebUI used the server's local time zone).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from datetime import UTC, datetime

from engine.context.messages import Message, add_or_update_system_message
from engine.ports import MemoryHit

HEADER = "User Context:"
UNKNOWN_DATE = "Unknown Date"


def memory_date(created_at: float | None) -> str:
    """``YYYY-MM-DD`` (UTC) of a memory's ``created_at`` (Unix seconds); ``Unknown Date``
    when it is missing, zero, not finite or out of range."""
    if not created_at or not math.isfinite(created_at):
        return UNKNOWN_DATE
    try:
        return datetime.fromtimestamp(created_at, tz=UTC).strftime("%Y-%m-%d")
    except (OverflowError, OSError, ValueError):
        return UNKNOWN_DATE


def memory_block(hits: Sequence[MemoryHit]) -> str | None:
    """``User Context:`` and one line ``N. [date] memory`` per hit, in the given
    order; hits whose content is blank are left out (and not numbered). None
    when no memory is left (Open WebUI injected an empty block)."""
    lines = [HEADER]
    for hit in hits:
        content = hit.content.strip()
        if content:
            lines.append(f"{len(lines)}. [{memory_date(hit.created_at)}] {content}")
    return "\n".join(lines) if len(lines) > 1 else None


def with_memory(messages: list[Message], block: str | None) -> list[Message]:
    """``block`` APPENDED to the system message (wherever it is; one is inserted
    at index 0 when there is none). A new list; ``None`` leaves the messages as
    they are."""
    if not block:
        return list(messages)
    return add_or_update_system_message(block, list(messages), append=True)
