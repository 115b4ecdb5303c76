"""What every event-store backend shares, so that their behaviour cannot drift.

``SqlEventStore`` and ``MemoryEventStore`` keep event data, views and tags as
the same compact JSON text (a reader gets fresh objects, and the same JSON
normalization, whichever store wrote them), hash API keys the same way and
refuse a poisoned fencing token with the same error.
"""

from __future__ import annotations

import hashlib
import json
import re
import secrets
from collections.abc import Sequence
from typing import Any

import orjson

from engine.chain import GENESIS, canonical, encode_data, parse_hash
from engine.events import Event
from engine.ports import LeaseLost

_json_dumps = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False).encode
_json_dumps_sorted = json.JSONEncoder(sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode

#: ``(turn_id, seq, type, at, data, chain)``: one event as the stores keep it;
#: ``chain`` is :data:`FROM_DATA` or its canonical form (``engine.chain``) until
#: the writer links it, then its hash (32 bytes), None with the chain off.
EventRow = tuple[str, int, str, float, str, Any]

#: A row's ``chain`` before linking when its canonical form is built from its
#: data text (``engine.chain.canonical_encoded``).
FROM_DATA = b""

#: A turn's last linked event: ``(seq, hash)``.
Head = tuple[int, bytes]


def dumps(obj: Any) -> str:
    """Compact JSON text; orjson (every flush window is encoded) with the stdlib for
    what orjson refuses (integers beyond 64 bits, non-string keys)."""
    try:
        return orjson.dumps(obj).decode()
    except TypeError:
        return _json_dumps(obj)


#: A number of 20 digits or more: maybe an integer beyond 64 bits, which
#: orjson reads back as a float (no error), so the stdlib must read it.
_LONG_NUMBER = re.compile(r"\d{20}")
_LONG_NUMBER_B = re.compile(rb"\d{20}")


def loads(text: str | bytes) -> Any:
    """What ``dumps`` wrote, exactly: an integer beyond 64 bits stays one (read
    as a float, the event would no longer match its hash)."""
    if (_LONG_NUMBER_B if isinstance(text, bytes) else _LONG_NUMBER).search(text) is not None:  # type: ignore[arg-type]
        return json.loads(text)
    try:
        return orjson.loads(text)
    except orjson.JSONDecodeError:
        return json.loads(text)


def event_rows(events: Sequence[Event], chain: bool = True) -> list[EventRow]:
    """Rows of ``events``, encoded in the caller's call, so that unencodable data
    fails there, before anything is queued.

    With the chain, data is stored as the canonical form writes it (sorted
    keys: ``engine.chain.encode_data``) and the row's last member is
    :data:`FROM_DATA`: the writer builds the canonical event from that text,
    so that an event's data is encoded once. Data orjson cannot encode
    carries its canonical form instead."""
    if not chain:
        return [(e.turn_id, e.seq, e.type, e.at, dumps(e.data), None) for e in events]
    rows: list[EventRow] = []
    append = rows.append
    for e in events:
        try:
            append((e.turn_id, e.seq, e.type, e.at, encode_data(e.data).decode(), FROM_DATA))
        except TypeError:  # integers beyond 64 bits: the stdlib, sorted like the canonical form
            canon = canonical(e.turn_id, e.seq, e.type, e.at, e.data)
            append((e.turn_id, e.seq, e.type, e.at, _json_dumps_sorted(e.data), canon))
    return rows


def link_rows(
    rows: Sequence[EventRow],
    heads: dict[str, Head],
    previous: Any,
    *older: dict[str, Head],
) -> list[EventRow]:
    """``rows`` with their hashes (32 bytes) in place of their canonical forms, in
    order; ``heads`` (turn -> last linked ``(seq, hash)``) is read and moved
    on, ``older`` only read (after ``heads``, in order). ``previous(turn_id,
    seq)`` gives the hash before ``seq`` when they do not hold ``seq - 1`` (a
    store's read; :data:`GENESIS` at seq 1)."""
    out: list[EventRow] = []
    append = out.append
    # engine.chain.canonical_encoded and link, inlined: this runs per event.
    sha256 = hashlib.sha256
    encode = orjson.dumps
    fragment = orjson.Fragment
    for turn_id, seq, type_, at, data, canon in rows:
        if canon is None:  # the chain is off
            append((turn_id, seq, type_, at, data, None))
            continue
        head = heads.get(turn_id)
        if head is None:
            for layer in older:
                head = layer.get(turn_id)
                if head is not None:
                    break
        if head is not None and head[0] == seq - 1:
            prev = head[1]
        else:
            prev = GENESIS if seq <= 1 else previous(turn_id, seq)
        if not canon:  # FROM_DATA
            body = prev + encode([turn_id, seq, type_, float(at), fragment(data)])
        else:
            body = prev + canon
        digest = sha256(body).digest()
        heads[turn_id] = (seq, digest)
        append((turn_id, seq, type_, at, data, digest))
    return out


def previous_hash(value: bytes | str | None) -> bytes:
    """A stored hash as the previous link of the next event; :data:`GENESIS`
    for a row without one (as ``engine.chain.check`` would name it)."""
    return parse_hash(value) or GENESIS


def hash_hex(value: bytes | None) -> str | None:
    """A stored hash as ``engine.chain`` shows it (hex)."""
    return None if value is None else bytes(value).hex()


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
        f"turn {turn_id}: an earlier append with fencing token {fencing} failed; later ones are refused so that the log keeps no gap (resume the turn)"
    )
