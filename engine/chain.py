"""The hash chain of a turn's log: what a receipt proves, and how damage is named.

Every event is chained when a store appends it::

    hash(event) = sha256(hash(previous event) || canonical(event))

``||`` is byte concatenation of the previous hash's 32 raw bytes and the
canonical event; the first event of a turn (seq 1) chains from
:data:`GENESIS`, 32 zero bytes. Stores keep the 32 bytes; everything
that shows a hash (``StoredEvent.hash``, receipts, exports) writes it as 64
lowercase hex digits. ``head`` is the hash of the turn's last event.

The canonical event is the UTF-8 JSON text of the array ``[turn_id, seq,
type, at, data]`` of the event *as stored* (``data`` before any upcast; its
version is ``data["v"]``), with

* the keys of every object in ``data`` sorted (by code point), at every level;
* no whitespace (``,`` and ``:`` separators);
* strings escaped only where JSON requires it (``"``, ``\\`` and control
  characters; ``\\n``-style short escapes, else ``\\u00XX``), every other
  character as itself in UTF-8;
* integers in decimal; floats (``at`` always is one) in their shortest
  round-trip digits with ``.0`` when integral (``1764736000.5``,
  ``1764736000.0``), as orjson writes them (``0.00001`` for 1e-05,
  ``1e+16`` for 1e16).

That is ``orjson.dumps(obj, option=OPT_SORT_KEYS)``, and, for data whose
floats lie between 1e-4 and 1e16 (a timestamp does), the same bytes as
Python's ``json.dumps(obj, sort_keys=True, separators=(",", ":"),
ensure_ascii=False)``: an exported
turn can be checked with any JSON library and sha256.

What the chain proves: the log is the one whose head a receipt names, in the
order it was written, with no event edited, inserted, deleted or moved since
(anything else gives another head). What it does not: who wrote it. Anyone
with write access to the database can rewrite a whole chain consistently; only
a receipt signed with a key they do not hold (``TURNLOG_RECEIPT_KEY``), kept
elsewhere, shows that. Nor can the chain alone show that its *last* events
were removed: a receipt taken earlier (its event count and head) can.

This module is pure (no I/O): stores, the CLI and the HTTP routes use it.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import orjson

from engine.events import Event, upcast
from engine.json_types import JsonObject

#: What a receipt's ``algorithm`` says.
ALGORITHM = "sha256-chain"

#: The previous hash of every turn's first event.
GENESIS = bytes(32)

_json_dumps = json.JSONEncoder(sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode

DamageKind = Literal["edited", "deleted", "inserted", "reordered"]

#: How far from a mismatching event ``check`` looks for where it belongs.
_REORDER_WINDOW = 32


def canonical(turn_id: str, seq: int, type: str, at: float, data: object) -> bytes:
    """The canonical form of one event (see the module docstring)."""
    obj = [turn_id, seq, type, float(at), data]
    try:
        return orjson.dumps(obj, option=orjson.OPT_SORT_KEYS)
    except TypeError:  # integers beyond 64 bits: the stdlib writes them the same way
        return _json_dumps(obj).encode("utf-8")


def encode_data(data: object) -> bytes:
    """``data`` as the canonical form writes it (sorted keys, compact); raises
    ``TypeError`` for what orjson cannot encode (integers beyond 64 bits).

    Stores keep this text as the event's data, so that the canonical event is
    :func:`canonical_encoded` of it: one encoding per event, not two."""
    return orjson.dumps(data, option=orjson.OPT_SORT_KEYS)


def canonical_encoded(turn_id: str, seq: int, type_: str, at: float, data_text: str) -> bytes:
    """:func:`canonical` of an event whose data is ``encode_data(data)``, from
    that text (spliced in as it is: the data is not encoded a second time)."""
    return orjson.dumps([turn_id, seq, type_, float(at), orjson.Fragment(data_text)])


def parse_hash(value: bytes | bytearray | memoryview | str | None) -> bytes | None:
    """A hash as stored (32 bytes) or shown (64 hex digits) as its 32 bytes;
    None for anything else (no hash, or not one)."""
    if isinstance(value, (bytes, bytearray, memoryview)):
        raw = bytes(value)
    elif isinstance(value, str):
        try:
            raw = bytes.fromhex(value)
        except ValueError:
            return None
    else:
        return None
    return raw if len(raw) == 32 else None


def link(previous: bytes, canonical_event: bytes) -> bytes:
    """One link of the chain: the 32-byte hash of an event."""
    return hashlib.sha256(previous + canonical_event).digest()


@dataclass(frozen=True, slots=True)
class StoredEvent:
    """An event as the store holds it (data not upcast) with its stored hash
    (hex; None for a row no store wrote)."""

    turn_id: str
    seq: int
    type: str
    at: float
    data: JsonObject
    hash: str | None

    def canonical(self, seq: int | None = None) -> bytes:
        return canonical(self.turn_id, self.seq if seq is None else seq, self.type, self.at, self.data)

    def event(self) -> Event:
        """The event as ``EventStore.read`` gives it (upcast)."""
        return upcast(Event.model_construct(turn_id=self.turn_id, seq=self.seq, type=self.type, at=self.at, data=self.data))

    def exported(self) -> JsonObject:
        """The event as ``turnlog export`` writes it (one JSON line)."""
        return {"turn_id": self.turn_id, "seq": self.seq, "type": self.type, "at": self.at, "data": self.data, "hash": self.hash}


@dataclass(frozen=True)
class Damage:
    """The first place a log does not match its chain."""

    seq: int
    kind: DamageKind
    message: str
    index: int  # position in the checked sequence (a file's line: index + its first event line)

    def public(self) -> JsonObject:
        return {"seq": self.seq, "kind": self.kind, "message": self.message}


@dataclass(frozen=True)
class ChainResult:
    """``damage`` is None when the chain holds; ``head`` is then the last hash
    (hex; the previous hash given when there were no events)."""

    events: int
    head: str
    damage: Damage | None

    @property
    def ok(self) -> bool:
        return self.damage is None


def check(
    turn_id: str,
    events: Sequence[StoredEvent],
    *,
    previous: bytes = GENESIS,
    first_seq: int = 1,
) -> ChainResult:
    """Check ``events`` (in the order read: by seq from a store, by line from
    a file) against their stored hashes, from ``previous`` (the hash before
    ``first_seq``). Stops at the first damage and classifies it:

    * ``deleted``: a seq is missing (the one named);
    * ``inserted``: a seq repeats, an event of another turn or without a hash,
      or an extra event whose followers were written one seq lower;
    * ``reordered``: an event's hash is that of the same event at another
      nearby seq (seqs swapped or moved);
    * ``edited``: an event whose content no longer gives its hash.
    """
    prev = previous
    expected = first_seq
    for i, event in enumerate(events):
        seq = event.seq
        if event.turn_id != turn_id:
            return _result(i, prev, Damage(seq, "inserted", f"seq {seq} belongs to another turn ({event.turn_id})", i))
        if seq < expected:
            if seq == expected - 1:
                return _result(i, prev, Damage(seq, "inserted", f"seq {seq} appears twice: an event was inserted", i))
            return _result(i, prev, Damage(seq, "reordered", f"seq {seq} comes after seq {expected - 1}: events are out of order", i))
        if seq > expected:
            gap = f"seq {expected}" if seq == expected + 1 else f"seqs {expected}-{seq - 1}"
            return _result(
                i,
                prev,
                Damage(expected, "deleted", f"{gap} missing: deleted (the log goes from seq {expected - 1} to seq {seq})", i),
            )
        computed = link(prev, event.canonical())
        stored = parse_hash(event.hash)
        if stored != computed:
            return _result(i, prev, _classify(events, i, prev, stored))
        prev = computed
        expected += 1
    return ChainResult(len(events), prev.hex(), None)


def _result(i: int, prev: bytes, damage: Damage) -> ChainResult:
    return ChainResult(i, prev.hex(), damage)


def _classify(events: Sequence[StoredEvent], i: int, prev: bytes, stored: bytes | None) -> Damage:
    event = events[i]
    seq = event.seq
    if stored is not None:
        # Moved: the event's hash is its own at another nearby seq, after
        # another stored hash (seqs swapped or moved, content and hash kept).
        lo, hi = max(0, i - _REORDER_WINDOW), min(len(events), i + _REORDER_WINDOW + 1)
        nearby = events[lo:hi]
        prevs = [p for p in (parse_hash(e.hash) for e in nearby) if p is not None]
        for other in nearby:
            if other.seq == seq:
                continue
            candidates = [GENESIS] if other.seq == 1 else prevs
            body = event.canonical(other.seq)
            if any(link(p, body) == stored for p in candidates):
                return Damage(seq, "reordered", f"seq {seq} ({event.type}) is out of order: it was written as seq {other.seq}", i)
    # An extra event: the next one is the original at this seq (chains from prev).
    after = events[i + 1] if i + 1 < len(events) else None
    if after is not None and after.seq == seq + 1 and parse_hash(after.hash) == link(prev, after.canonical(seq)):
        return Damage(seq, "inserted", f"seq {seq} ({event.type}) was inserted: the events after it were written one seq lower", i)
    if stored is None:
        return Damage(seq, "inserted", f"seq {seq} ({event.type}) has no valid hash: the store did not write it (inserted)", i)
    return Damage(seq, "edited", f"seq {seq} ({event.type}) was edited: its content does not match its hash", i)
