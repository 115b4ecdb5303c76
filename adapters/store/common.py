"""What every event-store backend shares, so that their behaviour cannot drift.

``SqlEventStore`` and ``MemoryEventStore`` keep event data, views and tags as
the same compact JSON text (a reader gets fresh objects, and the same JSON
normalization, whichever store wrote them), hash API keys the same way and
refuse a poisoned fencing token with the same error.
"""

from __future__ import annotations

import hashlib
import json
import secrets
from collections.abc import Sequence
from typing import Any

import orjson

from engine.events import Event
from engine.ports import LeaseLost

_json_dumps = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False).encode

#: ``(turn_id, seq, type, at, data)``: one event as the stores keep it.
EventRow = tuple[str, int, str, float, str]


def dumps(obj: Any) -> str:
    """Compact JSON text; orjson (every flush window is encoded) with the stdlib for
    what orjson refuses (integers beyond 64 bits, non-string keys)."""
    try:
        return orjson.dumps(obj).decode()
    except TypeError:
        return _json_dumps(obj)


def loads(text: str | bytes) -> Any:
    try:
        return orjson.loads(text)
    except orjson.JSONDecodeError:
        return json.loads(text)  # e.g. integers beyond 64 bits


def event_rows(events: Sequence[Event]) -> list[EventRow]:
    """Rows of ``events``, data as compact JSON: encoded in the caller's call,
    so that unencodable data fails there, before anything is queued."""
    return [(e.turn_id, e.seq, e.type, e.at, dumps(e.data)) for e in events]


def hash_api_key(key: str) -> str:
    """What a store keeps of ``key``: its sha256, hex (never the key)."""
    return hashlib.sha256(key.encode("utf-8")).hexdigest()


def new_api_key() -> str:
    return "tl-" + secrets.token_urlsafe(32)


def stale_token(turn_id: str | None, fencing: int, current: int | None) -> LeaseLost:
    return LeaseLost(f"turn {turn_id}: fencing token {fencing} is stale (current: {current})")


def after_failure(turn_id: str | None, fencing: int | None) -> LeaseLost:
    """The refusal of an append whose token already had a failed append: a later
    success would leave a gap in the turn's seqs."""
    return LeaseLost(
        f"turn {turn_id}: an earlier append with fencing token {fencing} failed; "
        "later ones are refused so that the log keeps no gap (resume the turn)"
    )
